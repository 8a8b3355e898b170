package embedded

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/status"

	"github.com/kubemq-io/kubemq-proxy/kubemqclient/fastpb"
	"github.com/kubemq-io/kubemq-proxy/kubemqclient/wirecodec"
	"github.com/kubemq-io/kubemq-proxy/kubemqpb"
)

// Version is reported by Ping.
const Version = "v2.4.0-embedded"

// maxGRPCMessage is the real server's default GRPC_BODY_LIMIT, both ways.
const maxGRPCMessage = 100 << 20

// Options configure a Server. The zero value is an in-memory server with the real server's
// defaults.
type Options struct {
	DataDir string // "" = in memory
	Strict  bool   // refuse hazardous usage patterns (docs/kubemq.md 8, 9)
	// ScanDelays releases delayed messages as the real server's delay processor does
	// (docs/kubemq.md 9.1): every 500 ms, those due among the 1024 earliest sent, rather than
	// each exactly when due. For running tests against the real server's timing.
	ScanDelays bool
	Logger     *zap.Logger // nil = nop
	Host       string      // PingResult.Host; default os hostname with dots as underscores

	// Store limits, with the real server's meaning (its store.* settings; environment
	// variables STORE_MAX_...). Zero means the real server's default.

	// MaxRetention is how long a message or event is kept (STORE_MAX_RETENTION, in minutes
	// there). Default 24h; negative = forever (the real server's 0).
	MaxRetention time.Duration
	// MaxPurgeInactive deletes a queue or events-store channel, with its messages and durable
	// cursors, once it has had no new message and no connected consumer for this long
	// (STORE_MAX_PURGE_INACTIVE, minutes there). Default 24h; negative = never (the real 0).
	MaxPurgeInactive time.Duration
	// MaxChannels caps the channels of the store: queues plus events-store channels, plus the
	// one internal channel the real server keeps for delayed messages (STORE_MAX_QUEUES). A
	// send, receive or subscription that would create one more gets "too many channels".
	// 0 = unlimited.
	MaxChannels int
	// MaxSubscribers caps the durable subscriptions of one events-store channel, offline ones
	// included (STORE_MAX_SUBSCRIBERS): one more gets gRPC Internal "too many subscriptions per
	// channel". 0 = unlimited.
	MaxSubscribers int
	// MaxChannelMessages and MaxChannelBytes cap one queue's or events-store channel's stored
	// messages (STORE_MAX_MESSAGES, STORE_MAX_QUEUE_SIZE). As on the real server a send is
	// never refused for them: the oldest messages are dropped to make room. 0 = unlimited.
	MaxChannelMessages int
	MaxChannelBytes    int64

	// Queue limits, with the real server's meaning (its queue.* settings; environment
	// variables QUEUE_...). Zero means the real server's default; beyond a limit a request gets
	// the real server's error number.

	// MaxReceiveMessages bounds MaxNumberOfMessages of a receive (QUEUE_MAX_NUMBER_OF_MESSAGES,
	// default 1024, Error 122).
	MaxReceiveMessages int
	// MaxWaitSeconds bounds a receive's WaitTimeSeconds (QUEUE_MAX_WAIT_TIMEOUT_SECONDS,
	// default 3600, Error 136).
	MaxWaitSeconds int
	// DefaultWaitSeconds replaces a WaitTimeSeconds of 0 (QUEUE_DEFAULT_WAIT_TIMEOUT_SECONDS,
	// default 1).
	DefaultWaitSeconds int
	// MaxExpirationSeconds and MaxDelaySeconds bound a message's policy
	// (QUEUE_MAX_EXPIRATION_SECONDS, QUEUE_MAX_DELAY_SECONDS, default 43200, Errors 133, 135).
	MaxExpirationSeconds int
	MaxDelaySeconds      int
	// MaxReceiveCount bounds a message's MaxReceiveCount and replaces a 0 there
	// (QUEUE_MAX_RECEIVE_COUNT, default 1024, Error 134).
	MaxReceiveCount int
	// MaxVisibilitySeconds bounds StreamQueueMessage visibility (QUEUE_MAX_VISIBILITY_SECONDS,
	// default 43200, Error 127); DefaultVisibilitySeconds replaces a 0 there
	// (QUEUE_DEFAULT_VISIBILITY_SECONDS, default 60).
	MaxVisibilitySeconds     int
	DefaultVisibilitySeconds int
	// BodyLimit is the largest gRPC message either way (GRPC_BODY_LIMIT, default 100 MiB, at
	// most 100 MiB here): a bigger request fails with gRPC ResourceExhausted before any handler.
	BodyLimit int

	// MaxMemory bounds the bytes of the messages the server holds in memory (queue messages,
	// delayed messages, events; bodies, metadata, tags and ids). A send that would go beyond it
	// is refused with an error that starts with "Error 130: memory limit reached" (a queue
	// result's IsError, or an events-store Result's Sent=false), so a client sees a clear,
	// retryable refusal instead of the process being killed. 0 = unlimited. With a DataDir only
	// what is held whole counts (events kept for live subscriptions): stored queue messages,
	// events and delayed messages are held as an index only.
	MaxMemory int64

	// MaxMessageBytes bounds one message (body + metadata + tags). Default 100 MiB - 64 KiB, so
	// that a message always fits in one gRPC frame with its envelope.
	MaxMessageBytes int
	// FsyncInterval is how often the log is fsynced in the background. Every acknowledged write
	// has already reached the OS (survives a process kill); the interval bounds what an OS crash
	// or power loss can take. Default 1s; negative = never (the OS decides).
	FsyncInterval time.Duration
	// FsyncEveryWrite makes every group commit fsync before acknowledging: power-loss safe, slower.
	FsyncEveryWrite bool
	// SegmentBytes is the size at which the log rolls to a new segment. Default 64 MiB.
	SegmentBytes int64
	// SubscriptionBuffer is the per-subscription send buffer (GRPC_SUB_BUFF_SIZE). Default 100.
	SubscriptionBuffer int
	// Now is the clock; nil = time.Now. Tests may inject one.
	Now func() time.Time
	// TLS, when set, makes the server speak gRPC over TLS (like a real KubeMQ with TLS enabled).
	TLS *tls.Config
	// ServerOptions are appended to the server's own (tests add interceptors).
	ServerOptions []grpc.ServerOption
}

func (o *Options) setDefaults() error {
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	if o.Host == "" {
		h, err := os.Hostname()
		if err != nil || h == "" {
			h = "localhost"
		}
		o.Host = strings.ReplaceAll(h, ".", "_")
	}
	if o.MaxRetention == 0 {
		o.MaxRetention = 24 * time.Hour
	}
	if o.MaxPurgeInactive == 0 {
		o.MaxPurgeInactive = 24 * time.Hour
	}
	if o.BodyLimit == 0 {
		o.BodyLimit = maxGRPCMessage
	}
	if o.BodyLimit < 1024 || o.BodyLimit > maxGRPCMessage {
		return fmt.Errorf("embedded: BodyLimit %d out of range 1024..%d", o.BodyLimit, maxGRPCMessage)
	}
	if o.MaxMessageBytes == 0 {
		o.MaxMessageBytes = o.BodyLimit - min(64<<10, o.BodyLimit/4)
	}
	if o.MaxMessageBytes < 0 || o.MaxMessageBytes > o.BodyLimit {
		return fmt.Errorf("embedded: MaxMessageBytes %d out of range 1..%d (BodyLimit)", o.MaxMessageBytes, o.BodyLimit)
	}
	for _, l := range []struct {
		name     string
		v        *int
		def, max int
	}{
		{"MaxReceiveMessages", &o.MaxReceiveMessages, maxReceiveMessages, 1 << 20},
		{"MaxWaitSeconds", &o.MaxWaitSeconds, maxWaitSeconds, 1 << 30},
		{"DefaultWaitSeconds", &o.DefaultWaitSeconds, 1, 1 << 30},
		{"MaxExpirationSeconds", &o.MaxExpirationSeconds, maxExpirationSeconds, 1 << 30},
		{"MaxDelaySeconds", &o.MaxDelaySeconds, maxDelaySeconds, 1 << 30},
		{"MaxReceiveCount", &o.MaxReceiveCount, defaultMaxReceiveCount, 1 << 30},
		{"MaxVisibilitySeconds", &o.MaxVisibilitySeconds, maxVisibilitySeconds, 1 << 30},
		{"DefaultVisibilitySeconds", &o.DefaultVisibilitySeconds, defaultVisibility, 1 << 30},
	} {
		if *l.v == 0 {
			*l.v = l.def
		}
		if *l.v < 0 || *l.v > l.max {
			return fmt.Errorf("embedded: %s %d out of range 1..%d", l.name, *l.v, l.max)
		}
	}
	if o.DefaultWaitSeconds > o.MaxWaitSeconds {
		return fmt.Errorf("embedded: DefaultWaitSeconds %d exceeds MaxWaitSeconds %d", o.DefaultWaitSeconds, o.MaxWaitSeconds)
	}
	if o.DefaultVisibilitySeconds > o.MaxVisibilitySeconds {
		return fmt.Errorf("embedded: DefaultVisibilitySeconds %d exceeds MaxVisibilitySeconds %d", o.DefaultVisibilitySeconds, o.MaxVisibilitySeconds)
	}
	for _, l := range []struct {
		name string
		v    int64
	}{
		{"MaxChannels", int64(o.MaxChannels)}, {"MaxSubscribers", int64(o.MaxSubscribers)},
		{"MaxChannelMessages", int64(o.MaxChannelMessages)}, {"MaxChannelBytes", o.MaxChannelBytes},
		{"MaxMemory", o.MaxMemory},
	} {
		if l.v < 0 {
			return fmt.Errorf("embedded: %s %d must not be negative (0 = unlimited)", l.name, l.v)
		}
	}
	if o.MaxChannels == 1 {
		return errors.New("embedded: MaxChannels 1 leaves no channel for clients (the real server counts its internal delay channel); use 0 for unlimited or at least 2")
	}
	if o.FsyncInterval == 0 {
		o.FsyncInterval = time.Second
	}
	if o.SegmentBytes == 0 {
		o.SegmentBytes = 64 << 20
	}
	if o.SegmentBytes < 1<<20 {
		return errors.New("embedded: SegmentBytes must be at least 1 MiB")
	}
	if o.SubscriptionBuffer <= 0 {
		o.SubscriptionBuffer = 100
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return nil
}

// Server is an in-process KubeMQ-compatible gRPC server. Create it with New, then Serve on a
// listener; Stop ends it.
type Server struct {
	kubemqpb.UnimplementedKubemqServer

	opts  Options
	log   *zap.Logger
	grpc  *grpc.Server
	start time.Time
	store *logStore // nil in memory

	calls channelCalls // handlers running for Channel callers

	// The interceptors of every call, over the network or through Channel.
	unaryInt  grpc.UnaryServerInterceptor
	streamInt grpc.StreamServerInterceptor

	// ctx is cancelled by Stop: every stream handler and background goroutine watches it.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // tracked goroutines (see go)

	// mu guards the name maps below; each queue and channel has its own lock for its contents.
	mu       sync.RWMutex
	queues   map[string]*queue
	listed   map[string][]*queue // queues by the name QueuesInfo lists them under (listedName)
	channels map[string]*eventChannel
	durables map[string]*durable // events-store durable cursors by key
	storeIDs map[string]bool     // ClientIDs holding an events-store subscription
	openTx   map[string]*dsTx    // open downstream transactions of every stream, by id
	plain    *plainBus
	requests *requestBus

	delays *delayer
	strict strictCounters

	mem       atomic.Int64 // bytes of messages held (MaxMemory)
	lastPurge time.Time    // owned by housekeeping

	nextStreamID uint64 // guarded by mu

	stopOnce  sync.Once
	closeOnce sync.Once
	closeErr  error
}

// New builds a server; with DataDir set it opens (and recovers) the log there.
func New(opts Options) (*Server, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	s := &Server{
		opts:     opts,
		log:      opts.Logger.Named("kubemq-embedded"),
		start:    opts.Now(),
		listed:   map[string][]*queue{},
		queues:   map[string]*queue{},
		channels: map[string]*eventChannel{},
		durables: map[string]*durable{},
		storeIDs: map[string]bool{},
		openTx:   map[string]*dsTx{},
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.calls.aborted = make(chan struct{})
	s.unaryInt, s.streamInt = recoverUnary(s.log), recoverStream(s.log)
	s.plain = newPlainBus()
	s.requests = newRequestBus()
	s.delays = newDelayer(s)
	if opts.DataDir != "" {
		st, err := openLogStore(opts.DataDir, s)
		if err != nil {
			s.cancel()
			return nil, err
		}
		s.store = st
	}
	sopts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(opts.BodyLimit),
		grpc.MaxSendMsgSize(maxGRPCMessage),
		grpc.ChainUnaryInterceptor(s.unaryInt),
		grpc.ChainStreamInterceptor(s.streamInt),
		// grpc's default codec zeroes a pooled buffer of up to 1 MiB per message.
		grpc.ForceServerCodecV2(fastpb.Codec()),
		experimental.BufferPool(wirecodec.Pool()),
		// Pipelining clients (a stream of events, batches in flight) would otherwise wait for
		// window updates every 64 KiB; fixed windows also skip BDP probing pings.
		grpc.InitialWindowSize(4 << 20),
		grpc.InitialConnWindowSize(16 << 20),
	}
	if opts.TLS != nil {
		sopts = append(sopts, grpc.Creds(credentials.NewTLS(opts.TLS)))
	}
	s.grpc = grpc.NewServer(append(sopts, opts.ServerOptions...)...)
	kubemqpb.RegisterKubemqServer(s.grpc, s)
	s.delays.start()
	s.goTracked(s.housekeeping)
	return s, nil
}

// GRPCServer returns the gRPC server with the kubemq.kubemq service registered, for callers that
// want to serve it themselves (Serve does the same on one listener).
func (s *Server) GRPCServer() *grpc.Server { return s.grpc }

// Serve accepts connections on lis until Stop or Close.
func (s *Server) Serve(lis net.Listener) error {
	err := s.grpc.Serve(lis)
	if errors.Is(err, grpc.ErrServerStopped) {
		return nil
	}
	return err
}

// Stop ends every open stream with Unavailable, stops accepting calls, waits for background work,
// flushes and closes the store. It is idempotent.
func (s *Server) Stop() {
	s.stopOnce.Do(func() {
		s.cancel()
		s.calls.close()
		done := make(chan struct{})
		go func() { s.grpc.GracefulStop(); s.calls.wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			s.calls.abort()
			s.grpc.Stop()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				// As grpc.Server.Stop, which does not wait for handlers either.
				s.log.Error("in-process calls still running 10s after Stop; closing anyway")
			}
		}
		s.wg.Wait()
		if s.store != nil {
			s.closeErr = s.store.close()
		}
	})
}

// Close is Stop, returning the store's close error.
func (s *Server) Close() error {
	s.Stop()
	return s.closeErr
}

// goTracked runs f in a goroutine that Stop waits for; f must return when s.ctx is done.
func (s *Server) goTracked(f func()) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		f()
	}()
}

func (s *Server) now() time.Time { return s.opts.Now() }

// errShutdown is how streams end when the server stops (docs/kubemq.md 5.5 shape 5).
func errShutdown() error {
	return status.Error(codes.Unavailable, "error reading from server: EOF")
}

// Ping reports host, version and uptime.
func (s *Server) Ping(context.Context, *kubemqpb.Empty) (*kubemqpb.PingResult, error) {
	now := s.now()
	return &kubemqpb.PingResult{
		Host:                s.opts.Host,
		Version:             Version,
		ServerStartTime:     s.start.Unix(),
		ServerUpTimeSeconds: int64(now.Sub(s.start) / time.Second),
	}, nil
}

// housekeeping applies retention and store maintenance once a second.
func (s *Server) housekeeping() {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
			s.applyRetention()
			if now := s.now(); now.Sub(s.lastPurge) >= purgeEvery {
				s.lastPurge = now
				s.purgeInactive()
			}
			if s.store != nil {
				s.store.maintain()
			}
		}
	}
}

func recoverUnary(log *zap.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (resp any, err error) {
		defer func() {
			if r := recover(); r != nil {
				log.Error("panic in handler", zap.String("method", info.FullMethod), zap.Any("panic", r), zap.Stack("stack"))
				err = status.Errorf(codes.Internal, "internal error: %v", r)
			}
		}()
		return h(ctx, req)
	}
}

func recoverStream(log *zap.Logger) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) (err error) {
		defer func() {
			if r := recover(); r != nil {
				log.Error("panic in stream handler", zap.String("method", info.FullMethod), zap.Any("panic", r), zap.Stack("stack"))
				err = status.Errorf(codes.Internal, "internal error: %v", r)
			}
		}()
		return h(srv, ss)
	}
}
