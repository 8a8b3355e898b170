package proxy

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"go.uber.org/zap"

	"github.com/kubemq-io/kubemq-proxy/embedded"
)

// validate checks the embedded server's limits with their keys; embedded.New checks the same
// again.
func (c *EmbeddedConfig) validate() error {
	for _, d := range []struct {
		key string
		v   time.Duration
	}{{"embedded.store.max_retention", c.Store.MaxRetention}, {"embedded.store.max_purge_inactive", c.Store.MaxPurgeInactive}} {
		if d.v < 0 {
			return fmt.Errorf("%s: %v must not be negative (0 = no limit)", d.key, d.v)
		}
	}
	for _, l := range []struct {
		key string
		v   int
	}{
		{"embedded.store.max_queues", c.Store.MaxQueues}, {"embedded.store.max_subscribers", c.Store.MaxSubscribers},
		{"embedded.store.max_messages", c.Store.MaxMessages}, {"embedded.store.max_queue_size", c.Store.MaxQueueSize},
	} {
		if l.v < 0 {
			return fmt.Errorf("%s: %d must not be negative (0 = no limit)", l.key, l.v)
		}
	}
	if c.Store.MaxQueues == 1 {
		return errors.New("embedded.store.max_queues: 1 leaves no channel for clients (the count includes one internal channel, as on the real server); use 0 or at least 2")
	}
	q := &c.Queue
	for _, l := range []struct {
		key string
		v   int
	}{
		{"embedded.queue.max_number_of_messages", q.MaxNumberOfMessages}, {"embedded.queue.max_wait_timeout_seconds", q.MaxWaitTimeoutSeconds},
		{"embedded.queue.default_wait_timeout_seconds", q.DefaultWaitTimeoutSeconds}, {"embedded.queue.max_expiration_seconds", q.MaxExpirationSeconds},
		{"embedded.queue.max_delay_seconds", q.MaxDelaySeconds}, {"embedded.queue.max_receive_count", q.MaxReceiveCount},
		{"embedded.queue.max_visibility_seconds", q.MaxVisibilitySeconds}, {"embedded.queue.default_visibility_seconds", q.DefaultVisibilitySeconds},
	} {
		if l.v < 1 || l.v > 1<<30 {
			return fmt.Errorf("%s: %d is outside 1..%d", l.key, l.v, 1<<30)
		}
	}
	if q.MaxNumberOfMessages > 1<<20 {
		return fmt.Errorf("embedded.queue.max_number_of_messages: %d is over %d", q.MaxNumberOfMessages, 1<<20)
	}
	if q.DefaultWaitTimeoutSeconds > q.MaxWaitTimeoutSeconds {
		return fmt.Errorf("embedded.queue.default_wait_timeout_seconds: %d exceeds embedded.queue.max_wait_timeout_seconds (%d)", q.DefaultWaitTimeoutSeconds, q.MaxWaitTimeoutSeconds)
	}
	if q.DefaultVisibilitySeconds > q.MaxVisibilitySeconds {
		return fmt.Errorf("embedded.queue.default_visibility_seconds: %d exceeds embedded.queue.max_visibility_seconds (%d)", q.DefaultVisibilitySeconds, q.MaxVisibilitySeconds)
	}
	if c.GRPCBodyLimit < 1024 || c.GRPCBodyLimit > 100<<20 {
		return fmt.Errorf("embedded.grpc_body_limit: %d is outside 1024..%d", c.GRPCBodyLimit, 100<<20)
	}
	if _, err := ParseMemory(c.MaxMemory, MemoryTotal); err != nil {
		return fmt.Errorf("embedded.max_memory: %v", err)
	}
	return nil
}

// EmbeddedOptions is the embedded server's configuration; log names its logger.
func (c *Config) EmbeddedOptions(log *zap.Logger) (embedded.Options, error) {
	e := &c.Embedded
	maxMem, err := ParseMemory(e.MaxMemory, MemoryTotal)
	if err != nil {
		return embedded.Options{}, fmt.Errorf("embedded.max_memory: %v", err)
	}
	if e.DataDir != "" {
		if err := checkDataDir(e.DataDir); err != nil {
			return embedded.Options{}, err
		}
	}
	o := embedded.Options{
		DataDir: e.DataDir, Strict: e.Strict, ScanDelays: e.ScanDelays, Logger: log,
		MaxRetention: orForever(e.Store.MaxRetention), MaxPurgeInactive: orForever(e.Store.MaxPurgeInactive),
		MaxChannels: e.Store.MaxQueues, MaxSubscribers: e.Store.MaxSubscribers,
		MaxChannelMessages: e.Store.MaxMessages, MaxChannelBytes: int64(e.Store.MaxQueueSize),
		MaxReceiveMessages: e.Queue.MaxNumberOfMessages, MaxWaitSeconds: e.Queue.MaxWaitTimeoutSeconds,
		DefaultWaitSeconds: e.Queue.DefaultWaitTimeoutSeconds, MaxExpirationSeconds: e.Queue.MaxExpirationSeconds,
		MaxDelaySeconds: e.Queue.MaxDelaySeconds, MaxReceiveCount: e.Queue.MaxReceiveCount,
		MaxVisibilitySeconds: e.Queue.MaxVisibilitySeconds, DefaultVisibilitySeconds: e.Queue.DefaultVisibilitySeconds,
		BodyLimit: e.GRPCBodyLimit, MaxMemory: maxMem,
	}
	return o, nil
}

// orForever maps the config's 0 (no limit, as on the real server) to the embedded server's
// negative value.
func orForever(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// MemoryTotal is the memory the process may use: the container's limit (cgroup v1 or v2), or
// the machine's memory without one.
func MemoryTotal() (uint64, error) {
	return memlimit.ApplyFallback(memlimit.FromCgroup, memlimit.FromSystem)()
}

// ParseMemory reads a memory size: "0" (no bound, returned as 0), "N%" of total(), or bytes
// with an optional unit (B, KiB, MiB, GiB, TiB; K, M, G, T as their binary multiples; KB, MB,
// GB, TB decimal).
func ParseMemory(s string, total func() (uint64, error)) (int64, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, errors.New(`empty: use "0" for no bound, "25%", or a size such as "512MiB"`)
	}
	if p, ok := strings.CutSuffix(s, "%"); ok {
		f, err := strconv.ParseFloat(strings.TrimSpace(p), 64)
		if err != nil || f <= 0 || f > 100 {
			return 0, fmt.Errorf("%q: a percentage must be in (0, 100]", s)
		}
		t, err := total()
		if err != nil || t == 0 {
			return 0, fmt.Errorf("%q: the memory size is unknown (%v); give a size instead", s, err)
		}
		return max(1, int64(float64(t)*f/100)), nil
	}
	i := len(s)
	for i > 0 && (s[i-1] < '0' || s[i-1] > '9') {
		i--
	}
	num, unit := strings.TrimSpace(s[:i]), strings.TrimSpace(s[i:])
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%q is not a size (a whole number of bytes with an optional unit such as MiB, a percentage, or 0)", s)
	}
	mult := map[string]int64{"": 1, "B": 1, "K": 1 << 10, "KiB": 1 << 10, "M": 1 << 20, "MiB": 1 << 20, "G": 1 << 30, "GiB": 1 << 30,
		"T": 1 << 40, "TiB": 1 << 40, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}[unit]
	if mult == 0 {
		return 0, fmt.Errorf("%q: unknown unit %q (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)", s, unit)
	}
	if n > (1<<62)/mult {
		return 0, fmt.Errorf("%q is too large", s)
	}
	return n * mult, nil
}
