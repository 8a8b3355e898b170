package kubemqclient_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/kubemq-io/kubemq-proxy/embedded"
	"github.com/kubemq-io/kubemq-proxy/internal/kubemqtest"
	kc "github.com/kubemq-io/kubemq-proxy/kubemqclient"
)

type observation struct {
	d   time.Duration
	err error
}

// recorder collects Options.Observe calls by op.
type recorder struct {
	mu  sync.Mutex
	ops map[string][]observation
}

func (r *recorder) observe(op string, d time.Duration, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ops[op] = append(r.ops[op], observation{d, err})
}

// take returns and forgets what was recorded for op.
func (r *recorder) take(op string) []observation {
	r.mu.Lock()
	defer r.mu.Unlock()
	o := r.ops[op]
	delete(r.ops, op)
	return o
}

func dialObserved(t *testing.T, addr string) (*kc.Client, *recorder) {
	t.Helper()
	r := &recorder{ops: map[string][]observation{}}
	c, err := kc.Dial(context.Background(), kc.Options{Address: addr, Conn: kubemqtest.Link(addr), Logger: zaptest.NewLogger(t), Observe: r.observe})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if err := c.WaitReady(timeout(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	return c, r
}

// TestObserve: every operation reports itself once per call, with a
// plausible duration and its outcome; local refusals are not reported.
func TestObserve(t *testing.T) {
	c, r := dialObserved(t, kubemqtest.Address(t))
	seen := map[string]bool{}
	// once checks that op was observed exactly n times since the last
	// check, successfully, within a sane time.
	once := func(op string, n int) {
		t.Helper()
		obs := r.take(op)
		if len(obs) != n {
			t.Fatalf("%s observed %d times, want %d: %v", op, len(obs), n, obs)
		}
		for _, o := range obs {
			if o.err != nil || o.d <= 0 || o.d > 10*time.Second {
				t.Fatalf("%s observed %v, %v", op, o.d, o.err)
			}
		}
		seen[op] = true
	}
	ctx := timeout(t, 60*time.Second)
	q, dst, evc := fresh(t, "q"), fresh(t, "dst"), fresh(t, "ev")

	if _, err := c.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	// The health loop pings too: at least ours.
	if obs := r.take(kc.OpPing); len(obs) < 1 || obs[len(obs)-1].err != nil {
		t.Fatalf("ping observed %v", obs)
	}
	seen[kc.OpPing] = true

	if _, err := c.SendQueueMessage(ctx, kc.QueueMessage{Channel: q, Body: body(0)}); err != nil {
		t.Fatal(err)
	}
	once(kc.OpSendQueue, 1)
	sendN(t, c, q, 1, 9)
	once(kc.OpSendQueueBatch, 1)
	if _, err := c.QueuesInfo(ctx, q); err != nil {
		t.Fatal(err)
	}
	once(kc.OpQueuesInfo, 1)
	if _, err := c.ReceiveQueueMessages(ctx, q, 1, time.Second, true); err != nil {
		t.Fatal(err)
	}
	once(kc.OpReceiveQueue, 1)

	up, err := c.OpenUpstream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = up.Close() })
	once(kc.OpUpstreamOpen, 1)
	for i := range 3 {
		if _, err := up.Send(ctx, []kc.QueueMessage{{Channel: q, Body: body(10 + i)}}); err != nil {
			t.Fatal(err)
		}
	}
	once(kc.OpUpstreamSend, 3)

	ds := openDS(t, c)
	once(kc.OpDownstreamOpen, 1)
	// Strict mode allows one open transaction per queue and stream, so each
	// Get is settled before the next.
	getTx := func() *kc.Transaction {
		t.Helper()
		tx := get(t, ds, q, 2, time.Second)
		if len(tx.Messages) != 2 {
			t.Fatalf("Get: %d messages", len(tx.Messages))
		}
		once(kc.OpDownstreamGet, 1)
		return tx
	}
	tx := getTx()
	if _, err := ds.ActiveOffsets(ctx, tx.ID); err != nil {
		t.Fatal(err)
	}
	once(kc.OpDownstreamOffsets, 1)
	if err := ds.AckRange(tx.ID, kc.Sequences(tx.Messages[:1])); err != nil {
		t.Fatal(err)
	}
	if err := ds.AckAll(tx.ID); err != nil {
		t.Fatal(err)
	}
	once(kc.OpDownstreamAck, 2)
	if err := ds.NAckAll(getTx().ID); err != nil {
		t.Fatal(err)
	}
	once(kc.OpDownstreamNack, 1)
	if err := ds.ReQueueAll(getTx().ID, dst); err != nil {
		t.Fatal(err)
	}
	once(kc.OpDownstreamRequeue, 1)
	tx = getTx()
	if err := ds.CloseByClient(tx.ID); err != nil {
		t.Fatal(err)
	}
	once(kc.OpDownstreamCloseTx, 1)
	if err := ds.Sync(ctx, tx.ID); err != nil {
		t.Fatal(err)
	}
	once(kc.OpDownstreamSync, 1)

	if n, err := c.AckAllQueueMessages(ctx, dst, time.Second); err != nil || n != 2 {
		t.Fatalf("AckAllQueueMessages: %d %v", n, err)
	}
	once(kc.OpAckAllQueue, 1)

	sub := subscribe(t, c, kc.SubscribeOptions{Channel: evc, Start: kc.StartPosition{Mode: kc.StartFromFirst}})
	once(kc.OpSubscribeOpen, 1)
	publish(t, c, evc, 0, 3)
	once(kc.OpPublishEvents, 1)
	recvN(t, sub, 3)

	sendN(t, c, q, 20, 3)
	once(kc.OpSendQueueBatch, 1)
	vis := []struct {
		op string
		f  func(v *kc.VisibleMessage) error
	}{
		{kc.OpVisibilityExtend, func(v *kc.VisibleMessage) error { return v.ExtendVisibility(ctx, 10*time.Second) }},
		{kc.OpVisibilityAck, func(v *kc.VisibleMessage) error { return v.Ack(ctx) }},
		{kc.OpVisibilityReject, func(v *kc.VisibleMessage) error { return v.Reject(ctx) }},
		{kc.OpVisibilityResend, func(v *kc.VisibleMessage) error { return v.Resend(ctx, dst) }},
		{kc.OpVisibilitySendModified, func(v *kc.VisibleMessage) error {
			return v.SendModified(ctx, kc.QueueMessage{Channel: dst, Body: []byte("modified")})
		}},
	}
	for _, s := range vis {
		v, err := c.ReceiveWithVisibility(ctx, q, 5*time.Second, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		once(kc.OpVisibilityReceive, 1)
		if err := s.f(v); err != nil {
			t.Fatalf("%s: %v", s.op, err)
		}
		once(s.op, 1)
		_ = v.Close()
	}

	// Local refusals never reach the server and are not observed.
	if _, err := c.QueuesInfo(ctx, "bad name"); !errors.Is(err, kc.ErrInvalidChannel) {
		t.Fatalf("bad name: %v", err)
	}
	if _, err := ds.Get(ctx, kc.GetRequest{Channel: q}); !errors.Is(err, kc.ErrInvalidArgument) {
		t.Fatalf("Get MaxItems 0: %v", err)
	}
	once(kc.OpQueuesInfo, 0)
	once(kc.OpDownstreamGet, 0)

	// A failing call reports its error: the server waits for a message
	// that does not come.
	empty := fresh(t, "empty")
	if _, err := c.ReceiveWithVisibility(ctx, empty, 5*time.Second, time.Second); !errors.Is(err, kc.ErrWaitExpired) {
		t.Fatalf("empty queue: %v", err)
	}
	obs := r.take(kc.OpVisibilityReceive)
	if len(obs) != 1 || !errors.Is(obs[0].err, kc.ErrWaitExpired) || obs[0].d < 900*time.Millisecond || obs[0].d > 10*time.Second {
		t.Fatalf("wait-expired receive observed as %v", obs)
	}
	var kerr *kc.Error
	if !errors.As(obs[0].err, &kerr) || kerr.Code != 138 {
		t.Fatalf("observed error %#v, want *Error 138", obs[0].err)
	}
	// And a call cut short by its context reports that.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := c.QueuesInfo(cctx); !errors.Is(err, kc.ErrCanceled) {
		t.Fatalf("cancelled QueuesInfo: %v", err)
	}
	if obs := r.take(kc.OpQueuesInfo); len(obs) != 1 || !errors.Is(obs[0].err, kc.ErrCanceled) {
		t.Fatalf("cancelled QueuesInfo observed as %v", obs)
	}

	for _, op := range kc.ObservedOps() {
		if !seen[op] {
			t.Errorf("%s never observed", op)
		}
	}
}

// TestObserveUnavailable: calls to a server that is gone report
// ErrUnavailable.
func TestObserveUnavailable(t *testing.T) {
	if kubemqtest.External() {
		t.Skip("needs a server the test can stop")
	}
	addr, srv := kubemqtest.StartEmbedded(t, embedded.Options{Strict: true, Logger: zap.NewNop()})
	c, r := dialObserved(t, addr)
	srv.Close()
	if _, err := c.SendQueueMessage(timeout(t, 10*time.Second), kc.QueueMessage{Channel: fresh(t, "q"), Body: body(0)}); !errors.Is(err, kc.ErrUnavailable) {
		t.Fatalf("send to a stopped server: %v", err)
	}
	obs := r.take(kc.OpSendQueue)
	if len(obs) != 1 || !errors.Is(obs[0].err, kc.ErrUnavailable) || obs[0].d <= 0 {
		t.Fatalf("observed %v", obs)
	}
}

// TestObservedOps: the names are distinct and label-safe.
func TestObservedOps(t *testing.T) {
	ops := kc.ObservedOps()
	if len(ops) == 0 || len(slices.Compact(slices.Sorted(slices.Values(ops)))) != len(ops) {
		t.Fatalf("ops not distinct: %v", ops)
	}
	for _, op := range ops {
		for _, b := range []byte(op) {
			if !(b >= 'a' && b <= 'z' || b == '_') {
				t.Fatalf("op %q is not [a-z_]", op)
			}
		}
	}
	ops[0] = "changed"
	if kc.ObservedOps()[0] == "changed" {
		t.Fatal("ObservedOps returns its own slice")
	}
}

// BenchmarkObserve is the per-call cost of Options.Observe: one-message
// Upstream.Send calls (the smallest pipelined call) against the in-memory
// embedded server, unobserved and with a no-op observer.
func BenchmarkObserve(b *testing.B) {
	if kubemqtest.External() {
		b.Skip("external server")
	}
	addr, _ := kubemqtest.StartEmbedded(b, embedded.Options{Strict: true, Logger: zap.NewNop()})
	for _, bc := range []struct {
		name    string
		observe func(string, time.Duration, error)
	}{
		{"nil", nil},
		{"noop", func(string, time.Duration, error) {}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			c, err := kc.Dial(context.Background(), kc.Options{Address: addr, Conn: kubemqtest.Link(addr), Logger: zap.NewNop(), Observe: bc.observe})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			ctx := timeout(b, time.Minute)
			if err := c.WaitReady(ctx); err != nil {
				b.Fatal(err)
			}
			up, err := c.OpenUpstream(ctx)
			if err != nil {
				b.Fatal(err)
			}
			defer up.Close()
			msgs := []kc.QueueMessage{{Channel: fresh(b, "q"), Body: payload}}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if _, err := up.Send(ctx, msgs); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
