package gcp_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/kubemq-io/kubemq-proxy/delivery"
)

// awaitReady waits until the proxy's KubeMQ client reports up (or down).
func (e *env) awaitReady(ctx context.Context, up bool) {
	e.t.Helper()
	ch := e.kc.StateChanges()
	for {
		select {
		case s, ok := <-ch:
			if !ok {
				e.t.Fatal("client closed")
			}
			if s == up {
				return
			}
		case <-ctx.Done():
			e.t.Fatalf("KubeMQ client never became ready=%v", up)
		}
	}
}

// TestBackendOutage: KubeMQ becomes unreachable while a Go client
// receives. Every RPC answers UNAVAILABLE meanwhile; on recovery the
// leases are dropped (the lease records give the messages back), the
// pollers rebuild, and Receive continues by itself and gets every message,
// including the one its callback held across the outage.
func TestBackendOutage(t *testing.T) {
	e := startEnv(t, withRelay(), withDelivery(delivery.Options{RecordDelay: time.Second}))
	ctx := ctxT(t, 2*time.Minute)
	tid, sid := e.id("t"), e.id("s")
	e.createTopic(ctx, tid)
	e.createSub(ctx, &pubsubpb.Subscription{Name: e.subName(sid), Topic: e.topicName(tid)})
	c := e.v2()

	var mu sync.Mutex
	got := map[string]int{}
	changed := make(chan struct{}, 1)
	release := make(chan struct{})
	heldOnce := false
	rctx, stop := context.WithCancel(ctx)
	recvDone := make(chan error, 1)
	go func() {
		recvDone <- c.Subscriber(sid).Receive(rctx, func(_ context.Context, m *pubsub.Message) {
			mu.Lock()
			got[m.ID]++
			hold := m.Attributes["hold"] == "1" && !heldOnce
			if hold {
				heldOnce = true
			}
			mu.Unlock()
			select {
			case changed <- struct{}{}:
			default:
			}
			if hold {
				<-release // leased across the outage; the late ack is stale
			}
			m.Ack()
		})
	}()
	waitFor := func(ids []string, what string) {
		t.Helper()
		for {
			mu.Lock()
			missing := 0
			for _, id := range ids {
				if got[id] == 0 {
					missing++
				}
			}
			mu.Unlock()
			if missing == 0 {
				return
			}
			select {
			case <-changed:
			case <-ctx.Done():
				t.Fatalf("%s: %d of %d messages never received", what, missing, len(ids))
			}
		}
	}
	pub := func(n int, attrs map[string]string) []string {
		p := c.Publisher(tid)
		defer p.Stop()
		rs := make([]*pubsub.PublishResult, n)
		for i := range rs {
			rs[i] = p.Publish(ctx, &pubsub.Message{Data: []byte("x"), Attributes: attrs})
		}
		ids := make([]string, n)
		for i, r := range rs {
			id, err := r.Get(ctx)
			if err != nil {
				t.Fatal(err)
			}
			ids[i] = id
		}
		return ids
	}
	before := pub(20, nil)
	held := pub(1, map[string]string{"hold": "1"})
	waitFor(append(before, held...), "before the outage")

	e.relay.cut()
	e.awaitReady(ctx, false)
	sc, pc := rawSubscriber(t, e), rawPublisher(t, e)
	short := func() context.Context { return ctxT(t, 5*time.Second) }
	_, err := pc.GetTopic(short(), &pubsubpb.GetTopicRequest{Topic: e.topicName(tid)})
	wantCode(t, err, codes.Unavailable, "")
	_, err = pc.Publish(short(), &pubsubpb.PublishRequest{Topic: e.topicName(tid), Messages: []*pubsubpb.PubsubMessage{{Data: []byte("x")}}})
	wantCode(t, err, codes.Unavailable, "")
	_, err = sc.Pull(short(), &pubsubpb.PullRequest{Subscription: e.subName(sid), MaxMessages: 1})
	wantCode(t, err, codes.Unavailable, "")
	_, err = sc.Acknowledge(short(), &pubsubpb.AcknowledgeRequest{Subscription: e.subName(sid), AckIds: []string{"x"}})
	wantCode(t, err, codes.Unavailable, "")

	e.relay.restore()
	e.awaitReady(ctx, true)
	close(release)
	after := pub(20, nil)
	waitFor(after, "after the outage")
	// The held message's lease was dropped with the outage: its record
	// brings it back, and Receive gets it again.
	for {
		mu.Lock()
		n := got[held[0]]
		mu.Unlock()
		if n >= 2 {
			break
		}
		select {
		case <-changed:
		case <-ctx.Done():
			t.Fatal("the message leased across the outage was not redelivered")
		}
	}
	stop()
	if err := <-recvDone; err != nil {
		t.Fatalf("Receive: %v", err)
	}
}

// TestRecreatedSubscriptionIsolated: a subscription deleted and created
// again under the same id never receives the old incarnation's messages,
// not even a nack copy whose retry backoff ends after the re-creation.
func TestRecreatedSubscriptionIsolated(t *testing.T) {
	e := startEnv(t, withDelivery(delivery.Options{RecordDelay: time.Second}))
	ctx := ctxT(t, time.Minute)
	tid, sid := e.id("t"), e.id("s")
	e.createTopic(ctx, tid)
	sub := &pubsubpb.Subscription{Name: e.subName(sid), Topic: e.topicName(tid),
		RetryPolicy: &pubsubpb.RetryPolicy{MinimumBackoff: durationpb.New(2 * time.Second), MaximumBackoff: durationpb.New(2 * time.Second)}}
	e.createSub(ctx, sub)
	sc := rawSubscriber(t, e)
	publishN(t, ctx, e.v2(), tid, 3, "")
	var old []*pubsubpb.ReceivedMessage
	for len(old) < 3 {
		old = append(old, pull(t, ctx, sc, e.subName(sid), 3)...)
	}
	// One nacked (its copy is due in 2 s), one left leased, one acked.
	if _, err := sc.ModifyAckDeadline(ctx, &pubsubpb.ModifyAckDeadlineRequest{Subscription: e.subName(sid), AckIds: []string{old[0].AckId}}); err != nil {
		t.Fatal(err)
	}
	if _, err := sc.Acknowledge(ctx, &pubsubpb.AcknowledgeRequest{Subscription: e.subName(sid), AckIds: []string{old[2].AckId}}); err != nil {
		t.Fatal(err)
	}
	if _, err := sc.DeleteSubscription(ctx, &pubsubpb.DeleteSubscriptionRequest{Subscription: e.subName(sid)}); err != nil {
		t.Fatal(err)
	}
	e.createSub(ctx, sub)
	fresh := publishN(t, ctx, e.v2(), tid, 1, "")
	// Long enough for the nack copy (2 s) and the lease records (1 s).
	deadline := time.Now().Add(6 * time.Second)
	var got []string
	for time.Now().Before(deadline) {
		pctx, cancel := context.WithDeadline(ctx, deadline)
		resp, err := sc.Pull(pctx, &pubsubpb.PullRequest{Subscription: e.subName(sid), MaxMessages: 10})
		cancel()
		if err != nil {
			break
		}
		for _, m := range resp.ReceivedMessages {
			got = append(got, m.Message.MessageId)
			sc.Acknowledge(ctx, &pubsubpb.AcknowledgeRequest{Subscription: e.subName(sid), AckIds: []string{m.AckId}})
		}
	}
	if len(got) != 1 || got[0] != fresh[0] {
		t.Fatalf("re-created subscription received %v, want only %v", got, fresh)
	}
}

// TestOrderingSurvivesOutage: an ordered key has its first messages out
// and the rest waiting behind them when KubeMQ becomes unreachable; the leases are
// dropped and come back from their records after later messages of the
// key were published. The key must still be delivered in publish order,
// from its first unacked message on.
func TestOrderingSurvivesOutage(t *testing.T) {
	e := startEnv(t, withRelay(), withDelivery(delivery.Options{RecordDelay: 5 * time.Second}))
	ctx := ctxT(t, 2*time.Minute)
	tid, sid := e.id("t"), e.id("s")
	e.createTopic(ctx, tid)
	e.createSub(ctx, &pubsubpb.Subscription{Name: e.subName(sid), Topic: e.topicName(tid), EnableMessageOrdering: true, AckDeadlineSeconds: 10})
	c := e.v2()
	const first, total = 10, 20
	publishKeyed(t, ctx, c, tid, 0, first)
	sc := rawSubscriber(t, e)
	leaseFirst(t, ctx, sc, e.subName(sid))

	// A Pull waits (the key's first messages are out to another Pull, so
	// nothing else is deliverable to it)
	// when KubeMQ goes away: the runtime hears that its leases are lost.
	waiting := make(chan error, 1)
	go func() {
		_, err := sc.Pull(ctx, &pubsubpb.PullRequest{Subscription: e.subName(sid), MaxMessages: 10})
		waiting <- err
	}()
	for waiters := 0; waiters == 0; {
		for _, st := range e.dm.Stats() {
			waiters += st.Waiters
		}
		select {
		case <-ctx.Done():
			t.Fatal("the Pull never reached the lease engine")
		case <-time.After(10 * time.Millisecond):
		}
	}
	e.relay.cut()
	e.awaitReady(ctx, false)
	wantCode(t, <-waiting, codes.Unavailable, "")
	e.relay.restore()
	e.awaitReady(ctx, true)
	publishKeyed(t, ctx, c, tid, first, total)
	drainKeyInOrder(t, ctx, sc, e.subName(sid), total, "outage")
}
