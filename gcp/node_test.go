package gcp_test

import (
	"github.com/kubemq-io/kubemq-proxy/internal/testenv"

	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// TestNodeClient runs test/node-pubsub (the official Node client) against
// the proxy. It needs node and `npm ci` in that directory (.ci/run does
// both); without them it skips, or fails under CI.
func TestNodeClient(t *testing.T) { runNodeTest(t, "pubsub.test.mjs", "PUBSUB_EMULATOR_HOST") }

// runNodeTest runs script of test/node-pubsub with node's test runner against a fresh proxy,
// whose address it passes in endpointVar.
func runNodeTest(t *testing.T, script, endpointVar string) {
	t.Helper()
	dir, err := filepath.Abs("../test/node-pubsub")
	if err != nil {
		t.Fatal(err)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		testenv.Missing(t, "node not installed")
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@google-cloud", "pubsub")); err != nil {
		testenv.Missing(t, "run `npm ci` in test/node-pubsub to enable the Node client test")
	}
	e := startEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "--test", "--test-reporter=spec", script)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), endpointVar+"="+e.addr, "PUBSUB_PROJECT_ID="+e.project, "TEST_SUFFIX="+e.suffix,
		// Never probe the GCE metadata server (a non-loopback address).
		"METADATA_SERVER_DETECTION=none", "GCE_METADATA_HOST=127.0.0.1:1", "GCE_METADATA_IP=127.0.0.1:1")
	out, err := cmd.CombinedOutput()
	t.Logf("node --test %s:\n%s", script, out)
	if err != nil {
		t.Fatalf("node client test %s failed: %v", script, err)
	}
}
