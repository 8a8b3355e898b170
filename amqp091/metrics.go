package amqp091

import (
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kubemq-io/kubemq-proxy/delivery"
)

// metrics are the front-end's Prometheus series.
type metrics struct {
	connections, channels, consumers, blocked                                prometheus.Gauge
	published, unroutable, routed, delivered, acked, requeued, storeFailures prometheus.Counter
	confirms                                                                 *prometheus.CounterVec
	errors                                                                   *prometheus.CounterVec
	// deadLettered counts messages dead-lettered and dropped by reason
	// (rejected, expired, maxlen; dropped: expired or over the length
	// limit without a dead-letter exchange).
	deadLettered, dropped *prometheus.CounterVec

	queueMsgsIn, queueBytesIn, queueMsgsOut, queueBytesOut *prometheus.CounterVec

	// linkRequests counts the requests other replicas' links send this one
	// (it holds the queue), by kind; linkCredit and linkSettle are two of
	// its series, resolved once.
	linkRequests           *prometheus.CounterVec
	linkCredit, linkSettle prometheus.Counter

	// publishLatency: a publish's content read to every queue copy stored in KubeMQ;
	// deliveryLatency: KubeMQ's store time to a first delivery handed to a client.
	publishLatency, deliveryLatency prometheus.Histogram

	// Per-queue series are bounded: the first maxQueues distinct queues get
	// their own labels, the rest share other.
	queueMu   sync.Mutex // guards queues
	queues    map[queueLabel]*queueStats
	maxQueues int
	other     *queueStats
}

type queueLabel struct{ vhost, queue string }

// queueStats are one label set's per-queue counters, resolved once.
type queueStats struct {
	msgsIn, bytesIn, msgsOut, bytesOut prometheus.Counter
}

// otherQueue labels the queues beyond the per-queue label bound.
const otherQueue = "_other"

func newMetrics(reg prometheus.Registerer, maxQueues int) *metrics {
	const ns, sub = "kubemq_proxy", "amqp"
	g := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help})
	}
	c := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help})
	}
	cv := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help}, labels)
	}
	const perQueue = " Queues beyond the configured label bound are counted under vhost and queue \"" + otherQueue + "\"."
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
		confirms:      cv("confirms_total", "Publisher confirms sent, by kind (ack, nack).", "kind"),
		errors: cv("errors_total", "Connections (scope=connection) and channels (scope=channel) the server closed, by reply code.",
			"code", "scope"),
		deadLettered:  cv("dead_lettered_total", "Messages dead-lettered, by reason (rejected, expired, maxlen).", "reason"),
		dropped:       cv("dropped_total", "Messages dropped by expiry or a length limit without a dead-letter exchange, by reason (expired, maxlen).", "reason"),
		queueMsgsIn:   cv("queue_messages_in_total", "Message copies KubeMQ stored in a queue."+perQueue, "vhost", "queue"),
		queueBytesIn:  cv("queue_bytes_in_total", "Body bytes of the message copies KubeMQ stored in a queue."+perQueue, "vhost", "queue"),
		queueMsgsOut:  cv("queue_messages_out_total", "Messages delivered from a queue (basic.deliver, basic.get-ok)."+perQueue, "vhost", "queue"),
		queueBytesOut: cv("queue_bytes_out_total", "Body bytes of the messages delivered from a queue."+perQueue, "vhost", "queue"),
		publishLatency: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "publish_latency_seconds",
			Help:    "Time from a basic.publish's content read to every routed copy stored in KubeMQ (outside transactions).",
			Buckets: publishLatencyBuckets}),
		deliveryLatency: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "delivery_latency_seconds",
			Help:    "Time from KubeMQ storing a message to its first delivery (basic.deliver, basic.get-ok) by this replica's lease engine.",
			Buckets: deliveryLatencyBuckets}),
		linkRequests: cv("peer_link_requests_total", "Requests received from other replicas' forwarded consumers and gets, by kind (open, credit, settle, get, cancel).", "kind"),
		queues:       map[queueLabel]*queueStats{},
		maxQueues:    maxQueues,
	}
	m.linkCredit, m.linkSettle = m.linkRequests.WithLabelValues("credit"), m.linkRequests.WithLabelValues("settle")
	m.other = m.statsFor(queueLabel{otherQueue, otherQueue})
	if reg != nil {
		for _, col := range []prometheus.Collector{m.connections, m.channels, m.consumers, m.blocked, m.published, m.unroutable,
			m.routed, m.delivered, m.acked, m.requeued, m.storeFailures, m.confirms, m.errors, m.deadLettered, m.dropped,
			m.queueMsgsIn, m.queueBytesIn, m.queueMsgsOut, m.queueBytesOut, m.publishLatency, m.deliveryLatency, m.linkRequests} {
			// A second Server on the same registry (tests) keeps counting
			// in its own series; registration errors are not fatal.
			_ = reg.Register(col)
		}
	}
	return m
}

func (m *metrics) statsFor(l queueLabel) *queueStats {
	return &queueStats{
		msgsIn: m.queueMsgsIn.WithLabelValues(l.vhost, l.queue), bytesIn: m.queueBytesIn.WithLabelValues(l.vhost, l.queue),
		msgsOut: m.queueMsgsOut.WithLabelValues(l.vhost, l.queue), bytesOut: m.queueBytesOut.WithLabelValues(l.vhost, l.queue),
	}
}

// queue returns the counters of queue name in vhost (its own, or the
// shared "_other" ones once the bound is reached).
func (m *metrics) queue(vhost, name string) *queueStats {
	l := queueLabel{vhost, name}
	m.queueMu.Lock()
	defer m.queueMu.Unlock()
	if st := m.queues[l]; st != nil {
		return st
	}
	if len(m.queues) >= m.maxQueues {
		return m.other
	}
	st := m.statsFor(l)
	m.queues[l] = st
	return st
}

// publishLatencyBuckets (100us to 13s) and deliveryLatencyBuckets (1ms to 35min: a
// delivery's latency includes the time the message waited in a backlog) are the buckets of
// the latency histograms (the Pub/Sub front-end uses the same).
var (
	publishLatencyBuckets  = prometheus.ExponentialBuckets(100e-6, 2, 18)
	deliveryLatencyBuckets = prometheus.ExponentialBuckets(1e-3, 2, 22)
)

// label returns the label pair queue name in vhost is reported under: its own, or "_other"
// once the bound is reached (the same assignment as queue's).
func (m *metrics) label(vhost, name string) queueLabel {
	l := queueLabel{vhost, name}
	if m.queue(vhost, name) == m.other {
		return queueLabel{otherQueue, otherQueue}
	}
	return l
}

// firstDelivery observes the delivery latency of d when it is a first delivery whose store
// time is known (a redelivery's would count the time it was out as well).
func (m *metrics) firstDelivery(d *delivery.Delivery) {
	if d.Attempt <= 1 && !d.StoredAt.IsZero() {
		m.deliveryLatency.Observe(max(time.Since(d.StoredAt), 0).Seconds())
	}
}

// firstForwarded observes the delivery latency of a delivery from the
// replica that holds its queue (peerpb.Delivery.stored_at; 0 when it is a
// redelivery or its store time is not known).
func (m *metrics) firstForwarded(storedAt int64) {
	if storedAt != 0 {
		m.deliveryLatency.Observe(max(time.Since(time.Unix(0, storedAt)), 0).Seconds())
	}
}

// closed counts a close the server initiated.
func (m *metrics) closed(code uint16, scope string) {
	m.errors.WithLabelValues(strconv.Itoa(int(code)), scope).Inc()
}

func (st *queueStats) in(bytes int) {
	if st == nil { // a delayed exchange's delay queue (delayed.go)
		return
	}
	st.msgsIn.Inc()
	st.bytesIn.Add(float64(bytes))
}

func (st *queueStats) out(bytes int) {
	st.msgsOut.Inc()
	st.bytesOut.Add(float64(bytes))
}
