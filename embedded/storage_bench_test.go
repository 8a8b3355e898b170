package embedded

import (
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
)

// BenchmarkLogStore measures the log alone with the workload of STORAGE.md's comparison: 8
// writers, each durable-appending batches of 100 one-KiB queue messages and then logging their
// deletion (the ack), waiting for each.
func BenchmarkLogStore(b *testing.B) {
	for _, fsync := range []bool{false, true} {
		name := "write-to-OS"
		if fsync {
			name = "fsync-each-commit"
		}
		b.Run(name, func(b *testing.B) { benchLogStore(b, fsync) })
	}
}

func benchLogStore(b *testing.B, fsync bool) {
	const writers, batch = 8, 100
	s := &Server{opts: Options{SegmentBytes: 64 << 20, FsyncEveryWrite: fsync, FsyncInterval: time.Second, Now: time.Now, MaxRetention: 24 * time.Hour}, log: zap.NewNop()}
	s.queues, s.channels, s.durables = map[string]*queue{}, map[string]*eventChannel{}, map[string]*durable{}
	s.delays = newDelayer(s)
	st, err := openLogStore(b.TempDir(), s)
	if err != nil {
		b.Fatal(err)
	}
	s.store = st
	defer st.close()
	rec := make([]byte, 12+1024)
	per := b.N/(writers*batch) + 1
	b.SetBytes(1024)
	b.ResetTimer()
	var wg sync.WaitGroup
	for range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var seq uint64
			for range per {
				var lsn uint64
				seqs := make([]uint64, batch)
				for j := range batch {
					seq++
					seqs[j] = seq
					// The same bytes as the key/value stores get: a 12-byte key and the body.
					lsn, _ = st.append(recQueueMsg, rec, true)
				}
				if err := s.waitLog(lsn); err != nil {
					b.Error(err)
					return
				}
				s.logQueueDel("q", seqs)
				st.mu.Lock()
				lsn = st.lsn
				st.mu.Unlock()
				if err := s.waitLog(lsn); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.ReportMetric(float64(per*writers*batch)/b.Elapsed().Seconds(), "msg/s")
}
