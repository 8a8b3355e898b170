package amqp091

import (
	"cmp"
	"context"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kubemq-io/kubemq-proxy/amqp091/wire"
)

// BacklogMaxAge is how old the KubeMQ waiting counts behind QueueStats may be: one QueuesInfo
// call for every queue at most this often, however often metrics, GET /state and the
// management API ask (kubemqclient.QueuesInfoCached).
const BacklogMaxAge = 2 * time.Second

// QueueStats is one queue's figures as this replica holds them: the source of the per-queue
// metrics, GET /state and the management API. Ready comes from KubeMQ and so is the queue's
// whole backlog; the lease figures, consumers and counts are this replica's own (with
// several replicas, the one that owns the queue's lease engine holds its unacked messages).
type QueueStats struct {
	Vhost      string // as clients name it ("/" for the default)
	Name       string
	Channel    string // the KubeMQ queue
	Durable    bool
	Exclusive  bool
	AutoDelete bool
	Arguments  wire.Table
	// Ready: messages waiting in KubeMQ (QueuesInfo's Waiting) plus those this replica's
	// lease engine fetched and has not handed out yet; -1 when unknown (KubeMQ did not
	// answer, or lists the queue ambiguously).
	Ready int64
	// Unacked: deliveries handed out by this replica's lease engine and not yet settled.
	Unacked int
	// OldestUnacked: time since KubeMQ stored the oldest of them (0 when none).
	OldestUnacked time.Duration
	// Consumers: basic.consume consumers on this replica.
	Consumers int
	// Published (copies stored in the queue), Delivered (basic.deliver and basic.get-ok) and
	// Acked (basic.ack) since this replica started.
	Published, Delivered, Acked uint64
}

// QueueStats returns every queue of every virtual host, sorted by vhost and name. The error
// is KubeMQ's when the waiting counts could not be read; the figures are returned anyway,
// with Ready -1.
func (s *Server) QueueStats(ctx context.Context) ([]QueueStats, error) {
	var out []QueueStats
	now := time.Now()
	for _, v := range s.top.snapshot() {
		v.mu.Lock()
		for _, q := range v.queues {
			if q.deleted {
				continue
			}
			out = append(out, QueueStats{Vhost: v.displayName(), Name: q.name, Channel: q.channel, Durable: q.durable,
				Exclusive: q.exclusive, AutoDelete: q.autoDelete, Arguments: q.args, Consumers: len(q.consumers),
				Published: q.nPublished.Load(), Delivered: q.nDelivered.Load(), Acked: q.nAcked.Load()})
		}
		v.mu.Unlock()
	}
	slices.SortFunc(out, func(a, b QueueStats) int {
		return cmp.Or(cmp.Compare(a.Vhost, b.Vhost), cmp.Compare(a.Name, b.Name))
	})
	idx, _, err := s.opts.Client.QueuesInfoCached(ctx, BacklogMaxAge)
	for i := range out {
		st := &out[i]
		st.Ready = -1
		if err == nil {
			st.Ready = idx.Waiting(st.Channel)
		}
		if c := s.deliveries.Lookup(st.Channel); c != nil {
			cs := c.Stats()
			if st.Ready >= 0 {
				st.Ready += int64(cs.Buffered)
			}
			st.Unacked = cs.Out
			if !cs.OldestOut.IsZero() {
				st.OldestUnacked = max(now.Sub(cs.OldestOut), 0)
			}
		}
	}
	return out, err
}

// snapshot returns the virtual hosts known now.
func (t *topology) snapshot() []*vhost {
	t.mu.Lock()
	defer t.mu.Unlock()
	vs := make([]*vhost, 0, len(t.vhosts))
	for _, v := range t.vhosts {
		vs = append(vs, v)
	}
	return vs
}

// Per-queue gauges, collected at scrape time from QueueStats under the same label bound as
// the per-queue counters (Options.MetricsQueueLabels; the rest add up under "_other").
// Names follow RabbitMQ's Prometheus plugin (rabbitmq_queue_messages_ready, ...).
var (
	queueLabels         = []string{"vhost", "queue"}
	queueReadyDesc      = prometheus.NewDesc("kubemq_proxy_amqp_queue_messages_ready", "Messages ready for delivery: waiting in KubeMQ plus fetched by this replica's lease engine and not handed out (RabbitMQ: rabbitmq_queue_messages_ready).", queueLabels, nil)
	queueUnackedDesc    = prometheus.NewDesc("kubemq_proxy_amqp_queue_messages_unacked", "Messages delivered by this replica and not yet settled (RabbitMQ: rabbitmq_queue_messages_unacked).", queueLabels, nil)
	queueConsumersDesc  = prometheus.NewDesc("kubemq_proxy_amqp_queue_consumers", "Consumers of the queue on this replica (RabbitMQ: rabbitmq_queue_consumers).", queueLabels, nil)
	queueOldestDesc     = prometheus.NewDesc("kubemq_proxy_amqp_queue_oldest_unacked_age_seconds", "Time since KubeMQ stored the oldest message delivered by this replica and not yet settled; the largest of the queues sharing \"_other\".", queueLabels, nil)
	queueStatsErrorDesc = prometheus.NewDesc("kubemq_proxy_amqp_queue_stats_errors", "1 when the last collection could not read the waiting counts from KubeMQ (messages_ready is then left out), else 0.", nil, nil)
)

// queueCollector reports QueueStats as the per-queue gauges.
type queueCollector struct{ s *Server }

func (c queueCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{queueReadyDesc, queueUnackedDesc, queueConsumersDesc, queueOldestDesc, queueStatsErrorDesc} {
		ch <- d
	}
}

func (c queueCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	stats, err := c.s.QueueStats(ctx)
	type agg struct {
		ready             int64
		readyKnown        bool
		unacked, consumer int
		oldest            time.Duration
	}
	by := map[queueLabel]*agg{}
	var order []queueLabel
	for _, st := range stats {
		l := c.s.m.label(st.Vhost, st.Name)
		a := by[l]
		if a == nil {
			a = &agg{readyKnown: true}
			by[l] = a
			order = append(order, l)
		}
		if st.Ready < 0 {
			a.readyKnown = false
		}
		a.ready += st.Ready
		a.unacked += st.Unacked
		a.consumer += st.Consumers
		a.oldest = max(a.oldest, st.OldestUnacked)
	}
	for _, l := range order {
		a := by[l]
		if a.readyKnown {
			ch <- prometheus.MustNewConstMetric(queueReadyDesc, prometheus.GaugeValue, float64(a.ready), l.vhost, l.queue)
		}
		ch <- prometheus.MustNewConstMetric(queueUnackedDesc, prometheus.GaugeValue, float64(a.unacked), l.vhost, l.queue)
		ch <- prometheus.MustNewConstMetric(queueConsumersDesc, prometheus.GaugeValue, float64(a.consumer), l.vhost, l.queue)
		ch <- prometheus.MustNewConstMetric(queueOldestDesc, prometheus.GaugeValue, a.oldest.Seconds(), l.vhost, l.queue)
	}
	failed := 0.0
	if err != nil {
		failed = 1
	}
	ch <- prometheus.MustNewConstMetric(queueStatsErrorDesc, prometheus.GaugeValue, failed)
}
