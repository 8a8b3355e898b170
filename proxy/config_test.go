package proxy_test

import (
	"strings"
	"testing"
	"time"

	"github.com/kubemq-io/kubemq-proxy/proxy"
)

// TestValidate: every rule of Config.Validate refuses a value just past its
// bound with a one-line error that names the key, and accepts the bound
// itself; the defaults are valid.
func TestValidate(t *testing.T) {
	const file = "config_test.go" // exists: only the combination can be wrong
	bad := []struct {
		key string
		mut func(*proxy.Config)
	}{
		{"gcp.listen", func(c *proxy.Config) { c.GCP.Listen = "nonsense" }},
		{"amqp.listen", func(c *proxy.Config) { c.AMQP.Listen = "127.0.0.1" }},
		{"amqp.tls_listen", func(c *proxy.Config) { c.AMQP.TLSListen = ":" }},
		{"http.listen", func(c *proxy.Config) { c.HTTP.Listen = "a:b:c" }},
		{"embedded.listen", func(c *proxy.Config) { c.Embedded.Listen = "localhost" }},
		{"kubemq.address", func(c *proxy.Config) { c.KubeMQ.Address = "no-port" }},
		{"embedded.tls_cert_file", func(c *proxy.Config) { c.Embedded.TLSCertFile = file }},
		{"embedded.tls_key_file", func(c *proxy.Config) { c.Embedded.TLSKeyFile = file }},
		{"amqp.cert_file", func(c *proxy.Config) { c.AMQP.CertFile = file }},
		{"amqp.key_file", func(c *proxy.Config) { c.AMQP.KeyFile = file }},
		{"amqp.cert_file", func(c *proxy.Config) { c.AMQP.CertFile, c.AMQP.KeyFile = "/nonexistent", file }},
		{"amqp.key_file", func(c *proxy.Config) { c.AMQP.CertFile, c.AMQP.KeyFile = file, "/nonexistent" }},
		{"amqp.client_ca_file", func(c *proxy.Config) { c.AMQP.ClientCAFile = "/nonexistent" }},
		{"amqp.client_ca_file", func(c *proxy.Config) { c.AMQP.ClientCAFile = file }},
		{"kubemq.ca_file", func(c *proxy.Config) { c.KubeMQ.CAFile = "/nonexistent" }},
		{"kubemq.ca_file", func(c *proxy.Config) { c.KubeMQ.CAFile = file }},
		{"kubemq.server_name", func(c *proxy.Config) { c.KubeMQ.ServerName = "kubemq" }},
		{"kubemq.cert_file", func(c *proxy.Config) { c.KubeMQ.TLS, c.KubeMQ.CertFile = true, file }},
		{"kubemq.key_file", func(c *proxy.Config) { c.KubeMQ.TLS, c.KubeMQ.KeyFile = true, file }},
		{"embedded.tls_cert_file", func(c *proxy.Config) { c.Embedded.TLSCertFile, c.Embedded.TLSKeyFile = "/nonexistent", file }},
		{"gcp.max_message_bytes", func(c *proxy.Config) { c.GCP.MaxMessageBytes = 1023 }},
		{"gcp.max_message_bytes", func(c *proxy.Config) { c.GCP.MaxMessageBytes = 64<<20 + 1 }},
		{"gcp.max_inflight_per_subscription", func(c *proxy.Config) { c.GCP.MaxInflightPerSubscription = 0 }},
		{"gcp.max_outstanding_messages", func(c *proxy.Config) { c.GCP.MaxOutstandingMessages = 0 }},
		{"gcp.runtime_idle", func(c *proxy.Config) { c.GCP.RuntimeIdle = 999 * time.Millisecond }},
		{"gcp.stream_close_after", func(c *proxy.Config) { c.GCP.StreamCloseAfter = 0 }},
		{"amqp.heartbeat", func(c *proxy.Config) { c.AMQP.Heartbeat = -time.Second }},
		{"amqp.heartbeat", func(c *proxy.Config) { c.AMQP.Heartbeat = 65536 * time.Second }},
		{"amqp.frame_max", func(c *proxy.Config) { c.AMQP.FrameMax = 4095 }},
		{"amqp.frame_max", func(c *proxy.Config) { c.AMQP.FrameMax = 1<<20 + 1 }},
		{"amqp.channel_max", func(c *proxy.Config) { c.AMQP.ChannelMax = 0 }},
		{"amqp.channel_max", func(c *proxy.Config) { c.AMQP.ChannelMax = 65536 }},
		{"amqp.max_body_size", func(c *proxy.Config) { c.AMQP.MaxBodySize = 0 }},
		{"amqp.max_body_size", func(c *proxy.Config) { c.AMQP.MaxBodySize = 96<<20 + 1 }},
		{"amqp.max_connections", func(c *proxy.Config) { c.AMQP.MaxConnections = -1 }},
		{"amqp.max_pending_publish_bytes", func(c *proxy.Config) { c.AMQP.MaxPendingPublishBytes = -1 }},
		{"amqp.metrics_queue_labels", func(c *proxy.Config) { c.AMQP.MetricsQueueLabels = -1 }},
		{"amqp.metrics_queue_labels", func(c *proxy.Config) { c.AMQP.MetricsQueueLabels = 10001 }},
		{"kubemq.client_id", func(c *proxy.Config) { c.KubeMQ.ClientID = "" }},
		{"registry.channel", func(c *proxy.Config) { c.Registry.Channel = "a b" }},
		{"registry.snapshot_interval", func(c *proxy.Config) { c.Registry.SnapshotInterval = 59 * time.Second }},
		{"registry.snapshot_interval", func(c *proxy.Config) { c.Registry.SnapshotInterval = 12*time.Hour + time.Second }},
		{"delivery.record_delay", func(c *proxy.Config) { c.Delivery.RecordDelay = 999 * time.Millisecond }},
		{"delivery.record_delay", func(c *proxy.Config) { c.Delivery.RecordDelay = 1500 * time.Millisecond }},
		{"delivery.record_delay", func(c *proxy.Config) { c.Delivery.RecordDelay = time.Hour + time.Second }},
		{"log.level", func(c *proxy.Config) { c.Log.Level = "loud" }},
		{"log.format", func(c *proxy.Config) { c.Log.Format = "xml" }},
		{"shutdown.timeout", func(c *proxy.Config) { c.Shutdown.Timeout = 0 }},
	}
	for _, b := range bad {
		cfg := proxy.Defaults()
		b.mut(&cfg)
		err := cfg.Validate()
		switch {
		case err == nil:
			t.Errorf("%s: accepted", b.key)
		case !strings.Contains(err.Error(), b.key):
			t.Errorf("%s: error %q does not name the key", b.key, err)
		case strings.Contains(err.Error(), "\n"):
			t.Errorf("%s: error is not one line: %q", b.key, err)
		}
	}

	good := map[string]func(*proxy.Config){
		"defaults":            func(*proxy.Config) {},
		"listeners disabled":  func(c *proxy.Config) { c.AMQP.Listen, c.AMQP.TLSListen, c.HTTP.Listen = "", "", "" },
		"external backend":    func(c *proxy.Config) { c.KubeMQ.Address, c.Embedded.Listen = "kubemq:50000", "nonsense" },
		"tls backend":         func(c *proxy.Config) { c.KubeMQ.TLS, c.KubeMQ.CAFile, c.KubeMQ.ServerName = true, file, "kubemq" },
		"client certificates": func(c *proxy.Config) { c.AMQP.CertFile, c.AMQP.KeyFile, c.AMQP.ClientCAFile = file, file, file },
		"message bytes low":   func(c *proxy.Config) { c.GCP.MaxMessageBytes = 1024 },
		"message bytes high":  func(c *proxy.Config) { c.GCP.MaxMessageBytes = 64 << 20 },
		"ceilings of one":     func(c *proxy.Config) { c.GCP.MaxInflightPerSubscription, c.GCP.MaxOutstandingMessages = 1, 1 },
		"one second":          func(c *proxy.Config) { c.GCP.RuntimeIdle, c.GCP.StreamCloseAfter = time.Second, time.Second },
		"heartbeat off":       func(c *proxy.Config) { c.AMQP.Heartbeat = 0 },
		"heartbeat max":       func(c *proxy.Config) { c.AMQP.Heartbeat = 65535 * time.Second },
		"frame_max bounds":    func(c *proxy.Config) { c.AMQP.FrameMax = 4096 },
		"frame_max high":      func(c *proxy.Config) { c.AMQP.FrameMax = 1 << 20 },
		"channel_max bounds":  func(c *proxy.Config) { c.AMQP.ChannelMax = 65535 },
		"body size bounds":    func(c *proxy.Config) { c.AMQP.MaxBodySize = 96 << 20 },
		"no bounds": func(c *proxy.Config) {
			c.AMQP.MaxConnections, c.AMQP.MaxPendingPublishBytes, c.AMQP.MetricsQueueLabels = 0, 0, 0
		},
		"metrics labels max":      func(c *proxy.Config) { c.AMQP.MetricsQueueLabels = 10000 },
		"snapshot interval low":   func(c *proxy.Config) { c.Registry.SnapshotInterval = time.Minute },
		"snapshot interval high":  func(c *proxy.Config) { c.Registry.SnapshotInterval = 12 * time.Hour },
		"console debug logs":      func(c *proxy.Config) { c.Log.Level, c.Log.Format = "debug", "console" },
		"record delay low":        func(c *proxy.Config) { c.Delivery.RecordDelay = time.Second },
		"record delay high":       func(c *proxy.Config) { c.Delivery.RecordDelay = time.Hour },
		"embedded tls":            func(c *proxy.Config) { c.Embedded.TLSCertFile, c.Embedded.TLSKeyFile = file, file },
		"kubemq client cert pair": func(c *proxy.Config) { c.KubeMQ.TLS, c.KubeMQ.CertFile, c.KubeMQ.KeyFile = true, file, file },
	}
	for name, mut := range good {
		cfg := proxy.Defaults()
		mut(&cfg)
		if err := cfg.Validate(); err != nil {
			t.Errorf("%s: refused: %v", name, err)
		}
	}
}
