package load

import (
	"context"
	"fmt"
	"math"
	"strconv"
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

// TestMemorySoak runs steady load on both protocols against one proxy process and samples its
// memory: Pub/Sub publish into a topic with a plain and an ordered subscription (16 ordering
// keys), and AMQP confirmed publish into a queue, each consumed with 95 % acks and 5 % nacks
// (requeues; one in 1,000 on the ordered subscription, where a nack brings back the rest of
// its key). After a warm-up (LOAD_SOAK_WARMUP, default 60 s: the acknowledgement log a
// replica follows fills its one-minute window meanwhile), the proxy's RSS must show no growth
// trend for LOAD_SOAK (default 60 s): its least-squares slope stays under soakMaxSlope, and in a
// long run (LOAD_SOAK of 10 minutes or more) every sample stays within ±15 % of the mean. It
// prints the samples as a table. Under -race it only reports: the race detector's own memory
// grows with every allocation.
//
//	go test ./test/load/ -run MemorySoak -v -count=1                            # as in CI
//	LOAD_SOAK=30m go test ./test/load/ -run MemorySoak -v -count=1 -timeout 40m  # the long run
//
// LOAD_SOAK_RATE is messages per second per protocol (default 1,000; 300 under -race, whose
// binary is several times slower).
func TestMemorySoak(t *testing.T) {
	if testing.Short() {
		t.Skip("the soak takes two minutes")
	}
	warmup := envDuration(t, "LOAD_SOAK_WARMUP", time.Minute)
	d := warmup + envDuration(t, "LOAD_SOAK", time.Minute)
	defRate := 1000
	if proctest.Race {
		defRate = 300
	}
	rate := envInt(t, "LOAD_SOAK_RATE", defRate, defRate)
	sampleEvery := 10 * time.Second
	if d < 5*time.Minute {
		sampleEvery = 5 * time.Second
	}
	// The backend runs apart: it keeps what KubeMQ retains (the topic log, 24 h by default),
	// which grows under any load; the proxy must not.
	kubemqAddr, backend := startBackend(t)
	e := startProxyOn(t, kubemqAddr, "--gcp.runtime_idle", "10m")
	defer e.stop()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	var ps, aq soakCounts
	soakPubSub(ctx, t, e, rate, &wg, &ps.published, &ps.delivered, &ps.nacked)
	soakAMQP(ctx, t, e, rate, &wg, &aq.published, &aq.delivered, &aq.nacked)

	type sample struct {
		at                 time.Duration
		rss, heap, backend float64
	}
	var samples []sample
	start := time.Now()
	for time.Since(start) < d {
		time.Sleep(sampleEvery)
		e.alive()
		m, err := proctest.Scrape(e.httpAdr)
		if err != nil {
			// Keep what was sampled: the table below shows the run up to here.
			t.Errorf("scrape at %v: %v", time.Since(start).Round(time.Second), err)
			break
		}
		s := sample{at: time.Since(start), rss: mib(m.RSS()), heap: mib(m.Heap())}
		if backend != nil {
			s.backend = mib(backend.RSS())
		}
		samples = append(samples, s)
	}
	cancel()
	wg.Wait()

	var b strings.Builder
	fmt.Fprintf(&b, "%8s %10s %10s %12s\n", "t", "RSS MiB", "heap MiB", "backend MiB")
	var xs, ys []float64
	for _, s := range samples {
		mark := ""
		if s.at >= warmup {
			xs, ys = append(xs, s.at.Minutes()), append(ys, s.rss)
		} else {
			mark = " (warm-up)"
		}
		fmt.Fprintf(&b, "%8s %10.1f %10.1f %12.1f%s\n", s.at.Round(time.Second), s.rss, s.heap, s.backend, mark)
	}
	slope, mean, se := regression(xs, ys)
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, y := range ys {
		lo, hi = min(lo, y), max(hi, y)
	}
	t.Logf("memory samples of the proxy under load:\n%s", b.String())
	report(t, "soak %v at %d msg/s per protocol: Pub/Sub %s (two subscriptions), AMQP %s; RSS after warm-up mean %.1f MiB, min %.1f, max %.1f, slope %+.2f MiB/min (standard error %.2f)",
		d, rate, &ps, &aq, mean, lo, hi, slope, se)
	if len(ys) < 3 {
		t.Fatalf("only %d samples after the warm-up", len(ys))
	}
	// Pub/Sub delivers each message on two subscriptions.
	ps.check(t, "Pub/Sub", 2)
	aq.check(t, "AMQP", 1)
	if proctest.Race {
		return
	}
	// A trend counts only when it is both steep and clear of the samples' scatter (three
	// standard errors): over a one-minute window, GC cycles move RSS by more than 5 % either way.
	if slope > soakMaxSlope(mean) && slope > 3*se {
		t.Errorf("RSS grows by %.2f MiB/min after the warm-up (allowed %.2f: 5 %% of its mean a minute; standard error %.2f)", slope, soakMaxSlope(mean), se)
	}
	if d-warmup >= 10*time.Minute && (lo < 0.85*mean || hi > 1.15*mean) {
		t.Errorf("RSS after the warm-up leaves ±15 %% of its mean %.1f MiB: min %.1f, max %.1f", mean, lo, hi)
	}
}

// soakCounts counts one protocol's messages in a soak.
type soakCounts struct{ published, delivered, nacked atomic.Int64 }

func (c *soakCounts) String() string {
	return fmt.Sprintf("published %d, delivered %d (%d nacked)", c.published.Load(), c.delivered.Load(), c.nacked.Load())
}

// check fails when the consumers fell far behind, or when far more was delivered than the nacks
// explain (a redelivery storm is a fault even when memory holds).
func (c *soakCounts) check(t *testing.T, name string, copies int64) {
	t.Helper()
	want := c.published.Load() * copies
	if got := c.delivered.Load(); got < want/2 {
		if proctest.Race {
			// A race-built proxy on a machine busy with other test packages may not keep up;
			// that measures the machine, not a leak.
			t.Logf("%s: the consumers fell behind (race build): %d delivered of %d", name, got, want)
		} else {
			t.Errorf("%s: the consumers fell far behind: %d delivered of %d", name, got, want)
		}
	} else if got > 2*want {
		t.Errorf("%s: %d delivered for %d published copies: a redelivery storm", name, got, want)
	}
}

// soakMaxSlope is the growth trend a soak tolerates: 5 % of the mean RSS per minute (over a short
// run, GC cycles and buffer pools move RSS by a few MiB either way; a leak at this load grows
// by far more).
func soakMaxSlope(mean float64) float64 { return 0.05 * mean }

// regression returns the least-squares slope of ys over xs, the mean of ys, and the slope's
// standard error.
func regression(xs, ys []float64) (slope, mean, se float64) {
	n := float64(len(xs))
	if n < 2 {
		return 0, 0, 0
	}
	var sx, sy, sxx, sxy float64
	for i := range xs {
		sx, sy, sxx, sxy = sx+xs[i], sy+ys[i], sxx+xs[i]*xs[i], sxy+xs[i]*ys[i]
	}
	den := n*sxx - sx*sx
	if den == 0 {
		return 0, sy / n, 0
	}
	slope, mean = (n*sxy-sx*sy)/den, sy/n
	if n > 2 {
		xm := sx / n
		var rss, sxxc float64
		for i := range xs {
			r := ys[i] - (mean + slope*(xs[i]-xm))
			rss += r * r
			sxxc += (xs[i] - xm) * (xs[i] - xm)
		}
		se = math.Sqrt(rss / (n - 2) / sxxc)
	}
	return slope, mean, se
}

// every runs f about rate times a second until ctx ends.
func every(ctx context.Context, rate int, f func(i int)) {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	start := time.Now()
	sent := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		due := int(time.Since(start).Seconds() * float64(rate))
		for ; sent < due; sent++ {
			f(sent)
		}
	}
}

func soakPubSub(ctx context.Context, t *testing.T, e *proxyEnv, rate int, wg *sync.WaitGroup, published, delivered, nacked *atomic.Int64) {
	c, err := pubsub.NewClient(context.Background(), "soak", option.WithEndpoint(e.gcpAddr), option.WithoutAuthentication(),
		option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	topic := "projects/soak/topics/soak-" + e.suffix
	if _, err := c.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: topic}); err != nil {
		t.Fatal(err)
	}
	subs := []*pubsubpb.Subscription{
		{Name: "projects/soak/subscriptions/plain-" + e.suffix, Topic: topic},
		{Name: "projects/soak/subscriptions/ordered-" + e.suffix, Topic: topic, EnableMessageOrdering: true},
	}
	for _, s := range subs {
		if _, err := c.SubscriptionAdminClient.CreateSubscription(ctx, s); err != nil {
			t.Fatal(err)
		}
		sub := c.Subscriber(s.Name)
		// A nack of an ordered message brings back every later message of its key that is
		// out (Google's rule), so nacks there multiply deliveries once a backlog forms; the
		// ordered subscription nacks one message in 1,000, the others one in 20.
		every := 20
		if s.EnableMessageOrdering {
			every = 1000
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			var n atomic.Int64 // the callback runs on several goroutines at once
			_ = sub.Receive(ctx, func(_ context.Context, m *pubsub.Message) {
				delivered.Add(1)
				if n.Add(1)%int64(every) == 0 {
					nacked.Add(1)
					m.Nack()
					return
				}
				m.Ack()
			})
		}()
	}
	pub := c.Publisher(topic)
	pub.EnableMessageOrdering = true
	body := make([]byte, 1024)
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer pub.Stop()
		every(ctx, rate, func(i int) {
			pub.Publish(ctx, &pubsub.Message{Data: body, OrderingKey: "k" + strconv.Itoa(i%16)})
			published.Add(1)
		})
	}()
}

func soakAMQP(ctx context.Context, t *testing.T, e *proxyEnv, rate int, wg *sync.WaitGroup, published, delivered, nacked *atomic.Int64) {
	conn, err := amqp.Dial("amqp://guest:guest@" + e.amqpAddr + "/")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	pch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	q := "soak-" + e.suffix
	if _, err := pch.QueueDeclare(q, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := pch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	confirms := pch.NotifyPublish(make(chan amqp.Confirmation, 4096))
	cch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := cch.Qos(100, 0, false); err != nil {
		t.Fatal(err)
	}
	msgs, err := cch.Consume(q, "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	body := make([]byte, 1024)
	wg.Add(3)
	go func() {
		defer wg.Done()
		every(ctx, rate, func(int) {
			if pch.PublishWithContext(ctx, "", q, false, false, amqp.Publishing{DeliveryMode: amqp.Persistent, Body: body}) == nil {
				published.Add(1)
			}
		})
	}()
	go func() {
		defer wg.Done()
		for {
			select {
			case <-confirms:
			case <-ctx.Done():
				return
			}
		}
	}()
	go func() {
		defer wg.Done()
		n := 0
		for {
			select {
			case m, ok := <-msgs:
				if !ok {
					return
				}
				delivered.Add(1)
				n++
				if n%20 == 0 {
					nacked.Add(1)
					_ = m.Nack(false, true)
					continue
				}
				_ = m.Ack(false)
			case <-ctx.Done():
				return
			}
		}
	}()
}

// The soak's trend check flags a steady leak and lets GC scatter pass.
func TestSoakTrendCheck(t *testing.T) {
	var xs, leak, flat []float64
	for i := range 12 {
		x := float64(i) / 12
		scatter := []float64{9, -7, 12, -10, 4, -12, 8, -3, 11, -9, 6, -8}[i]
		xs, leak, flat = append(xs, x), append(leak, 80+30*x+scatter/4), append(flat, 80+scatter)
	}
	if slope, mean, se := regression(xs, leak); !(slope > soakMaxSlope(mean) && slope > 3*se) {
		t.Errorf("a 30 MiB/min leak passes: slope %.2f, se %.2f", slope, se)
	}
	if slope, mean, se := regression(xs, flat); slope > soakMaxSlope(mean) && slope > 3*se {
		t.Errorf("flat scatter fails: slope %.2f, se %.2f", slope, se)
	}
}
