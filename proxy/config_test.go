package proxy_test

import (
	"errors"
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
		{"gcp.push_max_concurrency", func(c *proxy.Config) { c.GCP.PushMaxConcurrency = 0 }},
		{"gcp.push_max_per_subscription", func(c *proxy.Config) { c.GCP.PushMaxPerSubscription = 0 }},
		{"gcp.push_connect_timeout", func(c *proxy.Config) { c.GCP.PushConnectTimeout = time.Millisecond }},
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
		{"kubemq.outage_detection", func(c *proxy.Config) { c.KubeMQ.OutageDetection = 199 * time.Millisecond }},
		{"kubemq.outage_detection", func(c *proxy.Config) { c.KubeMQ.OutageDetection = time.Minute + 1 }},
		{"registry.channel", func(c *proxy.Config) { c.Registry.Channel = "a b" }},
		{"registry.snapshot_interval", func(c *proxy.Config) { c.Registry.SnapshotInterval = 59 * time.Second }},
		{"registry.snapshot_interval", func(c *proxy.Config) { c.Registry.SnapshotInterval = 12*time.Hour + time.Second }},
		{"delivery.record_delay", func(c *proxy.Config) { c.Delivery.RecordDelay = 999 * time.Millisecond }},
		{"delivery.record_delay", func(c *proxy.Config) { c.Delivery.RecordDelay = 1500 * time.Millisecond }},
		{"delivery.record_delay", func(c *proxy.Config) { c.Delivery.RecordDelay = time.Hour + time.Second }},
		{"log.level", func(c *proxy.Config) { c.Log.Level = "loud" }},
		{"log.format", func(c *proxy.Config) { c.Log.Format = "xml" }},
		{"shutdown.timeout", func(c *proxy.Config) { c.Shutdown.Timeout = 0 }},
		{"embedded.store.max_retention", func(c *proxy.Config) { c.Embedded.Store.MaxRetention = -time.Minute }},
		{"embedded.store.max_purge_inactive", func(c *proxy.Config) { c.Embedded.Store.MaxPurgeInactive = -time.Minute }},
		{"embedded.store.max_queues", func(c *proxy.Config) { c.Embedded.Store.MaxQueues = -1 }},
		{"embedded.store.max_queues", func(c *proxy.Config) { c.Embedded.Store.MaxQueues = 1 }},
		{"embedded.store.max_subscribers", func(c *proxy.Config) { c.Embedded.Store.MaxSubscribers = -1 }},
		{"embedded.store.max_messages", func(c *proxy.Config) { c.Embedded.Store.MaxMessages = -1 }},
		{"embedded.store.max_queue_size", func(c *proxy.Config) { c.Embedded.Store.MaxQueueSize = -1 }},
		{"embedded.queue.max_number_of_messages", func(c *proxy.Config) { c.Embedded.Queue.MaxNumberOfMessages = 0 }},
		{"embedded.queue.max_number_of_messages", func(c *proxy.Config) { c.Embedded.Queue.MaxNumberOfMessages = 1<<20 + 1 }},
		{"embedded.queue.max_wait_timeout_seconds", func(c *proxy.Config) { c.Embedded.Queue.MaxWaitTimeoutSeconds = 0 }},
		{"embedded.queue.default_wait_timeout_seconds", func(c *proxy.Config) { c.Embedded.Queue.DefaultWaitTimeoutSeconds = 3601 }},
		{"embedded.queue.max_expiration_seconds", func(c *proxy.Config) { c.Embedded.Queue.MaxExpirationSeconds = -1 }},
		{"embedded.queue.max_delay_seconds", func(c *proxy.Config) { c.Embedded.Queue.MaxDelaySeconds = 0 }},
		{"embedded.queue.max_receive_count", func(c *proxy.Config) { c.Embedded.Queue.MaxReceiveCount = 0 }},
		{"embedded.queue.max_visibility_seconds", func(c *proxy.Config) { c.Embedded.Queue.MaxVisibilitySeconds = 0 }},
		{"embedded.queue.default_visibility_seconds", func(c *proxy.Config) { c.Embedded.Queue.DefaultVisibilitySeconds = 43201 }},
		{"embedded.grpc_body_limit", func(c *proxy.Config) { c.Embedded.GRPCBodyLimit = 1023 }},
		{"embedded.grpc_body_limit", func(c *proxy.Config) { c.Embedded.GRPCBodyLimit = 100<<20 + 1 }},
		{"embedded.max_memory", func(c *proxy.Config) { c.Embedded.MaxMemory = "" }},
		{"embedded.max_memory", func(c *proxy.Config) { c.Embedded.MaxMemory = "lots" }},
		{"embedded.max_memory", func(c *proxy.Config) { c.Embedded.MaxMemory = "101%" }},
		{"embedded.max_memory", func(c *proxy.Config) { c.Embedded.MaxMemory = "12 parsecs" }},
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
		"embedded limits off": func(c *proxy.Config) {
			c.Embedded.Store = proxy.EmbeddedStoreConfig{}
			c.Embedded.MaxMemory = "0"
		},
		"embedded limits set": func(c *proxy.Config) {
			c.Embedded.Store = proxy.EmbeddedStoreConfig{MaxRetention: time.Minute, MaxPurgeInactive: time.Hour, MaxQueues: 2, MaxSubscribers: 1, MaxMessages: 1, MaxQueueSize: 1}
			c.Embedded.GRPCBodyLimit, c.Embedded.MaxMemory = 1024, "512MiB"
		},
		"external backend ignores embedded limits": func(c *proxy.Config) {
			c.KubeMQ.Address, c.Embedded.MaxMemory = "kubemq:50000", "nonsense"
		},
	}
	for name, mut := range good {
		cfg := proxy.Defaults()
		mut(&cfg)
		if err := cfg.Validate(); err != nil {
			t.Errorf("%s: refused: %v", name, err)
		}
	}
}

func TestParseMemory(t *testing.T) {
	total := func() (uint64, error) { return 8 << 30, nil }
	for in, want := range map[string]int64{
		"0": 0, "25%": 2 << 30, "100%": 8 << 30, "12.5%": 1 << 30, "1000": 1000, "512MiB": 512 << 20, "2GiB": 2 << 30,
		"2G": 2 << 30, "64K": 64 << 10, "1MB": 1e6, " 3 GB ": 3e9, "7B": 7,
	} {
		got, err := proxy.ParseMemory(in, total)
		if err != nil || got != want {
			t.Errorf("%q: %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "%", "0%", "-5%", "150%", "-1", "1.5GiB", "5 XB", "MiB", "99999999999999999999"} {
		if got, err := proxy.ParseMemory(in, total); err == nil {
			t.Errorf("%q accepted as %d", in, got)
		}
	}
	unknown := func() (uint64, error) { return 0, errors.New("no idea") }
	if _, err := proxy.ParseMemory("25%", unknown); err == nil || !strings.Contains(err.Error(), "give a size") {
		t.Errorf("a percentage of an unknown size: %v", err)
	}
	if n, err := proxy.ParseMemory("1GiB", unknown); err != nil || n != 1<<30 {
		t.Errorf("a size needs no total: %d %v", n, err)
	}
}

// Every embedded.store/queue key reaches the embedded server's option of the same meaning; the
// config's 0 (no limit, as on the real server) is the option's "forever".
func TestEmbeddedOptions(t *testing.T) {
	c := proxy.Defaults()
	c.Embedded.Store = proxy.EmbeddedStoreConfig{MaxRetention: 0, MaxPurgeInactive: time.Hour, MaxQueues: 3, MaxSubscribers: 4, MaxMessages: 5, MaxQueueSize: 6}
	c.Embedded.Queue = proxy.EmbeddedQueueConfig{MaxNumberOfMessages: 7, MaxWaitTimeoutSeconds: 8, DefaultWaitTimeoutSeconds: 2,
		MaxExpirationSeconds: 9, MaxDelaySeconds: 10, MaxReceiveCount: 11, MaxVisibilitySeconds: 12, DefaultVisibilitySeconds: 3}
	c.Embedded.GRPCBodyLimit, c.Embedded.MaxMemory = 2048, "1MiB"
	o, err := c.EmbeddedOptions(nil)
	if err != nil {
		t.Fatal(err)
	}
	if o.MaxRetention >= 0 || o.MaxPurgeInactive != time.Hour || o.MaxChannels != 3 || o.MaxSubscribers != 4 || o.MaxChannelMessages != 5 ||
		o.MaxChannelBytes != 6 || o.MaxReceiveMessages != 7 || o.MaxWaitSeconds != 8 || o.DefaultWaitSeconds != 2 || o.MaxExpirationSeconds != 9 ||
		o.MaxDelaySeconds != 10 || o.MaxReceiveCount != 11 || o.MaxVisibilitySeconds != 12 || o.DefaultVisibilitySeconds != 3 ||
		o.BodyLimit != 2048 || o.MaxMemory != 1<<20 {
		t.Fatalf("options %+v", o)
	}
	// The defaults: 25% of the memory the process may use.
	d := proxy.Defaults()
	o, err = d.EmbeddedOptions(nil)
	total, terr := proxy.MemoryTotal()
	if err != nil || terr != nil || (o.MaxMemory-int64(total/4) > 1 || int64(total/4)-o.MaxMemory > 1) || o.MaxRetention != 24*time.Hour {
		t.Fatalf("default options %+v %v; total %d %v", o, err, total, terr)
	}
}
