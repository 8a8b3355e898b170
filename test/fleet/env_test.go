package fleet

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kubemq-io/kubemq-proxy/internal/kubemqtest"
	"github.com/kubemq-io/kubemq-proxy/internal/proctest"
	"github.com/kubemq-io/kubemq-proxy/kubemqclient"
)

func TestMain(m *testing.M) { proctest.Main(m) }

// lease is the fleet's cluster lease: the default. A holder gives its queues up when its
// renewal is not confirmed within the lease less the 3 s stop slack; with a 5 s lease that
// left 2 s, which a loaded 2-CPU machine running the race detector missed now and then (a
// spurious handover, whose in-flight acks then came back).
const lease = 8 * time.Second

// recordDelay is the replicas' delivery.record_delay (the default), which the benchmark waits
// out between its runs.
const recordDelay = 10 * time.Second

func randSuffix() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// replicas is how many replicas the main fleet runs start: FLEET_REPLICAS (1 to 8), else 3.
func replicas(t testing.TB) int {
	if v := os.Getenv("FLEET_REPLICAS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 8 {
			t.Fatalf("FLEET_REPLICAS=%q: want 1 to 8", v)
		}
		return n
	}
	return 3
}

// faultReplicas is replicas for a run that kills or stops one replica and checks what the
// others do: at least 2.
func faultReplicas(t testing.TB) int {
	n := replicas(t)
	if n < 2 {
		t.Skipf("FLEET_REPLICAS=%d: a fault run needs 2 replicas or more", n)
	}
	return n
}

// messages is how many messages a run sends per protocol.
func messages(t testing.TB) int {
	if v := os.Getenv("FLEET_MESSAGES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			t.Fatalf("FLEET_MESSAGES=%q: want a positive integer", v)
		}
		return n
	}
	if testing.Short() {
		return 2000
	}
	return 20000
}

// fleet is one run: a backend and the replicas on it.
type fleet struct {
	t        testing.TB
	dir      string
	suffix   string
	backend  *proctest.Proc // nil with $KUBEMQ_ADDRESS
	kubemq   string
	secret   string
	replicas []*replica
	procs    []*proctest.Proc // every process started, for the problem check
}

// replica is one proxy process and the ports it keeps across restarts.
type replica struct {
	f    *fleet
	name string
	p    *proctest.Proc
	// mu guards the addresses: consumers read them while a restart writes them.
	mu                   sync.Mutex
	gcp, amqp, http, per string
}

// addr returns the replica's current address of listener "gcp", "amqp" or "http".
func (r *replica) addr(listener string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch listener {
	case "gcp":
		return r.gcp
	case "amqp":
		return r.amqp
	}
	return r.http
}

func newFleet(t testing.TB, n int) *fleet {
	t.Helper()
	f := &fleet{t: t, dir: proctest.RunDir(t, "FLEET_LOGS"), suffix: randSuffix(), secret: "fleet-" + randSuffix()}
	if a := os.Getenv(kubemqtest.EnvAddress); a != "" {
		f.kubemq = a
	} else {
		data := filepath.Join(f.dir, "backend-data")
		if err := os.MkdirAll(data, 0o755); err != nil {
			t.Fatal(err)
		}
		args := append([]string{"embedded", "--embedded.listen", "127.0.0.1:0", "--http.listen", "127.0.0.1:0", "--embedded.data_dir", data, "--log.level", logLevel()},
			kubemqtest.BinaryFlags()...)
		p, err := proctest.Start(proctest.Binary(t, proctest.Race), "backend", f.dir, []string{"embedded-kubemq"}, args...)
		if err != nil {
			t.Fatal(err)
		}
		f.backend = p
		f.procs = append(f.procs, p)
		f.kubemq = p.Addr("embedded-kubemq")
	}
	t.Cleanup(f.close)
	for i := range n {
		r := &replica{f: f, name: fmt.Sprintf("proxy%d", i)}
		r.start()
		f.replicas = append(f.replicas, r)
	}
	return f
}

func logLevel() string { return proctest.LogLevel("FLEET_LOG_LEVEL") }

// start runs the replica on its ports (127.0.0.1:0 the first time) and waits until ready.
func (r *replica) start() {
	f := r.f
	f.t.Helper()
	addr := func(a string) string {
		if a == "" {
			return "127.0.0.1:0"
		}
		return a
	}
	r.mu.Lock()
	args := []string{
		"--gcp.listen", addr(r.gcp), "--amqp.listen", addr(r.amqp), "--amqp.tls_listen", "", "--amqp.management_listen", "127.0.0.1:0", "--http.listen", addr(r.http),
		"--cluster.listen", addr(r.per), "--cluster.secret", f.secret, "--cluster.lease", lease.String(), "--delivery.record_delay", recordDelay.String(),
		"--cluster.channel", "kubemq-proxy-fleet.cluster." + f.suffix,
		"--kubemq.address", f.kubemq, "--registry.channel", "kubemq-proxy-fleet.registry." + f.suffix, "--log.level", logLevel(),
	}
	r.mu.Unlock()
	var p *proctest.Proc
	var err error
	for attempt := 0; attempt < 5; attempt++ { // a restart rebinds its ports; one may be taken meanwhile
		p, err = proctest.Start(proctest.Binary(f.t, proctest.Race), r.name, f.dir, []string{"gcp", "amqp", "http", "cluster"}, args...)
		if err == nil || !strings.Contains(err.Error(), "address already in use") {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		f.t.Fatal(err)
	}
	r.p = p
	f.procs = append(f.procs, p)
	r.mu.Lock()
	r.gcp, r.amqp, r.http, r.per = p.Addr("gcp"), p.Addr("amqp"), p.Addr("http"), p.Addr("cluster")
	r.mu.Unlock()
	if err := proctest.WaitReady(r.addr("http"), 60*time.Second); err != nil {
		f.t.Fatalf("%s: %v: %s", r.name, err, p.Tail(30))
	}
}

// strictRefusals counts the backend's strict-mode refusals so far (0 with an external KubeMQ).
func (f *fleet) strictRefusals() int {
	if f.backend == nil {
		return 0
	}
	file, err := os.Open(f.backend.LogPath())
	if err != nil {
		f.t.Fatal(err)
	}
	defer file.Close()
	var kills []time.Time
	for _, p := range f.procs {
		if k := p.KilledAt(); !k.IsZero() && p != f.backend {
			kills = append(kills, k)
		}
	}
	n := 0
	sc := bufio.NewScanner(file)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if line := sc.Text(); strings.Contains(line, "strict mode refused") && !killedDuringGet(line, kills) {
			n++
		}
	}
	return n
}

// killedDuringGet reports whether refusal (a backend log line) is a stream that ended while
// its Get waited, logged within a few seconds after a replica was killed (-9). A killed
// process cannot settle or close anything: that is the crash the test makes, whose cost on a
// real KubeMQ docs/CLUSTER.md states, not a pattern of the proxy's.
func killedDuringGet(refusal string, kills []time.Time) bool {
	if !strings.Contains(refusal, "downstream stream ended while a Get was waiting") {
		return false
	}
	var rec struct {
		TS string `json:"ts"`
	}
	if json.Unmarshal([]byte(refusal), &rec) != nil {
		return false
	}
	at, err := time.Parse(time.RFC3339Nano, rec.TS)
	if err != nil {
		return false
	}
	for _, k := range kills {
		if d := at.Sub(k); d >= 0 && d < 5*time.Second {
			return true
		}
	}
	return false
}

// storedTwice is how many messages of the proxies' stores into data queues (AMQP queues,
// Pub/Sub subscriptions) KubeMQ may have stored twice, and so delivered twice:
//   - on an external KubeMQ, those it left unanswered, which were sent again (docs/kubemq.md
//     10.2); the embedded backend answers every send;
//   - on any backend, those in flight when a proxy declared KubeMQ unreachable
//     (kubemq.outage_detection): the client was answered UNAVAILABLE or basic.nack and published
//     them again, though the backend may have stored them (on a starved machine a slow backend
//     is now and then declared down).
func (f *fleet) storedTwice() int {
	external := os.Getenv(kubemqtest.EnvAddress) != ""
	n := 0
	for _, p := range f.procs {
		for _, line := range logLines(p) {
			resent := strings.Contains(line, "kubemq left a send unanswered; sending it again")
			cut := strings.Contains(line, "kubemq outage declared while a send was in flight")
			if !cut && !(resent && external) {
				continue
			}
			var ev struct {
				Messages int    `json:"messages"`
				Channel  string `json:"channel"`
			}
			if json.Unmarshal([]byte(line), &ev) != nil {
				continue
			}
			if strings.HasPrefix(ev.Channel, "amqp.") || strings.HasPrefix(ev.Channel, "gcp.sub.") {
				n += ev.Messages
			}
		}
	}
	return n
}

// grepLogs returns, after a newline each, the lines of every process's log that contain one
// of the patterns, prefixed by the process's name (a failure's diagnostic).
func (f *fleet) grepLogs(patterns ...string) string {
	var b strings.Builder
	for _, p := range f.procs {
		for _, line := range logLines(p) {
			for _, pat := range patterns {
				if strings.Contains(line, pat) {
					b.WriteString("\n" + p.Name() + ": " + line)
					break
				}
			}
		}
	}
	return b.String()
}

// logLines returns the lines of p's log so far (none when it cannot be read).
func logLines(p *proctest.Proc) []string {
	b, err := os.ReadFile(p.LogPath())
	if err != nil {
		return nil
	}
	return strings.Split(string(b), "\n")
}

// excused reports whether dups deliveries beyond the first (what) are explained by messages
// KubeMQ may have stored twice (storedTwice), logging it as a known limit when so.
func (f *fleet) excused(dups int, what string) bool {
	f.t.Helper()
	if dups == 0 {
		return true
	}
	twice := f.storedTwice()
	if dups > twice {
		return false
	}
	f.t.Logf("KNOWN LIMIT (docs/kubemq.md 10.2, docs/CLUSTER.md): %d %s, and stores of %d messages were sent again after KubeMQ left them unanswered or were cut in flight by a declared outage and published again: each may be stored twice", dups, what, twice)
	return true
}

func (f *fleet) checkProblems() {
	f.t.Helper()
	for _, p := range f.procs {
		if pr := p.Problems(); len(pr) > 0 {
			f.t.Errorf("%s (log %s) reported:\n%s", p.Name(), p.LogPath(), strings.Join(pr, "\n"))
		}
	}
	if n := f.strictRefusals(); n > 0 {
		f.t.Errorf("the backend refused %d patterns hazardous on a real KubeMQ (strict mode): see %s", n, f.backend.LogPath())
	}
}

func (f *fleet) close() {
	for _, r := range f.replicas {
		if r.p != nil {
			r.p.Kill()
		}
	}
	if f.backend != nil {
		f.backend.Kill()
	}
	if f.t.Failed() {
		for _, p := range f.procs {
			f.t.Logf("first warnings of %s log (%s):%s", p.Name(), p.LogPath(), p.Warnings(20))
			f.t.Logf("last lines of %s log (%s):%s", p.Name(), p.LogPath(), p.Tail(30))
		}
	}
}

// backendQueues describes what KubeMQ lists for the queues whose names contain part (a
// diagnostic for a test that misses messages: are they waiting in KubeMQ, or gone?).
func (f *fleet) backendQueues(part string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kc, err := kubemqclient.Dial(ctx, kubemqclient.Options{Address: f.kubemq})
	if err != nil {
		return "cannot reach KubeMQ: " + err.Error()
	}
	defer kc.Close()
	info, err := kc.QueuesInfo(ctx)
	if err != nil {
		return "QueuesInfo: " + err.Error()
	}
	var b strings.Builder
	for _, q := range info.Queues {
		if strings.Contains(q.Name, part) {
			fmt.Fprintf(&b, "%s: waiting %d, sent %d, delivered %d; ", q.Name, q.Waiting, q.Sent, q.Delivered)
		}
	}
	if b.Len() == 0 {
		return "no queue listed"
	}
	return b.String()
}

// TestKilledDuringGet: only a Get-waiting refusal logged within 5 s after a kill is put down to
// the kill.
func TestKilledDuringGet(t *testing.T) {
	kill := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	line := func(at time.Time, msg string) string {
		return `{"level":"warn","ts":"` + at.Format(time.RFC3339Nano) + `","msg":"strict mode refused: ` + msg + `"}`
	}
	const waiting = "downstream stream ended while a Get was waiting"
	for _, c := range []struct {
		line string
		want bool
	}{
		{line(kill.Add(1100*time.Millisecond), waiting), true},
		{line(kill.Add(-time.Second), waiting), false},
		{line(kill.Add(6*time.Second), waiting), false},
		{line(kill.Add(time.Second), "second open transaction"), false},
	} {
		if got := killedDuringGet(c.line, []time.Time{kill}); got != c.want {
			t.Errorf("killedDuringGet(%s) = %v, want %v", c.line, got, c.want)
		}
	}
}
