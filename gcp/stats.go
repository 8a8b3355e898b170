package gcp

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kubemq-io/kubemq-proxy/gcp/names"
	"github.com/kubemq-io/kubemq-proxy/kubemqclient"
)

// BacklogMaxAge is how old the KubeMQ waiting counts behind SubscriptionStats may be: one
// QueuesInfo call for every queue at most this often (kubemqclient.QueuesInfoCached).
const BacklogMaxAge = 2 * time.Second

// errNoBacklog: the server was built without a KubeMQ client to count backlogs with (tests).
var errNoBacklog = errors.New("gcp: no backlog source")

// SubscriptionStats is one subscription's figures as this replica holds them: the source of
// the per-subscription metrics, GET /state and a console. Ready comes from KubeMQ and so is
// the whole backlog; the lease figures and consumers are this replica's own (with several
// replicas, the one that owns the subscription's lease engine holds its unacked messages).
type SubscriptionStats struct {
	ID    string
	Topic string // names.DeletedTopic once its topic is gone
	Queue string // the KubeMQ queue holding its backlog
	// Ready: messages waiting in KubeMQ plus those this replica's lease engine fetched and
	// has not handed out; -1 when unknown. Google's num_undelivered_messages is Ready+Unacked.
	Ready int64
	// Unacked: messages handed out by this replica's lease engine (to clients, or held back
	// behind an ordering key) and not yet settled.
	Unacked int
	// OldestUnacked: time since the oldest of them was published (stored in KubeMQ); 0 when none.
	OldestUnacked time.Duration
	// Consumers: Pull calls and StreamingPull streams using the subscription on this replica now.
	Consumers int
}

// SubscriptionStats returns every subscription, sorted by id. The error is KubeMQ's when the
// waiting counts could not be read; the figures are returned anyway, with Ready -1.
func (s *Server) SubscriptionStats(ctx context.Context) ([]SubscriptionStats, error) {
	ids := s.cat.subIDs()
	slices.Sort(ids)
	var idx *kubemqclient.QueuesIndex
	err := errNoBacklog
	if s.backlog != nil {
		idx, err = s.backlog(ctx)
	}
	now := time.Now()
	out := make([]SubscriptionStats, 0, len(ids))
	for _, id := range ids {
		e, ok := s.cat.sub(id)
		if !ok {
			continue
		}
		st := SubscriptionStats{ID: id, Topic: e.topicID, Queue: e.queue, Ready: -1}
		if !s.cat.attached(e) {
			st.Topic = names.DeletedTopic
		}
		if err == nil {
			st.Ready = idx.Waiting(e.queue)
		}
		if c := s.deliveries.Lookup(e.queue); c != nil {
			cs := c.Stats()
			if st.Ready >= 0 {
				st.Ready += int64(cs.Buffered)
			}
			st.Unacked = cs.Out
			if !cs.OldestOut.IsZero() {
				st.OldestUnacked = max(now.Sub(cs.OldestOut), 0)
			}
		}
		s.rtMu.Lock()
		if r := s.runtimes[e.id]; r != nil && r.uid == e.uid {
			st.Consumers = r.users
		}
		s.rtMu.Unlock()
		out = append(out, st)
	}
	return out, err
}

// Per-subscription gauges, collected at scrape time from SubscriptionStats under the
// subscription label bound (maxLabelValues; the rest add up under "_other"). Google Cloud
// Monitoring's names for the same figures are in docs/METRICS.md.
var (
	subLabels        = []string{"subscription"}
	subReadyDesc     = prometheus.NewDesc(metricPrefix+"subscription_messages_ready", "Messages not yet delivered: waiting in KubeMQ plus fetched by this replica's lease engine and not handed out.", subLabels, nil)
	subUnackedDesc   = prometheus.NewDesc(metricPrefix+"subscription_messages_unacked", "Messages handed out by this replica and not yet acknowledged.", subLabels, nil)
	subBacklogDesc   = prometheus.NewDesc(metricPrefix+"subscription_num_undelivered_messages", "Unacknowledged messages: ready plus unacked (Cloud Monitoring: subscription/num_undelivered_messages).", subLabels, nil)
	subOldestDesc    = prometheus.NewDesc(metricPrefix+"subscription_oldest_unacked_message_age_seconds", "Time since the oldest message handed out by this replica and not yet acknowledged was published; the largest of the subscriptions sharing \"_other\" (Cloud Monitoring: subscription/oldest_unacked_message_age, which also counts undelivered messages).", subLabels, nil)
	subConsumersDesc = prometheus.NewDesc(metricPrefix+"subscription_consumers", "Pull calls and StreamingPull streams using the subscription on this replica.", subLabels, nil)
	subErrorDesc     = prometheus.NewDesc(metricPrefix+"subscription_stats_errors", "1 when the last collection could not read the waiting counts from KubeMQ (ready and undelivered are then left out), else 0.", nil, nil)
)

// subCollector reports SubscriptionStats as the per-subscription gauges.
type subCollector struct{ s *Server }

func (c subCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{subReadyDesc, subUnackedDesc, subBacklogDesc, subOldestDesc, subConsumersDesc, subErrorDesc} {
		ch <- d
	}
}

func (c subCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	stats, err := c.s.SubscriptionStats(ctx)
	type agg struct {
		ready              int64
		readyKnown         bool
		unacked, consumers int
		oldest             time.Duration
	}
	by := map[string]*agg{}
	var order []string
	for _, st := range stats {
		l := c.s.m.sub(st.ID)
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
		a.consumers += st.Consumers
		a.oldest = max(a.oldest, st.OldestUnacked)
	}
	for _, l := range order {
		a := by[l]
		if a.readyKnown {
			ch <- prometheus.MustNewConstMetric(subReadyDesc, prometheus.GaugeValue, float64(a.ready), l)
			ch <- prometheus.MustNewConstMetric(subBacklogDesc, prometheus.GaugeValue, float64(a.ready+int64(a.unacked)), l)
		}
		ch <- prometheus.MustNewConstMetric(subUnackedDesc, prometheus.GaugeValue, float64(a.unacked), l)
		ch <- prometheus.MustNewConstMetric(subOldestDesc, prometheus.GaugeValue, a.oldest.Seconds(), l)
		ch <- prometheus.MustNewConstMetric(subConsumersDesc, prometheus.GaugeValue, float64(a.consumers), l)
	}
	failed := 0.0
	if err != nil {
		failed = 1
	}
	ch <- prometheus.MustNewConstMetric(subErrorDesc, prometheus.GaugeValue, failed)
}
