package amqp091

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kubemq-io/kubemq-proxy/amqp091/wire"
)

// metricsEnv is an option giving the server its own Prometheus registry.
func metricsEnv(reg *prometheus.Registry) func(*Options) {
	return func(o *Options) { o.Metrics = reg }
}

// metricValue reads one series of the registry: the counter or gauge
// named name (without the kubemq_proxy_amqp_ prefix) whose labels include
// labels (name, value pairs). A missing series reads 0.
func metricValue(t testing.TB, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "kubemq_proxy_amqp_"+name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, l := range m.GetLabel() {
					if l.GetName() == labels[i] && l.GetValue() == labels[i+1] {
						found = true
					}
				}
				if !found {
					continue series
				}
			}
			if c := m.GetCounter(); c != nil {
				return c.GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return 0
}

// Per-queue traffic counters (with their label bound) and the server's
// closes by reply code, read from the server's registry after real
// client traffic.
func TestMetricsQueueTrafficAndErrors(t *testing.T) {
	reg := prometheus.NewRegistry()
	e := newEnv(t, metricsEnv(reg), func(o *Options) { o.MetricsQueueLabels = 2 })
	c := e.dial()
	ch := e.channel(c)
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"m1", "m2", "m3", "m4"} {
		if _, err := ch.QueueDeclare(q, false, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	// Label order is first use: m1 and m2 get their own, m3 and m4 share.
	publishConfirmed(t, ch, "", "m1", "aa", "bbb", "c")
	publishConfirmed(t, ch, "", "m2", "dddd")
	publishConfirmed(t, ch, "", "m3", "eeeee")
	publishConfirmed(t, ch, "", "m4", "ffffff", "g")
	if got := drain(t, ch, "m1"); len(got) != 3 {
		t.Fatalf("m1: %v", got)
	}
	if got := drain(t, ch, "m4"); len(got) != 2 {
		t.Fatalf("m4: %v", got)
	}
	deliveries, err := ch.Consume("m2", "", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if d := mustRecv(t, deliveries, "delivery"); string(d.Body) != "dddd" {
		t.Fatalf("m2: %q", d.Body)
	}
	for _, w := range []struct {
		name, queue, vhost string
		want               float64
	}{
		{"queue_messages_in_total", "m1", e.vhost, 3}, {"queue_bytes_in_total", "m1", e.vhost, 6},
		{"queue_messages_out_total", "m1", e.vhost, 3}, {"queue_bytes_out_total", "m1", e.vhost, 6},
		{"queue_messages_in_total", "m2", e.vhost, 1}, {"queue_bytes_in_total", "m2", e.vhost, 4},
		{"queue_messages_out_total", "m2", e.vhost, 1}, {"queue_bytes_out_total", "m2", e.vhost, 4},
		{"queue_messages_in_total", "m3", e.vhost, 0},
		{"queue_messages_in_total", otherQueue, otherQueue, 3}, {"queue_bytes_in_total", otherQueue, otherQueue, 12},
		{"queue_messages_out_total", otherQueue, otherQueue, 2}, {"queue_bytes_out_total", otherQueue, otherQueue, 7},
	} {
		if got := metricValue(t, reg, w.name, "vhost", w.vhost, "queue", w.queue); got != w.want {
			t.Errorf("%s{vhost=%q,queue=%q} = %v, want %v", w.name, w.vhost, w.queue, got, w.want)
		}
	}
	if n := len(e.srv.m.queues); n != 2 {
		t.Errorf("%d queues with their own labels, want 2", n)
	}

	// 404 and 406 close channels; a frame on an unopened channel closes
	// the connection (504).
	if _, err := ch.QueueDeclarePassive("missing", false, false, false, false, nil); amqpCode(err) != 404 {
		t.Fatalf("passive declare: %v", err)
	}
	ch = e.channel(c)
	if _, err := ch.QueueDeclare("m1", true, false, false, false, nil); amqpCode(err) != 406 {
		t.Fatalf("inequivalent declare: %v", err)
	}
	p := e.rawDial()
	p.open(e.vhost, nil)
	p.send(7, &wire.QueueDeclare{Queue: "x"})
	p.expectClose(504, "CHANNEL_ERROR - expected 'channel.open'")
	for _, w := range []struct {
		code, scope string
		want        float64
	}{{"404", "channel", 1}, {"406", "channel", 1}, {"504", "connection", 1}, {"404", "connection", 0}} {
		if got := metricValue(t, reg, "errors_total", "code", w.code, "scope", w.scope); got != w.want {
			t.Errorf("errors_total{code=%s,scope=%s} = %v, want %v", w.code, w.scope, got, w.want)
		}
	}
}
