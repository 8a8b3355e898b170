package faults

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
)

// Timings of one fault run. The whole default suite (four runs) stays
// well under five minutes.
const (
	warmupDelivered = 600              // per protocol (3 s of load), before the fault
	unreachableFor  = 10 * time.Second // BackendUnreachable
	backendDownFor  = 3 * time.Second  // BackendKill: long enough for the proxy to notice
	pubsubStall     = 30 * time.Second // > 10 s ack deadline + one lease-record round
	amqpStall       = 15 * time.Second
	amqpStallHeld   = 20 // prefetch of the stalled AMQP consumer
	postFaultLoad   = 5 * time.Second
	recoverWithin   = 60 * time.Second
	settleWithin    = 90 * time.Second
)

// rate is each protocol's publish rate (messages per second).
func rate() int {
	if v, err := strconv.Atoi(os.Getenv("FAULTS_RATE")); err == nil && v > 0 {
		return v
	}
	return 200
}

// soakDuration is FAULTS_DURATION (0: no soak).
func soakDuration(t *testing.T) time.Duration {
	v := os.Getenv("FAULTS_DURATION")
	if v == "" {
		return 0
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < time.Minute {
		t.Fatalf("FAULTS_DURATION=%q: want a duration of at least 1m", v)
	}
	return d
}

// expectation is what clients must see during a fault.
type expectation struct {
	pubsubUnavailable bool   // at least one UNAVAILABLE
	amqpClose         string // "dropped": sockets drop (proxy killed); "320": proxy closes with 320; "": no close
}

type fault struct {
	name        string
	killBackend bool // impossible with an external server
	expect      expectation
	inject      func(t *testing.T, r *run) (end time.Time)
}

var faults = []fault{
	{
		name:   "ProxyKill",
		expect: expectation{pubsubUnavailable: true, amqpClose: "dropped"},
		inject: func(t *testing.T, r *run) time.Time {
			r.env.proxy.kill()
			r.env.startProxy() // same ports; returns once /readyz is 200
			return time.Now()
		},
	},
	{
		name:        "BackendKill",
		killBackend: true,
		expect:      expectation{pubsubUnavailable: true, amqpClose: "320"},
		inject: func(t *testing.T, r *run) time.Time {
			r.env.backend.kill()
			time.Sleep(backendDownFor) // the outage itself
			r.env.startBackend()       // same data dir; the relay follows the new port
			return time.Now()
		},
	},
	{
		name:   "BackendUnreachable",
		expect: expectation{pubsubUnavailable: true, amqpClose: "320"},
		inject: func(t *testing.T, r *run) time.Time {
			r.env.relay.Down()
			time.Sleep(unreachableFor) // the outage itself
			r.env.relay.Up()
			return time.Now()
		},
	},
	{
		name:   "ConsumerStall",
		expect: expectation{},
		inject: func(t *testing.T, r *run) time.Time {
			var wg sync.WaitGroup
			wg.Add(2)
			go func() {
				defer wg.Done()
				if err := r.ps.Stall(pubsubStall); err != nil {
					t.Errorf("pubsub stall: %v", err)
				}
			}()
			go func() {
				defer wg.Done()
				if err := r.am.Stall(amqpStall, amqpStallHeld); err != nil {
					t.Errorf("amqp stall: %v", err)
				}
			}()
			wg.Wait()
			return time.Now()
		},
	},
}

// run is one fault run's environment and load.
type run struct {
	env *env
	ps  *pubsubLoad
	am  *amqpLoad
}

// reportRow is one line of the final table.
type reportRow struct {
	fault, proto string
	s            summary
	recovered    time.Duration // fault end to first ack and delivery
	saw          string        // what the client saw during the fault
}

var (
	reportMu sync.Mutex
	report   []reportRow
	stats    []string
)

func addRow(r reportRow) {
	reportMu.Lock()
	report = append(report, r)
	reportMu.Unlock()
}

func addStats(format string, args ...any) {
	reportMu.Lock()
	stats = append(stats, fmt.Sprintf(format, args...))
	reportMu.Unlock()
}

func TestFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("fault injection builds the binary and runs for minutes")
	}
	proxyBinary(t)
	start := time.Now()
	t.Cleanup(func() { printReport(t, time.Since(start)) })
	for _, f := range faults {
		t.Run(f.name, func(t *testing.T) {
			if f.killBackend && os.Getenv("KUBEMQ_ADDRESS") != "" {
				t.Skipf("KUBEMQ_ADDRESS is set: the harness cannot kill and restart an external KubeMQ server; BackendUnreachable covers its outage through the relay")
			}
			runFault(t, f)
		})
	}
	if d := soakDuration(t); d > 0 {
		t.Run("Soak", func(t *testing.T) { runSoak(t, d) })
	}
}

func runFault(t *testing.T, f fault) {
	began := time.Now()
	e := newEnv(t)
	before, err := scrape(e.httpAddr)
	if err != nil {
		t.Fatal(err)
	}
	r := startLoad(t, e)
	waitWarm(t, r)
	during, err := scrape(e.httpAddr)
	if err != nil {
		t.Fatal(err)
	}

	t.Logf("%s: injecting", f.name)
	faultStart := time.Now()
	faultEnd := f.inject(t, r)
	recPS, recAM := waitRecovered(t, r, faultEnd)
	t.Logf("%s: fault lasted %v; pubsub recovered %v and amqp %v after its end", f.name,
		faultEnd.Sub(faultStart).Round(time.Millisecond), recPS.Round(time.Millisecond), recAM.Round(time.Millisecond))
	window := faultEnd.Add(max(recPS, recAM) + 2*time.Second)

	time.Sleep(postFaultLoad) // steady load after recovery
	r.ps.StopPublishing()
	r.am.StopPublishing()
	settleStart := time.Now()
	settle(t, r)
	t.Logf("%s: settled in %v", f.name, time.Since(settleStart).Round(time.Millisecond))
	r.ps.Close()
	r.am.Close()
	after, err := scrape(e.httpAddr)
	if err != nil {
		t.Error(err)
	}
	addStats("%-18s proxy before load: %v | during: %v | after: %v", f.name, before, during, after)

	psSaw := checkPubSub(t, r.ps, f.expect, began, faultStart, window)
	amSaw := checkAMQP(t, r.am, f.expect, faultStart, window)
	checkLedger(t, f.name, r.ps.led, recPS, psSaw)
	checkLedger(t, f.name, r.am.led, recAM, amSaw)
	if f.name == "ConsumerStall" {
		checkStall(t, r)
	}
	e.stop()
	t.Logf("%s: run took %v", f.name, time.Since(began).Round(time.Second))
}

func startLoad(t *testing.T, e *env) *run {
	t.Helper()
	ps, err := newPubSubLoad(e, rate())
	if err != nil {
		t.Fatal(err)
	}
	am, err := newAMQPLoad(e, rate())
	if err != nil {
		ps.Close()
		t.Fatal(err)
	}
	r := &run{env: e, ps: ps, am: am}
	ps.Start()
	am.Start()
	t.Cleanup(func() {
		// Idempotent with the normal path's Close: the loads end before
		// the processes are killed.
		r.ps.pubCancel()
		r.am.pubCancel()
		r.ps.Close()
		r.am.Close()
	})
	return r
}

// waitWarm waits until both protocols deliver steadily.
func waitWarm(t *testing.T, r *run) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ps, am := r.ps.led.Summary(), r.am.led.Summary()
		if ps.Delivered >= warmupDelivered && am.Delivered >= warmupDelivered {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no steady load after 30s: pubsub %+v; amqp %+v", ps, am)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitRecovered waits until each protocol has a publish acknowledged and a
// message delivered after the fault ended, and returns how long that took.
func waitRecovered(t *testing.T, r *run, end time.Time) (ps, am time.Duration) {
	t.Helper()
	deadline := end.Add(recoverWithin)
	for ps == 0 || am == 0 {
		if a, d := r.ps.led.Since(end); ps == 0 && a > 0 && d > 0 {
			ps = time.Since(end)
		}
		if a, d := r.am.led.Since(end); am == 0 && a > 0 && d > 0 {
			am = time.Since(end)
		}
		if time.Now().After(deadline) {
			t.Fatalf("clients did not recover within %v of the fault's end: pubsub recovered=%v, amqp recovered=%v", recoverWithin, ps != 0, am != 0)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return ps, am
}

func settle(t *testing.T, r *run) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), settleWithin)
	defer cancel()
	var wg sync.WaitGroup
	for _, l := range []*ledger{r.ps.led, r.am.led} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := l.waitSettled(ctx, t.Logf); err != nil {
				t.Errorf("%v (after %v)", err, settleWithin)
			}
		}()
	}
	wg.Wait()
}

// allowedCodes are what a Pub/Sub client may see during a fault: the
// documented UNAVAILABLE, its own cancellations and deadlines. INTERNAL or
// UNKNOWN would make clients treat a transient outage as a bug.
var allowedCodes = map[codes.Code]bool{codes.Unavailable: true, codes.Canceled: true, codes.DeadlineExceeded: true}

func checkPubSub(t *testing.T, l *pubsubLoad, x expectation, began, from, to time.Time) string {
	t.Helper()
	all := l.codes.Between(began, time.Now())
	for _, ev := range all {
		if !allowedCodes[ev.Code] {
			t.Errorf("pubsub: %s got %s: %s (want UNAVAILABLE, never INTERNAL/UNKNOWN or others)", ev.Method, ev.Code, ev.Msg)
		}
	}
	m, saw := countCodes(l.codes.Between(from, to))
	if x.pubsubUnavailable && m[codes.Unavailable] == 0 {
		t.Errorf("pubsub: no UNAVAILABLE seen during the fault (saw %s)", saw)
	}
	for _, err := range l.ReceiveErrors() {
		t.Errorf("pubsub: Receive gave up with %v: the client did not recover by itself", err)
	}
	return saw
}

func checkAMQP(t *testing.T, l *amqpLoad, x expectation, from, to time.Time) string {
	t.Helper()
	evs := l.events.Between(from, to)
	m, saw := countEvents(evs)
	for _, ev := range l.events.Between(time.Time{}, time.Now()) {
		bad := false
		switch {
		case ev.Kind == "channel":
			bad = true // a channel exception is never the documented outage signal
		case ev.Kind == "closed" && ev.Server && ev.Code != 320:
			bad = true
		case ev.Kind == "closed" && !ev.Server && x.amqpClose != "dropped":
			bad = true // the proxy was alive: it must close with 320, not drop the socket
		case ev.Kind == "closed" && x.amqpClose == "":
			bad = true
		}
		if bad {
			t.Errorf("amqp: %s %s at %s: code %d server=%v %q (expected %q)", ev.Who, ev.Kind, ev.At.Format("15:04:05.000"), ev.Code, ev.Server, ev.Reason, x.amqpClose)
		}
	}
	switch x.amqpClose {
	case "dropped":
		if m["closed:dropped"] == 0 {
			t.Errorf("amqp: no connection dropped while the proxy was killed (saw %s)", saw)
		}
	case "320":
		if m["closed:320"] == 0 {
			t.Errorf("amqp: no connection closed with 320 CONNECTION_FORCED during the outage (saw %s)", saw)
		}
	}
	return saw
}

func checkLedger(t *testing.T, fault string, l *ledger, recovered time.Duration, saw string) {
	t.Helper()
	s := l.Summary()
	addRow(reportRow{fault: fault, proto: l.proto, s: s, recovered: recovered, saw: saw})
	if s.Lost > 0 {
		t.Errorf("%s: %d acknowledged messages never delivered:\n%s", l.proto, s.Lost, l.LostDetail(20))
	}
	if s.Unknown > 0 || s.Corrupt > 0 {
		t.Errorf("%s: %d foreign and %d corrupt bodies delivered: %q", l.proto, s.Unknown, s.Corrupt, s.UnknownBodies[:min(5, len(s.UnknownBodies))])
	}
	if s.Acked == 0 {
		t.Errorf("%s: nothing acknowledged", l.proto)
	}
}

func checkStall(t *testing.T, r *run) {
	t.Helper()
	ps, am := r.ps.led.Summary(), r.am.led.Summary()
	addStats("ConsumerStall      pubsub: %d held by the stalled callback, %d redelivered (%d before it let go); amqp: %d held, %d redelivered (%d flagged redelivered, %d while still held)",
		ps.Held, ps.HeldRedelivered, ps.HeldRedeliveredEarly, am.Held, am.HeldRedelivered, am.HeldFlagged, am.HeldRedeliveredEarly)
	t.Logf("pubsub held: %s", r.ps.led.HeldDetail())
	t.Logf("amqp held: %s", r.am.led.HeldDetail())
	if ps.Held == 0 || am.Held == 0 {
		t.Errorf("the stalled consumers held nothing (pubsub %d, amqp %d)", ps.Held, am.Held)
	}
	// Pub/Sub: the ack deadline (10 s) expired long before the 30 s stall
	// ended, so the messages must have been redelivered while stalled,
	// not merely when the stalled subscriber went away.
	if ps.HeldRedeliveredEarly != ps.Held {
		t.Errorf("pubsub: only %d of %d messages held past their 10s ack deadline were redelivered during the %v stall", ps.HeldRedeliveredEarly, ps.Held, pubsubStall)
	}
	// AMQP has no ack deadline: a held delivery belongs to its channel
	// until the channel closes, then comes back flagged redelivered.
	if am.HeldRedeliveredEarly != 0 {
		t.Errorf("amqp: %d messages held unacked by an open channel were delivered to another consumer meanwhile", am.HeldRedeliveredEarly)
	}
	if am.HeldFlagged != am.Held {
		t.Errorf("amqp: %d of %d messages returned by the closed channel came back without the redelivered flag", am.Held-am.HeldFlagged, am.Held)
	}
}

func printReport(t *testing.T, took time.Duration) {
	reportMu.Lock()
	defer reportMu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "\nfault injection report (rate %d msg/s per protocol, race=%v, total %v)\n", rate(), raceEnabled, took.Round(time.Second))
	fmt.Fprintf(&b, "%-18s %-7s %7s %7s %7s %9s %5s %5s %6s %10s  %s\n", "fault", "proto", "sent", "acked", "failed", "delivered", "lost", "dup", "unres", "recovered", "client saw during the fault")
	for _, r := range report {
		fmt.Fprintf(&b, "%-18s %-7s %7d %7d %7d %9d %5d %5d %6d %10s  %s\n", r.fault, r.proto, r.s.Sent, r.s.Acked, r.s.Failed,
			r.s.Delivered, r.s.Lost, r.s.Duplicated, r.s.Pending, r.recovered.Round(10*time.Millisecond), r.saw)
	}
	for _, s := range stats {
		b.WriteString(s + "\n")
	}
	t.Log(b.String())
	report, stats = nil, nil
}
