package gcp_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
)

// Helpers of the ordering recovery tests (TestOrderingSurvivesCrash,
// TestOrderingSurvivesOutage): one key "k", messages numbered by attribute i.

// publishKeyed publishes messages from..to-1 of key "k" and waits for them.
func publishKeyed(t *testing.T, ctx context.Context, c *pubsub.Client, topicID string, from, to int) {
	t.Helper()
	p := c.Publisher(topicID)
	p.EnableMessageOrdering = true
	defer p.Stop()
	var rs []*pubsub.PublishResult
	for i := from; i < to; i++ {
		rs = append(rs, p.Publish(ctx, &pubsub.Message{Data: []byte("m"), Attributes: map[string]string{"i": strconv.Itoa(i)}, OrderingKey: "k"}))
	}
	for _, r := range rs {
		if _, err := r.Get(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// leaseFirst pulls until the key's first messages are handed out: they
// start at message 0 and follow publish order.
func leaseFirst(t *testing.T, ctx context.Context, sc pubsubpb.SubscriberClient, sub string) {
	t.Helper()
	var got []*pubsubpb.ReceivedMessage
	for len(got) == 0 {
		got = pull(t, ctx, sc, sub, 5)
	}
	for k, m := range got {
		if i := m.Message.Attributes["i"]; i != strconv.Itoa(k) {
			t.Fatalf("handed out message %s as number %d of the key", i, k)
		}
	}
}

// drainKeyInOrder pulls and acks until messages 0..total-1 have all been
// seen, and fails unless the key came from message 0 on, never going back
// (repeats of a message are allowed: at-least-once). what names the event
// the key had to survive. It returns when the first message came.
func drainKeyInOrder(t *testing.T, ctx context.Context, sc pubsubpb.SubscriberClient, sub string, total int, what string) (firstAt time.Time) {
	t.Helper()
	var order []int
	seen := map[int]bool{}
	for len(seen) < total {
		ms := pull(t, ctx, sc, sub, 10)
		if len(ms) > 0 && firstAt.IsZero() {
			firstAt = time.Now()
		}
		var ids []string
		for _, m := range ms {
			i, _ := strconv.Atoi(m.Message.Attributes["i"])
			order = append(order, i)
			seen[i] = true
			ids = append(ids, m.AckId)
		}
		if len(ids) > 0 {
			if _, err := sc.Acknowledge(ctx, &pubsubpb.AcknowledgeRequest{Subscription: sub, AckIds: ids}); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Logf("delivery order after the %s: %v", what, order)
	if order[0] != 0 {
		t.Fatalf("the first unacked message (0) was not delivered first after the %s: %v", what, order)
	}
	for k := 1; k < len(order); k++ {
		if order[k] < order[k-1] {
			t.Fatalf("key delivered out of order after the %s: %v", what, order)
		}
	}
	return firstAt
}
