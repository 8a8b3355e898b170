package gcp_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	pubsubv1 "cloud.google.com/go/pubsub"
	"cloud.google.com/go/pubsub/v2"

	"github.com/kubemq-io/kubemq-proxy/delivery"
	"github.com/kubemq-io/kubemq-proxy/embedded"
	"github.com/kubemq-io/kubemq-proxy/gcp"
	"github.com/kubemq-io/kubemq-proxy/internal/kubemqtest"
	"github.com/kubemq-io/kubemq-proxy/kubemqclient"
	"github.com/kubemq-io/kubemq-proxy/registry"
)

// env is one proxy front-end on 127.0.0.1:0 over a test KubeMQ.
type env struct {
	t       testing.TB
	addr    string
	srv     *gcp.Server
	kc      *kubemqclient.Client
	reg     *registry.Registry
	dm      *delivery.Manager
	project string
	suffix  string // makes ids unique on a shared external KubeMQ
	ready   atomic.Pointer[error]
	log     *zap.Logger
	cfg     envConfig
	relay   *relay // between the proxy's KubeMQ client and the server, when asked for
	// dialKubeMQ opens another client to the env's KubeMQ (a replica of
	// its own); closed at cleanup.
	dialKubeMQ func() *kubemqclient.Client
	stop       func() // stops the current replica
	// followDelay: replicas started from now on read the registry log this
	// late (registry.Options.FollowDelay).
	followDelay time.Duration
}

// envConfig is what envOptions adjust.
type envConfig struct {
	gcp      []func(*gcp.Options)
	delivery delivery.Options
	// relay puts a TCP relay the test can cut between the proxy's KubeMQ
	// client and the server; the readiness gate then follows the client.
	relay bool
	// kubemq is the address of a KubeMQ server to use ("" = the usual).
	kubemq string
	// scanDelays gives the test's own embedded server the real server's
	// delay processor (embedded.Options.ScanDelays).
	scanDelays bool
	// embedded, when set, are the options of the test's own embedded server
	// (for embedded-only limits; the test skips itself on an external one).
	embedded *embedded.Options
}

type envOption func(*envConfig)

// withGCP adjusts the front-end's options.
func withGCP(f func(*gcp.Options)) envOption {
	return func(c *envConfig) { c.gcp = append(c.gcp, f) }
}

// withDelivery sets the lease engine's options (the logger is added).
func withDelivery(o delivery.Options) envOption {
	return func(c *envConfig) { c.delivery = o }
}

// withKubeMQ uses the KubeMQ server at addr.
func withKubeMQ(addr string) envOption { return func(c *envConfig) { c.kubemq = addr } }

// withScanDelays models the real server's delay processor in the test's
// embedded server (an external one is used as it is).
func withScanDelays() envOption { return func(c *envConfig) { c.scanDelays = true } }

// withEmbedded runs the test's own embedded server with opts, reached
// through the in-process channel the binary uses.
func withEmbedded(opts embedded.Options) envOption {
	return func(c *envConfig) { c.embedded = &opts }
}

// withRelay puts a cuttable TCP relay in front of KubeMQ.
func withRelay() envOption { return func(c *envConfig) { c.relay = true } }

func startEnv(t testing.TB, opts ...envOption) *env {
	t.Helper()
	var cfg envConfig
	for _, o := range opts {
		o(&cfg)
	}
	var kaddr string
	var inproc grpc.ClientConnInterface // nil: TCP
	log := zaptest.NewLogger(t)
	if cfg.embedded != nil {
		_, srv := kubemqtest.StartEmbedded(t, *cfg.embedded)
		kubemqtest.CheckStrict(t, srv)
		kaddr, inproc = "embedded", srv.Channel(embedded.SharePayloads())
	} else if cfg.kubemq != "" {
		kaddr = cfg.kubemq
		if _, bench := t.(*testing.B); bench {
			log = zap.NewNop()
		}
	} else if _, bench := t.(*testing.B); bench {
		// Benchmarks measure the proxy as the binary runs it (not strict, no
		// debug logging): the embedded server in process and in memory, or
		// with $BENCH_PERSIST=1 with a data directory; $KUBEMQ_LINK=tcp
		// reaches it over loopback TCP instead.
		log = zap.NewNop()
		opts := embedded.Options{Logger: log}
		if os.Getenv("BENCH_PERSIST") != "" {
			opts.DataDir = t.TempDir()
		}
		switch {
		case kubemqtest.External():
			kaddr = kubemqtest.Address(t)
		case !kubemqtest.InProcess(true):
			kaddr, _ = kubemqtest.StartEmbedded(t, opts)
		default:
			srv, err := embedded.New(opts)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { srv.Close() })
			kaddr, inproc = "embedded", srv.Channel(embedded.SharePayloads())
		}
	} else if kubemqtest.InProcess(true) && !kubemqtest.External() && !cfg.relay {
		// By default this suite reaches the embedded server (strict, as
		// every test backend) through the in-process channel the binary uses;
		// KUBEMQ_LINK=tcp uses loopback TCP (the AMQP suite's default).
		_, srv := kubemqtest.StartEmbedded(t, embedded.Options{Strict: true, ScanDelays: cfg.scanDelays})
		kubemqtest.CheckStrict(t, srv)
		kaddr, inproc = "embedded", srv.Channel(embedded.SharePayloads())
	} else if cfg.scanDelays && !kubemqtest.External() {
		var srv *embedded.Server
		kaddr, srv = kubemqtest.StartEmbedded(t, embedded.Options{Strict: true, DataDir: t.TempDir(), ScanDelays: true})
		kubemqtest.CheckStrict(t, srv)
	} else {
		kaddr = kubemqtest.Address(t)
	}
	var rl *relay
	if cfg.relay {
		// Cutting the relay ends the proxy's streams, also one whose Get
		// waits: the network's doing, not the proxy's.
		kubemqtest.Tolerate(t, func(st *embedded.StrictStats) { st.StreamEndedDuringGet = 0 })
		rl = startRelay(t, kaddr)
		kaddr = rl.addr
	}
	suffix := randSuffix()
	e := &env{t: t, project: "proj-" + suffix, suffix: suffix, log: log, cfg: cfg, relay: rl}
	e.dialKubeMQ = func() *kubemqclient.Client {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		kc, err := kubemqclient.Dial(ctx, kubemqclient.Options{Address: kaddr, Conn: inproc, Logger: log.Named("kubemq"),
			MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, PingInterval: 200 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { kc.Close() })
		if err := kc.WaitReady(ctx); err != nil {
			t.Fatal(err)
		}
		return kc
	}
	e.kc = e.dialKubeMQ()
	e.addr, e.srv, e.stop = e.startReplica()
	t.Cleanup(func() { e.stop() })
	return e
}

// startReplica starts a proxy front-end with its own registry view and
// lease engine (a proxy process) on the env's KubeMQ and registry channel.
// stop shuts it down gracefully; it is idempotent.
func (e *env) startReplica() (addr string, srv *gcp.Server, stop func()) {
	t := e.t
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	reg, err := registry.Open(ctx, registry.Options{
		Client:      e.kc,
		Channel:     kubemqclient.Channel("kubemq-proxy-test.gcp", e.suffix),
		Logger:      e.log.Named("registry"),
		FollowDelay: e.followDelay,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := reg.WaitReplayed(ctx); err != nil {
		t.Fatalf("registry replay: %v", err)
	}
	e.reg = reg
	dopts := e.cfg.delivery
	dopts.Logger = e.log.Named("delivery")
	dm, err := delivery.NewManager(delivery.NewKubeMQBackend(e.kc), dopts, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.dm = dm
	o := gcp.Options{Client: e.kc, Registry: reg, Deliveries: dm, Logger: e.log.Named("gcp"), Ready: func() error {
		if p := e.ready.Load(); p != nil {
			return *p
		}
		if e.relay != nil && !e.kc.Ready() {
			return errKubeMQDown
		}
		return nil
	}}
	for _, f := range e.cfg.gcp {
		f(&o)
	}
	srv, err = gcp.New(o)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(lis) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			srv.Shutdown(ctx)
			if err := <-done; err != nil {
				t.Errorf("Serve: %v", err)
			}
			dm.Close(ctx)
			reg.Close()
		})
	}
	return lis.Addr().String(), srv, stop
}

func randSuffix() string {
	var b [4]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// id makes a resource id unique to this run.
func (e *env) id(base string) string { return base + "-" + e.suffix }

func (e *env) topicName(id string) string { return "projects/" + e.project + "/topics/" + id }
func (e *env) subName(id string) string   { return "projects/" + e.project + "/subscriptions/" + id }

func (e *env) clientOptions() []option.ClientOption {
	return []option.ClientOption{
		option.WithEndpoint(e.addr),
		option.WithoutAuthentication(),
		option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())),
	}
}

// v2 is the current Go client.
func (e *env) v2() *pubsub.Client {
	e.t.Helper()
	c, err := pubsub.NewClient(context.Background(), e.project, e.clientOptions()...)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { c.Close() })
	return c
}

// v1 is the previous generation of the Go client (same wire service).
func (e *env) v1() *pubsubv1.Client {
	e.t.Helper()
	c, err := pubsubv1.NewClient(context.Background(), e.project, e.clientOptions()...)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { c.Close() })
	return c
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func wantCode(t *testing.T, err error, want codes.Code, contains string) {
	t.Helper()
	st, _ := status.FromError(err)
	if st.Code() != want {
		t.Fatalf("got %v, want %v", err, want)
	}
	if contains != "" && !strings.Contains(st.Message(), contains) {
		t.Fatalf("message %q does not contain %q", st.Message(), contains)
	}
}

var errKubeMQDown = errors.New("KubeMQ unreachable")
