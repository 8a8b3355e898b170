package load

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// pullStream is one raw StreamingPull stream (exactly one per
// subscription, unlike the client library, which opens several) and what
// it received.
type pullStream struct {
	sub    string
	cancel context.CancelFunc
	done   chan struct{}

	mu   sync.Mutex        // guards got, dups and err
	got  map[string]string // message id -> data
	dups int
	err  error // set when the stream ended other than by cancel
}

// openPull opens a stream on sub and runs it until ctx is cancelled:
// every message received is recorded and acked on the stream. complete is
// called once, when want distinct messages have arrived.
func openPull(ctx context.Context, cl pubsubpb.SubscriberClient, sub string, want int, complete func()) (*pullStream, error) {
	ctx, cancel := context.WithCancel(ctx)
	st, err := cl.StreamingPull(ctx)
	if err != nil {
		cancel()
		return nil, err
	}
	if err := st.Send(&pubsubpb.StreamingPullRequest{Subscription: sub, StreamAckDeadlineSeconds: 60,
		MaxOutstandingMessages: 10, ClientId: sub}); err != nil {
		cancel()
		return nil, err
	}
	s := &pullStream{sub: sub, cancel: cancel, done: make(chan struct{}), got: map[string]string{}}
	go func() {
		defer close(s.done)
		signalled := false
		for {
			resp, err := st.Recv()
			if err != nil {
				if ctx.Err() == nil {
					s.mu.Lock()
					s.err = err
					s.mu.Unlock()
				}
				return
			}
			var ids []string
			s.mu.Lock()
			for _, m := range resp.GetReceivedMessages() {
				ids = append(ids, m.GetAckId())
				if _, seen := s.got[m.GetMessage().GetMessageId()]; seen {
					s.dups++
				}
				s.got[m.GetMessage().GetMessageId()] = string(m.GetMessage().GetData())
			}
			n := len(s.got)
			s.mu.Unlock()
			if len(ids) > 0 {
				// Only this goroutine sends after the first request, so
				// sends never run concurrently.
				if err := st.Send(&pubsubpb.StreamingPullRequest{AckIds: ids}); err != nil {
					if ctx.Err() == nil {
						s.mu.Lock()
						s.err = fmt.Errorf("send acks: %w", err)
						s.mu.Unlock()
					}
					return
				}
			}
			if n >= want && !signalled {
				signalled = true
				complete()
			}
		}
	}()
	return s, nil
}

func (s *pullStream) snapshot() (got map[string]string, dups int, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	got = make(map[string]string, len(s.got))
	for k, v := range s.got {
		got[k] = v
	}
	return got, s.dups, s.err
}

// TestLoadPubSub holds LOAD_PUBSUB_STREAMS StreamingPull streams (default
// 200), one per subscription of one topic, publishes LOAD_PUBSUB_MESSAGES
// messages (default 3) to the topic and checks that every stream receives
// and acks each of them while all are open; then closes the streams and
// checks that the proxy's goroutines come back to the baseline. It reports
// the proxy process's RSS and goroutines per stream.
func TestLoadPubSub(t *testing.T) {
	nStreams := envInt(t, "LOAD_PUBSUB_STREAMS", 200, 50)
	nMsgs := envInt(t, "LOAD_PUBSUB_MESSAGES", 3, 3)
	const workers = 8

	// Runtimes of subscriptions nobody pulls from end after runtimeIdle:
	// long enough to outlast the stream phase, short enough to check.
	const runtimeIdle = 15 * time.Second
	e := startProxy(t, "--gcp.runtime_idle", runtimeIdle.String())
	cc, err := grpc.NewClient(e.gcpAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	pub, subc := pubsubpb.NewPublisherClient(cc), pubsubpb.NewSubscriberClient(cc)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	project := "projects/load-" + e.suffix

	// Warm-up on a topic of its own: one stream receives and acks one
	// message, so that whatever the proxy starts on first use is in the
	// baseline.
	{
		topic, sub := project+"/topics/warmup", project+"/subscriptions/warmup"
		if _, err := pub.CreateTopic(ctx, &pubsubpb.Topic{Name: topic}); err != nil {
			t.Fatal(err)
		}
		if _, err := subc.CreateSubscription(ctx, &pubsubpb.Subscription{Name: sub, Topic: topic, AckDeadlineSeconds: 60}); err != nil {
			t.Fatal(err)
		}
		if _, err := pub.Publish(ctx, &pubsubpb.PublishRequest{Topic: topic, Messages: []*pubsubpb.PubsubMessage{{Data: []byte("warmup")}}}); err != nil {
			t.Fatal(err)
		}
		got := make(chan struct{})
		s, err := openPull(ctx, subc, sub, 1, func() { close(got) })
		if err != nil {
			t.Fatal(err)
		}
		select {
		case <-got:
		case <-s.done:
			_, _, err := s.snapshot()
			t.Fatalf("warm-up stream ended: %v", err)
		case <-time.After(30 * time.Second):
			t.Fatal("warm-up message not received within 30s")
		}
		if _, ok := e.waitMetric(leakWait, func(m metrics) bool { return m["kubemq_proxy_gcp_acked_messages_total"] == 1 }); !ok {
			t.Fatal("warm-up ack not counted by the proxy")
		}
		s.cancel()
		<-s.done
	}
	beforeSubs, ok := e.waitMetric(leakWait, func(m metrics) bool { return m["kubemq_proxy_gcp_streaming_pulls"] == 0 })
	if !ok {
		t.Fatalf("warm-up stream still open in the proxy")
	}

	topic := project + "/topics/load"
	if _, err := pub.CreateTopic(ctx, &pubsubpb.Topic{Name: topic}); err != nil {
		t.Fatal(err)
	}
	subs := make([]string, nStreams)
	err = parallel(nStreams, workers, func(i int) error {
		subs[i] = fmt.Sprintf("%s/subscriptions/load-%04d", project, i)
		_, err := subc.CreateSubscription(ctx, &pubsubpb.Subscription{Name: subs[i], Topic: topic, AckDeadlineSeconds: 60})
		return err
	})
	if err != nil {
		t.Fatalf("create subscriptions: %v", err)
	}
	created := e.scrape()

	// A subscription's delivery runtime starts on first use and stays
	// until it has been idle for gcp.runtime_idle (gcp/pull.go), so each is
	// started here with a unary Pull: the baseline then holds them, and
	// the leak check after the streams close is exact for what the streams
	// started. Their retirement is checked at the end.
	err = parallel(nStreams, workers, func(i int) error {
		_, err := subc.Pull(ctx, &pubsubpb.PullRequest{Subscription: subs[i], MaxMessages: 1, ReturnImmediately: true})
		return err
	})
	if err != nil {
		t.Fatalf("start the subscription runtimes: %v", err)
	}
	before, ok := e.waitMetric(leakWait, func(m metrics) bool {
		return m["kubemq_proxy_gcp_active_subscriptions"] == float64(1+nStreams)
	})
	if !ok {
		t.Fatalf("proxy counts %v subscription runtimes, want %d", before["kubemq_proxy_gcp_active_subscriptions"], 1+nStreams)
	}

	var received sync.WaitGroup
	received.Add(nStreams)
	streams := make([]*pullStream, nStreams)
	stopAll := func() {
		for _, s := range streams {
			if s != nil {
				s.cancel()
				<-s.done
			}
		}
	}
	defer stopAll()
	err = parallel(nStreams, workers, func(i int) error {
		s, err := openPull(ctx, subc, subs[i], nMsgs, received.Done)
		streams[i] = s
		return err
	})
	if err != nil {
		t.Fatalf("open streams: %v", err)
	}
	opened, ok := e.waitMetric(30*time.Second, func(m metrics) bool { return m["kubemq_proxy_gcp_streaming_pulls"] == float64(nStreams) })
	if !ok {
		t.Fatalf("proxy counts %v streams, want %d", opened["kubemq_proxy_gcp_streaming_pulls"], nStreams)
	}

	msgs := make([]*pubsubpb.PubsubMessage, nMsgs)
	want := map[string]string{}
	for k := range msgs {
		msgs[k] = &pubsubpb.PubsubMessage{Data: []byte(fmt.Sprintf("load-%d", k))}
	}
	resp, err := pub.Publish(ctx, &pubsubpb.PublishRequest{Topic: topic, Messages: msgs})
	if err != nil {
		t.Fatal(err)
	}
	for k, id := range resp.GetMessageIds() {
		want[id] = string(msgs[k].Data)
	}
	if len(want) != nMsgs {
		t.Fatalf("publish returned %d distinct ids for %d messages", len(want), nMsgs)
	}

	all := make(chan struct{})
	go func() { received.Wait(); close(all) }()
	var ended atomic.Int64
	select {
	case <-all:
	case <-time.After(60 * time.Second):
		missing := 0
		for _, s := range streams {
			if got, _, _ := s.snapshot(); len(got) < nMsgs {
				missing++
			}
		}
		t.Errorf("%d of %d streams lack messages 60s after the publish", missing, nStreams)
	}
	wantAcks := float64(1 + nStreams*nMsgs)
	acked, ok := e.waitMetric(30*time.Second, func(m metrics) bool { return m["kubemq_proxy_gcp_acked_messages_total"] >= wantAcks })
	if !ok {
		t.Errorf("proxy counts %v acks, want %v", acked["kubemq_proxy_gcp_acked_messages_total"], wantAcks)
	}
	held := e.scrape()
	if n := held["kubemq_proxy_gcp_streaming_pulls"]; n != float64(nStreams) {
		t.Errorf("proxy counts %v open streams with every client stream open, want %d", n, nStreams)
	}

	// Every stream got exactly the published messages, once, and none
	// ended on its own.
	totalDups := 0
	for i, s := range streams {
		got, dups, err := s.snapshot()
		totalDups += dups
		if err != nil {
			ended.Add(1)
			t.Errorf("stream %d (%s) ended: %v", i, s.sub, err)
			continue
		}
		if len(got) != len(want) {
			t.Errorf("stream %d (%s): %d messages, want %d", i, s.sub, len(got), len(want))
			continue
		}
		for id, data := range want {
			if got[id] != data {
				t.Errorf("stream %d (%s): message %s = %q, want %q", i, s.sub, id, got[id], data)
			}
		}
	}
	if totalDups > 0 {
		t.Errorf("%d duplicate deliveries within the 60s ack deadline", totalDups)
	}

	stopAll()
	if m, ok := e.waitMetric(leakWait, func(m metrics) bool { return m["kubemq_proxy_gcp_streaming_pulls"] == 0 }); !ok {
		t.Errorf("proxy still counts %v streams %v after every client stream was cancelled", m["kubemq_proxy_gcp_streaming_pulls"], leakWait)
	}
	after := e.leakCheck("StreamingPull streams", before.Goroutines())

	report(t, "pubsub streams=%d messages_per_stream=%d delivered=%d dups=%d rss_before_subs=%.1fMiB rss_subs=%.1fMiB rss_before=%.1fMiB rss_held=%.1fMiB rss_after=%.1fMiB "+
		"per_stream_kib=%.1f per_subscription_kib=%.1f per_runtime_kib=%.1f goroutines_before_subs=%.0f goroutines_subs=%.0f goroutines_before=%.0f goroutines_held=%.0f goroutines_after=%.0f "+
		"goroutines_per_stream=%.2f goroutines_per_runtime=%.2f heap_before=%.1fMiB heap_held=%.1fMiB heap_per_stream_kib=%.1f",
		nStreams, nMsgs, nStreams*nMsgs-int(ended.Load())*nMsgs, totalDups,
		mib(beforeSubs.RSS()), mib(created.RSS()), mib(before.RSS()), mib(held.RSS()), mib(after.RSS()),
		(held.RSS()-before.RSS())/float64(nStreams)/1024, (created.RSS()-beforeSubs.RSS())/float64(nStreams)/1024,
		(before.RSS()-created.RSS())/float64(nStreams)/1024,
		beforeSubs.Goroutines(), created.Goroutines(), before.Goroutines(), held.Goroutines(), after.Goroutines(),
		(held.Goroutines()-before.Goroutines())/float64(nStreams), (before.Goroutines()-created.Goroutines())/float64(nStreams),
		mib(before.Heap()), mib(held.Heap()), (held.Heap()-before.Heap())/float64(nStreams)/1024)

	// With every stream gone and nothing leased, the subscription runtimes
	// retire after runtimeIdle: the proxy is back to what it was before
	// the subscriptions were first pulled from.
	idle, ok := e.waitMetric(runtimeIdle+leakWait+runtimeIdle/2, func(m metrics) bool {
		return m["kubemq_proxy_gcp_active_subscriptions"] == 0
	})
	if !ok {
		t.Fatalf("%v subscription runtimes still running %v after the last stream closed", idle["kubemq_proxy_gcp_active_subscriptions"], runtimeIdle+leakWait)
	}
	retired := e.leakCheck("idle subscription runtimes", beforeSubs.Goroutines())
	report(t, "pubsub runtimes retired after %v idle: goroutines %.0f (before the subscriptions: %.0f)", runtimeIdle, retired.Goroutines(), beforeSubs.Goroutines())
	e.stop()
}
