package faults

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	amqp "github.com/rabbitmq/amqp091-go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/kubemq-io/kubemq-proxy/internal/kubemqtest"
)

// envServer names a kubemq-server script (`start DIR` prints host:port and
// writes the server's pid to DIR/pid, `stop DIR`): when set, the runs that
// freeze the backend start a real KubeMQ of their own with it and freeze that
// process; otherwise they freeze the embedded backend process.
const envServer = "KUBEMQ_SERVER"

// Timings of the frozen-backend runs.
const (
	frozenFor = 10 * time.Second // BackendFrozen: SIGSTOP to SIGCONT
	// outageDetection is the proxy's kubemq.outage_detection default, which the
	// runs keep. Readiness must drop within twice it: the bound plus the slack a
	// loaded two-core machine needs (the figure itself is reported).
	outageDetection = 2 * time.Second
	// shutdownTimeout is the proxy's shutdown.timeout default; FrozenShutdown
	// allows it plus 10 s for the exit (the -race binary's start of teardown,
	// process exit).
	shutdownTimeout = 15 * time.Second
	probeEvery      = 50 * time.Millisecond
)

// canFreeze reports why the backend of a run cannot be frozen ("" when it can).
func canFreeze() string {
	if os.Getenv(envServer) == "" && kubemqtest.External() {
		return "KUBEMQ_ADDRESS is set: the harness cannot SIGSTOP an external server; set " + envServer + " to a kubemq-server script for a real KubeMQ of the run's own"
	}
	return ""
}

// startRealServer starts a real KubeMQ with the KUBEMQ_SERVER script in the
// run's directory and returns its address.
func (e *env) startRealServer() string {
	e.t.Helper()
	e.realDir = filepath.Join(e.dir, "real-kubemq")
	out, err := exec.Command(os.Getenv(envServer), "start", e.realDir).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, ee.Stderr)
		}
		e.realDir = ""
		e.t.Fatalf("%s start: %v", envServer, err)
	}
	lines := strings.Fields(strings.TrimSpace(string(out)))
	if len(lines) == 0 {
		e.t.Fatalf("%s start printed no address", envServer)
	}
	return lines[len(lines)-1]
}

// stopRealServer resumes (a stopped process cannot act on SIGTERM) and stops
// the run's real server.
func (e *env) stopRealServer() {
	e.signalBackend(syscall.SIGCONT)
	if out, err := exec.Command(os.Getenv(envServer), "stop", e.realDir).CombinedOutput(); err != nil {
		e.t.Logf("%s stop: %v: %s", envServer, err, out)
	}
	e.realDir = ""
}

// signalBackend sends sig to the run's own backend process: the real server
// (its pid file) or the embedded one. For SIGSTOP it returns once every thread
// of the process is stopped: kill(2) only queues the signal, and a request
// that reaches the backend in the moments before its threads stop is still
// answered, so a probe sent right after the call could otherwise be acked.
func (e *env) signalBackend(sig syscall.Signal) error {
	pid, err := e.backendPid()
	if err != nil {
		return err
	}
	if err := syscall.Kill(pid, sig); err != nil {
		return err
	}
	if sig == syscall.SIGSTOP {
		return waitStopped(pid, 5*time.Second)
	}
	return nil
}

// backendPid is the process id of the run's own backend.
func (e *env) backendPid() (int, error) {
	if e.realDir != "" {
		raw, err := os.ReadFile(filepath.Join(e.realDir, "pid"))
		if err != nil {
			return 0, err
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
		if err != nil {
			return 0, fmt.Errorf("pid file: %w", err)
		}
		return pid, nil
	}
	if e.backend != nil {
		return e.backend.Pid(), nil
	}
	return 0, errors.New("the run has no backend process of its own")
}

// waitStopped polls /proc until every thread of pid is in the stopped state
// ("T"), for at most d.
func waitStopped(pid int, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		running, err := runningThreads(pid)
		if err != nil {
			return err
		}
		if running == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("process %d: %d threads still not stopped %v after SIGSTOP", pid, running, d)
		}
		time.Sleep(time.Millisecond)
	}
}

// runningThreads counts the threads of pid whose state is not "T" (stopped).
func runningThreads(pid int) (int, error) {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	running := 0
	for _, task := range tasks {
		raw, err := os.ReadFile(filepath.Join(dir, task.Name(), "stat"))
		if err != nil {
			continue // the thread exited
		}
		// The state follows the command name, which is in parentheses and
		// may itself hold spaces or parentheses.
		stat := string(raw)
		i := strings.LastIndexByte(stat, ')')
		if i < 0 || i+2 >= len(stat) {
			return 0, fmt.Errorf("%s/%s/stat: unexpected format", dir, task.Name())
		}
		if stat[i+2] != 'T' {
			running++
		}
	}
	return running, nil
}

// readyz returns the proxy's /readyz status code (0 when it does not answer).
func readyz(httpAddr string) int {
	hc := http.Client{Timeout: time.Second}
	resp, err := hc.Get("http://" + httpAddr + "/readyz")
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// waitReadyz polls /readyz every 10 ms until it answers want, for at most d;
// it returns how long that took, or false.
func waitReadyz(httpAddr string, want int, since time.Time, d time.Duration) (time.Duration, bool) {
	for time.Since(since) < d {
		if readyz(httpAddr) == want {
			return time.Since(since), true
		}
		time.Sleep(10 * time.Millisecond)
	}
	return 0, false
}

// probeResult is one probe publish: when it was sent and when and how it was
// answered. outcome is "ok" (Pub/Sub id) or "ack", "nack", a gRPC code name,
// "closed" (no confirm before the AMQP connection closed) or "unanswered".
type probeResult struct {
	sent, done time.Time
	outcome    string
}

// probes publish one message every probeEvery on each protocol, on a topic
// and a queue of their own (the load's ledgers never see them), each publish
// on its own: a Pub/Sub Publish RPC without client retries (30 s deadline)
// and an AMQP publish with confirms on one connection, until that connection
// closes. They show what a single publish meets during the outage.
type probes struct {
	stop chan struct{}
	wg   sync.WaitGroup

	mu       sync.Mutex // guards the fields below
	ps, am   []*probeResult
	amClosed time.Time // the AMQP probe connection's close
	amReason string
}

func startProbes(t *testing.T, e *env) *probes {
	t.Helper()
	p := &probes{stop: make(chan struct{})}
	cc, err := grpc.NewClient(e.gcpAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	topic := "projects/faults-" + e.suffix + "/topics/probe-" + e.suffix
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pub := pubsubpb.NewPublisherClient(cc)
	if _, err := pub.CreateTopic(ctx, &pubsubpb.Topic{Name: topic}); err != nil {
		t.Fatalf("probe topic: %v", err)
	}
	conn, err := amqp.Dial("amqp://guest:guest@" + e.amqpAddr + "/")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	queue := "faults-probe-" + e.suffix
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 4096))
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	byTag := map[uint64]*probeResult{}

	p.wg.Add(2)
	go func() { // Pub/Sub: one goroutine per publish, so a hanging one holds up nothing
		defer p.wg.Done()
		var wg sync.WaitGroup
		defer wg.Wait()
		tick := time.NewTicker(probeEvery)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-p.stop:
				return
			case <-tick.C:
			}
			r := &probeResult{sent: time.Now(), outcome: "unanswered"}
			p.mu.Lock()
			p.ps = append(p.ps, r)
			p.mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				_, err := pub.Publish(ctx, &pubsubpb.PublishRequest{Topic: topic, Messages: []*pubsubpb.PubsubMessage{{Data: []byte("probe " + strconv.Itoa(i))}}})
				p.mu.Lock()
				r.done, r.outcome = time.Now(), "ok"
				if err != nil {
					r.outcome = status.Code(err).String()
				}
				p.mu.Unlock()
			}()
		}
	}()
	go func() { // AMQP: publish until the connection closes; confirms resolve by delivery tag
		defer p.wg.Done()
		tick := time.NewTicker(probeEvery)
		defer tick.Stop()
		for {
			select {
			case <-p.stop:
				return
			case c, ok := <-confirms:
				if !ok {
					confirms = nil
					continue
				}
				p.mu.Lock()
				if r := byTag[c.DeliveryTag]; r != nil {
					r.done, r.outcome = time.Now(), map[bool]string{true: "ack", false: "nack"}[c.Ack]
				}
				p.mu.Unlock()
			case e := <-closed:
				p.mu.Lock()
				p.amClosed = time.Now()
				if e != nil {
					p.amReason = fmt.Sprintf("%d %s", e.Code, e.Reason)
				}
				p.mu.Unlock()
				closed = nil
				// Confirms already read are in; what is left unanswered was
				// not confirmed before the close. The library closes the
				// confirms after it reports the close, but this select may
				// have taken that closed channel first (confirms is nil then:
				// ranging over it would block for ever).
				for c := range orClosed(confirms) {
					p.mu.Lock()
					if r := byTag[c.DeliveryTag]; r != nil {
						r.done, r.outcome = time.Now(), map[bool]string{true: "ack", false: "nack"}[c.Ack]
					}
					p.mu.Unlock()
				}
				p.mu.Lock()
				for _, r := range p.am {
					if r.outcome == "unanswered" {
						r.outcome = "closed"
					}
				}
				p.mu.Unlock()
				<-p.stop
				return
			case <-tick.C:
				if closed == nil {
					continue
				}
				tag := ch.GetNextPublishSeqNo()
				r := &probeResult{sent: time.Now(), outcome: "unanswered"}
				err := ch.PublishWithContext(context.Background(), "", queue, false, false, amqp.Publishing{DeliveryMode: amqp.Persistent, Body: []byte("probe")})
				if err != nil {
					continue // closing: not sent
				}
				p.mu.Lock()
				byTag[tag] = r
				p.am = append(p.am, r)
				p.mu.Unlock()
			}
		}
	}()
	return p
}

// orClosed returns c, or a closed channel when c is nil.
func orClosed(c chan amqp.Confirmation) chan amqp.Confirmation {
	if c == nil {
		c = make(chan amqp.Confirmation)
		close(c)
	}
	return c
}

// Stop ends the probes; a probe still blocked after 40 s (a Pub/Sub publish
// has a 30 s deadline; an AMQP publish cannot be cancelled once written) is
// reported and left behind.
func (p *probes) Stop(t *testing.T) {
	close(p.stop)
	done := make(chan struct{})
	go func() { p.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(40 * time.Second):
		t.Errorf("probe publishes still blocked 40s after the probes stopped; the test's goroutines:\n%s", probeStacks())
	}
}

// probeStacks returns the stacks of this test binary's goroutines that run
// test code or a client library, so a probe that never returns shows where.
func probeStacks() string {
	buf := make([]byte, 1<<22)
	buf = buf[:runtime.Stack(buf, true)]
	var keep []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "test/faults") || strings.Contains(g, "amqp091-go") || strings.Contains(g, "pubsubpb") {
			keep = append(keep, g)
		}
	}
	return strings.Join(keep, "\n\n")
}

// between returns the probe publishes sent in [from, to).
func between(rs []*probeResult, from, to time.Time) []probeResult {
	var out []probeResult
	for _, r := range rs {
		if !r.sent.Before(from) && r.sent.Before(to) {
			out = append(out, *r)
		}
	}
	return out
}

// latencies summarises probe publishes: count per outcome and the longest
// wait for an answer.
func latencies(rs []probeResult) (counts string, longest time.Duration) {
	m := map[string]int{}
	for _, r := range rs {
		m[r.outcome]++
		if !r.done.IsZero() && r.done.Sub(r.sent) > longest {
			longest = r.done.Sub(r.sent)
		}
	}
	var parts []string
	for k, n := range m {
		parts = append(parts, fmt.Sprintf("%s=%d", k, n))
	}
	sort.Strings(parts)
	if len(parts) == 0 {
		return "none", 0
	}
	return strings.Join(parts, " "), longest.Round(time.Millisecond)
}

// injectFrozen is the BackendFrozen fault: SIGSTOP of the backend process for
// frozenFor under load, with probes measuring what a publish meets.
func injectFrozen(t *testing.T, r *run) time.Time {
	e := r.env
	p := startProbes(t, e)
	time.Sleep(500 * time.Millisecond) // probes answered normally before the freeze
	if err := e.signalBackend(syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP: %v", err)
	}
	frozeAt := time.Now()
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			if err := e.signalBackend(syscall.SIGCONT); err != nil {
				t.Errorf("SIGCONT: %v", err)
			}
		}
	}
	defer resume()
	down, ok := waitReadyz(e.httpAddr, http.StatusServiceUnavailable, frozeAt, frozenFor)
	if !ok {
		t.Errorf("/readyz still not 503 %v after SIGSTOP of the backend", frozenFor)
	} else if down > 2*outageDetection {
		t.Errorf("/readyz turned 503 %v after SIGSTOP: more than twice kubemq.outage_detection (%v)", down, outageDetection)
	}
	detected := frozeAt.Add(down)
	time.Sleep(time.Until(frozeAt.Add(frozenFor)))
	resume()
	thawAt := time.Now()
	up, ok := waitReadyz(e.httpAddr, http.StatusOK, thawAt, recoverWithin)
	if !ok {
		t.Errorf("/readyz not 200 again %v after SIGCONT", recoverWithin)
	}
	// A Pub/Sub probe answered after the thaw shows publishing is back.
	var firstOK time.Duration
	for deadline := time.Now().Add(30 * time.Second); firstOK == 0 && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		p.mu.Lock()
		for _, r := range p.ps {
			if r.outcome == "ok" && r.sent.After(thawAt) {
				firstOK = r.done.Sub(thawAt)
				break
			}
		}
		p.mu.Unlock()
	}
	p.Stop(t)

	p.mu.Lock()
	defer p.mu.Unlock()
	// Pub/Sub: every publish sent while frozen failed with UNAVAILABLE, before
	// the thaw or within the detection bound of being sent (one sent just
	// before the SIGCONT), never at a deadline or when the backend came back.
	for _, pr := range between(p.ps, frozeAt, thawAt) {
		if pr.outcome != codes.Unavailable.String() || pr.done.IsZero() || !pr.done.Before(thawAt) && pr.done.Sub(pr.sent) > outageDetection {
			t.Errorf("pubsub probe sent %v after SIGSTOP: %s after %v, want UNAVAILABLE before SIGCONT (%v)",
				pr.sent.Sub(frozeAt).Round(time.Millisecond), pr.outcome, pr.done.Sub(pr.sent).Round(time.Millisecond), frozenFor)
		}
	}
	psInflight, psInflightMax := latencies(between(p.ps, frozeAt, detected))
	psAfter, psAfterMax := latencies(between(p.ps, detected, thawAt))
	// AMQP: every publish in flight when the outage was declared got a
	// basic.nack (not merely the connection's close) before the 320 close.
	// The proxy declared it no later than its first refusal of a probe (the
	// /readyz poll may see it later on a loaded machine): probes sent before
	// that were in flight then.
	declared := detected
	for _, r := range append(append([]*probeResult(nil), p.ps...), p.am...) {
		if !r.done.IsZero() && r.outcome != "ok" && r.outcome != "ack" && r.outcome != "closed" && r.done.Before(declared) && r.done.After(frozeAt) {
			declared = r.done
		}
	}
	amInflightRs := between(p.am, frozeAt, declared)
	for _, ar := range amInflightRs {
		if ar.outcome != "nack" {
			t.Errorf("amqp probe sent %v after SIGSTOP: %s, want basic.nack", ar.sent.Sub(frozeAt).Round(time.Millisecond), ar.outcome)
		}
	}
	if len(amInflightRs) == 0 {
		t.Errorf("no AMQP probe publish was in flight when the outage was declared")
	}
	// Their stores were cut in flight (KubeMQ may hold them after the thaw, and the client's
	// retry may store them twice): the proxy says so (kubemq_proxy_backend_sends_cut_total).
	if log, err := os.ReadFile(e.proxy.LogPath()); err != nil {
		t.Errorf("proxy log: %v", err)
	} else if len(amInflightRs) > 0 && !bytes.Contains(log, []byte("kubemq outage declared while a send was in flight")) {
		t.Errorf("%d AMQP publishes nacked in flight and no send logged as cut by the outage", len(amInflightRs))
	}
	amInflight, amInflightMax := latencies(amInflightRs)
	amAfter, amAfterMax := latencies(between(p.am, declared, thawAt))
	closedAfter := "no close"
	if !p.amClosed.IsZero() {
		closedAfter = fmt.Sprintf("%v (%s)", p.amClosed.Sub(frozeAt).Round(time.Millisecond), p.amReason)
	}
	addStats("BackendFrozen      backend %s SIGSTOPped %v: first publish refused after %v, /readyz 503 seen after %v; pubsub publishes in flight then: %s, answered within %v; sent after detection: %s, within %v | amqp in flight: %s within %v; after: %s within %v; probe connection closed after %v | SIGCONT: /readyz 200 after %v, first pubsub publish ok %v after",
		backendKind(e), frozenFor, declared.Sub(frozeAt).Round(time.Millisecond), down.Round(time.Millisecond), psInflight, psInflightMax, psAfter, psAfterMax, amInflight, amInflightMax, amAfter, amAfterMax, closedAfter,
		up.Round(time.Millisecond), firstOK.Round(time.Millisecond))
	return thawAt
}

// injectFrozenShutdown is the FrozenShutdown fault: with the backend frozen
// and the outage detected, SIGTERM the proxy: it must exit within
// shutdown.timeout (plus slack), naming what it gave up on; then the backend
// resumes and a new proxy takes over on the same ports.
func injectFrozenShutdown(t *testing.T, r *run) time.Time {
	e := r.env
	if err := e.signalBackend(syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP: %v", err)
	}
	frozeAt := time.Now()
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			if err := e.signalBackend(syscall.SIGCONT); err != nil {
				t.Errorf("SIGCONT: %v", err)
			}
		}
	}
	defer resume()
	down, ok := waitReadyz(e.httpAddr, http.StatusServiceUnavailable, frozeAt, frozenFor)
	if !ok {
		t.Errorf("/readyz still not 503 %v after SIGSTOP of the backend", frozenFor)
	}
	termAt := time.Now()
	err := e.proxy.Stop(shutdownTimeout + 10*time.Second)
	took := time.Since(termAt)
	if err != nil && !e.proxy.Exited() {
		t.Errorf("proxy with a frozen backend: %v", err)
	} else if err != nil {
		t.Logf("proxy with a frozen backend: %v", err)
	}
	gaveUp := "nothing (clean shutdown)"
	for _, line := range strings.Split(e.proxy.Tail(200), "\n") {
		if strings.Contains(line, "giving up on the rest") {
			gaveUp = line
		}
	}
	resume()
	e.startProxy() // same ports; returns once /readyz is 200
	addStats("FrozenShutdown     backend %s SIGSTOPped: /readyz 503 after %v; SIGTERM to exit %v (shutdown.timeout %v); gave up on: %s",
		backendKind(e), down.Round(time.Millisecond), took.Round(time.Millisecond), shutdownTimeout, gaveUp)
	return time.Now()
}

func backendKind(e *env) string {
	if e.realDir != "" {
		return "real KubeMQ"
	}
	return "embedded"
}
