package delivery

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metric names all start with this.
const metricPrefix = "kubemq_proxy_delivery_"

// add sums counters (gauges are summed too; for totals over several Consumers).
func (s *Stats) add(o Stats) {
	s.Leases += o.Leases
	s.Out += o.Out
	s.Buffered += o.Buffered
	s.Waiters += o.Waiters
	s.Gets += o.Gets
	s.Received += o.Received
	s.DuplicateSeqs += o.DuplicateSeqs
	s.Retaken += o.Retaken
	s.Delivered += o.Delivered
	s.Acked += o.Acked
	s.Redelivered += o.Redelivered
	s.DroppedByHook += o.DroppedByHook
	s.RecordsStored += o.RecordsStored
	s.EntriesStored += o.EntriesStored
	s.RecordsReturned += o.RecordsReturned
	s.EntriesRearmed += o.EntriesRearmed
	s.EntriesObsolete += o.EntriesObsolete
	s.EntriesBounced += o.EntriesBounced
	s.EntriesRecovered += o.EntriesRecovered
	s.RecordsCorrupt += o.RecordsCorrupt
	s.StoreFailures += o.StoreFailures
	s.LeasesLost += o.LeasesLost
	s.Resets += o.Resets
	s.TransientRefusals += o.TransientRefusals
	s.RecordTimeouts += o.RecordTimeouts
	s.Requeued += o.Requeued
	s.Purged += o.Purged
	s.SentinelsStored += o.SentinelsStored
	s.SentinelsReturned += o.SentinelsReturned
	s.SentinelsBounced += o.SentinelsBounced
	s.SentinelsDropped += o.SentinelsDropped
}

// Totals returns the sum over every Consumer the Manager has run: counters include closed
// Consumers (so they never go down), gauges cover the open ones.
func (m *Manager) Totals() (s Stats, consumers int) {
	m.mu.Lock()
	s = m.closedTotals
	cs := make([]*Consumer, 0, len(m.queues))
	for _, e := range m.queues {
		cs = append(cs, e.c)
	}
	m.mu.Unlock()
	for _, c := range cs {
		s.add(c.Stats())
	}
	return s, len(cs)
}

// collector exports a Manager's Totals at scrape time, and a few series per queue under a
// bounded queue label (Options.MetricsQueueLabels: ordering keys and server-named queues can
// make queues unbounded).
type collector struct{ m *Manager }

type metricDesc struct {
	d     *prometheus.Desc
	typ   prometheus.ValueType
	value func(s *Stats, consumers int) float64
}

var metricDescs = func() []metricDesc {
	g := func(name, help string, f func(*Stats, int) float64) metricDesc {
		return metricDesc{prometheus.NewDesc(metricPrefix+name, help, nil, nil), prometheus.GaugeValue, f}
	}
	c := func(name, help string, f func(*Stats) uint64) metricDesc {
		return metricDesc{prometheus.NewDesc(metricPrefix+name+"_total", help, nil, nil), prometheus.CounterValue,
			func(s *Stats, _ int) float64 { return float64(f(s)) }}
	}
	e := func(outcome string, f func(*Stats) uint64) metricDesc {
		return metricDesc{prometheus.NewDesc(metricPrefix+"record_entries_returned_total",
			"Lease-record entries received back, by what was done with them.", nil,
			prometheus.Labels{"outcome": outcome}), prometheus.CounterValue,
			func(s *Stats, _ int) float64 { return float64(f(s)) }}
	}
	return []metricDesc{
		g("consumers", "Open queue consumers.", func(_ *Stats, n int) float64 { return float64(n) }),
		g("leases", "Live leases (buffered, out, delayed, being requeued).", func(s *Stats, _ int) float64 { return float64(s.Leases) }),
		g("leases_out", "Deliveries handed out and not settled.", func(s *Stats, _ int) float64 { return float64(s.Out) }),
		g("leases_buffered", "Recorded messages waiting for a Fetch.", func(s *Stats, _ int) float64 { return float64(s.Buffered) }),
		g("fetch_waiters", "Fetch calls waiting.", func(s *Stats, _ int) float64 { return float64(s.Waiters) }),
		c("gets", "Downstream Gets.", func(s *Stats) uint64 { return s.Gets }),
		c("received", "Data messages received.", func(s *Stats) uint64 { return s.Received }),
		c("duplicate_sequences", "Repeated sequences dropped from Get responses.", func(s *Stats) uint64 { return s.DuplicateSeqs }),
		c("retaken", "Copies of messages already taken and acknowledged, received again and dropped.", func(s *Stats) uint64 { return s.Retaken }),
		c("delivered", "Deliveries handed out.", func(s *Stats) uint64 { return s.Delivered }),
		c("acked", "Deliveries acked.", func(s *Stats) uint64 { return s.Acked }),
		c("redelivered", "Redelivery copies enqueued (nack, expiry, release, recovery).", func(s *Stats) uint64 { return s.Redelivered }),
		c("dropped_by_hook", "Redeliveries the front-end dropped (dead-lettered).", func(s *Stats) uint64 { return s.DroppedByHook }),
		c("records_stored", "Lease records stored.", func(s *Stats) uint64 { return s.RecordsStored }),
		c("record_entries_stored", "Entries in stored lease records.", func(s *Stats) uint64 { return s.EntriesStored }),
		c("records_returned", "Lease records received back.", func(s *Stats) uint64 { return s.RecordsReturned }),
		e("rearmed", func(s *Stats) uint64 { return s.EntriesRearmed }),
		e("obsolete", func(s *Stats) uint64 { return s.EntriesObsolete }),
		e("bounced", func(s *Stats) uint64 { return s.EntriesBounced }),
		e("recovered", func(s *Stats) uint64 { return s.EntriesRecovered }),
		c("records_corrupt", "Lease records that could not be decoded.", func(s *Stats) uint64 { return s.RecordsCorrupt }),
		c("store_failures", "Get batches given back because their record could not be stored.", func(s *Stats) uint64 { return s.StoreFailures }),
		c("leases_lost", "Leases dropped because the backend failed.", func(s *Stats) uint64 { return s.LeasesLost }),
		c("resets", "Lease-table drops after backend failures.", func(s *Stats) uint64 { return s.Resets }),
		c("transient_refusals", "Gets the backend refused for now on a stream that went on (retried).",
			func(s *Stats) uint64 { return s.TransientRefusals }),
		c("record_timeouts", "Lease record stores the backend left unanswered within one attempt (sent again).",
			func(s *Stats) uint64 { return s.RecordTimeouts }),
		c("requeued", "Deliveries given back in place (Requeue).", func(s *Stats) uint64 { return s.Requeued }),
		c("purged", "Buffered leases dropped by Purge.", func(s *Stats) uint64 { return s.Purged }),
		c("sentinels_stored", "Sentinel records stored (ordered recovery), including other consumers' ones stored again.",
			func(s *Stats) uint64 { return s.SentinelsStored }),
		c("sentinels_returned", "Own sentinel records received back.", func(s *Stats) uint64 { return s.SentinelsReturned }),
		c("sentinels_bounced", "Sentinel records of other consumers stored again.", func(s *Stats) uint64 { return s.SentinelsBounced }),
		c("sentinels_dropped", "Expired sentinel records of other consumers dropped.", func(s *Stats) uint64 { return s.SentinelsDropped }),
	}
}()

// otherQueue is the queue label shared by the queues past Options.MetricsQueueLabels.
const otherQueue = "_other"

// queueDescs are the per-queue series: the open Consumer of each queue (a counter starts
// again from 0 when its queue's Consumer is replaced, as Prometheus counters may).
var queueDescs = func() []metricDesc {
	g := func(name, help string, f func(*Stats) uint64) metricDesc {
		return metricDesc{prometheus.NewDesc(metricPrefix+"queue_"+name, help, []string{"queue"}, nil), prometheus.GaugeValue,
			func(s *Stats, _ int) float64 { return float64(f(s)) }}
	}
	c := func(name, help string, f func(*Stats) uint64) metricDesc {
		return metricDesc{prometheus.NewDesc(metricPrefix+"queue_"+name+"_total", help, []string{"queue"}, nil), prometheus.CounterValue,
			func(s *Stats, _ int) float64 { return float64(f(s)) }}
	}
	return []metricDesc{
		g("leases_out", "Deliveries handed out and not settled, by KubeMQ queue.", func(s *Stats) uint64 { return uint64(s.Out) }),
		g("leases_buffered", "Recorded messages waiting for a Fetch, by KubeMQ queue.", func(s *Stats) uint64 { return uint64(s.Buffered) }),
		c("delivered", "Deliveries handed out, by KubeMQ queue (open Consumer).", func(s *Stats) uint64 { return s.Delivered }),
		c("acked", "Deliveries acked, by KubeMQ queue (open Consumer).", func(s *Stats) uint64 { return s.Acked }),
		c("redelivered", "Redelivery copies enqueued, by KubeMQ queue (open Consumer).", func(s *Stats) uint64 { return s.Redelivered }),
		c("store_failures", "Get batches given back because their record could not be stored, by KubeMQ queue (open Consumer).",
			func(s *Stats) uint64 { return s.StoreFailures }),
	}
}()

// queueLabelLocked returns queue's label in the per-queue series. Under m.mu.
func (m *Manager) queueLabelLocked(queue string) string {
	if m.labelled[queue] {
		return queue
	}
	if len(m.labelled) >= m.opts.MetricsQueueLabels {
		return otherQueue
	}
	if m.labelled == nil {
		m.labelled = map[string]bool{}
	}
	m.labelled[queue] = true
	return queue
}

// byQueue returns the open Consumers' Stats by queue label.
func (m *Manager) byQueue() map[string]*Stats {
	m.mu.Lock()
	type one struct {
		label string
		c     *Consumer
	}
	cs := make([]one, 0, len(m.queues))
	for q, e := range m.queues {
		if e.c != nil {
			cs = append(cs, one{m.queueLabelLocked(q), e.c})
		}
	}
	m.mu.Unlock()
	out := map[string]*Stats{}
	for _, o := range cs {
		s := out[o.label]
		if s == nil {
			s = &Stats{}
			out[o.label] = s
		}
		s.add(o.c.Stats())
	}
	return out
}

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range metricDescs {
		ch <- d.d
	}
	for _, d := range queueDescs {
		ch <- d.d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	s, n := c.m.Totals()
	for _, d := range metricDescs {
		ch <- prometheus.MustNewConstMetric(d.d, d.typ, d.value(&s, n))
	}
	for label, qs := range c.m.byQueue() {
		for _, d := range queueDescs {
			ch <- prometheus.MustNewConstMetric(d.d, d.typ, d.value(qs, 0), label)
		}
	}
}
