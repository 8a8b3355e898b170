package fleet

import (
	"context"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
)

// TestPubSubFleetExactlyOnceKill: an exactly-once subscription consumed on every replica, acks
// by AckWithResult; the replica that holds the subscription is killed (-9) mid-run and started
// again. No message is delivered after an ack of it that succeeded, and none is lost. An ack
// whose answer the kill lost may be retried and then reported invalid although it was applied
// (Google's contract has the same ambiguity): such a message is not delivered again, and counts
// as settled with a failed ack.
func TestPubSubFleetExactlyOnceKill(t *testing.T) {
	if testing.Short() {
		t.Skip("a fleet of processes: over 30 s")
	}
	f := newFleet(t, 3)
	topic, sub := f.setupSub(t, "eod-"+f.suffix, func(s *pubsubpb.Subscription) { s.EnableExactlyOnceDelivery = true })
	l := newLedger()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var mu sync.Mutex
	failed := map[pubsub.AcknowledgeStatus]int{}
	failedIDs := map[string]bool{}
	for _, r := range f.replicas {
		c := r.pubsub(t)
		s := c.Subscriber(sub)
		s.ReceiveSettings.MaxOutstandingMessages = 100
		s.ReceiveSettings.NumGoroutines = 1
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				err := s.Receive(ctx, func(_ context.Context, m *pubsub.Message) {
					n := m.Attributes["n"]
					l.deliver(n, r.name)
					st, _ := m.AckWithResult().Get(ctx)
					if st == pubsub.AcknowledgeStatusSuccess {
						l.ack(n)
						return
					}
					mu.Lock()
					failed[st]++
					failedIDs[n] = true
					mu.Unlock()
				})
				if err != nil && ctx.Err() == nil {
					time.Sleep(100 * time.Millisecond)
				}
			}
		}()
	}
	n := messages(t) / 4
	ids := f.publish(t, topic, n, nil)
	// The holder dies while the consumers ack: leases out, acks in flight.
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(20 * time.Millisecond) {
		l.mu.Lock()
		k := len(l.acked)
		l.mu.Unlock()
		if k >= n/3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d messages acked", k, n)
		}
	}
	victim := f.holder(t, f.subQueue(t, sub), 30*time.Second)
	l.mark()
	victim.p.Kill()
	time.Sleep(time.Second)
	victim.start()
	l.waitFor(t, n, 5*time.Minute)
	// Every message settled: acked successfully at last, or its last ack failed and it is not
	// delivered again (checked below with the deliveries after an ack).
	settled := func() (ok, bad int) {
		l.mu.Lock()
		defer l.mu.Unlock()
		mu.Lock()
		defer mu.Unlock()
		for _, id := range ids {
			if _, acked := l.acked[id]; acked {
				ok++
			} else if failedIDs[id] {
				bad++
			}
		}
		return ok, bad
	}
	for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		ok, bad := settled()
		if ok+bad == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d messages acked successfully, %d with a failed ack only", ok, n, bad)
		}
	}
	// Lease records of the killed replica come back a record delay later: none may bring an
	// acked message back.
	time.Sleep(15 * time.Second)
	cancel()
	wg.Wait()
	dups, afterAck, split := l.report(t, ids)
	ok, bad := settled()
	mu.Lock()
	t.Logf("FLEET pubsub exactly-once kill -9: %d messages, %d duplicates, %d after a successful ack, failed acks %v, %d acked successfully, %d settled with a failed ack only, per replica:%s", n, dups, afterAck, failed, ok, bad, split)
	mu.Unlock()
	if afterAck != 0 {
		t.Errorf("%d deliveries of messages whose ack had succeeded", afterAck)
	}
	f.checkProblems()
}
