package proctest

import (
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// EnvBinary names the environment variable that points the suites at a
// prebuilt binary (e.g. a release build) instead of building one.
const EnvBinary = "PROXY_BIN"

// module is the main package that Binary builds; go build resolves it from
// any directory inside the module, which is where go test runs a test.
const module = "github.com/kubemq-io/kubemq-proxy"

// build is one "go build" of the binary, done at most once.
type build struct {
	once sync.Once
	path string
	dir  string // removed by Cleanup; "" with $PROXY_BIN
	err  error
}

var (
	buildsMu sync.Mutex // guards builds
	builds   = map[bool]*build{}
)

// Binary returns the path of the kubemq-proxy binary, built once per test
// binary (and per race setting): with the race detector when race is set,
// so that a race inside the proxy is printed to its log and reported by
// Proc.Problems. With $PROXY_BIN set, that binary is used as it is. A
// failed build fails t. TestMain should call Cleanup after m.Run.
func Binary(t testing.TB, race bool) string {
	t.Helper()
	buildsMu.Lock()
	b := builds[race]
	if b == nil {
		b = &build{}
		builds[race] = b
	}
	buildsMu.Unlock()
	b.once.Do(func() { b.run(race) })
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}

func (b *build) run(race bool) {
	if p := os.Getenv(EnvBinary); p != "" {
		b.path = p
		return
	}
	dir, err := os.MkdirTemp("", "kubemq-proxy-test")
	if err != nil {
		b.err = err
		return
	}
	b.dir = dir
	b.path = filepath.Join(dir, "kubemq-proxy")
	args := []string{"build", "-o", b.path}
	if race {
		args = append(args, "-race")
	}
	args = append(args, module)
	if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
		b.err = fmt.Errorf("go build: %v\n%s", err, out)
		return
	}
	statSources()
}

// statSources stats every Go source file of the module, plus go.mod and
// go.sum. go test caches a passing result by the test binary and the files
// the test touched; the proxy binary is built at run time, outside what go
// test tracks, so without this a change to the proxy alone would replay a
// cached pass of a suite that runs the binary.
func statSources() {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return
	}
	root := filepath.Dir(strings.TrimSpace(string(out)))
	filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "node_modules", "testdata":
				return filepath.SkipDir
			}
			return nil
		}
		if n := d.Name(); strings.HasSuffix(n, ".go") || n == "go.mod" || n == "go.sum" {
			os.Stat(path) // recorded by go test's cache key
		}
		return nil
	})
}

// Main is the TestMain of a suite that runs the binary: it runs the tests,
// removes what Binary built and exits with the tests' code. Shortly before
// the binary's -timeout it prints which tests still run, where their
// goroutines wait and the ends of the live processes' logs, kills the
// processes and exits (watchdog.go).
func Main(m *testing.M) {
	disarm := Watchdog()
	code := m.Run()
	disarm()
	Cleanup()
	os.Exit(code)
}

// Cleanup removes the binaries Binary built (tens of MB each, left behind
// by every run otherwise). Call it from TestMain after m.Run.
func Cleanup() {
	buildsMu.Lock()
	defer buildsMu.Unlock()
	for _, b := range builds {
		if b.dir != "" {
			os.RemoveAll(b.dir)
		}
	}
}
