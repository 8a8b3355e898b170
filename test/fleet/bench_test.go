package fleet

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"github.com/kubemq-io/kubemq-proxy/internal/proctest"
	amqp "github.com/rabbitmq/amqp091-go"
)

// BenchmarkFleet measures one KubeMQ queue served by 1, 2 and 3 replicas of one fleet (the
// others idle), for Pub/Sub and AMQP: the drain of a backlog and the steady publish-to-ack
// throughput, with benchConsumers consumers and as many publishers spread over the replicas in
// use; and what forwarding costs one consumer: alone on a replica that does not hold the queue
// against alone on the holder. It runs once whatever b.N (-benchtime=1x):
//
//	go test ./test/fleet/ -run '^$' -bench BenchmarkFleet -benchtime=1x
//
// FLEET_BENCH_MESSAGES sets the messages per measurement (default 10000); FLEET_BENCH_PROTO
// (pubsub or amqp) measures one protocol only; FLEET_BENCH_FORWARD_ONLY=1 runs only the
// forwarding measurement; FLEET_BENCH_PROFILE=DIR writes CPU profiles of the holder, the
// forwarding replica and the embedded backend, taken while each consumer drains, into DIR (for
// FLEET_BENCH_PROFILE_SECONDS, default 2). FLEET_BENCH_PIN=1
// pins the forwarding measurement's processes (taskset, two processors or more): the holder,
// the backend and this process (the clients) to processor 0 in both runs, the forwarding
// replica to processor 1, so that the holder has the same processor time with and without
// forwarding, as when the forwarding replica is another machine's (a pod elsewhere).
func BenchmarkFleet(b *testing.B) {
	n := 10000
	if v := os.Getenv("FLEET_BENCH_MESSAGES"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n <= 0 {
			b.Fatalf("FLEET_BENCH_MESSAGES=%q: want a positive integer", v)
		}
	}
	f := newFleet(b, 3)
	b.ResetTimer()
	var table strings.Builder
	fmt.Fprintf(&table, "%-7s %-8s %10s %10s %10s %8s %8s\n", "proto", "measure", "1 replica", "2 replicas", "3 replicas", "2/1", "3/1")
	protos := []string{"pubsub", "amqp"}
	if p := os.Getenv("FLEET_BENCH_PROTO"); p != "" {
		protos = []string{p}
	}
	forwardOnly := os.Getenv("FLEET_BENCH_FORWARD_ONLY") == "1"
	for _, proto := range protos {
		for _, steady := range []bool{false, true} {
			if forwardOnly {
				break
			}
			measure := "drain"
			if steady {
				measure = "steady"
			}
			rates := make([]float64, 3)
			for k := 1; k <= 3; k++ {
				rates[k-1] = f.benchRun(b, proto, f.replicas[:k], n, steady)
				b.ReportMetric(rates[k-1], fmt.Sprintf("%s-%s-%dr-msg/s", proto, measure, k))
				if k > 1 {
					b.ReportMetric(rates[k-1]/rates[0], fmt.Sprintf("%s-%s-%dr/1r", proto, measure, k))
				}
			}
			fmt.Fprintf(&table, "%-7s %-8s %10.0f %10.0f %10.0f %8.2f %8.2f\n", proto, measure, rates[0], rates[1], rates[2], rates[1]/rates[0], rates[2]/rates[0])
		}
		own, fwd, perMsg, cpu := f.benchForward(b, proto, n)
		b.ReportMetric(own, proto+"-owner-msg/s")
		b.ReportMetric(fwd, proto+"-forwarded-msg/s")
		b.ReportMetric(fwd/own, proto+"-forwarded/owner")
		fmt.Fprintf(&table, "%-7s one consumer: on the holder %.0f msg/s, forwarded %.0f msg/s (%.2f)\n", proto, own, fwd, fwd/own)
		if cpu[0].holder > 0 {
			b.ReportMetric(cpu[1].holder/cpu[0].holder, proto+"-holder-cpu-forwarded/own")
			fmt.Fprintf(&table, "%-7s CPU per message: the holder %.1f µs serving its own consumer, %.1f µs serving the forwarded one (%.2f); the forwarding replica %.1f µs; the backend %.1f and %.1f µs\n",
				proto, cpu[0].holder, cpu[1].holder, cpu[1].holder/cpu[0].holder, cpu[1].forwarder, cpu[0].backend, cpu[1].backend)
		}
		if proto == "amqp" {
			b.ReportMetric(perMsg, "amqp-link-requests/msg")
			fmt.Fprintf(&table, "%-7s link requests (credit and settle) the holder received per forwarded delivery: %.3f\n", proto, perMsg)
		}
		peak, heap := f.memory(b)
		b.ReportMetric(peak/(1<<20), proto+"-max-peak-rss-MiB")
		b.ReportMetric(heap/(1<<20), proto+"-max-heap-MiB")
		fmt.Fprintf(&table, "%-7s memory after it: peak RSS so far %.0f MiB, Go heap in use %.0f MiB (the largest replica's)\n", proto, peak/(1<<20), heap/(1<<20))
	}
	b.StopTimer()
	fmt.Printf("BenchmarkFleet: %d messages of 1 KiB per measurement, %d consumers and publishers, backend %s\n%s", n, benchConsumers, f.kubemq, table.String())
	f.checkProblems()
}

// memory returns the largest peak RSS (VmHWM) and Go heap in use among the replicas.
func (f *fleet) memory(b *testing.B) (peak, heap float64) {
	for _, r := range f.replicas {
		peak = max(peak, r.p.PeakRSS())
		heap = max(heap, scrape(b, r).Heap())
	}
	return peak, heap
}

// benchConsumers consumers (and publishers) run on the replicas in use, in turn.
const benchConsumers = 3

var benchSeq int

// benchTarget creates a fresh subscription (with its topic) or queue known to rs; key names
// its KubeMQ queue for holder.
func (f *fleet) benchTarget(b *testing.B, proto string, rs []*replica) (topic, target, key string) {
	benchSeq++
	name := fmt.Sprintf("bench-%s-%03d", f.suffix, benchSeq)
	if proto == "pubsub" {
		topic, target = f.setupSub(b, name, nil)
		return topic, target, f.subQueue(b, target)
	}
	return "", f.declareQueue(b, name, rs), "." + name
}

// benchRun measures one drain (a backlog of n, the consumers started before and held back
// until the clock starts) or one steady run (n messages published while consumed): n divided
// by the time until all n were acked.
func (f *fleet) benchRun(b *testing.B, proto string, rs []*replica, n int, steady bool) float64 {
	topic, target, key := f.benchTarget(b, proto, rs)
	l := newLedger()
	gate := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for i := range benchConsumers {
		benchConsume(ctx, b, &wg, proto, rs[i%len(rs)], target, l, gate, -1)
		if i == 0 {
			f.holder(b, key, 30*time.Second) // the first consumer's replica holds it
		}
	}
	var start time.Time
	if steady {
		close(gate)
		start = time.Now()
		benchPublish(b, proto, rs, topic, target, n)
	} else {
		benchPublish(b, proto, rs, topic, target, n)
		time.Sleep(time.Second)
		start = time.Now()
		close(gate)
	}
	l.waitFor(b, n, 10*time.Minute)
	took := time.Since(start)
	cancel()
	wg.Wait()
	l.mu.Lock()
	dups := 0
	for _, c := range l.deliveries {
		dups += c - 1
	}
	l.mu.Unlock()
	what := "drain"
	if steady {
		what = "steady"
	}
	b.Logf("%s %s, %d replica(s): %d messages in %v (%.0f msg/s), %d duplicates", proto, what, len(rs), n, took.Round(time.Millisecond), float64(n)/took.Seconds(), dups)
	return float64(n) / took.Seconds()
}

// cpuPerMsg is the processor time each process spent per message of a measurement, in µs (0
// for a process not involved or not ours: an external KubeMQ).
type cpuPerMsg struct{ holder, forwarder, backend float64 }

// benchForward drains a backlog of n with one consumer on the holder, then with one consumer
// on another replica while the holder keeps the queue through a consumer that holds one message
// (present in both runs). For AMQP, perMsg is the credit and settle requests the holder
// received per forwarded delivery. cpu is each run's processor time per message: what the
// holder spends per message served to a forwarded consumer against one of its own says what
// forwarding costs it, apart from the machine's other processes (the forwarding replica, the
// backend and the clients share its processors here).
func (f *fleet) benchForward(b *testing.B, proto string, n int) (own, fwd, perMsg float64, cpu [2]cpuPerMsg) {
	h := f.replicas[0]
	prevEnd := time.Now() // the measurement before this one (drain, steady) ended about now
	for i, on := range []*replica{h, f.replicas[1]} {
		topic, target, key := f.benchTarget(b, proto, f.replicas)
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		idle := newLedger()
		benchConsume(ctx, b, &wg, proto, h, target, idle, nil, 1)
		if got := f.holder(b, key, 30*time.Second); got != h {
			b.Fatalf("%s holds %s, want %s", got.name, target, h.name)
		}
		benchPublish(b, proto, f.replicas, topic, target, n)
		idle.waitFor(b, 1, time.Minute)
		l := newLedger()
		gate := make(chan struct{})
		benchConsume(ctx, b, &wg, proto, on, target, l, gate, -1)
		time.Sleep(2 * time.Second)
		// KubeMQ releases the lease records of the run or measurement before (into its queue)
		// record_delay after they were stored: let it before the clock starts, or the backend's
		// work for them falls into this run (measured: 3-8 µs more backend CPU per message in
		// the second run, on the processor the holder has).
		time.Sleep(time.Until(prevEnd.Add(recordDelay + time.Second)))
		before := linkRequests(b, h)
		unpin := f.pin(b, h, on)
		callsBefore, onBefore := scrape(b, h), scrape(b, on)
		cpuHolder, cpuOn, cpuBackend := h.p.CPU(), on.p.CPU(), f.backendCPU()
		start := time.Now()
		close(gate)
		profiled := f.profileDuring(b, proto, i, []*replica{h, on})
		l.waitFor(b, n-1, 10*time.Minute)
		took := time.Since(start)
		prevEnd = time.Now()
		perUS := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(n-1) }
		cpu[i].holder = perUS(h.p.CPU() - cpuHolder)
		if on != h {
			cpu[i].forwarder = perUS(on.p.CPU() - cpuOn)
		}
		if f.backend != nil {
			cpu[i].backend = perUS(f.backendCPU() - cpuBackend)
		}
		unpin()
		b.Logf("%s run %d: the holder's KubeMQ calls per message: %s", proto, i, callsPerMsg(callsBefore, scrape(b, h), n-1))
		if on != h {
			b.Logf("%s run %d: the forwarding replica's KubeMQ calls per message: %s", proto, i, callsPerMsg(onBefore, scrape(b, on), n-1))
		}
		profiled()
		if i == 1 {
			perMsg = (linkRequests(b, h) - before) / float64(n-1)
		}
		cancel()
		wg.Wait()
		rate := float64(n-1) / took.Seconds()
		where := "on the holder"
		if i == 0 {
			own = rate
		} else {
			fwd = rate
			where = "forwarded from " + on.name
		}
		b.Logf("%s one consumer %s: %d messages in %v (%.0f msg/s)", proto, where, n-1, took.Round(time.Millisecond), rate)
	}
	return own, fwd, perMsg, cpu
}

// pin applies FLEET_BENCH_PIN (see BenchmarkFleet) to one forwarding run: holder h, the backend
// and this process on processor 0, on (when not h) on processor 1. The returned func gives every
// process all processors again.
func (f *fleet) pin(b *testing.B, h, on *replica) func() {
	if os.Getenv("FLEET_BENCH_PIN") != "1" {
		return func() {}
	}
	cpus := runtime.NumCPU()
	if cpus < 2 {
		b.Fatal("FLEET_BENCH_PIN needs two processors or more")
	}
	pids := []int{os.Getpid(), h.p.Pid()}
	if f.backend != nil {
		pids = append(pids, f.backend.Pid())
	}
	set := func(pid int, list string) {
		// -a: every thread of the process (threads started later inherit it).
		if out, err := exec.Command("taskset", "-a", "-p", "-c", list, strconv.Itoa(pid)).CombinedOutput(); err != nil {
			b.Fatalf("taskset %s %d: %v: %s", list, pid, err, out)
		}
	}
	for _, pid := range pids {
		set(pid, "0")
	}
	if on != h {
		set(on.p.Pid(), "1")
		pids = append(pids, on.p.Pid())
	}
	return func() {
		for _, pid := range pids {
			set(pid, fmt.Sprintf("0-%d", cpus-1))
		}
	}
}

// backendCPU is the embedded backend process's processor time so far; 0 on an external KubeMQ.
func (f *fleet) backendCPU() time.Duration {
	if f.backend == nil {
		return 0
	}
	return f.backend.CPU()
}

// scrape reads r's metrics, failing b when it cannot.
func scrape(b *testing.B, r *replica) proctest.Metrics {
	m, err := proctest.Scrape(r.addr("http"))
	if err != nil {
		b.Fatalf("%s: %v", r.name, err)
	}
	return m
}

// callsPerMsg describes the KubeMQ calls a replica made between two scrapes, per message, by
// operation (kubemq_proxy_backend_call_seconds_count).
func callsPerMsg(before, after proctest.Metrics, n int) string {
	const prefix = "kubemq_proxy_backend_call_seconds_count{"
	var parts []string
	for series, v := range after {
		if strings.HasPrefix(series, prefix) {
			if d := v - before[series]; d > 0 {
				parts = append(parts, fmt.Sprintf("%s %.4f", strings.TrimSuffix(strings.TrimPrefix(series, prefix), "}"), d/float64(n)))
			}
		}
	}
	slices.Sort(parts)
	return strings.Join(parts, ", ")
}

// linkRequests is the credit and settle requests r received from other replicas' AMQP links.
func linkRequests(b *testing.B, r *replica) float64 {
	m := scrape(b, r)
	const name = "kubemq_proxy_amqp_peer_link_requests_total"
	return m[name+`{kind="credit"}`] + m[name+`{kind="settle"}`]
}

// benchConsume runs one consumer of target on r until ctx ends; it acks nothing before gate
// closes. hold >= 0 makes it a consumer that keeps its first message unacked (and, for Pub/Sub,
// gives back any other): hold is then its prefetch.
func benchConsume(ctx context.Context, b *testing.B, wg *sync.WaitGroup, proto string, r *replica, target string, l *ledger, gate chan struct{}, hold int) {
	wg.Add(1)
	if proto == "pubsub" {
		s := r.pubsub(b).Subscriber(target)
		s.ReceiveSettings.MaxOutstandingMessages = 100
		if hold >= 0 {
			s.ReceiveSettings.MaxOutstandingMessages = hold
		}
		s.ReceiveSettings.NumGoroutines = 1
		var once sync.Once
		go func() {
			defer wg.Done()
			err := s.Receive(ctx, func(cctx context.Context, m *pubsub.Message) {
				if hold >= 0 {
					kept := false
					once.Do(func() { kept = true })
					if kept {
						l.deliver(m.Attributes["n"], r.name)
						<-cctx.Done() // the client's shutdown waits for it
						m.Nack()
						return
					}
					m.Nack()
					return
				}
				select {
				case <-gate:
				case <-cctx.Done():
					return
				}
				l.deliver(m.Attributes["n"], r.name)
				m.Ack()
			})
			if err != nil && ctx.Err() == nil {
				b.Errorf("%s: Receive: %v", r.name, err)
			}
		}()
		return
	}
	c, err := amqp.Dial(r.amqpURL())
	if err != nil {
		b.Fatal(err)
	}
	ch, err := c.Channel()
	if err != nil {
		b.Fatal(err)
	}
	prefetch := 100
	if hold >= 0 {
		prefetch = hold
	}
	if err := ch.Qos(prefetch, 0, false); err != nil {
		b.Fatal(err)
	}
	ds, err := ch.ConsumeWithContext(ctx, target, "", false, false, false, false, nil)
	if err != nil {
		b.Fatal(err)
	}
	go func() {
		defer wg.Done()
		defer c.Close()
		if hold < 0 {
			select {
			case <-gate:
			case <-ctx.Done():
				return
			}
		}
		for {
			select {
			case d, ok := <-ds:
				if !ok {
					if ctx.Err() == nil {
						b.Errorf("%s: deliveries ended", r.name)
					}
					return
				}
				l.deliver(d.MessageId, r.name)
				if hold < 0 {
					if err := d.Ack(false); err != nil {
						b.Errorf("%s: ack: %v", r.name, err)
						return
					}
				}
			case <-ctx.Done():
				_ = ch.Close()
				return
			}
		}
	}()
}

// benchPublish sends n 1 KiB messages with benchConsumers publishers spread over rs, each a
// share of them, concurrently; it returns once all are confirmed.
func benchPublish(b *testing.B, proto string, rs []*replica, topic, target string, n int) {
	var wg sync.WaitGroup
	body := make([]byte, 1024)
	for p := range benchConsumers {
		r := rs[p%len(rs)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := func(i int) string { return strconv.Itoa(i) }
			if proto == "pubsub" {
				pub := r.pubsub(b).Publisher(topic)
				pub.PublishSettings.CountThreshold = 100
				defer pub.Stop()
				var results []*pubsub.PublishResult
				for i := p; i < n; i += benchConsumers {
					results = append(results, pub.Publish(context.Background(), &pubsub.Message{Data: body, Attributes: map[string]string{"n": id(i)}}))
				}
				for _, res := range results {
					if _, err := res.Get(context.Background()); err != nil {
						b.Errorf("publish: %v", err)
						return
					}
				}
				return
			}
			c, err := amqp.Dial(r.amqpURL())
			if err != nil {
				b.Error(err)
				return
			}
			defer c.Close()
			ch, err := c.Channel()
			if err == nil {
				err = ch.Confirm(false)
			}
			if err != nil {
				b.Error(err)
				return
			}
			var pending []*amqp.DeferredConfirmation
			wait := func() bool {
				for _, d := range pending {
					if ok, err := d.WaitContext(context.Background()); !ok || err != nil {
						b.Errorf("publish not confirmed: %v %v", ok, err)
						return false
					}
				}
				pending = pending[:0]
				return true
			}
			for i := p; i < n; i += benchConsumers {
				d, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", target, false, false,
					amqp.Publishing{MessageId: id(i), Body: body, DeliveryMode: amqp.Persistent})
				if err != nil {
					b.Errorf("publish: %v", err)
					return
				}
				pending = append(pending, d)
				if len(pending) >= 300 && !wait() {
					return
				}
			}
			wait()
		}()
	}
	wg.Wait()
	if b.Failed() {
		b.FailNow()
	}
}

// profileDuring starts CPU profiles of rs and of the embedded backend (for as long as
// FLEET_BENCH_PROFILE_SECONDS says, default 2 s, through their /debug/pprof/profile) when
// FLEET_BENCH_PROFILE names a directory; the function it returns waits for them.
func (f *fleet) profileDuring(b *testing.B, proto string, run int, rs []*replica) func() {
	dir := os.Getenv("FLEET_BENCH_PROFILE")
	if dir == "" {
		return func() {}
	}
	secs := "2"
	if v := os.Getenv("FLEET_BENCH_PROFILE_SECONDS"); v != "" {
		secs = v
	}
	targets := map[string]string{}
	for k, r := range rs {
		if run == 0 && k > 0 {
			break
		}
		targets[r.name] = r.addr("http")
	}
	if f.backend != nil {
		targets["backend"] = f.backend.Addr("http")
	}
	var wg sync.WaitGroup
	for name, addr := range targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body, err := proctest.Get("http://" + addr + "/debug/pprof/profile?seconds=" + secs)
			if err != nil {
				b.Errorf("profile of %s: %v", name, err)
				return
			}
			path := filepath.Join(dir, fmt.Sprintf("%s-run%d-%s.pprof", proto, run, name))
			if err := os.WriteFile(path, body, 0o644); err != nil {
				b.Error(err)
			}
		}()
	}
	return wg.Wait
}
