package gcp_test

import (
	"encoding/json"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/kubemq-io/kubemq-proxy/gcp"
)

// TestState: the /state view lists subscriptions with their queue and the
// leases held, and counts open StreamingPull streams.
func TestState(t *testing.T) {
	e := startEnv(t)
	ctx := ctxT(t, 30*time.Second)
	tid, sid, idle := e.id("t"), e.id("s"), e.id("idle")
	e.createTopic(ctx, tid)
	e.createSub(ctx, &pubsubpb.Subscription{Name: e.subName(sid), Topic: e.topicName(tid), EnableMessageOrdering: true})
	e.createSub(ctx, &pubsubpb.Subscription{Name: e.subName(idle), Topic: e.topicName(tid)})
	publishN(t, ctx, e.v2(), tid, 3, "k")
	sc := rawSubscriber(t, e)
	// One stream takes the ordered key's three messages (its later ones
	// may come in later responses); acking the second while the first is
	// out holds it.
	ordered, err := sc.StreamingPull(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := ordered.Send(&pubsubpb.StreamingPullRequest{Subscription: e.subName(sid), StreamAckDeadlineSeconds: 60}); err != nil {
		t.Fatal(err)
	}
	var got []*pubsubpb.ReceivedMessage
	for len(got) < 3 {
		resp, err := ordered.Recv()
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, resp.ReceivedMessages...)
	}
	if _, err := sc.Acknowledge(ctx, &pubsubpb.AcknowledgeRequest{Subscription: e.subName(sid), AckIds: []string{got[1].AckId}}); err != nil {
		t.Fatal(err)
	}
	stream, err := sc.StreamingPull(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&pubsubpb.StreamingPullRequest{Subscription: e.subName(idle), StreamAckDeadlineSeconds: 10}); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil { // the idle subscription has 3 messages too
		t.Fatal(err)
	}

	st := e.srv.State().(gcp.State)
	raw, _ := json.Marshal(st)
	t.Logf("%s", raw)
	if st.Topics < 1 || st.StreamingPulls != 2 {
		t.Fatalf("topics %d, streams %d; want >= 1 and 2", st.Topics, st.StreamingPulls)
	}
	var s *gcp.SubState
	for i := range st.Subscriptions {
		if st.Subscriptions[i].ID == sid {
			s = &st.Subscriptions[i]
		}
	}
	if s == nil {
		t.Fatalf("subscription %s missing from %s", sid, raw)
	}
	// The key's three messages went out; the second was acked and is held
	// until the first is settled.
	if !s.Active || !s.Ordered || s.Out != 2 || s.Acked != 1 || s.Waiting != 0 || s.Topic != tid || s.Queue == "" {
		t.Fatalf("subscription state %+v", *s)
	}
}

// TestIdleRuntimeRetired: a subscription's delivery runtime ends once no
// stream or Pull has used it for RuntimeIdle and nothing is leased, and
// the next pull starts a fresh one.
func TestIdleRuntimeRetired(t *testing.T) {
	e := startEnv(t, withGCP(func(o *gcp.Options) { o.Config.RuntimeIdle = 300 * time.Millisecond }))
	ctx := ctxT(t, 30*time.Second)
	tid, sid := e.id("t"), e.id("s")
	e.createTopic(ctx, tid)
	e.createSub(ctx, &pubsubpb.Subscription{Name: e.subName(sid), Topic: e.topicName(tid)})
	sc := rawSubscriber(t, e)
	active := func() bool {
		for _, s := range e.srv.State().(gcp.State).Subscriptions {
			if s.ID == sid {
				return s.Active
			}
		}
		t.Fatalf("subscription %s missing", sid)
		return false
	}
	for round := range 2 {
		publishN(t, ctx, e.v2(), tid, 1, "")
		var got []*pubsubpb.ReceivedMessage
		for len(got) == 0 {
			got = pull(t, ctx, sc, e.subName(sid), 10)
		}
		if !active() {
			t.Fatalf("round %d: no runtime while a message is leased", round)
		}
		// A leased message keeps the runtime past its idle time.
		time.Sleep(600 * time.Millisecond)
		if !active() {
			t.Fatalf("round %d: runtime retired while a message was leased", round)
		}
		if _, err := sc.Acknowledge(ctx, &pubsubpb.AcknowledgeRequest{Subscription: e.subName(sid), AckIds: []string{got[0].AckId}}); err != nil {
			t.Fatal(err)
		}
		for active() {
			select {
			case <-ctx.Done():
				t.Fatalf("round %d: idle runtime never retired", round)
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
}
