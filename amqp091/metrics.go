package amqp091

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the front-end's Prometheus series.
type metrics struct {
	connections, channels, consumers, blocked                                prometheus.Gauge
	published, unroutable, routed, delivered, acked, requeued, storeFailures prometheus.Counter
	confirms                                                                 *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	g := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "kubemq_proxy", Subsystem: "amqp", Name: name, Help: help})
	}
	c := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: "kubemq_proxy", Subsystem: "amqp", Name: name, Help: help})
	}
	m := &metrics{
		connections:   g("connections", "Open AMQP connections."),
		channels:      g("channels", "Open AMQP channels."),
		consumers:     g("consumers", "Active basic.consume consumers."),
		blocked:       g("blocked_connections", "Connections not read from because their pending publish bytes are over the limit."),
		published:     c("published_total", "Messages published by clients."),
		unroutable:    c("unroutable_total", "Published messages that reached no queue."),
		routed:        c("routed_total", "Queue copies of published messages sent to KubeMQ."),
		delivered:     c("delivered_total", "Messages delivered to clients (basic.deliver and basic.get-ok)."),
		acked:         c("acked_total", "Deliveries settled by the client (ack, or reject/nack without requeue)."),
		requeued:      c("requeued_total", "Deliveries given back for redelivery."),
		storeFailures: c("store_failures_total", "Queue copies KubeMQ did not store."),
		confirms: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "kubemq_proxy", Subsystem: "amqp",
			Name: "confirms_total", Help: "Publisher confirms sent, by kind (ack, nack)."}, []string{"kind"}),
	}
	if reg != nil {
		for _, col := range []prometheus.Collector{m.connections, m.channels, m.consumers, m.blocked, m.published, m.unroutable,
			m.routed, m.delivered, m.acked, m.requeued, m.storeFailures, m.confirms} {
			// A second Server on the same registry (tests) keeps counting
			// in its own series; registration errors are not fatal.
			_ = reg.Register(col)
		}
	}
	return m
}
