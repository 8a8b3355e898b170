// Package overhead measures what the proxy adds to KubeMQ: the same work through the proxy (the
// official Pub/Sub and AMQP clients, the proxy running as its own process) and by the project's
// kubemqclient straight to the same KubeMQ, in one run, with 1 KiB messages. The backend is
// $KUBEMQ_ADDRESS (the real KubeMQ), else this repository's embedded server run as a process of
// its own. Run:
//
//	go test -run '^$' -bench . -benchtime 1x ./test/overhead/
//	KUBEMQ_ADDRESS=127.0.0.1:50000 go test -run '^$' -bench . -benchtime 1x ./test/overhead/
//
// Each benchmark does a fixed amount of work (OVERHEAD_N messages, default 20000; b.N is
// ignored beyond 1) and reports msg/s through the proxy and direct, and their ratio. The direct
// side does what the proxy must do on KubeMQ for the same result:
//   - Pub/Sub publish: one events-store event in the topic log and one copy in the subscription
//     queue per message, 100 messages per call, 8 calls in flight;
//   - backlog receive and ack: Get up to 1,000, store one lease record for the batch (a delayed
//     message holding the batch), AckAll, as the proxy's delivery engine does; the plain drain
//     (Get and AckAll only) is reported too;
//   - AMQP publish with confirms: one queue message per publish, 100 per call, 8 calls in flight;
//   - AMQP consume: as the backlog drain.
//
// BenchmarkLatency publishes at a steady OVERHEAD_RATE (default 1,000) msg/s for 10 s through the
// proxy and reports publish-to-receive p50/p99 on the backend above and, in the same run, on an
// embedded backend.
package overhead

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kubemq-io/kubemq-proxy/internal/kubemqtest"
	"github.com/kubemq-io/kubemq-proxy/internal/proctest"
	kc "github.com/kubemq-io/kubemq-proxy/kubemqclient"
)

func TestMain(m *testing.M) { proctest.Main(m) }

const bodySize = 1024

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func suffix() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// backend is a KubeMQ for a benchmark: $KUBEMQ_ADDRESS, or an embedded server process.
func backend(b *testing.B, embeddedAlways bool) string {
	if a := os.Getenv(kubemqtest.EnvAddress); a != "" && !embeddedAlways {
		return a
	}
	dir := proctest.RunDir(b, "OVERHEAD_LOGS")
	p, err := proctest.Start(proctest.Binary(b, false), "backend", dir, []string{"embedded-kubemq"},
		"embedded", "--embedded.listen", "127.0.0.1:0", "--http.listen", "127.0.0.1:0", "--embedded.data_dir", filepath.Join(dir, "data"), "--log.level", "info")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(p.Kill)
	return p.Addr("embedded-kubemq")
}

// proxyOn runs the proxy binary on kubemqAddr and returns its Pub/Sub and AMQP addresses.
func proxyOn(b *testing.B, kubemqAddr string) (gcpAddr, amqpAddr string) {
	dir := proctest.RunDir(b, "OVERHEAD_LOGS")
	s := suffix()
	p, err := proctest.Start(proctest.Binary(b, false), "proxy", dir, []string{"gcp", "amqp", "http"},
		"--gcp.listen", "127.0.0.1:0", "--amqp.listen", "127.0.0.1:0", "--amqp.tls_listen", "", "--amqp.management_listen", "127.0.0.1:0", "--http.listen", "127.0.0.1:0",
		"--kubemq.address", kubemqAddr, "--registry.channel", "overhead.registry."+s, "--cluster.channel", "overhead.cluster."+s,
		"--log.level", logLevel(), "--gcp.max_inflight_per_subscription", "200000")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(p.Kill)
	if err := proctest.WaitReady(p.Addr("http"), time.Minute); err != nil {
		b.Fatal(err)
	}
	return p.Addr("gcp"), p.Addr("amqp")
}

func dial(b *testing.B, addr string) *kc.Client {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := kc.Dial(ctx, kc.Options{Address: addr, Logger: zap.NewNop()})
	if err != nil {
		b.Fatal(err)
	}
	if err := c.WaitReady(ctx); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	return c
}

func pubsubClient(b *testing.B, addr string) *pubsub.Client {
	c, err := pubsub.NewClient(context.Background(), "overhead", option.WithEndpoint(addr), option.WithoutAuthentication(),
		option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	return c
}

// report prints one line and the metrics of a proxy-vs-direct pair.
func report(b *testing.B, what string, n int, proxy, direct time.Duration) {
	pr, dr := float64(n)/proxy.Seconds(), float64(n)/direct.Seconds()
	b.ReportMetric(pr, "proxy-msg/s")
	b.ReportMetric(dr, "direct-msg/s")
	b.ReportMetric(pr/dr, "ratio")
	fmt.Printf("OVERHEAD %s: %d messages, proxy %.0f msg/s, direct %.0f msg/s, ratio %.2f\n", what, n, pr, dr, pr/dr)
}

// parallel runs f for [0,n) in chunks of size, with workers at a time.
func parallel(b *testing.B, n, size, workers int, f func(from, k int) error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				from := int(next.Add(int64(size))) - size
				if from >= n {
					return
				}
				if err := f(from, min(size, n-from)); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
}

var body = make([]byte, bodySize)

// sendQueue stores k messages in queue, one call.
func sendQueue(c *kc.Client, queue string, k int) error {
	msgs := make([]kc.QueueMessage, k)
	for i := range msgs {
		msgs[i] = kc.QueueMessage{Channel: queue, Body: body, Tags: map[string]string{"n": strconv.Itoa(i)}}
	}
	rs, err := c.SendQueueMessages(context.Background(), msgs)
	if err == nil {
		err = kc.FirstError(rs)
	}
	return err
}

// drain reads n messages from queue: Get up to 1,000, a lease record for the batch when
// records, then AckAll and a Sync.
func drain(b *testing.B, c *kc.Client, queue string, n int, records bool) time.Duration {
	ds, err := c.OpenDownstream(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	defer ds.Close()
	start := time.Now()
	for got := 0; got < n; {
		tx, err := ds.Get(context.Background(), kc.GetRequest{Channel: queue, MaxItems: min(1000, n-got), Wait: time.Second})
		if err != nil {
			b.Fatal(err)
		}
		if len(tx.Messages) == 0 {
			continue
		}
		if records {
			size := 0
			for _, m := range tx.Messages {
				size += len(m.Body) + 64
			}
			rec := make([]byte, 0, size)
			for _, m := range tx.Messages {
				rec = append(rec, m.Body...)
			}
			rs, err := c.SendQueueMessages(context.Background(), []kc.QueueMessage{{Channel: queue, Body: rec, Policy: kc.QueuePolicy{Delay: 10 * time.Second}}})
			if err == nil {
				err = kc.FirstError(rs)
			}
			if err != nil {
				b.Fatal(err)
			}
		}
		if err := ds.AckAll(tx.ID); err != nil {
			b.Fatal(err)
		}
		if err := ds.Sync(context.Background(), tx.ID); err != nil {
			b.Fatal(err)
		}
		got += len(tx.Messages)
	}
	return time.Since(start)
}

func BenchmarkPubSubPublish(b *testing.B) {
	n := envInt("OVERHEAD_N", 20000)
	addr := backend(b, false)
	gcpAddr, _ := proxyOn(b, addr)
	c := pubsubClient(b, gcpAddr)
	s := suffix()
	topic, sub := "projects/overhead/topics/pub-"+s, "projects/overhead/subscriptions/pub-"+s
	ctx := context.Background()
	if _, err := c.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: topic}); err != nil {
		b.Fatal(err)
	}
	if _, err := c.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{Name: sub, Topic: topic}); err != nil {
		b.Fatal(err)
	}
	pub := c.Publisher(topic)
	defer pub.Stop()
	start := time.Now()
	results := make([]*pubsub.PublishResult, n)
	for i := range n {
		results[i] = pub.Publish(ctx, &pubsub.Message{Data: body, Attributes: map[string]string{"n": strconv.Itoa(i)}})
	}
	for _, r := range results {
		if _, err := r.Get(ctx); err != nil {
			b.Fatal(err)
		}
	}
	proxy := time.Since(start)

	kcl := dial(b, addr)
	log, queue := "overhead.direct.log."+s, "overhead.direct.sub."+s
	start = time.Now()
	parallel(b, n, 100, 8, func(from, k int) error {
		evs := make([]kc.Event, k)
		for i := range evs {
			evs[i] = kc.Event{Channel: log, Body: body, Tags: map[string]string{"n": strconv.Itoa(from + i)}}
		}
		rs, err := kcl.PublishEvents(ctx, evs)
		if err == nil {
			err = kc.FirstError(rs)
		}
		if err != nil {
			return err
		}
		return sendQueue(kcl, queue, k)
	})
	report(b, "Pub/Sub publish", n, proxy, time.Since(start))
}

func BenchmarkPubSubBacklog(b *testing.B) {
	n := envInt("OVERHEAD_N", 20000)
	addr := backend(b, false)
	gcpAddr, _ := proxyOn(b, addr)
	c := pubsubClient(b, gcpAddr)
	s := suffix()
	topic, sub := "projects/overhead/topics/backlog-"+s, "projects/overhead/subscriptions/backlog-"+s
	ctx := context.Background()
	if _, err := c.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: topic}); err != nil {
		b.Fatal(err)
	}
	if _, err := c.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{Name: sub, Topic: topic, AckDeadlineSeconds: 60}); err != nil {
		b.Fatal(err)
	}
	pub := c.Publisher(topic)
	results := make([]*pubsub.PublishResult, n)
	for i := range n {
		results[i] = pub.Publish(ctx, &pubsub.Message{Data: body})
	}
	for _, r := range results {
		if _, err := r.Get(ctx); err != nil {
			b.Fatal(err)
		}
	}
	pub.Stop()
	rs := c.Subscriber(sub)
	rs.ReceiveSettings.MaxOutstandingMessages = 1000
	rs.ReceiveSettings.NumGoroutines = 1
	var got atomic.Int64
	rctx, cancel := context.WithCancel(ctx)
	start := time.Now()
	done := make(chan time.Duration, 1)
	go func() {
		_ = rs.Receive(rctx, func(_ context.Context, m *pubsub.Message) {
			m.Ack()
			if got.Add(1) == int64(n) {
				done <- time.Since(start)
			}
		})
	}()
	var proxy time.Duration
	select {
	case proxy = <-done:
	case <-time.After(5 * time.Minute):
		b.Fatalf("received %d of %d", got.Load(), n)
	}
	cancel()

	kcl := dial(b, addr)
	q1, q2 := "overhead.direct.backlog."+s, "overhead.direct.plain."+s
	parallel(b, n, 100, 8, func(_, k int) error { return sendQueue(kcl, q1, k) })
	parallel(b, n, 100, 8, func(_, k int) error { return sendQueue(kcl, q2, k) })
	direct := drain(b, kcl, q1, n, true)
	plain := drain(b, kcl, q2, n, false)
	report(b, "Pub/Sub backlog receive+ack", n, proxy, direct)
	fmt.Printf("OVERHEAD Pub/Sub backlog receive+ack vs a plain drain (Get, AckAll; no lease records): ratio %.2f\n", plain.Seconds()/proxy.Seconds())
}

func amqpChannel(b *testing.B, addr string) *amqp.Channel {
	conn, err := amqp.Dial("amqp://guest:guest@" + addr + "/")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	return ch
}

// publishConfirmed publishes n persistent messages to queue with confirms, window in flight.
func publishConfirmed(b *testing.B, ch *amqp.Channel, queue string, n, window int) time.Duration {
	if err := ch.Confirm(false); err != nil {
		b.Fatal(err)
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, window))
	start := time.Now()
	outstanding := 0
	for i := range n {
		if outstanding == window {
			if c := <-confirms; !c.Ack {
				b.Fatalf("publish %d nacked", c.DeliveryTag)
			}
			outstanding--
		}
		if err := ch.PublishWithContext(context.Background(), "", queue, false, false, amqp.Publishing{DeliveryMode: amqp.Persistent, Body: body}); err != nil {
			b.Fatal(err)
		}
		outstanding++
		_ = i
	}
	for ; outstanding > 0; outstanding-- {
		if c := <-confirms; !c.Ack {
			b.Fatalf("publish %d nacked", c.DeliveryTag)
		}
	}
	return time.Since(start)
}

func BenchmarkAMQPPublishConfirm(b *testing.B) {
	n := envInt("OVERHEAD_N", 20000)
	addr := backend(b, false)
	_, amqpAddr := proxyOn(b, addr)
	ch := amqpChannel(b, amqpAddr)
	q := "overhead-" + suffix()
	if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
		b.Fatal(err)
	}
	proxy := publishConfirmed(b, ch, q, n, 1000)
	kcl := dial(b, addr)
	start := time.Now()
	parallel(b, n, 100, 8, func(_, k int) error { return sendQueue(kcl, "overhead.direct.amqp."+q, k) })
	report(b, "AMQP publish with confirms", n, proxy, time.Since(start))
}

func BenchmarkAMQPConsume(b *testing.B) {
	n := envInt("OVERHEAD_N", 20000)
	addr := backend(b, false)
	_, amqpAddr := proxyOn(b, addr)
	ch := amqpChannel(b, amqpAddr)
	q := "overhead-" + suffix()
	if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
		b.Fatal(err)
	}
	publishConfirmed(b, ch, q, n, 1000)
	cch := amqpChannel(b, amqpAddr)
	if err := cch.Qos(1000, 0, false); err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	deliveries, err := cch.Consume(q, "", false, false, false, false, nil)
	if err != nil {
		b.Fatal(err)
	}
	for i := range n {
		d, ok := <-deliveries
		if !ok {
			b.Fatalf("consumer closed after %d", i)
		}
		if err := d.Ack(false); err != nil {
			b.Fatal(err)
		}
	}
	proxy := time.Since(start)
	kcl := dial(b, addr)
	dq := "overhead.direct.consume." + suffix()
	parallel(b, n, 100, 8, func(_, k int) error { return sendQueue(kcl, dq, k) })
	report(b, "AMQP consume", n, proxy, drain(b, kcl, dq, n, true))
}

// BenchmarkLatency: publish-to-receive latency at a steady rate through the proxy, on the
// benchmark's backend and on an embedded one, in one run.
func BenchmarkLatency(b *testing.B) {
	rate := envInt("OVERHEAD_RATE", 1000)
	for _, t := range []struct {
		name     string
		embedded bool
	}{{"backend", false}, {"embedded", true}} {
		if t.name == "backend" && os.Getenv(kubemqtest.EnvAddress) == "" {
			continue // the embedded row covers it
		}
		p50, p99, n := latency(b, backend(b, t.embedded), rate, 10*time.Second)
		b.ReportMetric(float64(p50.Microseconds())/1000, t.name+"-p50-ms")
		b.ReportMetric(float64(p99.Microseconds())/1000, t.name+"-p99-ms")
		fmt.Printf("OVERHEAD latency at %d msg/s (%s KubeMQ): %d messages, p50 %v, p99 %v\n", rate, t.name, n, p50.Round(100*time.Microsecond), p99.Round(100*time.Microsecond))
	}
}

func latency(b *testing.B, kubemqAddr string, rate int, d time.Duration) (p50, p99 time.Duration, n int) {
	gcpAddr, _ := proxyOn(b, kubemqAddr)
	c := pubsubClient(b, gcpAddr)
	s := suffix()
	topic, sub := "projects/overhead/topics/lat-"+s, "projects/overhead/subscriptions/lat-"+s
	ctx := context.Background()
	if _, err := c.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: topic}); err != nil {
		b.Fatal(err)
	}
	if _, err := c.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{Name: sub, Topic: topic}); err != nil {
		b.Fatal(err)
	}
	var mu sync.Mutex
	var lat []time.Duration
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	rs := c.Subscriber(sub)
	go func() {
		_ = rs.Receive(rctx, func(_ context.Context, m *pubsub.Message) {
			sent, _ := strconv.ParseInt(m.Attributes["t"], 10, 64)
			mu.Lock()
			lat = append(lat, time.Since(time.Unix(0, sent)))
			mu.Unlock()
			m.Ack()
		})
	}()
	time.Sleep(time.Second) // the stream is open
	pub := c.Publisher(topic)
	pub.PublishSettings.DelayThreshold = time.Millisecond
	defer pub.Stop()
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	end := time.Now().Add(d)
	sent := 0
	for time.Now().Before(end) {
		<-tick.C
		pub.Publish(ctx, &pubsub.Message{Data: body, Attributes: map[string]string{"t": strconv.FormatInt(time.Now().UnixNano(), 10)}})
		sent++
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		got := len(lat)
		mu.Unlock()
		if got >= sent || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(lat) == 0 {
		b.Fatal("nothing received")
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	return lat[len(lat)/2], lat[len(lat)*99/100], len(lat)
}

// logLevel is the proxy's log level: $OVERHEAD_LOG_LEVEL, default info.
func logLevel() string {
	if l := os.Getenv("OVERHEAD_LOG_LEVEL"); l != "" {
		return l
	}
	return "info"
}
