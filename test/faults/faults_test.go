package faults

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/kubemq-io/kubemq-proxy/internal/proctest"
)

// Timings of one fault run. The whole default suite (four runs) stays
// well under five minutes.
const (
	warmupDelivered = 600              // per protocol (3 s of load), before the fault
	unreachableFor  = 10 * time.Second // BackendUnreachable
	backendDownFor  = 3 * time.Second  // BackendKill: long enough for the proxy to notice
	pubsubStall     = 30 * time.Second // > pubsubRedeliverWithin
	// pubsubRedeliverWithin: the 10 s ack deadline, one 10 s lease-record
	// round, 2 s slack.
	pubsubRedeliverWithin = 22 * time.Second
	amqpStall             = 15 * time.Second
	amqpStallHeld         = 20 // prefetch of the stalled AMQP consumer
	postFaultLoad         = 3 * time.Second
	recoverWithin         = 90 * time.Second
	settleWithin          = 90 * time.Second
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
	// proxyExits: the proxy process ends during the fault (FrozenShutdown gives up
	// at shutdown.timeout), so a socket dropped by its exit is expected too.
	proxyExits bool
}

type fault struct {
	name        string
	killBackend bool // impossible with an external server
	// freeze: the run SIGSTOPs its backend process (frozen_test.go): the
	// embedded one, or a real KubeMQ of its own started with KUBEMQ_SERVER.
	freeze bool
	expect expectation
	inject func(t *testing.T, r *run) (end time.Time)
}

var faults = []fault{
	{
		name:   "ProxyKill",
		expect: expectation{pubsubUnavailable: true, amqpClose: "dropped"},
		inject: func(t *testing.T, r *run) time.Time {
			r.env.proxy.Kill()
			r.env.startProxy() // same ports; returns once /readyz is 200
			return time.Now()
		},
	},
	{
		name:        "BackendKill",
		killBackend: true,
		expect:      expectation{pubsubUnavailable: true, amqpClose: "320"},
		inject: func(t *testing.T, r *run) time.Time {
			r.env.backend.Kill()
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
		name:   "BackendFrozen",
		freeze: true,
		expect: expectation{pubsubUnavailable: true, amqpClose: "320"},
		inject: injectFrozen,
	},
	{
		name:   "FrozenShutdown",
		freeze: true,
		// AMQP connections close with 320 at the outage, before the proxy is
		// stopped (one opened meanwhile may be dropped by its exit); Pub/Sub
		// clients see UNAVAILABLE, then the proxy gone.
		expect: expectation{pubsubUnavailable: true, amqpClose: "320", proxyExits: true},
		inject: injectFrozenShutdown,
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
				switch err := r.am.Stall(amqpStall, amqpStallHeld); {
				case errors.Is(err, errStallInterrupted):
					t.Logf("amqp stall: %v", err) // see checkStall
				case err != nil:
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
	recovered    recovery
	saw          string // what the client saw during the fault
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

func TestMain(m *testing.M) {
	proctest.Main(m)
}

func TestFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("fault injection builds the binary and runs for minutes")
	}
	proctest.Binary(t, proctest.Race)
	start := time.Now()
	t.Cleanup(func() { printReport(t, time.Since(start)) })
	// Each run has processes of its own, so runs may overlap (up to
	// -parallel, GOMAXPROCS by default); FAULTS_SERIAL=1 runs one at a time
	// (cleaner timings and logs when investigating).
	serial := os.Getenv("FAULTS_SERIAL") != ""
	for _, f := range faults {
		t.Run(f.name, func(t *testing.T) {
			if f.killBackend && os.Getenv("KUBEMQ_ADDRESS") != "" {
				t.Skipf("KUBEMQ_ADDRESS is set: the harness cannot kill and restart an external KubeMQ server; BackendUnreachable covers its outage through the relay")
			}
			if why := canFreeze(); f.freeze && why != "" {
				t.Skip(why)
			}
			if !serial {
				t.Parallel()
			}
			runFault(t, f)
		})
	}
	if d := soakDuration(t); d > 0 {
		t.Run("Soak", func(t *testing.T) {
			if !serial {
				t.Parallel()
			}
			runSoak(t, d)
		})
	}
}

func runFault(t *testing.T, f fault) {
	began := time.Now()
	e := newEnvWith(t, f.freeze && os.Getenv(envServer) != "")
	t.Logf("%s: processes up in %v: %v", f.name, time.Since(began).Round(time.Millisecond), e)
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
	t.Logf("%s: fault lasted %v; first ack/delivery after its end: pubsub %v, amqp %v", f.name,
		faultEnd.Sub(faultStart).Round(time.Millisecond), recPS, recAM)
	window := faultEnd.Add(max(recPS.ack, recPS.deliv, recAM.ack, recAM.deliv) + 2*time.Second)

	time.Sleep(postFaultLoad) // steady load after recovery
	stopStart := time.Now()
	stopPublishing(t, r)
	t.Logf("%s: publishers stopped in %v", f.name, time.Since(stopStart).Round(time.Millisecond))
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
		checkStall(t, r, faultStart, faultEnd)
	}
	stopStart = time.Now()
	e.stop()
	t.Logf("%s: processes stopped in %v; run took %v", f.name, time.Since(stopStart).Round(time.Millisecond), time.Since(began).Round(time.Second))
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

// recovery is how long after a fault's end a protocol had its first
// publish acknowledged and its first delivery.
type recovery struct{ ack, deliv time.Duration }

func (r recovery) done() bool { return r.ack > 0 && r.deliv > 0 }

func (r recovery) String() string {
	if !r.done() {
		return "-"
	}
	return fmt.Sprintf("%v/%v", r.ack.Round(10*time.Millisecond), r.deliv.Round(10*time.Millisecond))
}

func (r *recovery) observe(l *ledger, end time.Time) {
	a, d := l.Since(end)
	if r.ack == 0 && a > 0 {
		r.ack = time.Since(end)
	}
	if r.deliv == 0 && d > 0 {
		r.deliv = time.Since(end)
	}
}

// waitRecovered waits until each protocol has a publish acknowledged and a
// message delivered after the fault ended. The bound is generous: with its
// default settings the Pub/Sub publisher can need up to its 60 s publish
// timeout to send again, every handler slot being held by a batch asleep
// in its retry backoff (multiplier 4, up to 60 s) from the outage.
func waitRecovered(t *testing.T, r *run, end time.Time) (ps, am recovery) {
	t.Helper()
	deadline := end.Add(recoverWithin)
	for !ps.done() || !am.done() {
		ps.observe(r.ps.led, end)
		am.observe(r.am.led, end)
		if time.Now().After(deadline) {
			psA, psD := r.ps.led.Since(end)
			amA, amD := r.am.led.Since(end)
			t.Logf("proxy metrics:\n%s", metricLines(r.env.httpAddr))
			t.Fatalf("clients did not recover within %v of the fault's end: since then pubsub %d publishes acknowledged, %d deliveries; amqp %d acknowledged, %d deliveries",
				recoverWithin, psA, psD, amA, amD)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return ps, am
}

// stopPublishing ends both publishers at once and waits for every
// publish to resolve. The Pub/Sub publisher can take a while: a batch that
// failed during the fault sleeps in the client's default retry backoff
// (multiplier 4, up to 60 s) before its next attempt.
func stopPublishing(t *testing.T, r *run) {
	t.Helper()
	r.ps.pubCancel()
	r.am.pubCancel()
	start := time.Now()
	r.am.StopPublishing()
	amTook := time.Since(start)
	r.ps.StopPublishing()
	t.Logf("last publish resolved %v (amqp) and %v (pubsub) after the publishers stopped",
		amTook.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
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
		case ev.Kind == "closed" && !ev.Server && x.amqpClose != "dropped" && !x.proxyExits:
			bad = true // the proxy was alive: it must close with 320, not drop the socket
		case ev.Kind == "closed" && x.amqpClose == "" && ev.Server:
			// No outage was injected, yet the proxy reported one (a
			// health ping timed out, e.g. on a starved machine). It
			// behaved as documented for an outage; note it.
			t.Logf("amqp: %s closed with %d %q although no outage was injected", ev.Who, ev.Code, ev.Reason)
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

func checkLedger(t *testing.T, fault string, l *ledger, recovered recovery, saw string) {
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

func checkStall(t *testing.T, r *run, from, to time.Time) {
	t.Helper()
	// A backend outage reported during the stall (none is injected, but a
	// health ping can time out on a starved machine) drops every lease;
	// their records bring the messages back on the outage's schedule, so
	// the redelivery timings below do not apply. Loss is still checked.
	psCodes, _ := countCodes(r.ps.codes.Between(from, to))
	amEvents, _ := countEvents(r.am.events.Between(from, to))
	outage := psCodes[codes.Unavailable] > 0 || amEvents["closed:320"] > 0
	ps, am := r.ps.led.Summary(), r.am.led.Summary()
	if ps.Held == 0 || am.Held == 0 {
		t.Errorf("the stalled consumers held nothing (pubsub %d, amqp %d)", ps.Held, am.Held)
	}
	// Pub/Sub: a message whose 10 s ack deadline passed must be redelivered
	// (to either subscriber) while the callback still sleeps, not merely
	// when the stalled subscriber goes away: within the deadline plus one
	// lease-record round (10 s) and some slack of each receipt.
	due, late := r.ps.trace.Overdue(pubsubRedeliverWithin, r.ps.led.ReleasedAt())
	addStats("ConsumerStall      pubsub: %d messages reached the stalled subscriber, all %d back at the healthy one; %d of %d receipts past their deadline redelivered within %v | amqp: %d held, %d redelivered (%d flagged redelivered, %d while still held)",
		ps.Held, ps.HeldRedelivered, due-len(late), due, pubsubRedeliverWithin, am.Held, am.HeldRedelivered, am.HeldFlagged, am.HeldRedeliveredEarly)
	if outage {
		t.Logf("the proxy reported a backend outage during the stall (pubsub UNAVAILABLE=%d, amqp 320 closes=%d): redelivery timings not checked",
			psCodes[codes.Unavailable], amEvents["closed:320"])
		return
	}
	if due == 0 {
		t.Errorf("pubsub: no message outlived its ack deadline at the stalled subscriber during the %v stall", pubsubStall)
	}
	if len(late) > 0 {
		t.Logf("proxy metrics after the stall:\n%s", metricLines(r.env.httpAddr))
		var traces []string
		for _, id := range late[:min(5, len(late))] {
			traces = append(traces, id+":\n"+r.ps.trace.Trace(id))
		}
		t.Errorf("pubsub: %d messages past their 10s ack deadline at the stalled subscriber were not redelivered within %v while its callback slept (stall %v..%v); history of the first ones (times since the run's start):\n%s",
			len(late), pubsubRedeliverWithin, from.Sub(r.ps.trace.start).Round(time.Millisecond), r.ps.led.ReleasedAt().Sub(r.ps.trace.start).Round(time.Millisecond), strings.Join(traces, "\n"))
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
	fmt.Fprintf(&b, "\nfault injection report (rate %d msg/s per protocol, race=%v, total %v)\n", rate(), proctest.Race, took.Round(time.Second))
	fmt.Fprintf(&b, "%-18s %-7s %7s %7s %7s %9s %5s %5s %6s %15s  %s\n", "fault", "proto", "sent", "acked", "failed", "delivered", "lost", "dup", "unres", "recovered a/d", "client saw during the fault")
	order := map[string]int{}
	for i, f := range faults {
		order[f.name] = i
	}
	order["Soak"] = len(faults)
	sort.SliceStable(report, func(i, j int) bool { return order[report[i].fault] < order[report[j].fault] })
	sort.SliceStable(stats, func(i, j int) bool {
		return order[strings.Fields(stats[i])[0]] < order[strings.Fields(stats[j])[0]]
	})
	for _, r := range report {
		fmt.Fprintf(&b, "%-18s %-7s %7d %7d %7d %9d %5d %5d %6d %15s  %s\n", r.fault, r.proto, r.s.Sent, r.s.Acked, r.s.Failed,
			r.s.Delivered, r.s.Lost, r.s.Duplicated, r.s.Pending, r.recovered, r.saw)
	}
	b.WriteString("(acked: publish confirmed; failed: publish not confirmed, may still be delivered; delivered: unique ids a healthy consumer acked;\n" +
		" lost: acked but never delivered; dup: deliveries beyond the first; unres: publishes never resolved; recovered a/d: fault end to the first publish ack / first delivery)\n")
	for _, s := range stats {
		b.WriteString(s + "\n")
	}
	t.Log(b.String())
	report, stats = nil, nil
}
