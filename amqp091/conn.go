package amqp091

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/kubemq-io/kubemq-proxy/amqp091/wire"
)

const (
	// closeOkTimeout bounds the wait for the peer's close-ok after the
	// server sent connection.close.
	closeOkTimeout = 3 * time.Second
	// channelStopTimeout bounds how long a closing connection waits for its
	// channels to give their deliveries back.
	channelStopTimeout = 10 * time.Second
	// closeDrainTimeout bounds how long a client's connection.close waits
	// for its channels to finish the methods sent before it.
	closeDrainTimeout = 3 * time.Second
)

// conn is one AMQP connection.
//
// Goroutines: serve (the reader) owns the channel table and the content
// assembly state; the writer owns the socket's write side; each channel has
// its own goroutine (so a slow KubeMQ call on one channel never blocks
// another), and each consumer one more. Close state is guarded by closeMu
// because any of them may raise a connection error.
type conn struct {
	srv    *Server
	nc     net.Conn
	id     uint64
	log    *zap.Logger
	ctx    context.Context // ends with the connection; bounds all work done for it
	cancel context.CancelFunc

	// Set by the handshake, read-only afterwards.
	user         string
	vhostName    string // as the client named it, for error texts
	vh           *vhost
	frameMax     uint32
	channelMax   uint16
	heartbeat    time.Duration
	cancelNotify bool // client understands server-sent basic.cancel
	blockNotify  bool // client understands connection.blocked/unblocked
	clientName   string
	refuse       *wire.Error // KubeMQ was unreachable at connection.open: close with it
	w            *writer
	opened       atomic.Bool // set once the handshake is done and w exists
	since        time.Time   // when the handshake finished (set before opened)

	// For the state view (state.go).
	nChannels, nConsumers atomic.Int32
	// viewMu guards view: the open channels, for the management API's channel list (the
	// channel table itself belongs to serve).
	viewMu  sync.Mutex
	view    map[*channel]struct{}
	blocked atomic.Bool // reading paused by publish back-pressure

	// Owned by serve.
	fr         *wire.FrameReader
	channels   map[uint16]*slot
	assembling int64 // body bytes of publishes whose content is still arriving

	// Publish back-pressure (Options.MaxPendingPublishBytes): body bytes of
	// complete publishes handed to channels and not yet stored or dropped.
	// Channels and publisher lanes release them; drained wakes the reader
	// when it waits for them.
	pending atomic.Int64
	drained chan struct{} // cap 1

	closeMu   sync.Mutex // guards closing, reason, closeSent, handshook
	closing   bool
	closeSent bool
	reason    string
	// handshook: the peer closed the connection and was sent close-ok, so
	// it is about to close its end.
	handshook bool

	chWG sync.WaitGroup // channel goroutines

	ownedMu sync.Mutex // guards owned
	owned   map[*queue]struct{}
}

// slot is the reader's view of one open channel: the channel and the
// content being assembled on it.
type slot struct {
	ch        *channel
	pub       *wire.BasicPublish // a publish waiting for its content
	hdr       wire.ContentHeader
	haveHdr   bool
	body      []byte
	remaining uint64
	discard   uint64 // body bytes of a refused (oversized) publish still to skip
}

func newConn(s *Server, nc net.Conn, id uint64) *conn {
	c := &conn{srv: s, nc: nc, id: id, channels: map[uint16]*slot{}, owned: map[*queue]struct{}{},
		drained: make(chan struct{}, 1)}
	c.ctx, c.cancel = context.WithCancel(s.ctx)
	c.log = s.log.With(zap.Uint64("conn", id), zap.String("remote", nc.RemoteAddr().String()))
	return c
}

// errDone ends the read loop after an orderly close.
var errDone = errors.New("connection done")

// serve runs the connection to its end.
func (c *conn) serve() {
	defer c.teardown()
	c.nc.SetDeadline(time.Now().Add(c.srv.opts.HandshakeTimeout))
	if err := wire.ReadProtocolHeader(c.nc); err != nil {
		var he *wire.ProtocolHeaderError
		if errors.As(err, &he) {
			// Tell the peer what we speak, as RabbitMQ does, and hang up.
			c.nc.Write(wire.ProtocolHeader[:])
			c.setReason("unsupported protocol header %q", he.Got[:])
		} else {
			c.setReason("no protocol header: %v", err)
		}
		return
	}
	br := bufio.NewReaderSize(c.nc, 32<<10)
	// Until tuned, accept frames up to our own limit: start-ok carries the
	// client's properties, which may exceed the 4096-byte minimum.
	c.fr = wire.NewFrameReader(br, uint32(c.srv.opts.FrameMax))
	bw := bufio.NewWriterSize(c.nc, 4096)
	hw := wire.NewFrameWriter(bw, uint32(c.srv.opts.FrameMax))
	if err := c.handshake(hw); err != nil {
		var e *wire.Error
		if errors.As(err, &e) && e.Hard {
			c.closeDuringHandshake(hw, e)
		}
		c.setReason("handshake: %v", err)
		return
	}
	c.nc.SetDeadline(time.Time{})
	c.fr.SetFrameMax(c.frameMax)
	c.w = newWriter(c.nc, c.frameMax)
	go c.w.run(c.heartbeat)
	c.since = time.Now()
	c.opened.Store(true)
	c.srv.m.connections.Inc()
	defer c.srv.m.connections.Dec()
	c.log.Info("connection open", zap.String("user", c.user), zap.String("vhost", c.vhostName),
		zap.String("client", c.clientName), zap.Duration("heartbeat", c.heartbeat))
	if c.refuse != nil {
		c.refuseLater()
	}
	c.readLoop()
}

func (c *conn) setReason(format string, args ...any) {
	c.closeMu.Lock()
	if c.reason == "" {
		c.reason = fmt.Sprintf(format, args...)
	}
	c.closeMu.Unlock()
}

func (c *conn) isClosing() bool {
	c.closeMu.Lock()
	defer c.closeMu.Unlock()
	return c.closing
}

// fail closes the connection with a hard error, from any goroutine: it
// sends connection.close, stops every channel, and lets the reader wait a
// little for the peer's close-ok. Later calls do nothing.
func (c *conn) fail(e *wire.Error) {
	c.closeMu.Lock()
	if c.closing {
		c.closeMu.Unlock()
		return
	}
	c.closing, c.closeSent = true, true
	if c.reason == "" {
		c.reason = e.Text
	}
	c.closeMu.Unlock()
	c.log.Info("closing connection", zap.Uint16("code", e.Code), zap.String("text", e.Text))
	c.srv.m.closed(e.Code, "connection")
	c.cancel()
	// A peer that stopped reading must not hold the close up for long.
	c.nc.SetWriteDeadline(time.Now().Add(closeOkTimeout))
	c.w.method(0, e.CloseMethod())
	c.nc.SetReadDeadline(time.Now().Add(closeOkTimeout))
}

func (c *conn) readLoop() {
	hbTimeout := 2 * c.heartbeat
	var armedAt time.Time
	for {
		if c.overPending() {
			c.holdReads()
			armedAt = time.Time{} // the time spent holding was not the client's silence
		}
		if hbTimeout > 0 && !c.isClosing() {
			// Resetting the deadline on every frame is wasted work; a
			// quarter of the timeout is precise enough.
			if now := time.Now(); now.Sub(armedAt) > hbTimeout/4 {
				c.nc.SetReadDeadline(now.Add(hbTimeout))
				armedAt = now
			}
		}
		f, err := c.fr.ReadFrame()
		if err != nil {
			var e *wire.Error
			if errors.As(err, &e) && !c.isClosing() {
				// A framing error: report it and keep reading for the
				// peer's close-ok, which parses when the bad frame was
				// read whole (a bad frame-end); any further error ends it.
				c.fail(e)
				continue
			}
			c.readFailed(err, hbTimeout)
			return
		}
		if c.isClosing() {
			if c.closingFrame(f) {
				return
			}
			continue
		}
		if err := c.handleFrame(f); err != nil {
			if err == errDone {
				return
			}
			c.fail(asAMQP(err))
		}
	}
}

func (c *conn) readFailed(err error, hbTimeout time.Duration) {
	switch {
	case c.isClosing():
	case errors.Is(err, os.ErrDeadlineExceeded):
		c.setReason("missed heartbeats from client, timeout: %v", hbTimeout)
		c.log.Warn("missed heartbeats from client", zap.Duration("timeout", hbTimeout))
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed):
		c.setReason("client closed the socket")
	default:
		c.setReason("read: %v", err)
	}
}

// closingFrame handles a frame after connection.close was sent or
// received; it reports whether the connection is finished.
func (c *conn) closingFrame(f wire.Frame) bool {
	if f.Type != wire.FrameMethod || f.Channel != 0 {
		return false
	}
	m, err := wire.DecodeMethod(f.Payload)
	if err != nil {
		return false
	}
	switch m.(type) {
	case *wire.ConnectionCloseOk:
		return true
	case *wire.ConnectionClose:
		c.w.method(0, &wire.ConnectionCloseOk{})
		c.setHandshook()
		return true
	}
	return false
}

func (c *conn) setHandshook() {
	c.closeMu.Lock()
	c.handshook = true
	c.closeMu.Unlock()
}

// refuseGrace is how long a connection refused at connection.open (KubeMQ
// unreachable) stays open waiting for the client's first method.
const refuseGrace = 5 * time.Second

// refuseLater closes a refused connection after refuseGrace if the client
// sends nothing meanwhile: the client has had time to register for the
// close (amqp091-go and streadway drop the reason of a close that came
// before NotifyClose), and its first method is answered with the close.
func (c *conn) refuseLater() {
	t := time.AfterFunc(refuseGrace, func() { c.fail(c.refuse) })
	go func() {
		<-c.ctx.Done()
		t.Stop()
	}()
}

func (c *conn) handleFrame(f wire.Frame) error {
	switch f.Type {
	case wire.FrameHeartbeat:
		if f.Channel != 0 {
			return wire.FrameError("heartbeat frame on channel %d", f.Channel)
		}
		return nil
	case wire.FrameMethod:
		m, err := wire.DecodeMethod(f.Payload)
		if err != nil {
			return err
		}
		if c.refuse != nil && (f.Channel != 0 || m.ClassID() != wire.ClassConnection) {
			return c.refuse // a client closing its refused connection is answered as usual
		}
		if f.Channel == 0 {
			return c.handleConnectionMethod(m)
		}
		return c.handleChannelMethod(f.Channel, m)
	case wire.FrameHeader:
		if c.refuse != nil {
			return c.refuse
		}
		return c.handleHeader(f)
	case wire.FrameBody:
		return c.handleBody(f)
	}
	return wire.FrameError("unknown frame type %d", f.Type)
}

func (c *conn) handleConnectionMethod(m wire.Method) error {
	switch m := m.(type) {
	case *wire.ConnectionClose:
		c.closeMu.Lock()
		c.closing = true
		if c.reason == "" {
			c.reason = fmt.Sprintf("client closed the connection: %d %s", m.ReplyCode, m.ReplyText)
		}
		c.closeMu.Unlock()
		// Channels handle what the client sent before the close (its
		// publishes are stored, its acks applied), then give their
		// deliveries back, before the close-ok: a client that reconnects at
		// once finds them again.
		c.closeChannels()
		c.cancel()
		waitTimeout(&c.chWG, channelStopTimeout)
		c.w.method(0, &wire.ConnectionCloseOk{})
		c.setHandshook()
		return errDone
	case *wire.ConnectionCloseOk:
		return errDone
	case *wire.ConnectionUpdateSecret:
		// Secrets are not tokens here: accept, as RabbitMQ does for
		// backends that do not use them.
		c.w.method(0, &wire.ConnectionUpdateSecretOk{})
		return nil
	case *wire.ConnectionBlocked, *wire.ConnectionUnblocked:
		return nil
	}
	if m.ClassID() != wire.ClassConnection {
		return wire.CommandInvalid("method %s on channel 0", m.Name()).OnMethod(m.ClassID(), m.MethodID())
	}
	return wire.CommandInvalid("unexpected method %s", m.Name()).OnMethod(m.ClassID(), m.MethodID())
}

func (c *conn) handleChannelMethod(id uint16, m wire.Method) error {
	if info := wire.LookupMethod(m.ClassID(), m.MethodID()); info == nil || !info.ToServer || m.ClassID() == wire.ClassConnection {
		return wire.CommandInvalid("method %s is not allowed from a client on channel %d", m.Name(), id).OnMethod(m.ClassID(), m.MethodID())
	}
	s := c.channels[id]
	if s == nil {
		switch m.(type) {
		case *wire.ChannelOpen:
			// RabbitMQ 3.10 limits how many channels are open, not their
			// numbers (a number above channel_max is accepted).
			if c.channelMax > 0 && len(c.channels) >= int(c.channelMax) {
				return wire.NotAllowed("number of channels opened (%d) has reached the negotiated channel_max (%d)", len(c.channels), c.channelMax)
			}
			c.openChannel(id)
			return nil
		case *wire.ChannelCloseOk:
			return nil // a close-ok crossing our own close of the channel
		}
		return wire.ChannelError("expected 'channel.open'").OnMethod(m.ClassID(), m.MethodID())
	}
	if _, ok := m.(*wire.ChannelOpen); ok {
		return wire.ChannelError("second 'channel.open' seen").OnMethod(m.ClassID(), m.MethodID())
	}
	// A method ends the discarding of an oversized body: the channel
	// refused it and is closing; what follows is its close handshake.
	s.discard = 0
	if s.pub != nil {
		if s.haveHdr {
			return wire.UnexpectedFrame("expected content body, got non content body frame instead")
		}
		return wire.UnexpectedFrame("expected content header for class 60, got non content header frame instead")
	}
	if pub, ok := m.(*wire.BasicPublish); ok {
		s.pub = pub
		return nil
	}
	c.dispatch(s, command{m: m})
	switch m.(type) {
	case *wire.ChannelClose, *wire.ChannelCloseOk:
		// The channel finishes its close; the number is free again. A
		// method that follows on it is 504 CHANNEL_ERROR, also before the
		// channel has sent close-ok. RabbitMQ drops such a method while the
		// channel is stopping, and amqp091-go then waits in Channel.Close for
		// ever when a consume's context ended at the same time (its
		// basic.cancel goes out after the close, and the cancel's waiter
		// takes the close-ok): the connection error ends both waits, and the
		// acks that came before still apply (channel.settleQueued).
		delete(c.channels, id)
	}
	return nil
}

// closeChannels ends every open channel after the commands queued in it
// (a client's connection.close), waiting at most closeDrainTimeout: a
// channel that cannot finish them in time (KubeMQ unreachable, a queue
// whose holder does not answer) is stopped by the connection's cancel
// after, which drops what it has not done.
func (c *conn) closeChannels() {
	ctx, cancel := context.WithTimeout(c.ctx, closeDrainTimeout)
	defer cancel()
	var ends []chan struct{}
	for _, s := range c.channels {
		select {
		case s.ch.cmds <- command{connClose: true}:
			ends = append(ends, s.ch.done)
		case <-s.ch.done:
		case <-ctx.Done():
			return
		}
	}
	for _, done := range ends {
		select {
		case <-done:
		case <-ctx.Done():
			return
		}
	}
}

func (c *conn) handleHeader(f wire.Frame) error {
	s := c.channels[f.Channel]
	if s == nil || s.pub == nil || s.haveHdr {
		return wire.UnexpectedFrame("expected method frame, got non method frame instead")
	}
	size, ok := wire.ContentBodySize(f.Payload)
	if ok && size > uint64(c.srv.opts.MaxBodySize) {
		// Refused on the header, before any of the body is read: the
		// channel closes with 406 now, and the body frames still on the
		// way are discarded as they come, unbuffered.
		cmd := command{m: s.pub, tooLarge: size}
		s.pub, s.discard = nil, size
		c.dispatch(s, cmd)
		return nil
	}
	h, err := wire.DecodeContentHeader(f.Payload)
	if err != nil {
		return err
	}
	s.hdr = h
	s.haveHdr = true
	s.remaining = size
	s.body = make([]byte, 0, min(size, uint64(c.frameMax)))
	if size == 0 {
		c.completeContent(s)
	}
	return nil
}

func (c *conn) handleBody(f wire.Frame) error {
	s := c.channels[f.Channel]
	n := uint64(len(f.Payload))
	if s != nil && s.discard > 0 {
		if n > s.discard {
			return wire.UnexpectedFrame("content body frames exceed the declared body size")
		}
		s.discard -= n
		return nil
	}
	if s == nil || s.pub == nil || !s.haveHdr {
		return wire.UnexpectedFrame("expected method frame, got non method frame instead")
	}
	if n > s.remaining {
		return wire.UnexpectedFrame("content body frames exceed the declared body size")
	}
	s.body = append(s.body, f.Payload...)
	s.remaining -= n
	c.assembling += int64(n)
	if s.remaining == 0 {
		c.completeContent(s)
	}
	return nil
}

func (c *conn) completeContent(s *slot) {
	props := s.hdr.Properties
	cmd := command{m: s.pub, body: s.body, props: &props}
	n := int64(len(s.body))
	c.assembling -= n
	if c.srv.opts.MaxPendingPublishBytes > 0 {
		cmd.pending = n
		c.pending.Add(n)
	}
	s.pub, s.haveHdr, s.body, s.remaining = nil, false, nil, 0
	s.hdr = wire.ContentHeader{}
	c.dispatch(s, cmd)
}

// dispatch hands a command to its channel. It blocks while the channel's
// queue is full: that is TCP back-pressure on a client that outruns its
// channel.
func (c *conn) dispatch(s *slot, cmd command) {
	select {
	case s.ch.cmds <- cmd:
	case <-s.ch.done:
		c.unpend(cmd.pending)
	case <-c.ctx.Done():
		c.unpend(cmd.pending)
	}
}

// unpend releases the pending bytes of a publish that was stored, refused
// or dropped, and wakes the reader if it waits for them. Any goroutine.
func (c *conn) unpend(n int64) {
	if n == 0 {
		return
	}
	c.pending.Add(-n)
	select {
	case c.drained <- struct{}{}:
	default:
	}
}

// blockedReason is connection.blocked's reason text.
const blockedReason = "pending publish bytes over limit"

// overPending reports whether the reader must stop reading: the bytes
// read and not yet stored are over the bound, and some of them belong to
// complete publishes, which will drain (bytes of content still arriving
// alone never block, or a body above the bound could never complete).
func (c *conn) overPending() bool {
	limit := c.srv.opts.MaxPendingPublishBytes
	if limit <= 0 {
		return false
	}
	p := c.pending.Load()
	return p > 0 && p+c.assembling > limit && !c.isClosing()
}

// holdReads stops reading the socket until the pending bytes are down to
// half the bound (hysteresis, so a busy publisher is not blocked and
// unblocked on every message), as RabbitMQ's reader does in its blocked
// state: the client's heartbeats wait in the socket meanwhile and missing
// them is not held against it, while the writer keeps sending ours.
func (c *conn) holdReads() {
	limit := c.srv.opts.MaxPendingPublishBytes
	c.srv.m.blocked.Inc()
	defer c.srv.m.blocked.Dec()
	c.blocked.Store(true)
	defer c.blocked.Store(false)
	c.log.Debug("reading paused: "+blockedReason, zap.Int64("pending", c.pending.Load()), zap.Int64("limit", limit))
	if c.blockNotify {
		c.w.method(0, &wire.ConnectionBlocked{Reason: blockedReason})
	}
	for {
		p := c.pending.Load()
		if p == 0 || p+c.assembling <= limit/2 {
			break
		}
		select {
		case <-c.drained:
		case <-c.ctx.Done():
			return // closing: the reader goes on to read the close handshake
		case <-c.w.done:
			return // the socket failed: the next read says so
		}
	}
	c.log.Debug("reading resumed", zap.Int64("pending", c.pending.Load()))
	if c.blockNotify {
		c.w.method(0, &wire.ConnectionUnblocked{})
	}
}

func (c *conn) openChannel(id uint16) {
	ch := newChannel(c, id)
	c.channels[id] = &slot{ch: ch}
	c.chWG.Add(1)
	go func() {
		defer c.chWG.Done()
		ch.run()
	}()
	c.w.method(id, &wire.ChannelOpenOk{})
}

// own records an exclusive queue, deleted when the connection ends.
func (c *conn) own(q *queue) {
	c.ownedMu.Lock()
	c.owned[q] = struct{}{}
	c.ownedMu.Unlock()
}

func (c *conn) disown(q *queue) {
	c.ownedMu.Lock()
	delete(c.owned, q)
	c.ownedMu.Unlock()
}
