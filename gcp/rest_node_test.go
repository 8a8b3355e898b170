package gcp_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/kubemq-io/kubemq-proxy/internal/testenv"
)

// TestNodeClientREST runs test/node-pubsub/rest.test.mjs: the official
// Node client with its REST transport (fallback: 'rest') against the REST
// API on the proxy's gRPC port. Same needs as TestNodeClient.
func TestNodeClientREST(t *testing.T) {
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
	cmd := exec.CommandContext(ctx, node, "--test", "--test-reporter=spec", "rest.test.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "PUBSUB_REST_ENDPOINT="+e.addr, "PUBSUB_PROJECT_ID="+e.project, "TEST_SUFFIX="+e.suffix,
		"METADATA_SERVER_DETECTION=none", "GCE_METADATA_HOST=127.0.0.1:1", "GCE_METADATA_IP=127.0.0.1:1")
	out, err := cmd.CombinedOutput()
	t.Logf("node --test:\n%s", out)
	if err != nil {
		t.Fatalf("node REST client test failed: %v", err)
	}
}
