package amqp091

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Node amqplib and Python pika as peers, through the scripts in
// test/amqp-clients. Each test is skipped, saying why, when its runtime or
// library is not installed (npm install in that folder; Debian's
// python3-pika).

func clientsDir(t *testing.T) string {
	dir, err := filepath.Abs(filepath.Join("..", "test", "amqp-clients"))
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

func runClient(t *testing.T, e *env, name string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, append(args, e.url())...)
	cmd.Dir = clientsDir(t)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "OK") {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
}

func TestNodeAmqplib(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed")
	}
	if _, err := os.Stat(filepath.Join(clientsDir(t), "node_modules", "amqplib")); err != nil {
		t.Skip("amqplib is not installed: run npm install in test/amqp-clients")
	}
	brokers(t, func(t *testing.T, e *env) { runClient(t, e, node, "node_client.js") })
}

func TestPythonPika(t *testing.T) {
	py := "/usr/bin/python3"
	if _, err := os.Stat(py); err != nil {
		t.Skip("/usr/bin/python3 is not installed")
	}
	if err := exec.Command(py, "-c", "import pika").Run(); err != nil {
		t.Skip("pika is not installed (Debian package python3-pika)")
	}
	brokers(t, func(t *testing.T, e *env) { runClient(t, e, py, "pika_client.py") })
}
