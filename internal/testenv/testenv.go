// Package testenv decides what a test does when an outside tool it needs
// (node and its packages, python3-pika, rabbitmq-server) is missing: on a
// developer machine it skips with the install hint; in CI (CI set) the
// missing tool is a failure, so a broken install step cannot pass unseen.
package testenv

import (
	"os"
	"testing"
)

// Missing skips or fails t because a dependency is absent.
func Missing(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf("CI: "+format, args...)
	}
	t.Skipf(format, args...)
}
