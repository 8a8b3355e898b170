package memreclaim

import (
	"context"
	"runtime"
	"runtime/metrics"
	"testing"
	"time"
)

func TestDue(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		name                     string
		cycles, last, live, heap uint64
		want                     bool
	}{
		{"quiet, big garbage", 7, 7, 10 * mib, 200 * mib, true},
		{"quiet, little garbage", 7, 7, 10 * mib, 30 * mib, false},
		{"busy: the runtime collects by itself", 9, 7, 10 * mib, 200 * mib, false},
		{"just at the slack", 7, 7, 10 * mib, 42 * mib, false},
		{"big live heap, garbage under a quarter of it", 7, 7, 400 * mib, 480 * mib, false},
		{"big live heap, garbage over a quarter of it", 7, 7, 400 * mib, 520 * mib, true},
	} {
		if got := Due(c.cycles, c.last, c.live, c.heap, 32*mib); got != c.want {
			t.Errorf("%s: Due = %v, want %v", c.name, got, c.want)
		}
	}
}

var sink [][]byte

// Garbage left by a burst is collected by Run within a few intervals, though nothing
// allocates any more.
func TestRunCollectsAfterABurst(t *testing.T) {
	runtime.GC()
	for range 64 {
		sink = append(sink, make([]byte, 1<<20))
	}
	sink = nil // 64 MiB of garbage (part of it already collected during the burst)
	s := []metrics.Sample{{Name: mCycles}}
	metrics.Read(s)
	before := s[0].Value.Uint64()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		Run(ctx, 20*time.Millisecond, 4<<20)
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		metrics.Read(s)
		if s[0].Value.Uint64() > before {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no collection within 10 s of a 64 MiB burst of garbage")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done
}
