package kubemqclient_test

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/kubemq-io/kubemq-proxy/internal/kubemqtest"
	kc "github.com/kubemq-io/kubemq-proxy/kubemqclient"
)

// freezeRelay forwards TCP to a server; Freeze stops forwarding in both
// directions while keeping every connection open (what a SIGSTOPped
// server or a silent partition looks like to the client), Thaw delivers
// what was held and forwards again.
type freezeRelay struct {
	lis    net.Listener
	target string

	mu     sync.Mutex
	frozen bool
	thaw   *sync.Cond
	conns  []net.Conn
	wg     sync.WaitGroup
}

func newFreezeRelay(t *testing.T, target string) *freezeRelay {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &freezeRelay{lis: lis, target: target}
	r.thaw = sync.NewCond(&r.mu)
	r.wg.Add(1)
	go r.accept()
	t.Cleanup(r.close)
	return r
}

func (r *freezeRelay) addr() string { return r.lis.Addr().String() }

func (r *freezeRelay) freeze() {
	r.mu.Lock()
	r.frozen = true
	r.mu.Unlock()
}

func (r *freezeRelay) unfreeze() {
	r.mu.Lock()
	r.frozen = false
	r.thaw.Broadcast()
	r.mu.Unlock()
}

func (r *freezeRelay) close() {
	r.lis.Close()
	r.unfreeze()
	r.mu.Lock()
	for _, c := range r.conns {
		c.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
}

func (r *freezeRelay) accept() {
	defer r.wg.Done()
	for {
		c, err := r.lis.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", r.target)
		if err != nil {
			c.Close()
			continue
		}
		r.mu.Lock()
		r.conns = append(r.conns, c, s)
		r.mu.Unlock()
		r.wg.Add(2)
		go r.pipe(c, s)
		go r.pipe(s, c)
	}
}

// pipe copies src to dst, holding each chunk while the relay is frozen.
func (r *freezeRelay) pipe(dst, src net.Conn) {
	defer r.wg.Done()
	defer dst.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			r.mu.Lock()
			for r.frozen {
				r.thaw.Wait()
			}
			r.mu.Unlock()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				src.Close()
			}
			return
		}
	}
}

// TestFrozenServerFailsFast freezes the link to a server: readiness drops
// within the health loop's bound (PingInterval + 2 x PingTimeout),
// publishing calls with a FailFast ctx in flight fail then with
// ErrUnavailable (not at their own deadline), new ones fail at once, a call
// without FailFast waits for the server, and after the thaw the client is
// ready again and publishes.
func TestFrozenServerFailsFast(t *testing.T) {
	target := kubemqtest.Address(t)
	r := newFreezeRelay(t, target)
	c, err := kc.Dial(context.Background(), kc.Options{Address: r.addr(), Logger: zaptest.NewLogger(t),
		PingInterval: 100 * time.Millisecond, PingTimeout: 150 * time.Millisecond,
		MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, DialTimeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.WaitReady(timeout(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	q, ev := fresh(t, "q"), fresh(t, "es")
	ctx := kc.FailFast(timeout(t, 60*time.Second))
	if _, err := c.SendQueueMessage(ctx, kc.QueueMessage{Channel: q, Body: body(0)}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.PublishEvent(ctx, kc.Event{Channel: ev, Body: body(0)}); err != nil {
		t.Fatal(err)
	}

	r.freeze()
	frozeAt := time.Now()
	// In flight when the freeze begins: each must end with ErrUnavailable,
	// long before its 60 s context.
	type outcome struct {
		name string
		err  error
		took time.Duration
	}
	out := make(chan outcome, 3)
	go func() {
		_, err := c.SendQueueMessage(ctx, kc.QueueMessage{Channel: q, Body: body(1)})
		out <- outcome{"SendQueueMessage", err, time.Since(frozeAt)}
	}()
	go func() {
		_, err := c.SendQueueMessages(ctx, []kc.QueueMessage{{Channel: q, Body: body(2)}, {Channel: q, Body: body(3)}})
		out <- outcome{"SendQueueMessages", err, time.Since(frozeAt)}
	}()
	go func() {
		_, err := c.PublishEvent(ctx, kc.Event{Channel: ev, Body: body(1)})
		out <- outcome{"PublishEvent", err, time.Since(frozeAt)}
	}()
	for range 3 {
		o := <-out
		if !errors.Is(o.err, kc.ErrUnavailable) || !kc.IsRetryable(o.err) {
			t.Errorf("%s during the freeze: %v, want a retryable ErrUnavailable", o.name, o.err)
		}
		t.Logf("%s in flight failed after %v: %v", o.name, o.took.Round(time.Millisecond), o.err)
	}
	if c.Ready() {
		t.Error("still ready after the in-flight calls failed")
	}
	// Each was cut in flight (the server may have stored it): counted, for the
	// proxy's metric and log.
	if got := c.SendsCut(); got != 3 {
		t.Errorf("SendsCut = %d after three calls cut in flight, want 3", got)
	}
	// Without FailFast a call waits for the server as before: here until its
	// own deadline.
	plain, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	if _, err := c.SendQueueMessage(plain, kc.QueueMessage{Channel: q, Body: body(9)}); !errors.Is(err, kc.ErrTimeout) {
		t.Errorf("SendQueueMessage without FailFast during the outage: %v, want its own deadline", err)
	}
	cancel()
	// During the outage: at once, before anything is sent.
	start := time.Now()
	if _, err := c.SendQueueMessages(ctx, []kc.QueueMessage{{Channel: q, Body: body(4)}}); !errors.Is(err, kc.ErrUnavailable) {
		t.Errorf("SendQueueMessages during the outage: %v, want ErrUnavailable", err)
	}
	if _, err := c.PublishEvent(ctx, kc.Event{Channel: ev, Body: body(2)}); !errors.Is(err, kc.ErrUnavailable) {
		t.Errorf("PublishEvent during the outage: %v, want ErrUnavailable", err)
	}
	t.Logf("calls during the outage failed after %v", time.Since(start).Round(time.Microsecond))

	r.unfreeze()
	thawedAt := time.Now()
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("ready again %v after the thaw", time.Since(thawedAt).Round(time.Millisecond))
	if _, err := c.SendQueueMessage(ctx, kc.QueueMessage{Channel: q, Body: body(5)}); err != nil {
		t.Errorf("SendQueueMessage after the thaw: %v", err)
	}
	if _, err := c.PublishEvent(ctx, kc.Event{Channel: ev, Body: body(3)}); err != nil {
		t.Errorf("PublishEvent after the thaw: %v", err)
	}
}

// TestSlowPingsWithTrafficStayReady: health pings that time out do not
// declare an outage while other calls get answers (a busy or CPU-starved
// server, not a frozen one); once the traffic stops, the silence does.
func TestSlowPingsWithTrafficStayReady(t *testing.T) {
	var stall atomic.Bool
	stallPings := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if stall.Load() && strings.HasSuffix(method, "/Ping") {
			<-ctx.Done() // a ping that never comes back in time
			return status.FromContextError(ctx.Err()).Err()
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	c, err := kc.Dial(context.Background(), kc.Options{Address: kubemqtest.Address(t), Logger: zaptest.NewLogger(t),
		PingInterval: 100 * time.Millisecond, PingTimeout: 200 * time.Millisecond, OutageSilence: time.Second,
		DialOptions: []grpc.DialOption{grpc.WithUnaryInterceptor(stallPings)}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := timeout(t, 60*time.Second)
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	q := fresh(t, "q")
	var downs atomic.Int32
	defer c.OnStateChange(func(up bool) {
		if !up {
			downs.Add(1)
		}
	})()
	stall.Store(true)
	// Traffic answered every 20 ms, through about 15 ping timeouts.
	for i := 0; i < 150; i++ {
		if _, err := c.SendQueueMessage(ctx, kc.QueueMessage{Channel: q, Body: body(i)}); err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n := downs.Load(); n != 0 || !c.Ready() {
		t.Fatalf("declared down %d times while the server answered traffic", n)
	}
	// No traffic: the pings alone speak, and they time out.
	deadline := time.Now().Add(10 * time.Second)
	for c.Ready() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if c.Ready() {
		t.Fatal("still ready with every ping timing out and no traffic")
	}
	stall.Store(false)
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
}
