package proxy_test

import (
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/kubemq-io/kubemq-proxy/internal/testenv"
	"github.com/kubemq-io/kubemq-proxy/proxy"
)

func request(t *testing.T, method, url, token string) int {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(`{"level":"info"}`))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// /healthz, /readyz and /metrics answer anyone; /state, /loglevel and /debug/pprof/ answer loopback peers,
// and others only with the admin token (read from http.admin_token_file here).
func TestAdminEndpointsLoopbackOrToken(t *testing.T) {
	ip := testenv.NonLoopbackIP(t)
	for _, withToken := range []bool{false, true} {
		cfg := testConfig(t)
		cfg.HTTP.Listen = net.JoinHostPort(ip, "0")
		if withToken {
			f := filepath.Join(t.TempDir(), "token")
			if err := os.WriteFile(f, []byte("s3cret\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			cfg.HTTP.AdminTokenFile = f
		}
		p, err := proxy.New(cfg, zaptest.NewLogger(t))
		if err != nil {
			t.Fatal(err)
		}
		p.SetLogLevel(zap.NewAtomicLevel())
		if err := p.Start(context.Background(), nil); err != nil {
			t.Fatal(err)
		}
		base := "http://" + p.Addr("http")
		for _, path := range []string{"/healthz", "/metrics"} {
			if code := request(t, "GET", base+path, ""); code != 200 {
				t.Errorf("token %v: GET %s from %s = %d, want 200", withToken, path, ip, code)
			}
		}
		wantDenied := http.StatusForbidden
		if withToken {
			wantDenied = http.StatusUnauthorized
		}
		for _, c := range []struct{ method, path string }{{"GET", "/state"}, {"GET", "/loglevel"}, {"PUT", "/loglevel"}, {"GET", "/debug/pprof/"}, {"GET", "/debug/pprof/heap"}} {
			if code := request(t, c.method, base+c.path, ""); code != wantDenied {
				t.Errorf("token %v: %s %s without token from %s = %d, want %d", withToken, c.method, c.path, ip, code, wantDenied)
			}
			if code := request(t, c.method, base+c.path, "wrong"); code != wantDenied {
				t.Errorf("token %v: %s %s with a wrong token = %d, want %d", withToken, c.method, c.path, code, wantDenied)
			}
			if withToken {
				if code := request(t, c.method, base+c.path, "s3cret"); code != 200 {
					t.Errorf("%s %s with the token = %d, want 200", c.method, c.path, code)
				}
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := p.Shutdown(ctx); err != nil {
			t.Error(err)
		}
		cancel()
	}

	// From loopback, /state needs no token.
	cfg := testConfig(t)
	p, err := proxy.New(cfg, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	defer p.Shutdown(context.Background())
	if code := request(t, "GET", "http://"+p.Addr("http")+"/state", ""); code != 200 {
		t.Errorf("GET /state from loopback = %d", code)
	}
}

// PUT /loglevel takes a JSON body as curl -d sends it (labelled form-encoded) and as a plain
// form; the level changes.
func TestLogLevelBodies(t *testing.T) {
	cfg := testConfig(t)
	p, err := proxy.New(cfg, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	level := zap.NewAtomicLevel()
	p.SetLogLevel(level)
	if err := p.Start(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	defer p.Shutdown(context.Background())
	url := "http://" + p.Addr("http") + "/loglevel"
	for _, c := range []struct{ ctype, body, want string }{
		{"application/x-www-form-urlencoded", `{"level":"debug"}`, "debug"},
		{"", `{"level":"warn"}`, "warn"},
		{"application/json", `{"level":"error"}`, "error"},
		{"application/x-www-form-urlencoded", `level=info`, "info"},
	} {
		req, _ := http.NewRequest("PUT", url, strings.NewReader(c.body))
		if c.ctype != "" {
			req.Header.Set("Content-Type", c.ctype)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 || level.Level().String() != c.want {
			t.Errorf("PUT %q as %q: %d, level %s; want 200, %s", c.body, c.ctype, resp.StatusCode, level.Level(), c.want)
		}
	}
}
