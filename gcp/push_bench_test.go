package gcp_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/kubemq-io/kubemq-proxy/gcp"
)

// BenchmarkPush: push throughput from a backlog of 1 KiB messages to a
// local endpoint answering 204, against the Go client's StreamingPull
// Receive of the same backlog on the same proxy in the same run (ratio =
// push msgs/s / pull msgs/s). $BENCH_PUSH_N sets the backlog (default
// 20,000), $BENCH_PUSH_WINDOW the largest push window
// (gcp.push_max_per_subscription, 64 by default).
func BenchmarkPush(b *testing.B) {
	n := 20_000
	if v, _ := strconv.Atoi(os.Getenv("BENCH_PUSH_N")); v > 0 {
		n = v
	}
	e := startEnv(b, withGCP(func(o *gcp.Options) {
		if v, _ := strconv.Atoi(os.Getenv("BENCH_PUSH_WINDOW")); v > 0 {
			o.Config.PushMaxPerSubscription = v
		}
	}))
	c := benchClient(b, e.addr, e.project)
	var pushed atomic.Int64
	done := make(chan struct{}, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
		if pushed.Add(1) == int64(n) {
			done <- struct{}{}
		}
	}))
	b.Cleanup(srv.Close)
	ctx := context.Background()
	var pushRate, pullRate float64
	for range b.N {
		topicID, pullID := benchTopology(b, c, e.project)
		pushID := "bench-push-" + randSuffix()
		if _, err := c.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{
			Name: e.subName(pushID), Topic: e.topicName(topicID)}); err != nil {
			b.Fatal(err)
		}
		publishAll(b, c, topicID, n)
		pushed.Store(0)
		start := time.Now()
		if err := c.SubscriptionAdminClient.ModifyPushConfig(ctx, &pubsubpb.ModifyPushConfigRequest{
			Subscription: e.subName(pushID), PushConfig: &pubsubpb.PushConfig{PushEndpoint: srv.URL}}); err != nil {
			b.Fatal(err)
		}
		select {
		case <-done:
		case <-time.After(10 * time.Minute):
			b.Fatalf("pushed %d of %d in 10 minutes", pushed.Load(), n)
		}
		pushRate = float64(n) / time.Since(start).Seconds()
		var got atomic.Int64
		rctx, cancel := context.WithCancel(ctx)
		start = time.Now()
		err := c.Subscriber(pullID).Receive(rctx, func(_ context.Context, m *pubsub.Message) {
			m.Ack()
			if got.Add(1) == int64(n) {
				cancel()
			}
		})
		cancel()
		if err != nil {
			b.Fatal(err)
		}
		pullRate = float64(n) / time.Since(start).Seconds()
		c.SubscriptionAdminClient.DeleteSubscription(ctx, &pubsubpb.DeleteSubscriptionRequest{Subscription: e.subName(pushID)})
	}
	b.ReportMetric(pushRate, "push-msgs/s")
	b.ReportMetric(pullRate, "pull-msgs/s")
	b.ReportMetric(pushRate/pullRate, "ratio")
}
