package gcp_test

import (
	"context"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/fieldmaskpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/kubemq-io/kubemq-proxy/gcp"
)

// BenchmarkSnapshot: CreateSnapshot of a subscription with a backlog of
// 100k messages ($BENCH_SNAPSHOT_N), then Seek to that snapshot, and, as
// the reference measured in the same run, Seek to a time before the
// backlog (the same messages made deliverable again). The proxy only: the
// Go pstest does not implement snapshots. backend=default is the suite's
// backend (the embedded server, or $KUBEMQ_ADDRESS); with
// $BENCH_KUBEMQ=host:port, backend=kubemq measures the same on that KubeMQ
// in the same run.
func BenchmarkSnapshot(b *testing.B) {
	b.Run("backend=default", func(b *testing.B) {
		addr, project := benchTargets[0].start(b)
		benchSnapshot(b, addr, project)
	})
	if k := os.Getenv("BENCH_KUBEMQ"); k != "" {
		b.Run("backend=kubemq", func(b *testing.B) {
			e := startEnv(b, withKubeMQ(k), withGCP(func(o *gcp.Options) { o.Config.MaxInflightPerSubscription = 200_000 }))
			benchSnapshot(b, e.addr, e.project)
		})
	}
}

func benchSnapshot(b *testing.B, addr, project string) {
	n := 100_000
	if v, _ := strconv.Atoi(os.Getenv("BENCH_SNAPSHOT_N")); v > 0 {
		n = v
	}
	c := benchClient(b, addr, project)
	topicID, subID := benchTopology(b, c, project)
	sub := "projects/" + project + "/subscriptions/" + subID
	before := time.Now()
	publishAll(b, c, topicID, n)
	ctx := context.Background()
	b.ResetTimer()
	var create, seek, ref time.Duration
	for i := range b.N {
		snap := "projects/" + project + "/snapshots/bench-" + randSuffix() + strconv.Itoa(i)
		start := time.Now()
		if _, err := c.SubscriptionAdminClient.CreateSnapshot(ctx, &pubsubpb.CreateSnapshotRequest{Name: snap, Subscription: sub}); err != nil {
			b.Fatal(err)
		}
		create = time.Since(start)
		start = time.Now()
		if _, err := c.SubscriptionAdminClient.Seek(ctx, &pubsubpb.SeekRequest{Subscription: sub, Target: &pubsubpb.SeekRequest_Snapshot{Snapshot: snap}}); err != nil {
			b.Fatal(err)
		}
		seek = time.Since(start)
		start = time.Now()
		if _, err := c.SubscriptionAdminClient.Seek(ctx, &pubsubpb.SeekRequest{Subscription: sub, Target: &pubsubpb.SeekRequest_Time{Time: timestamppb.New(before)}}); err != nil {
			b.Fatal(err)
		}
		ref = time.Since(start)
	}
	b.ReportMetric(float64(create.Milliseconds()), "create-ms")
	b.ReportMetric(float64(seek.Milliseconds()), "seek-snapshot-ms")
	b.ReportMetric(float64(ref.Milliseconds()), "seek-time-ms")
	b.ReportMetric(seek.Seconds()/ref.Seconds(), "seek-snapshot/seek-time")
}

// BenchmarkExactlyOnceAck: one subscription drained by the Go client, n
// messages ($BENCH_EOD_N, 20k) at least once with Ack, then n more with
// exactly-once enabled and AckWithResult awaited for each: the messages
// per second of both, and their ratio, in one run.
func BenchmarkExactlyOnceAck(b *testing.B) {
	n := 20_000
	if v, _ := strconv.Atoi(os.Getenv("BENCH_EOD_N")); v > 0 {
		n = v
	}
	tg := benchTargets[0]
	addr, project := tg.start(b)
	c := benchClient(b, addr, project)
	topicID, subID := benchTopology(b, c, project)
	ctx := context.Background()
	drain := func(withResult bool) float64 {
		publishAll(b, c, topicID, n)
		var done atomic.Int64
		var wg sync.WaitGroup
		rctx, cancel := context.WithCancel(ctx)
		s := c.Subscriber(subID)
		start := time.Now()
		errc := make(chan error, 1)
		go func() {
			errc <- s.Receive(rctx, func(_ context.Context, m *pubsub.Message) {
				if !withResult {
					m.Ack()
					if done.Add(1) == int64(n) {
						cancel()
					}
					return
				}
				r := m.AckWithResult()
				wg.Add(1)
				go func() {
					defer wg.Done()
					if st, _ := r.Get(ctx); st == pubsub.AcknowledgeStatusSuccess && done.Add(1) == int64(n) {
						cancel()
					}
				}()
			})
		}()
		if err := <-errc; err != nil {
			b.Fatal(err)
		}
		wg.Wait()
		if done.Load() < int64(n) {
			b.Fatalf("%d of %d acked", done.Load(), n)
		}
		return float64(n) / time.Since(start).Seconds()
	}
	b.ResetTimer()
	var plain, eod float64
	for range b.N {
		if _, err := c.SubscriptionAdminClient.UpdateSubscription(ctx, &pubsubpb.UpdateSubscriptionRequest{
			Subscription: &pubsubpb.Subscription{Name: "projects/" + project + "/subscriptions/" + subID, EnableExactlyOnceDelivery: false},
			UpdateMask:   &fieldmaskpb.FieldMask{Paths: []string{"enable_exactly_once_delivery"}}}); err != nil {
			b.Fatal(err)
		}
		plain = drain(false)
		if _, err := c.SubscriptionAdminClient.UpdateSubscription(ctx, &pubsubpb.UpdateSubscriptionRequest{
			Subscription: &pubsubpb.Subscription{Name: "projects/" + project + "/subscriptions/" + subID, EnableExactlyOnceDelivery: true},
			UpdateMask:   &fieldmaskpb.FieldMask{Paths: []string{"enable_exactly_once_delivery"}}}); err != nil {
			b.Fatal(err)
		}
		eod = drain(true)
	}
	b.ReportMetric(plain, "at-least-once-msgs/s")
	b.ReportMetric(eod, "exactly-once-msgs/s")
	b.ReportMetric(eod/plain, "exactly-once/at-least-once")
}
