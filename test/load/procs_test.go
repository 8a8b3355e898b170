package load

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Copied from test/faults (a test package cannot be imported): build the
// binary once, run it, read the bound addresses from its log.

var (
	buildOnce sync.Once
	binPath   string
	buildDir  string // removed by TestMain; "" with LOAD_PROXY_BIN
	buildErr  error
)

// TestMain removes the built binary: every run would leave ~30 MB behind.
func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// proxyBinary builds kubemq-proxy once per test binary, with the race
// detector when the tests run with it, so a race inside the proxy under
// load is reported (and fails the run, see proc.Problems).
// LOAD_PROXY_BIN=path uses that binary instead (e.g. a release build).
func proxyBinary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		if p := os.Getenv("LOAD_PROXY_BIN"); p != "" {
			binPath = p
			return
		}
		dir, err := os.MkdirTemp("", "kubemq-proxy-load")
		if err != nil {
			buildErr = err
			return
		}
		buildDir = dir
		binPath = filepath.Join(dir, "kubemq-proxy")
		args := []string{"build", "-o", binPath}
		if raceEnabled {
			args = append(args, "-race")
		}
		args = append(args, "github.com/kubemq-io/kubemq-proxy")
		out, err := exec.Command("go", args...).CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// proc is one running kubemq-proxy process. Its stderr goes to a log
// file; the "listening" lines give the bound addresses; race reports and
// panics are collected as problems.
type proc struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{}

	mu       sync.Mutex // guards addrs and problems
	addrs    map[string]string
	problems []string
}

// startProc runs the binary with args until every listener in want has
// reported its address.
func startProc(t testing.TB, name, logDir string, want []string, args ...string) (*proc, error) {
	t.Helper()
	cmd := exec.Command(proxyBinary(t), args...)
	cmd.Dir = logDir // no ./config.yaml there
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	logPath := filepath.Join(logDir, fmt.Sprintf("%s-%d.log", name, time.Now().UnixNano()))
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	p := &proc{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{}), addrs: map[string]string{}}
	found := make(chan struct{})
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		defer logf.Close()
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		signalled := false
		inRace := 0
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(logf, line)
			if strings.Contains(line, "WARNING: DATA RACE") || strings.HasPrefix(line, "panic:") || strings.HasPrefix(line, "fatal error:") {
				inRace = 40
			}
			if inRace > 0 {
				inRace--
				p.mu.Lock()
				p.problems = append(p.problems, line)
				p.mu.Unlock()
			}
			var rec struct {
				Msg      string `json:"msg"`
				Listener string `json:"listener"`
				Address  string `json:"address"`
			}
			if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "listening" {
				p.mu.Lock()
				p.addrs[rec.Listener] = rec.Address
				ready := true
				for _, l := range want {
					ready = ready && p.addrs[l] != ""
				}
				p.mu.Unlock()
				if ready && !signalled {
					signalled = true
					close(found)
				}
			}
		}
	}()
	go func() { <-scanned; cmd.Wait(); close(p.done) }()
	select {
	case <-found:
		return p, nil
	case <-p.done:
		return nil, fmt.Errorf("%s exited before listening: %s", name, tail(logPath, 20))
	case <-time.After(60 * time.Second):
		p.kill()
		return nil, fmt.Errorf("%s did not report its listeners within 60s: %s", name, tail(logPath, 20))
	}
}

func (p *proc) addr(listener string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.addrs[listener]
}

// kill sends SIGKILL and waits for the exit.
func (p *proc) kill() {
	select {
	case <-p.done:
		return
	default:
	}
	p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// terminate sends SIGTERM and waits up to d for a graceful exit.
func (p *proc) terminate(d time.Duration) error {
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		if code := p.cmd.ProcessState.ExitCode(); code != 0 {
			return fmt.Errorf("%s: exit code %d after SIGTERM", p.name, code)
		}
		return nil
	case <-time.After(d):
		p.kill()
		return fmt.Errorf("%s: no exit %v after SIGTERM", p.name, d)
	}
}

// exited reports whether the process ended on its own.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Problems returns race reports, panics and fatal errors the process
// printed.
func (p *proc) Problems() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.problems...)
}

// tail returns the last n lines of a log file.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "\n" + string(bytes.Join(lines, []byte("\n")))
}

// waitReady polls /readyz until 200 or the deadline.
func waitReady(httpAddr string, d time.Duration) error {
	deadline := time.Now().Add(d)
	hc := http.Client{Timeout: time.Second}
	var last string
	for {
		resp, err := hc.Get("http://" + httpAddr + "/readyz")
		if err == nil {
			var buf bytes.Buffer
			buf.ReadFrom(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
			last = strings.TrimSpace(buf.String())
		} else {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("/readyz not 200 within %v (last: %s)", d, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// metrics is one /metrics scrape: every sample summed over its labels,
// by metric name, and each labelled series as printed (name{k="v",...}).
type metrics map[string]float64

// Goroutines and RSS are the Go and process collectors' figures.
func (m metrics) Goroutines() float64 { return m["go_goroutines"] }
func (m metrics) RSS() float64        { return m["process_resident_memory_bytes"] }

// Heap is the Go heap in use: unlike RSS, it falls as soon as a GC has
// freed what the clients held, so it tells a leak from pages the runtime
// has not returned to the OS yet.
func (m metrics) Heap() float64 { return m["go_memstats_heap_inuse_bytes"] }

// scrape reads /metrics; it fails when the Go or process collector is
// missing, since every figure of the suite comes from them.
func scrape(httpAddr string) (metrics, error) {
	hc := http.Client{Timeout: 5 * time.Second}
	resp, err := hc.Get("http://" + httpAddr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return nil, fmt.Errorf("/metrics: %s", resp.Status)
	}
	m := metrics{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		// name{labels} value: the value is the last field; label values
		// may hold spaces, so split from the right.
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		name := line[:i]
		if j := strings.IndexByte(name, '{'); j >= 0 {
			name = name[:j]
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		m[strings.TrimSpace(name)] += v
		if series := line[:i]; series != name {
			m[series] = v // the labelled series too, for breakdowns
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if _, ok := m["go_goroutines"]; !ok {
		return nil, fmt.Errorf("/metrics lacks go_goroutines")
	}
	if _, ok := m["process_resident_memory_bytes"]; !ok {
		return nil, fmt.Errorf("/metrics lacks process_resident_memory_bytes")
	}
	return m, nil
}
