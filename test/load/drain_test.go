package load

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	amqp "github.com/rabbitmq/amqp091-go"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kubemq-io/kubemq-proxy/internal/proctest"
)

// BenchmarkBacklogDrain measures what a drained backlog leaves behind in the proxy process: it
// stores LOAD_DRAIN_N (default 100,000) 1 KiB messages per protocol (AMQP confirmed publishes
// into one durable queue, Pub/Sub publishes into a topic with one subscription), nobody
// consuming; then consumes and acks every one, and samples the process's Go heap (allocated
// objects, go_memstats_heap_alloc_bytes), its heap spans in use and RSS every 5 s for 120 s. It reports, above the baseline taken before the first publish, the
// heap and RSS with the backlog stored, right after the drain, 60 s and 120 s later, and the
// seconds until the heap came back within 32 MiB of the baseline (-1: never in 120 s); it
// fails when that took more than 60 s. A replica keeps the acknowledgements of the last minute
// in memory (the cluster's acknowledgement log, docs/CLUSTER.md), so part of a drain stays for
// that minute. It runs
// twice: the proxy on a backend process of its own (only the proxy's memory), and the proxy
// with its embedded server on a data directory (the whole process, as `go run .` with
// embedded.data_dir), unless KUBEMQ_ADDRESS names a KubeMQ, which both cases then use.
//
//	go test ./test/load/ -run x -bench BacklogDrain -benchtime 1x -timeout 30m
func BenchmarkBacklogDrain(b *testing.B) {
	n := envInt(b, "LOAD_DRAIN_N", 100_000, 10_000)
	for _, embedded := range []bool{false, true} {
		name := "separate-backend"
		if embedded {
			name = "embedded-data-dir"
		}
		b.Run(name, func(b *testing.B) {
			for range b.N {
				var e *proxyEnv
				switch {
				case !embedded:
					addr, _ := startBackend(b)
					e = startProxyOn(b, addr)
				default:
					e = startProxy(b, "--embedded.data_dir", runDir(b)+"/proxy-data")
				}
				benchBacklogDrain(b, e, n)
				e.stop()
			}
		})
	}
}

// heapAlloc is the bytes of allocated heap objects: after a collection, what is live.
const heapAlloc = "go_memstats_heap_alloc_bytes"

func benchBacklogDrain(b *testing.B, e *proxyEnv, n int) {
	type sample struct {
		at               time.Duration
		heap, inuse, rss float64
	}
	read := func(at time.Duration) sample {
		e.alive()
		m := e.scrape()
		return sample{at, mib(m[heapAlloc]), mib(m.Heap()), mib(m.RSS())}
	}
	ctx := b.Context()
	c, err := pubsub.NewClient(ctx, "drain", option.WithEndpoint(e.gcpAddr), option.WithoutAuthentication(),
		option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	topic := "projects/drain/topics/drain-" + e.suffix
	subName := "projects/drain/subscriptions/drain-" + e.suffix
	if _, err := c.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: topic}); err != nil {
		b.Fatal(err)
	}
	if _, err := c.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{Name: subName, Topic: topic, AckDeadlineSeconds: 60}); err != nil {
		b.Fatal(err)
	}
	conn, err := amqp.Dial("amqp://guest:guest@" + e.amqpAddr + "/")
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	q := "drain-" + e.suffix
	if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
		b.Fatal(err)
	}
	time.Sleep(2 * time.Second) // settle after start and declare
	base := read(0)

	// The backlog, both protocols at once.
	body := make([]byte, 1024)
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	wg.Add(2)
	go func() {
		defer wg.Done()
		pub := c.Publisher(topic)
		defer pub.Stop()
		rs := make([]*pubsub.PublishResult, 0, 1000)
		for i := range n {
			rs = append(rs, pub.Publish(ctx, &pubsub.Message{Data: body}))
			if len(rs) == cap(rs) || i == n-1 {
				for _, r := range rs {
					if _, err := r.Get(ctx); err != nil {
						errs <- fmt.Errorf("pubsub publish: %w", err)
						return
					}
				}
				rs = rs[:0]
			}
		}
	}()
	go func() {
		defer wg.Done()
		pch, err := conn.Channel()
		if err != nil {
			errs <- err
			return
		}
		defer pch.Close()
		if err := pch.Confirm(false); err != nil {
			errs <- err
			return
		}
		var pending []*amqp.DeferredConfirmation
		for i := range n {
			d, err := pch.PublishWithDeferredConfirmWithContext(ctx, "", q, false, false, amqp.Publishing{DeliveryMode: amqp.Persistent, Body: body})
			if err != nil {
				errs <- err
				return
			}
			pending = append(pending, d)
			if len(pending) == 1000 || i == n-1 {
				for _, d := range pending {
					if ok, err := d.WaitContext(ctx); !ok || err != nil {
						errs <- fmt.Errorf("amqp publish not confirmed: %v %v", ok, err)
						return
					}
				}
				pending = pending[:0]
			}
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	stored := read(0)

	// The drain.
	var got atomic.Int64
	dctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wg.Add(2)
	go func() {
		defer wg.Done()
		var seen atomic.Int64
		sub := c.Subscriber(subName)
		sub.ReceiveSettings.MaxOutstandingMessages = 2000
		_ = sub.Receive(dctx, func(_ context.Context, m *pubsub.Message) {
			m.Ack()
			if seen.Add(1) <= int64(n) {
				got.Add(1)
			}
		})
	}()
	go func() {
		defer wg.Done()
		cch, err := conn.Channel()
		if err != nil {
			b.Error(err)
			return
		}
		defer cch.Close()
		if err := cch.Qos(1000, 0, false); err != nil {
			b.Error(err)
			return
		}
		ds, err := cch.ConsumeWithContext(dctx, q, "", false, false, false, false, nil)
		if err != nil {
			b.Error(err)
			return
		}
		for i := 1; i <= n; i++ {
			select {
			case d := <-ds:
				if i%100 == 0 || i == n {
					_ = d.Ack(true)
				}
				got.Add(1)
			case <-dctx.Done():
				return
			}
		}
	}()
	deadline := time.Now().Add(10 * time.Minute)
	for got.Load() < int64(2*n) {
		if time.Now().After(deadline) {
			b.Fatalf("drained %d of %d in 10 minutes", got.Load(), 2*n)
		}
		e.alive()
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(time.Second) // the last acks reach the proxy
	cancel()
	wg.Wait()

	// What is live, for `go tool pprof -top`: the heap profile after a collection.
	profile := func(name string) {
		prof, err := proctest.Get("http://" + e.httpAdr + "/debug/pprof/heap?gc=1")
		if err != nil {
			b.Logf("heap profile: %v", err)
			return
		}
		f := filepath.Join(runDir(b), "heap-"+name+"-after-drain.pprof")
		if err := os.WriteFile(f, prof, 0o644); err != nil {
			b.Fatal(err)
		}
		b.Logf("heap profile %s after the drain: %s", name, f)
	}
	start := time.Now()
	samples := []sample{read(0)}
	back := -1.0
	for {
		s := samples[len(samples)-1]
		if back < 0 && s.heap-base.heap <= 32 {
			back = s.at.Seconds()
		}
		if s.at >= 120*time.Second {
			break
		}
		time.Sleep(5 * time.Second)
		samples = append(samples, read(time.Since(start)))
		if n := len(samples); samples[n-1].at >= 20*time.Second && samples[n-2].at < 20*time.Second {
			profile("20s")
		}
	}
	profile("120s")
	var tb strings.Builder
	fmt.Fprintf(&tb, "%8s %10s %12s %10s\n", "t", "heap MiB", "in-use MiB", "RSS MiB")
	line := func(name string, s sample) {
		fmt.Fprintf(&tb, "%8s %10.1f %12.1f %10.1f\n", name, s.heap, s.inuse, s.rss)
	}
	line("baseline", base)
	line("stored", stored)
	for _, s := range samples {
		line(s.at.Round(time.Second).String(), s)
	}
	b.Logf("proxy memory around a drained backlog of %d messages per protocol:\n%s", n, tb.String())
	at := func(d time.Duration) sample {
		for _, s := range samples {
			if s.at >= d {
				return s
			}
		}
		return samples[len(samples)-1]
	}
	b.ReportMetric(stored.heap-base.heap, "stored-heap-MiB")
	b.ReportMetric(stored.rss-base.rss, "stored-RSS-MiB")
	b.ReportMetric(samples[0].heap-base.heap, "drained-heap-MiB")
	b.ReportMetric(at(60*time.Second).heap-base.heap, "60s-heap-MiB")
	b.ReportMetric(at(60*time.Second).inuse-base.inuse, "60s-inuse-MiB")
	b.ReportMetric(at(60*time.Second).rss-base.rss, "60s-RSS-MiB")
	b.ReportMetric(at(120*time.Second).heap-base.heap, "120s-heap-MiB")
	b.ReportMetric(at(120*time.Second).rss-base.rss, "120s-RSS-MiB")
	b.ReportMetric(back, "back-within-32MiB-s")
	if proctest.Race {
		return
	}
	if back < 0 || back > 60 {
		b.Errorf("the proxy's heap came back within 32 MiB of its baseline %v s after the drain (-1: not in 120 s; want at most 60)", back)
	}
}
