package amqp091

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net"
	"net/url"
	"os"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"

	"github.com/kubemq-io/kubemq-proxy/embedded"
	"github.com/kubemq-io/kubemq-proxy/internal/kubemqtest"
	"github.com/kubemq-io/kubemq-proxy/kubemqclient"
	"github.com/kubemq-io/kubemq-proxy/registry"
)

// env is one proxy front-end on 127.0.0.1:0 in front of the test KubeMQ
// (embedded strict server, or $KUBEMQ_ADDRESS), with its own registry
// channel and a virtual host unique to the test, so runs against a shared
// KubeMQ never see each other's queues.
type env struct {
	t       testing.TB
	addr    string
	kubemq  string
	conn    grpc.ClientConnInterface // the in-process channel (KUBEMQ_LINK=memory)
	vhost   string
	srv     *Server
	kc      *kubemqclient.Client
	reg     *registry.Registry
	regChan string
	// followDelay: the registry reads the log this late (registry.Options.FollowDelay).
	followDelay time.Duration
	ready       atomic.Pointer[error]
	log         *zap.Logger
	stopFn      func()
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func newEnv(t testing.TB, opts ...func(*Options)) *env {
	t.Helper()
	e := &env{t: t, vhost: "t-" + randHex(4), regChan: "amqptest.registry." + randHex(4)}
	if kubemqtest.InProcess(false) && !kubemqtest.External() {
		// KUBEMQ_LINK=memory: through the in-process channel the binary uses
		// with its embedded server (strict, as every test backend); by
		// default loopback TCP (the Pub/Sub suite defaults to memory).
		_, srv := kubemqtest.StartEmbedded(t, embedded.Options{Strict: true})
		kubemqtest.CheckStrict(t, srv)
		e.kubemq, e.conn = "embedded", srv.Channel(embedded.SharePayloads())
	} else {
		e.kubemq = kubemqtest.Address(t)
	}
	e.log = zaptest.NewLogger(t, zaptest.Level(testLogLevel()))
	e.start(opts...)
	return e
}

// testLogLevel is the level of the proxy's log in tests: warnings unless
// AMQP_TEST_LOG_LEVEL names another (debug, to see a rare failure's story;
// AMQP_TEST_STACKS=FILE also writes every goroutine's stack to FILE when
// mustRecv times out).
func testLogLevel() zapcore.Level {
	if v := os.Getenv("AMQP_TEST_LOG_LEVEL"); v != "" {
		if l, err := zapcore.ParseLevel(v); err == nil {
			return l
		}
	}
	return zap.WarnLevel
}

// start (re)creates client, registry and server; used again by restart tests.
func (e *env) start(opts ...func(*Options)) {
	t := e.t
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	kc, err := kubemqclient.Dial(ctx, kubemqclient.Options{Address: e.kubemq, Logger: e.log.Named("kubemq"), Conn: e.conn})
	if err != nil {
		t.Fatal(err)
	}
	if err := kc.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	reg, err := registry.Open(ctx, registry.Options{Client: kc, Channel: e.regChan, Logger: e.log.Named("registry"),
		FollowDelay: e.followDelay})
	if err != nil {
		t.Fatal(err)
	}
	if err := reg.WaitReplayed(ctx); err != nil {
		t.Fatal(err)
	}
	o := Options{Client: kc, Registry: reg, Logger: e.log, ReadyCheck: 50 * time.Millisecond,
		Ready: func() error {
			if p := e.ready.Load(); p != nil {
				return *p
			}
			return nil
		}}
	for _, f := range opts {
		f(&o)
	}
	srv, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(lis) }()
	e.addr, e.srv, e.kc, e.reg = lis.Addr().String(), srv, kc, reg
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			buf := make([]byte, 1<<20)
			t.Errorf("Shutdown: %v\n%s", err, buf[:runtime.Stack(buf, true)])
		}
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
		reg.Close()
		kc.Close()
	}
	e.stopFn = stop
	t.Cleanup(stop)
}

// url is the AMQP URL of the env's vhost.
func (e *env) url() string {
	return "amqp://guest:guest@" + e.addr + "/" + url.PathEscape(e.vhost)
}

func (e *env) dial() *amqp.Connection {
	e.t.Helper()
	c, err := amqp.Dial(e.url())
	if err != nil {
		e.t.Fatalf("dial: %v", err)
	}
	e.t.Cleanup(func() { c.Close() })
	return c
}

func (e *env) channel(c *amqp.Connection) *amqp.Channel {
	e.t.Helper()
	ch, err := c.Channel()
	if err != nil {
		e.t.Fatalf("channel: %v", err)
	}
	return ch
}

// amqpCode returns the reply code of an *amqp.Error, or 0.
func amqpCode(err error) int {
	var e *amqp.Error
	if errors.As(err, &e) {
		return e.Code
	}
	return 0
}

func mustRecv[T any](t testing.TB, c <-chan T, what string) T {
	t.Helper()
	select {
	case v, ok := <-c:
		if !ok {
			t.Fatalf("%s: channel closed", what)
		}
		return v
	case <-time.After(15 * time.Second):
		if f := os.Getenv("AMQP_TEST_STACKS"); f != "" { // see testLogLevel
			buf := make([]byte, 64<<20)
			if err := os.WriteFile(f, buf[:runtime.Stack(buf, true)], 0o644); err != nil {
				t.Log(err)
			}
		}
		t.Fatalf("%s: timed out", what)
	}
	var zero T
	return zero
}

// rabbitEnv is an env on the test RabbitMQ (started once per test binary)
// with a fresh virtual host, so the same scenarios run against both brokers
// and must observe the same. It skips the test when RabbitMQ is missing.
func rabbitEnv(t testing.TB) *env {
	t.Helper()
	if _, err := rabbitURL(); err != nil {
		t.Skipf("differential run against RabbitMQ skipped: %v", err)
	}
	e := &env{t: t, addr: rabbitAddr, vhost: "t-" + randHex(4)}
	if err := rabbitctlRetry("add_vhost", e.vhost); err != nil {
		t.Fatal(err)
	}
	if err := rabbitctlRetry("set_permissions", "-p", e.vhost, "guest", ".*", ".*", ".*"); err != nil {
		t.Fatal(err)
	}
	return e
}

// rabbitctlRetry runs rabbitmqctl until it succeeds, for a few seconds: on
// a loaded machine the CLI sometimes fails to reach a node that already
// accepts AMQP connections (exit status 64 or 69 with "unable to perform
// an operation"). A vhost that a failed attempt did create counts as done.
func rabbitctlRetry(args ...string) error {
	var err error
	for range 20 {
		if err = rabbitctl(args...); err == nil || strings.Contains(err.Error(), "already exists") {
			return nil
		}
		time.Sleep(500 * time.Millisecond)
	}
	return err
}

// brokers runs a scenario against the proxy and, when it is installed,
// against RabbitMQ: what the clients observe must be the same.
func brokers(t *testing.T, scenario func(t *testing.T, e *env)) {
	t.Run("proxy", func(t *testing.T) { scenario(t, newEnv(t)) })
	t.Run("rabbitmq", func(t *testing.T) { scenario(t, rabbitEnv(t)) })
}
