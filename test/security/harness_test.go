package security

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// proxyBinary builds the command (with -race) once per test run.
// TestMain removes the built binary (tens of MB per run) after the tests.
func TestMain(m *testing.M) {
	code := m.Run()
	if binPath != "" {
		os.RemoveAll(filepath.Dir(binPath))
	}
	os.Exit(code)
}

func proxyBinary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "kubemq-proxy-security")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "kubemq-proxy")
		cmd := exec.Command("go", "build", "-race", "-o", binPath, ".")
		cmd.Dir = "../.."
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// proc is one running proxy.
type proc struct {
	cmd   *exec.Cmd
	addrs map[string]string // listener name -> bound address
	done  chan struct{}

	mu   sync.Mutex
	logs []string
}

// startProxy runs the binary with its Pub/Sub, AMQP and HTTP listeners on
// 127.0.0.1:0 (and the embedded backend, unless args name kubemq.address),
// and waits until the listeners named in want have reported their address.
func startProxy(t *testing.T, want []string, args ...string) *proc {
	t.Helper()
	base := []string{"--gcp.listen", "127.0.0.1:0", "--amqp.listen", "127.0.0.1:0", "--amqp.tls_listen", "127.0.0.1:0",
		"--http.listen", "127.0.0.1:0", "--embedded.listen", "127.0.0.1:0", "--embedded.strict", "--log.level", "debug"}
	if len(args) > 0 && args[0] == "embedded" {
		// The backend alone: the subcommand comes first, and only its own
		// listener applies.
		base = append([]string{"embedded"}, "--embedded.listen", "127.0.0.1:0", "--embedded.strict", "--log.level", "debug", "--http.listen", "127.0.0.1:0")
		args = args[1:]
	}
	cmd := exec.Command(proxyBinary(t), append(base, args...)...)
	cmd.Dir = t.TempDir() // no ./config.yaml there
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, addrs: map[string]string{}, done: make(chan struct{})}
	found := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		signalled := false
		for sc.Scan() {
			line := sc.Text()
			p.mu.Lock()
			p.logs = append(p.logs, line)
			var rec struct{ Msg, Listener, Address string }
			if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "listening" {
				p.addrs[rec.Listener] = rec.Address
			}
			all := true
			for _, l := range want {
				all = all && p.addrs[l] != ""
			}
			p.mu.Unlock()
			if all && !signalled {
				signalled = true
				close(found)
			}
		}
		io.Copy(io.Discard, stderr)
	}()
	go func() { cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			p.mu.Lock()
			t.Logf("proxy log:\n%s", strings.Join(p.logs, "\n"))
			p.mu.Unlock()
		}
	})
	select {
	case <-found:
	case <-p.done:
		t.Fatalf("proxy exited before listening")
	case <-time.After(60 * time.Second):
		t.Fatalf("proxy did not report its listeners %v", want)
	}
	return p
}

func (p *proc) addr(name string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.addrs[name]
}

func (p *proc) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
}

// readyz returns /readyz's status code (0 when the request failed).
func (p *proc) readyz() int {
	resp, err := http.Get("http://" + p.addr("http") + "/readyz")
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

func (p *proc) waitReady(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for p.readyz() != http.StatusOK {
		if time.Now().After(deadline) {
			t.Fatalf("/readyz not 200 within 30s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// writeConfig writes a config file for keys that have no flag (amqp.users).
func writeConfig(t *testing.T, yaml string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(p, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
