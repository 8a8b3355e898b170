package gcp_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/kubemq-io/kubemq-proxy/gcp"
)

// TestStreamingPullClientCancelIsCanceled: a client that cancels its
// StreamingPull is counted (and logged) with code Canceled, not Unknown.
func TestStreamingPullClientCancelIsCanceled(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	e := startEnv(t, withGCP(func(o *gcp.Options) { o.Metrics = reg }))
	ctx := ctxT(t, 30*time.Second)
	tid, sid := e.id("t"), e.id("s")
	e.createTopic(ctx, tid)
	e.createSub(ctx, &pubsubpb.Subscription{Name: e.subName(sid), Topic: e.topicName(tid)})
	publishN(t, ctx, e.v2(), tid, 1, "")

	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := rawSubscriber(t, e).StreamingPull(sctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&pubsubpb.StreamingPullRequest{Subscription: e.subName(sid), StreamAckDeadlineSeconds: 60}); err != nil {
		t.Fatal(err)
	}
	// A delivered message means the handler is past its set-up and in its
	// main wait, where the cancel used to come out as Unknown.
	resp, err := stream.Recv()
	if err != nil || len(resp.GetReceivedMessages()) != 1 {
		t.Fatalf("first response: %v %v", resp, err)
	}
	cancel()

	const name = "kubemq_proxy_gcp_rpcs_total"
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		var seen map[string]float64
		for label, v := range gather(t, reg)[name] {
			if v > 0 && strings.HasSuffix(label, "method=StreamingPull") {
				if seen == nil {
					seen = map[string]float64{}
				}
				seen[label] = v
			}
		}
		if seen != nil {
			if got := seen["code=Canceled,method=StreamingPull"]; got != 1 || len(seen) != 1 {
				t.Fatalf("%s for StreamingPull = %v, want only code=Canceled once", name, seen)
			}
			return
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatalf("no %s for StreamingPull after the client cancelled", name)
		}
	}
}
