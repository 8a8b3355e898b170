package proxy

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap/zapcore"

	"github.com/kubemq-io/kubemq-proxy/kubemqclient"
)

// Config is the proxy's whole configuration: one typed, validated struct.
// main.go fills it from config.yaml, KUBEMQ_PROXY_* environment variables
// and flags; nothing else reads configuration sources. The mapstructure
// tags are the config keys (and, upper-cased with "." as "_", the
// environment variable suffixes).
type Config struct {
	GCP      GCPConfig      `mapstructure:"gcp"`
	AMQP     AMQPConfig     `mapstructure:"amqp"`
	HTTP     HTTPConfig     `mapstructure:"http"`
	KubeMQ   KubeMQConfig   `mapstructure:"kubemq"`
	Embedded EmbeddedConfig `mapstructure:"embedded"`
	Registry RegistryConfig `mapstructure:"registry"`
	Delivery DeliveryConfig `mapstructure:"delivery"`
	Cluster  ClusterConfig  `mapstructure:"cluster"`
	Log      LogConfig      `mapstructure:"log"`
	Shutdown ShutdownConfig `mapstructure:"shutdown"`
}

// GCPConfig is the Pub/Sub v1 front-end (emulator mode: plaintext, no auth).
type GCPConfig struct {
	Listen string `mapstructure:"listen"`
	// REST serves the Pub/Sub v1 REST API on the same port as gRPC.
	REST bool `mapstructure:"rest"`
	// MaxMessageBytes bounds one message (data + attributes).
	MaxMessageBytes int `mapstructure:"max_message_bytes"`
	// MaxInflightPerSubscription caps leased messages per subscription
	// across all streams; the rest waits in KubeMQ.
	MaxInflightPerSubscription int `mapstructure:"max_inflight_per_subscription"`
	// MaxOutstandingMessages bounds a StreamingPull whose client set no limit.
	MaxOutstandingMessages int `mapstructure:"max_outstanding_messages"`
	// StreamCloseAfter ends each StreamingPull with UNAVAILABLE after this
	// long, as Google does; clients reconnect.
	StreamCloseAfter time.Duration `mapstructure:"stream_close_after"`
	// RuntimeIdle ends a subscription's delivery runtime (poller, lease
	// table) after this long without streams, Pulls or leases.
	RuntimeIdle time.Duration `mapstructure:"runtime_idle"`
	// PushMaxConcurrency bounds push requests in flight, all subscriptions.
	PushMaxConcurrency int `mapstructure:"push_max_concurrency"`
	// PushMaxPerSubscription is the largest push window of a subscription.
	PushMaxPerSubscription int `mapstructure:"push_max_per_subscription"`
	// PushConnectTimeout bounds connecting to a push endpoint.
	PushConnectTimeout time.Duration `mapstructure:"push_connect_timeout"`
	// PushAllowedHosts restricts push endpoints (comma-separated hosts,
	// *.domain, host:port); "" allows any.
	PushAllowedHosts string `mapstructure:"push_allowed_hosts"`
	// PushOIDCKeyFile signs the OIDC tokens of push requests; "" = none.
	PushOIDCKeyFile string `mapstructure:"push_oidc_key_file"`
	// MaxPendingPublishBytes bounds the Publish requests read and not yet
	// answered, all connections together; further calls wait unread. 0 = no bound.
	MaxPendingPublishBytes int `mapstructure:"max_pending_publish_bytes"`
}

// AMQPConfig is the AMQP 0-9-1 front-end.
type AMQPConfig struct {
	Listen    string `mapstructure:"listen"`
	TLSListen string `mapstructure:"tls_listen"`
	CertFile  string `mapstructure:"cert_file"`
	KeyFile   string `mapstructure:"key_file"`
	// ClientCAFile enables client certificates (SASL EXTERNAL) when set.
	ClientCAFile string        `mapstructure:"client_ca_file"`
	Heartbeat    time.Duration `mapstructure:"heartbeat"`
	FrameMax     int           `mapstructure:"frame_max"`
	ChannelMax   int           `mapstructure:"channel_max"`
	// Users maps user names to passwords, "sha256:<hex>" hashed or plain.
	// Empty means any credentials are accepted, from loopback addresses
	// only (RabbitMQ's rule for its guest user) unless
	// OpenLoginsFromAnywhere.
	Users map[string]string `mapstructure:"users"`
	// OpenLoginsFromAnywhere accepts any credentials from any address while
	// Users is empty.
	OpenLoginsFromAnywhere bool `mapstructure:"open_logins_from_anywhere"`
	// UsersFile reads Users from a file holding a JSON object (a mounted
	// Secret); it replaces Users.
	UsersFile string `mapstructure:"users_file"`
	// MaxBodySize is the largest message body accepted.
	MaxBodySize int `mapstructure:"max_body_size"`
	// MaxConnections caps open AMQP connections; 0 = no cap.
	MaxConnections int `mapstructure:"max_connections"`
	// MaxPendingPublishBytes bounds, per connection, the bodies of
	// publishes not yet stored in KubeMQ; above it the connection stops
	// being read (and is told connection.blocked). 0 = no bound.
	MaxPendingPublishBytes int `mapstructure:"max_pending_publish_bytes"`
	// MetricsQueueLabels is how many queues get their own series in the
	// per-queue metrics; later ones are counted as "_other".
	MetricsQueueLabels int `mapstructure:"metrics_queue_labels"`
	// PasswordAsKubeMQToken passes each connection's AMQP password through
	// as the KubeMQ auth token of the calls made for it, so that KubeMQ
	// (not amqp.users) decides who may publish.
	PasswordAsKubeMQToken bool `mapstructure:"password_as_kubemq_token"`
	// ManagementListen serves the subset of RabbitMQ's management HTTP API that tools use
	// (rabbitmqadmin, queue-length lookups), with HTTP basic auth against Users; "" = off.
	ManagementListen string `mapstructure:"management_listen"`
}

// HTTPConfig is the side port: /healthz, /readyz, /metrics open to all;
// /state and /loglevel for loopback peers or holders of the admin token.
type HTTPConfig struct {
	Listen string `mapstructure:"listen"`
	// AdminToken, if set, lets any peer that sends it as a bearer token use
	// /state and /loglevel; AdminTokenFile reads it from a file.
	AdminToken     string `mapstructure:"admin_token"`
	AdminTokenFile string `mapstructure:"admin_token_file"`
}

// KubeMQConfig selects the backend. An empty Address runs the embedded
// server in the same process.
type KubeMQConfig struct {
	Address   string `mapstructure:"address"`
	ClientID  string `mapstructure:"client_id"`
	AuthToken string `mapstructure:"auth_token"`
	// AuthTokenFile reads AuthToken from a file (a mounted Secret).
	AuthTokenFile string `mapstructure:"auth_token_file"`
	TLS           bool   `mapstructure:"tls"`
	CAFile        string `mapstructure:"ca_file"`
	CertFile      string `mapstructure:"cert_file"`
	KeyFile       string `mapstructure:"key_file"`
	// ServerName overrides the TLS server name.
	ServerName string `mapstructure:"server_name"`
	// SendAttempt bounds one attempt to store a batch of queue messages;
	// a batch left unanswered that long is sent again (kubemqclient.Options).
	SendAttempt time.Duration `mapstructure:"send_attempt"`
	// OutageDetection bounds how long a KubeMQ that stops answering (a frozen
	// process, a partition: the TCP connection stays open) goes unnoticed
	// (HealthPings); then readiness is off and publishes in flight fail with
	// UNAVAILABLE / basic.nack, new ones at once.
	OutageDetection time.Duration `mapstructure:"outage_detection"`
}

// HealthPings derives the client's health ping schedule from OutageDetection:
// a ping every fifth of it with three tenths of it as its deadline; a
// timed-out ping declares the outage once the server has sent nothing at all
// (no ping answer, no other answer or stream message) for 0.55 of it. A
// silent server is thus noticed after one interval plus two timed-out pings,
// 0.8 of the bound (the rest is slack for a loaded machine), while an idle
// client asks a slow first ping again and a server that is slow but answers
// traffic stays ready. While down, pings back off up to the bound.
func (k *KubeMQConfig) HealthPings() (interval, timeout, silence, maxBackoff time.Duration) {
	d := k.OutageDetection
	return d / 5, d * 3 / 10, d * 11 / 20, max(d, time.Second)
}

// EmbeddedConfig configures the in-process KubeMQ-compatible server.
type EmbeddedConfig struct {
	Listen  string `mapstructure:"listen"`
	DataDir string `mapstructure:"data_dir"`
	// Strict refuses usage patterns that are hazardous on a real KubeMQ.
	Strict bool `mapstructure:"strict"`
	// ScanDelays releases delayed messages as a real KubeMQ does: every
	// 500 ms, those due among the 1024 earliest sent (docs/kubemq.md 9.1).
	ScanDelays bool `mapstructure:"scan_delays"`
	// TLSCertFile and TLSKeyFile (PEM) make `kubemq-proxy embedded` serve
	// gRPC over TLS, like a KubeMQ with TLS enabled.
	TLSCertFile string `mapstructure:"tls_cert_file"`
	TLSKeyFile  string `mapstructure:"tls_key_file"`
	// Store and Queue are the real KubeMQ server's store and queue limits, with its names
	// and meaning (config.yaml names each one's environment variable on the real server).
	Store EmbeddedStoreConfig `mapstructure:"store"`
	Queue EmbeddedQueueConfig `mapstructure:"queue"`
	// GRPCBodyLimit is the largest gRPC message the server takes (GRPC_BODY_LIMIT).
	GRPCBodyLimit int `mapstructure:"grpc_body_limit"`
	// MaxMemory bounds the bytes of the messages the embedded server holds: "N%" of the
	// container's memory limit (cgroup) or, without one, of the machine's memory; a size
	// ("512MiB", "2GiB", "1000000"); or "0" for no bound. Beyond it sends are refused.
	MaxMemory string `mapstructure:"max_memory"`
}

// EmbeddedStoreConfig is the real server's store.* section (environment STORE_...).
type EmbeddedStoreConfig struct {
	// MaxRetention: how long messages and events are kept; 0 = forever.
	MaxRetention time.Duration `mapstructure:"max_retention"`
	// MaxPurgeInactive: a channel or queue without new messages and connected consumers
	// for this long is deleted with its messages; 0 = never.
	MaxPurgeInactive time.Duration `mapstructure:"max_purge_inactive"`
	// MaxQueues caps channels (queues and events-store channels, plus one internal); 0 = no cap.
	MaxQueues int `mapstructure:"max_queues"`
	// MaxSubscribers caps the durable subscriptions of one events-store channel; 0 = no cap.
	MaxSubscribers int `mapstructure:"max_subscribers"`
	// MaxMessages and MaxQueueSize (bytes) cap one channel; the oldest messages are
	// dropped beyond them (never refused); 0 = no cap.
	MaxMessages  int `mapstructure:"max_messages"`
	MaxQueueSize int `mapstructure:"max_queue_size"`
}

// EmbeddedQueueConfig is the real server's queue.* section (environment QUEUE_...).
type EmbeddedQueueConfig struct {
	MaxNumberOfMessages       int `mapstructure:"max_number_of_messages"`
	MaxWaitTimeoutSeconds     int `mapstructure:"max_wait_timeout_seconds"`
	DefaultWaitTimeoutSeconds int `mapstructure:"default_wait_timeout_seconds"`
	MaxExpirationSeconds      int `mapstructure:"max_expiration_seconds"`
	MaxDelaySeconds           int `mapstructure:"max_delay_seconds"`
	MaxReceiveCount           int `mapstructure:"max_receive_count"`
	MaxVisibilitySeconds      int `mapstructure:"max_visibility_seconds"`
	DefaultVisibilitySeconds  int `mapstructure:"default_visibility_seconds"`
}

// RegistryConfig is the durable topology log.
type RegistryConfig struct {
	Channel          string        `mapstructure:"channel"`
	SnapshotInterval time.Duration `mapstructure:"snapshot_interval"`
}

// DeliveryConfig tunes the lease engine both front-ends consume through.
type DeliveryConfig struct {
	// RecordDelay is the KubeMQ delay of every lease record (whole
	// seconds): how soon a crashed proxy's leased messages come back, and
	// (plus 5 s) the least time ordered Pub/Sub subscriptions hold keyed
	// messages after a restart or an outage. Shorter means more record
	// traffic for leases held long.
	RecordDelay time.Duration `mapstructure:"record_delay"`
	// MetricsQueueLabels is how many KubeMQ queues get a label of their own in the lease
	// engine's per-queue series (kubemq_proxy_delivery_queue_*); later ones share "_other".
	// Negative: every queue is "_other".
	MetricsQueueLabels int `mapstructure:"metrics_queue_labels"`
}

// ClusterConfig lets any number of replicas share one KubeMQ (a sidecar in every pod): one
// replica at a time consumes each queue or subscription, the others forward their clients'
// consuming calls to it over the peer port.
type ClusterConfig struct {
	// Channel is the ownership log (an events-store channel); the acknowledgement log is
	// Channel + ".acks". Every replica of one deployment must use the same.
	Channel string `mapstructure:"channel"`
	// ReplicaID names this replica in the log; empty = random at each start.
	ReplicaID string `mapstructure:"replica_id"`
	// Listen is the peer port other replicas forward to; empty = none (this replica serves
	// only its own clients' queues, and clients of a queue another replica consumes get
	// UNAVAILABLE unless that replica has a peer port).
	Listen string `mapstructure:"listen"`
	// Advertise is the host:port other replicas dial to reach Listen (in Kubernetes the pod
	// IP from the downward API); empty = Listen when it names a host.
	Advertise string `mapstructure:"advertise"`
	// Secret is shared by every replica and carried by every peer call; required with
	// Listen. SecretFile reads it from a file (a mounted Kubernetes Secret) instead.
	Secret     string `mapstructure:"secret"`
	SecretFile string `mapstructure:"secret_file"`
	// Lease is how long a replica's hold on a queue outlives its last heartbeat: the takeover
	// time after a replica dies. Heartbeat is the heartbeat interval.
	Lease     time.Duration `mapstructure:"lease"`
	Heartbeat time.Duration `mapstructure:"heartbeat"`
	// TLSCertFile, TLSKeyFile and TLSCAFile (PEM) make the peer port mutual TLS: each replica
	// presents its certificate and accepts only peers whose certificate TLSCAFile signed.
	TLSCertFile string `mapstructure:"tls_cert_file"`
	TLSKeyFile  string `mapstructure:"tls_key_file"`
	TLSCAFile   string `mapstructure:"tls_ca_file"`
}

// LogConfig configures zap.
type LogConfig struct {
	Level  string `mapstructure:"level"`
	Format string `mapstructure:"format"`
	// Sampling thins out repeated log lines (zap's production sampler: per
	// second, the first 100 of each message, then every 100th).
	Sampling bool `mapstructure:"sampling"`
}

// ShutdownConfig bounds the graceful shutdown: past Timeout the process exits
// anyway, naming the step it gave up on.
type ShutdownConfig struct {
	Timeout time.Duration `mapstructure:"timeout"`
}

// Defaults returns the configuration used when nothing is set. config.yaml
// documents the same values.
func Defaults() Config {
	return Config{
		GCP: GCPConfig{Listen: ":8085", REST: true, MaxMessageBytes: 10 << 20, MaxInflightPerSubscription: 20000,
			MaxOutstandingMessages: 1000, StreamCloseAfter: 30 * time.Minute, RuntimeIdle: 2 * time.Minute,
			PushMaxConcurrency: 256, PushMaxPerSubscription: 64, PushConnectTimeout: 10 * time.Second,
			MaxPendingPublishBytes: 32 << 20},
		AMQP: AMQPConfig{Listen: ":5672", TLSListen: ":5671", Heartbeat: 60 * time.Second, FrameMax: 131072, ChannelMax: 2047,
			MaxBodySize: 64 << 20, MaxPendingPublishBytes: 64 << 20, MetricsQueueLabels: 100, ManagementListen: "127.0.0.1:15672"},
		HTTP: HTTPConfig{Listen: ":9102"},
		KubeMQ: KubeMQConfig{
			ClientID: "kubemq-proxy", SendAttempt: 10 * time.Second, OutageDetection: 2 * time.Second,
		},
		Embedded: EmbeddedConfig{Listen: "127.0.0.1:50000",
			Store: EmbeddedStoreConfig{MaxRetention: 24 * time.Hour, MaxPurgeInactive: 24 * time.Hour},
			Queue: EmbeddedQueueConfig{MaxNumberOfMessages: 1024, MaxWaitTimeoutSeconds: 3600, DefaultWaitTimeoutSeconds: 1,
				MaxExpirationSeconds: 43200, MaxDelaySeconds: 43200, MaxReceiveCount: 1024, MaxVisibilitySeconds: 43200,
				DefaultVisibilitySeconds: 60},
			GRPCBodyLimit: 100 << 20, MaxMemory: "25%"},
		Registry: RegistryConfig{Channel: "kubemq-proxy.registry", SnapshotInterval: time.Hour},
		Delivery: DeliveryConfig{RecordDelay: 10 * time.Second, MetricsQueueLabels: 100},
		Cluster:  ClusterConfig{Channel: "kubemq-proxy.cluster", Lease: 8 * time.Second, Heartbeat: time.Second},
		Log:      LogConfig{Level: "info", Format: "json", Sampling: true},
		Shutdown: ShutdownConfig{Timeout: 15 * time.Second},
	}
}

// Embedded reports whether the proxy runs its own backend.
func (c *Config) UseEmbedded() bool { return c.KubeMQ.Address == "" }

// AMQPTLSEnabled reports whether the AMQPS listener is active.
func (c *Config) AMQPTLSEnabled() bool {
	return c.AMQP.CertFile != "" && c.AMQP.KeyFile != "" && c.AMQP.TLSListen != ""
}

// Validate checks every value and returns the first problem as one line.
func (c *Config) Validate() error {
	addrs := []struct{ key, val string }{
		{"gcp.listen", c.GCP.Listen},
		{"amqp.listen", c.AMQP.Listen},
		{"amqp.tls_listen", c.AMQP.TLSListen},
		{"amqp.management_listen", c.AMQP.ManagementListen},
		{"http.listen", c.HTTP.Listen},
		{"cluster.listen", c.Cluster.Listen},
	}
	if c.UseEmbedded() {
		addrs = append(addrs, struct{ key, val string }{"embedded.listen", c.Embedded.Listen})
	}
	for _, a := range addrs {
		if a.val == "" {
			continue // disabled listener
		}
		if err := checkHostPort(a.val); err != nil {
			return fmt.Errorf("%s: %q is not a valid listen address: %v", a.key, a.val, err)
		}
	}
	if c.KubeMQ.Address != "" {
		if err := checkHostPort(c.KubeMQ.Address); err != nil {
			return fmt.Errorf("kubemq.address: %q is not host:port: %v", c.KubeMQ.Address, err)
		}
	}
	if (c.Embedded.TLSCertFile == "") != (c.Embedded.TLSKeyFile == "") {
		return errors.New("embedded.tls_cert_file and embedded.tls_key_file must be set together")
	}
	if (c.AMQP.CertFile == "") != (c.AMQP.KeyFile == "") {
		return errors.New("amqp.cert_file and amqp.key_file must be set together")
	}
	for _, f := range []struct{ key, val string }{
		{"amqp.cert_file", c.AMQP.CertFile}, {"amqp.key_file", c.AMQP.KeyFile},
		{"amqp.client_ca_file", c.AMQP.ClientCAFile}, {"kubemq.ca_file", c.KubeMQ.CAFile},
		{"kubemq.cert_file", c.KubeMQ.CertFile}, {"kubemq.key_file", c.KubeMQ.KeyFile},
		{"embedded.tls_cert_file", c.Embedded.TLSCertFile}, {"embedded.tls_key_file", c.Embedded.TLSKeyFile},
		{"cluster.secret_file", c.Cluster.SecretFile}, {"cluster.tls_cert_file", c.Cluster.TLSCertFile},
		{"cluster.tls_key_file", c.Cluster.TLSKeyFile}, {"cluster.tls_ca_file", c.Cluster.TLSCAFile},
		{"amqp.users_file", c.AMQP.UsersFile}, {"kubemq.auth_token_file", c.KubeMQ.AuthTokenFile},
		{"http.admin_token_file", c.HTTP.AdminTokenFile},
	} {
		if f.val == "" {
			continue
		}
		if _, err := os.Stat(f.val); err != nil {
			return fmt.Errorf("%s: %v", f.key, err)
		}
	}
	if c.AMQP.ClientCAFile != "" && c.AMQP.CertFile == "" {
		return errors.New("amqp.client_ca_file needs amqp.cert_file and amqp.key_file (client certificates are checked on the AMQPS listener)")
	}
	if !c.KubeMQ.TLS && (c.KubeMQ.CAFile != "" || c.KubeMQ.CertFile != "" || c.KubeMQ.ServerName != "") {
		return errors.New("kubemq.ca_file, kubemq.cert_file and kubemq.server_name need kubemq.tls: true")
	}
	if (c.KubeMQ.CertFile == "") != (c.KubeMQ.KeyFile == "") {
		return errors.New("kubemq.cert_file and kubemq.key_file must be set together")
	}
	if c.GCP.MaxMessageBytes < 1024 || c.GCP.MaxMessageBytes > 64<<20 {
		return fmt.Errorf("gcp.max_message_bytes: %d is outside 1024..67108864", c.GCP.MaxMessageBytes)
	}
	if c.GCP.MaxPendingPublishBytes < 0 {
		return fmt.Errorf("gcp.max_pending_publish_bytes: %d must not be negative", c.GCP.MaxPendingPublishBytes)
	}
	if c.GCP.MaxInflightPerSubscription < 1 {
		return fmt.Errorf("gcp.max_inflight_per_subscription: %d must be at least 1", c.GCP.MaxInflightPerSubscription)
	}
	if c.GCP.MaxOutstandingMessages < 1 {
		return fmt.Errorf("gcp.max_outstanding_messages: %d must be at least 1", c.GCP.MaxOutstandingMessages)
	}
	if c.GCP.RuntimeIdle < time.Second {
		return fmt.Errorf("gcp.runtime_idle: %v must be at least 1s", c.GCP.RuntimeIdle)
	}
	if c.GCP.StreamCloseAfter < time.Second {
		return fmt.Errorf("gcp.stream_close_after: %v must be at least 1s", c.GCP.StreamCloseAfter)
	}
	if c.GCP.PushMaxConcurrency < 1 {
		return fmt.Errorf("gcp.push_max_concurrency: %d must be at least 1", c.GCP.PushMaxConcurrency)
	}
	if c.GCP.PushMaxPerSubscription < 1 {
		return fmt.Errorf("gcp.push_max_per_subscription: %d must be at least 1", c.GCP.PushMaxPerSubscription)
	}
	if c.GCP.PushConnectTimeout < 100*time.Millisecond {
		return fmt.Errorf("gcp.push_connect_timeout: %v must be at least 100ms", c.GCP.PushConnectTimeout)
	}
	if c.AMQP.Heartbeat < 0 || c.AMQP.Heartbeat > 65535*time.Second {
		return fmt.Errorf("amqp.heartbeat: %v is outside 0s..65535s", c.AMQP.Heartbeat)
	}
	if c.AMQP.FrameMax < 4096 || c.AMQP.FrameMax > 1<<20 {
		return fmt.Errorf("amqp.frame_max: %d is outside 4096..1048576", c.AMQP.FrameMax)
	}
	if c.AMQP.ChannelMax < 1 || c.AMQP.ChannelMax > 65535 {
		return fmt.Errorf("amqp.channel_max: %d is outside 1..65535", c.AMQP.ChannelMax)
	}
	if c.AMQP.MaxBodySize < 1 || c.AMQP.MaxBodySize > 96<<20 {
		return fmt.Errorf("amqp.max_body_size: %d is outside 1..100663296 (KubeMQ caps a message at 100 MiB)", c.AMQP.MaxBodySize)
	}
	if c.AMQP.MaxConnections < 0 {
		return fmt.Errorf("amqp.max_connections: %d must not be negative", c.AMQP.MaxConnections)
	}
	if c.AMQP.MaxPendingPublishBytes < 0 {
		return fmt.Errorf("amqp.max_pending_publish_bytes: %d must not be negative (0 = no bound)", c.AMQP.MaxPendingPublishBytes)
	}
	if c.AMQP.MetricsQueueLabels < 0 || c.AMQP.MetricsQueueLabels > 10000 {
		return fmt.Errorf("amqp.metrics_queue_labels: %d is outside 0..10000", c.AMQP.MetricsQueueLabels)
	}
	if d := c.KubeMQ.OutageDetection; d < 200*time.Millisecond || d > time.Minute {
		return fmt.Errorf("kubemq.outage_detection: %v is outside 200ms..1m", d)
	}
	if c.KubeMQ.ClientID == "" {
		return errors.New("kubemq.client_id must not be empty")
	}
	if err := kubemqclient.ValidChannel(c.Registry.Channel); err != nil {
		return fmt.Errorf("registry.channel: %v", err)
	}
	if c.Registry.SnapshotInterval < time.Minute || c.Registry.SnapshotInterval > 12*time.Hour {
		return fmt.Errorf("registry.snapshot_interval: %v is outside 1m..12h (the backend keeps 24h)", c.Registry.SnapshotInterval)
	}
	if d := c.Delivery.RecordDelay; d < time.Second || d > time.Hour || d%time.Second != 0 {
		return fmt.Errorf("delivery.record_delay: %v is not whole seconds in 1s..1h", d)
	}
	if err := c.Cluster.validate(c.Registry.Channel); err != nil {
		return err
	}
	if c.UseEmbedded() {
		if err := c.Embedded.validate(); err != nil {
			return err
		}
	}
	var lvl zapcore.Level
	if err := lvl.UnmarshalText([]byte(c.Log.Level)); err != nil {
		return fmt.Errorf("log.level: %q is not one of debug, info, warn, error", c.Log.Level)
	}
	if c.Log.Format != "json" && c.Log.Format != "console" {
		return fmt.Errorf("log.format: %q is not json or console", c.Log.Format)
	}
	if c.Shutdown.Timeout <= 0 {
		return fmt.Errorf("shutdown.timeout: %v must be positive", c.Shutdown.Timeout)
	}
	return nil
}

func checkHostPort(s string) error {
	_, port, err := net.SplitHostPort(s)
	if err != nil {
		return err
	}
	if port == "" {
		return errors.New("missing port")
	}
	// A numeric port: a service name would be looked up only when the listener opens, and
	// fail there instead of here.
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || port != strconv.FormatUint(n, 10) {
		return fmt.Errorf("port %q is not a number from 0 to 65535", port)
	}
	return nil
}

func (c *ClusterConfig) validate(registry string) error {
	if err := kubemqclient.ValidChannel(c.Channel); err != nil {
		return fmt.Errorf("cluster.channel: %v", err)
	}
	if c.Channel == registry {
		return errors.New("cluster.channel must differ from registry.channel")
	}
	if c.Heartbeat < 100*time.Millisecond || c.Heartbeat > 10*time.Second {
		return fmt.Errorf("cluster.heartbeat: %v is outside 100ms..10s", c.Heartbeat)
	}
	// The holder stops 3 s before its lease ends and needs two heartbeats to renew it.
	if c.Lease < 2*c.Heartbeat+3*time.Second || c.Lease > 5*time.Minute {
		return fmt.Errorf("cluster.lease: %v must be at least two heartbeats plus 3s, and at most 5m", c.Lease)
	}
	if c.Secret != "" && c.SecretFile != "" {
		return errors.New("cluster.secret and cluster.secret_file are exclusive")
	}
	if c.Listen != "" && c.Secret == "" && c.SecretFile == "" {
		return errors.New("cluster.listen needs cluster.secret or cluster.secret_file: the peer port must never be open to anyone who reaches it")
	}
	if c.Advertise != "" {
		if err := checkHostPort(c.Advertise); err != nil {
			return fmt.Errorf("cluster.advertise: %q is not host:port: %v", c.Advertise, err)
		}
	}
	if c.TLSCertFile != "" || c.TLSKeyFile != "" || c.TLSCAFile != "" {
		if c.TLSCertFile == "" || c.TLSKeyFile == "" || c.TLSCAFile == "" {
			return errors.New("cluster.tls_cert_file, cluster.tls_key_file and cluster.tls_ca_file must be set together")
		}
	}
	return nil
}

// AdvertiseAddr is the peer address this replica announces: Advertise, else Listen when it
// names a host (a bound port 0 is resolved by the caller).
func (c *ClusterConfig) AdvertiseAddr(bound string) string {
	if c.Advertise != "" {
		return c.Advertise
	}
	host, _, err := net.SplitHostPort(c.Listen)
	if err != nil || host == "" || host == "0.0.0.0" || host == "::" {
		return "" // every interface: nobody knows which address reaches this replica
	}
	if bound != "" {
		return bound
	}
	return c.Listen
}

// readSecrets replaces the keys given as files (amqp.users_file, kubemq.auth_token_file,
// http.admin_token_file) with the files' contents.
func (c *Config) readSecrets() error {
	read := func(key, path string) (string, error) {
		b, err := os.ReadFile(path)
		if err != nil {
			return "", fmt.Errorf("%s: %w", key, err)
		}
		v := strings.TrimSpace(string(b))
		if v == "" {
			return "", fmt.Errorf("%s: the file %s is empty", key, path)
		}
		return v, nil
	}
	if f := c.AMQP.UsersFile; f != "" {
		v, err := read("amqp.users_file", f)
		if err != nil {
			return err
		}
		users := map[string]string{}
		if err := json.Unmarshal([]byte(v), &users); err != nil {
			return fmt.Errorf("amqp.users_file: expected a JSON object of strings, e.g. {\"alice\":\"secret\"}: %v", err)
		}
		c.AMQP.Users = users
	}
	if f := c.KubeMQ.AuthTokenFile; f != "" {
		v, err := read("kubemq.auth_token_file", f)
		if err != nil {
			return err
		}
		c.KubeMQ.AuthToken = v
	}
	if f := c.HTTP.AdminTokenFile; f != "" {
		v, err := read("http.admin_token_file", f)
		if err != nil {
			return err
		}
		c.HTTP.AdminToken = v
	}
	return nil
}
