package gcp_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
)

// TestCreateSnapshotLeavesSubscribersAlone: a StreamingPull consumer
// receiving steadily while CreateSnapshot runs over a backlog sees no
// stream error and no message twice (neither acked nor leased ones); the
// messages it held leased are in the snapshot, those whose ack was
// applied before the call are not, and a Seek to the snapshot delivers
// exactly the rest.
func TestCreateSnapshotLeavesSubscribersAlone(t *testing.T) {
	e := startEnv(t)
	ctx := ctxT(t, 5*time.Minute)
	tid, sid := e.id("t"), e.id("s")
	e.createTopic(ctx, tid)
	e.createSub(ctx, &pubsubpb.Subscription{Name: e.subName(sid), Topic: e.topicName(tid), AckDeadlineSeconds: 120})
	s := newSnapTarget(t, e.addr, e.project, e.suffix)
	const total = 3000
	var all []string
	for i := range total {
		all = append(all, fmt.Sprintf("m%05d", i))
	}
	for i := 0; i < total; i += 500 {
		s.publish("t", all[i:i+500]...)
	}

	// The consumer: one raw stream; every tenth message is held (leased,
	// not acked) until after the snapshot, the others are acked by unary
	// Acknowledge, whose return says the ack is applied.
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	stream, err := s.sc.StreamingPull(sctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&pubsubpb.StreamingPullRequest{Subscription: s.sub("s"), StreamAckDeadlineSeconds: 120,
		MaxOutstandingMessages: 1000}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	deliveries := map[string]int{}
	trail := map[string][]string{}    // each delivery's ack id and attempt, for a failure's message
	ackedAt := map[string]time.Time{} // when Acknowledge returned
	ackStart := map[string]time.Time{}
	var held []string // ack ids
	var heldData []string
	progress := make(chan int, 1000)
	streamErr := make(chan error, 1)
	go func() {
		n := 0
		for {
			resp, err := stream.Recv()
			if err != nil {
				streamErr <- err
				return
			}
			for _, m := range resp.ReceivedMessages {
				d := string(m.Message.Data)
				mu.Lock()
				deliveries[d]++
				trail[d] = append(trail[d], fmt.Sprintf("%s@%s attempt %d", m.AckId, time.Now().Format("15:04:05.000"), m.DeliveryAttempt))
				first := deliveries[d] == 1
				mu.Unlock()
				if !first {
					continue
				}
				n++
				var idx int
				fmt.Sscanf(d, "m%d", &idx)
				if idx%10 == 0 {
					mu.Lock()
					held, heldData = append(held, m.AckId), append(heldData, d)
					mu.Unlock()
				} else {
					mu.Lock()
					ackStart[d] = time.Now()
					mu.Unlock()
					if _, err := s.sc.Acknowledge(ctx, &pubsubpb.AcknowledgeRequest{Subscription: s.sub("s"), AckIds: []string{m.AckId}}); err != nil {
						t.Errorf("ack %s: %v", d, err)
					}
					mu.Lock()
					ackedAt[d] = time.Now()
					mu.Unlock()
				}
				time.Sleep(time.Millisecond) // a steady consumer, not a drain
				select {
				case progress <- n:
				default:
				}
			}
		}
	}()
	waitProgress := func(n int) {
		t.Helper()
		for deadline := time.After(2 * time.Minute); ; {
			select {
			case got := <-progress:
				if got >= n {
					return
				}
			case err := <-streamErr:
				t.Fatalf("stream ended: %v", err)
			case <-deadline:
				t.Fatalf("consumer stalled below %d messages", n)
			}
		}
	}
	waitProgress(300)
	t0 := time.Now()
	if _, err := s.sc.CreateSnapshot(ctx, &pubsubpb.CreateSnapshotRequest{Name: s.snap("s"), Subscription: s.sub("s")}); err != nil {
		t.Fatal(err)
	}
	t1 := time.Now()
	// The consumer goes on to the end of the backlog on the same stream.
	waitProgress(total)
	mu.Lock()
	ids := append([]string(nil), held...)
	mu.Unlock()
	if _, err := s.sc.Acknowledge(ctx, &pubsubpb.AcknowledgeRequest{Subscription: s.sub("s"), AckIds: ids}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // a redelivery would show here
	select {
	case err := <-streamErr:
		t.Fatalf("stream ended: %v", err)
	default:
	}
	stop()
	mu.Lock()
	for d, n := range deliveries {
		if n != 1 {
			if e.dm != nil {
				for _, st := range e.dm.Stats() {
					t.Logf("engine: %+v", st)
				}
			}
			t.Errorf("%s delivered %d times before the seek: %v", d, n, trail[d])
		}
	}
	if len(deliveries) != total {
		t.Errorf("%d of %d messages delivered before the seek", len(deliveries), total)
	}
	mu.Unlock()

	if err := s.seek("s", "s"); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	need := 0 // the messages the snapshot must hold
	for _, d := range all {
		if started, began := ackStart[d]; !began || started.After(t1) {
			need++
		}
	}
	mu.Unlock()
	got := map[string]bool{}
	for _, d := range s.drainAtLeast("s", need, 2*time.Second) {
		got[d] = true
	}
	mu.Lock()
	defer mu.Unlock()
	var missing, extra []string
	for _, d := range all {
		applied, acked := ackedAt[d]
		started, began := ackStart[d]
		switch {
		case (!began || started.After(t1)) && !got[d]:
			missing = append(missing, d) // unacked when the snapshot was taken
		case acked && applied.Before(t0) && got[d]:
			extra = append(extra, d) // acked before it
		}
	}
	if len(missing) > 0 || len(extra) > 0 {
		t.Errorf("seek to the snapshot: %d missing (%s), %d acked before it delivered again (%s)",
			len(missing), head(missing), len(extra), head(extra))
	}
	for _, d := range heldData {
		if !got[d] {
			t.Errorf("leased message %s not in the snapshot", d)
			break
		}
	}
	t.Logf("snapshot taken in %v with %d messages acked before it; %d delivered after the seek", t1.Sub(t0), countBefore(ackedAt, t0), len(got))
}

func head(xs []string) string {
	if len(xs) > 5 {
		xs = xs[:5]
	}
	return strings.Join(xs, ",")
}

func countBefore(m map[string]time.Time, t0 time.Time) int {
	n := 0
	for _, at := range m {
		if at.Before(t0) {
			n++
		}
	}
	return n
}
