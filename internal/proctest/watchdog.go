package proctest

import (
	"flag"
	"fmt"
	"os"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"time"
)

// watchdogLead is how long before go test's own -timeout panic the
// watchdog reports (a tenth of the timeout when that is shorter). That panic prints every goroutine of the test binary
// first and the name of the hung test at the top, so a CI log that keeps
// only its end loses which test hung; the watchdog's report ends with it.
const watchdogLead = 30 * time.Second

// live is the set of started processes that have not exited, for the
// watchdog's report.
var live sync.Map // *Proc -> struct{}

// Watchdog arms the report for the -test.timeout of the test binary
// (none without one); the returned func disarms it.
func Watchdog() func() {
	if !flag.Parsed() {
		flag.Parse()
	}
	f := flag.Lookup("test.timeout")
	if f == nil {
		return func() {}
	}
	timeout, err := time.ParseDuration(f.Value.String())
	if err != nil || timeout <= 0 {
		return func() {}
	}
	start := time.Now()
	t := time.AfterFunc(timeout-min(watchdogLead, timeout/10), func() { watchdogFire(start, timeout) })
	return func() { t.Stop() }
}

// watchdogFire prints, last, what the suite is stuck on, kills the
// processes it started and ends the test binary.
func watchdogFire(start time.Time, timeout time.Duration) {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n==== proctest watchdog: %v of the -timeout %v passed\n", time.Since(start).Round(time.Second), timeout)
	live.Range(func(k, _ any) bool {
		p := k.(*Proc)
		fmt.Fprintf(&b, "---- %s (pid %d, log %s), last lines:%s\n", p.name, p.Pid(), p.logPath, clip(p.Tail(6), 300))
		return true
	})
	stuck := testGoroutines(string(buf))
	b.WriteString("---- goroutines in test code:\n")
	for _, g := range stuck {
		b.WriteString(g.block)
		b.WriteString("\n\n")
	}
	b.WriteString("---- where each test goroutine waits (innermost test frame):\n")
	for _, g := range stuck {
		fmt.Fprintf(&b, "  %s at %s\n", g.header, g.frame)
	}
	fmt.Fprintf(&b, "==== running: %s\n", strings.Join(runningTests(string(buf)), ", "))
	os.Stderr.WriteString(b.String())
	live.Range(func(k, _ any) bool {
		k.(*Proc).Kill()
		return true
	})
	Cleanup()
	os.Exit(2)
}

type stuckGoroutine struct {
	header string // "goroutine 7 [chan receive, 3 minutes]"
	frame  string // the innermost frame in a _test.go file: func and file:line
	block  string
}

// testGoroutines picks from a runtime.Stack dump of all goroutines those
// with a frame in a _test.go file, but for the main goroutine (TestMain).
func testGoroutines(dump string) []stuckGoroutine {
	var out []stuckGoroutine
	for _, block := range strings.Split(dump, "\n\n") {
		lines := strings.Split(strings.TrimSpace(block), "\n")
		if len(lines) < 3 {
			continue
		}
		for i := 2; i < len(lines); i += 2 {
			file := strings.TrimSpace(lines[i])
			if !strings.Contains(file, "_test.go:") {
				continue
			}
			if j := strings.LastIndex(file, " +0x"); j > 0 {
				file = file[:j]
			}
			fn := lines[i-1]
			if j := strings.LastIndex(fn, "("); j > 0 {
				fn = fn[:j]
			}
			if strings.HasSuffix(fn, ".TestMain") { // the main goroutine, in m.Run
				break
			}
			out = append(out, stuckGoroutine{header: strings.TrimSuffix(lines[0], ":"), frame: fn + " " + file, block: block})
			break
		}
	}
	return out
}

var testFunc = regexp.MustCompile(`^\S+\.(Test\w*)\(`)

// runningTests names the test functions in a dump: those that
// testing.tRunner called.
func runningTests(dump string) []string {
	var names []string
	lines := strings.Split(dump, "\n")
	for i := range lines {
		if !strings.HasPrefix(lines[i], "testing.tRunner(") || i < 2 {
			continue
		}
		if m := testFunc.FindStringSubmatch(lines[i-2]); m != nil && m[1] != "TestMain" {
			names = append(names, m[1])
		}
	}
	return names
}

func clip(s string, n int) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		if len(l) > n {
			lines[i] = l[:n] + "..."
		}
	}
	return strings.Join(lines, "\n")
}
