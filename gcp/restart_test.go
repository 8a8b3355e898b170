package gcp_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/kubemq-io/kubemq-proxy/delivery"
	"github.com/kubemq-io/kubemq-proxy/gcp"
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

// TestOrderingSurvivesCrashBehindLongDelays: as above, but on a server
// whose delay processor is backed up (docs/kubemq.md 9.1, modelled by the
// embedded server's scan mode): the dead replica's last lease record was
// stored behind more than 1,024 messages delayed 10 s, so it comes back
// about 10 s after the crash, later than the recovery hold's minimum
// (RecordDelay+5 s). The hold must last until it is back: the new
// runtime's sentinel record, stored after it, comes back after it.
func TestOrderingSurvivesCrashBehindLongDelays(t *testing.T) {
	e := startEnv(t, withDelivery(delivery.Options{RecordDelay: time.Second}), withScanDelays())
	ctx := ctxT(t, 2*time.Minute)
	tid, sid := e.id("t"), e.id("s")
	e.createTopic(ctx, tid)

	a, own := e.startCrashableReplica()
	sub := e.subName(sid)
	if _, err := a.CreateSubscription(ctx, &pubsubpb.Subscription{Name: sub, Topic: e.topicName(tid),
		EnableMessageOrdering: true, AckDeadlineSeconds: 10}); err != nil {
		t.Fatal(err)
	}
	c := e.v2()
	const first, total = 10, 20
	publishKeyed(t, ctx, c, tid, 0, first)
	leaseFirst(t, ctx, a, sub)
	// A keeps a Pull waiting, so its engine polls and re-arms its records
	// each time they come back.
	pctx, stopPulling := context.WithCancel(ctx)
	pulling := make(chan struct{})
	go func() {
		defer close(pulling)
		for pctx.Err() == nil {
			_, _ = a.Pull(pctx, &pubsubpb.PullRequest{Subscription: sub, MaxMessages: 10})
		}
	}()
	// Fill the delay processor's 1,024 slots with long delays: A's next
	// re-armed record is stored behind them.
	const filler = 1100
	fq := "gcp-test-filler." + e.suffix
	for i := 0; i < filler; i += 100 {
		msgs := make([]kubemqclient.QueueMessage, 100)
		for k := range msgs {
			msgs[k] = kubemqclient.QueueMessage{MessageID: fq + "." + strconv.Itoa(i+k), Channel: fq, Body: []byte("x"),
				Policy: kubemqclient.QueuePolicy{Delay: 10 * time.Second}}
		}
		res, err := e.kc.SendQueueMessages(ctx, msgs)
		if err == nil {
			err = kubemqclient.FirstError(res)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	filled := time.Now()
	time.Sleep(3 * time.Second) // A's record returns (it was stored before the filler) and is re-armed behind it
	stopPulling()
	<-pulling
	own.Close() // A dies; its last record waits behind the filler
	publishKeyed(t, ctx, c, tid, first, total)
	drainKeyInOrder(t, ctx, rawSubscriber(t, e), sub, total, "crash behind long delays")
	t.Logf("drained %v after the filler was stored", time.Since(filled).Round(100*time.Millisecond))
}

// TestRecoveryHoldAtTheCeiling: a runtime that starts recovering with a
// backlog of keyed messages larger than the subscription's in-flight
// ceiling fills the ceiling with held messages; its engine then stops
// polling, so its sentinel cannot come back. The hold must end at its
// least end (record delay + 5 s), not wait for the cap (30 s more), and the
// key still comes out in order.
func TestRecoveryHoldAtTheCeiling(t *testing.T) {
	const ceiling, total = 10, 30
	e := startEnv(t, withDelivery(delivery.Options{RecordDelay: time.Second}),
		withGCP(func(o *gcp.Options) { o.Config.MaxInflightPerSubscription = ceiling }))
	ctx := ctxT(t, 2*time.Minute)
	tid, sid := e.id("t"), e.id("s")
	e.createTopic(ctx, tid)
	a, _ := e.startCrashableReplica() // another process created it: this one recovers
	sub := e.subName(sid)
	if _, err := a.CreateSubscription(ctx, &pubsubpb.Subscription{Name: sub, Topic: e.topicName(tid),
		EnableMessageOrdering: true}); err != nil {
		t.Fatal(err)
	}
	publishKeyed(t, ctx, e.v2(), tid, 0, total)
	start := time.Now()
	firstAt := drainKeyInOrder(t, ctx, rawSubscriber(t, e), sub, total, "restart with a backlog over the ceiling")
	if wait := firstAt.Sub(start); wait > 20*time.Second {
		t.Errorf("the first keyed message came %v after the first pull; the hold should end about 6 s in", wait.Round(100*time.Millisecond))
	}
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
