package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/kubemq-io/kubemq-proxy/internal/kubemqtest"
	"github.com/kubemq-io/kubemq-proxy/kubemqclient"
	"github.com/kubemq-io/kubemq-proxy/proxy"
)

// histograms returns "op,result" -> (sample count, sample sum) of the
// backend call histogram.
func histograms(t *testing.T, reg *prometheus.Registry) map[string][2]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][2]float64{}
	for _, mf := range mfs {
		if mf.GetName() != proxy.BackendCallMetric {
			continue
		}
		for _, m := range mf.GetMetric() {
			var op, result string
			for _, lp := range m.GetLabel() {
				switch lp.GetName() {
				case "op":
					op = lp.GetValue()
				case "result":
					result = lp.GetValue()
				}
			}
			h := m.GetHistogram()
			if b := h.GetBucket(); len(b) == 0 || b[0].GetUpperBound() > 50e-6 || b[len(b)-1].GetUpperBound() < 10 {
				t.Errorf("buckets %v do not span 50us..10s", b)
			}
			out[op+","+result] = [2]float64{float64(h.GetSampleCount()), h.GetSampleSum()}
		}
	}
	return out
}

// TestBackendObserverLabels: results are "ok" or a bounded error class,
// unknown ops share "other", and registering twice reuses the histogram.
func TestBackendObserverLabels(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	obs := proxy.BackendObserver(reg)
	if again := proxy.BackendObserver(reg); again == nil {
		t.Fatal("second BackendObserver on the same registry returned nil")
	} else {
		again(kubemqclient.OpPing, time.Millisecond, nil)
	}
	if proxy.BackendObserver(nil) != nil {
		t.Fatal("nil registry must turn observation off")
	}

	// Real *Error values from the client, without a server.
	c, err := kubemqclient.Dial(context.Background(), kubemqclient.Options{Address: "127.0.0.1:1", Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, canceled := c.QueuesInfo(cctx)
	c.Close()
	_, closed := c.QueuesInfo(context.Background())

	for _, tc := range []struct {
		op     string
		err    error
		labels string
	}{
		{kubemqclient.OpSendQueue, nil, "send_queue,ok"},
		{kubemqclient.OpSendQueue, nil, "send_queue,ok"},
		{kubemqclient.OpQueuesInfo, canceled, "queues_info,canceled"},
		{kubemqclient.OpQueuesInfo, closed, "queues_info,closed"},
		{kubemqclient.OpDownstreamGet, kubemqclient.ValidChannel("bad name"), "downstream_get,invalid_channel"},
		{kubemqclient.OpVisibilityReceive, fmt.Errorf("w: %w", kubemqclient.ErrWaitExpired), "visibility_receive,wait_expired"},
		{kubemqclient.OpDownstreamSync, errors.Join(errors.New("x"), fmt.Errorf("w: %w", kubemqclient.ErrTxNotFound)), "downstream_sync,tx_not_found"},
		{kubemqclient.OpPublishEvents, errors.New("not from the client"), "publish_events,other"},
		{"made_up_op", nil, "other,ok"},
	} {
		obs(tc.op, 2*time.Millisecond, tc.err)
	}
	if !errors.Is(canceled, kubemqclient.ErrCanceled) || !errors.Is(closed, kubemqclient.ErrClosed) {
		t.Fatalf("test errors are not what they should be: %v, %v", canceled, closed)
	}
	got := histograms(t, reg)
	want := map[string]float64{
		"ping,ok": 1, "send_queue,ok": 2, "queues_info,canceled": 1, "queues_info,closed": 1,
		"downstream_get,invalid_channel": 1, "visibility_receive,wait_expired": 1,
		"downstream_sync,tx_not_found": 1, "publish_events,other": 1, "other,ok": 1,
	}
	if len(got) != len(want) {
		t.Errorf("series %v, want %v", got, want)
	}
	for k, n := range want {
		if got[k][0] != n {
			t.Errorf("%s: count %v, want %v (all: %v)", k, got[k][0], n, got)
		}
	}
	if s := got["send_queue,ok"][1]; s < 0.0039 || s > 0.0041 {
		t.Errorf("send_queue sum %v s, want 0.004", s)
	}

	// The per-call path of a known series allocates nothing.
	if a := testing.AllocsPerRun(1000, func() { obs(kubemqclient.OpSendQueue, time.Millisecond, nil) }); a != 0 {
		t.Errorf("%v allocations per observation", a)
	}
}

// TestBackendObserverClient: a client with the observer records its calls
// against a real server.
func TestBackendObserverClient(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	c, err := kubemqclient.Dial(context.Background(), kubemqclient.Options{
		Address: kubemqtest.Address(t), Logger: zaptest.NewLogger(t), Observe: proxy.BackendObserver(reg),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	ch := kubemqclient.Channel("proxy-test", t.Name(), time.Now().Format("150405.000000000"))
	if _, err := c.SendQueueMessage(ctx, kubemqclient.QueueMessage{Channel: ch, Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ReceiveWithVisibility(ctx, ch+".empty", time.Second, time.Second); !errors.Is(err, kubemqclient.ErrWaitExpired) {
		t.Fatalf("empty queue: %v", err)
	}
	got := histograms(t, reg)
	if got["send_queue,ok"][0] != 1 || got["ping,ok"][0] < 1 {
		t.Errorf("series %v, want send_queue,ok once and a ping", got)
	}
	if h := got["visibility_receive,wait_expired"]; h[0] != 1 || h[1] < 0.9 || h[1] > 10 {
		t.Errorf("visibility_receive,wait_expired = %v, want one call of about 1 s", h)
	}
}
