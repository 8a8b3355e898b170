package proctest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// RunDir returns the directory for a test's process logs and data: a new
// directory named for the test under $envLogs when that is set (kept for
// inspection), else a test temporary directory.
func RunDir(t testing.TB, envLogs string) string {
	t.Helper()
	base := os.Getenv(envLogs)
	if base == "" {
		return t.TempDir()
	}
	dir := filepath.Join(base, strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())+"-"+time.Now().Format("150405"))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// LogLevel returns the processes' log level: $envLevel, default info.
func LogLevel(envLevel string) string {
	if v := os.Getenv(envLevel); v != "" {
		return v
	}
	return "info"
}
