package gcp

import (
	"cmp"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
)

// Metric names all start with this.
const metricPrefix = "kubemq_proxy_gcp_"

// maxLabelValues bounds the distinct topic and subscription label values:
// ids are created by clients, so the first ones seen keep their own series
// and the rest share otherLabel.
const (
	maxLabelValues = 200
	otherLabel     = "_other"
)

// metrics is the front-end's Prometheus instrumentation. Label values are
// resolved once per RPC (topics) or per runtime (subscriptions); the hot
// path only adds to resolved counters.
type metrics struct {
	published, publishedBytes *prometheus.CounterVec // topic
	delivered, deliveredBytes *prometheus.CounterVec // subscription
	acked, nacked, expired    *prometheus.CounterVec // subscription
	deadLettered, dlFailed    *prometheus.CounterVec // subscription
	rpcs                      *prometheus.CounterVec // method, code
	forwarded                 prometheus.Counter     // calls forwarded to the replica that consumes
	streams                   prometheus.Gauge
	// publishLatency: a Publish call received to its messages stored in KubeMQ (topic log and
	// every subscription); deliveryLatency: publish (KubeMQ store) time to a first hand-out.
	publishLatency, deliveryLatency prometheus.Histogram
	openStreams                     atomic.Int64 // the streams gauge's value, for State

	topics, subs labelSet
}

func newMetrics() *metrics {
	cv := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricPrefix + name, Help: help}, labels)
	}
	return &metrics{
		published:      cv("published_messages_total", "Messages accepted by Publish (stored in the topic log and every subscription).", "topic"),
		publishedBytes: cv("published_bytes_total", "Data and attribute bytes of published messages.", "topic"),
		delivered:      cv("delivered_messages_total", "Messages handed to clients (Pull and StreamingPull), redeliveries included.", "subscription"),
		deliveredBytes: cv("delivered_bytes_total", "Data and attribute bytes of delivered messages.", "subscription"),
		acked:          cv("acked_messages_total", "Deliveries acknowledged.", "subscription"),
		nacked:         cv("nacked_messages_total", "Deliveries nacked (modify ack deadline 0).", "subscription"),
		expired:        cv("expired_messages_total", "Deliveries whose ack deadline passed.", "subscription"),
		deadLettered:   cv("dead_lettered_messages_total", "Messages forwarded to the subscription's dead-letter topic (and so acked here).", "subscription"),
		dlFailed:       cv("dead_letter_failures_total", "Failed forwardings to the dead-letter topic (the message is delivered again, or on an ordered subscription forwarded again later).", "subscription"),
		rpcs:           cv("rpcs_total", "Finished RPCs by method and gRPC status code.", "method", "code"),
		forwarded: prometheus.NewCounter(prometheus.CounterOpts{Name: metricPrefix + "forwarded_calls_total",
			Help: "Subscriber calls forwarded to the replica that consumes the subscription."}),
		streams: prometheus.NewGauge(prometheus.GaugeOpts{Name: metricPrefix + "streaming_pulls",
			Help: "Open StreamingPull streams."}),
		publishLatency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: metricPrefix + "publish_latency_seconds",
			Help:    "Time from a Publish call received to its messages stored in KubeMQ (successful calls).",
			Buckets: prometheus.ExponentialBuckets(100e-6, 2, 18)}),
		deliveryLatency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: metricPrefix + "delivery_latency_seconds",
			Help:    "Time from a message's publish (stored in KubeMQ) to its first hand-out to a client (Pull, StreamingPull, push) by this replica.",
			Buckets: prometheus.ExponentialBuckets(1e-3, 2, 22)}),
		topics: labelSet{seen: map[string]struct{}{}},
		subs:   labelSet{seen: map[string]struct{}{}},
	}
}

// register adds the metrics and a collector of the lease gauges to reg.
func (m *metrics) register(reg prometheus.Registerer, s *Server) error {
	for _, c := range []prometheus.Collector{m.forwarded, m.published, m.publishedBytes, m.delivered, m.deliveredBytes,
		m.acked, m.nacked, m.expired, m.deadLettered, m.dlFailed, m.rpcs, m.streams, leaseCollector{s}, subCollector{s},
		m.publishLatency, m.deliveryLatency} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	if b := s.pubBudget; b != nil {
		return m.registerBudget(reg, b)
	}
	return nil
}

// registerBudget adds the publish admission gauges (admission.go).
func (m *metrics) registerBudget(reg prometheus.Registerer, b *publishBudget) error {
	for _, c := range []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: metricPrefix + "publish_pending_bytes",
			Help: "Encoded bytes of the Publish requests read and in progress (bounded by gcp.max_pending_publish_bytes)."},
			func() float64 { u, _ := b.state(); return float64(u) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: metricPrefix + "publish_calls_waiting",
			Help: "Publish calls waiting, unread, for room under gcp.max_pending_publish_bytes."},
			func() float64 { _, w := b.state(); return float64(w) }),
	} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

func (m *metrics) topic(id string) string { return m.topics.label(id) }
func (m *metrics) sub(id string) string   { return m.subs.label(id) }

// rpc counts a finished RPC; method is the gRPC full method name.
func (m *metrics) rpc(fullMethod string, c codes.Code) {
	if i := strings.LastIndexByte(fullMethod, '/'); i >= 0 {
		fullMethod = fullMethod[i+1:]
	}
	m.rpcs.WithLabelValues(fullMethod, c.String()).Inc()
}

// labelSet hands out at most maxLabelValues distinct label values.
type labelSet struct {
	mu   sync.Mutex
	seen map[string]struct{}
	max  int // 0: maxLabelValues (tests lower it)
}

func (l *labelSet) label(id string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.seen[id]; ok {
		return id
	}
	if n := cmp.Or(l.max, maxLabelValues); len(l.seen) >= n {
		return otherLabel
	}
	l.seen[id] = struct{}{}
	return id
}

// leaseCollector reports the leases held by this replica's subscription
// runtimes at scrape time, in total (one gauge, no per-subscription series).
type leaseCollector struct{ s *Server }

var (
	leasesDesc = prometheus.NewDesc(metricPrefix+"leases",
		"Messages leased to Pub/Sub clients (out, waiting behind an ordering key, or in an ordered backoff).", nil, nil)
	runtimesDesc = prometheus.NewDesc(metricPrefix+"active_subscriptions",
		"Subscriptions with a delivery runtime on this replica.", nil, nil)
)

func (c leaseCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- leasesDesc
	ch <- runtimesDesc
}

func (c leaseCollector) Collect(ch chan<- prometheus.Metric) {
	c.s.rtMu.Lock()
	rs := make([]*subRuntime, 0, len(c.s.runtimes))
	for _, r := range c.s.runtimes {
		rs = append(rs, r)
	}
	c.s.rtMu.Unlock()
	n := 0
	for _, r := range rs {
		r.mu.Lock()
		n += len(r.leases)
		r.mu.Unlock()
	}
	ch <- prometheus.MustNewConstMetric(leasesDesc, prometheus.GaugeValue, float64(n))
	ch <- prometheus.MustNewConstMetric(runtimesDesc, prometheus.GaugeValue, float64(len(rs)))
}
