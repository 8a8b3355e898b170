// Package kubemqtest gives tests a KubeMQ server: the one named by $KUBEMQ_ADDRESS, or an
// embedded server in strict mode started for the test.
package kubemqtest

import (
	"net"
	"os"
	"sync"
	"testing"

	"google.golang.org/grpc"

	"go.uber.org/zap/zaptest"

	"github.com/kubemq-io/kubemq-proxy/embedded"
)

// EnvAddress names the environment variable that points tests at an external KubeMQ server.
const EnvAddress = "KUBEMQ_ADDRESS"

// External reports whether tests run against an external server ($KUBEMQ_ADDRESS set).
func External() bool { return os.Getenv(EnvAddress) != "" }

// Address returns host:port of a KubeMQ server for tests: $KUBEMQ_ADDRESS if set, otherwise an
// embedded server in strict mode on 127.0.0.1:0 with a t.TempDir() data dir, stopped at
// t.Cleanup, which fails the test if the server saw a pattern that is hazardous on a real
// KubeMQ (CheckStrict).
func Address(t testing.TB) string {
	t.Helper()
	if a := os.Getenv(EnvAddress); a != "" {
		return a
	}
	addr, srv := StartEmbedded(t, embedded.Options{Strict: true, DataDir: t.TempDir()})
	CheckStrict(t, srv)
	return addr
}

// CheckStrict fails t at its cleanup (before the cleanups registered earlier, such as the
// server's own stop) if srv counted any pattern that is hazardous on a real KubeMQ server
// (embedded.StrictStats): strict mode refuses them, and a caller that copes with the refusal
// would hide them otherwise.
func CheckStrict(t testing.TB, srv *embedded.Server) {
	t.Cleanup(func() {
		st := srv.StrictStats()
		toleratedMu.Lock()
		fs := tolerated[t]
		delete(tolerated, t)
		toleratedMu.Unlock()
		for _, f := range fs {
			f(&st)
		}
		if st.Total() != 0 {
			t.Errorf("kubemqtest: the embedded server saw patterns that are hazardous on a real KubeMQ: %+v", st)
		}
	})
}

// Tolerate lets a test provoke a hazardous pattern on purpose (a cut connection ends a stream
// during a Get; a test of the error a foreign settlement gets): f clears the counters it expects
// before CheckStrict judges them. t is the test that asked for the server.
func Tolerate(t testing.TB, f func(*embedded.StrictStats)) {
	toleratedMu.Lock()
	defer toleratedMu.Unlock()
	tolerated[t] = append(tolerated[t], f)
}

// tolerated maps a test to the Tolerate functions CheckStrict applies.
var (
	toleratedMu sync.Mutex
	tolerated   = map[testing.TB][]func(*embedded.StrictStats){}
)

// EnvScanDelays names the environment variable that, when not empty, makes every embedded
// server of the tests release delayed messages as a real KubeMQ does (embedded.Options.ScanDelays
// for StartEmbedded, --embedded.scan_delays for the binary): late by up to 500 ms, and behind the
// 1024 earliest sent.
const EnvScanDelays = "KUBEMQ_SCAN_DELAYS"

// ScanDelays reports whether $KUBEMQ_SCAN_DELAYS is set.
func ScanDelays() bool { return os.Getenv(EnvScanDelays) != "" }

// BinaryFlags are the flags that make the proxy binary run its embedded server as the tests'
// servers run: strict, and releasing delayed messages as a real KubeMQ does under
// $KUBEMQ_SCAN_DELAYS.
func BinaryFlags() []string {
	if ScanDelays() {
		return []string{"--embedded.strict", "--embedded.scan_delays"}
	}
	return []string{"--embedded.strict"}
}

// StartEmbedded starts an embedded server with opts on 127.0.0.1:0 and stops it at t.Cleanup.
// A nil opts.Logger becomes a zaptest logger; $KUBEMQ_SCAN_DELAYS sets opts.ScanDelays.
func StartEmbedded(t testing.TB, opts embedded.Options) (addr string, srv *embedded.Server) {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = zaptest.NewLogger(t)
	}
	opts.ScanDelays = opts.ScanDelays || ScanDelays()
	srv, err := embedded.New(opts)
	if err != nil {
		t.Fatalf("kubemqtest: start embedded server: %v", err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		srv.Stop()
		t.Fatalf("kubemqtest: listen: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(lis) }()
	addr = lis.Addr().String()
	started.Store(addr, srv)
	t.Cleanup(func() {
		started.Delete(addr)
		if err := srv.Close(); err != nil {
			t.Errorf("kubemqtest: close embedded server: %v", err)
		}
		if err := <-done; err != nil {
			t.Errorf("kubemqtest: serve: %v", err)
		}
	})
	return addr, srv
}

// started maps the address of each embedded server StartEmbedded runs to it.
var started sync.Map

// EnvLink names the environment variable that chooses how tests reach an
// embedded server: "memory" through its in-process channel
// (embedded.Server.Channel, what the proxy binary uses), "tcp" through its
// listener.
const EnvLink = "KUBEMQ_LINK"

// InProcess reports whether a suite reaches its embedded server through the
// in-process channel: $KUBEMQ_LINK if set, else the suite's default.
func InProcess(byDefault bool) bool {
	switch os.Getenv(EnvLink) {
	case "memory":
		return true
	case "tcp":
		return false
	}
	return byDefault
}

// Link returns the in-process channel of the embedded server StartEmbedded
// runs on addr when $KUBEMQ_LINK is "memory", else nil: dial addr. Use it
// as kubemqclient.Options.Conn. It shares sent payloads as the proxy's
// channel does (embedded.SharePayloads).
func Link(addr string) grpc.ClientConnInterface {
	if !InProcess(false) {
		return nil
	}
	if srv, ok := started.Load(addr); ok {
		return srv.(*embedded.Server).Channel(embedded.SharePayloads())
	}
	return nil
}
