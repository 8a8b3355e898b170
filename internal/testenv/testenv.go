// Package testenv decides what a test does when an outside tool it needs
// (node and its packages, python3-pika, rabbitmq-server) is missing: on a
// developer machine it skips with the install hint; in CI (CI set) the
// missing tool is a failure, so a broken install step cannot pass unseen.
package testenv

import (
	"net"
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

// NonLoopbackIP returns an IPv4 address of this machine that is not a loopback address (so a
// server listening on it sees its peers as non-loopback), or skips t.
func NonLoopbackIP(t testing.TB) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Skip(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && n.IP.To4() != nil {
			return n.IP.String()
		}
	}
	t.Skip("no non-loopback IPv4 address")
	return ""
}
