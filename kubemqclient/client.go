package kubemqclient

import (
	"context"
	cryptorand "crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/keepalive"

	"github.com/kubemq-io/kubemq-proxy/kubemqclient/fastpb"
	"github.com/kubemq-io/kubemq-proxy/kubemqclient/wirecodec"
	"github.com/kubemq-io/kubemq-proxy/kubemqpb"
)

// Options configure Dial. Only Address is required.
type Options struct {
	Address   string      // host:port of the KubeMQ gRPC API
	ClientID  string      // prefix of every ClientID sent; default "kubemq-proxy-<random>"
	TLS       *tls.Config // nil = plaintext
	AuthToken string      // sent as "authorization" metadata on every call
	Logger    *zap.Logger // nil = zap.NewNop()

	// DialTimeout bounds one health ping while the client is not ready (the
	// connect attempt). Default 5s.
	DialTimeout time.Duration
	// PingInterval is the health ping period while ready. Default 5s.
	PingInterval time.Duration
	// PingTimeout bounds one health ping while ready. Default 3s.
	PingTimeout time.Duration
	// OutageSilence: while ready, a health ping that times out declares an
	// outage only once nothing has come from the server (a ping's answer,
	// another call's answer, a message on a stream) for this long; until
	// then the ping is asked again at once. A busy but slow server thus stays
	// ready while a frozen one (nothing answers) is declared down within
	// PingInterval + 2 x PingTimeout when OutageSilence is at most
	// 2 x PingTimeout. A refused or broken connection is an outage at once.
	// Default PingInterval + 1.5 x PingTimeout (a second consecutive timeout
	// of an idle client).
	OutageSilence time.Duration
	// MinBackoff and MaxBackoff bound the exponential backoff between failed
	// health pings. Defaults 100ms and 5s.
	MinBackoff, MaxBackoff time.Duration
	// MaxMessageBytes is the largest gRPC message in either direction.
	// Default 100 MiB, the server's default limit.
	MaxMessageBytes int
	// PublishStreams is how many SendEventsStream streams PublishEvents
	// spreads batches over. Default 2.
	PublishStreams int
	// CloseTimeout bounds Close's wait for streams to wind down cleanly.
	// Default 10s.
	CloseTimeout time.Duration
	// SendAttempt bounds one attempt of SendQueueMessages: the real server
	// now and then leaves a send unanswered for 30 s or more while sends
	// after it go through (docs/kubemq.md 10.2). A batch left unanswered
	// that long is sent again, as long as the caller's context and the
	// server's health allow: a message may then be stored twice, which
	// beats failing a publish that a second attempt stores at once.
	// Default 10s; negative disables.
	SendAttempt time.Duration
	// DialOptions are appended to the client's own (tests, tracing).
	DialOptions []grpc.DialOption
	// Conn, if set, carries every call instead of a connection dialled to
	// Address (which is then only a name for logs): an in-process server's
	// channel such as embedded.Server.Channel(). TLS and DialOptions do
	// not apply to it; the client does not close it. Over a channel with
	// embedded.SharePayloads the server keeps the Body and Tags of sent
	// queue messages and events as they are: never change them after the
	// call, even a failed one.
	Conn grpc.ClientConnInterface
	// Observe, if set, is called once per operation that reached the
	// server (ObservedOps names it) with the time until the server's
	// answer and the outcome: nil or an *Error. It runs on the caller's
	// goroutine; keep it short. nil costs nothing.
	Observe func(op string, d time.Duration, err error)
}

func (o *Options) setDefaults() error {
	if o.Conn != nil && (o.TLS != nil || len(o.DialOptions) > 0) {
		return invalidArg("Dial", "TLS and DialOptions do not apply to Conn", nil)
	}
	if o.Address == "" {
		if o.Conn == nil {
			return invalidArg("Dial", "empty address", nil)
		}
		o.Address = "in-process"
	}
	if o.ClientID == "" {
		o.ClientID = "kubemq-proxy-" + randHex(4)
	} else if !isVerbatim(o.ClientID) {
		// Derived ids become store client ids, which accept only this alphabet.
		return invalidArg("Dial", "ClientID must match [A-Za-z0-9-][A-Za-z0-9_-]*", nil)
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&o.DialTimeout, 5*time.Second)
	def(&o.PingInterval, 5*time.Second)
	def(&o.PingTimeout, 3*time.Second)
	def(&o.OutageSilence, o.PingInterval+o.PingTimeout*3/2)
	def(&o.MinBackoff, 100*time.Millisecond)
	def(&o.MaxBackoff, 5*time.Second)
	def(&o.CloseTimeout, 10*time.Second)
	if o.SendAttempt == 0 {
		o.SendAttempt = 10 * time.Second
	}
	if o.MaxBackoff < o.MinBackoff {
		o.MaxBackoff = o.MinBackoff
	}
	if o.PublishStreams <= 0 {
		o.PublishStreams = 2
	}
	if o.MaxMessageBytes <= 0 {
		o.MaxMessageBytes = 100 << 20
	}
	return nil
}

// Client is a connection to one KubeMQ server. It is safe for concurrent use.
type Client struct {
	opts     Options
	log      *zap.Logger
	conn     *grpc.ClientConn
	rpc      kubemqpb.KubemqClient
	clientID string
	ids      idGen

	// ctx is the lifetime of every stream the client opens; Close cancels it
	// after the streams have wound down.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // every goroutine the client starts (see goTracked)

	ready atomic.Bool
	heard atomic.Int64 // unix nanos of the last answer or stream message from the server (hear)
	// sendRetries counts batches sent again after an unanswered attempt (SendAttempt).
	sendRetries atomic.Int64
	// sendsCut counts publishing calls (FailFast) that failed because readiness was lost
	// while they were in flight: the server may have stored what they sent.
	sendsCut atomic.Int64
	kick     chan struct{} // wakes the health loop early (cap 1)
	notifyMu sync.Mutex    // held from a readiness change through its hooks, so hooks see changes in order
	stateMu  sync.Mutex    // guards hooks, readyCh, closed
	hooks    map[int]func(up bool)
	hookID   int
	readyCh  chan struct{} // closed when ready; replaced when going down
	closed   bool
	// upCtx lives while the client is ready and ends (cause errOutage) when
	// readiness is lost; a new one starts with the next ready. nil until the
	// first ready. Publishing calls are bound to it (boundToReadiness).
	upCtx    context.Context
	upCancel context.CancelCauseFunc

	backlog backlogCache // QueuesInfoCached's last answer (backlog.go)

	pub *eventPublisher

	// closers are the open long-lived streams, closed by Client.Close.
	closersMu sync.Mutex
	closers   map[closer]struct{}
	closeOnce sync.Once
}

type closer interface{ Close() error }

// Dial creates a client. It does not wait for the server: it starts a health
// loop that pings with backoff and drives Ready, WaitReady and StateChanges.
// It fails only for invalid options (or an already ended ctx); use WaitReady
// to wait for the server.
func Dial(ctx context.Context, opts Options) (*Client, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, wrapErr("Dial", err)
	}
	if opts.Conn != nil {
		return newClient(opts, nil, opts.Conn), nil
	}
	creds := insecure.NewCredentials()
	if opts.TLS != nil {
		creds = credentials.NewTLS(opts.TLS)
	}
	dopts := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(
			grpc.MaxCallRecvMsgSize(opts.MaxMessageBytes),
			grpc.MaxCallSendMsgSize(opts.MaxMessageBytes),
			// grpc's default codec zeroes a pooled buffer of up to 1 MiB per message.
			grpc.ForceCodecV2(fastpb.Codec()),
		),
		experimental.WithBufferPool(wirecodec.Pool()),
		// Detect a dead server on idle long-lived streams.
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
		// Large windows keep pipelined streams from stalling on flow control.
		grpc.WithInitialWindowSize(4 << 20),
		grpc.WithInitialConnWindowSize(16 << 20),
		grpc.WithWriteBufferSize(256 << 10),
		grpc.WithReadBufferSize(256 << 10),
	}
	dopts = append(dopts, opts.DialOptions...)
	conn, err := grpc.NewClient(opts.Address, dopts...)
	if err != nil {
		return nil, invalidArg("Dial", err.Error(), nil)
	}
	conn.Connect()
	return newClient(opts, conn, conn), nil
}

// newClient starts a client on cc; conn, if not nil, is closed with it.
func newClient(opts Options, conn *grpc.ClientConn, cc grpc.ClientConnInterface) *Client {
	c := &Client{
		opts:     opts,
		log:      opts.Logger.Named("kubemqclient"),
		conn:     conn,
		rpc:      kubemqpb.NewKubemqClient(tokenConn{cc, opts.AuthToken}),
		clientID: opts.ClientID,
		ids:      newIDGen(),
		kick:     make(chan struct{}, 1),
		hooks:    map[int]func(bool){},
		readyCh:  make(chan struct{}),
		closers:  map[closer]struct{}{},
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.pub = newEventPublisher(c)
	c.goTracked(c.healthLoop)
	return c
}

// tokenConn puts a token on every call: the one WithToken put in its
// context, else Options.AuthToken, else none.
type tokenConn struct {
	cc  grpc.ClientConnInterface
	tok string
}

func (t tokenConn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	return t.cc.Invoke(withAuthorization(ctx, t.tok), method, args, reply, opts...)
}

func (t tokenConn) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	return t.cc.NewStream(withAuthorization(ctx, t.tok), desc, method, opts...)
}

// ClientID is the prefix of every ClientID the client sends.
func (c *Client) ClientID() string { return c.clientID }

// NewID returns an id unique to this client process, for MessageIDs and
// EventIDs that must not repeat (lease records need their own ids).
func (c *Client) NewID() string { return c.ids.next() }

func (c *Client) goTracked(f func()) {
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		f()
	}()
}

func (c *Client) isClosed() bool {
	c.stateMu.Lock()
	defer c.stateMu.Unlock()
	return c.closed
}

func (c *Client) track(x closer) bool {
	c.closersMu.Lock()
	defer c.closersMu.Unlock()
	if c.closers == nil {
		return false
	}
	c.closers[x] = struct{}{}
	return true
}

func (c *Client) untrack(x closer) {
	c.closersMu.Lock()
	defer c.closersMu.Unlock()
	delete(c.closers, x)
}

// Close winds down every open stream cleanly (downstream transactions are
// closed, outstanding requests answered), stops the health loop and closes the
// connection. It is idempotent.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		c.stateMu.Lock()
		c.closed = true
		c.stateMu.Unlock()
		c.closersMu.Lock()
		open := make([]closer, 0, len(c.closers))
		for x := range c.closers {
			open = append(open, x)
		}
		c.closers = nil
		c.closersMu.Unlock()
		var wg sync.WaitGroup
		for _, x := range open {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_ = x.Close()
			}()
		}
		wg.Wait()
		dctx, cancel := context.WithTimeout(context.Background(), c.opts.CloseTimeout)
		c.pub.drain(dctx)
		cancel()
		c.cancel()
		c.pub.close()
		c.wg.Wait()
		c.setReady(false)
		if c.conn != nil {
			_ = c.conn.Close()
		}
	})
	return nil
}

// --- health ---

// Ready reports whether the last health ping succeeded. A call that sees
// the server unavailable triggers a ping at once, so readiness drops within
// one ping of an outage.
func (c *Client) Ready() bool { return c.ready.Load() }

// WaitReady blocks until the client is ready, ctx ends, or the client is
// closed.
func (c *Client) WaitReady(ctx context.Context) error {
	for {
		c.stateMu.Lock()
		ch, closed := c.readyCh, c.closed
		c.stateMu.Unlock()
		if closed {
			return closedErr("WaitReady")
		}
		if c.ready.Load() {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return wrapErr("WaitReady", ctx.Err())
		case <-c.ctx.Done():
			return closedErr("WaitReady")
		}
	}
}

// OnStateChange registers fn to be called with every readiness change, in
// order, synchronously by the goroutine that observed the change (keep it
// short; it must not call back into the client). It returns a function that
// removes the hook.
func (c *Client) OnStateChange(fn func(up bool)) (remove func()) {
	c.stateMu.Lock()
	defer c.stateMu.Unlock()
	id := c.hookID
	c.hookID++
	c.hooks[id] = fn
	return func() {
		c.stateMu.Lock()
		defer c.stateMu.Unlock()
		delete(c.hooks, id)
	}
}

// StateChanges returns a channel that receives the current readiness at once
// and then every change. Only the latest state is kept if the reader lags.
// It is closed when the client is closed.
func (c *Client) StateChanges() <-chan bool {
	ch := make(chan bool, 1)
	var mu sync.Mutex
	done := false
	push := func(up bool) {
		mu.Lock()
		defer mu.Unlock()
		if done {
			return
		}
		select {
		case <-ch:
		default:
		}
		ch <- up
	}
	// Registering and pushing the current state under notifyMu keeps a
	// concurrent change from being overtaken by the initial value.
	c.notifyMu.Lock()
	c.stateMu.Lock()
	id := c.hookID
	c.hookID++
	c.hooks[id] = push
	c.stateMu.Unlock()
	push(c.ready.Load())
	c.notifyMu.Unlock()
	c.goTracked(func() {
		<-c.ctx.Done()
		mu.Lock()
		done = true
		close(ch)
		mu.Unlock()
	})
	return ch
}

// setReady flips readiness and runs the hooks; only the health loop and Close
// call it with true, any caller may call it with false.
func (c *Client) setReady(up bool) {
	c.notifyMu.Lock()
	defer c.notifyMu.Unlock()
	c.stateMu.Lock()
	if c.ready.Load() == up {
		c.stateMu.Unlock()
		return
	}
	c.ready.Store(up)
	if up {
		close(c.readyCh)
		c.upCtx, c.upCancel = context.WithCancelCause(context.Background())
	} else {
		c.readyCh = make(chan struct{})
		if c.upCancel != nil {
			c.upCancel(errOutage)
		}
	}
	hooks := make([]func(bool), 0, len(c.hooks))
	for _, h := range c.hooks {
		hooks = append(hooks, h)
	}
	c.stateMu.Unlock()
	switch {
	case up:
		c.log.Info("kubemq ready", zap.String("address", c.opts.Address))
	case c.isClosed():
		// Close itself: an orderly shutdown, not an outage.
		c.log.Info("kubemq client closed", zap.String("address", c.opts.Address))
	default:
		c.log.Warn("kubemq not ready", zap.String("address", c.opts.Address))
	}
	for _, h := range hooks {
		h(up)
	}
}

// SendsResent is how many queue message batches the server left unanswered
// for Options.SendAttempt and that were sent again.
func (c *Client) SendsResent() int64 { return c.sendRetries.Load() }

// SendsCut is how many publishing calls with a FailFast ctx failed with
// ErrUnavailable because readiness was lost while they were in flight. The
// server may have stored what each sent, so the caller's retry may store it
// twice (a false outage on a starved machine is the usual case: the server
// was slow, not gone).
func (c *Client) SendsCut() int64 { return c.sendsCut.Load() }

// observe inspects an error from any call: an unavailable server makes the
// health loop ping at once, and that ping decides readiness. (Flipping on
// the error itself would flap: after a restart, streams opened before it
// still fail with Unavailable while the server is already back.) It returns
// err unchanged.
func (c *Client) observe(err error) error {
	if err != nil && errors.Is(err, ErrUnavailable) && !c.isClosed() {
		select {
		case c.kick <- struct{}{}:
		default:
		}
	}
	return err
}

// hear records that the server answered something just now: a live
// server, however slow its health pings (see Options.OutageSilence).
func (c *Client) hear() { c.heard.Store(time.Now().UnixNano()) }

// silence is how long the server has said nothing.
func (c *Client) silence() time.Duration {
	return time.Duration(time.Now().UnixNano() - c.heard.Load())
}

func (c *Client) healthLoop() {
	backoff := c.opts.MinBackoff
	for {
		timeout := c.opts.PingTimeout
		if !c.ready.Load() {
			timeout = c.opts.DialTimeout
		}
		ctx, cancel := context.WithTimeout(c.ctx, timeout)
		_, err := c.Ping(ctx)
		cancel()
		if c.ctx.Err() != nil {
			return
		}
		var wait time.Duration
		if err == nil {
			c.setReady(true)
			backoff = c.opts.MinBackoff
			wait = c.opts.PingInterval
		} else if silent := c.silence(); c.ready.Load() && errors.Is(err, ErrTimeout) && silent < c.opts.OutageSilence {
			// A slow ping on a CPU-starved machine, or behind a burst of
			// traffic, is asked again at once: declaring the backend down
			// drops every lease.
			c.log.Warn("kubemq health ping timed out; asking again before declaring an outage", zap.Error(err),
				zap.Duration("server_silent_for", silent))
			continue
		} else {
			if c.ready.Load() {
				c.log.Warn("kubemq health ping failed", zap.Error(err))
			}
			c.setReady(false)
			// Jitter keeps many proxies from pinging in lockstep.
			wait = backoff/2 + rand.N(backoff/2+1)
			backoff = min(backoff*2, c.opts.MaxBackoff)
		}
		// While backing off, a kick (another call saw the outage) must not
		// shorten the wait; while healthy it triggers an immediate ping.
		kick := c.kick
		if err != nil {
			kick = nil
		}
		t := time.NewTimer(wait)
		select {
		case <-c.ctx.Done():
			t.Stop()
			return
		case <-t.C:
		case <-kick:
			t.Stop()
		}
	}
}

// errOutage is the cause of upCtx's end: the client lost readiness.
var errOutage = errors.New("the server stopped answering health pings")

// outageErr is a publishing call's failure during an outage: retryable.
func outageErr(op string) *Error {
	return &Error{Op: op, GRPC: codes.Unavailable, Msg: "not ready: " + errOutage.Error(), kind: ErrUnavailable, Retryable: true, cause: errOutage}
}

type failFastKey struct{}

// FailFast marks ctx so that the publishing calls made with it
// (PublishEvents, SendQueueMessage, SendQueueMessages) fail fast with a
// retryable ErrUnavailable during an outage instead of waiting for their
// deadline on a server that stopped answering (a frozen process or a
// partition keeps the TCP connection open): at once while the client is not
// ready after having been ready, and when readiness is lost while the call
// is in flight (within PingInterval + 2 x PingTimeout of the server's last
// word). The server may still store what such a call sent, after the
// outage: use it where the caller's retry is a new message (a client's
// publish, at-least-once), not where a retry reuses a MessageID that must
// not be stored twice (lease records).
func FailFast(ctx context.Context) context.Context {
	return context.WithValue(ctx, failFastKey{}, true)
}

// boundToReadiness applies FailFast to one call: it returns outageErr during
// an outage, else a context that ends (cause errOutage) when readiness is
// lost; settleOutage maps the call's error then. Calls without FailFast, and
// every call before the first successful ping (a caller that starts before
// the connection waits as before), are not bound.
func (c *Client) boundToReadiness(op string, ctx context.Context) (context.Context, context.CancelFunc, error) {
	if ctx.Value(failFastKey{}) == nil {
		return ctx, func() {}, nil
	}
	c.stateMu.Lock()
	up := c.upCtx
	c.stateMu.Unlock()
	if up == nil {
		return ctx, func() {}, nil
	}
	if up.Err() != nil {
		return nil, nil, outageErr(op)
	}
	bctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(up, func() { cancel(errOutage) })
	return bctx, func() { stop(); cancel(nil) }, nil
}

// settleOutage replaces err with outageErr when ctx (from
// boundToReadiness) ended because readiness was lost, counting the call
// (SendsCut) and logging its messages (n, the first one's channel): the
// server may have stored them, and the caller's retry may store them again.
func (c *Client) settleOutage(op string, ctx context.Context, err error, n int, channel string) error {
	if err != nil && ctx.Err() != nil && errors.Is(context.Cause(ctx), errOutage) {
		c.sendsCut.Add(1)
		c.log.Warn("kubemq outage declared while a send was in flight; the server may have stored it, so a retry may store it twice",
			zap.String("op", op), zap.Int("messages", n), zap.String("channel", channel))
		return outageErr(op)
	}
	return err
}

// PingInfo is the server's identity.
type PingInfo struct {
	Host      string
	Version   string
	StartTime time.Time
	Uptime    time.Duration
}

// Ping asks the server for its identity. Failures flip readiness off.
func (c *Client) Ping(ctx context.Context) (PingInfo, error) {
	t := c.startOp()
	r, err := c.rpc.Ping(ctx, &kubemqpb.Empty{})
	if err != nil {
		err = c.observe(wrapErr("Ping", err))
		t.end(OpPing, err)
		return PingInfo{}, err
	}
	c.hear()
	t.end(OpPing, nil)
	return PingInfo{
		Host:      r.GetHost(),
		Version:   r.GetVersion(),
		StartTime: time.Unix(r.GetServerStartTime(), 0),
		Uptime:    time.Duration(r.GetServerUpTimeSeconds()) * time.Second,
	}, nil
}

// --- ids ---

// idGen mints ids unique to this process: a random base plus a counter, so
// minting costs one atomic add.
type idGen struct {
	base string
	n    *atomic.Uint64
}

func newIDGen() idGen { return idGen{base: randHex(6) + "-", n: new(atomic.Uint64)} }

func (g idGen) next() string {
	var buf [13 + 16]byte
	b := append(buf[:0], g.base...)
	b = strconv.AppendUint(b, g.n.Add(1), 36)
	return string(b)
}

func randHex(n int) string {
	b := make([]byte, n)
	if _, err := cryptorand.Read(b); err != nil {
		panic("kubemqclient: crypto/rand failed: " + err.Error())
	}
	return hex.EncodeToString(b)
}
