package gcp_test

import (
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
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
