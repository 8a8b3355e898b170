package delivery

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
)

// BenchmarkBacklog100k: receive and ack a backlog of 100k 1 KiB messages (one lease record per
// Get batch), against kubemqtest's server. Run with -benchtime=1x; each iteration drains a
// fresh queue. Reports msg/s.
func BenchmarkBacklog100k(b *testing.B) { benchBacklog(b, 10*time.Second) }

// BenchmarkBacklog100kRecordsReturning is BenchmarkBacklog100k with 1 s lease records, so the
// records of acked batches come back (and are dropped) while the backlog drains.
func BenchmarkBacklog100kRecordsReturning(b *testing.B) { benchBacklog(b, time.Second) }

func benchBacklog(b *testing.B, recordDelay time.Duration) {
	addr, checkStrict := testServer(b)
	cl := dial(b, addr)
	const n = 100_000
	var total time.Duration
	for b.Loop() {
		b.StopTimer()
		q := uniqueQueue(b)
		produce(b, cl.Client, q, ids(n, "m"), 1024)
		c, err := NewConsumer(NewKubeMQBackend(cl.Client), q, Options{Logger: zap.NewNop(), RecordDelay: recordDelay})
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		start := time.Now()
		var got sync.WaitGroup
		var mu sync.Mutex
		count := 0
		ctx, cancel := context.WithCancel(context.Background())
		for range 2 { // two fetchers keep demand up while one acks
			got.Add(1)
			go func() {
				defer got.Done()
				for {
					ds, err := c.Fetch(ctx, 500)
					if err != nil {
						return
					}
					c.Ack(leaseIDs(ds)...)
					mu.Lock()
					count += len(ds)
					if count >= n {
						cancel()
					}
					mu.Unlock()
				}
			}()
		}
		got.Wait()
		cancel()
		total += time.Since(start)
		b.StopTimer()
		st := c.Stats()
		closeWithin(b, c, 30*time.Second)
		if count != n {
			b.Fatalf("received %d of %d", count, n)
		}
		b.Logf("gets %d, records stored %d, returned %d; %.1f msgs/Get", st.Gets, st.RecordsStored, st.RecordsReturned,
			float64(st.Received)/float64(st.Gets))
		b.StartTimer()
	}
	b.ReportMetric(float64(n)*float64(b.N)/total.Seconds(), "msg/s")
	checkStrict()
}

// BenchmarkLoneMessageLatency: one 1 KiB message at a time, sent while a Fetch waits on an
// idle queue; reports the send-to-delivery latency percentiles.
func BenchmarkLoneMessageLatency(b *testing.B) {
	addr, checkStrict := testServer(b)
	cl := dial(b, addr)
	q := uniqueQueue(b)
	c, err := NewConsumer(NewKubeMQBackend(cl.Client), q, Options{Logger: zap.NewNop()})
	if err != nil {
		b.Fatal(err)
	}
	defer closeWithin(b, c, 10*time.Second)
	var lat []time.Duration
	for b.Loop() {
		got := make(chan *Delivery, 1)
		go func() {
			ds, err := c.Fetch(context.Background(), 1)
			if err != nil {
				b.Error(err)
				got <- nil
				return
			}
			got <- ds[0]
		}()
		time.Sleep(5 * time.Millisecond) // let the Fetch reach the poll loop's idle Get
		start := time.Now()
		produce(b, cl.Client, q, []string{"x"}, 1024)
		d := <-got
		lat = append(lat, time.Since(start))
		if d != nil {
			c.Ack(d.LeaseID)
		}
	}
	slices.Sort(lat)
	pct := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Microseconds()) / 1000 }
	b.ReportMetric(pct(0.5), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
	b.ReportMetric(pct(1), "max-ms")
	checkStrict()
}
