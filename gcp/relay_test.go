package gcp_test

import (
	"io"
	"net"
	"sync"
	"testing"
)

// relay forwards TCP connections to a target until cut: then every open
// connection is closed and new ones are closed at once (KubeMQ
// unreachable), until restore.
type relay struct {
	addr   string
	target string
	lis    net.Listener

	mu    sync.Mutex
	down  bool
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

func startRelay(t testing.TB, target string) *relay {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &relay{addr: lis.Addr().String(), target: target, lis: lis, conns: map[net.Conn]struct{}{}}
	r.wg.Add(1)
	go r.accept()
	t.Cleanup(func() {
		lis.Close()
		r.cut()
		r.wg.Wait()
	})
	return r
}

func (r *relay) accept() {
	defer r.wg.Done()
	for {
		c, err := r.lis.Accept()
		if err != nil {
			return
		}
		r.mu.Lock()
		if r.down {
			r.mu.Unlock()
			c.Close()
			continue
		}
		up, err := net.Dial("tcp", r.target)
		if err != nil {
			r.mu.Unlock()
			c.Close()
			continue
		}
		r.conns[c] = struct{}{}
		r.conns[up] = struct{}{}
		r.wg.Add(2)
		r.mu.Unlock()
		go r.pipe(c, up)
		go r.pipe(up, c)
	}
}

func (r *relay) pipe(dst, src net.Conn) {
	defer r.wg.Done()
	_, _ = io.Copy(dst, src) // ends at a cut or a closed peer; either ends both directions
	dst.Close()
	src.Close()
	r.mu.Lock()
	delete(r.conns, dst)
	delete(r.conns, src)
	r.mu.Unlock()
}

// cut closes every relayed connection and refuses new ones.
func (r *relay) cut() {
	r.mu.Lock()
	r.down = true
	cs := make([]net.Conn, 0, len(r.conns))
	for c := range r.conns {
		cs = append(cs, c)
	}
	r.mu.Unlock()
	for _, c := range cs {
		c.Close()
	}
}

// restore accepts connections again.
func (r *relay) restore() {
	r.mu.Lock()
	r.down = false
	r.mu.Unlock()
}
