package gcp_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/kubemq-io/kubemq-proxy/gcp"
)

// openStream starts a StreamingPull on sub and returns its messages.
func openStream(t *testing.T, ctx context.Context, sc pubsubpb.SubscriberClient, sub string) <-chan *pubsubpb.ReceivedMessage {
	t.Helper()
	stream, err := sc.StreamingPull(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&pubsubpb.StreamingPullRequest{Subscription: sub, StreamAckDeadlineSeconds: 60, MaxOutstandingMessages: 100}); err != nil {
		t.Fatal(err)
	}
	out := make(chan *pubsubpb.ReceivedMessage, 100)
	go func() {
		defer close(out)
		for {
			resp, err := stream.Recv()
			if err != nil {
				return
			}
			for _, m := range resp.ReceivedMessages {
				out <- m
			}
		}
	}()
	return out
}

// recvKey takes n messages of key from ms (others are dropped) and fails
// unless their numbers are want, want+1, ...
func recvKey(t *testing.T, ctx context.Context, ms <-chan *pubsubpb.ReceivedMessage, key string, want, n int) []*pubsubpb.ReceivedMessage {
	t.Helper()
	var got []*pubsubpb.ReceivedMessage
	for len(got) < n {
		select {
		case m, ok := <-ms:
			if !ok {
				t.Fatal("stream ended")
			}
			if m.Message.OrderingKey != key {
				continue
			}
			if i := m.Message.Attributes["i"]; i != strconv.Itoa(want+len(got)) {
				t.Fatalf("key %s: got message %s, want %d", key, i, want+len(got))
			}
			got = append(got, m)
		case <-ctx.Done():
			t.Fatalf("key %s: %d of %d messages from %d", key, len(got), n, want)
		}
	}
	return got
}

func subState(t *testing.T, e *env, sid string) gcp.SubState {
	t.Helper()
	for _, s := range e.srv.State().(gcp.State).Subscriptions {
		if s.ID == sid {
			return s
		}
	}
	t.Fatalf("subscription %s not in /state", sid)
	return gcp.SubState{}
}

// TestOrderedKeyWindow: a key's messages go out several at a time, in
// order, all to one stream while any is out; an ack behind an unsettled
// message is held; a nack sends the nacked message and every later one of
// its key again, in order and under new ack ids, acked ones included
// (Google's semantics), and the stale ack ids change nothing.
func TestOrderedKeyWindow(t *testing.T) {
	e := startEnv(t)
	ctx := ctxT(t, 60*time.Second)
	tid, sid := e.id("t"), e.id("s")
	e.createTopic(ctx, tid)
	e.createSub(ctx, &pubsubpb.Subscription{Name: e.subName(sid), Topic: e.topicName(tid), EnableMessageOrdering: true, AckDeadlineSeconds: 60})
	c := e.v2()
	sub := e.subName(sid)
	sc := rawSubscriber(t, e)

	publishN(t, ctx, c, tid, 6, "k")
	a := openStream(t, ctx, sc, sub)
	first := recvKey(t, ctx, a, "k", 0, 6) // all six out at once, in order

	// Another stream gets none of the key while A holds some of it; the
	// key's later messages go to A.
	b := openStream(t, ctx, sc, sub)
	p := c.Publisher(tid)
	p.EnableMessageOrdering = true
	for i := 6; i < 8; i++ {
		if _, err := p.Publish(ctx, &pubsub.Message{Data: []byte("m"), Attributes: map[string]string{"i": strconv.Itoa(i)}, OrderingKey: "k"}).Get(ctx); err != nil {
			t.Fatal(err)
		}
	}
	p.Stop()
	later := recvKey(t, ctx, a, "k", 6, 2)
	select {
	case m := <-b:
		t.Fatalf("stream B got message %s of key %s while A holds the key", m.Message.Attributes["i"], m.Message.OrderingKey)
	case <-time.After(300 * time.Millisecond):
	}
	all := append(first, later...)

	// Acks of 2 and 3 while 0 and 1 are out: held.
	ack := func(ms ...*pubsubpb.ReceivedMessage) {
		t.Helper()
		var ids []string
		for _, m := range ms {
			ids = append(ids, m.AckId)
		}
		if _, err := sc.Acknowledge(ctx, &pubsubpb.AcknowledgeRequest{Subscription: sub, AckIds: ids}); err != nil {
			t.Fatal(err)
		}
	}
	ack(all[2], all[3])
	if st := subState(t, e, sid); st.Out != 6 || st.Acked != 2 {
		t.Fatalf("after acking 2 and 3: %d out, %d acked, want 6 and 2", st.Out, st.Acked)
	}

	// Nack 1: 1..7 come again, in order, on A (0 is still out there).
	if _, err := sc.ModifyAckDeadline(ctx, &pubsubpb.ModifyAckDeadlineRequest{Subscription: sub, AckIds: []string{all[1].AckId}, AckDeadlineSeconds: 0}); err != nil {
		t.Fatal(err)
	}
	again := recvKey(t, ctx, a, "k", 1, 7)
	for k, m := range again {
		if m.AckId == all[k+1].AckId {
			t.Fatalf("message %d came again under its old ack id", k+1)
		}
	}
	ack(all[4], all[5]) // stale: no effect
	if st := subState(t, e, sid); st.Out != 8 || st.Acked != 0 {
		t.Fatalf("after the nack: %d out, %d acked, want 8 and 0", st.Out, st.Acked)
	}

	// Acking everything in reverse order settles it all, once 0 is acked.
	for k := len(again) - 1; k >= 0; k-- {
		ack(again[k])
	}
	if st := subState(t, e, sid); st.Out != 1 || st.Acked != 7 {
		t.Fatalf("with 0 out and the rest acked: %d out, %d acked, want 1 and 7", st.Out, st.Acked)
	}
	ack(all[0])
	if st := subState(t, e, sid); st.Out != 0 || st.Acked != 0 {
		t.Fatalf("all acked: %d out, %d acked, want none", st.Out, st.Acked)
	}
	select {
	case m := <-a:
		t.Fatalf("message %s of key %s came again after every message was acked", m.Message.Attributes["i"], m.Message.OrderingKey)
	case m := <-b:
		t.Fatalf("message %s of key %s came again after every message was acked", m.Message.Attributes["i"], m.Message.OrderingKey)
	case <-time.After(300 * time.Millisecond):
	}
}
