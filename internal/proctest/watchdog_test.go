package proctest

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// envHang makes TestWatchdogHang hang, in the test binary run by
// TestWatchdogReportsHungTest.
const envHang = "PROCTEST_WATCHDOG_HANG"

func TestWatchdogHang(t *testing.T) {
	if os.Getenv(envHang) == "" {
		t.Skip("run by TestWatchdogReportsHungTest")
	}
	if _, err := startHelper(t, "ok", "gcp"); err != nil {
		t.Fatal(err)
	}
	hangHere()
}

func hangHere() { select {} }

func TestWatchdogReportsHungTest(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestWatchdogHang$", "-test.timeout=4s")
	cmd.Env = append(os.Environ(), envHang+"=1")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 {
		t.Fatalf("want exit code 2 from the watchdog, got %v:\n%s", err, out)
	}
	s := string(out)
	if strings.Contains(s, "panic: test timed out") {
		t.Fatalf("go test's own timeout fired first:\n%s", s)
	}
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if last := lines[len(lines)-1]; last != "==== running: TestWatchdogHang" {
		t.Fatalf("last line %q, want the hung test's name:\n%s", last, s)
	}
	for _, want := range []string{"---- helper (pid ", "proctest.hangHere", "watchdog_test.go:"} {
		if !strings.Contains(s, want) {
			t.Errorf("report lacks %q:\n%s", want, s)
		}
	}
}
