package faults

import (
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// relay is a TCP forwarder between the proxy and its backend. Down makes
// the backend unreachable: open connections are cut and new ones are
// accepted and closed at once (a refusal the client sees immediately,
// like a closed port, while the relay keeps its address). SetTarget
// follows a backend restarted on another port.
type relay struct {
	lis net.Listener
	wg  sync.WaitGroup // accept loop and pipes

	mu     sync.Mutex // guards the fields below
	target string
	down   bool
	closed bool
	conns  map[net.Conn]struct{} // both ends of every open pair
}

func newRelay(target string) (*relay, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &relay{lis: lis, target: target, conns: map[net.Conn]struct{}{}}
	r.wg.Add(1)
	go r.accept()
	return r, nil
}

func (r *relay) Addr() string { return r.lis.Addr().String() }

func (r *relay) SetTarget(addr string) {
	r.mu.Lock()
	r.target = addr
	r.mu.Unlock()
}

// Down cuts every open connection and refuses new ones until Up.
func (r *relay) Down() {
	r.mu.Lock()
	r.down = true
	conns := r.conns
	r.conns = map[net.Conn]struct{}{}
	r.mu.Unlock()
	for c := range conns {
		c.Close()
	}
}

// Up accepts and forwards again.
func (r *relay) Up() {
	r.mu.Lock()
	r.down = false
	r.mu.Unlock()
}

// Close stops the relay and waits for its goroutines.
func (r *relay) Close() {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	r.lis.Close()
	r.Down()
	r.wg.Wait()
}

func (r *relay) accept() {
	defer r.wg.Done()
	for {
		c, err := r.lis.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		r.mu.Lock()
		down, target := r.down || r.closed, r.target
		r.mu.Unlock()
		if down {
			c.Close()
			continue
		}
		r.wg.Add(1)
		go r.pipe(c, target)
	}
}

func (r *relay) pipe(c net.Conn, target string) {
	defer r.wg.Done()
	up, err := net.DialTimeout("tcp", target, 2*time.Second)
	if err != nil {
		c.Close()
		return
	}
	r.mu.Lock()
	if r.down || r.closed {
		r.mu.Unlock()
		c.Close()
		up.Close()
		return
	}
	r.conns[c] = struct{}{}
	r.conns[up] = struct{}{}
	r.mu.Unlock()
	done := make(chan struct{}, 2)
	cp := func(dst, src net.Conn) {
		io.Copy(dst, src)
		// Either side ending ends the pair: a half-open relay would hide
		// a dead backend from the proxy.
		dst.Close()
		src.Close()
		done <- struct{}{}
	}
	go cp(up, c)
	go cp(c, up)
	<-done
	<-done
	r.mu.Lock()
	delete(r.conns, c)
	delete(r.conns, up)
	r.mu.Unlock()
}

func TestRelay(t *testing.T) {
	echo := func() (net.Listener, error) {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		go func() {
			for {
				c, err := lis.Accept()
				if err != nil {
					return
				}
				go func() { io.Copy(c, c); c.Close() }()
			}
		}()
		return lis, nil
	}
	a, err := echo()
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	r, err := newRelay(a.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	roundTrip := func(c net.Conn) error {
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write([]byte("ping")); err != nil {
			return err
		}
		buf := make([]byte, 4)
		if _, err := io.ReadFull(c, buf); err != nil {
			return err
		}
		if string(buf) != "ping" {
			return errors.New("echo mismatch: " + string(buf))
		}
		return nil
	}
	c, err := net.Dial("tcp", r.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := roundTrip(c); err != nil {
		t.Fatalf("through the relay: %v", err)
	}

	r.Down()
	if err := roundTrip(c); err == nil {
		t.Fatal("an open connection survived Down")
	}
	c2, err := net.Dial("tcp", r.Addr())
	if err == nil {
		defer c2.Close()
		if err := roundTrip(c2); err == nil {
			t.Fatal("a new connection was forwarded while down")
		}
	}

	r.Up()
	b, err := echo()
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	r.SetTarget(b.Addr().String())
	a.Close()
	c3, err := net.Dial("tcp", r.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c3.Close()
	if err := roundTrip(c3); err != nil {
		t.Fatalf("after Up and SetTarget: %v", err)
	}
}
