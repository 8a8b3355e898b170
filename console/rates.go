package console

import (
	"encoding/json"
	"net/http"
	"strings"
	"time"
)

// rateCounter is one message counter of the proxy's own metrics the overview shows as a rate
// (the page's script polls /console/api/rates and divides the change by the time between).
type rateCounter struct {
	Key, Label, Family string
}

var rateCounters = []rateCounter{
	{"pubsub_published", "Pub/Sub published", "kubemq_proxy_gcp_published_messages_total"},
	{"pubsub_delivered", "Pub/Sub delivered", "kubemq_proxy_gcp_delivered_messages_total"},
	{"pubsub_acked", "Pub/Sub acked", "kubemq_proxy_gcp_acked_messages_total"},
	{"amqp_published", "AMQP published", "kubemq_proxy_amqp_published_total"},
	{"amqp_delivered", "AMQP delivered", "kubemq_proxy_amqp_delivered_total"},
	{"amqp_acked", "AMQP acked", "kubemq_proxy_amqp_acked_total"},
}

// rateRow is one counter's total now.
type rateRow struct {
	Key, Label string
	Total      float64
}

// counters sums each family of rateCounters over its label values, for the front-ends that
// run (a labelled family has no series until its first count: 0 then).
func (c *Console) counters() map[string]float64 {
	out := map[string]float64{}
	ps, aq := c.frontends()
	for _, rc := range rateCounters {
		if strings.HasPrefix(rc.Key, "pubsub_") && ps != nil || strings.HasPrefix(rc.Key, "amqp_") && aq != nil {
			out[rc.Key] = 0
		}
	}
	if c.o.Metrics == nil {
		return out
	}
	fams, _ := c.o.Metrics.Gather() // a partial result still has what it could gather
	byName := map[string]float64{}
	for _, f := range fams {
		var sum float64
		for _, m := range f.GetMetric() {
			if ct := m.GetCounter(); ct != nil {
				sum += ct.GetValue()
			}
		}
		byName[f.GetName()] = sum
	}
	for _, rc := range rateCounters {
		if _, ok := out[rc.Key]; ok {
			out[rc.Key] = byName[rc.Family]
		}
	}
	return out
}

func (c *Console) rateRows() []rateRow {
	cs := c.counters()
	var rows []rateRow
	for _, rc := range rateCounters {
		if v, ok := cs[rc.Key]; ok {
			rows = append(rows, rateRow{Key: rc.Key, Label: rc.Label, Total: v})
		}
	}
	return rows
}

// serveRates is GET /console/api/rates: the counters' totals and the time they were read.
func (c *Console) serveRates(w http.ResponseWriter, r *http.Request) {
	out := struct {
		TimeMillis int64              `json:"time_ms"`
		Counters   map[string]float64 `json:"counters"`
	}{time.Now().UnixMilli(), c.counters()}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	json.NewEncoder(w).Encode(out)
}
