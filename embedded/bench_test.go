package embedded_test

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/kubemq-io/kubemq-proxy/embedded"
	pb "github.com/kubemq-io/kubemq-proxy/kubemqpb"
)

// Benchmarks over gRPC on loopback with a data dir and 1 KiB bodies; each reports msg/s.

func benchEnv(b *testing.B) *env {
	b.Helper()
	srv, err := embedded.New(embedded.Options{Strict: true, DataDir: b.TempDir(), Logger: zap.NewNop()})
	if err != nil {
		b.Fatal(err)
	}
	lis := listen(b)
	go func() { _ = srv.Serve(lis) }()
	b.Cleanup(srv.Stop)
	return &env{t: b, srv: srv, c: dial(b, lis.Addr().String()), ctx: testCtx(b)}
}

var kib = make([]byte, 1024)

func rate(b *testing.B, n int) {
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "msg/s")
}

func fill(b *testing.B, e *env, queue string, n int) {
	b.Helper()
	const callers = 4
	var wg sync.WaitGroup
	for w := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w * 100; i < n; i += callers * 100 {
				msgs := make([]*pb.QueueMessage, 0, 100)
				for j := i; j < min(i+100, n); j++ {
					msgs = append(msgs, &pb.QueueMessage{ClientID: "c", Channel: queue, Body: kib})
				}
				res, err := e.c.SendQueueMessagesBatch(e.ctx, &pb.QueueMessagesBatchRequest{Messages: msgs})
				if err != nil || res.HaveErrors {
					b.Errorf("batch: %v", err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// BenchmarkQueueSendBatch: SendQueueMessagesBatch of 100 messages, 4 concurrent callers.
func BenchmarkQueueSendBatch(b *testing.B) {
	e := benchEnv(b)
	b.SetBytes(1024)
	b.ResetTimer()
	fill(b, e, "bench", b.N)
	rate(b, b.N)
}

// BenchmarkQueueUpstream: QueuesUpstream with 100-message requests, 8 in flight.
func BenchmarkQueueUpstream(b *testing.B) {
	e := benchEnv(b)
	up, err := e.c.QueuesUpstream(e.ctx)
	if err != nil {
		b.Fatal(err)
	}
	reqs := (b.N + 99) / 100
	b.SetBytes(1024)
	b.ResetTimer()
	window := make(chan struct{}, 8)
	done := make(chan error, 1)
	go func() {
		for range reqs {
			r, err := up.Recv()
			if err != nil {
				done <- err
				return
			}
			if r.IsError {
				done <- fmt.Errorf("%s", r.Error)
				return
			}
			<-window
		}
		done <- nil
	}()
	for i := range reqs {
		msgs := make([]*pb.QueueMessage, 100)
		for j := range msgs {
			msgs[j] = &pb.QueueMessage{ClientID: "c", Channel: "up", Body: kib}
		}
		window <- struct{}{}
		if err := up.Send(&pb.QueuesUpstreamRequest{RequestID: fmt.Sprint(i), Messages: msgs}); err != nil {
			b.Fatal(err)
		}
	}
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	rate(b, reqs*100)
}

// BenchmarkDownstreamGetAckAll drains a pre-filled queue with Get(MaxItems=1000) + AckAll on one
// stream, the proxy's receive pattern.
func BenchmarkDownstreamGetAckAll(b *testing.B) {
	e := benchEnv(b)
	fill(b, e, "drain", b.N)
	s, err := e.c.QueuesDownstream(e.ctx)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(1024)
	b.ResetTimer()
	for got := 0; got < b.N; {
		if err := s.Send(&pb.QueuesDownstreamRequest{ClientID: "c", RequestTypeData: pb.QueuesDownstreamRequestType_Get, Channel: "drain", MaxItems: int32(min(1000, b.N-got)), WaitTimeout: 1000}); err != nil {
			b.Fatal(err)
		}
		r, err := s.Recv()
		if err != nil || r.IsError {
			b.Fatalf("get: %v %+v", err, r)
		}
		got += len(r.Messages)
		if err := s.Send(&pb.QueuesDownstreamRequest{ClientID: "c", RequestTypeData: pb.QueuesDownstreamRequestType_AckAll, RefTransactionId: r.TransactionId}); err != nil {
			b.Fatal(err)
		}
	}
	rate(b, b.N)
}

// BenchmarkEventsStorePublish streams events-store events on one SendEventsStream and waits for
// every Result.
func BenchmarkEventsStorePublish(b *testing.B) {
	e := benchEnv(b)
	b.SetBytes(1024)
	b.ResetTimer()
	publishStream(b, e, "bench.es", b.N)
	rate(b, b.N)
}

func publishStream(b *testing.B, e *env, ch string, n int) {
	st, err := e.c.SendEventsStream(e.ctx)
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		for range n {
			r, err := st.Recv()
			if err != nil || !r.Sent {
				done <- fmt.Errorf("result %v %+v", err, r)
				return
			}
		}
		done <- nil
	}()
	for range n {
		if err := st.Send(&pb.Event{ClientID: "p", Channel: ch, Body: kib, Store: true}); err != nil {
			b.Fatal(err)
		}
	}
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	_ = st.CloseSend()
}

// BenchmarkEventsStoreReplay replays a pre-filled channel with StartFromFirst.
func BenchmarkEventsStoreReplay(b *testing.B) {
	e := benchEnv(b)
	publishStream(b, e, "replay", b.N)
	b.SetBytes(1024)
	b.ResetTimer()
	s, err := e.c.SubscribeToEvents(e.ctx, storeSub("r", "replay", "", pb.Subscribe_StartFromFirst, 0))
	if err != nil {
		b.Fatal(err)
	}
	for i := range b.N {
		ev, err := s.Recv()
		if err != nil || ev.Sequence != uint64(i+1) {
			b.Fatalf("replay %d: %v", i, err)
		}
	}
	rate(b, b.N)
}

// BenchmarkDelayedMessages sends b.N messages with DelaySeconds=1 (batches of 100) and drains
// them as they come due; it reports the send rate and how late they arrived against DelayedTo.
func BenchmarkDelayedMessages(b *testing.B) {
	e := benchEnv(b)
	b.ResetTimer()
	due := make(map[string]int64, b.N)
	for i := 0; i < b.N; i += 100 {
		msgs := make([]*pb.QueueMessage, 0, 100)
		for j := i; j < min(i+100, b.N); j++ {
			msgs = append(msgs, &pb.QueueMessage{ClientID: "c", Channel: "delayed", Body: kib, Policy: &pb.QueueMessagePolicy{DelaySeconds: 1}})
		}
		res, err := e.c.SendQueueMessagesBatch(e.ctx, &pb.QueueMessagesBatchRequest{Messages: msgs})
		if err != nil || res.HaveErrors {
			b.Fatalf("send: %v", err)
		}
		for _, r := range res.Results {
			due[r.MessageID] = r.DelayedTo
		}
	}
	sendRate := float64(b.N) / b.Elapsed().Seconds()
	s, err := e.c.QueuesDownstream(e.ctx)
	if err != nil {
		b.Fatal(err)
	}
	late := make([]int64, 0, b.N)
	for len(late) < b.N {
		if err := s.Send(&pb.QueuesDownstreamRequest{ClientID: "c", RequestTypeData: pb.QueuesDownstreamRequestType_Get, Channel: "delayed", MaxItems: 1, WaitTimeout: 10000, AutoAck: true}); err != nil {
			b.Fatal(err)
		}
		// MaxItems=1 returns as soon as one is due; then take what else is visible.
		r, err := s.Recv()
		if err != nil || r.IsError {
			b.Fatalf("get %v %+v", err, r)
		}
		now := time.Now().UnixNano()
		for _, m := range r.Messages {
			late = append(late, now-due[m.MessageID])
		}
		info, err := e.c.QueuesInfo(e.ctx, &pb.QueuesInfoRequest{QueueName: "delayed"})
		if err != nil {
			b.Fatal(err)
		}
		if w := info.Info.Waiting; w > 0 {
			if err := s.Send(&pb.QueuesDownstreamRequest{ClientID: "c", RequestTypeData: pb.QueuesDownstreamRequestType_Get, Channel: "delayed", MaxItems: int32(w), WaitTimeout: 1000, AutoAck: true}); err != nil {
				b.Fatal(err)
			}
			r, err := s.Recv()
			if err != nil || r.IsError {
				b.Fatalf("get %v %+v", err, r)
			}
			now := time.Now().UnixNano()
			for _, m := range r.Messages {
				late = append(late, now-due[m.MessageID])
			}
		}
	}
	slices.Sort(late)
	ms := func(ns int64) float64 { return float64(ns) / 1e6 }
	b.ReportMetric(sendRate, "sent-msg/s")
	b.ReportMetric(ms(late[len(late)/2]), "late-p50-ms")
	b.ReportMetric(ms(late[len(late)*99/100]), "late-p99-ms")
	b.ReportMetric(ms(late[len(late)-1]), "late-max-ms")
}
