package gcp_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/kubemq-io/kubemq-proxy/gcp"
)

// quiet is how long a test watches for deliveries that must not come (an
// absence cannot be awaited).
const quiet = 500 * time.Millisecond

// delivered is one message handed to the test, and by which path.
type delivered struct {
	ackID, msgID, via string
}

// TestInflightCeiling: Config.MaxInflightPerSubscription bounds the leases
// of a subscription across all its StreamingPull streams and unary Pulls
// together. At the ceiling nothing errors (Google's flow control never
// does): streams simply receive nothing more, and a unary Pull waits like
// a Pull on an empty subscription, then answers empty. Every settlement
// lets exactly one more message out; nothing is lost or repeated; another
// subscription of the same topic has its own ceiling and is not held back.
func TestInflightCeiling(t *testing.T) {
	const (
		ceiling = 50
		n       = 200
	)
	reg := prometheus.NewPedanticRegistry()
	e := startEnv(t, withGCP(func(o *gcp.Options) {
		o.Metrics = reg
		o.Config.MaxInflightPerSubscription = ceiling
	}))
	ctx := ctxT(t, 90*time.Second)
	tid, sidA, sidB := e.id("t"), e.id("a"), e.id("b")
	e.createTopic(ctx, tid)
	// A long ack deadline: no lease may expire during the test, so every
	// redelivery would be a fault.
	e.createSub(ctx, &pubsubpb.Subscription{Name: e.subName(sidA), Topic: e.topicName(tid), AckDeadlineSeconds: 120})
	e.createSub(ctx, &pubsubpb.Subscription{Name: e.subName(sidB), Topic: e.topicName(tid), AckDeadlineSeconds: 120})
	subA := e.subName(sidA)
	sc := rawSubscriber(t, e)

	// Two streams and a unary Pull loop on A all wait for messages before
	// any is published, so they race for the first ones.
	rctx, stopReceivers := context.WithCancel(ctx)
	got := make(chan delivered, 2*n)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stopReceivers()
	for _, via := range []string{"stream1", "stream2"} {
		stream, err := sc.StreamingPull(rctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := stream.Send(&pubsubpb.StreamingPullRequest{Subscription: subA, StreamAckDeadlineSeconds: 120,
			MaxOutstandingMessages: 1000}); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				resp, err := stream.Recv()
				if err != nil {
					if rctx.Err() == nil {
						t.Errorf("%s: %v", via, err)
					}
					return
				}
				for _, m := range resp.GetReceivedMessages() {
					got <- delivered{m.GetAckId(), m.GetMessage().GetMessageId(), via}
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for rctx.Err() == nil {
			pctx, cancel := context.WithTimeout(rctx, 2*time.Second)
			resp, err := sc.Pull(pctx, &pubsubpb.PullRequest{Subscription: subA, MaxMessages: 100})
			cancel()
			if err != nil {
				if rctx.Err() == nil && status.Code(err) != codes.DeadlineExceeded {
					t.Errorf("unary Pull: %v", err)
				}
				continue
			}
			for _, m := range resp.GetReceivedMessages() {
				got <- delivered{m.GetAckId(), m.GetMessage().GetMessageId(), "pull"}
			}
		}
	}()
	// The receivers' requests have reached the server once the
	// subscription has a runtime on this replica.
	for gather(t, reg)["kubemq_proxy_gcp_active_subscriptions"][""] < 1 {
		select {
		case <-ctx.Done():
			t.Fatal("no runtime for the subscription")
		case <-time.After(5 * time.Millisecond):
		}
	}

	ids := publishN(t, ctx, e.v2(), tid, n, "")
	published := map[string]bool{}
	for _, id := range ids {
		published[id] = true
	}

	seen := map[string]string{} // message id -> via
	var out []delivered         // leased, not yet acked
	// take receives until total deliveries reach want, then (if
	// settled) checks that no more come within quiet.
	take := func(want int, settled bool) {
		t.Helper()
		for len(seen) < want {
			select {
			case d := <-got:
				if !published[d.msgID] {
					t.Fatalf("unknown message %q", d.msgID)
				}
				if prev, dup := seen[d.msgID]; dup {
					t.Fatalf("message %s delivered again (via %s, first via %s)", d.msgID, d.via, prev)
				}
				seen[d.msgID] = d.via
				out = append(out, d)
			case <-ctx.Done():
				t.Fatalf("%d deliveries, want %d", len(seen), want)
			}
		}
		if !settled {
			return
		}
		select {
		case d := <-got:
			t.Fatalf("delivery beyond %d: %s via %s (%d leased)", want, d.msgID, d.via, len(out)+1)
		case <-time.After(quiet):
		}
	}
	ack := func(k int) {
		t.Helper()
		ackIDs := make([]string, k)
		for i := range ackIDs {
			ackIDs[i] = out[i].ackID
		}
		if _, err := sc.Acknowledge(ctx, &pubsubpb.AcknowledgeRequest{Subscription: subA, AckIds: ackIDs}); err != nil {
			t.Fatal(err)
		}
		out = out[k:]
	}
	leases := func() float64 { return gather(t, reg)["kubemq_proxy_gcp_leases"][""] }

	take(ceiling, true)
	if l := leases(); l != ceiling {
		t.Fatalf("leases gauge %v, want %d", l, ceiling)
	}
	// A unary Pull at the ceiling: no error, no message.
	resp, err := sc.Pull(ctx, &pubsubpb.PullRequest{Subscription: subA, MaxMessages: 10, ReturnImmediately: true})
	if err != nil || len(resp.GetReceivedMessages()) != 0 {
		t.Fatalf("Pull at the ceiling: %v, %v", resp.GetReceivedMessages(), err)
	}

	ack(20)
	take(ceiling+20, true)
	if l := leases(); l != ceiling {
		t.Fatalf("leases gauge %v after acking 20 and receiving 20, want %d", l, ceiling)
	}

	// B gets all n, with the current client acking as it goes, while A
	// stays at its ceiling.
	gotB := map[string]int{}
	var muB sync.Mutex
	bctx, stopB := context.WithCancel(ctx)
	errB := make(chan error, 1)
	go func() {
		errB <- e.v2().Subscriber(sidB).Receive(bctx, func(_ context.Context, m *pubsub.Message) {
			muB.Lock()
			gotB[m.ID]++
			if len(gotB) == n {
				stopB()
			}
			muB.Unlock()
			m.Ack()
		})
	}()
	if err := <-errB; err != nil {
		t.Fatalf("Receive on B: %v", err)
	}
	if len(gotB) != n {
		t.Fatalf("B received %d of %d", len(gotB), n)
	}
	for id := range gotB {
		if !published[id] {
			t.Fatalf("B received unknown message %q", id)
		}
	}
	select {
	case d := <-got:
		t.Fatalf("A delivered %s via %s beyond its ceiling while B ran", d.msgID, d.via)
	default:
	}

	// Drain A: each ack lets as many out, until all n came once.
	for len(seen) < n {
		if len(out) == 0 {
			t.Fatalf("%d delivered, none leased", len(seen))
		}
		k := min(len(out), 25)
		ack(k)
		take(min(len(seen)+k, n), false)
		if len(seen) < n && len(out) != ceiling {
			t.Fatalf("%d leased after refilling, want %d", len(out), ceiling)
		}
	}
	ack(len(out))
	take(n, true) // and nothing comes again
	if l := leases(); l != 0 {
		t.Errorf("leases gauge %v after acking everything", l)
	}
	vias := map[string]int{}
	for _, via := range seen {
		vias[via]++
	}
	t.Logf("A's deliveries by path: %v", vias)
}
