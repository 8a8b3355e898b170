package amqp091

import (
	"bufio"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/kubemq-io/kubemq-proxy/amqp091/wire"
)

// peer is a scripted AMQP client speaking raw frames, for input no real
// client library would send.
type peer struct {
	t  testing.TB
	nc net.Conn
	fr *wire.FrameReader
	bw *bufio.Writer
	fw *wire.FrameWriter
}

func (e *env) rawDial() *peer { return e.rawDialFor(e.t) }

func (e *env) rawDialFor(t testing.TB) *peer {
	t.Helper()
	nc, err := net.Dial("tcp", e.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	nc.SetDeadline(time.Now().Add(20 * time.Second)) // nothing may hang
	bw := bufio.NewWriter(nc)
	return &peer{t: t, nc: nc, fr: wire.NewFrameReader(bufio.NewReader(nc), 1<<20), bw: bw, fw: wire.NewFrameWriter(bw, 1<<20)}
}

func (p *peer) raw(b []byte) {
	p.t.Helper()
	if _, err := p.nc.Write(b); err != nil {
		p.t.Fatal(err)
	}
}

func (p *peer) send(channel uint16, m wire.Method) {
	p.t.Helper()
	if err := p.fw.WriteMethod(channel, m); err != nil {
		p.t.Fatal(err)
	}
	if err := p.fw.Flush(); err != nil {
		p.t.Fatal(err)
	}
}

func (p *peer) frame(typ wire.FrameType, channel uint16, payload []byte) {
	p.t.Helper()
	p.raw(wire.AppendFrame(nil, typ, channel, payload))
}

// recv reads the next method, skipping heartbeats.
func (p *peer) recv() wire.Method {
	p.t.Helper()
	for {
		f, err := p.fr.ReadFrame()
		if err != nil {
			p.t.Fatalf("read: %v", err)
		}
		if f.Type == wire.FrameHeartbeat {
			continue
		}
		if f.Type != wire.FrameMethod {
			p.t.Fatalf("got %s, want a method", f)
		}
		m, err := wire.DecodeMethod(f.Payload)
		if err != nil {
			p.t.Fatal(err)
		}
		return m
	}
}

// open performs the handshake with PLAIN guest/guest and the given
// client capabilities.
func (p *peer) open(vhost string, caps wire.Table) {
	p.t.Helper()
	p.raw(wire.ProtocolHeader[:])
	start, ok := p.recv().(*wire.ConnectionStart)
	if !ok || start.Mechanisms != "AMQPLAIN PLAIN" || start.Locales != "en_US" {
		p.t.Fatalf("connection.start: %+v", start)
	}
	p.send(0, &wire.ConnectionStartOk{ClientProperties: wire.Table{"capabilities": caps}, Mechanism: "PLAIN", Response: "\x00guest\x00guest", Locale: "en_US"})
	if _, ok := p.recv().(*wire.ConnectionTune); !ok {
		p.t.Fatal("no tune")
	}
	p.send(0, &wire.ConnectionTuneOk{ChannelMax: 10, FrameMax: 131072, Heartbeat: 0})
	p.send(0, &wire.ConnectionOpen{VirtualHost: vhost})
	if m, ok := p.recv().(*wire.ConnectionOpenOk); !ok {
		p.t.Fatalf("open: %v", m)
	}
}

// openAs performs the handshake with PLAIN guest/guest, proposing
// channelMax, on the proxy or RabbitMQ alike (their mechanism lists
// differ in order).
func (p *peer) openAs(vhost string, channelMax uint16) {
	p.t.Helper()
	p.raw(wire.ProtocolHeader[:])
	if _, ok := p.recv().(*wire.ConnectionStart); !ok {
		p.t.Fatal("no connection.start")
	}
	p.send(0, &wire.ConnectionStartOk{Mechanism: "PLAIN", Response: "\x00guest\x00guest", Locale: "en_US"})
	if _, ok := p.recv().(*wire.ConnectionTune); !ok {
		p.t.Fatal("no tune")
	}
	p.send(0, &wire.ConnectionTuneOk{ChannelMax: channelMax, FrameMax: 131072, Heartbeat: 0})
	p.send(0, &wire.ConnectionOpen{VirtualHost: vhost})
	if m, ok := p.recv().(*wire.ConnectionOpenOk); !ok {
		p.t.Fatalf("open: %v", m)
	}
}

func (p *peer) openChannel(id uint16) {
	p.t.Helper()
	p.send(id, &wire.ChannelOpen{})
	if m, ok := p.recv().(*wire.ChannelOpenOk); !ok {
		p.t.Fatalf("channel.open: %v", m)
	}
}

// expectClose waits for connection.close with code, answers close-ok and
// checks the server hangs up.
func (p *peer) expectClose(code uint16, textPrefix string) {
	p.t.Helper()
	m := p.recv()
	cl, ok := m.(*wire.ConnectionClose)
	if !ok {
		p.t.Fatalf("got %v, want connection.close %d", m, code)
	}
	if cl.ReplyCode != code || !strings.HasPrefix(cl.ReplyText, textPrefix) {
		p.t.Fatalf("connection.close %d %q, want %d %q...", cl.ReplyCode, cl.ReplyText, code, textPrefix)
	}
	p.send(0, &wire.ConnectionCloseOk{})
	p.expectEOF()
}

func (p *peer) expectEOF() {
	p.t.Helper()
	for {
		_, err := p.fr.ReadFrame()
		if err == nil {
			continue
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
			strings.Contains(err.Error(), "reset by peer") {
			return
		}
		p.t.Fatalf("want the server to hang up, got %v", err)
	}
}

func TestRawProtocolHeader(t *testing.T) {
	e := newEnv(t)
	for _, hdr := range []string{"AMQP\x00\x00\x09\x00", "AMQP\x00\x01\x00\x00", "GET / HT"} {
		p := e.rawDial()
		p.raw([]byte(hdr))
		got := make([]byte, 8)
		if _, err := io.ReadFull(p.nc, got); err != nil {
			t.Fatalf("%q: %v", hdr, err)
		}
		if string(got) != "AMQP\x00\x00\x09\x01" {
			t.Fatalf("%q: answered %q", hdr, got)
		}
		if n, err := p.nc.Read(got); err == nil {
			t.Fatalf("%q: %d more bytes, want close", hdr, n)
		}
	}
}

func TestRawMalformedInput(t *testing.T) {
	e := newEnv(t)
	publish, _ := wire.AppendMethod(nil, &wire.BasicPublish{RoutingKey: "q"})
	header := func(size uint64) []byte {
		b, _ := wire.AppendContentHeader(nil, &wire.ContentHeader{ClassID: wire.ClassBasic, BodySize: size})
		return b
	}
	cases := []struct {
		name   string
		script func(p *peer)
		code   uint16
		text   string
	}{
		{"bad frame end", func(p *peer) {
			b := wire.AppendFrame(nil, wire.FrameMethod, 1, publish)
			b[len(b)-1] = 0x00
			p.raw(b)
		}, 501, "FRAME_ERROR"},
		{"oversize frame", func(p *peer) {
			var hdr [7]byte
			hdr[0] = byte(wire.FrameBody)
			binary.BigEndian.PutUint16(hdr[1:], 1)
			binary.BigEndian.PutUint32(hdr[3:], 500000)
			p.raw(hdr[:])
		}, 501, "FRAME_ERROR"},
		{"unknown frame type", func(p *peer) {
			p.raw([]byte{9, 0, 1, 0, 0, 0, 0, wire.FrameEnd})
		}, 501, "FRAME_ERROR"},
		{"method on an unopened channel", func(p *peer) {
			p.send(5, &wire.QueueDeclare{Queue: "x"})
		}, 504, "CHANNEL_ERROR - expected 'channel.open'"},
		{"second channel.open", func(p *peer) {
			p.send(1, &wire.ChannelOpen{})
		}, 504, "CHANNEL_ERROR - second 'channel.open' seen"},
		{"header without publish", func(p *peer) {
			p.frame(wire.FrameHeader, 1, header(1))
		}, 505, "UNEXPECTED_FRAME"},
		{"body without header", func(p *peer) {
			p.frame(wire.FrameMethod, 1, publish)
			p.frame(wire.FrameBody, 1, []byte("x"))
		}, 505, "UNEXPECTED_FRAME"},
		{"method instead of header", func(p *peer) {
			p.frame(wire.FrameMethod, 1, publish)
			p.send(1, &wire.BasicQos{PrefetchCount: 1})
		}, 505, "UNEXPECTED_FRAME - expected content header for class 60"},
		{"method instead of body", func(p *peer) {
			p.frame(wire.FrameMethod, 1, publish)
			p.frame(wire.FrameHeader, 1, header(5))
			p.send(1, &wire.BasicQos{PrefetchCount: 1})
		}, 505, "UNEXPECTED_FRAME - expected content body"},
		{"body longer than declared", func(p *peer) {
			p.frame(wire.FrameMethod, 1, publish)
			p.frame(wire.FrameHeader, 1, header(2))
			p.frame(wire.FrameBody, 1, []byte("xyz"))
		}, 505, "UNEXPECTED_FRAME"},
		{"unknown class", func(p *peer) {
			p.frame(wire.FrameMethod, 1, []byte{0x03, 0xe7, 0, 10})
		}, 503, "COMMAND_INVALID"},
		{"truncated arguments", func(p *peer) {
			p.frame(wire.FrameMethod, 1, []byte{0, 50, 0, 10, 0})
		}, 502, "SYNTAX_ERROR"},
		{"server-only method from the client", func(p *peer) {
			p.send(1, &wire.BasicDeliver{ConsumerTag: "x"})
		}, 503, "COMMAND_INVALID"},
		{"heartbeat on a channel", func(p *peer) {
			p.frame(wire.FrameHeartbeat, 1, nil)
		}, 501, "FRAME_ERROR"},
		{"content on channel 0", func(p *peer) {
			p.frame(wire.FrameBody, 0, []byte("x"))
		}, 505, "UNEXPECTED_FRAME"},
		{"channel method on channel 0", func(p *peer) {
			p.send(0, &wire.QueueDeclare{Queue: "x"})
		}, 503, "COMMAND_INVALID"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := e.rawDial()
			p.t = t
			p.open(e.vhost, nil)
			p.openChannel(1)
			c.script(p)
			p.expectClose(c.code, c.text)
		})
	}
}

func TestRawOversizedBodyIsAChannelError(t *testing.T) {
	e := newEnv(t, func(o *Options) { o.MaxBodySize = 10 })
	p := e.rawDial()
	p.open(e.vhost, nil)
	p.openChannel(1)
	publish, _ := wire.AppendMethod(nil, &wire.BasicPublish{RoutingKey: "q"})
	hdr, _ := wire.AppendContentHeader(nil, &wire.ContentHeader{ClassID: wire.ClassBasic, BodySize: 20})
	p.frame(wire.FrameMethod, 1, publish)
	p.frame(wire.FrameHeader, 1, hdr)
	p.frame(wire.FrameBody, 1, make([]byte, 20))
	cl, ok := p.recv().(*wire.ChannelClose)
	if !ok || cl.ReplyCode != 406 || cl.ReplyText != "PRECONDITION_FAILED - message size 20 is larger than configured max size 10" {
		t.Fatalf("got %+v", cl)
	}
	p.send(1, &wire.ChannelCloseOk{})
	// The connection is still usable.
	p.openChannel(1)
}

func TestRawLogin(t *testing.T) {
	e := newEnv(t, func(o *Options) {
		o.Users = map[string]string{"guest": "guest"}
		o.Vhosts = []string{"/", "only"}
	})
	handshake := func(p *peer, mech, resp string, caps wire.Table) {
		p.raw(wire.ProtocolHeader[:])
		p.recv()
		p.send(0, &wire.ConnectionStartOk{ClientProperties: wire.Table{"capabilities": caps}, Mechanism: mech, Response: resp, Locale: "en_US"})
	}
	// Wrong password, client with authentication_failure_close: 403.
	p := e.rawDial()
	handshake(p, "PLAIN", "\x00guest\x00nope", wire.Table{"authentication_failure_close": true})
	p.expectClose(403, "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. For details see the broker logfile.")
	// Without the capability: the socket just closes.
	p = e.rawDial()
	handshake(p, "PLAIN", "\x00guest\x00nope", nil)
	p.expectEOF()
	// Unknown mechanism.
	p = e.rawDial()
	handshake(p, "EXTERNAL", "", nil)
	p.expectClose(503, "COMMAND_INVALID - unknown authentication mechanism 'EXTERNAL'")
	// AMQPLAIN works, and an unknown vhost is 530.
	p = e.rawDial()
	tbl, _ := wire.AppendTable(nil, wire.Table{"LOGIN": "guest", "PASSWORD": "guest"})
	handshake(p, "AMQPLAIN", string(tbl[4:]), nil)
	if _, ok := p.recv().(*wire.ConnectionTune); !ok {
		t.Fatal("AMQPLAIN login refused")
	}
	p.send(0, &wire.ConnectionTuneOk{ChannelMax: 0, FrameMax: 0, Heartbeat: 0})
	p.send(0, &wire.ConnectionOpen{VirtualHost: "novhost"})
	p.expectClose(530, "NOT_ALLOWED - vhost novhost not found")
	// "/" is allowed.
	p = e.rawDial()
	p.open("/", nil)
}

func TestRawTuneLimits(t *testing.T) {
	e := newEnv(t)
	p := e.rawDial()
	p.raw(wire.ProtocolHeader[:])
	start := p.recv().(*wire.ConnectionStart)
	caps, _ := start.ServerProperties["capabilities"].(wire.Table)
	for _, c := range []string{"publisher_confirms", "exchange_exchange_bindings", "basic.nack", "consumer_cancel_notify",
		"authentication_failure_close", "per_consumer_qos", "connection.blocked", "consumer_priorities", "direct_reply_to"} {
		if caps[c] != true {
			t.Errorf("capability %s missing", c)
		}
	}
	p.send(0, &wire.ConnectionStartOk{Mechanism: "PLAIN", Response: "\x00guest\x00guest", Locale: "en_US"})
	tune := p.recv().(*wire.ConnectionTune)
	if tune.ChannelMax != 2047 || tune.FrameMax != 131072 || tune.Heartbeat != 60 {
		t.Fatalf("tune %+v", tune)
	}
	p.send(0, &wire.ConnectionTuneOk{ChannelMax: 0, FrameMax: 200000, Heartbeat: 60})
	p.expectClose(530, "NOT_ALLOWED - negotiated frame_max = 200000 is higher than the maximum allowed value (131072)")
}

// A client that negotiated heartbeats and then goes silent is dropped after
// two intervals; the server's own heartbeats arrive meanwhile.
func TestRawMissedHeartbeats(t *testing.T) {
	e := newEnv(t)
	p := e.rawDial()
	p.raw(wire.ProtocolHeader[:])
	p.recv()
	p.send(0, &wire.ConnectionStartOk{Mechanism: "PLAIN", Response: "\x00guest\x00guest", Locale: "en_US"})
	p.recv()
	p.send(0, &wire.ConnectionTuneOk{ChannelMax: 0, FrameMax: 0, Heartbeat: 1})
	p.send(0, &wire.ConnectionOpen{VirtualHost: e.vhost})
	p.recv()
	start := time.Now()
	heartbeats := 0
	for {
		f, err := p.fr.ReadFrame()
		if err != nil {
			break
		}
		if f.Type == wire.FrameHeartbeat {
			heartbeats++
		}
	}
	if d := time.Since(start); d < 1500*time.Millisecond || d > 10*time.Second {
		t.Fatalf("dropped after %v, want about 2s", d)
	}
	if heartbeats == 0 {
		t.Fatal("server sent no heartbeats")
	}
}

// FuzzConnection feeds arbitrary bytes to an open connection (after the
// handshake and channel.open) and half-closes: the server must neither
// panic nor hang, whatever it makes of them.
func FuzzConnection(f *testing.F) {
	frame := func(typ wire.FrameType, ch uint16, m wire.Method) []byte {
		p, _ := wire.AppendMethod(nil, m)
		return wire.AppendFrame(nil, typ, ch, p)
	}
	hdr := func(size uint64) []byte {
		b, _ := wire.AppendContentHeader(nil, &wire.ContentHeader{ClassID: wire.ClassBasic, BodySize: size,
			Properties: wire.Properties{Flags: wire.FlagHeaders, Headers: wire.Table{"a": int32(1)}}})
		return wire.AppendFrame(nil, wire.FrameHeader, 1, b)
	}
	var publish []byte
	publish = append(publish, frame(wire.FrameMethod, 1, &wire.QueueDeclare{Queue: "fz"})...)
	publish = append(publish, frame(wire.FrameMethod, 1, &wire.BasicPublish{RoutingKey: "fz", Mandatory: true})...)
	publish = append(publish, hdr(3)...)
	publish = append(publish, wire.AppendFrame(nil, wire.FrameBody, 1, []byte("abc"))...)
	f.Add(publish)
	f.Add(append(frame(wire.FrameMethod, 1, &wire.BasicConsume{Queue: "fz"}), frame(wire.FrameMethod, 1, &wire.BasicGet{Queue: "fz"})...))
	f.Add(frame(wire.FrameMethod, 1, &wire.ExchangeDeclare{Exchange: "x", Type: "topic"}))
	f.Add(append(frame(wire.FrameMethod, 1, &wire.ConfirmSelect{}), publish...))
	f.Add(frame(wire.FrameMethod, 0, &wire.ConnectionClose{ReplyCode: 200}))
	f.Add(frame(wire.FrameMethod, 1, &wire.ChannelClose{ReplyCode: 200}))
	f.Add(frame(wire.FrameMethod, 1, &wire.BasicAck{DeliveryTag: 1, Multiple: true}))
	f.Add([]byte{1, 0, 1, 0, 0, 0, 4, 0, 60, 0, 40, 0xce})
	f.Add([]byte{3, 0, 1, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte("AMQP\x00\x00\x09\x01"))
	e := newEnv(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		p := e.rawDialFor(t)
		p.open(e.vhost, nil)
		p.openChannel(1)
		p.nc.SetDeadline(time.Now().Add(20 * time.Second))
		p.raw(data)
		p.nc.(*net.TCPConn).CloseWrite()
		// Whatever it answered, the server must end the connection.
		if _, err := io.Copy(io.Discard, p.nc); err != nil && !strings.Contains(err.Error(), "reset by peer") {
			t.Fatalf("server did not close the connection: %v", err)
		}
	})
}

// A delivery that nothing follows is followed by a heartbeat within
// nudgeAfter when heartbeats are on (it wakes kombu's event loop, see
// writer.run), and by nothing when they are off.
func TestRawHeartbeatAfterDelivery(t *testing.T) {
	e := newEnv(t)
	ch := e.channel(e.dial())
	if _, err := ch.QueueDeclare("nudge", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	publishConfirmed(t, ch, "", "nudge", "a", "b")
	for _, hb := range []uint16{60, 0} {
		p := e.rawDial()
		p.raw(wire.ProtocolHeader[:])
		p.recv()
		p.send(0, &wire.ConnectionStartOk{Mechanism: "PLAIN", Response: "\x00guest\x00guest", Locale: "en_US"})
		p.recv()
		p.send(0, &wire.ConnectionTuneOk{FrameMax: 131072, Heartbeat: hb})
		p.send(0, &wire.ConnectionOpen{VirtualHost: e.vhost})
		p.recv()
		p.openChannel(1)
		p.send(1, &wire.BasicQos{PrefetchCount: 1})
		p.recv()
		p.send(1, &wire.BasicConsume{Queue: "nudge", ConsumerTag: "c"})
		p.recv() // consume-ok
		if m, ok := p.recv().(*wire.BasicDeliver); !ok {
			t.Fatalf("heartbeat %d: got %v, want a delivery", hb, m)
		}
		for range 2 { // header and body
			if _, err := p.fr.ReadFrame(); err != nil {
				t.Fatal(err)
			}
		}
		// The periodic heartbeat is 30 s away: a frame within a second is the nudge.
		p.nc.SetReadDeadline(time.Now().Add(time.Second))
		f, err := p.fr.ReadFrame()
		switch {
		case hb > 0 && (err != nil || f.Type != wire.FrameHeartbeat):
			t.Fatalf("heartbeat %d: after the delivery got %v %v, want a heartbeat", hb, f, err)
		case hb == 0 && err == nil:
			t.Fatalf("heartbeats off: after the delivery got %v", f)
		}
		p.nc.Close()
	}
}
