package gcp_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/kubemq-io/kubemq-proxy/gcp"
)

// TestMetrics: published, delivered and acked counts per topic and
// subscription, RPCs by code, and the lease gauge.
func TestMetrics(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	e := startEnv(t, withGCP(func(o *gcp.Options) { o.Metrics = reg }))
	ctx := ctxT(t, 30*time.Second)
	tid, sid := e.id("t"), e.id("s")
	e.createTopic(ctx, tid)
	e.createSub(ctx, &pubsubpb.Subscription{Name: e.subName(sid), Topic: e.topicName(tid)})
	publishN(t, ctx, e.v2(), tid, 3, "")
	sc := rawSubscriber(t, e)
	var got []*pubsubpb.ReceivedMessage
	for len(got) < 3 {
		got = append(got, pull(t, ctx, sc, e.subName(sid), 3)...)
	}
	if v := gather(t, reg)["kubemq_proxy_gcp_leases"]; v[""] != 3 {
		t.Errorf("leases gauge %v, want 3", v)
	}
	if _, err := sc.Acknowledge(ctx, &pubsubpb.AcknowledgeRequest{Subscription: e.subName(sid), AckIds: []string{got[0].AckId, got[1].AckId}}); err != nil {
		t.Fatal(err)
	}
	if _, err := sc.ModifyAckDeadline(ctx, &pubsubpb.ModifyAckDeadlineRequest{Subscription: e.subName(sid), AckIds: []string{got[2].AckId}}); err != nil {
		t.Fatal(err)
	}
	rawPublisher(t, e).GetTopic(ctx, &pubsubpb.GetTopicRequest{Topic: e.topicName(e.id("missing"))})

	m := gather(t, reg)
	for _, c := range []struct {
		name, label string
		want        float64
	}{
		{"kubemq_proxy_gcp_published_messages_total", "topic=" + tid, 3},
		{"kubemq_proxy_gcp_published_bytes_total", "topic=" + tid, 3*2 + 3*2}, // "m0" and attribute i=0
		{"kubemq_proxy_gcp_delivered_messages_total", "subscription=" + sid, 3},
		{"kubemq_proxy_gcp_acked_messages_total", "subscription=" + sid, 2},
		{"kubemq_proxy_gcp_nacked_messages_total", "subscription=" + sid, 1},
		{"kubemq_proxy_gcp_rpcs_total", "code=NotFound,method=GetTopic", 1},
		{"kubemq_proxy_gcp_rpcs_total", "code=OK,method=Acknowledge", 1},
		{"kubemq_proxy_gcp_leases", "", 0},
	} {
		if got := m[c.name][c.label]; got != c.want {
			t.Errorf("%s{%s} = %v, want %v (all: %v)", c.name, c.label, got, c.want, m[c.name])
		}
	}
}

// gather returns metric name -> "k=v,k=v" labels -> value.
func gather(t *testing.T, reg *prometheus.Registry) map[string]map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]float64{}
	for _, mf := range mfs {
		vals := map[string]float64{}
		for _, mt := range mf.GetMetric() {
			key := ""
			for i, lp := range mt.GetLabel() {
				if i > 0 {
					key += ","
				}
				key += lp.GetName() + "=" + lp.GetValue()
			}
			switch {
			case mt.GetCounter() != nil:
				vals[key] = mt.GetCounter().GetValue()
			case mt.GetGauge() != nil:
				vals[key] = mt.GetGauge().GetValue()
			}
		}
		out[mf.GetName()] = vals
	}
	return out
}
