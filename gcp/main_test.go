package gcp_test

import (
	"os"
	"testing"

	"github.com/kubemq-io/kubemq-proxy/internal/proctest"
)

// TestMain arms proctest's watchdog: a test that hangs is named, with
// where its goroutines wait, in the last lines before the -timeout.
func TestMain(m *testing.M) {
	disarm := proctest.Watchdog()
	code := m.Run()
	disarm()
	os.Exit(code)
}
