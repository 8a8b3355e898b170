package gcp_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/kubemq-io/kubemq-proxy/gcp"
)

// TestPublishAdmissionWaitsUnread: with the publish budget taken by a call
// whose request has not arrived, the next Publish waits (the waiting gauge
// says so) and completes as soon as the first call goes away; a waiting call
// whose deadline passes ends with DEADLINE_EXCEEDED and leaves the line.
func TestPublishAdmissionWaitsUnread(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	e := startEnv(t, withGCP(func(o *gcp.Options) {
		o.Metrics = reg
		o.Config.MaxPendingPublishBytes = 1 // one call at a time
	}))
	ctx := ctxT(t, 60*time.Second)
	tid := e.id("t")
	e.createTopic(ctx, tid)
	waiting := func() float64 { return gather(t, reg)["kubemq_proxy_gcp_publish_calls_waiting"][""] }
	inFlight := func() float64 { return gather(t, reg)["kubemq_proxy_gcp_publish_pending_bytes"][""] }

	// A Publish that sends its headers and no request: admitted, it waits for its request.
	conn, err := grpc.NewClient(e.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	holdCtx, release := context.WithCancel(ctx)
	defer release()
	if _, err := conn.NewStream(holdCtx, &grpc.StreamDesc{ClientStreams: true}, pubsubpb.Publisher_Publish_FullMethodName); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 10*time.Second, "the held call counted", func() bool { return inFlight() > 0 })

	pc := rawPublisher(t, e)
	req := &pubsubpb.PublishRequest{Topic: e.topicName(tid), Messages: []*pubsubpb.PubsubMessage{{Data: []byte("x")}}}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = pc.Publish(short, req)
	cancel()
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("publish behind a full budget: %v, want DEADLINE_EXCEEDED", err)
	}
	waitUntil(t, 10*time.Second, "the expired call gone from the line", func() bool { return waiting() == 0 })

	done := make(chan error, 1)
	go func() {
		_, err := pc.Publish(ctx, req)
		done <- err
	}()
	waitUntil(t, 10*time.Second, "a waiting call", func() bool { return waiting() == 1 })
	select {
	case err := <-done:
		t.Fatalf("publish completed while the budget was taken: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	release() // the held call ends unread: its place goes to the waiting one
	if err := <-done; err != nil {
		t.Fatalf("waiting publish: %v", err)
	}
	waitUntil(t, 10*time.Second, "the budget empty", func() bool { return inFlight() == 0 && waiting() == 0 })
}

// TestPublishAdmissionManyPublishers: a budget that admits one call at a
// time serves many concurrent clients' batches, in full and in order per
// ordering key.
func TestPublishAdmissionManyPublishers(t *testing.T) {
	e := startEnv(t, withGCP(func(o *gcp.Options) { o.Config.MaxPendingPublishBytes = 1 }))
	ctx := ctxT(t, 120*time.Second)
	tid, sid := e.id("t"), e.id("s")
	e.createTopic(ctx, tid)
	e.createSub(ctx, &pubsubpb.Subscription{Name: e.subName(sid), Topic: e.topicName(tid), EnableMessageOrdering: true})
	const clients, per = 6, 300
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for k := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := e.v2().Publisher(tid)
			p.EnableMessageOrdering = true
			defer p.Stop()
			rs := make([]*pubsub.PublishResult, per)
			for i := range per {
				rs[i] = p.Publish(ctx, &pubsub.Message{Data: fmt.Appendf(nil, "%d", i), OrderingKey: fmt.Sprint("k", k)})
			}
			for _, r := range rs {
				if _, err := r.Get(ctx); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	sub := e.v2().Subscriber(sid)
	next := map[string]int{}
	var mu sync.Mutex
	rctx, stop := context.WithCancel(ctx)
	got := 0
	err := sub.Receive(rctx, func(_ context.Context, m *pubsub.Message) {
		mu.Lock()
		defer mu.Unlock()
		m.Ack()
		if want := fmt.Sprint(next[m.OrderingKey]); string(m.Data) != want {
			t.Errorf("key %s: got %s, want %s", m.OrderingKey, m.Data, want)
		}
		next[m.OrderingKey]++
		if got++; got == clients*per {
			stop()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if got != clients*per {
		t.Fatalf("received %d of %d", got, clients*per)
	}
}

// waitUntil polls cond every 20 ms until it holds or d passes.
func waitUntil(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(d); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("%s: not within %v", what, d)
		}
	}
}
