package gcp_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"

	pubsubv1 "cloud.google.com/go/pubsub"
	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/kubemq-io/kubemq-proxy/gcp"
	"github.com/kubemq-io/kubemq-proxy/internal/keyorder"
)

// publishN publishes n messages "m0".."m{n-1}" with attribute i and waits
// for every id.
func publishN(t *testing.T, ctx context.Context, c *pubsub.Client, topicID string, n int, key string) []string {
	t.Helper()
	p := c.Publisher(topicID)
	if key != "" {
		p.EnableMessageOrdering = true
	}
	defer p.Stop()
	rs := make([]*pubsub.PublishResult, n)
	for i := range n {
		rs[i] = p.Publish(ctx, &pubsub.Message{Data: []byte(fmt.Sprint("m", i)), Attributes: map[string]string{"i": strconv.Itoa(i)}, OrderingKey: key})
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

// TestReceiveV2: publish and Receive with the current Go client: every
// message once, attributes intact, reserved tags turned back into fields.
func TestReceiveV2(t *testing.T) {
	e := startEnv(t)
	ctx := ctxT(t, 60*time.Second)
	tid, sid := e.id("t"), e.id("s")
	e.createTopic(ctx, tid)
	e.createSub(ctx, &pubsubpb.Subscription{Name: e.subName(sid), Topic: e.topicName(tid)})
	c := e.v2()
	const n = 200
	ids := publishN(t, ctx, c, tid, n, "")
	want := map[string]int{}
	for i, id := range ids {
		want[id] = i
	}
	var mu sync.Mutex
	got := map[string]bool{}
	rctx, cancel := context.WithCancel(ctx)
	err := c.Subscriber(sid).Receive(rctx, func(_ context.Context, m *pubsub.Message) {
		mu.Lock()
		defer mu.Unlock()
		i, ok := want[m.ID]
		if !ok || string(m.Data) != fmt.Sprint("m", i) || m.Attributes["i"] != strconv.Itoa(i) || len(m.Attributes) != 1 {
			t.Errorf("unexpected message %s %q %v", m.ID, m.Data, m.Attributes)
		}
		if time.Since(m.PublishTime) > time.Minute {
			t.Errorf("publish time %v", m.PublishTime)
		}
		if m.DeliveryAttempt != nil {
			t.Errorf("delivery attempt set without a dead-letter policy")
		}
		got[m.ID] = true
		m.Ack()
		if len(got) == n {
			cancel()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != n {
		t.Fatalf("received %d of %d", len(got), n)
	}
}

// TestReceiveV1: the same through the previous client generation.
func TestReceiveV1(t *testing.T) {
	e := startEnv(t)
	ctx := ctxT(t, 60*time.Second)
	c := e.v1()
	tp, err := c.CreateTopic(ctx, e.id("t"))
	if err != nil {
		t.Fatal(err)
	}
	sub, err := c.CreateSubscription(ctx, e.id("s"), pubsubv1.SubscriptionConfig{Topic: tp})
	if err != nil {
		t.Fatal(err)
	}
	const n = 50
	for i := range n {
		if _, err := tp.Publish(ctx, &pubsubv1.Message{Data: []byte(fmt.Sprint(i))}).Get(ctx); err != nil {
			t.Fatal(err)
		}
	}
	tp.Stop()
	var mu sync.Mutex
	got := map[string]bool{}
	rctx, cancel := context.WithCancel(ctx)
	if err := sub.Receive(rctx, func(_ context.Context, m *pubsubv1.Message) {
		mu.Lock()
		got[string(m.Data)] = true
		if len(got) == n {
			cancel()
		}
		mu.Unlock()
		m.Ack()
	}); err != nil {
		t.Fatal(err)
	}
	if len(got) != n {
		t.Fatalf("received %d of %d", len(got), n)
	}
}

func pull(t *testing.T, ctx context.Context, sc pubsubpb.SubscriberClient, sub string, max int32) []*pubsubpb.ReceivedMessage {
	t.Helper()
	resp, err := sc.Pull(ctx, &pubsubpb.PullRequest{Subscription: sub, MaxMessages: max})
	if err != nil {
		t.Fatal(err)
	}
	return resp.ReceivedMessages
}

// TestUnaryPull covers Pull, Acknowledge and ModifyAckDeadline: empty
// pulls, nack, stale ack ids, a late modack after a nack, error codes.
func TestUnaryPull(t *testing.T) {
	e := startEnv(t)
	ctx := ctxT(t, 60*time.Second)
	tid, sid := e.id("t"), e.id("s")
	e.createTopic(ctx, tid)
	e.createSub(ctx, &pubsubpb.Subscription{Name: e.subName(sid), Topic: e.topicName(tid)})
	sc := rawSubscriber(t, e)
	sub := e.subName(sid)

	resp, err := sc.Pull(ctx, &pubsubpb.PullRequest{Subscription: sub, MaxMessages: 10, ReturnImmediately: true})
	if err != nil || len(resp.ReceivedMessages) != 0 {
		t.Fatalf("empty pull: %v %v", resp, err)
	}
	publishN(t, ctx, e.v2(), tid, 3, "")
	var got []*pubsubpb.ReceivedMessage
	for len(got) < 3 {
		got = append(got, pull(t, ctx, sc, sub, 10)...)
	}
	if len(got) != 3 {
		t.Fatalf("pulled %d", len(got))
	}
	for _, m := range got {
		if m.Message.MessageId == "" || m.Message.PublishTime == nil {
			t.Fatalf("message fields: %v", m)
		}
		for k := range m.Message.Attributes {
			if strings.HasPrefix(k, "_pubsub_") {
				t.Fatalf("reserved tag %q delivered", k)
			}
		}
	}
	// Ack the first; nack the second and then send a late receipt modack
	// for it (the Go client's race): the redelivery must come at once with
	// a new ack id, and the old id must be dead.
	if _, err := sc.Acknowledge(ctx, &pubsubpb.AcknowledgeRequest{Subscription: sub, AckIds: []string{got[0].AckId}}); err != nil {
		t.Fatal(err)
	}
	nacked := got[1]
	if _, err := sc.ModifyAckDeadline(ctx, &pubsubpb.ModifyAckDeadlineRequest{Subscription: sub, AckIds: []string{nacked.AckId}, AckDeadlineSeconds: 0}); err != nil {
		t.Fatal(err)
	}
	if _, err := sc.ModifyAckDeadline(ctx, &pubsubpb.ModifyAckDeadlineRequest{Subscription: sub, AckIds: []string{nacked.AckId}, AckDeadlineSeconds: 10}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	again := pull(t, ctx, sc, sub, 10)
	if len(again) != 1 || again[0].Message.MessageId != nacked.Message.MessageId || again[0].AckId == nacked.AckId {
		t.Fatalf("redelivery: %v", again)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("nack redelivered after %v: the late modack re-leased it", d)
	}
	// Stale and garbage ack ids are no-ops, not errors.
	if _, err := sc.Acknowledge(ctx, &pubsubpb.AcknowledgeRequest{Subscription: sub, AckIds: []string{nacked.AckId, "garbage", got[0].AckId}}); err != nil {
		t.Fatal(err)
	}
	if _, err := sc.Acknowledge(ctx, &pubsubpb.AcknowledgeRequest{Subscription: sub, AckIds: []string{again[0].AckId, got[2].AckId}}); err != nil {
		t.Fatal(err)
	}
	resp, err = sc.Pull(ctx, &pubsubpb.PullRequest{Subscription: sub, MaxMessages: 10, ReturnImmediately: true})
	if err != nil || len(resp.ReceivedMessages) != 0 {
		t.Fatalf("after acks: %v %v", resp, err)
	}

	_, err = sc.ModifyAckDeadline(ctx, &pubsubpb.ModifyAckDeadlineRequest{Subscription: sub, AckIds: []string{"x"}, AckDeadlineSeconds: 601})
	wantCode(t, err, codes.InvalidArgument, "ack deadline")
	_, err = sc.Pull(ctx, &pubsubpb.PullRequest{Subscription: sub, MaxMessages: 0})
	wantCode(t, err, codes.InvalidArgument, "max_messages")
	_, err = sc.Pull(ctx, &pubsubpb.PullRequest{Subscription: e.subName(e.id("nope")), MaxMessages: 1})
	wantCode(t, err, codes.NotFound, "")
	_, err = sc.Acknowledge(ctx, &pubsubpb.AcknowledgeRequest{Subscription: sub})
	wantCode(t, err, codes.InvalidArgument, "")
	if _, err := rawPublisher(t, e).DetachSubscription(ctx, &pubsubpb.DetachSubscriptionRequest{Subscription: sub}); err != nil {
		t.Fatal(err)
	}
	_, err = sc.Pull(ctx, &pubsubpb.PullRequest{Subscription: sub, MaxMessages: 1})
	wantCode(t, err, codes.FailedPrecondition, "detached")
	stream, err := sc.StreamingPull(ctx)
	if err != nil {
		t.Fatal(err)
	}
	stream.Send(&pubsubpb.StreamingPullRequest{Subscription: sub, StreamAckDeadlineSeconds: 10})
	_, err = stream.Recv()
	wantCode(t, err, codes.FailedPrecondition, "")
}

// TestModackExpiryAndExtension: a short modack makes the message expire
// and come back; an extension keeps it leased.
func TestModackExpiryAndExtension(t *testing.T) {
	e := startEnv(t)
	ctx := ctxT(t, 60*time.Second)
	tid, sid := e.id("t"), e.id("s")
	e.createTopic(ctx, tid)
	e.createSub(ctx, &pubsubpb.Subscription{Name: e.subName(sid), Topic: e.topicName(tid)})
	sc := rawSubscriber(t, e)
	sub := e.subName(sid)
	publishN(t, ctx, e.v2(), tid, 2, "")
	var got []*pubsubpb.ReceivedMessage
	for len(got) < 2 {
		got = append(got, pull(t, ctx, sc, sub, 10)...)
	}
	// got[0]: 1 s, expires. got[1]: 1 s then extended to 60 s.
	sc.ModifyAckDeadline(ctx, &pubsubpb.ModifyAckDeadlineRequest{Subscription: sub, AckIds: []string{got[0].AckId, got[1].AckId}, AckDeadlineSeconds: 1})
	sc.ModifyAckDeadline(ctx, &pubsubpb.ModifyAckDeadlineRequest{Subscription: sub, AckIds: []string{got[1].AckId}, AckDeadlineSeconds: 60})
	start := time.Now()
	back := pull(t, ctx, sc, sub, 10)
	if len(back) != 1 || back[0].Message.MessageId != got[0].Message.MessageId {
		t.Fatalf("expected the expired message back, got %v", back)
	}
	if d := time.Since(start); d < 500*time.Millisecond {
		t.Fatalf("came back after %v, before its 1 s deadline", d)
	}
	// The extended one stays out past the short deadline.
	resp, err := sc.Pull(ctx, &pubsubpb.PullRequest{Subscription: sub, MaxMessages: 10, ReturnImmediately: true})
	if err != nil || len(resp.ReceivedMessages) != 0 {
		t.Fatalf("extended message redelivered: %v %v", resp, err)
	}
}

// TestDeadLetter: after max_delivery_attempts failed attempts the message
// goes to the dead-letter topic with Google's source attributes;
// delivery_attempt counts 1..5.
func TestDeadLetter(t *testing.T) {
	e := startEnv(t)
	ctx := ctxT(t, 60*time.Second)
	tid, sid, dlt, dls := e.id("t"), e.id("s"), e.id("dlt"), e.id("dls")
	e.createTopic(ctx, tid)
	e.createTopic(ctx, dlt)
	e.createSub(ctx, &pubsubpb.Subscription{Name: e.subName(dls), Topic: e.topicName(dlt)})
	e.createSub(ctx, &pubsubpb.Subscription{Name: e.subName(sid), Topic: e.topicName(tid),
		DeadLetterPolicy: &pubsubpb.DeadLetterPolicy{DeadLetterTopic: e.topicName(dlt), MaxDeliveryAttempts: 5},
		RetryPolicy:      &pubsubpb.RetryPolicy{MinimumBackoff: durationpb.New(0), MaximumBackoff: durationpb.New(0)},
	})
	c := e.v2()
	ids := publishN(t, ctx, c, tid, 1, "")
	var attempts []int
	rctx, cancel := context.WithCancel(ctx)
	var mu sync.Mutex
	go func() {
		c.Subscriber(sid).Receive(rctx, func(_ context.Context, m *pubsub.Message) {
			mu.Lock()
			if m.DeliveryAttempt != nil {
				attempts = append(attempts, *m.DeliveryAttempt)
			} else {
				attempts = append(attempts, 0)
			}
			mu.Unlock()
			m.Nack()
		})
	}()
	var dead *pubsub.Message
	dctx, dcancel := context.WithCancel(ctx)
	if err := c.Subscriber(dls).Receive(dctx, func(_ context.Context, m *pubsub.Message) {
		dead = m
		m.Ack()
		dcancel()
	}); err != nil {
		t.Fatal(err)
	}
	cancel()
	if dead == nil {
		t.Fatal("nothing dead-lettered")
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(attempts) != "[1 2 3 4 5]" {
		t.Fatalf("delivery attempts %v", attempts)
	}
	a := dead.Attributes
	if string(dead.Data) != "m0" || a["i"] != "0" || a["CloudPubSubDeadLetterSourceDeliveryCount"] != "5" ||
		a["CloudPubSubDeadLetterSourceSubscription"] != e.subName(sid) || a["CloudPubSubDeadLetterSourceSubscriptionProject"] != e.project ||
		a["CloudPubSubDeadLetterSourceTopicPublishTime"] == "" || dead.ID == ids[0] {
		t.Fatalf("dead-lettered copy %q %v id %s", dead.Data, a, dead.ID)
	}
}

// TestRetryBackoff: a nack waits out the retry policy's minimum backoff.
func TestRetryBackoff(t *testing.T) {
	e := startEnv(t)
	ctx := ctxT(t, 60*time.Second)
	tid, sid := e.id("t"), e.id("s")
	e.createTopic(ctx, tid)
	e.createSub(ctx, &pubsubpb.Subscription{Name: e.subName(sid), Topic: e.topicName(tid),
		RetryPolicy: &pubsubpb.RetryPolicy{MinimumBackoff: durationpb.New(2 * time.Second), MaximumBackoff: durationpb.New(4 * time.Second)}})
	sc := rawSubscriber(t, e)
	sub := e.subName(sid)
	publishN(t, ctx, e.v2(), tid, 1, "")
	var got []*pubsubpb.ReceivedMessage
	for len(got) == 0 {
		got = pull(t, ctx, sc, sub, 1)
	}
	nackAt := time.Now()
	sc.ModifyAckDeadline(ctx, &pubsubpb.ModifyAckDeadlineRequest{Subscription: sub, AckIds: []string{got[0].AckId}, AckDeadlineSeconds: 0})
	var back []*pubsubpb.ReceivedMessage
	for len(back) == 0 {
		back = pull(t, ctx, sc, sub, 1)
	}
	if d := time.Since(nackAt); d < 1900*time.Millisecond {
		t.Fatalf("redelivered %v after the nack, before the 2 s minimum backoff", d)
	}
}

// TestOrderingKeys: with nacks mixed in, each key's deliveries follow
// publish order and never skip a message, go back only to a nacked message
// (after which the key's later messages come again, acked or not, as Google
// redelivers them), and every message is acked in the end.
func TestOrderingKeys(t *testing.T) {
	e := startEnv(t)
	ctx := ctxT(t, 90*time.Second)
	tid, sid := e.id("t"), e.id("s")
	e.createTopic(ctx, tid)
	e.createSub(ctx, &pubsubpb.Subscription{Name: e.subName(sid), Topic: e.topicName(tid), EnableMessageOrdering: true})
	c := e.v2()
	const perKey = 40
	keys := []string{"a", "b", "c"}
	for _, k := range keys {
		publishN(t, ctx, c, tid, perKey, k)
	}
	var mu sync.Mutex
	seqs := map[string][]int{}
	acked := map[string]map[int]bool{}
	nacked := map[string]bool{}
	done := 0
	rctx, cancel := context.WithCancel(ctx)
	err := c.Subscriber(sid).Receive(rctx, func(_ context.Context, m *pubsub.Message) {
		mu.Lock()
		defer mu.Unlock()
		i, _ := strconv.Atoi(m.Attributes["i"])
		seqs[m.OrderingKey] = append(seqs[m.OrderingKey], i)
		id := m.OrderingKey + m.Attributes["i"]
		if i%7 == 3 && !nacked[id] {
			nacked[id] = true
			m.Nack()
			return
		}
		m.Ack()
		if acked[m.OrderingKey] == nil {
			acked[m.OrderingKey] = map[int]bool{}
		}
		if !acked[m.OrderingKey][i] {
			acked[m.OrderingKey][i] = true
			if len(acked[m.OrderingKey]) == perKey {
				done++
				if done == len(keys) {
					cancel()
				}
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		checkKeyOrder(t, k, seqs[k], perKey, func(i int) bool { return nacked[k+strconv.Itoa(i)] })
	}
}

// checkKeyOrder fails unless a key's deliveries (in callback order) follow
// publish order without skipping a message, go back only to a nacked one,
// and reach the key's last message.
func checkKeyOrder(t *testing.T, key string, seq []int, perKey int, wasNacked func(int) bool) {
	t.Helper()
	if err := keyorder.Check(seq, wasNacked); err != nil {
		t.Fatalf("key %s: %v", key, err)
	}
	if len(seq) == 0 || slices.Max(seq) != perKey-1 {
		t.Fatalf("key %s did not reach message %d: %v", key, perKey-1, seq)
	}
}

// TestStreamFlowControl: the server sends no more than the stream's
// max_outstanding_messages until something is acked, and acks from a
// unary call release stream credit.
func TestStreamFlowControl(t *testing.T) {
	e := startEnv(t)
	ctx := ctxT(t, 60*time.Second)
	tid, sid := e.id("t"), e.id("s")
	e.createTopic(ctx, tid)
	e.createSub(ctx, &pubsubpb.Subscription{Name: e.subName(sid), Topic: e.topicName(tid)})
	publishN(t, ctx, e.v2(), tid, 10, "")
	sc := rawSubscriber(t, e)
	stream, err := sc.StreamingPull(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&pubsubpb.StreamingPullRequest{Subscription: e.subName(sid), StreamAckDeadlineSeconds: 60, MaxOutstandingMessages: 3}); err != nil {
		t.Fatal(err)
	}
	msgs := make(chan *pubsubpb.ReceivedMessage, 100)
	go func() {
		for {
			resp, err := stream.Recv()
			if err != nil {
				close(msgs)
				return
			}
			for _, m := range resp.ReceivedMessages {
				msgs <- m
			}
		}
	}()
	var held []*pubsubpb.ReceivedMessage
	for len(held) < 3 {
		held = append(held, <-msgs)
	}
	select {
	case m := <-msgs:
		t.Fatalf("a 4th message arrived with 3 outstanding: %v", m)
	case <-time.After(500 * time.Millisecond):
	}
	// Ack one through the unary RPC: its credit comes back, and the ack
	// counts as "in transit" for a quarter second (flow.go), so one or two
	// more may come, and then no more while nothing else is acked.
	if _, err := sc.Acknowledge(ctx, &pubsubpb.AcknowledgeRequest{Subscription: e.subName(sid), AckIds: []string{held[0].AckId}}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-msgs:
	case <-time.After(10 * time.Second):
		t.Fatal("no message after the ack freed credit")
	}
	extra := 0
	for done := false; !done; {
		select {
		case <-msgs:
			extra++
		case <-time.After(time.Second):
			done = true
		}
	}
	if extra > 1 {
		t.Fatalf("%d messages beyond the freed credit and the one ack in transit", extra)
	}
}

// TestStreamPeriodicClose: the server ends a stream with UNAVAILABLE after
// its lifetime, and the Go client reconnects by itself.
func TestStreamPeriodicClose(t *testing.T) {
	e := startEnv(t, withGCP(func(o *gcp.Options) { o.Config.StreamCloseAfter = time.Second }))
	ctx := ctxT(t, 60*time.Second)
	tid, sid := e.id("t"), e.id("s")
	e.createTopic(ctx, tid)
	e.createSub(ctx, &pubsubpb.Subscription{Name: e.subName(sid), Topic: e.topicName(tid)})
	stream, err := rawSubscriber(t, e).StreamingPull(ctx)
	if err != nil {
		t.Fatal(err)
	}
	stream.Send(&pubsubpb.StreamingPullRequest{Subscription: e.subName(sid), StreamAckDeadlineSeconds: 10})
	_, err = stream.Recv()
	wantCode(t, err, codes.Unavailable, "lifetime")

	c := e.v2()
	got := make(chan string, 10)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go c.Subscriber(sid).Receive(rctx, func(_ context.Context, m *pubsub.Message) {
		m.Ack()
		got <- string(m.Data)
	})
	publishN(t, ctx, c, tid, 1, "")
	if m := <-got; m != "m0" {
		t.Fatal(m)
	}
	// Published after at least one server close: still received.
	time.Sleep(1500 * time.Millisecond)
	p := c.Publisher(tid)
	defer p.Stop()
	if _, err := p.Publish(ctx, &pubsub.Message{Data: []byte("late")}).Get(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-got:
		if m != "late" {
			t.Fatal(m)
		}
	case <-ctx.Done():
		t.Fatal("not received after the stream was recycled")
	}
}
