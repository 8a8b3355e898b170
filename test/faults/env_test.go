package faults

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kubemq-io/kubemq-proxy/internal/kubemqtest"
	"github.com/kubemq-io/kubemq-proxy/internal/proctest"
)

// env is one fault run's processes: the backend (an embedded-mode process
// of our own, or the external KUBEMQ_ADDRESS server), the relay in front
// of it, and the proxy pointed at the relay. The proxy keeps its first
// ports across restarts, so clients reconnect to the same address.
type env struct {
	t        testing.TB
	dir      string
	suffix   string // makes names unique on a shared external server
	external bool

	backendDir string
	backend    *proctest.Proc
	relay      *relay
	// realDir is the data directory of a real KubeMQ server this run started
	// with the KUBEMQ_SERVER script (freezable: its pid is in realDir/pid).
	realDir string

	regChannel string
	proxy      *proctest.Proc
	proxies    []*proctest.Proc // every proxy process started, for the problem check
	backends   []*proctest.Proc
	gcpAddr    string
	amqpAddr   string
	httpAddr   string
}

func randSuffix() string {
	b := make([]byte, 4)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// logLevel is the processes' log level: FAULTS_LOG_LEVEL, default info.
func logLevel() string { return proctest.LogLevel("FAULTS_LOG_LEVEL") }

// runDir holds a run's data and process logs: under FAULTS_LOGS when set
// (kept for inspection), else a test temporary directory.
func runDir(t testing.TB) string { return proctest.RunDir(t, "FAULTS_LOGS") }

// startProc runs the proxy binary (built with -race under -race) as
// process name, its log in dir, until the listeners in want report.
func startProc(t testing.TB, name, dir string, want []string, args ...string) (*proctest.Proc, error) {
	t.Helper()
	return proctest.Start(proctest.Binary(t, proctest.Race), name, dir, want, args...)
}

func newEnv(t testing.TB) *env { return newEnvWith(t, false) }

// newEnvWith is newEnv; ownReal runs the backend as a real KubeMQ server of
// the run's own, started with the KUBEMQ_SERVER script (see frozen_test.go).
func newEnvWith(t testing.TB, ownReal bool) *env {
	t.Helper()
	e := &env{t: t, dir: runDir(t), suffix: randSuffix(), external: kubemqtest.External() || ownReal}
	e.regChannel = "kubemq-proxy-faults-" + e.suffix
	target := os.Getenv(kubemqtest.EnvAddress)
	if ownReal {
		target = e.startRealServer()
	} else if !e.external {
		e.backendDir = filepath.Join(e.dir, "backend-data")
		if err := os.MkdirAll(e.backendDir, 0o755); err != nil {
			t.Fatal(err)
		}
		e.startBackend()
		target = e.backend.Addr("embedded-kubemq")
	}
	r, err := newRelay(target)
	if err != nil {
		t.Fatal(err)
	}
	e.relay = r
	t.Cleanup(e.close)
	e.startProxy()
	return e
}

// startBackend runs "kubemq-proxy embedded" on the run's data directory,
// in strict mode as every test backend.
func (e *env) startBackend() {
	e.t.Helper()
	args := append([]string{"embedded", "--embedded.listen", "127.0.0.1:0", "--http.listen", "127.0.0.1:0", "--embedded.data_dir", e.backendDir, "--log.level", logLevel()},
		kubemqtest.BinaryFlags()...)
	p, err := startProc(e.t, "backend", e.dir, []string{"embedded-kubemq"}, args...)
	if err != nil {
		e.t.Fatal(err)
	}
	e.backend = p
	e.backends = append(e.backends, p)
	if e.relay != nil {
		e.relay.SetTarget(p.Addr("embedded-kubemq"))
	}
}

// startProxy runs the proxy on the run's ports (127.0.0.1:0 the first
// time) and waits until /readyz answers 200.
func (e *env) startProxy() {
	e.t.Helper()
	gcp, amqp, httpA := "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	if e.gcpAddr != "" {
		gcp, amqp, httpA = e.gcpAddr, e.amqpAddr, e.httpAddr
	}
	args := []string{
		"--gcp.listen", gcp, "--amqp.listen", amqp, "--amqp.tls_listen", "", "--amqp.management_listen", "127.0.0.1:0", "--http.listen", httpA,
		"--kubemq.address", e.relay.Addr(), "--registry.channel", e.regChannel, "--log.level", logLevel(),
	}
	var p *proctest.Proc
	var err error
	// A restart rebinds the same ports; another process could have taken
	// one in between (rare on loopback), so a bind failure is retried.
	for attempt := 0; attempt < 5; attempt++ {
		p, err = startProc(e.t, "proxy", e.dir, []string{"gcp", "amqp", "http"}, args...)
		if err == nil || !strings.Contains(err.Error(), "address already in use") {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		e.t.Fatal(err)
	}
	e.proxy = p
	e.proxies = append(e.proxies, p)
	e.gcpAddr, e.amqpAddr, e.httpAddr = p.Addr("gcp"), p.Addr("amqp"), p.Addr("http")
	if err := proctest.WaitReady(e.httpAddr, 60*time.Second); err != nil {
		e.t.Fatalf("proxy: %v: %s", err, p.Tail(30))
	}
}

// checkProblems fails the test on a race report, panic or fatal error in
// any process of the run.
func (e *env) checkProblems() {
	e.t.Helper()
	for _, p := range append(append([]*proctest.Proc(nil), e.proxies...), e.backends...) {
		if pr := p.Problems(); len(pr) > 0 {
			e.t.Errorf("%s (log %s) reported:\n%s", p.Name(), p.LogPath(), strings.Join(pr, "\n"))
		}
	}
}

// stop ends the proxy and backend gracefully and checks they exit 0.
func (e *env) stop() {
	e.t.Helper()
	if e.proxy != nil && !e.proxy.Exited() {
		if err := e.proxy.Stop(30 * time.Second); err != nil {
			e.t.Errorf("%v: %s", err, e.proxy.Tail(20))
		}
	}
	if e.backend != nil && !e.backend.Exited() {
		if err := e.backend.Stop(30 * time.Second); err != nil {
			e.t.Errorf("%v: %s", err, e.backend.Tail(20))
		}
	}
	e.checkProblems()
}

func (e *env) close() {
	if e.proxy != nil {
		e.proxy.Kill()
	}
	if e.relay != nil {
		e.relay.Close()
	}
	if e.backend != nil {
		e.backend.Kill()
	}
	if e.realDir != "" {
		e.stopRealServer()
	}
	if e.t.Failed() {
		for _, p := range append(append([]*proctest.Proc(nil), e.proxies...), e.backends...) {
			e.t.Logf("last lines of %s log (%s):%s", p.Name(), p.LogPath(), p.Tail(40))
		}
	}
}

func (e *env) String() string {
	return fmt.Sprintf("proxy gcp=%s amqp=%s http=%s via relay %s", e.gcpAddr, e.amqpAddr, e.httpAddr, e.relay.Addr())
}
