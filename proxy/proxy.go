// Package proxy owns the process lifecycle: it starts the KubeMQ backend
// (embedded or external), the topology registry, the protocol front-ends and
// the HTTP side port, gates readiness on the backend and the registry, and
// shuts everything down in order.
package proxy

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kubemq-io/kubemq-proxy/cluster"
	"github.com/kubemq-io/kubemq-proxy/delivery"
	"github.com/kubemq-io/kubemq-proxy/embedded"
	"github.com/kubemq-io/kubemq-proxy/kubemqclient"
	"github.com/kubemq-io/kubemq-proxy/kubemqclient/wirecodec"
	"github.com/kubemq-io/kubemq-proxy/registry"
)

// Frontend is a protocol front-end served on one listener. Serve blocks
// until Shutdown (or a fatal listener error); Shutdown stops accepting,
// closes client connections with the protocol's "going away" signal and
// gives leases back.
type Frontend interface {
	Name() string
	Serve(lis net.Listener) error
	Shutdown(ctx context.Context) error
}

// PeerFrontend is a Frontend that takes work forwarded by other replicas: it registers the
// services they call on the peer port (cluster.listen).
type PeerFrontend interface {
	RegisterPeer(s grpc.ServiceRegistrar)
}

// FrontendFactory builds a front-end once the backend client and registry
// exist. main.go passes the factories of the compiled-in front-ends.
type FrontendFactory struct {
	Name   string
	Listen func(cfg *Config) []string // listen addresses; "" entries skipped
	TLS    func(cfg *Config) []bool   // per address: wrap in the AMQPS config
	New    func(deps Deps) (Frontend, error)
	// Management is the listen address of the front-end's management HTTP API (the
	// front-end implements ManagementAPI) and its configuration key; "" serves none.
	Management func(cfg *Config) (addr, key string)
	// PeerFast, if set, encodes or decodes some messages of the front-end's peer service
	// without protobuf reflection (the peer port's codec tries it first; see
	// cluster.PeerOptions.Fast).
	PeerFast *wirecodec.Fast
}

// ManagementAPI is implemented by front-ends that serve an HTTP management API of their
// protocol on a listener of its own (amqp091: RabbitMQ's management API subset).
type ManagementAPI interface {
	ManagementHandler() http.Handler
}

// Deps is what a front-end gets from the lifecycle.
type Deps struct {
	Config   *Config
	Logger   *zap.Logger
	Client   *kubemqclient.Client
	Registry *registry.Registry
	// Deliveries is the one lease engine of the process (one consumer per
	// KubeMQ queue), shared by the front-ends.
	Deliveries *delivery.Manager
	Metrics    prometheus.Registerer
	// Ready reports nil when the backend is reachable and the registry replayed.
	Ready func() error
	// Peers reaches the replica that consumes a queue; nil when this replica cannot forward
	// (no cluster secret).
	Peers *Peers
	// Fleet names the replicas that share this KubeMQ (the ownership log's members).
	Fleet *Fleet
}

// Fleet names the replicas that share this KubeMQ, as the ownership log knows them.
type Fleet struct{ c *cluster.Cluster }

// ID is this replica's id.
func (f *Fleet) ID() string { return f.c.ID() }

// Alive returns the ids of the replicas heard from within the lease, this one included; nil
// until the ownership log has been read up to now.
func (f *Fleet) Alive() []string {
	select {
	case <-f.c.Ready():
	default:
		return nil
	}
	ms := f.c.Members()
	ids := make([]string, 0, len(ms))
	for _, m := range ms {
		ids = append(ids, m.ID)
	}
	return ids
}

// Lease is how long a replica stays alive in the log after its last heartbeat.
func (f *Fleet) Lease() time.Duration { return f.c.Lease() }

// ReportUses sets the function the heartbeats call for the queues this replica's clients
// consume (cluster.Cluster.ReportUses).
func (f *Fleet) ReportUses(uses func() []string) { f.c.ReportUses(uses) }

// UsesChanged asks for a heartbeat now (cluster.Cluster.UsesChanged).
func (f *Fleet) UsesChanged() { f.c.UsesChanged() }

// Orphaned returns the queues whose consumers ended with a replica that died
// (cluster.Cluster.Orphaned).
func (f *Fleet) Orphaned() []string { return f.c.Orphaned() }

// Peers reaches the replica that consumes a queue, when several share one KubeMQ.
type Peers struct {
	c    *cluster.Cluster
	p    *cluster.Peers
	reg  *registry.Registry
	self string // this replica's advertised peer address
	log  *zap.Logger
}

// Self returns the peer address this replica advertises.
func (p *Peers) Self() string { return p.self }

// Owner returns the peer address of another replica that consumes queue.
func (p *Peers) Owner(queue string) (string, bool) {
	m, ok := p.c.Owner(queue)
	if !ok || m.ID == p.c.ID() {
		return "", false
	}
	return m.Addr, true
}

// Conn returns a connection to the replica at addr.
func (p *Peers) Conn(addr string) (grpc.ClientConnInterface, error) { return p.p.Conn(addr) }

// Propagate waits until every other live replica has read this replica's
// registry writes so far (registry.Registry.Propagate): a front-end calls it
// after a topology change, before it answers. A replica that cannot be
// reached in time is logged and not waited for further.
func (p *Peers) Propagate(ctx context.Context) {
	conns, err := p.p.Others(p.c)
	if err != nil {
		p.log.Warn("topology change not confirmed by a replica", zap.Error(err))
	}
	if err := p.reg.Propagate(ctx, conns); err != nil && ctx.Err() == nil {
		p.log.Warn("topology change not confirmed by every replica; they apply it when they read the registry log", zap.Error(err))
	}
}

// owners adapts the ownership log to the delivery engine.
type owners struct{ c *cluster.Cluster }

func (o owners) Claim(ctx context.Context, queue string) (delivery.Owned, error) {
	h, err := o.c.Claim(ctx, queue)
	var oe *cluster.OwnedError
	switch {
	case err == nil:
		return h, nil
	case errors.As(err, &oe), errors.Is(err, cluster.ErrUnsettled), errors.Is(err, cluster.ErrNotReady):
		// Owned elsewhere, or not known yet: the front-ends forward or answer "retry".
		return nil, fmt.Errorf("%w: %w", delivery.ErrNotOwner, err)
	}
	return nil, err
}

// Proxy is one running kubemq-proxy.
type Proxy struct {
	cfg     Config
	log     *zap.Logger
	metrics *prometheus.Registry

	embedded      *embedded.Server
	embeddedLis   net.Listener
	client        *kubemqclient.Client
	reg           *registry.Registry
	clusterClient *kubemqclient.Client // the ownership and acknowledgement logs' own
	cluster       *cluster.Cluster
	acks          *cluster.AckLog
	peers         *cluster.Peers
	peerSrv       *grpc.Server
	peerLis       net.Listener
	deliveries    *delivery.Manager
	httpSrv       *http.Server
	httpLis       net.Listener

	frontends []runningFrontend
	logLevel  *zap.AtomicLevel // served on /loglevel when set
	// adminToken opens /state and /loglevel to non-loopback peers ("" = loopback only).
	adminToken string

	wg       sync.WaitGroup
	mu       sync.Mutex // guards stopping
	stopping bool
	errc     chan error
}

type runningFrontend struct {
	fe   Frontend
	lis  []net.Listener
	name string
	// The management API's server and listener (FrontendFactory.Management); nil without.
	mgmt    *http.Server
	mgmtLis net.Listener
}

// New validates cfg; nothing is started until Start.
func New(cfg Config, log *zap.Logger) (*Proxy, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = zap.NewNop()
	}
	if err := cfg.readSecrets(); err != nil {
		return nil, err
	}
	return &Proxy{cfg: cfg, log: log, metrics: prometheus.NewRegistry(), errc: make(chan error, 8), adminToken: cfg.HTTP.AdminToken}, nil
}

// SetLogLevel lets GET/PUT /loglevel read and change the running log level;
// call it before Start.
func (p *Proxy) SetLogLevel(l zap.AtomicLevel) { p.logLevel = &l }

// Start brings the proxy up: backend, client, registry replay, HTTP side
// port, front-ends. Readiness (/readyz) turns on by itself once the backend
// is reachable and the registry has replayed; Start does not wait for it,
// so a slow backend does not keep the health endpoints down.
func (p *Proxy) Start(ctx context.Context, factories []FrontendFactory) (err error) {
	defer func() {
		if err != nil {
			p.Shutdown(context.Background())
		}
	}()
	p.metrics.MustRegister(prometheus.NewGoCollector(), prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}))

	address := p.cfg.KubeMQ.Address
	if p.cfg.UseEmbedded() {
		opts, err := p.cfg.EmbeddedOptions(p.log.Named("embedded"))
		if err != nil {
			return err
		}
		srv, err := embedded.New(opts)
		if err != nil {
			return fmt.Errorf("embedded server: %w", err)
		}
		p.embedded = srv
		lis, err := Listen("embedded.listen", p.cfg.Embedded.Listen)
		if err != nil {
			return err
		}
		p.embeddedLis = lis
		address = lis.Addr().String()
		p.log.Info("listening", zap.String("listener", "embedded-kubemq"), zap.String("address", address), zap.String("data_dir", p.cfg.Embedded.DataDir),
			zap.Int64("max_memory_bytes", opts.MaxMemory))
		p.goServe("embedded-kubemq", func() error { return srv.Serve(lis) })
	}

	copts := kubemqclient.Options{Address: address, ClientID: p.cfg.KubeMQ.ClientID, AuthToken: p.cfg.KubeMQ.AuthToken, Logger: p.log.Named("kubemq"),
		Observe: BackendObserver(p.metrics), SendAttempt: p.cfg.KubeMQ.SendAttempt}
	copts.PingInterval, copts.PingTimeout, copts.OutageSilence, copts.MaxBackoff = p.cfg.KubeMQ.HealthPings()
	if p.embedded != nil {
		// The proxy's own client calls the embedded server's handlers in
		// this process (embedded.Server.Channel: the same gRPC service
		// and messages without HTTP/2 framing or protobuf encoding);
		// embedded.listen still serves native KubeMQ clients. The
		// front-ends never change a message's body or tags once sent, so
		// the server keeps them as the stored message (SharePayloads).
		copts.Address = "embedded"
		copts.Conn = p.embedded.Channel(embedded.SharePayloads())
	}
	if p.cfg.KubeMQ.TLS && !p.cfg.UseEmbedded() {
		tc, err := p.clientTLS()
		if err != nil {
			return err
		}
		copts.TLS = tc
	}
	p.client, err = kubemqclient.Dial(ctx, copts)
	if err != nil {
		return fmt.Errorf("kubemq client: %w", err)
	}
	// The ownership and acknowledgement logs go through a connection of their own: a
	// heartbeat queued behind a burst of published messages on the shared event streams
	// could come back too late and cost the replica its queues.
	copts.Observe, copts.Logger = nil, p.log.Named("kubemq.cluster")
	p.clusterClient, err = kubemqclient.Dial(ctx, copts)
	if err != nil {
		return fmt.Errorf("kubemq client: %w", err)
	}

	p.metrics.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "kubemq_proxy", Name: "backend_up",
		Help: "1 while the KubeMQ backend answers, 0 otherwise.",
	}, func() float64 {
		if p.client.Ready() {
			return 1
		}
		return 0
	}))
	p.metrics.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Namespace: "kubemq_proxy", Name: "backend_sends_resent_total",
		Help: "Queue message batches KubeMQ left unanswered within one attempt (kubemq.send_attempt), sent again.",
	}, func() float64 { return float64(p.client.SendsResent() + p.clusterClient.SendsResent()) }))
	p.metrics.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Namespace: "kubemq_proxy", Name: "backend_sends_cut_total",
		Help: "Client publishes in flight to KubeMQ when it was declared unreachable (kubemq.outage_detection), answered UNAVAILABLE or basic.nack: KubeMQ may have stored them, so the client's retry may store them twice.",
	}, func() float64 { return float64(p.client.SendsCut()) }))
	p.metrics.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "kubemq_proxy", Name: "ready",
		Help: "1 while the proxy is ready (backend up and registry replayed).",
	}, func() float64 {
		if p.Ready() == nil {
			return 1
		}
		return 0
	}))

	p.reg, err = registry.Open(ctx, registry.Options{Client: p.client, Channel: p.cfg.Registry.Channel, SnapshotInterval: p.cfg.Registry.SnapshotInterval, Logger: p.log.Named("registry")})
	if err != nil {
		return fmt.Errorf("registry: %w", err)
	}

	var deps Deps
	if err := p.startCluster(&deps, factories); err != nil {
		return err
	}
	p.deliveries, err = delivery.NewManager(delivery.NewKubeMQBackend(p.client), delivery.Options{
		Logger: p.log.Named("delivery"), RecordDelay: p.cfg.Delivery.RecordDelay,
		Owners: owners{p.cluster}, Settlements: p.acks, MetricsQueueLabels: p.cfg.Delivery.MetricsQueueLabels,
	}, p.metrics)
	if err != nil {
		return fmt.Errorf("delivery: %w", err)
	}

	deps.Config, deps.Logger, deps.Client, deps.Registry, deps.Deliveries, deps.Metrics, deps.Ready =
		&p.cfg, p.log, p.client, p.reg, p.deliveries, p.metrics, p.Ready
	for _, f := range factories {
		addrs := f.Listen(&p.cfg)
		var tlsFlags []bool
		if f.TLS != nil {
			tlsFlags = f.TLS(&p.cfg)
		}
		fe, err := f.New(deps)
		if err != nil {
			return fmt.Errorf("%s: %w", f.Name, err)
		}
		rf := runningFrontend{fe: fe, name: f.Name}
		for i, a := range addrs {
			if a == "" {
				continue
			}
			key := f.Name + ".listen"
			if i < len(tlsFlags) && tlsFlags[i] {
				key = f.Name + ".tls_listen"
			}
			lis, err := Listen(key, a)
			if err != nil {
				return err
			}
			name := f.Name
			if i < len(tlsFlags) && tlsFlags[i] {
				tc, err := p.amqpTLS()
				if err != nil {
					lis.Close()
					return err
				}
				lis = tls.NewListener(lis, tc)
				name += "-tls"
			}
			rf.lis = append(rf.lis, lis)
			p.log.Info("listening", zap.String("listener", name), zap.String("address", lis.Addr().String()))
		}
		if f.Management != nil {
			if a, key := f.Management(&p.cfg); a != "" {
				api, ok := fe.(ManagementAPI)
				if !ok {
					return fmt.Errorf("%s: %s is set but the front-end has no management API", f.Name, key)
				}
				lis, err := Listen(key, a)
				if err != nil {
					return err
				}
				rf.mgmtLis = lis
				rf.mgmt = &http.Server{Handler: api.ManagementHandler(), ReadHeaderTimeout: 10 * time.Second}
				p.log.Info("listening", zap.String("listener", f.Name+"-management"), zap.String("address", lis.Addr().String()))
			}
		}
		p.frontends = append(p.frontends, rf)
		if rf.mgmt != nil {
			srv, lis := rf.mgmt, rf.mgmtLis
			p.goServe(rf.name+"-management", func() error {
				if err := srv.Serve(lis); !errors.Is(err, http.ErrServerClosed) {
					return err
				}
				return nil
			})
		}
		for _, lis := range rf.lis {
			lis := lis
			p.goServe(rf.name, func() error { return fe.Serve(lis) })
		}
		if pf, ok := fe.(PeerFrontend); ok && p.peerSrv != nil {
			pf.RegisterPeer(p.peerSrv)
		}
	}
	if p.peerSrv != nil {
		p.goServe("cluster", func() error { return p.peerSrv.Serve(p.peerLis) })
	}

	// The side port comes last so that /state never races with the
	// front-end list being built.
	if p.cfg.HTTP.Listen != "" {
		lis, err := Listen("http.listen", p.cfg.HTTP.Listen)
		if err != nil {
			return err
		}
		p.httpLis = lis
		p.httpSrv = &http.Server{Handler: p.httpHandler(), ReadHeaderTimeout: 10 * time.Second}
		p.log.Info("listening", zap.String("listener", "http"), zap.String("address", lis.Addr().String()))
		p.goServe("http", func() error {
			if err := p.httpSrv.Serve(lis); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		})
	}
	return nil
}

// goServe runs a listener loop; an unexpected return is reported on Errors.
func (p *Proxy) goServe(name string, serve func() error) {
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		err := serve()
		p.mu.Lock()
		stopping := p.stopping
		p.mu.Unlock()
		if err != nil && !stopping {
			select {
			case p.errc <- fmt.Errorf("%s: %w", name, err):
			default:
			}
		}
	}()
}

// Errors delivers fatal listener errors; main exits on the first.
func (p *Proxy) Errors() <-chan error { return p.errc }

// Ready is nil when the proxy can serve traffic.
func (p *Proxy) Ready() error {
	p.mu.Lock()
	stopping := p.stopping
	p.mu.Unlock()
	if stopping {
		return errors.New("shutting down")
	}
	return p.serving()
}

// serving is Ready without the shutdown: other replicas' calls are still taken while the
// front-ends drain (their clients' settlements of what this replica handed out).
func (p *Proxy) serving() error {
	switch {
	case p.client == nil || !p.client.Ready():
		return errors.New("kubemq backend unreachable")
	case p.reg == nil || !p.reg.Replayed():
		return errors.New("registry not replayed yet")
	case p.cluster == nil:
		return errors.New("ownership log not opened yet")
	}
	select {
	case <-p.cluster.Ready():
	default:
		return errors.New("ownership log not read up to now yet")
	}
	return nil
}

// Addr returns the bound address of a listener by name ("http",
// "embedded-kubemq", a front-end name, or "amqp-management"); tests use it with port 0.
func (p *Proxy) Addr(name string) string {
	switch name {
	case "http":
		if p.httpLis != nil {
			return p.httpLis.Addr().String()
		}
	case "embedded-kubemq":
		if p.embeddedLis != nil {
			return p.embeddedLis.Addr().String()
		}
	case "cluster":
		if p.peerLis != nil {
			return p.peerLis.Addr().String()
		}
	}
	for _, f := range p.frontends {
		if f.name+"-management" == name && f.mgmtLis != nil {
			return f.mgmtLis.Addr().String()
		}
		for i, l := range f.lis {
			if f.name == name && i == 0 || f.name+"-tls" == name && i == 1 {
				return l.Addr().String()
			}
		}
	}
	return ""
}

// Client is the proxy's KubeMQ client (tests use it for native interop).
func (p *Proxy) Client() *kubemqclient.Client { return p.client }

// Registry is the proxy's topology registry.
func (p *Proxy) Registry() *registry.Registry { return p.reg }

// Shutdown stops in order: readiness off, front-ends (stop accepting, close
// connections, give leases back), registry, client, HTTP, embedded backend.
// It returns when ctx ends even if a step is still waiting (a KubeMQ that
// stopped answering holds up the steps that settle with it), with an error
// naming the step it gave up on; the process can then exit: whatever was
// not settled comes back through KubeMQ's own expiries (lease records,
// visibility). It is idempotent.
func (p *Proxy) Shutdown(ctx context.Context) error {
	p.mu.Lock()
	if p.stopping {
		p.mu.Unlock()
		return nil
	}
	p.stopping = true
	p.mu.Unlock()

	var stepMu sync.Mutex
	current := "starting"
	step := func(s string) {
		stepMu.Lock()
		current = s
		stepMu.Unlock()
		p.log.Debug("shutdown step", zap.String("step", s))
	}
	done := make(chan error, 1)
	go func() { done <- p.shutdown(ctx, step) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	stepMu.Lock()
	at := current
	stepMu.Unlock()
	p.log.Warn("shutdown deadline passed; giving up on the rest", zap.String("waiting_on", at), zap.Error(ctx.Err()))
	return fmt.Errorf("shutdown gave up waiting on %s: %w", at, ctx.Err())
}

// shutdown runs Shutdown's steps, naming each through step before it starts.
func (p *Proxy) shutdown(ctx context.Context, step func(string)) error {
	var errs []error
	for i := len(p.frontends) - 1; i >= 0; i-- {
		f := p.frontends[i]
		if f.mgmt != nil {
			step("front-end " + f.name + " management API")
			f.mgmt.Shutdown(ctx)
		}
		step("front-end " + f.name + " (closing connections, giving leases back)")
		if err := f.fe.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", f.name, err))
		}
		for _, l := range f.lis {
			l.Close()
		}
	}
	if p.deliveries != nil {
		step("delivery consumers (settling with KubeMQ)")
		// Consumers close clean (everything given back, recorded in the acknowledgement
		// log) and release their queues for other replicas to claim at once.
		if err := p.deliveries.Close(ctx); err != nil {
			errs = append(errs, fmt.Errorf("delivery: %w", err))
		}
	}
	step("peer port")
	if p.peerSrv != nil {
		p.peerSrv.Stop()
	}
	if p.peers != nil {
		p.peers.Close()
	}
	if p.acks != nil {
		step("acknowledgement log")
		if err := p.acks.Close(ctx); err != nil {
			errs = append(errs, fmt.Errorf("acknowledgement log: %w", err))
		}
	}
	if p.cluster != nil {
		step("ownership log (releasing queues)")
		if err := p.cluster.Close(ctx); err != nil {
			errs = append(errs, fmt.Errorf("cluster: %w", err))
		}
	}
	if p.reg != nil {
		step("registry")
		p.reg.Close()
	}
	if p.clusterClient != nil {
		step("KubeMQ client of the ownership log")
		p.clusterClient.Close()
	}
	if p.client != nil {
		step("KubeMQ client (draining publishes and streams)")
		p.client.Close()
	}
	step("HTTP side port and embedded server")
	if p.httpSrv != nil {
		p.httpSrv.Shutdown(ctx)
	} else if p.httpLis != nil {
		p.httpLis.Close()
	}
	if p.embedded != nil {
		p.embedded.Stop()
	} else if p.embeddedLis != nil {
		p.embeddedLis.Close()
	}
	step("listener goroutines")
	done := make(chan struct{})
	go func() { p.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		errs = append(errs, fmt.Errorf("shutdown: %w", ctx.Err()))
	}
	return errors.Join(errs...)
}

func (p *Proxy) clientTLS() (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: p.cfg.KubeMQ.ServerName}
	if p.cfg.KubeMQ.CAFile != "" {
		pool, err := loadPool(p.cfg.KubeMQ.CAFile)
		if err != nil {
			return nil, fmt.Errorf("kubemq.ca_file: %w", err)
		}
		tc.RootCAs = pool
	}
	if p.cfg.KubeMQ.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(p.cfg.KubeMQ.CertFile, p.cfg.KubeMQ.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("kubemq.cert_file: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

func (p *Proxy) amqpTLS() (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(p.cfg.AMQP.CertFile, p.cfg.AMQP.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("amqp.cert_file: %w", err)
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}
	if p.cfg.AMQP.ClientCAFile != "" {
		pool, err := loadPool(p.cfg.AMQP.ClientCAFile)
		if err != nil {
			return nil, fmt.Errorf("amqp.client_ca_file: %w", err)
		}
		tc.ClientCAs = pool
		tc.ClientAuth = tls.VerifyClientCertIfGiven
	}
	return tc, nil
}

func loadPool(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, errors.New("no PEM certificates found")
	}
	return pool, nil
}

// startCluster opens the ownership and acknowledgement logs, and the peer port and the peer
// connections when a secret is configured.
func (p *Proxy) startCluster(deps *Deps, factories []FrontendFactory) error {
	cc := p.cfg.Cluster
	secret := cc.Secret
	if cc.SecretFile != "" {
		b, err := os.ReadFile(cc.SecretFile)
		if err != nil {
			return fmt.Errorf("cluster.secret_file: %w", err)
		}
		secret = strings.TrimSpace(string(b))
		if secret == "" {
			return errors.New("cluster.secret_file: the file is empty")
		}
	}
	var serverTLS, clientTLS *tls.Config
	if cc.TLSCertFile != "" {
		cert, err := tls.LoadX509KeyPair(cc.TLSCertFile, cc.TLSKeyFile)
		if err != nil {
			return fmt.Errorf("cluster.tls_cert_file: %w", err)
		}
		pool, err := loadPool(cc.TLSCAFile)
		if err != nil {
			return fmt.Errorf("cluster.tls_ca_file: %w", err)
		}
		serverTLS = &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert}
		clientTLS = &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}, RootCAs: pool}
	}
	po := cluster.PeerOptions{Secret: secret, ServerTLS: serverTLS, ClientTLS: clientTLS, Fast: peerFast(factories)}
	bound := ""
	if cc.Listen != "" {
		lis, err := Listen("cluster.listen", cc.Listen)
		if err != nil {
			return err
		}
		p.peerLis = lis
		bound = lis.Addr().String()
		srv, err := cluster.NewPeerServer(po,
			[]grpc.UnaryServerInterceptor{func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (resp any, err error) {
				if rerr := p.serving(); rerr != nil {
					return nil, status.Error(codes.Unavailable, "kubemq-proxy is not ready: "+rerr.Error())
				}
				defer func() {
					if r := recover(); r != nil {
						p.log.Error("panic in a peer call", zap.String("method", info.FullMethod), zap.Any("panic", r), zap.Stack("stack"))
						err = status.Error(codes.Internal, "kubemq-proxy: internal error")
					}
				}()
				return h(ctx, req)
			}},
			[]grpc.StreamServerInterceptor{func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) (err error) {
				if rerr := p.serving(); rerr != nil {
					return status.Error(codes.Unavailable, "kubemq-proxy is not ready: "+rerr.Error())
				}
				defer func() {
					if r := recover(); r != nil {
						p.log.Error("panic in a peer stream", zap.String("method", info.FullMethod), zap.Any("panic", r), zap.Stack("stack"))
						err = status.Error(codes.Internal, "kubemq-proxy: internal error")
					}
				}()
				return h(srv, ss)
			}})
		if err != nil {
			return err
		}
		registry.RegisterPeer(srv, p.reg)
		p.peerSrv = srv
		p.log.Info("listening", zap.String("listener", "cluster"), zap.String("address", bound))
	}
	advertise := cc.AdvertiseAddr(bound)
	id := cc.ReplicaID
	if id == "" && p.embedded != nil {
		// Only this process consumes its own embedded server's queues; with a data dir its
		// ownership log outlives the process, and a restart must find its queues its own
		// at once rather than wait out the last process's hold.
		id = "embedded"
		if d := p.cfg.Embedded.DataDir; d != "" {
			if abs, err := filepath.Abs(d); err == nil {
				d = abs
			}
			sum := sha256.Sum256([]byte(d))
			id = "embedded-" + hex.EncodeToString(sum[:6])
		}
	}
	c, err := cluster.Open(cluster.Options{
		Client: p.clusterClient, Channel: cc.Channel, ReplicaID: id, Advertise: advertise,
		Lease: cc.Lease, Heartbeat: cc.Heartbeat, Logger: p.log,
	})
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	p.cluster = c
	p.acks, err = cluster.OpenAckLog(cluster.AckLogOptions{
		Client: p.clusterClient, Channel: cc.Channel + ".acks", Window: 2*p.cfg.Delivery.RecordDelay + cc.Lease + 30*time.Second, Logger: p.log,
	})
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	if secret != "" {
		if p.peers, err = cluster.NewPeers(po); err != nil {
			return err
		}
		deps.Peers = &Peers{c: c, p: p.peers, reg: p.reg, self: advertise, log: p.log.Named("cluster")}
	}
	deps.Fleet = &Fleet{c: c}
	p.log.Info("cluster", zap.String("replica", c.ID()), zap.String("advertise", advertise), zap.Bool("forwarding", secret != ""))
	return nil
}

// peerFast is the front-ends' PeerFast encoders and decoders, chained (nil when none has any).
func peerFast(factories []FrontendFactory) *wirecodec.Fast {
	var fs []*wirecodec.Fast
	for _, f := range factories {
		if f.PeerFast != nil {
			fs = append(fs, f.PeerFast)
		}
	}
	return wirecodec.Chain(fs...)
}
