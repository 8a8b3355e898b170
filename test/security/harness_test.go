package security

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kubemq-io/kubemq-proxy/internal/proctest"
)

// TestMain removes the built binary (tens of MB per run) after the tests.
func TestMain(m *testing.M) {
	proctest.Main(m)
}

// proxyBinary returns the command built with -race, once per test run.
func proxyBinary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	return proctest.Binary(t, true)
}

// proc is one running proxy.
type proc struct{ *proctest.Proc }

// startProxy runs the binary with its Pub/Sub, AMQP and HTTP listeners on
// 127.0.0.1:0 (and the embedded backend, unless args name kubemq.address),
// and waits until the listeners named in want have reported their address.
func startProxy(t *testing.T, want []string, args ...string) *proc {
	t.Helper()
	base := []string{"--gcp.listen", "127.0.0.1:0", "--amqp.listen", "127.0.0.1:0", "--amqp.tls_listen", "127.0.0.1:0", "--amqp.management_listen", "127.0.0.1:0",
		"--http.listen", "127.0.0.1:0", "--embedded.listen", "127.0.0.1:0", "--embedded.strict", "--log.level", "debug"}
	name := "proxy"
	if len(args) > 0 && args[0] == "embedded" {
		// The backend alone: the subcommand comes first, and only its own
		// listener applies.
		base = append([]string{"embedded"}, "--embedded.listen", "127.0.0.1:0", "--embedded.strict", "--log.level", "debug", "--http.listen", "127.0.0.1:0")
		args = args[1:]
		name = "backend"
	}
	p, err := proctest.Start(proxyBinary(t), name, t.TempDir(), want, append(base, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Stop(20 * time.Second) // the exit code is not what these tests check
		// Built with -race: a race report (or panic) in the log fails the
		// test, which the exit code alone would not.
		if pr := p.Problems(); len(pr) > 0 {
			t.Errorf("%s reported:\n%s", name, strings.Join(pr, "\n"))
		}
		if t.Failed() {
			t.Logf("%s log:%s", name, p.Tail(0))
		}
	})
	return &proc{p}
}

func (p *proc) addr(name string) string { return p.Addr(name) }

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
	if err := proctest.WaitReady(p.addr("http"), 30*time.Second); err != nil {
		t.Fatal(err)
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
