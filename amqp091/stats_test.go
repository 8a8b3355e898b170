package amqp091

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
)

// series reads one gauge or counter series of reg by full name and exact label set; ok is
// false when the series is missing.
func series(t testing.TB, reg *prometheus.Registry, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			for _, l := range m.GetLabel() {
				if labels[l.GetName()] != l.GetValue() {
					continue next
				}
			}
			if c := m.GetCounter(); c != nil {
				return c.GetValue(), true
			}
			if h := m.GetHistogram(); h != nil {
				return float64(h.GetSampleCount()), true
			}
			return m.GetGauge().GetValue(), true
		}
	}
	return 0, false
}

// until retries check until it returns "" or 20 s pass (the waiting counts are cached
// for BacklogMaxAge, and the lease engine fetches on its own schedule).
func until(t testing.TB, check func() string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		msg := check()
		if msg == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(msg)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Per-queue backlog gauges after publishing N and holding M unacked with amqp091-go: ready,
// unacked, consumers and oldest unacked age per queue, the "_other" bound, the latency
// histograms, and the same figures in QueueStats and GET /state's view.
func TestQueueBacklogMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	e := newEnv(t, metricsEnv(reg), func(o *Options) { o.MetricsQueueLabels = 2 })
	c := e.dial()
	ch := e.channel(c)
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"b1", "b2", "b3", "b4"} {
		if _, err := ch.QueueDeclare(q, false, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	const n, m = 10, 3
	var bodies []string
	for i := range n {
		bodies = append(bodies, fmt.Sprint("m", i))
	}
	// Label order is first use: b1 and b2 get their own, b3 and b4 share "_other".
	publishConfirmed(t, ch, "", "b1", bodies...)
	publishConfirmed(t, ch, "", "b2", "x")
	publishConfirmed(t, ch, "", "b3", "y", "z")
	publishConfirmed(t, ch, "", "b4", "w")

	cc := e.channel(c)
	if err := cc.Qos(m, 0, false); err != nil {
		t.Fatal(err)
	}
	ds, err := cc.Consume("b1", "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	var held []amqp.Delivery
	for range m {
		held = append(held, mustRecv(t, ds, "delivery"))
	}
	time.Sleep(50 * time.Millisecond) // some age for the oldest unacked message

	const ns = "kubemq_proxy_amqp_"
	lbl := func(q string) map[string]string { return map[string]string{"vhost": e.vhost, "queue": q} }
	other := map[string]string{"vhost": otherQueue, "queue": otherQueue}
	until(t, func() string {
		for _, w := range []struct {
			name   string
			labels map[string]string
			want   float64
		}{
			{"queue_messages_ready", lbl("b1"), n - m}, {"queue_messages_unacked", lbl("b1"), m}, {"queue_consumers", lbl("b1"), 1},
			{"queue_messages_ready", lbl("b2"), 1}, {"queue_messages_unacked", lbl("b2"), 0}, {"queue_consumers", lbl("b2"), 0},
			{"queue_messages_ready", other, 3}, {"queue_messages_unacked", other, 0},
			{"queue_stats_errors", nil, 0},
		} {
			if got, ok := series(t, reg, ns+w.name, w.labels); !ok || got != w.want {
				return fmt.Sprintf("%s%v = %v (present %v), want %v", w.name, w.labels, got, ok, w.want)
			}
		}
		if _, ok := series(t, reg, ns+"queue_messages_ready", lbl("b3")); ok {
			return "b3 has its own series beyond the label bound"
		}
		if age, _ := series(t, reg, ns+"queue_oldest_unacked_age_seconds", lbl("b1")); age <= 0 || age > 60 {
			return fmt.Sprintf("oldest unacked age of b1 = %v", age)
		}
		return ""
	})
	if got, _ := series(t, reg, ns+"publish_latency_seconds", nil); got < n+4 {
		t.Errorf("publish latency observations = %v, want >= %d", got, n+4)
	}
	if got, _ := series(t, reg, ns+"delivery_latency_seconds", nil); got < m {
		t.Errorf("delivery latency observations = %v, want >= %d", got, m)
	}

	// An ack moves one message out of unacked and counts in message_stats.
	if err := held[0].Ack(false); err != nil {
		t.Fatal(err)
	}
	until(t, func() string {
		stats, err := e.srv.QueueStats(context.Background())
		if err != nil {
			return err.Error()
		}
		for _, st := range stats {
			if st.Vhost == e.vhost && st.Name == "b1" {
				// The freed credit lets one more out: unacked stays m, ready drops by one.
				if st.Unacked != m || st.Ready != n-m-1 || st.Acked != 1 || st.Published != n || st.Delivered != m+1 || st.Consumers != 1 {
					return fmt.Sprintf("b1 stats %+v", st)
				}
				return ""
			}
		}
		return "b1 missing from QueueStats"
	})
	st := e.srv.State().(State)
	for _, v := range st.Vhosts {
		if v.Name != e.vhost {
			continue
		}
		for _, q := range v.Queues {
			if q.Name == "b1" {
				if q.MessagesReady == nil || *q.MessagesReady != n-m-1 || q.MessagesUnacked != m || q.OldestUnackedSeconds <= 0 || q.Acked != 1 {
					t.Errorf("/state b1: %+v", q)
				}
				return
			}
		}
	}
	t.Errorf("/state has no queue b1 in %s: %+v", e.vhost, st.Vhosts)
}

// The histograms count: a publish's latency is observed once per confirmed publish (not per
// routed copy), a delivery's only for first deliveries.
func TestLatencyHistogramsCount(t *testing.T) {
	reg := prometheus.NewRegistry()
	e := newEnv(t, metricsEnv(reg))
	c := e.dial()
	ch := e.channel(c)
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"h1", "h2"} {
		if _, err := ch.QueueDeclare(q, false, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
		if err := ch.QueueBind(q, "k", "amq.direct", false, nil); err != nil {
			t.Fatal(err)
		}
	}
	publishConfirmed(t, ch, "amq.direct", "k", "a", "b")
	if got, _ := series(t, reg, "kubemq_proxy_amqp_publish_latency_seconds", nil); got != 2 {
		t.Errorf("publish latency observations = %v, want 2 (one per publish)", got)
	}
	g, ok, err := ch.Get("h1", false)
	if err != nil || !ok {
		t.Fatalf("get: %v %v", ok, err)
	}
	if err := g.Nack(false, true); err != nil {
		t.Fatal(err)
	}
	g, ok, err = ch.Get("h1", true)
	if err != nil || !ok || !g.Redelivered {
		t.Fatalf("get again: %v %v %v", ok, g.Redelivered, err)
	}
	if got, _ := series(t, reg, "kubemq_proxy_amqp_delivery_latency_seconds", nil); got != 1 {
		t.Errorf("delivery latency observations = %v, want 1 (the redelivery is not observed)", got)
	}
}

// BenchmarkQueueStats measures building every queue's figures (what a scrape, GET /state or
// GET /api/queues costs) with 200 queues, each with a message; the waiting counts come from
// the cached QueuesInfo (one call every BacklogMaxAge, included when it falls due).
func BenchmarkQueueStats(b *testing.B) {
	e := newEnv(b)
	c := e.dial()
	ch := e.channel(c)
	if err := ch.Confirm(false); err != nil {
		b.Fatal(err)
	}
	for i := range 200 {
		q := fmt.Sprint("bq", i)
		if _, err := ch.QueueDeclare(q, false, false, false, false, nil); err != nil {
			b.Fatal(err)
		}
		dc, err := ch.PublishWithDeferredConfirm("", q, false, false, amqp.Publishing{Body: []byte("x")})
		if err != nil || !dc.Wait() {
			b.Fatal(err)
		}
	}
	ctx := context.Background()
	if _, err := e.srv.QueueStats(ctx); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		if _, err := e.srv.QueueStats(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// With two replicas, each reports what it holds: the owner of a queue's lease engine has all
// its unacked messages, those delivered to a consumer on the other replica included; the other
// replica reports none; both see KubeMQ's backlog. Delivery latency is observed where a message
// reaches its client (the forwarding replica's read-ahead may hold what the owner sent it).
func TestQueueBacklogMetricsTwoReplicas(t *testing.T) {
	first := newEnv(t)
	first.stopFn()
	clusterChan, secret := "amqptest.cluster."+randHex(4), "s-"+randHex(8)
	regA, regB := prometheus.NewRegistry(), prometheus.NewRegistry()
	a := startReplica(t, first, "ra", clusterChan, secret, metricsEnv(regA))
	b := startReplica(t, first, "rb", clusterChan, secret, metricsEnv(regB))
	rs := []*replica{a, b}
	cha := a.channel(a.dial())
	if _, err := cha.QueueDeclare("mr.q", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := cha.Qos(1, 0, false); err != nil {
		t.Fatal(err)
	}
	da, err := cha.Consume("mr.q", "ca", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if owner(t, rs, "mr.q") != a {
		t.Fatal("a should hold the queue")
	}
	chb := b.channel(b.dial())
	if err := chb.Qos(2, 0, false); err != nil {
		t.Fatal(err)
	}
	db, err := chb.Consume("mr.q", "cb", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	publishN(t, a.channel(a.dial()), "mr.q", 0, 10)
	mustRecv(t, da, "delivery on a")
	mustRecv(t, db, "delivery on b")
	mustRecv(t, db, "delivery on b")

	const ns = "kubemq_proxy_amqp_"
	l := map[string]string{"vhost": a.vhost, "queue": "mr.q"}
	until(t, func() string {
		ua, _ := series(t, regA, ns+"queue_messages_unacked", l)
		ub, okb := series(t, regB, ns+"queue_messages_unacked", l)
		ra, _ := series(t, regA, ns+"queue_messages_ready", l)
		rb, _ := series(t, regB, ns+"queue_messages_ready", l)
		cb, _ := series(t, regB, ns+"queue_consumers", l)
		if ua != 3 || ub != 0 || !okb || ra != 7 || rb > 7 || cb != 1 {
			return fmt.Sprintf("unacked a %v b %v (present %v), ready a %v b %v, consumers on b %v", ua, ub, okb, ra, rb, cb)
		}
		return ""
	})
	if got, _ := series(t, regA, ns+"delivery_latency_seconds", nil); got != 1 {
		t.Errorf("owner observed %v delivery latencies, want 1 (its own consumer's)", got)
	}
	if got, _ := series(t, regB, ns+"delivery_latency_seconds", nil); got != 2 {
		t.Errorf("the forwarding replica observed %v delivery latencies, want 2 (its consumer's)", got)
	}
}
