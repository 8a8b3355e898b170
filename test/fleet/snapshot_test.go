package fleet

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
)

// TestPubSubFleetSnapshotUndisturbed: a CreateSnapshot issued through a replica that does not
// hold the subscription (forwarded to the holder) while the holder's subscriber receives a
// backlog steadily: no message is delivered twice (acked or held leased), and a seek to the
// snapshot brings back every message the client held then.
func TestPubSubFleetSnapshotUndisturbed(t *testing.T) {
	if testing.Short() {
		t.Skip("a fleet of processes: over 30 s")
	}
	f := newFleet(t, 2)
	topic, sub := f.setupSub(t, "snap-"+f.suffix, func(s *pubsubpb.Subscription) { s.AckDeadlineSeconds = 60 })
	q := f.subQueue(t, sub)
	a := f.replicas[0]
	const n = 3000
	ids := publishBatch(t, a, topic, "m", n)

	// a's subscriber acks all but every tenth message, which it holds until after the snapshot.
	var cur sync.Map // *ledger, under key 0
	cur.Store(0, newLedger())
	var heldMu sync.Mutex
	var held []*pubsub.Message
	var holding sync.Map // id -> true while the snapshot is taken
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	sa := a.pubsub(t).Subscriber(sub)
	sa.ReceiveSettings.MaxOutstandingMessages = 1000
	sa.ReceiveSettings.NumGoroutines = 1
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			err := sa.Receive(ctx, func(_ context.Context, m *pubsub.Message) {
				v, _ := cur.Load(0)
				l := v.(*ledger)
				id := m.Attributes["n"]
				l.deliver(id, a.name)
				if i, _ := strconv.Atoi(strings.TrimPrefix(id, "m")); i%10 == 0 {
					if _, again := holding.LoadOrStore(id, true); !again {
						heldMu.Lock()
						held = append(held, m)
						heldMu.Unlock()
						return
					}
				}
				time.Sleep(2 * time.Millisecond) // a steady consumer, not a drain
				m.Ack()
				l.ack(id)
			})
			if err != nil && ctx.Err() == nil {
				t.Errorf("%s: Receive ended: %v", a.name, err)
				time.Sleep(100 * time.Millisecond)
			}
		}
	}()
	v, _ := cur.Load(0)
	l1 := v.(*ledger)
	l1.waitFor(t, 300, 2*time.Minute)
	h := f.holder(t, q, 30*time.Second)
	if h != a {
		t.Fatalf("%s holds the subscription; only %s consumed it", h.name, a.name)
	}
	b := f.others(h)[0]
	before := b.forwarded(t)
	snap := strings.Replace(sub, "/subscriptions/", "/snapshots/", 1)
	sctx, scancel := context.WithTimeout(ctx, 2*time.Minute)
	start := time.Now()
	_, err := b.pubsub(t).SubscriptionAdminClient.CreateSnapshot(sctx, &pubsubpb.CreateSnapshotRequest{Name: snap, Subscription: sub})
	took := time.Since(start)
	scancel()
	if err != nil {
		t.Fatalf("CreateSnapshot through %s: %v", b.name, err)
	}
	if after := b.forwarded(t); after <= before {
		t.Fatalf("CreateSnapshot through %s was not forwarded (forwarded calls %v, then %v)", b.name, before, after)
	}
	l1.waitFor(t, n, 3*time.Minute)
	heldMu.Lock()
	nHeld := len(held)
	heldIDs := make([]string, 0, nHeld)
	for _, m := range held {
		heldIDs = append(heldIDs, m.Attributes["n"])
		m.Ack()
		l1.ack(m.Attributes["n"])
	}
	heldMu.Unlock()
	time.Sleep(5 * time.Second) // a redelivery would show here
	dups, afterAck, _ := l1.report(t, ids)
	t.Logf("FLEET pubsub snapshot through %s (holder %s) in %v while receiving: %d held leased, %d duplicates, %d after ack",
		b.name, h.name, took.Round(time.Millisecond), nHeld, dups, afterAck)
	if !f.excused(dups, "deliveries beyond the first") {
		t.Errorf("%d deliveries beyond the first while and after the snapshot was taken", dups)
	}
	if nHeld != n/10 {
		t.Errorf("the client held %d messages, want %d", nHeld, n/10)
	}

	// The seek to the snapshot brings back every message held then.
	l2 := newLedger()
	cur.Store(0, l2)
	if _, err := b.pubsub(t).SubscriptionAdminClient.Seek(ctx, &pubsubpb.SeekRequest{Subscription: sub,
		Target: &pubsubpb.SeekRequest_Snapshot{Snapshot: snap}}); err != nil {
		t.Fatalf("seek to the snapshot through %s: %v", b.name, err)
	}
	deadline := time.After(2 * time.Minute)
	for {
		l2.mu.Lock()
		missing := 0
		for _, id := range heldIDs {
			if l2.deliveries[id] == 0 {
				missing++
			}
		}
		l2.mu.Unlock()
		if missing == 0 {
			break
		}
		select {
		case <-l2.changed:
		case <-deadline:
			t.Fatalf("%d of the %d messages held at the snapshot not delivered after the seek", missing, nHeld)
		}
	}
	cancel()
	wg.Wait()
	f.checkProblems()
}
