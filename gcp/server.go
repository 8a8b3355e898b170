package gcp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/experimental"

	"cloud.google.com/go/iam/apiv1/iampb"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/kubemq-io/kubemq-proxy/delivery"
	"github.com/kubemq-io/kubemq-proxy/gcp/limits"
	"github.com/kubemq-io/kubemq-proxy/kubemqclient"
	"github.com/kubemq-io/kubemq-proxy/kubemqclient/wirecodec"
)

// Defaults of the knobs in Config.
const (
	DefaultMaxMessageBytes            = 10 << 20
	DefaultAckDeadline                = 10 * time.Second
	DefaultMaxInflightPerSubscription = 20000
	DefaultStreamCloseAfter           = 30 * time.Minute
	DefaultMaxOutstandingMessages     = 1000
	DefaultPushMaxConcurrency         = 256
	DefaultPushMaxPerSubscription     = 64
	DefaultPushConnectTimeout         = 10 * time.Second
	DefaultMaxPendingPublishBytes     = 32 << 20

	// grpcHeadroom is what a PublishRequest may carry beyond its messages'
	// bytes (names, framing) before gRPC refuses it; the per-message limit
	// is checked by the publish validation with Google's text.
	grpcHeadroom = 1 << 20
)

// Config holds the front-end's knobs; zero values take the defaults above.
type Config struct {
	// MaxMessageBytes bounds one message (data + attributes); a Publish
	// request may carry up to this plus a little headroom.
	MaxMessageBytes int
	// DefaultAckDeadline is a subscription's deadline when it asks for 0.
	DefaultAckDeadline time.Duration
	// MaxInflightPerSubscription caps leased messages per subscription
	// across all streams; the tail waits in KubeMQ.
	MaxInflightPerSubscription int
	// StreamCloseAfter is when the server ends a StreamingPull with
	// UNAVAILABLE so that clients reconnect (Google does the same).
	StreamCloseAfter time.Duration
	// MaxOutstandingMessages bounds a stream whose client set no limit.
	MaxOutstandingMessages int
	// RuntimeIdle ends a subscription's delivery runtime (its poller and
	// lease table) once no stream or Pull has used it for this long and it
	// holds no leases (default 2 minutes); the next pull starts a new one.
	RuntimeIdle time.Duration
	// PushMaxConcurrency bounds the push requests in flight on this
	// replica, all subscriptions together (push.go).
	PushMaxConcurrency int
	// PushMaxPerSubscription is the largest flow-control window of one push
	// subscription: requests it may have in flight.
	PushMaxPerSubscription int
	// PushConnectTimeout bounds connecting to a push endpoint (TCP and
	// TLS); a request as a whole is bounded by the ack deadline.
	PushConnectTimeout time.Duration
	// PushAllowedHosts, when not empty, is a comma-separated list of the
	// endpoint hosts pushes may go to: names, *.domain wildcards, host:port.
	PushAllowedHosts string
	// PushOIDCKeyFile is a PEM RSA private key that signs the tokens of
	// oidc_token push configurations; "" sends no Authorization header.
	PushOIDCKeyFile string
	// MaxPendingPublishBytes bounds the Publish requests read and in
	// progress (their encoded bytes); further calls wait unread
	// (admission.go). Negative: no bound.
	MaxPendingPublishBytes int64
	// DisableREST serves gRPC only; by default the Pub/Sub REST API is
	// served on the same port (rest.go, sniff.go).
	DisableREST bool
}

func (c *Config) setDefaults() {
	if c.MaxMessageBytes <= 0 {
		c.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if c.DefaultAckDeadline <= 0 {
		c.DefaultAckDeadline = DefaultAckDeadline
	}
	if c.MaxInflightPerSubscription <= 0 {
		c.MaxInflightPerSubscription = DefaultMaxInflightPerSubscription
	}
	if c.RuntimeIdle <= 0 {
		c.RuntimeIdle = 2 * time.Minute
	}
	if c.StreamCloseAfter <= 0 {
		c.StreamCloseAfter = DefaultStreamCloseAfter
	}
	if c.MaxOutstandingMessages <= 0 {
		c.MaxOutstandingMessages = DefaultMaxOutstandingMessages
	}
	if c.PushMaxConcurrency <= 0 {
		c.PushMaxConcurrency = DefaultPushMaxConcurrency
	}
	if c.PushMaxPerSubscription <= 0 {
		c.PushMaxPerSubscription = DefaultPushMaxPerSubscription
	}
	if c.PushConnectTimeout <= 0 {
		c.PushConnectTimeout = DefaultPushConnectTimeout
	}
	if c.MaxPendingPublishBytes == 0 {
		c.MaxPendingPublishBytes = DefaultMaxPendingPublishBytes
	}
}

// Server is the Pub/Sub front-end. It satisfies the proxy's Frontend
// interface (Name, Serve, Shutdown).
type Server struct {
	cfg   Config
	log   *zap.Logger
	ready func() error
	topo  topology
	be    backend
	cat   *catalog
	grpc  *grpc.Server
	ids   *idGen
	// chains links the copies of each ordering key this process stores in an ordered
	// subscription (keychain.go).
	chains keyChains
	m      *metrics
	push   *pushManager // push subscriptions (push.go)

	pubLimits limits.Publish
	// pubBudget admits Publish calls (admission.go); nil: no bound.
	pubBudget *publishBudget
	// unary is the unary interceptor chain (publishStream runs it too).
	unary grpc.UnaryServerInterceptor
	// onDrop tells the delivery side that a subscription's backlog and
	// leases are gone (detach, delete).
	onDrop func(subID, uid string)

	deliveries    *delivery.Manager
	ownDeliveries *delivery.Manager                                            // built by New: closed at Shutdown
	peers         Peers                                                        // nil: one replica (forward.go)
	backlog       func(ctx context.Context) (*kubemqclient.QueuesIndex, error) // see core
	rtMu          sync.Mutex                                                   // guards runtimes, rtClosed, seeking, capturing
	noRecovery    sync.Map                                                     // uid -> time.Time: needs no ordering recovery hold here unless another process consumed it since (created by this process, or recovered by an earlier runtime, then; ordering.go)
	runtimes      map[string]*subRuntime
	rtClosed      bool
	seeking       map[string]chan struct{} // subscription id -> closed when its seek ends (seek.go)
	capturing     map[string]chan struct{} // subscription id -> closed when its snapshot capture ends (snapshot.go)
	pubs          inflight                 // publishes in progress (a seek waits for them)

	stopping chan struct{} // closed at Shutdown: streams end with UNAVAILABLE
	// draining: Shutdown has begun; nothing new goes out, settlements of what is out are still
	// taken (drain).
	draining atomic.Bool
	outageMu sync.Mutex     // guards outage
	outage   chan struct{}  // closed (and replaced) when KubeMQ is reported unreachable
	unwatch  func()         // removes the readiness hook
	streams  sync.WaitGroup // StreamingPull receive loops
	bg       sync.WaitGroup // runtime drops started by topology changes

	// adminMu serialises topology writes of this replica, so that a check
	// ("does it exist?") and the write that follows are atomic here.
	// Replicas still race; the registry's last writer wins.
	adminMu sync.Mutex

	stopWatch func()
	closeOnce sync.Once

	rest        http.Handler // the REST API (rest.go); nil: gRPC only
	restMu      sync.Mutex   // guards restClosed, splitters, restServers
	restClosed  bool
	splitters   []*splitter
	restServers []*http.Server
}

// core is what newServer needs; New (wiring.go) builds it from the
// proxy's dependencies, tests may build it from fakes.
type core struct {
	cfg           Config
	log           *zap.Logger
	ready         func() error
	topo          topology
	be            backend
	deliveries    *delivery.Manager
	ownDeliveries *delivery.Manager // built by New: closed at Shutdown
	peers         Peers
	// watch registers a readiness hook on the KubeMQ client (nil: none);
	// StreamingPull streams end with UNAVAILABLE when it reports down.
	watch   func(fn func(up bool)) (remove func())
	metrics prometheus.Registerer // nil: not exported
	// backlog reads every queue's waiting count (cached); nil: unknown (SubscriptionStats).
	backlog func(ctx context.Context) (*kubemqclient.QueuesIndex, error)
}

func newServer(c core) (*Server, error) {
	if c.topo == nil || c.be == nil || c.deliveries == nil {
		return nil, errors.New("gcp: no registry, backend or delivery manager")
	}
	c.cfg.setDefaults()
	if c.log == nil {
		c.log = zap.NewNop()
	}
	if c.ready == nil {
		c.ready = func() error { return nil }
	}
	s := &Server{cfg: c.cfg, log: c.log, ready: c.ready, topo: c.topo, be: c.be, ids: newIDGen(),
		deliveries: c.deliveries, peers: c.peers, runtimes: map[string]*subRuntime{}, seeking: map[string]chan struct{}{}, capturing: map[string]chan struct{}{}, stopping: make(chan struct{}),
		outage: make(chan struct{}), m: newMetrics(), backlog: c.backlog}
	if s.cfg.MaxPendingPublishBytes > 0 {
		s.pubBudget = newPublishBudget(s.cfg.MaxPendingPublishBytes)
	}
	var err error
	if s.push, err = newPushManager(s); err != nil {
		return nil, err
	}
	if c.metrics != nil {
		if err := s.m.register(c.metrics, s); err != nil {
			return nil, fmt.Errorf("gcp: register metrics: %w", err)
		}
		for _, col := range s.push.collectors() {
			if err := c.metrics.Register(col); err != nil {
				return nil, fmt.Errorf("gcp: register metrics: %w", err)
			}
		}
	}
	if c.watch != nil {
		s.unwatch = c.watch(func(up bool) {
			if !up {
				s.outageMu.Lock()
				close(s.outage)
				s.outage = make(chan struct{})
				s.outageMu.Unlock()
			}
		})
	}
	s.onDrop = s.dropRuntime
	s.pubLimits = limits.Publish{MaxMessageBytes: s.cfg.MaxMessageBytes, MaxRequestBytes: max(limits.DefaultMaxRequestBytes, s.cfg.MaxMessageBytes)}
	s.cat = newCatalog(s.log)
	s.cat.onSubGone = func(id, uid string) {
		// Deleted, detached or re-created, here or on another replica.
		// The registry's callback must not block: drop in the background.
		s.bg.Add(1)
		go func() {
			defer s.bg.Done()
			s.dropRuntime(id, uid)
		}()
	}
	s.stopWatch = s.cat.follow(s.topo)
	s.push.start()
	s.unary = chainUnary(recoverUnary(s.log), logUnary(s.log, s.m), gateUnary(s.ready, s.draining.Load), markREST)
	s.grpc = grpc.NewServer(
		grpc.MaxRecvMsgSize(s.cfg.MaxMessageBytes+grpcHeadroom),
		// grpc's default codec zeroes a pooled buffer of up to 1 MiB per message.
		grpc.ForceServerCodecV2(wirecodec.Codec()),
		experimental.BufferPool(wirecodec.Pool()),
		// A 1,000-message publish batch is ~1 MiB: with the default 64 KiB
		// window the client would wait for window updates within each one.
		grpc.InitialWindowSize(1<<20),
		grpc.InitialConnWindowSize(16<<20),
		grpc.UnaryInterceptor(s.unary),
		grpc.ChainStreamInterceptor(recoverStream(s.log), logStream(s.log, s.m), gateStream(s.ready)),
	)
	s.grpc.RegisterService(s.publisherDesc(), &publisher{s: s})
	pubsubpb.RegisterSubscriberServer(s.grpc, &subscriber{s: s})
	pubsubpb.RegisterSchemaServiceServer(s.grpc, &schemaService{s: s})
	iampb.RegisterIAMPolicyServer(s.grpc, iamPolicy{s: s})
	if !s.cfg.DisableREST {
		if s.rest, err = s.newREST(); err != nil {
			s.stopWatch()
			s.push.stop()
			return nil, err
		}
	}
	return s, nil
}

// RegisterPeer serves the Subscriber calls other replicas forward (forward.go) on the peer port.
func (s *Server) RegisterPeer(r grpc.ServiceRegistrar) {
	pubsubpb.RegisterSubscriberServer(r, &subscriber{s: s})
}

// outageChan is closed at the next report that KubeMQ is unreachable.
func (s *Server) outageChan() <-chan struct{} {
	s.outageMu.Lock()
	defer s.outageMu.Unlock()
	return s.outage
}

// Name is the front-end's name in logs and metrics.
func (s *Server) Name() string { return "gcp" }

// Serve answers Pub/Sub RPCs on lis until Shutdown.
func (s *Server) Serve(lis net.Listener) error {
	if s.rest != nil {
		return s.serveSplit(lis)
	}
	err := s.grpc.Serve(lis)
	if errors.Is(err, grpc.ErrServerStopped) {
		return nil
	}
	return err
}

// Shutdown stops accepting, ends StreamingPull streams with UNAVAILABLE,
// lets unary calls finish (when ctx ends first, it stops hard), and gives
// every lease back for redelivery.
func (s *Server) Shutdown(ctx context.Context) error {
	s.closeOnce.Do(func() {
		if s.unwatch != nil {
			s.unwatch()
		}
		s.drain(ctx)
		s.push.stop()
		close(s.stopping)
		s.stopAccepting()
		done := make(chan struct{})
		go func() {
			// REST calls run on grpc.Server.ServeHTTP, whose transports
			// GracefulStop closes at once: they finish first.
			s.stopREST(ctx)
			s.grpc.GracefulStop()
			close(done)
		}()
		select {
		case <-done:
		case <-ctx.Done():
			s.grpc.Stop()
			<-done
		}
		s.stopWatch()
		// closeRuntimes first: once it has run, nothing adds to bg (idle
		// retirement finds no runtime, RPCs and topology feed are over).
		s.closeRuntimes()
		s.bg.Wait()
		s.streams.Wait()
		if s.ownDeliveries != nil {
			s.ownDeliveries.Close(ctx)
		}
	})
	return nil
}

// maxDrain bounds the drain of a graceful shutdown.
const maxDrain = 5 * time.Second

// drain stops handing out messages and waits, while streams stay open, until the clients have
// settled what they hold, or maxDrain (at most half of what ctx leaves) passes. A client's acks
// travel a little behind its processing; closing its stream at once would lose the ones in
// flight, and the next replica to consume the subscription would deliver those messages again.
func (s *Server) drain(ctx context.Context) {
	s.draining.Store(true)
	s.rtMu.Lock()
	for _, r := range s.runtimes {
		r.mu.Lock()
		r.notifyLocked() // fetches waiting for work see the drain
		r.mu.Unlock()
	}
	s.rtMu.Unlock()
	d := maxDrain
	if dl, ok := ctx.Deadline(); ok {
		d = min(d, time.Until(dl)/2)
	}
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if s.leasesOut() == 0 {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.log.Info("shutdown: messages still out to clients after the drain go back to the subscriptions", zap.Int("leases", s.leasesOut()))
}

// leasesOut counts the messages out to clients on this replica.
func (s *Server) leasesOut() int {
	s.rtMu.Lock()
	rts := make([]*subRuntime, 0, len(s.runtimes))
	for _, r := range s.runtimes {
		rts = append(rts, r)
	}
	s.rtMu.Unlock()
	n := 0
	for _, r := range rts {
		r.mu.Lock()
		n += len(r.leases)
		r.mu.Unlock()
	}
	return n
}
