package embedded

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kubemq-io/kubemq-proxy/kubemqpb"
)

var (
	storedMessages = flag.Int("stored", 100_000, "BenchmarkStoredMemory: how many 1 KiB messages to store (1000000 for the STORAGE.md figure)")
	storedDir      = flag.String("stored-dir", "", "BenchmarkStoredMemory/data-dir: the data dir to use; empty: store into a temporary one and restart in the same process; "+
		"a dir without segments: store into it only; a dir with segments (stored by an earlier run): open it only (a restart in a new process)")
)

// BenchmarkStoredMemory stores -stored 1 KiB queue messages (100 per batch, as a batched send)
// in an in-memory server and in one with a data directory, and reports the process's RSS
// (VmRSS) and Go heap once they are stored (after a GC), per message and in total, and the send
// rate; with a data dir also the restart time and the RSS and heap after it. Run one case per
// process for a clean RSS:
//
//	go test -run x -bench 'StoredMemory/in-memory' -benchtime 1x -stored 1000000 ./embedded
//
// With -stored-dir the data-dir case splits the two phases over two processes, as a user meets a
// restart: the first run stores into the (empty or missing) dir and stops, reporting the storing
// phase's peak; the next run only opens the dir and reports the recovery time and the peak, RSS
// and heap of a process that has done nothing but recover:
//
//	go test -run x -bench 'StoredMemory/data-dir' -benchtime 1x -stored 1000000 -stored-dir /tmp/d ./embedded  # store
//	go test -run x -bench 'StoredMemory/data-dir' -benchtime 1x -stored 1000000 -stored-dir /tmp/d ./embedded  # open
func BenchmarkStoredMemory(b *testing.B) {
	inMemoryAndDataDir(b, func(b *testing.B, persisted bool) { benchStoredMemory(b, persisted, *storedMessages) })
}

// inMemoryAndDataDir runs bench as two sub-benchmarks: a server in memory, one on a data dir.
func inMemoryAndDataDir(b *testing.B, bench func(b *testing.B, persisted bool)) {
	for _, persisted := range []bool{false, true} {
		name := "in-memory"
		if persisted {
			name = "data-dir"
		}
		b.Run(name, func(b *testing.B) {
			for range b.N {
				bench(b, persisted)
			}
		})
	}
}

// storeQueue sends n copies of body to queue channel in batches of 100 (a fresh body per
// message, as a client's messages arrive) and waits until each batch is durable.
func storeQueue(b *testing.B, s *Server, channel string, n int, body []byte) {
	const batch = 100
	msgs := make([]*kubemqpb.QueueMessage, batch)
	for sent := 0; sent < n; sent += batch {
		for i := range msgs {
			msgs[i] = &kubemqpb.QueueMessage{ClientID: "bench", Channel: channel, Body: append([]byte(nil), body...)}
		}
		res, _, lsn := s.sendBatch(msgs)
		if err := s.waitLog(lsn); err != nil {
			b.Fatal(err)
		}
		if res[0].IsError {
			b.Fatal(res[0].Error)
		}
	}
}

func benchStoredMemory(b *testing.B, persisted bool, n int) {
	opts := Options{Logger: zap.NewNop()}
	openOnly := false
	if persisted {
		opts.DataDir = b.TempDir()
		if *storedDir != "" {
			opts.DataDir = *storedDir
			segs, err := listSegments(*storedDir)
			if err != nil && !os.IsNotExist(err) {
				b.Fatal(err)
			}
			openOnly = len(segs) > 0
		}
	}
	runtime.GC()
	debug.FreeOSMemory()
	rss0 := vmRSS(b)
	var ms0 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	if openOnly {
		benchOpenStored(b, opts, n, rss0, &ms0)
		return
	}
	s, err := New(opts)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { // the server of the moment
		if s != nil {
			s.Stop()
		}
	}()
	body := make([]byte, 1024)
	for i := range body {
		body[i] = byte('a' + i%26)
	}
	start := time.Now()
	storeQueue(b, s, "stored", n, body)
	elapsed := time.Since(start)
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	rss := vmRSS(b)
	heap := float64(ms.HeapAlloc - ms0.HeapAlloc)
	b.ReportMetric(float64(n)/elapsed.Seconds(), "msg/s")
	b.ReportMetric(float64(rss-rss0)/(1<<20), "RSS-MiB")
	b.ReportMetric(heap/(1<<20), "heap-MiB")
	b.ReportMetric(float64(rss-rss0)/float64(n), "RSS-bytes/msg")
	b.ReportMetric(heap/float64(n), "heap-bytes/msg")
	b.ReportMetric(float64(s.MemoryUsed())/float64(n), "counted-bytes/msg")
	b.ReportMetric(float64(procStatus(b, "VmHWM:"))/(1<<20), "peak-RSS-MiB") // the whole process, so far
	if q := s.getQueue("stored", false); q == nil || q.count != int64(n) {
		b.Fatalf("stored %v messages, want %d", q, n)
	}
	if !persisted || *storedDir != "" {
		return // with -stored-dir the next run opens what this one stored
	}
	// The same after a restart: the index rebuilt from the log. The first server must not stay
	// reachable while the second recovers (its index would count in the restart's peak).
	s.Stop()
	s = nil
	runtime.GC()
	debug.FreeOSMemory()
	start = time.Now()
	s, err = New(opts)
	if err != nil {
		b.Fatal(err)
	}
	recovery := time.Since(start)
	runtime.GC()
	debug.FreeOSMemory()
	runtime.ReadMemStats(&ms)
	b.ReportMetric(recovery.Seconds(), "restart-s")
	b.ReportMetric(float64(vmRSS(b)-rss0)/(1<<20), "restart-RSS-MiB")
	b.ReportMetric(float64(ms.HeapAlloc-ms0.HeapAlloc)/(1<<20), "restart-heap-MiB")
	b.ReportMetric(float64(procStatus(b, "VmHWM:"))/(1<<20), "restart-peak-RSS-MiB")
	if q := s.getQueue("stored", false); q == nil || q.count != int64(n) {
		b.Fatalf("after restart %v messages, want %d", q, n)
	}
}

// benchOpenStored opens the data dir of opts, stored by an earlier run, in a process that has
// done nothing else, and reports the recovery time, the process's peak RSS (VmHWM: recovery is
// all it has done), its RSS right after recovery and after a GC, and the Go heap after a GC
// (RSS and heap against the process before the server started).
func benchOpenStored(b *testing.B, opts Options, n int, rss0 int64, ms0 *runtime.MemStats) {
	start := time.Now()
	s, err := New(opts)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Stop()
	recovery := time.Since(start)
	b.ReportMetric(recovery.Seconds(), "restart-s")
	b.ReportMetric(float64(n)/recovery.Seconds(), "restart-msg/s")
	b.ReportMetric(float64(procStatus(b, "VmHWM:"))/(1<<20), "restart-peak-RSS-MiB")
	b.ReportMetric(float64(vmRSS(b)-rss0)/(1<<20), "restart-RSS-at-open-MiB")
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	b.ReportMetric(float64(vmRSS(b)-rss0)/(1<<20), "restart-RSS-MiB")
	b.ReportMetric(float64(ms.HeapAlloc-ms0.HeapAlloc)/(1<<20), "restart-heap-MiB")
	if q := s.getQueue("stored", false); q == nil || q.count != int64(n) {
		b.Fatalf("after restart %v messages, want %d", q, n)
	}
}

// vmRSS is the process's resident set size in bytes (/proc/self/status).
func vmRSS(b *testing.B) int64 { return procStatus(b, "VmRSS:") }

// procStatus reads a size field of /proc/self/status in bytes.
func procStatus(b *testing.B, field string) int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		b.Skip("no /proc/self/status")
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				b.Fatal(fmt.Errorf("%s %q: %w", field, v, err))
			}
			return kb << 10
		}
	}
	b.Fatal("no " + field + " in /proc/self/status")
	return 0
}

var drainedMessages = flag.Int("drained", 200_000, "BenchmarkDrainMemory: how many 1 KiB messages to store and then drain")

// BenchmarkDrainMemory stores -drained 1 KiB queue messages, receives and settles every one
// (simple pull, 1,000 per call, as a consumer that keeps up would), then reads the Go heap
// once a second (after a GC) for up to 60 s. It reports the heap above the server's
// baseline (its heap before the first send) when the backlog is stored, right after the
// drain and after 60 s, and the seconds until the heap is back within 32 MiB of that
// baseline (the memory bound's target); it fails if it never is.
//
//	go test -run x -bench DrainMemory -benchtime 1x ./embedded
func BenchmarkDrainMemory(b *testing.B) {
	inMemoryAndDataDir(b, func(b *testing.B, persisted bool) { benchDrainMemory(b, persisted, *drainedMessages) })
}

func benchDrainMemory(b *testing.B, persisted bool, n int) {
	opts := Options{Logger: zap.NewNop()}
	if persisted {
		opts.DataDir = b.TempDir()
	}
	s, err := New(opts)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Stop()
	heap := func() float64 {
		runtime.GC()
		debug.FreeOSMemory()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return float64(ms.HeapAlloc) / (1 << 20)
	}
	base := heap()
	storeQueue(b, s, "drained", n, make([]byte, 1024))
	stored := heap()
	ctx := b.Context()
	for got := 0; got < n; {
		r, err := s.ReceiveQueueMessages(ctx, &kubemqpb.ReceiveQueueMessagesRequest{ClientID: "bench", Channel: "drained", MaxNumberOfMessages: 1000, WaitTimeSeconds: 1})
		if err != nil || r.IsError {
			b.Fatalf("receive after %d: %v %s", got, err, r.GetError())
		}
		if len(r.Messages) == 0 {
			b.Fatalf("the queue ran dry after %d of %d", got, n)
		}
		got += len(r.Messages)
	}
	drained := heap()
	start := time.Now()
	back := -1.0
	last := drained
	for time.Since(start) < 60*time.Second {
		if last-base <= 32 {
			back = time.Since(start).Seconds()
			break
		}
		time.Sleep(time.Second)
		last = heap()
	}
	b.ReportMetric(stored-base, "stored-heap-MiB")
	b.ReportMetric(drained-base, "drained-heap-MiB")
	b.ReportMetric(last-base, "final-heap-MiB")
	b.ReportMetric(back, "back-within-32MiB-s")
	if back < 0 {
		b.Errorf("60 s after draining %d messages the heap is %.1f MiB above its baseline (want at most 32)", n, last-base)
	}
}

// BenchmarkStoredEvents publishes -stored 1 KiB events to one events-store channel (straight to
// the server, no gRPC; the log awaited every 100 events) in an in-memory server and in one with
// a data directory, and reports the process's RSS and Go heap once they are stored (after a GC),
// per event and in total, and the rate at which a StartFromFirst subscription over gRPC replays
// them all; with a data dir also the restart time, the RSS and heap after it, and the replay rate
// after the restart (records read back from the segments). One case per process:
//
//	go test -run x -bench 'StoredEvents/data-dir' -benchtime 1x -stored 1000000 ./embedded
func BenchmarkStoredEvents(b *testing.B) {
	for _, persisted := range []bool{false, true} {
		name := "in-memory"
		if persisted {
			name = "data-dir"
		}
		b.Run(name, func(b *testing.B) {
			for range b.N {
				benchStoredEvents(b, persisted, *storedMessages)
			}
		})
	}
}

func benchStoredEvents(b *testing.B, persisted bool, n int) {
	opts := Options{Logger: zap.NewNop()}
	if persisted {
		opts.DataDir = b.TempDir()
	}
	runtime.GC()
	debug.FreeOSMemory()
	rss0 := vmRSS(b)
	var ms0 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	s, err := New(opts)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { s.Stop() }()
	body := make([]byte, 1024)
	for i := range body {
		body[i] = byte('a' + i%26)
	}
	start := time.Now()
	var lsn uint64
	for i := range n {
		res, l, msg := s.publish(&kubemqpb.Event{ClientID: "bench", Channel: "stored", Body: append([]byte(nil), body...), Store: true,
			Tags: map[string]string{"k": "v"}})
		if msg != "" || !res.Sent {
			b.Fatal(msg, res.Error)
		}
		lsn = l
		if i%100 == 99 || i == n-1 {
			if err := s.waitLog(lsn); err != nil {
				b.Fatal(err)
			}
		}
	}
	elapsed := time.Since(start)
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	rss := vmRSS(b)
	heap := float64(ms.HeapAlloc - ms0.HeapAlloc)
	b.ReportMetric(float64(n)/elapsed.Seconds(), "ev/s")
	b.ReportMetric(float64(rss-rss0)/(1<<20), "RSS-MiB")
	b.ReportMetric(heap/(1<<20), "heap-MiB")
	b.ReportMetric(float64(rss-rss0)/float64(n), "RSS-bytes/ev")
	b.ReportMetric(heap/float64(n), "heap-bytes/ev")
	b.ReportMetric(float64(procStatus(b, "VmHWM:"))/(1<<20), "peak-RSS-MiB")
	b.ReportMetric(replayRate(b, s, n), "replay-ev/s")
	if !persisted {
		return
	}
	s.Stop()
	runtime.GC()
	debug.FreeOSMemory()
	start = time.Now()
	s, err = New(opts)
	if err != nil {
		b.Fatal(err)
	}
	recovery := time.Since(start)
	runtime.GC()
	debug.FreeOSMemory()
	runtime.ReadMemStats(&ms)
	b.ReportMetric(recovery.Seconds(), "restart-s")
	b.ReportMetric(float64(vmRSS(b)-rss0)/(1<<20), "restart-RSS-MiB")
	b.ReportMetric(float64(ms.HeapAlloc-ms0.HeapAlloc)/(1<<20), "restart-heap-MiB")
	b.ReportMetric(replayRate(b, s, n), "restart-replay-ev/s")
}

// replayRate subscribes to s's channel "stored" from the first event over gRPC and reads all n
// events; it returns the rate.
func replayRate(b *testing.B, s *Server, n int) float64 {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go func() { _ = s.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := time.Now()
	sub, err := kubemqpb.NewKubemqClient(conn).SubscribeToEvents(ctx, &kubemqpb.Subscribe{
		SubscribeTypeData: kubemqpb.Subscribe_EventsStore, ClientID: fmt.Sprintf("replay-%d", time.Now().UnixNano()), Channel: "stored",
		EventsStoreTypeData: kubemqpb.Subscribe_StartFromFirst})
	if err != nil {
		b.Fatal(err)
	}
	for i := range n {
		ev, err := sub.Recv()
		if err != nil || ev.Sequence != uint64(i+1) || len(ev.Body) != 1024 || ev.Tags["k"] != "v" {
			b.Fatalf("replay %d: %v", i, err)
		}
	}
	return float64(n) / time.Since(start).Seconds()
}
