package faults

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kubemq-io/kubemq-proxy/internal/keyorder"
)

// TestOrderedKeysSurviveProxyKill: the proxy is killed while it has
// windows of four ordering keys out to a client; KubeMQ (a process of its
// own) lives on and takes the open transaction's messages back, and more
// messages of the keys are published after the restart. Every message
// must then arrive, and each key must start again at its first message
// (none was acked) and never skip ahead: the returning messages, which
// KubeMQ and the lease records give back behind later ones, are put back
// in publish order (gcp/ordering.go).
func TestOrderedKeysSurviveProxyKill(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the proxy and the backend as processes")
	}
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const project = "faults"
	suffix := randSuffix()
	topicID, subID := "ordered-"+suffix, "ordered-sub-"+suffix
	client := func() *pubsub.Client {
		c, err := pubsub.NewClient(ctx, project, option.WithEndpoint(e.gcpAddr), option.WithoutAuthentication(),
			option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	c := client()
	if _, err := c.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: "projects/" + project + "/topics/" + topicID}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{
		Name: "projects/" + project + "/subscriptions/" + subID, Topic: "projects/" + project + "/topics/" + topicID,
		AckDeadlineSeconds: 10, EnableMessageOrdering: true,
	}); err != nil {
		t.Fatal(err)
	}
	const keys, before, after = 4, 160, 80
	publish := func(c *pubsub.Client, from, to int) {
		t.Helper()
		p := c.Publisher(topicID)
		p.EnableMessageOrdering = true
		defer p.Stop()
		var rs []*pubsub.PublishResult
		for i := from; i < to; i++ {
			rs = append(rs, p.Publish(ctx, &pubsub.Message{Data: []byte(fmt.Sprintf("m%03d", i)),
				OrderingKey: fmt.Sprint("k", i%keys), Attributes: map[string]string{"i": strconv.Itoa(i / keys)}}))
		}
		for _, r := range rs {
			if _, err := r.Get(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	publish(c, 0, before)

	// Receive without acking until the keys' windows are out, then kill.
	held := make(chan struct{}, before)
	rctx, rcancel := context.WithCancel(ctx)
	go c.Subscriber(subID).Receive(rctx, func(_ context.Context, m *pubsub.Message) { held <- struct{}{} })
	for range 40 {
		select {
		case <-held:
		case <-ctx.Done():
			t.Fatal("nothing delivered before the kill")
		}
	}
	e.proxy.Kill()
	rcancel()
	c.Close()
	e.startProxy() // same ports; returns once /readyz is 200

	c2 := client()
	defer c2.Close()
	publish(c2, before, before+after)
	var mu sync.Mutex
	seq := map[string][]int{}
	seen := map[string]bool{}
	all := make(chan struct{})
	rctx2, rcancel2 := context.WithCancel(ctx)
	defer rcancel2()
	go c2.Subscriber(subID).Receive(rctx2, func(_ context.Context, m *pubsub.Message) {
		m.Ack()
		i, _ := strconv.Atoi(m.Attributes["i"])
		mu.Lock()
		defer mu.Unlock()
		seq[m.OrderingKey] = append(seq[m.OrderingKey], i)
		if !seen[string(m.Data)] {
			seen[string(m.Data)] = true
			if len(seen) == before+after {
				close(all)
			}
		}
	})
	select {
	case <-all:
	case <-ctx.Done():
		mu.Lock()
		t.Fatalf("after the restart %d of %d messages arrived", len(seen), before+after)
	}
	rcancel2()
	mu.Lock()
	defer mu.Unlock()
	for k, s := range seq {
		if err := keyorder.Check(s, keyorder.Repeats); err != nil {
			t.Fatalf("key %s out of order after the restart: %v", k, err)
		}
	}
	e.stop()
}
