package amqp091

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/kubemq-io/kubemq-proxy/amqp091/wire"
	"github.com/kubemq-io/kubemq-proxy/kubemqclient"
)

// gatedBackend holds every store until open is called: a KubeMQ that
// cannot keep up with the publishers.
type gatedBackend struct {
	backend
	gate chan struct{}
	once sync.Once
}

func newGatedBackend(b backend) *gatedBackend {
	return &gatedBackend{backend: b, gate: make(chan struct{})}
}

func (g *gatedBackend) open() { g.once.Do(func() { close(g.gate) }) }

func (g *gatedBackend) SendQueueMessages(ctx context.Context, msgs []kubemqclient.QueueMessage) ([]kubemqclient.SendResult, error) {
	select {
	case <-g.gate:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return g.backend.SendQueueMessages(ctx, msgs)
}

// gatedEnv is an env whose stores wait for the returned gate, with the
// given pending publish bound.
func gatedEnv(t *testing.T, limit int64, opts ...func(*Options)) (*env, *gatedBackend, *prometheus.Registry) {
	var g *gatedBackend
	reg := prometheus.NewRegistry()
	e := newEnv(t, append([]func(*Options){metricsEnv(reg), func(o *Options) {
		o.MaxPendingPublishBytes = limit
		g = newGatedBackend(o.Client)
		o.backend = g
	}}, opts...)...)
	t.Cleanup(g.open) // before the env's Shutdown (cleanups run last first)
	return e, g, reg
}

// A publisher that outruns KubeMQ is blocked (connection.blocked, as the
// client announced the capability), stays connected through heartbeats
// while blocked longer than the heartbeat timeout, is unblocked when the
// stores catch up, and every confirmed message is in the queue.
func TestPendingPublishBytesBlockAndUnblock(t *testing.T) {
	const limit, size, n = 64 << 10, 4 << 10, 64 // 256 KiB against a 64 KiB bound
	e, gate, reg := gatedEnv(t, limit, func(o *Options) {
		o.Heartbeat = 2 * time.Second
		o.Logger = zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)) // why a connection closed, if it does
	})
	c, err := amqp.DialConfig(e.url(), amqp.Config{Heartbeat: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if caps, _ := c.Properties["capabilities"].(amqp.Table); caps["connection.blocked"] != true {
		t.Fatalf("server capabilities %v lack connection.blocked", c.Properties["capabilities"])
	}
	// The client's reader waits while a notification cannot be handed
	// over: pass them on through an unbounded buffer (after the unblock
	// the backlog may block the connection again).
	notes := c.NotifyBlocked(make(chan amqp.Blocking))
	blocked := make(chan amqp.Blocking, 1000)
	go func() {
		for b := range notes {
			blocked <- b
		}
	}()
	closed := c.NotifyClose(make(chan *amqp.Error, 1))
	ch := e.channel(c)
	q, err := ch.QueueDeclare("bp", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	body := func(i int) []byte { return bytes.Repeat([]byte{byte('a' + i%26)}, size) }
	confirms := make(chan []*amqp.DeferredConfirmation, 1)
	go func() {
		var dcs []*amqp.DeferredConfirmation
		for i := range n {
			dc, err := ch.PublishWithDeferredConfirm("", q.Name, false, false, amqp.Publishing{Body: body(i), MessageId: fmt.Sprint(i)})
			if err != nil {
				t.Error(err)
				break
			}
			dcs = append(dcs, dc)
		}
		confirms <- dcs
	}()
	b := mustRecv(t, blocked, "connection.blocked")
	if !b.Active || b.Reason != blockedReason {
		t.Fatalf("got %+v, want blocked with reason %q", b, blockedReason)
	}
	if v := metricValue(t, reg, "blocked_connections"); v != 1 {
		t.Fatalf("blocked_connections = %v", v)
	}
	// Blocked for longer than the 4 s the server allows a silent client:
	// the connection must survive it (and the client must go on hearing
	// the server's heartbeats).
	time.Sleep(5 * time.Second)
	select {
	case err := <-closed:
		t.Fatalf("connection closed while blocked: %v", err)
	default:
	}
	gate.open()
	if b := mustRecv(t, blocked, "connection.unblocked"); b.Active {
		t.Fatalf("got %+v, want unblocked", b)
	}
	dcs := mustRecv(t, confirms, "publishes")
	if len(dcs) != n {
		t.Fatalf("%d publishes went out", len(dcs))
	}
	for i, dc := range dcs {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		ok, err := dc.WaitContext(ctx)
		cancel()
		if err != nil || !ok {
			t.Fatalf("confirm %d: %v %v", i, ok, err)
		}
	}
	// Blocked and unblocked alternate, ending unblocked.
	for last := false; ; {
		select {
		case b := <-blocked:
			if b.Active == last {
				t.Fatalf("blocked=%v twice in a row", b.Active)
			}
			last = b.Active
			continue
		default:
		}
		if last {
			b := mustRecv(t, blocked, "connection.unblocked")
			if b.Active {
				t.Fatal("blocked twice in a row")
			}
		}
		break
	}
	msgs, err := ch.Consume(q.Name, "", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		d := mustRecv(t, msgs, "delivery")
		if d.MessageId != fmt.Sprint(i) || !bytes.Equal(d.Body, body(i)) {
			t.Fatalf("delivery %d: id %s, %d bytes", i, d.MessageId, len(d.Body))
		}
	}
	if v := metricValue(t, reg, "blocked_connections"); v != 0 {
		t.Fatalf("blocked_connections = %v after unblock", v)
	}
	if p := serverConn(t, e).pending.Load(); p != 0 {
		t.Fatalf("%d pending bytes left", p)
	}
}

// serverConn returns the server's only connection.
func serverConn(t testing.TB, e *env) *conn {
	t.Helper()
	e.srv.mu.Lock()
	defer e.srv.mu.Unlock()
	if len(e.srv.conns) != 1 {
		t.Fatalf("%d connections", len(e.srv.conns))
	}
	for c := range e.srv.conns {
		return c
	}
	return nil
}

// A client that did not announce connection.blocked is only slowed down:
// the server stops reading it, sends no blocked or unblocked frame, and
// stores everything.
func TestPendingPublishBytesWithoutCapability(t *testing.T) {
	const limit, size, n = 16 << 10, 4 << 10, 32
	e, gate, reg := gatedEnv(t, limit)
	p := e.rawDial()
	p.open(e.vhost, wire.Table{"publisher_confirms": true})
	p.openChannel(1)
	p.send(1, &wire.QueueDeclare{Queue: "bp"})
	if m, ok := p.recv().(*wire.QueueDeclareOk); !ok {
		t.Fatalf("declare: %v", m)
	}
	p.send(1, &wire.ConfirmSelect{})
	if m, ok := p.recv().(*wire.ConfirmSelectOk); !ok {
		t.Fatalf("confirm.select: %v", m)
	}
	publish, _ := wire.AppendMethod(nil, &wire.BasicPublish{RoutingKey: "bp"})
	hdr, _ := wire.AppendContentHeader(nil, &wire.ContentHeader{ClassID: wire.ClassBasic, BodySize: size})
	var frames []byte
	for range n {
		frames = wire.AppendFrame(frames, wire.FrameMethod, 1, publish)
		frames = wire.AppendFrame(frames, wire.FrameHeader, 1, hdr)
		frames = wire.AppendFrame(frames, wire.FrameBody, 1, make([]byte, size))
	}
	wrote := make(chan error, 1)
	go func() {
		_, err := p.nc.Write(frames) // may wait for the server to read again
		wrote <- err
	}()
	eventually(t, "the connection to block", func() bool { return metricValue(t, reg, "blocked_connections") == 1 })
	gate.open()
	if err := mustRecv(t, wrote, "write"); err != nil {
		t.Fatal(err)
	}
	// Confirms only, then (the reader has resumed and read the declare)
	// the declare-ok: a blocked or unblocked frame would come before it.
	for acked := uint64(0); acked < n; {
		m, ok := p.recv().(*wire.BasicAck)
		if !ok {
			t.Fatalf("got %v, want basic.ack", m)
		}
		acked = m.DeliveryTag
	}
	p.send(1, &wire.QueueDeclare{Queue: "bp", Passive: true})
	m, ok := p.recv().(*wire.QueueDeclareOk)
	if !ok || m.MessageCount != n {
		t.Fatalf("got %v, want declare-ok with %d messages", m, n)
	}
}

// A body above the pending bound cannot wait for itself: content still
// arriving never blocks the reader, only complete publishes do.
func TestPendingPublishBytesBodyAboveLimit(t *testing.T) {
	e := newEnv(t, func(o *Options) { o.MaxPendingPublishBytes = 8 << 10 })
	c, err := amqp.DialConfig(e.url(), amqp.Config{FrameSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ch := e.channel(c)
	q, err := ch.QueueDeclare("", false, false, true, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	bodies := []string{string(bytes.Repeat([]byte("x"), 40<<10)), string(bytes.Repeat([]byte("y"), 40<<10)), "z"}
	publishConfirmed(t, ch, "", q.Name, bodies...)
	if got := drain(t, ch, q.Name); len(got) != 3 {
		t.Fatalf("%d messages", len(got))
	}
}

// An oversized body is refused on its content header: the channel closes
// before any body frame was sent (nothing of it is buffered), and body
// frames that arrive anyway are skipped.
func TestRawOversizedBodyRefusedOnHeader(t *testing.T) {
	e := newEnv(t, func(o *Options) { o.MaxBodySize = 10 })
	p := e.rawDial()
	p.open(e.vhost, nil)
	p.openChannel(1)
	publish, _ := wire.AppendMethod(nil, &wire.BasicPublish{RoutingKey: "q"})
	hdr, _ := wire.AppendContentHeader(nil, &wire.ContentHeader{ClassID: wire.ClassBasic, BodySize: 1 << 40})
	p.frame(wire.FrameMethod, 1, publish)
	p.frame(wire.FrameHeader, 1, hdr)
	cl, ok := p.recv().(*wire.ChannelClose)
	if !ok || cl.ReplyCode != 406 || cl.ReplyText != fmt.Sprintf("PRECONDITION_FAILED - message size %d is larger than configured max size 10", uint64(1<<40)) {
		t.Fatalf("got %+v", cl)
	}
	p.frame(wire.FrameBody, 1, make([]byte, 100)) // the start of the body, already on its way
	p.send(1, &wire.ChannelCloseOk{})
	p.openChannel(1)
	p.openChannel(2)
}

// Without a pending bound the server never blocks, so it does not
// announce connection.blocked.
func TestPendingPublishBytesOffNotAdvertised(t *testing.T) {
	e := newEnv(t, func(o *Options) { o.MaxPendingPublishBytes = -1 })
	c := e.dial()
	if caps, _ := c.Properties["capabilities"].(amqp.Table); caps["connection.blocked"] != nil || caps["publisher_confirms"] != true {
		t.Fatalf("capabilities %v", caps)
	}
}

// Publishes a closing channel discards give their pending bytes back: a
// leak would leave the reader blocked for good.
func TestPendingPublishBytesReleasedByClosingChannel(t *testing.T) {
	const limit, size, n = 16 << 10, 4 << 10, 20
	e := newEnv(t, func(o *Options) { o.MaxPendingPublishBytes = limit })
	p := e.rawDial()
	p.open(e.vhost, nil)
	p.openChannel(1)
	hdr, _ := wire.AppendContentHeader(nil, &wire.ContentHeader{ClassID: wire.ClassBasic, BodySize: size})
	var frames []byte
	for i := range n {
		x := ""
		if i == 0 {
			x = "nope" // 404: the channel closes and discards the rest
		}
		publish, _ := wire.AppendMethod(nil, &wire.BasicPublish{Exchange: x, RoutingKey: "q"})
		frames = wire.AppendFrame(frames, wire.FrameMethod, 1, publish)
		frames = wire.AppendFrame(frames, wire.FrameHeader, 1, hdr)
		frames = wire.AppendFrame(frames, wire.FrameBody, 1, make([]byte, size))
	}
	p.raw(frames)
	if cl, ok := p.recv().(*wire.ChannelClose); !ok || cl.ReplyCode != 404 {
		t.Fatalf("got %v, want channel.close 404", cl)
	}
	p.send(1, &wire.ChannelCloseOk{})
	p.openChannel(1)
	// close-ok frees the channel number at once (channel 1 opens again)
	// while the old channel still discards what was queued behind the
	// refused publish: its bytes come back shortly after, never not at all.
	c := serverConn(t, e)
	eventually(t, "pending bytes back to 0", func() bool { return c.pending.Load() == 0 })
}
