package gcp_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestRESTGcloud drives the proxy with the gcloud CLI, a real client of
// Google's REST API (CLOUDSDK_API_ENDPOINT_OVERRIDES_PUBSUB points it at the
// proxy; a dummy access token file stands in for credentials). Skipped when
// gcloud is not installed.
func TestRESTGcloud(t *testing.T) {
	gcloud, err := exec.LookPath("gcloud")
	if err != nil {
		t.Skip("gcloud is not installed: no run with the gcloud CLI")
	}
	e := startEnv(t)
	dir := t.TempDir()
	tok := filepath.Join(dir, "token")
	if err := os.WriteFile(tok, []byte("dummy-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(),
		"CLOUDSDK_CONFIG="+filepath.Join(dir, "config"),
		"CLOUDSDK_API_ENDPOINT_OVERRIDES_PUBSUB=http://"+e.addr+"/",
		"CLOUDSDK_AUTH_ACCESS_TOKEN_FILE="+tok,
		"CLOUDSDK_CORE_DISABLE_PROMPTS=1",
		"CLOUDSDK_CORE_DISABLE_USAGE_REPORTING=1",
	)
	run := func(wantOK bool, args ...string) string {
		t.Helper()
		cmd := exec.Command(gcloud, append(args, "--project="+e.project)...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		if wantOK && err != nil {
			t.Fatalf("gcloud %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		if !wantOK && err == nil {
			t.Fatalf("gcloud %s succeeded, want a failure:\n%s", strings.Join(args, " "), out)
		}
		return string(out)
	}
	top, sub, snap, sch := e.id("gtop"), e.id("gsub"), e.id("gsnap"), e.id("gsch")

	run(true, "pubsub", "topics", "create", top)
	if out := run(false, "pubsub", "topics", "create", top); !strings.Contains(out, "ALREADY_EXISTS") && !strings.Contains(out, "already exists") {
		t.Fatalf("second create: %s", out)
	}
	if out := run(false, "pubsub", "topics", "describe", e.id("nope")); !strings.Contains(out, "NOT_FOUND: Resource not found") {
		t.Fatalf("describe of a missing topic: %s", out)
	}
	run(true, "pubsub", "subscriptions", "create", sub, "--topic="+top, "--ack-deadline=20")
	run(true, "pubsub", "topics", "publish", top, "--message=hello", "--attribute=k=v")

	var pulled []struct {
		AckID   string `json:"ackId"`
		Message struct {
			Data       []byte            `json:"data"`
			Attributes map[string]string `json:"attributes"`
			MessageID  string            `json:"messageId"`
		} `json:"message"`
	}
	for range 20 {
		out := run(true, "pubsub", "subscriptions", "pull", sub, "--auto-ack", "--format=json")
		if err := json.Unmarshal([]byte(out[strings.Index(out, "["):]), &pulled); err != nil {
			t.Fatalf("pull output: %v\n%s", err, out)
		}
		if len(pulled) > 0 {
			break
		}
	}
	if len(pulled) != 1 || string(pulled[0].Message.Data) != "hello" || pulled[0].Message.Attributes["k"] != "v" {
		t.Fatalf("pulled %+v", pulled)
	}

	out := run(true, "pubsub", "topics", "list", "--format=value(name)")
	if !strings.Contains(out, "/topics/"+top) {
		t.Fatalf("topics list: %s", out)
	}
	if out := run(true, "pubsub", "topics", "list-subscriptions", top); !strings.Contains(out, "/subscriptions/"+sub) {
		t.Fatalf("list-subscriptions: %s", out)
	}
	run(true, "pubsub", "subscriptions", "update", sub, "--ack-deadline=30")
	if out := run(true, "pubsub", "subscriptions", "describe", sub, "--format=value(ackDeadlineSeconds)"); strings.TrimSpace(out) != "30" {
		t.Fatalf("describe after update: %q", out)
	}
	run(true, "pubsub", "topics", "update", top, "--update-labels=team=a")
	run(true, "pubsub", "topics", "add-iam-policy-binding", top, "--member=user:a@example.com", "--role=roles/pubsub.publisher")
	if out := run(true, "pubsub", "topics", "get-iam-policy", top, "--format=json"); !strings.Contains(out, "user:a@example.com") {
		t.Fatalf("get-iam-policy: %s", out)
	}
	run(true, "pubsub", "snapshots", "create", snap, "--subscription="+sub)
	run(true, "pubsub", "subscriptions", "seek", sub, "--snapshot="+snap)
	run(true, "pubsub", "subscriptions", "seek", sub, "--time=2020-01-01T00:00:00Z")
	run(true, "pubsub", "schemas", "create", sch, "--type=avro", "--definition="+restAvro)
	if out := run(true, "pubsub", "schemas", "list-revisions", sch, "--format=value(revisionId)"); strings.TrimSpace(out) == "" {
		t.Fatalf("list-revisions: %q", out)
	}
	run(true, "pubsub", "schemas", "delete", sch)
	run(true, "pubsub", "snapshots", "delete", snap)
	run(true, "pubsub", "subscriptions", "delete", sub)
	run(true, "pubsub", "topics", "delete", top)
	if out := run(false, "pubsub", "topics", "describe", top); !strings.Contains(out, "NOT_FOUND") {
		t.Fatalf("describe after delete: %s", out)
	}
}
