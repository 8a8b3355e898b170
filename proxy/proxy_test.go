package proxy_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/kubemq-io/kubemq-proxy/internal/kubemqtest"
	"github.com/kubemq-io/kubemq-proxy/kubemqclient"
	"github.com/kubemq-io/kubemq-proxy/proxy"
)

// testConfig binds every listener to 127.0.0.1:0 and uses an external
// KubeMQ when KUBEMQ_ADDRESS is set, else the embedded server.
func testConfig(t *testing.T) proxy.Config {
	cfg := proxy.Defaults()
	cfg.GCP.Listen = "127.0.0.1:0"
	cfg.AMQP.Listen = "127.0.0.1:0"
	cfg.AMQP.TLSListen = ""
	cfg.AMQP.ManagementListen = "127.0.0.1:0"
	cfg.HTTP.Listen = "127.0.0.1:0"
	cfg.Embedded.Listen = "127.0.0.1:0"
	cfg.Embedded.DataDir = t.TempDir()
	cfg.Embedded.Strict = true
	cfg.Registry.Channel = kubemqclient.Channel("kubemq-proxy-test.registry", t.Name(), time.Now().Format("150405.000000000"))
	if kubemqtest.External() {
		cfg.KubeMQ.Address = kubemqtest.Address(t)
	}
	return cfg
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestLifecycleReadinessAndMetrics(t *testing.T) {
	p, err := proxy.New(testConfig(t), zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	base := "http://" + p.Addr("http")
	if code, _ := get(t, base+"/healthz"); code != 200 {
		t.Fatalf("/healthz = %d", code)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		code, body := get(t, base+"/readyz")
		if code == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz still %d after 5s: %s", code, body)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The registry replay reached KubeMQ, so the backend call histogram
	// has series.
	if code, body := get(t, base+"/metrics"); code != 200 || !strings.Contains(body, "go_goroutines") || !strings.Contains(body, "kubemq_proxy_backend_up 1") ||
		!strings.Contains(body, `kubemq_proxy_backend_call_seconds_count{op=`) {
		t.Fatalf("/metrics = %d", code)
	}
	if !kubemqtest.External() && p.Addr("embedded-kubemq") == "" {
		t.Fatal("embedded server address unknown")
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.Shutdown(ctx); err != nil {
		t.Fatalf("second Shutdown: %v", err)
	}
	if p.Ready() == nil {
		t.Fatal("ready after shutdown")
	}
}

func TestBackendDownIsNotReady(t *testing.T) {
	cfg := testConfig(t)
	cfg.KubeMQ.Address = "127.0.0.1:1" // nothing listens there
	p, err := proxy.New(cfg, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	defer p.Shutdown(context.Background())
	code, body := get(t, "http://"+p.Addr("http")+"/readyz")
	if code != 503 || !strings.Contains(body, "kubemq backend unreachable") {
		t.Fatalf("/readyz = %d %q", code, body)
	}
}
