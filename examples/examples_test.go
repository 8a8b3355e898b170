// Package examples runs every example program in this directory against a
// freshly started proxy, so that the examples stay correct.
package examples

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kubemq-io/kubemq-proxy/internal/kubemqtest"
	"github.com/kubemq-io/kubemq-proxy/internal/proctest"
	"github.com/kubemq-io/kubemq-proxy/internal/testenv"
)

// startProxy builds the proxy (with -race) and runs it with the embedded
// backend and every listener on 127.0.0.1:0; it returns the bound
// addresses by listener name once /readyz answers 200.
func startProxy(t *testing.T) map[string]string {
	t.Helper()
	bin := proctest.Binary(t, true)
	want := []string{"http", "gcp", "amqp"}
	args := append([]string{"--gcp.listen", "127.0.0.1:0", "--amqp.listen", "127.0.0.1:0",
		"--amqp.tls_listen", "", "--amqp.management_listen", "127.0.0.1:0", "--http.listen", "127.0.0.1:0", "--embedded.listen", "127.0.0.1:0"}, kubemqtest.BinaryFlags()...)
	p, err := proctest.Start(bin, "proxy", t.TempDir(), want, args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Stop(20 * time.Second); err != nil {
			t.Errorf("proxy: %v", err)
		}
		if probs := p.Problems(); len(probs) > 0 {
			t.Errorf("proxy log: %s", strings.Join(probs, "\n"))
		}
		if t.Failed() {
			t.Logf("proxy log:\n%s", p.Tail(60))
		}
	})
	if err := proctest.WaitReady(p.Addr("http"), 30*time.Second); err != nil {
		t.Fatal(err)
	}
	addrs := map[string]string{}
	for _, l := range want {
		addrs[l] = p.Addr(l)
	}
	return addrs
}

// TestMain removes the proxy binary built for the examples.
func TestMain(m *testing.M) {
	proctest.Main(m)
}

// example is one program: how to run it and what it must print.
type example struct {
	name string
	dir  string   // working directory, relative to examples/
	cmd  []string // argv; cmd[0] is resolved by need
	want string   // a line the program prints after receiving
	need func(t *testing.T) string
}

func TestExamples(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the proxy and every example")
	}
	addrs := startProxy(t)
	env := append(os.Environ(),
		"PUBSUB_EMULATOR_HOST="+addrs["gcp"],
		"PUBSUB_PROJECT_ID=examples",
		"AMQP_URL=amqp://guest:guest@"+addrs["amqp"]+"/",
		// Keeps the Node client from probing for a GCE metadata server.
		"METADATA_SERVER_DETECTION=none",
	)
	goBin := func(pkg string) func(t *testing.T) string {
		return func(t *testing.T) string {
			bin := filepath.Join(t.TempDir(), "example")
			build := exec.Command("go", "build", "-o", bin, "./"+pkg)
			if out, err := build.CombinedOutput(); err != nil {
				t.Fatalf("go build ./%s: %v\n%s", pkg, err, out)
			}
			return bin
		}
	}
	node := func(t *testing.T) string {
		bin, err := exec.LookPath("node")
		if err != nil {
			testenv.Missing(t, "node is not installed")
		}
		if _, err := os.Stat("node/node_modules/amqplib"); err != nil {
			testenv.Missing(t, "examples/node has no node_modules: run npm ci in examples/node")
		}
		return bin
	}
	// Debian's python3 carries python3-pika; a python3 first on PATH (pyenv)
	// usually does not.
	python := func(t *testing.T) string {
		const py = "/usr/bin/python3"
		if err := exec.Command(py, "-c", "import pika").Run(); err != nil {
			testenv.Missing(t, "%s cannot import pika (apt-get install python3-pika)", py)
		}
		return py
	}
	for _, ex := range []example{
		{name: "go/pubsub", dir: ".", want: "received hello from Go Pub/Sub", need: goBin("go/pubsub")},
		{name: "go/amqp", dir: ".", want: "received hello from Go AMQP", need: goBin("go/amqp")},
		{name: "node/pubsub", dir: "node", cmd: []string{"pubsub.mjs"}, want: "received hello from Node Pub/Sub", need: node},
		{name: "node/amqp", dir: "node", cmd: []string{"amqp.mjs"}, want: "received hello from Node AMQP", need: node},
		{name: "python/amqp", dir: "python", cmd: []string{"amqp_pika.py"}, want: "received hello from Python AMQP", need: python},
	} {
		t.Run(ex.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, ex.need(t), ex.cmd...)
			cmd.Dir = ex.dir
			cmd.Env = env
			out, err := cmd.CombinedOutput()
			t.Logf("%s:\n%s", ex.name, out)
			if err != nil {
				t.Fatalf("%s: %v", ex.name, err)
			}
			if !hasLine(string(out), ex.want) {
				t.Fatalf("%s did not print %q", ex.name, ex.want)
			}
		})
	}
}

func hasLine(out, want string) bool {
	for _, l := range strings.Split(out, "\n") {
		if strings.TrimSpace(l) == want {
			return true
		}
	}
	return false
}
