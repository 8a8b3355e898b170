package load

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	amqp "github.com/rabbitmq/amqp091-go"
)

// BenchmarkPublishBurst measures Pub/Sub publishers that outrun KubeMQ: LOAD_BURST_CLIENTS
// (default 32) Go clients publish LOAD_BURST_N (default 200,000) 1 KiB messages in all into a
// topic with one subscription, with their default settings (their publish flow control does not
// limit the messages outstanding; each has up to 25 batches per CPU in flight), and wait for the
// results only at the end. The proxy runs on a backend process of its own, with
// gcp.max_pending_publish_bytes at its default (32 MiB) and off (0), or at the values in
// LOAD_BURST_BOUNDS (comma-separated; "default" for the default). It reports the throughput,
// the proxy's peak RSS (VmHWM) and the highest Go heap (allocated objects) sampled every 100 ms.
//
//	go test ./test/load/ -run x -bench PublishBurst -benchtime 1x
func BenchmarkPublishBurst(b *testing.B) {
	n := envInt(b, "LOAD_BURST_N", 200_000, 20_000)
	clients := envInt(b, "LOAD_BURST_CLIENTS", 32, 4)
	bounds := []string{"default", "0"}
	if v := os.Getenv("LOAD_BURST_BOUNDS"); v != "" {
		bounds = strings.Split(v, ",")
	}
	for _, bound := range bounds {
		b.Run("bound="+bound, func(b *testing.B) {
			for range b.N {
				addr, _ := startBackend(b)
				var extra []string
				if bound != "default" {
					extra = []string{"--gcp.max_pending_publish_bytes", bound}
				}
				e := startProxyOn(b, addr, extra...)
				benchPublishBurst(b, e, n, clients)
				e.stop()
			}
		})
	}
}

func benchPublishBurst(b *testing.B, e *proxyEnv, n, clients int) {
	ctx := b.Context()
	cs := make([]*pubsub.Client, clients)
	for i := range cs {
		c, err := pubsub.NewClient(ctx, "burst", option.WithEndpoint(e.gcpAddr), option.WithoutAuthentication(),
			option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())))
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		cs[i] = c
	}
	c := cs[0]
	topic := "projects/burst/topics/burst-" + e.suffix
	if _, err := c.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: topic}); err != nil {
		b.Fatal(err)
	}
	if _, err := c.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{Name: "projects/burst/subscriptions/burst-" + e.suffix, Topic: topic}); err != nil {
		b.Fatal(err)
	}
	peak := sampleHeap(e)
	pubs := make([]*pubsub.Publisher, clients)
	for i, c := range cs {
		pubs[i] = c.Publisher(topic)
	}
	body := make([]byte, 1024)
	start := time.Now()
	rs := make([]*pubsub.PublishResult, n)
	var pwg sync.WaitGroup
	for k := range clients {
		pwg.Add(1)
		go func() {
			defer pwg.Done()
			for i := k; i < n; i += clients {
				rs[i] = pubs[k].Publish(ctx, &pubsub.Message{Data: body})
			}
		}()
	}
	pwg.Wait()
	failed := 0
	var firstErr error
	for _, r := range rs {
		if _, err := r.Get(context.Background()); err != nil {
			failed++
			if firstErr == nil {
				firstErr = err
			}
		}
	}
	took := time.Since(start)
	for _, p := range pubs {
		p.Stop()
	}
	maxHeap := peak()
	if failed > 0 {
		b.Errorf("%d of %d publishes failed; the first: %v", failed, n, firstErr)
	}
	rate := float64(n) / took.Seconds()
	b.ReportMetric(rate, "msg/s")
	b.ReportMetric(mib(e.p.PeakRSS()), "peak-RSS-MiB")
	b.ReportMetric(mib(maxHeap), "max-heap-MiB")
	fmt.Printf("LOAD publish burst: %d clients, %d messages in %v (%.0f msg/s), proxy peak RSS %.0f MiB, highest Go heap %.0f MiB\n",
		clients, n, took.Round(time.Millisecond), rate, mib(e.p.PeakRSS()), mib(maxHeap))
}

// BenchmarkAMQPPublishBurst is BenchmarkPublishBurst for AMQP: LOAD_BURST_CLIENTS connections
// (default 32), one channel each in confirm mode, publish LOAD_BURST_N (default 200,000) 1 KiB
// persistent messages in all into one durable queue as fast as the client sends them, and wait
// for every confirm only at the end. It reports the throughput, the proxy's peak RSS and the
// highest Go heap.
//
//	go test ./test/load/ -run x -bench AMQPPublishBurst -benchtime 1x
func BenchmarkAMQPPublishBurst(b *testing.B) {
	n := envInt(b, "LOAD_BURST_N", 200_000, 20_000)
	clients := envInt(b, "LOAD_BURST_CLIENTS", 32, 4)
	for range b.N {
		addr, _ := startBackend(b)
		e := startProxyOn(b, addr)
		benchAMQPPublishBurst(b, e, n, clients)
		e.stop()
	}
}

func benchAMQPPublishBurst(b *testing.B, e *proxyEnv, n, clients int) {
	url := "amqp://guest:guest@" + e.amqpAddr + "/"
	queue := "burst-" + e.suffix
	conns := make([]*amqp.Connection, clients)
	chs := make([]*amqp.Channel, clients)
	confirms := make([]chan amqp.Confirmation, clients)
	for i := range conns {
		c, err := amqp.Dial(url)
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		ch, err := c.Channel()
		if err != nil {
			b.Fatal(err)
		}
		if err := ch.Confirm(false); err != nil {
			b.Fatal(err)
		}
		conns[i], chs[i] = c, ch
		confirms[i] = ch.NotifyPublish(make(chan amqp.Confirmation, n/clients+1))
	}
	if _, err := chs[0].QueueDeclare(queue, true, false, false, false, nil); err != nil {
		b.Fatal(err)
	}
	peak := sampleHeap(e)
	body := make([]byte, 1024)
	start := time.Now()
	var wg sync.WaitGroup
	var nacked, failed atomic.Int64
	for k := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sent := 0
			for i := k; i < n; i += clients {
				if err := chs[k].PublishWithContext(b.Context(), "", queue, false, false,
					amqp.Publishing{DeliveryMode: amqp.Persistent, Body: body}); err != nil {
					failed.Add(1)
					return
				}
				sent++
			}
			for range sent {
				if c := <-confirms[k]; !c.Ack {
					nacked.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	took := time.Since(start)
	maxHeap := peak()
	if nacked.Load() > 0 || failed.Load() > 0 {
		b.Errorf("%d nacked, %d clients failed", nacked.Load(), failed.Load())
	}
	rate := float64(n) / took.Seconds()
	b.ReportMetric(rate, "msg/s")
	b.ReportMetric(mib(e.p.PeakRSS()), "peak-RSS-MiB")
	b.ReportMetric(mib(maxHeap), "max-heap-MiB")
	fmt.Printf("LOAD AMQP publish burst: %d connections, %d messages in %v (%.0f msg/s), proxy peak RSS %.0f MiB, highest Go heap %.0f MiB\n",
		clients, n, took.Round(time.Millisecond), rate, mib(e.p.PeakRSS()), mib(maxHeap))
}

// sampleHeap samples the proxy's Go heap every 100 ms until the returned
// function is called, which returns the highest value seen.
func sampleHeap(e *proxyEnv) func() float64 {
	var maxHeap float64
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			if m := e.scrape(); m[heapAlloc] > maxHeap {
				maxHeap = m[heapAlloc]
			}
		}
	}()
	return func() float64 {
		close(stop)
		<-done
		return maxHeap
	}
}
