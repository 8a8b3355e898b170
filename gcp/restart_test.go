package gcp_test

import (
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/kubemq-io/kubemq-proxy/delivery"
	"github.com/kubemq-io/kubemq-proxy/kubemqclient"
)

// TestRestartKeepsTopologyAndMessages: a new proxy process on the same
// KubeMQ sees the topics and subscriptions (registry records) and delivers
// every unacked message, also those leased when the first one stopped.
func TestRestartKeepsTopologyAndMessages(t *testing.T) {
	e := startEnv(t)
	ctx := ctxT(t, 60*time.Second)
	tid, sid := e.id("t"), e.id("s")
	e.createTopic(ctx, tid)
	e.createSub(ctx, &pubsubpb.Subscription{Name: e.subName(sid), Topic: e.topicName(tid)})
	ids := publishN(t, ctx, e.v2(), tid, 5, "")
	var leased []*pubsubpb.ReceivedMessage
	for len(leased) < 3 {
		leased = append(leased, pull(t, ctx, rawSubscriber(t, e), e.subName(sid), 3-int32(len(leased)))...)
	}
	e.stop()
	e.addr, e.srv, e.stop = e.startReplica()

	if _, err := rawPublisher(t, e).GetTopic(ctx, &pubsubpb.GetTopicRequest{Topic: e.topicName(tid)}); err != nil {
		t.Fatal(err)
	}
	sc := rawSubscriber(t, e)
	// The old ack ids are stale on the new process: a no-op, not an error.
	if _, err := sc.Acknowledge(ctx, &pubsubpb.AcknowledgeRequest{Subscription: e.subName(sid), AckIds: []string{leased[0].AckId}}); err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for len(got) < len(ids) {
		for _, m := range pull(t, ctx, sc, e.subName(sid), 10) {
			got[m.Message.MessageId] = true
			if _, err := sc.Acknowledge(ctx, &pubsubpb.AcknowledgeRequest{Subscription: e.subName(sid), AckIds: []string{m.AckId}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, id := range ids {
		if !got[id] {
			t.Fatalf("message %s lost across the restart", id)
		}
	}
}

// TestCrashRedeliveryAfterAckDeadline: the lease records carry the
// subscription's ack deadline, so when the proxy holding a lease dies
// another one redelivers the message once the deadline (plus the record
// delay) has passed: not earlier, while the lease could still be honoured,
// and not at the engine's own hold time.
func TestCrashRedeliveryAfterAckDeadline(t *testing.T) {
	e := startEnv(t, withDelivery(delivery.Options{RecordDelay: time.Second}))
	ctx := ctxT(t, 90*time.Second)
	tid, sid := e.id("t"), e.id("s")
	e.createTopic(ctx, tid)
	e.createSub(ctx, &pubsubpb.Subscription{Name: e.subName(sid), Topic: e.topicName(tid), AckDeadlineSeconds: 12})

	// Replica A, on a KubeMQ connection of its own, leases the message...
	a, own := e.startCrashableReplica()
	ids := publishN(t, ctx, e.v2(), tid, 1, "")
	var leased []*pubsubpb.ReceivedMessage
	for len(leased) == 0 {
		leased = pull(t, ctx, a, e.subName(sid), 1)
	}
	start := time.Now()
	// ...and dies: it can no longer settle, give back or re-arm anything.
	own.Close()

	b := rawSubscriber(t, e)
	var got []*pubsubpb.ReceivedMessage
	for len(got) == 0 {
		got = pull(t, ctx, b, e.subName(sid), 1)
	}
	took := time.Since(start)
	if got[0].Message.MessageId != ids[0] {
		t.Fatalf("redelivered %s, want %s", got[0].Message.MessageId, ids[0])
	}
	t.Logf("redelivered by the other proxy after %v", took)
	if took < 11*time.Second {
		t.Fatalf("redelivered after %v, before the 12 s ack deadline had passed", took)
	}
}

// TestOrderingSurvivesCrash: a replica holding an ordered key's messages
// (its first ones out to a client, the rest waiting behind them) dies; later messages of
// the key are published meanwhile. The surviving replica, which did not
// create the subscription, must deliver the key from its first unacked
// message on, in publish order, although the returning messages come back
// from their lease records after the later ones were fetched.
func TestOrderingSurvivesCrash(t *testing.T) {
	e := startEnv(t, withDelivery(delivery.Options{RecordDelay: time.Second}))
	ctx := ctxT(t, 120*time.Second)
	tid, sid := e.id("t"), e.id("s")
	e.createTopic(ctx, tid)

	a, own := e.startCrashableReplica()
	if _, err := a.CreateSubscription(ctx, &pubsubpb.Subscription{Name: e.subName(sid), Topic: e.topicName(tid),
		EnableMessageOrdering: true, AckDeadlineSeconds: 10}); err != nil {
		t.Fatal(err)
	}
	c := e.v2()
	const first, total = 10, 20
	publishKeyed(t, ctx, c, tid, 0, first)
	leaseFirst(t, ctx, a, e.subName(sid))
	own.Close() // A dies holding the key's first messages out and the rest behind them
	publishKeyed(t, ctx, c, tid, first, total)
	drainKeyInOrder(t, ctx, rawSubscriber(t, e), e.subName(sid), total, "crash")
}

// startCrashableReplica starts a replica on a KubeMQ connection of its own
// and returns a Subscriber client of it and that connection: closing the
// connection is the replica dying (it can no longer settle, give back or
// re-arm anything).
func (e *env) startCrashableReplica() (pubsubpb.SubscriberClient, *kubemqclient.Client) {
	shared, own := e.kc, e.dialKubeMQ()
	e.kc = own
	addr, _, stop := e.startReplica()
	e.kc = shared
	e.t.Cleanup(stop)
	return rawSubscriber(e.t, &env{addr: addr}), own
}
