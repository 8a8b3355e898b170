package fleet

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// publishBatch sends n messages through r, attribute n = prefix0 .. prefix(n-1), and returns
// their ids.
func publishBatch(t testing.TB, r *replica, topic, prefix string, n int) []string {
	t.Helper()
	p := r.pubsub(t).Publisher(topic)
	defer p.Stop()
	ids := make([]string, n)
	var results []*pubsub.PublishResult
	for i := range n {
		ids[i] = fmt.Sprintf("%s%d", prefix, i)
		results = append(results, p.Publish(context.Background(), &pubsub.Message{Data: []byte(ids[i]), Attributes: map[string]string{"n": ids[i]}}))
	}
	for _, res := range results {
		if _, err := res.Get(context.Background()); err != nil {
			t.Fatalf("publish: %v", err)
		}
	}
	return ids
}

// seekVia seeks sub to target through r, which must forward the call (it does not consume the
// subscription).
func seekVia(t testing.TB, r *replica, sub string, target time.Time) {
	t.Helper()
	before := r.forwarded(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := r.pubsub(t).SubscriptionAdminClient.Seek(ctx, &pubsubpb.SeekRequest{Subscription: sub,
		Target: &pubsubpb.SeekRequest_Time{Time: timestamppb.New(target)}}); err != nil {
		t.Fatalf("seek through %s: %v", r.name, err)
	}
	if after := r.forwarded(t); after <= before {
		t.Fatalf("the seek through %s was not forwarded (forwarded calls %v, then %v)", r.name, before, after)
	}
}

// TestPubSubFleetSeek: messages consumed and acked through one replica come back after a seek
// to a time before them issued through another one (forwarded to the holder, which gives up
// what it holds); a seek to now through a replica that does not hold the subscription acks
// everything pending, leased or not.
func TestPubSubFleetSeek(t *testing.T) {
	if testing.Short() {
		t.Skip("a fleet of processes: over 30 s")
	}
	f := newFleet(t, 3)
	topic, sub := f.setupSub(t, "seek-"+f.suffix, nil)
	q := f.subQueue(t, sub)
	a := f.replicas[0]

	// a's subscriber acks into the current ledger, or in hold mode keeps what it gets.
	var cur atomic.Pointer[ledger]
	cur.Store(newLedger())
	var hold atomic.Bool
	var heldMu sync.Mutex
	var held []*pubsub.Message
	heldCh := make(chan struct{}, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	sa := a.pubsub(t).Subscriber(sub)
	sa.ReceiveSettings.MaxOutstandingMessages = 50
	sa.ReceiveSettings.NumGoroutines = 1
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			err := sa.Receive(ctx, func(_ context.Context, m *pubsub.Message) {
				if hold.Load() {
					heldMu.Lock()
					held = append(held, m)
					heldMu.Unlock()
					select {
					case heldCh <- struct{}{}:
					default:
					}
					return
				}
				l := cur.Load()
				l.deliver(m.Attributes["n"], a.name)
				m.Ack()
				l.ack(m.Attributes["n"])
			})
			if err != nil && ctx.Err() == nil {
				t.Logf("%s: Receive ended: %v; again", a.name, err)
				time.Sleep(100 * time.Millisecond)
			}
		}
	}()

	// 1. Consumed and acked through a.
	t0 := time.Now()
	ids1 := publishBatch(t, a, topic, "a", 200)
	l1 := cur.Load()
	l1.waitFor(t, len(ids1), 2*time.Minute)
	time.Sleep(2 * time.Second) // the acks are out
	h := f.holder(t, q, 30*time.Second)
	if h != a {
		t.Fatalf("%s holds the subscription; only %s consumed it", h.name, a.name)
	}
	b := f.others(h)[0]

	// Seek back through b: every message comes again, at the subscribers of any replica.
	l2 := newLedger()
	cur.Store(l2)
	seekVia(t, b, sub, t0.Add(-time.Second))
	octx, ocancel := context.WithCancel(ctx)
	var owg sync.WaitGroup
	for _, r := range f.others(a) {
		receiveOn(octx, t, &owg, r, sub, l2)
	}
	l2.waitFor(t, len(ids1), 2*time.Minute)
	dups, _, split := l2.report(t, ids1)
	t.Logf("FLEET pubsub seek back through %s (holder %s): %d messages delivered again, %d duplicates, per replica:%s", b.name, h.name, len(ids1), dups, split)
	if l2.unique() != len(ids1) {
		t.Errorf("%d distinct messages after the seek back, want %d", l2.unique(), len(ids1))
	}
	ocancel()
	owg.Wait()

	// 2. Pending: 50 or more leased to a's client (held, unacked), the rest in the backlog.
	h = f.holder(t, q, 30*time.Second)
	nb := f.others(h)[0]
	hold.Store(true)
	ids2 := publishBatch(t, f.replicas[2], topic, "b", 150)
	deadline := time.After(time.Minute)
	for {
		heldMu.Lock()
		n := len(held)
		heldMu.Unlock()
		if n >= 50 {
			break
		}
		select {
		case <-heldCh:
		case <-deadline:
			t.Fatalf("%s's client holds %d messages, want 50", a.name, n)
		}
	}
	time.Sleep(time.Second)
	l3 := newLedger()
	cur.Store(l3)
	seekVia(t, nb, sub, time.Now())
	// Were they still leased, the nacks would bring them back at once.
	heldMu.Lock()
	for _, m := range held {
		m.Nack()
	}
	nHeld := len(held)
	heldMu.Unlock()
	hold.Store(false)
	ids3 := publishBatch(t, nb, topic, "c", 50)
	l3.waitFor(t, len(ids3), 2*time.Minute)
	time.Sleep(5 * time.Second)
	l3.report(t, ids3)
	l3.mu.Lock()
	back := 0
	for _, id := range ids2 {
		back += l3.deliveries[id]
	}
	l3.mu.Unlock()
	t.Logf("FLEET pubsub seek to now through %s (holder %s): %d held by the client and %d in the backlog acked, %d of them delivered after it",
		nb.name, h.name, nHeld, len(ids2)-nHeld, back)
	if back != 0 {
		t.Errorf("%d deliveries of messages pending at a seek to now", back)
	}
	cancel()
	wg.Wait()
	f.checkProblems()
}
