package gcp_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pubsubv1 "cloud.google.com/go/pubsub"
	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
)

// invalidAckIDs is the ack ids an exactly-once answer lists as invalid
// (nil for OK); it fails on any other outcome.
func invalidAckIDs(t *testing.T, err error) map[string]string {
	t.Helper()
	if err == nil {
		return nil
	}
	st := status.Convert(err)
	if st.Code() != codes.FailedPrecondition {
		t.Fatalf("got %v, want FAILED_PRECONDITION", err)
	}
	for _, d := range st.Details() {
		if ei, ok := d.(*errdetails.ErrorInfo); ok {
			return ei.Metadata
		}
	}
	t.Fatalf("no ErrorInfo in %v", err)
	return nil
}

// TestExactlyOnceAckIDs: on an exactly-once subscription an ack or modack
// of an id that settles nothing (already acked, unknown, past its
// deadline) fails for that id alone with PERMANENT_FAILURE_INVALID_ACK_ID;
// the valid ids of the request are applied; a seek makes acked messages
// deliverable again. At-least-once subscriptions keep answering OK.
func TestExactlyOnceAckIDs(t *testing.T) {
	e := startEnv(t)
	ctx := ctxT(t, 2*time.Minute)
	tid, sid, plain := e.id("t"), e.id("s"), e.id("plain")
	e.createTopic(ctx, tid)
	e.createSub(ctx, &pubsubpb.Subscription{Name: e.subName(sid), Topic: e.topicName(tid), AckDeadlineSeconds: 30, EnableExactlyOnceDelivery: true})
	e.createSub(ctx, &pubsubpb.Subscription{Name: e.subName(plain), Topic: e.topicName(tid)})
	t0 := time.Now()
	publishN(t, ctx, e.v2(), tid, 3, "")
	sc := rawSubscriber(t, e)
	var got []*pubsubpb.ReceivedMessage
	for len(got) < 3 {
		got = append(got, pull(t, ctx, sc, e.subName(sid), int32(3-len(got)))...)
	}
	ack := func(ids ...string) error {
		_, err := sc.Acknowledge(ctx, &pubsubpb.AcknowledgeRequest{Subscription: e.subName(sid), AckIds: ids})
		return err
	}
	modack := func(secs int32, ids ...string) error {
		_, err := sc.ModifyAckDeadline(ctx, &pubsubpb.ModifyAckDeadlineRequest{Subscription: e.subName(sid), AckIds: ids, AckDeadlineSeconds: secs})
		return err
	}
	if md := invalidAckIDs(t, ack(got[0].AckId)); md != nil {
		t.Fatalf("first ack: %v", md)
	}
	md := invalidAckIDs(t, ack(got[0].AckId, "bogus.1", got[1].AckId))
	if len(md) != 2 || md[got[0].AckId] != "PERMANENT_FAILURE_INVALID_ACK_ID" || md["bogus.1"] != "PERMANENT_FAILURE_INVALID_ACK_ID" {
		t.Fatalf("second ack: %v", md)
	}
	// got[1] was acked by that request: nothing to modack.
	if md := invalidAckIDs(t, modack(60, got[1].AckId)); md[got[1].AckId] == "" {
		t.Fatalf("modack of an acked message: %v", md)
	}
	// A deadline that passed: the lease is invalid even before it is swept.
	if md := invalidAckIDs(t, modack(1, got[2].AckId)); md != nil {
		t.Fatal(md)
	}
	time.Sleep(1100 * time.Millisecond)
	if md := invalidAckIDs(t, ack(got[2].AckId)); md[got[2].AckId] == "" {
		t.Fatalf("ack after the deadline: %v", md)
	}
	// It is delivered again (with a new ack id) and acked for good.
	var again []*pubsubpb.ReceivedMessage
	for len(again) == 0 {
		again = pull(t, ctx, sc, e.subName(sid), 10)
	}
	if len(again) != 1 || again[0].Message.MessageId != got[2].Message.MessageId {
		t.Fatalf("redelivered: %v", again)
	}
	if md := invalidAckIDs(t, ack(again[0].AckId)); md != nil {
		t.Fatal(md)
	}
	// A seek brings acked messages back, exactly-once or not.
	if err := seekTo(ctx, e, sid, t0); err != nil {
		t.Fatal(err)
	}
	back := map[string]bool{}
	for len(back) < 3 {
		for _, m := range pull(t, ctx, sc, e.subName(sid), 10) {
			back[m.Message.MessageId] = true
			if md := invalidAckIDs(t, ack(m.AckId)); md != nil {
				t.Fatal(md)
			}
		}
	}
	// A subscription without exactly-once: stale ids are a no-op.
	if _, err := sc.Acknowledge(ctx, &pubsubpb.AcknowledgeRequest{Subscription: e.subName(plain), AckIds: []string{"bogus.1"}}); err != nil {
		t.Fatal(err)
	}
}

// TestExactlyOnceWithResult: the Go clients' AckWithResult reports
// success for acks that took and INVALID_ACK_ID for an ack id made stale
// (a seek); under redelivery pressure (nacks and a short deadline) no
// message is delivered again after an ack that succeeded.
func TestExactlyOnceWithResult(t *testing.T) {
	e := startEnv(t)
	ctx := ctxT(t, 3*time.Minute)
	tid, sid := e.id("t"), e.id("s")
	e.createTopic(ctx, tid)
	e.createSub(ctx, &pubsubpb.Subscription{Name: e.subName(sid), Topic: e.topicName(tid), AckDeadlineSeconds: 10, EnableExactlyOnceDelivery: true})
	const n = 200
	ids := publishN(t, ctx, e.v2(), tid, n, "")

	var mu sync.Mutex
	deliveries := map[string]int{}
	ackedAt := map[string]int{} // delivery number whose ack succeeded
	var late []string
	var wg sync.WaitGroup
	rctx, cancel := context.WithCancel(ctx)
	sub := e.v2().Subscriber(sid)
	sub.ReceiveSettings.MaxOutstandingMessages = 50
	done := make(chan error, 1)
	go func() {
		done <- sub.Receive(rctx, func(_ context.Context, m *pubsub.Message) {
			mu.Lock()
			deliveries[m.ID]++
			k := deliveries[m.ID]
			if _, ok := ackedAt[m.ID]; ok {
				late = append(late, m.ID)
			}
			mu.Unlock()
			if k == 1 && m.ID[len(m.ID)-1]%3 == 0 {
				m.Nack() // pressure: a third comes back at once
				return
			}
			r := m.AckWithResult()
			wg.Add(1)
			go func() {
				defer wg.Done()
				st, err := r.Get(ctx)
				mu.Lock()
				defer mu.Unlock()
				if st == pubsub.AcknowledgeStatusSuccess {
					if _, ok := ackedAt[m.ID]; ok {
						t.Errorf("message %s acked successfully twice", m.ID)
					}
					ackedAt[m.ID] = k
				} else {
					t.Logf("ack of %s (delivery %d): %v %v", m.ID, k, st, err)
				}
			}()
		})
	}()
	for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		mu.Lock()
		k := len(ackedAt)
		mu.Unlock()
		if k == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d acked", k, n)
		}
	}
	time.Sleep(2 * time.Second) // anything delivered after its ack would show now
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if len(late) > 0 {
		t.Fatalf("delivered after a successful ack: %v", late)
	}
	for _, id := range ids {
		if ackedAt[id] == 0 {
			t.Fatalf("message %s never acked", id)
		}
	}

	// A stale ack id (the subscription was seeked meanwhile): the v1
	// client's AckWithResult says INVALID_ACK_ID.
	publishN(t, ctx, e.v2(), tid, 1, "")
	held := make(chan *pubsubv1.Message, 1)
	rctx, cancel = context.WithCancel(ctx)
	v1sub := e.v1().Subscription(sid)
	go func() {
		done <- v1sub.Receive(rctx, func(_ context.Context, m *pubsubv1.Message) {
			select {
			case held <- m:
			default:
				m.Nack()
			}
		})
	}()
	m := <-held
	if err := seekTo(ctx, e, sid, time.Now().Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	st, err := m.AckWithResult().Get(ctx)
	cancel()
	<-done
	if st != pubsubv1.AcknowledgeStatusInvalidAckID {
		t.Fatalf("ack after a seek: %v %v, want INVALID_ACK_ID", st, err)
	}
}
