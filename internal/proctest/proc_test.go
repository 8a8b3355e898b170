package proctest

import (
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// helperArg makes the test binary act as the process under test: the
// argument after it says how (see helper).
const helperArg = "proctest-helper"

func TestMain(m *testing.M) {
	if len(os.Args) > 2 && os.Args[1] == helperArg {
		os.Exit(helper(os.Args[2]))
	}
	Main(m)
}

// helper imitates the binary's stderr: JSON "listening" lines, then
// whatever mode asks for, then it waits for SIGTERM.
func helper(mode string) int {
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	if mode == "exit" {
		fmt.Fprintln(os.Stderr, `{"level":"fatal","msg":"bad flag"}`)
		return 3
	}
	fmt.Fprintln(os.Stderr, `{"level":"info","msg":"starting"}`)
	fmt.Fprintln(os.Stderr, `{"level":"info","msg":"listening","listener":"gcp","address":"127.0.0.1:1001"}`)
	fmt.Fprintln(os.Stderr, "not json")
	fmt.Fprintln(os.Stderr, `{"level":"info","msg":"listening","listener":"http","address":"127.0.0.1:1002"}`)
	switch mode {
	case "race":
		fmt.Fprintln(os.Stderr, "==================")
		fmt.Fprintln(os.Stderr, "WARNING: DATA RACE")
		fmt.Fprintln(os.Stderr, "Write at 0x00c000123 by goroutine 7:")
	case "ignore-term":
		signal.Ignore(syscall.SIGTERM)
		select {}
	}
	<-term
	if mode == "bad-exit" {
		return 2
	}
	return 0
}

func startHelper(t *testing.T, mode string, want ...string) (*Proc, error) {
	t.Helper()
	p, err := Start(os.Args[0], "helper", t.TempDir(), want, helperArg, mode)
	if p != nil {
		t.Cleanup(p.Kill)
	}
	return p, err
}

func TestStartReadsListeners(t *testing.T) {
	p, err := startHelper(t, "ok", "gcp", "http")
	if err != nil {
		t.Fatal(err)
	}
	if got := p.Addr("gcp"); got != "127.0.0.1:1001" {
		t.Errorf("Addr(gcp) = %q", got)
	}
	if got := p.Addr("http"); got != "127.0.0.1:1002" {
		t.Errorf("Addr(http) = %q", got)
	}
	if got := p.Addr("amqp"); got != "" {
		t.Errorf("Addr(amqp) = %q, want none", got)
	}
	if p.Exited() {
		t.Fatal("Exited before Stop")
	}
	if err := p.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if !p.Exited() {
		t.Error("not Exited after Stop")
	}
	if pr := p.Problems(); len(pr) != 0 {
		t.Errorf("Problems = %q, want none", pr)
	}
	if p.Name() != "helper" || !strings.HasPrefix(p.LogPath(), os.TempDir()) {
		t.Errorf("Name %q LogPath %q", p.Name(), p.LogPath())
	}
	all := p.Tail(0)
	if !strings.Contains(all, `"msg":"starting"`) || !strings.Contains(all, "not json") {
		t.Errorf("Tail(0) misses log lines:%s", all)
	}
	if last := p.Tail(1); last != "\n"+`{"level":"info","msg":"listening","listener":"http","address":"127.0.0.1:1002"}` {
		t.Errorf("Tail(1) = %q", last)
	}
}

func TestStartExitBeforeListening(t *testing.T) {
	_, err := startHelper(t, "exit", "gcp")
	if err == nil || !strings.Contains(err.Error(), "exited before listening") || !strings.Contains(err.Error(), "bad flag") {
		t.Fatalf("err = %v, want an early exit with the log's end", err)
	}
}

func TestProblemsCollectsRaceReport(t *testing.T) {
	p, err := startHelper(t, "race", "http")
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	want := []string{"WARNING: DATA RACE", "Write at 0x00c000123 by goroutine 7:"}
	if got := p.Problems(); !slices.Equal(got, want) {
		t.Errorf("Problems = %q, want %q", got, want)
	}
}

func TestStopReportsExitCode(t *testing.T) {
	p, err := startHelper(t, "bad-exit", "http")
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Stop(10 * time.Second); err == nil || !strings.Contains(err.Error(), "exit code 2") {
		t.Fatalf("Stop = %v, want exit code 2", err)
	}
}

func TestStopKillsAfterTimeout(t *testing.T) {
	p, err := startHelper(t, "ignore-term", "http")
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Stop(200 * time.Millisecond); err == nil || !strings.Contains(err.Error(), "no exit") {
		t.Fatalf("Stop = %v, want no exit after SIGTERM", err)
	}
	if !p.Exited() {
		t.Error("still running after Stop's kill")
	}
}

func TestKill(t *testing.T) {
	p, err := startHelper(t, "ok", "gcp")
	if err != nil {
		t.Fatal(err)
	}
	p.Kill()
	if !p.Exited() {
		t.Fatal("not Exited after Kill")
	}
	p.Kill() // idempotent
}

func TestBinaryFromEnv(t *testing.T) {
	t.Setenv(EnvBinary, "/opt/kubemq-proxy")
	if got := Binary(t, false); got != "/opt/kubemq-proxy" {
		t.Fatalf("Binary = %q, want $%s", got, EnvBinary)
	}
}

func TestRunDirAndLogLevel(t *testing.T) {
	const envLogs, envLevel = "PROCTEST_TEST_LOGS", "PROCTEST_TEST_LOG_LEVEL"
	t.Setenv(envLogs, "")
	t.Setenv(envLevel, "")
	if d := RunDir(t, envLogs); !strings.HasPrefix(d, os.TempDir()) {
		t.Errorf("RunDir = %q, want a temporary directory", d)
	}
	if l := LogLevel(envLevel); l != "info" {
		t.Errorf("LogLevel = %q, want info", l)
	}
	base := t.TempDir()
	t.Setenv(envLogs, base)
	t.Setenv(envLevel, "debug")
	d := RunDir(t, envLogs)
	if !strings.HasPrefix(d, base+string(os.PathSeparator)+"TestRunDirAndLogLevel-") {
		t.Errorf("RunDir = %q, want a directory for the test under %s", d, base)
	}
	if st, err := os.Stat(d); err != nil || !st.IsDir() {
		t.Errorf("RunDir did not create %s: %v", d, err)
	}
	if l := LogLevel(envLevel); l != "debug" {
		t.Errorf("LogLevel = %q, want debug", l)
	}
}
