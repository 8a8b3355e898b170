package amqp091

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kubemq-io/kubemq-proxy/amqp091/peerpb"
	"github.com/kubemq-io/kubemq-proxy/amqp091/wire"
	"github.com/kubemq-io/kubemq-proxy/delivery"
	"github.com/kubemq-io/kubemq-proxy/kubemqclient"
	"github.com/kubemq-io/kubemq-proxy/registry"
)

// Options configure New. Client is required; everything else has a
// default.
type Options struct {
	Client *kubemqclient.Client
	// Registry keeps durable exchanges, queues and bindings, shared by
	// replicas. nil keeps them in memory only (tests).
	Registry *registry.Registry
	// Deliveries is the lease engine. nil builds one from Client (closed by
	// Shutdown).
	Deliveries *delivery.Manager
	Logger     *zap.Logger
	Metrics    prometheus.Registerer
	// Ready reports nil while KubeMQ is reachable (and the registry
	// replayed). While it fails, new connections are refused and open ones
	// closed with 320 CONNECTION_FORCED. nil: always ready.
	Ready func() error

	// Heartbeat proposed in connection.tune; default 60s, negative disables.
	Heartbeat time.Duration
	// FrameMax proposed in connection.tune; default 131072 (RabbitMQ's).
	FrameMax int
	// ChannelMax proposed in connection.tune; default 2047.
	ChannelMax int
	// Users maps user names to passwords, plain or "sha256:<hex>". Empty
	// accepts any credentials, from loopback peers only unless
	// OpenLoginsFromAnywhere (RabbitMQ's rule for its default guest user).
	Users map[string]string
	// OpenLoginsFromAnywhere accepts any credentials from any address when
	// Users is empty; off, such logins are refused (403) unless the peer is
	// on a loopback address.
	OpenLoginsFromAnywhere bool
	// External offers SASL EXTERNAL to TLS peers whose client certificate
	// the listener verified: the certificate's CN is the user, which must
	// be in Users when Users is set (RabbitMQ's rabbitmq_auth_mechanism_ssl
	// with ssl_cert_login_from = common_name).
	External bool
	// PasswordAsToken passes a PLAIN/AMQPLAIN password through as the
	// KubeMQ auth token of the KubeMQ calls made for that connection
	// (publishes, queue counts, purges). Deliveries come from one shared
	// consumer per queue, which uses the proxy's own token.
	PasswordAsToken bool
	// Vhosts lists the virtual hosts clients may open; empty allows any.
	// "/" and "default" name the same one.
	Vhosts []string
	// MaxBodySize is the largest message body accepted; default 64 MiB
	// (KubeMQ caps a whole gRPC message at 100 MiB).
	MaxBodySize int
	// MaxConnections caps open connections; 0 = no cap.
	MaxConnections int
	// HandshakeTimeout bounds protocol header through connection.open;
	// default 10s (RabbitMQ's).
	HandshakeTimeout time.Duration
	// PublishBatch is the most messages one KubeMQ batch carries; default 500.
	PublishBatch int
	// Product, Version and ClusterName go into the server properties.
	// Product defaults to "RabbitMQ" and Version to "3.10.8": some clients
	// (kombu, Spring AMQP) choose RabbitMQ's QoS meaning and features from
	// them, and the proxy implements RabbitMQ's semantics.
	Product, Version, ClusterName string
	// ReadyCheck is how often Ready is polled; default 1s.
	ReadyCheck time.Duration
	// MaxPendingPublishBytes bounds the message body bytes one connection
	// has read and KubeMQ has not yet stored (or refused). Above it the
	// connection stops reading its socket (TCP back-pressure), telling
	// clients that announced the capability with connection.blocked, until
	// the pending bytes are down to half of it. Default 64 MiB; negative
	// disables the bound.
	MaxPendingPublishBytes int64
	// MetricsQueueLabels is how many distinct queues get their own labels
	// in the per-queue message and byte counters; later queues share the
	// label "_other". Default 100; negative: every queue is "_other".
	MetricsQueueLabels int

	// Peers reaches the replica that holds a queue when several replicas
	// share one KubeMQ: consumers, basic.get, message counts and purges of
	// a queue another replica holds are forwarded to it (forward.go). nil:
	// a channel waits for such a queue's hold to lapse (ownerWait), then
	// closes the connection with 320.
	Peers Peers
	// Fleet names the replicas sharing this KubeMQ: with it (and a
	// Registry), non-durable exchanges and queues and their bindings are
	// seen by every replica (transient.go). nil: they stay in this process.
	Fleet Fleet

	// backend replaces Client for publishing and queue counts (tests: a
	// slow or failing KubeMQ).
	backend backend
}

func (o *Options) setDefaults() error {
	if o.Client == nil {
		return errors.New("amqp091: Options.Client is required")
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	if o.Heartbeat == 0 {
		o.Heartbeat = 60 * time.Second
	}
	if o.Heartbeat < 0 {
		o.Heartbeat = 0
	}
	if o.Heartbeat > 65535*time.Second {
		return fmt.Errorf("amqp091: heartbeat %v above 65535s", o.Heartbeat)
	}
	if o.FrameMax == 0 {
		o.FrameMax = 131072
	}
	if o.FrameMax < 4096 {
		return fmt.Errorf("amqp091: frame_max %d below 4096", o.FrameMax)
	}
	if o.ChannelMax == 0 {
		o.ChannelMax = 2047
	}
	if o.ChannelMax < 1 || o.ChannelMax > 65535 {
		return fmt.Errorf("amqp091: channel_max %d outside 1..65535", o.ChannelMax)
	}
	if o.MaxBodySize == 0 {
		o.MaxBodySize = 64 << 20
	}
	if o.HandshakeTimeout <= 0 {
		o.HandshakeTimeout = 10 * time.Second
	}
	if o.PublishBatch <= 0 {
		o.PublishBatch = 500
	}
	if o.Product == "" {
		o.Product = "RabbitMQ"
	}
	if o.Version == "" {
		o.Version = "3.10.8"
	}
	if o.ClusterName == "" {
		o.ClusterName = "kubemq-proxy"
	}
	if o.ReadyCheck <= 0 {
		o.ReadyCheck = time.Second
	}
	if o.MaxPendingPublishBytes == 0 {
		o.MaxPendingPublishBytes = 64 << 20
	}
	if o.MaxPendingPublishBytes < 0 {
		o.MaxPendingPublishBytes = 0
	}
	if o.MetricsQueueLabels == 0 {
		o.MetricsQueueLabels = 100
	}
	if o.MetricsQueueLabels < 0 {
		o.MetricsQueueLabels = 0
	}
	return users(o.Users).validate()
}

// backend is what the front-end asks of KubeMQ directly (the lease engine
// and the registry have their own). *kubemqclient.Client implements it.
type backend interface {
	SendQueueMessages(ctx context.Context, msgs []kubemqclient.QueueMessage) ([]kubemqclient.SendResult, error)
	QueuesInfo(ctx context.Context, names ...string) (kubemqclient.QueuesInfo, error)
	AckAllQueueMessages(ctx context.Context, channel string, wait time.Duration) (uint64, error)
}

// Server is the AMQP 0-9-1 front-end. It implements the proxy's Frontend
// (Name, Serve, Shutdown); Serve accepts plain or TLS listeners alike.
type Server struct {
	delays        delayHolders // holders of delayed exchanges' delay queues (delayed.go)
	opts          Options
	log           *zap.Logger
	b             backend
	deliveries    *delivery.Manager
	ownDeliveries bool
	users         users
	vhosts        map[string]bool
	top           *topology
	pub           *publisher
	m             *metrics
	unwatch       func()
	peers         Peers           // nil: no forwarding (one replica, or no cluster secret)
	ctx           context.Context // ends at Shutdown
	cancel        context.CancelFunc
	nextID        atomic.Uint64
	replies       replies     // direct reply-to consumers (replyto.go)
	stopping      atomic.Bool // Shutdown began: queue lifetimes are no longer judged here (judges)

	replyMu    sync.Mutex            // guards replyLanes
	replyLanes map[string]*replyLane // by peer address (replyto.go)

	mu        sync.Mutex // guards listeners, conns, closed, downSince, links, standIns
	listeners map[net.Listener]struct{}

	// Totals since start for the management API's overview: client publishes, deliveries,
	// basic.ack'ed deliveries; rates keeps its rate samples (management.go).
	nPublishes, nDelivered, nAcked atomic.Uint64
	rates                          rateSampler
	conns                          map[*conn]struct{}
	links                          map[*peerLink]struct{} // other replicas' links served here (peer.go)
	standIns                       map[string]*standIn    // by KubeMQ channel (peer.go)
	closed                         bool
	wg                             sync.WaitGroup // connections, the readiness watcher, background queue drops, reply lanes
	downErr                        error
}

// New builds a Server; it does not listen until Serve.
func New(opts Options) (*Server, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	s := &Server{
		opts: opts, log: opts.Logger.Named("amqp091"), b: opts.Client, deliveries: opts.Deliveries,
		users: users(opts.Users), listeners: map[net.Listener]struct{}{}, conns: map[*conn]struct{}{},
		links: map[*peerLink]struct{}{}, standIns: map[string]*standIn{}, peers: opts.Peers,
		m: newMetrics(opts.Metrics, opts.MetricsQueueLabels),
	}
	if len(opts.Vhosts) > 0 {
		s.vhosts = map[string]bool{}
		for _, v := range opts.Vhosts {
			s.vhosts[vhostKey(v)] = true
		}
	}
	if opts.backend != nil {
		s.b = opts.backend
	}
	if s.deliveries == nil {
		m, err := delivery.NewManager(delivery.NewKubeMQBackend(opts.Client), delivery.Options{Logger: opts.Logger}, opts.Metrics)
		if err != nil {
			return nil, err
		}
		s.deliveries, s.ownDeliveries = m, true
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	// Before the topology: restored queues' reapers may dead-letter at once.
	s.pub = newPublisher(s.b, opts.PublishBatch, func() { s.m.storeFailures.Inc() })
	s.top = newTopology(s, opts.Registry, s.log)
	s.unwatch = s.top.watch()
	s.top.load()
	if opts.Metrics != nil {
		_ = opts.Metrics.Register(queueCollector{s}) // a second Server on one registry (tests) goes without
	}
	if s.top.sharesTransient() {
		if fu, ok := opts.Fleet.(fleetUses); ok {
			fu.ReportUses(s.localUses)
		}
		s.wg.Add(1)
		go s.sweepLoop()
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.watchReady()
	}()
	return s, nil
}

// Name is the front-end's name.
func (s *Server) Name() string { return "amqp091" }

// Serve accepts connections on lis until Shutdown. It returns nil after
// Shutdown and the listener's error otherwise.
func (s *Server) Serve(lis net.Listener) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		lis.Close()
		return nil
	}
	s.listeners[lis] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, lis)
		s.mu.Unlock()
	}()
	var backoff time.Duration
	for {
		nc, err := lis.Accept()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				time.Sleep(backoff)
				continue
			}
			return err
		}
		backoff = 0
		s.accept(nc)
	}
}

func (s *Server) accept(nc net.Conn) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		nc.Close()
		return
	}
	if s.opts.MaxConnections > 0 && len(s.conns) >= s.opts.MaxConnections {
		s.mu.Unlock()
		s.log.Warn("connection refused: connection limit reached", zap.Int("limit", s.opts.MaxConnections))
		nc.Close()
		return
	}
	c := newConn(s, nc, s.nextID.Add(1))
	s.conns[c] = struct{}{}
	s.wg.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.wg.Done()
		c.serve()
	}()
}

func (s *Server) forget(c *conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
}

// Shutdown stops accepting, closes every connection with 320
// CONNECTION_FORCED (their deliveries go back to the queues), stores what
// was published and stops. It waits for all of it or ctx.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.stopping.Store(true)
	for lis := range s.listeners {
		lis.Close()
	}
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	drops := s.autoDeletesOnStop()
	for _, c := range conns {
		c.shutdown(errShutdown())
	}
	for _, q := range drops {
		s.dropQueue(q, "auto-delete queue lost its last consumer (its replica stopped)", s.log)
	}
	// Other replicas' consumers: nothing new goes out, settlements of what
	// is out are still taken for a while (drainWait).
	s.drainLinks(ctx)
	s.cancel() // the readiness watcher, the links, and any work still bound to a connection
	done := make(chan struct{})
	go func() {
		s.wg.Wait()
		close(done)
	}()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		err = ctx.Err()
	}
	s.unwatch()
	s.pub.close()
	if s.ownDeliveries {
		if cerr := s.deliveries.Close(ctx); err == nil {
			err = cerr
		}
	}
	return err
}

// shutdown closes a connection from outside: with connection.close when it
// is open, by hanging up when it is still in its handshake.
func (c *conn) shutdown(e *wire.Error) {
	if !c.opened.Load() {
		c.setReason("%s", e.Text)
		c.nc.Close()
		return
	}
	c.fail(e)
}

func (s *Server) ready() error {
	if s.opts.Ready == nil {
		return nil
	}
	return s.opts.Ready()
}

func (s *Server) vhostAllowed(name string) bool {
	return s.vhosts == nil || s.vhosts[vhostKey(name)]
}

// watchReady closes every connection with 320 when KubeMQ becomes
// unreachable, as RabbitMQ does when it loses its store: clients reconnect
// (and are refused until it is back); nothing they were told is stored is
// lost, and unacknowledged deliveries come back through their lease records.
// The close waits for the second check that finds the outage: publishes in
// flight fail when the client declares the outage, and their basic.nack must
// reach confirming publishers first (a close would leave them unconfirmed,
// their fate unknown); publishes in between are refused at once, nacked too.
// A publisher without confirms learns of the outage from the close only;
// what it sent since the outage began is dropped, as RabbitMQ gives such a
// publisher no guarantee either.
func (s *Server) watchReady() {
	if s.opts.Ready == nil {
		return
	}
	t := time.NewTicker(s.opts.ReadyCheck)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		err := s.opts.Ready()
		if err == nil {
			s.mu.Lock()
			if s.downErr != nil {
				s.log.Info("KubeMQ reachable again: accepting connections")
			}
			s.downErr = nil
			s.mu.Unlock()
			continue
		}
		s.mu.Lock()
		first := s.downErr == nil
		s.downErr = err
		conns := make([]*conn, 0, len(s.conns))
		for c := range s.conns {
			conns = append(conns, c)
		}
		s.mu.Unlock()
		if first {
			s.log.Warn("KubeMQ unreachable: closing AMQP connections", zap.Int("connections", len(conns)), zap.Error(err))
			continue
		}
		for _, c := range conns {
			if c.opened.Load() && c.refuse == nil { // refused ones close on their own
				c.fail(errBackendDown(err.Error()))
			}
		}
	}
}

// waiting returns how many messages wait in KubeMQ channel ch (KubeMQ's count).
func (s *Server) waiting(ctx context.Context, ch string) (n uint32, known bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	info, err := s.b.QueuesInfo(ctx, ch)
	if err != nil {
		return 0, false, err
	}
	qi, l := info.Lookup(ch)
	switch {
	case l == kubemqclient.Ambiguous:
		return 0, false, nil // the server lists another queue under the same name
	case l == kubemqclient.NotListed || qi.Waiting <= 0:
		return 0, true, nil
	}
	return uint32(min(qi.Waiting, 1<<32-1)), true, nil
}

// readyCount returns how many messages of q a consumer could get now: KubeMQ's
// count and the lease engine's buffer, without lease records (see
// delivery.Manager.Ready). known is false when KubeMQ cannot count q. The
// replica that holds q counts it (its buffer is part of the count).
func (s *Server) readyCount(ctx context.Context, q *queue) (n uint32, known bool, err error) {
	n, known, _, err = s.counts(ctx, q, false)
	return n, known, err
}

// counts is readyCount with q's consumer count: this replica's, or, when
// another replica holds q, the holder's (which includes the consumers this
// one forwarded to it). use: they answer a queue.declare, which the holder
// counts as a use of q (x-expires).
func (s *Server) counts(ctx context.Context, q *queue, use bool) (n uint32, known bool, consumers int, err error) {
	q.vh.mu.Lock()
	consumers = len(q.consumers)
	q.vh.mu.Unlock()
	if r, ok := s.queueRemote(ctx, q, peerpb.QueueRequest_COUNT, use); ok {
		return r.Count, r.Known, max(consumers, int(r.Consumers)), nil
	}
	n, known, err = s.readyWithLinks(ctx, q)
	return n, known, consumers, err
}

// readyWithLinks is queueReady plus what other replicas hold in their
// links' read-ahead (no client has those: ready, as this replica's own
// read-ahead is).
func (s *Server) readyWithLinks(ctx context.Context, q *queue) (uint32, bool, error) {
	n, known, err := s.queueReady(ctx, q)
	if err == nil && known {
		n += min(s.linksBuffered(q.channel), 1<<32-1-n)
	}
	return n, known, err
}

// localReadyCount is readyCount for KubeMQ channel ch by this replica.
func (s *Server) localReadyCount(ctx context.Context, ch string) (n uint32, known bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	r, err := s.deliveries.Ready(ctx, ch)
	if err != nil || r < 0 {
		return 0, false, err
	}
	return uint32(min(r, 1<<32-1)), true, nil
}

// purge removes the ready messages of q: those the lease engine holds
// for it and those in KubeMQ (deliveries out stay, as in RabbitMQ). It
// returns how many were ready. The replica that holds q purges it (its
// buffer is part of what is ready).
func (s *Server) purge(ctx context.Context, q *queue) (uint32, error) {
	if r, ok := s.queueRemote(ctx, q, peerpb.QueueRequest_PURGE, false); ok {
		return r.Count, nil
	}
	return s.queuePurge(ctx, q)
}

// localPurge is purge of KubeMQ channel ch by this replica. KubeMQ's purge
// waits at least a second, so a KubeMQ queue known to be empty is not
// purged at all.
func (s *Server) localPurge(ctx context.Context, ch string) (uint32, error) {
	n, known, err := s.localReadyCount(ctx, ch)
	if err != nil {
		return 0, err
	}
	dropped := 0
	if c := s.deliveries.Lookup(ch); c != nil {
		dropped = c.Purge()
	}
	w, wknown, err := s.waiting(ctx, ch)
	if err != nil || (wknown && w == 0) {
		return n, err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	got, err := s.b.AckAllQueueMessages(ctx, ch, time.Second)
	if err != nil {
		return 0, err
	}
	if !known {
		n = uint32(min(got+uint64(dropped), 1<<32-1))
	}
	return n, nil
}

// deleteQueue removes q from the topology (registry included), cancels
// its consumers and purges its messages. It returns how many it purged.
func (s *Server) deleteQueue(ctx context.Context, q *queue, why string) (uint32, error) {
	if err := s.unlinkQueue(ctx, q, why); err != nil {
		if errors.Is(err, errQueueGone) {
			return 0, nil // deleted meanwhile: nothing left to purge
		}
		return 0, err
	}
	return s.purge(ctx, q)
}

// errQueueGone: the queue to delete was deleted meanwhile (its name may
// already be another queue's).
var errQueueGone = errors.New("amqp091: queue deleted meanwhile")

// unlinkQueue is deleteQueue without the purge. A queue that was used
// moves its name to the next incarnation first (queueChannel). A queue
// deleted meanwhile is left alone (errQueueGone): its registry record
// may already be a new declaration's.
func (s *Server) unlinkQueue(ctx context.Context, q *queue, why string) error {
	vh := q.vh
	vh.declMu.Lock()
	if vh.lookupQueue(q.name) != q {
		vh.declMu.Unlock()
		return errQueueGone
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	if err := s.nextIncarnation(wctx, q); err != nil {
		cancel()
		vh.declMu.Unlock()
		return err
	}
	if err := vh.deleteQueueRecord(wctx, q); err != nil {
		cancel()
		vh.declMu.Unlock()
		return err
	}
	r := vh.removeQueue(q, why)
	err := vh.persistRemoval(wctx, r, q)
	cancel()
	vh.declMu.Unlock()
	if q.owner != nil {
		q.owner.disown(q)
	}
	return err
}

// nextIncarnation gives q's name a new incarnation for its next
// declaration if q may leave anything behind in its KubeMQ queue: it was
// used here, KubeMQ lists its queue (a message was stored in it, here or
// elsewhere), or the lease engine has a consumer of it. Server-named
// queues are never declared again and keep theirs. Called under declMu.
func (s *Server) nextIncarnation(ctx context.Context, q *queue) error {
	if reserved(q.name) {
		return nil
	}
	used := q.used.Load() || s.deliveries.Lookup(q.channel) != nil
	if !used {
		info, err := s.b.QueuesInfo(ctx, q.channel)
		if err != nil {
			return err
		}
		_, l := info.Lookup(q.channel)
		used = l != kubemqclient.NotListed
	}
	if !used {
		return nil
	}
	next := q.incarnation + 1
	if err := q.vh.putIncarnationRecord(ctx, q.name, next); err != nil {
		return err
	}
	q.vh.mu.Lock()
	q.vh.noteIncarnationLocked(q.name, next)
	q.vh.mu.Unlock()
	return nil
}

// dropQueue deletes q on the proxy's behalf (exclusive owner gone,
// auto-delete): it leaves the topology at once, so the name is free again,
// and its messages are purged on a tracked goroutine, so nobody waits for
// KubeMQ's purge. Failures are logged on log (the connection or channel
// the deletion is for).
func (s *Server) dropQueue(q *queue, why string, log *zap.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	err := s.unlinkQueue(ctx, q, why)
	cancel()
	if errors.Is(err, errQueueGone) {
		return
	}
	if err != nil {
		log.Warn("deleting queue failed", zap.String("queue", q.name), zap.String("reason", why), zap.Error(err))
		return
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := s.purge(ctx, q); err != nil {
			log.Warn("purging deleted queue failed", zap.String("queue", q.name), zap.Error(err))
		}
	}()
}

// catchUpWait bounds a wait for the registry log (catchUp).
const catchUpWait = 5 * time.Second

// catchUp reports, after a lookup found no queue or exchange, whether
// looking again may find one: in a fleet, a declare through another
// replica a moment ago reaches this one through the registry log, so this
// replica first applies every write the log holds now (registry.CatchUp;
// it costs one KubeMQ subscription round trip, and only a miss pays it).
// Not while holding a vhost's declMu: the log's changes take it.
func (s *Server) catchUp(ctx context.Context) bool {
	if s.peers == nil || s.top.reg == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, catchUpWait)
	defer cancel()
	if err := s.top.reg.CatchUp(ctx); err != nil {
		s.log.Debug("catching up with the registry failed", zap.Error(err))
		return false
	}
	return true
}

// judges reports whether this replica decides q's lifetime now (auto-delete,
// x-expires). Without replicas, it judges the queues it declared (not
// another replica's non-durable ones, remote). With replicas, the replica
// that holds q does, whoever declared it: every consumer of the fleet is
// one of its consumers (other replicas forward theirs), and the others
// tell it of their uses (redeclare, basic.get). A replica that stops no
// longer judges: its consumers and links end because of the stop (Shutdown
// judges its auto-delete queues once as it begins, autoDeletesOnStop).
func (s *Server) judges(q *queue) bool {
	if s.peers == nil {
		return !q.remote
	}
	return !s.stopping.Load() && s.deliveries.Lookup(q.channel) != nil
}

// autoDeletesOnStop returns, when this replica of a fleet begins to stop,
// the auto-delete queues it holds whose consumers are all its own clients':
// they all end with the stop, so the queue goes, as a RabbitMQ queue does
// when its node's connections close. A queue that also serves other
// replicas' consumers stays: they move to the next holder. (Once stopping,
// the consumers' ends no longer judge the queue, judges.)
func (s *Server) autoDeletesOnStop() []*queue {
	if s.peers == nil {
		return nil // judges still holds while stopping
	}
	var own []*queue
	for _, v := range s.top.snapshot() {
		v.mu.Lock()
		for _, q := range v.queues {
			if !q.autoDelete || !q.hadConsumer || q.deleted || len(q.consumers) == 0 {
				continue
			}
			local := true
			for cs := range q.consumers {
				local = local && cs.peer == nil
			}
			if local {
				own = append(own, q)
			}
		}
		v.mu.Unlock()
	}
	// Held here (outside v.mu: the lease engine's lock is not taken under it).
	return slices.DeleteFunc(own, func(q *queue) bool { return s.deliveries.Lookup(q.channel) == nil })
}

// dropQueueAsync runs dropQueue on a tracked goroutine, for callers that
// must not wait for the registry either.
func (s *Server) dropQueueAsync(q *queue, why string, log *zap.Logger) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.dropQueue(q, why, log)
	}()
}
