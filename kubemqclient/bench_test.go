package kubemqclient_test

// Throughput through the client over gRPC against kubemqtest (the embedded
// server with a data dir, or $KUBEMQ_ADDRESS), 1 KiB bodies. b.N counts
// messages; run with e.g. -benchtime=100000x. Targets on 2 cores: queue send
// >= 100k msg/s, Get(1000)+AckAll >= 50k msg/s, events-store publish >= 100k
// msg/s.

import (
	"context"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/kubemq-io/kubemq-proxy/embedded"
	"github.com/kubemq-io/kubemq-proxy/internal/kubemqtest"
	kc "github.com/kubemq-io/kubemq-proxy/kubemqclient"
)

// servers runs f against kubemqtest.Address ("disk": the embedded server with
// a data dir, or the external one) and, for comparison, an in-memory
// embedded server ("mem"), which shows the client's own cost.
func servers(b *testing.B, f func(b *testing.B, c *kc.Client)) {
	b.Run("disk", func(b *testing.B) { f(b, dial(b)) })
	b.Run("mem", func(b *testing.B) {
		if kubemqtest.External() {
			b.Skip("external server")
		}
		addr, _ := kubemqtest.StartEmbedded(b, embedded.Options{Strict: true, Logger: zap.NewNop()})
		f(b, dialAddr(b, addr))
	})
}

var payload = make([]byte, 1024)

func report(b *testing.B, start time.Time, n int) {
	b.ReportMetric(float64(n)/time.Since(start).Seconds(), "msg/s")
	b.ReportMetric(0, "ns/op")
}

// chunks runs f over [0,n) in pieces of size per, on workers goroutines.
func chunks(b *testing.B, n, per, workers int, f func(from, k int) error) {
	var next int
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				from := next
				next += per
				mu.Unlock()
				if from >= n {
					return
				}
				if err := f(from, min(per, n-from)); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
}

func queueBatch(ch string, k int) []kc.QueueMessage {
	msgs := make([]kc.QueueMessage, k)
	for i := range msgs {
		msgs[i] = kc.QueueMessage{Channel: ch, Body: payload}
	}
	return msgs
}

// fill sends n messages as 100-message batches from 8 concurrent callers.
func fill(b *testing.B, c *kc.Client, ch string, n int) {
	chunks(b, n, 100, 8, func(_, k int) error {
		rs, err := c.SendQueueMessages(context.Background(), queueBatch(ch, k))
		if err == nil {
			err = kc.FirstError(rs)
		}
		return err
	})
}

func BenchmarkQueueSendBatch(b *testing.B) { servers(b, benchQueueSendBatch) }

func benchQueueSendBatch(b *testing.B, c *kc.Client) {
	ch := fresh(b, "bench")
	b.ResetTimer()
	start := time.Now()
	fill(b, c, ch, b.N)
	report(b, start, b.N)
}

func BenchmarkQueueSendUpstream(b *testing.B) { servers(b, benchQueueSendUpstream) }

func benchQueueSendUpstream(b *testing.B, c *kc.Client) {
	ch := fresh(b, "bench")
	up, err := c.OpenUpstream(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	defer up.Close()
	b.ResetTimer()
	start := time.Now()
	chunks(b, b.N, 100, 16, func(_, k int) error {
		rs, err := up.Send(context.Background(), queueBatch(ch, k))
		if err == nil {
			err = kc.FirstError(rs)
		}
		return err
	})
	report(b, start, b.N)
}

func BenchmarkQueueReceiveAckAll(b *testing.B) { servers(b, benchQueueReceiveAckAll) }

func benchQueueReceiveAckAll(b *testing.B, c *kc.Client) {
	ch := fresh(b, "bench")
	fill(b, c, ch, b.N)
	ds, err := c.OpenDownstream(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	defer ds.Close()
	ctx := context.Background()
	b.ResetTimer()
	start := time.Now()
	got := 0
	var last string
	for got < b.N {
		tx, err := ds.Get(ctx, kc.GetRequest{Channel: ch, MaxItems: min(1000, b.N-got), Wait: time.Second})
		if err != nil {
			b.Fatal(err)
		}
		if len(tx.Messages) == 0 {
			b.Fatalf("queue empty after %d of %d", got, b.N)
		}
		got += len(tx.Messages)
		if err := ds.AckAll(tx.ID); err != nil {
			b.Fatal(err)
		}
		last = tx.ID
	}
	if err := ds.Sync(ctx, last); err != nil {
		b.Fatal(err)
	}
	report(b, start, got)
}

func publishN(b *testing.B, c *kc.Client, ch string, n, per, workers int) {
	chunks(b, n, per, workers, func(_, k int) error {
		evs := make([]kc.Event, k)
		for i := range evs {
			evs[i] = kc.Event{Channel: ch, Body: payload}
		}
		rs, err := c.PublishEvents(context.Background(), evs)
		if err == nil {
			err = kc.FirstError(rs)
		}
		return err
	})
}

func BenchmarkEventsStorePublish(b *testing.B) { servers(b, benchEventsStorePublish) }

func benchEventsStorePublish(b *testing.B, c *kc.Client) {
	ch := fresh(b, "bench")
	b.ResetTimer()
	start := time.Now()
	publishN(b, c, ch, b.N, 100, 8)
	report(b, start, b.N)
}

func BenchmarkEventsStoreReplay(b *testing.B) { servers(b, benchEventsStoreReplay) }

func benchEventsStoreReplay(b *testing.B, c *kc.Client) {
	ch := fresh(b, "bench")
	publishN(b, c, ch, b.N, 100, 8)
	b.ResetTimer()
	start := time.Now()
	s, err := c.SubscribeEventsStore(context.Background(), kc.SubscribeOptions{Channel: ch, Start: kc.StartPosition{Mode: kc.StartFromFirst}, Buffer: 8192})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	for i := 1; i <= b.N; i++ {
		e, err := s.Recv(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		if e.Sequence != uint64(i) {
			b.Fatalf("sequence %d, want %d", e.Sequence, i)
		}
	}
	report(b, start, b.N)
}
