package load

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kubemq-io/kubemq-proxy/internal/proctest"
)

// envAddress names an external KubeMQ server to use as the backend, as in
// the rest of the module's tests.
const envAddress = "KUBEMQ_ADDRESS"

// TestMain removes the built binary: every run would leave ~30 MB behind.
// LOAD_PROXY_BIN, this suite's older name for $PROXY_BIN, still selects a
// prebuilt binary.
func TestMain(m *testing.M) {
	if p := os.Getenv("LOAD_PROXY_BIN"); p != "" {
		os.Setenv(proctest.EnvBinary, p)
	}
	proctest.Main(m)
}

// metrics is one /metrics scrape of the proxy.
type metrics = proctest.Metrics

// leakSlack is how many goroutines above the baseline the proxy may keep
// once every client has gone (timers, pooled workers winding down).
const leakSlack = 20

// leakWait bounds the wait for the goroutines to come back down.
const leakWait = 10 * time.Second

func randSuffix() string {
	b := make([]byte, 4)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// envInt reads a positive integer knob; short is the -short default.
func envInt(t testing.TB, name string, def, short int) int {
	t.Helper()
	if v := os.Getenv(name); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			t.Fatalf("%s=%q: want a positive integer", name, v)
		}
		return n
	}
	if testing.Short() {
		return short
	}
	return def
}

// envDuration reads a positive duration knob.
func envDuration(t testing.TB, name string, def time.Duration) time.Duration {
	t.Helper()
	if v := os.Getenv(name); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("%s=%q: want a positive duration", name, v)
		}
		return d
	}
	return def
}

// runDir holds a run's process log: under LOAD_LOGS when set (kept for
// inspection), else a test temporary directory.
func runDir(t testing.TB) string { return proctest.RunDir(t, "LOAD_LOGS") }

// proxyEnv is one proxy process and its bound addresses.
type proxyEnv struct {
	t                          testing.TB
	p                          *proctest.Proc
	gcpAddr, amqpAddr, httpAdr string
	suffix                     string
}

// startProxy runs the proxy as its own process, every listener on
// 127.0.0.1:0 and AMQPS off, on the embedded in-memory backend (in the
// same process, so its cost is part of the figures) or on $KUBEMQ_ADDRESS.
// extra are more flags. The process is killed at cleanup; the test calls
// stop for the graceful exit and the problem check.
func startProxy(t testing.TB, extra ...string) *proxyEnv {
	t.Helper()
	return startProxyOn(t, os.Getenv(envAddress), extra...)
}

// startBackend runs the embedded KubeMQ-compatible server as a process of its own on a data
// directory, unless $KUBEMQ_ADDRESS names one; it returns the address and the process (nil
// for $KUBEMQ_ADDRESS).
func startBackend(t testing.TB) (string, *proctest.Proc) {
	t.Helper()
	if a := os.Getenv(envAddress); a != "" {
		return a, nil
	}
	dir := runDir(t)
	p, err := proctest.Start(proctest.Binary(t, proctest.Race), "backend", dir, []string{"embedded-kubemq"},
		"embedded", "--embedded.listen", "127.0.0.1:0", "--http.listen", "127.0.0.1:0", "--embedded.data_dir", filepath.Join(dir, "backend-data"), "--log.level", logLevel())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Kill)
	return p.Addr("embedded-kubemq"), p
}

// startProxyOn is startProxy on the KubeMQ at addr ("" = its own embedded server).
func startProxyOn(t testing.TB, addr string, extra ...string) *proxyEnv {
	t.Helper()
	e := &proxyEnv{t: t, suffix: randSuffix()}
	dir := runDir(t)
	args := []string{
		"--gcp.listen", "127.0.0.1:0", "--amqp.listen", "127.0.0.1:0", "--amqp.tls_listen", "", "--amqp.management_listen", "127.0.0.1:0",
		"--http.listen", "127.0.0.1:0", "--registry.channel", "kubemq-proxy-load-" + e.suffix,
		"--log.level", logLevel(),
	}
	if addr != "" {
		args = append(args, "--kubemq.address", addr)
	} else {
		args = append(args, "--embedded.listen", "127.0.0.1:0")
	}
	args = append(args, extra...)
	p, err := proctest.Start(proctest.Binary(t, proctest.Race), "proxy", dir, []string{"gcp", "amqp", "http"}, args...)
	if err != nil {
		t.Fatal(err)
	}
	e.p = p
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("last lines of the proxy log (%s):%s", p.LogPath(), p.Tail(40))
		}
	})
	e.gcpAddr, e.amqpAddr, e.httpAdr = p.Addr("gcp"), p.Addr("amqp"), p.Addr("http")
	if err := proctest.WaitReady(e.httpAdr, 60*time.Second); err != nil {
		t.Fatalf("proxy: %v: %s", err, p.Tail(30))
	}
	return e
}

// logLevel is the proxy's log level: LOAD_LOG_LEVEL, default info.
func logLevel() string { return proctest.LogLevel("LOAD_LOG_LEVEL") }

// scrape reads the proxy's /metrics, failing the test on an error.
func (e *proxyEnv) scrape() metrics {
	e.t.Helper()
	m, err := proctest.Scrape(e.httpAdr)
	if err != nil {
		e.t.Fatalf("scrape: %v", err)
	}
	return m
}

// alive fails the test at once when the proxy has exited or reported a
// race, panic or fatal error.
func (e *proxyEnv) alive() {
	e.t.Helper()
	if pr := e.p.Problems(); len(pr) > 0 {
		e.t.Fatalf("proxy (log %s) reported:\n%s", e.p.LogPath(), strings.Join(pr, "\n"))
	}
	if e.p.Exited() {
		e.t.Fatalf("proxy exited: %s", e.p.Tail(30))
	}
}

// waitMetric polls /metrics until ok accepts a scrape or d passes; it
// returns the last scrape and whether ok accepted it.
func (e *proxyEnv) waitMetric(d time.Duration, ok func(metrics) bool) (metrics, bool) {
	e.t.Helper()
	deadline := time.Now().Add(d)
	for {
		m := e.scrape()
		if ok(m) {
			return m, true
		}
		if time.Now().After(deadline) {
			return m, false
		}
		e.alive()
		time.Sleep(200 * time.Millisecond)
	}
}

// leakCheck waits for the proxy's goroutines to come back to within
// leakSlack of the baseline and fails the test when they do not.
func (e *proxyEnv) leakCheck(what string, baseline float64) metrics {
	e.t.Helper()
	m, ok := e.waitMetric(leakWait, func(m metrics) bool { return m.Goroutines() <= baseline+leakSlack })
	if !ok {
		e.t.Errorf("goroutine leak after closing the %s: %.0f goroutines %v after the close, baseline %.0f (+%d allowed)",
			what, m.Goroutines(), leakWait, baseline, leakSlack)
	}
	return m
}

// stop ends the proxy with SIGTERM, checks the exit code, and fails the
// test on a race report, panic or fatal error in its log.
func (e *proxyEnv) stop() {
	e.t.Helper()
	if !e.p.Exited() {
		if err := e.p.Stop(30 * time.Second); err != nil {
			e.t.Errorf("%v: %s", err, e.p.Tail(20))
		}
	}
	if pr := e.p.Problems(); len(pr) > 0 {
		e.t.Errorf("proxy (log %s) reported:\n%s", e.p.LogPath(), strings.Join(pr, "\n"))
	}
}

// report prints one LOAD line: to the test log, and to stdout in verbose
// runs so that it can be grepped from `go test -v` output.
func report(t testing.TB, format string, args ...any) {
	t.Helper()
	line := "LOAD " + fmt.Sprintf(format, args...)
	if proctest.Race {
		line += " race=1"
	}
	t.Log(line)
	if testing.Verbose() {
		fmt.Println(line)
	}
}

func mib(b float64) float64 { return b / (1 << 20) }
