package gcp_test

import (
	"fmt"
	"strings"
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

// histCount is the observation count of histogram name in reg (0 when missing).
func histCount(t *testing.T, reg *prometheus.Registry, name string) uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	return 0
}

// TestSubscriptionBacklogMetrics: after publishing N with the Go client and pulling M
// without acking, each subscription reports its ready and unacked messages, Google's
// num_undelivered_messages, the oldest unacked age and its consumers; subscriptions past the
// label bound add up under "_other"; the latency histograms count; SubscriptionStats and
// GET /state's view carry the same figures.
func TestSubscriptionBacklogMetrics(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	e := startEnv(t, withGCP(func(o *gcp.Options) { o.Metrics = reg }))
	gcp.SetSubscriptionLabelBound(e.srv, 2)
	ctx := ctxT(t, 60*time.Second)
	tid := e.id("t")
	s1, s2, s3, s4 := e.id("s1"), e.id("s2"), e.id("s3"), e.id("s4")
	e.createTopic(ctx, tid)
	for _, s := range []string{s1, s2, s3, s4} {
		e.createSub(ctx, &pubsubpb.Subscription{Name: e.subName(s), Topic: e.topicName(tid)})
	}
	const n, m = 10, 3
	publishN(t, ctx, e.v2(), tid, n, "")
	sc := rawSubscriber(t, e)
	var got []*pubsubpb.ReceivedMessage
	for len(got) < m {
		got = append(got, pull(t, ctx, sc, e.subName(s1), int32(m-len(got)))...)
	}
	time.Sleep(50 * time.Millisecond) // some age for the oldest unacked message
	// A StreamingPull on s2 that takes nothing yet: one consumer.
	stream, err := sc.StreamingPull(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&pubsubpb.StreamingPullRequest{Subscription: e.subName(s2), StreamAckDeadlineSeconds: 60,
		MaxOutstandingMessages: 1}); err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	_ = first // s2 has one message out to the stream now (its flow control allows one)

	const p = "kubemq_proxy_gcp_subscription_"
	deadline := time.Now().Add(20 * time.Second)
	for {
		mt := gather(t, reg)
		var bad []string
		for _, c := range []struct {
			name, label string
			want        float64
		}{
			{p + "messages_ready", "subscription=" + s1, n - m},
			{p + "messages_unacked", "subscription=" + s1, m},
			{p + "num_undelivered_messages", "subscription=" + s1, n},
			{p + "consumers", "subscription=" + s1, 0},
			{p + "messages_ready", "subscription=" + s2, n - 1},
			{p + "messages_unacked", "subscription=" + s2, 1},
			{p + "consumers", "subscription=" + s2, 1},
			// s3 and s4 are past the bound of 2: their figures add up.
			{p + "messages_ready", "subscription=_other", 2 * n},
			{p + "num_undelivered_messages", "subscription=_other", 2 * n},
			{p + "stats_errors", "", 0},
		} {
			if v, ok := mt[c.name][c.label]; !ok || v != c.want {
				bad = append(bad, fmt.Sprintf("%s{%s} = %v (present %v), want %v", c.name, c.label, v, ok, c.want))
			}
		}
		if _, ok := mt[p+"messages_ready"]["subscription="+s3]; ok {
			bad = append(bad, "s3 has a series of its own past the label bound")
		}
		if age := mt[p+"oldest_unacked_message_age_seconds"]["subscription="+s1]; age <= 0 || age > 60 {
			bad = append(bad, fmt.Sprintf("oldest unacked age of s1 = %v", age))
		}
		if len(bad) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal(strings.Join(bad, "\n"))
		}
		time.Sleep(200 * time.Millisecond)
	}
	if c := histCount(t, reg, "kubemq_proxy_gcp_publish_latency_seconds"); c < 1 {
		t.Errorf("publish latency observations = %d", c)
	}
	if c := histCount(t, reg, "kubemq_proxy_gcp_delivery_latency_seconds"); c < m+1 {
		t.Errorf("delivery latency observations = %d, want >= %d", c, m+1)
	}
	before := histCount(t, reg, "kubemq_proxy_gcp_delivery_latency_seconds")
	// A nack and redelivery is not observed again.
	if _, err := sc.ModifyAckDeadline(ctx, &pubsubpb.ModifyAckDeadlineRequest{Subscription: e.subName(s1), AckIds: []string{got[0].AckId}}); err != nil {
		t.Fatal(err)
	}
	var again []*pubsubpb.ReceivedMessage
	for len(again) == 0 {
		for _, rm := range pull(t, ctx, sc, e.subName(s1), 1) {
			if rm.GetMessage().GetMessageId() == got[0].GetMessage().GetMessageId() {
				again = append(again, rm)
			} else {
				before++ // a first delivery of another message
			}
		}
	}
	if c := histCount(t, reg, "kubemq_proxy_gcp_delivery_latency_seconds"); c != before {
		t.Errorf("delivery latency observations = %d after a redelivery, want %d", c, before)
	}

	stats, err := e.srv.SubscriptionStats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	found := 0
	for _, st := range stats {
		if st.ID == s2 {
			found++
			if st.Ready != n-1 || st.Unacked != 1 || st.Consumers != 1 || st.Topic != tid {
				t.Errorf("SubscriptionStats s2: %+v", st)
			}
		}
	}
	state := e.srv.State().(gcp.State)
	for _, ss := range state.Subscriptions {
		if ss.ID == s2 {
			found++
			if ss.MessagesReady == nil || *ss.MessagesReady != n-1 || ss.MessagesUnacked != 1 || ss.Consumers != 1 {
				t.Errorf("/state s2: %+v", ss)
			}
		}
	}
	if found != 2 {
		t.Errorf("s2 found %d times in SubscriptionStats and /state, want once in each", found)
	}
}
