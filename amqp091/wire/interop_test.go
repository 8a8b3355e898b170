package wire_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"reflect"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/kubemq-io/kubemq-proxy/amqp091/wire"
)

// These tests run the real amqp091-go client against a tiny scripted server
// built only from this package's public API. They prove the codec
// interoperates: handshake, channel open, publish with every header type and
// a body split over several frames, consume + deliver, ack, a channel error,
// connection close, and a refused login.

const interopFrameMax = wire.FrameMinSize // small, so bodies span frames

// peer is the server side of one scripted connection.
type peer struct {
	conn net.Conn
	fr   *wire.FrameReader
	fw   *wire.FrameWriter
}

func newPeer(conn net.Conn) *peer {
	return &peer{
		conn: conn,
		fr:   wire.NewFrameReader(bufio.NewReader(conn), wire.FrameMinSize),
		fw:   wire.NewFrameWriter(bufio.NewWriter(conn), wire.FrameMinSize),
	}
}

// frame reads the next non-heartbeat frame.
func (p *peer) frame() (wire.Frame, error) {
	for {
		f, err := p.fr.ReadFrame()
		if err != nil || f.Type != wire.FrameHeartbeat {
			return f, err
		}
	}
}

// expect reads a method frame and checks its type and channel.
func expect[M wire.Method](p *peer, channel uint16) (M, error) {
	var zero M
	f, err := p.frame()
	if err != nil {
		return zero, err
	}
	if f.Type != wire.FrameMethod || f.Channel != channel {
		return zero, fmt.Errorf("got %s, want a method frame on channel %d", f, channel)
	}
	m, err := wire.DecodeMethod(f.Payload)
	if err != nil {
		return zero, err
	}
	got, ok := m.(M)
	if !ok {
		return zero, fmt.Errorf("got %s, want %T", m, zero)
	}
	return got, nil
}

// content reads a content header and the body frames it announces.
func (p *peer) content(channel uint16) (wire.ContentHeader, []byte, error) {
	f, err := p.frame()
	if err != nil {
		return wire.ContentHeader{}, nil, err
	}
	if f.Type != wire.FrameHeader || f.Channel != channel {
		return wire.ContentHeader{}, nil, fmt.Errorf("got %s, want a header frame", f)
	}
	h, err := wire.DecodeContentHeader(f.Payload)
	if err != nil {
		return h, nil, err
	}
	var body []byte
	for uint64(len(body)) < h.BodySize {
		f, err := p.frame()
		if err != nil {
			return h, nil, err
		}
		if f.Type != wire.FrameBody || f.Channel != channel {
			return h, nil, fmt.Errorf("got %s, want a body frame", f)
		}
		body = append(body, f.Payload...)
	}
	return h, body, nil
}

func (p *peer) send(channel uint16, m wire.Method) error {
	if err := p.fw.WriteMethod(channel, m); err != nil {
		return err
	}
	return p.fw.Flush()
}

// handshake runs the server side of start .. open-ok like RabbitMQ 3.10.
func (p *peer) handshake() error {
	if err := wire.ReadProtocolHeader(p.conn); err != nil {
		return err
	}
	err := p.send(0, &wire.ConnectionStart{
		VersionMajor: 0, VersionMinor: 9,
		ServerProperties: wire.Table{
			"product": "kubemq-proxy", "version": "test", "platform": "Go",
			"capabilities": wire.Table{
				"publisher_confirms": true, "basic.nack": true, "consumer_cancel_notify": true,
				"authentication_failure_close": true, "per_consumer_qos": true,
			},
		},
		Mechanisms: "AMQPLAIN PLAIN",
		Locales:    "en_US",
	})
	if err != nil {
		return err
	}
	so, err := expect[*wire.ConnectionStartOk](p, 0)
	if err != nil {
		return err
	}
	if so.Mechanism != "PLAIN" || so.Response != "\x00guest\x00guest" || so.Locale != "en_US" {
		return fmt.Errorf("start-ok %s with response %q", so, so.Response)
	}
	if _, ok := so.ClientProperties["product"].(string); !ok {
		return fmt.Errorf("client properties lack product: %v", so.ClientProperties)
	}
	if caps, _ := so.ClientProperties["capabilities"].(wire.Table); caps["consumer_cancel_notify"] != true {
		return fmt.Errorf("client capabilities: %v", so.ClientProperties["capabilities"])
	}
	if err := p.send(0, &wire.ConnectionTune{ChannelMax: 2047, FrameMax: interopFrameMax, Heartbeat: 60}); err != nil {
		return err
	}
	to, err := expect[*wire.ConnectionTuneOk](p, 0)
	if err != nil {
		return err
	}
	if to.ChannelMax != 2047 || to.FrameMax != interopFrameMax {
		return fmt.Errorf("tune-ok %s", to)
	}
	p.fr.SetFrameMax(to.FrameMax)
	p.fw.SetFrameMax(to.FrameMax)
	open, err := expect[*wire.ConnectionOpen](p, 0)
	if err != nil {
		return err
	}
	if open.VirtualHost != "/" {
		return fmt.Errorf("open %s", open)
	}
	return p.send(0, &wire.ConnectionOpenOk{})
}

// deliverHeaders holds every field type; clientHeaders is the same data as
// amqp091-go represents it.
var deliverHeaders = wire.Table{
	"bool": true, "int8": int8(-8), "uint8": uint8(8), "int16": int16(-16), "uint16": uint16(16),
	"int32": int32(-32), "uint32": uint32(32), "int64": int64(-64), "float32": float32(3.5),
	"float64": 6.25, "decimal": wire.Decimal{Scale: 2, Value: 314}, "string": "s", "bytes": []byte{0, 1},
	"array": []any{"a", int32(1), wire.Table{"n": true}}, "time": time.Unix(1700000000, 0).UTC(),
	"table": wire.Table{"k": "v"}, "void": nil,
}

var clientHeaders = amqp.Table{
	"bool": true, "int8": int8(-8), "uint8": uint8(8), "int16": int16(-16), "uint16": uint16(16),
	"int32": int32(-32), "uint32": uint32(32), "int64": int64(-64), "float32": float32(3.5),
	"float64": 6.25, "decimal": amqp.Decimal{Scale: 2, Value: 314}, "string": "s", "bytes": []byte{0, 1},
	"array": []any{"a", int32(1), amqp.Table{"n": true}}, "time": time.Unix(1700000000, 0).UTC(),
	"table": amqp.Table{"k": "v"}, "void": nil,
}

func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// serve accepts one connection and runs script on it in a goroutine whose
// result the returned channel delivers; the deadline keeps a broken script
// from hanging the test.
func serve(t *testing.T, ln net.Listener, script func(*peer) error) <-chan error {
	done := make(chan error, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			done <- err
			return
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(20 * time.Second))
		done <- script(newPeer(conn))
	}()
	return done
}

func TestInteropAmqp091Go(t *testing.T) {
	ln := listen(t)
	publishBody := bytes.Repeat([]byte("0123456789abcdef"), 700) // 11200 bytes: 3 body frames
	deliverBody := bytes.Repeat([]byte("fedcba9876543210"), 600)

	type published struct {
		m    *wire.BasicPublish
		h    wire.ContentHeader
		body []byte
	}
	pubCh := make(chan published, 1)
	ackCh := make(chan *wire.BasicAck, 1)

	done := serve(t, ln, func(p *peer) error {
		if err := p.handshake(); err != nil {
			return fmt.Errorf("handshake: %w", err)
		}
		if _, err := expect[*wire.ChannelOpen](p, 1); err != nil {
			return err
		}
		if err := p.send(1, &wire.ChannelOpenOk{}); err != nil {
			return err
		}

		// Publish: method, header, body frames.
		pm, err := expect[*wire.BasicPublish](p, 1)
		if err != nil {
			return err
		}
		h, body, err := p.content(1)
		if err != nil {
			return err
		}
		pubCh <- published{pm, h, body}

		// Consume, then deliver a message with every header type.
		cm, err := expect[*wire.BasicConsume](p, 1)
		if err != nil {
			return err
		}
		if err := p.send(1, &wire.BasicConsumeOk{ConsumerTag: cm.ConsumerTag}); err != nil {
			return err
		}
		props := wire.Properties{
			ContentType: "application/octet-stream", ContentEncoding: "identity", Headers: deliverHeaders,
			DeliveryMode: 2, Priority: 7, CorrelationID: "corr", ReplyTo: "reply", Expiration: "1000",
			MessageID: "mid", Timestamp: time.Unix(1700000001, 0).UTC(), Type: "type", UserID: "guest", AppID: "app",
		}
		props.FlagNonZero()
		err = p.fw.WriteContent(1, &wire.BasicDeliver{
			ConsumerTag: cm.ConsumerTag, DeliveryTag: 42, Redelivered: true, Exchange: "amq.direct", RoutingKey: "rk",
		}, &props, deliverBody)
		if err != nil {
			return err
		}
		if err := p.fw.Flush(); err != nil {
			return err
		}
		ack, err := expect[*wire.BasicAck](p, 1)
		if err != nil {
			return err
		}
		ackCh <- ack

		// A channel error, RabbitMQ style.
		qd, err := expect[*wire.QueueDeclare](p, 1)
		if err != nil {
			return err
		}
		if !qd.Passive || qd.Queue != "probe.missing" {
			return fmt.Errorf("queue.declare %s", qd)
		}
		e := wire.NotFound("no queue '%s' in vhost '%s'", qd.Queue, "/").OnMethod(qd.ClassID(), qd.MethodID())
		if err := p.send(1, e.CloseMethod()); err != nil {
			return err
		}
		if _, err := expect[*wire.ChannelCloseOk](p, 1); err != nil {
			return err
		}

		// Client closes the connection.
		cc, err := expect[*wire.ConnectionClose](p, 0)
		if err != nil {
			return err
		}
		if cc.ReplyCode != wire.ReplySuccess {
			return fmt.Errorf("connection.close %s", cc)
		}
		return p.send(0, &wire.ConnectionCloseOk{})
	})

	conn, err := amqp.DialConfig("amqp://guest:guest@"+ln.Addr().String()+"/", amqp.Config{Locale: "en_US"})
	if err != nil {
		t.Fatalf("dial: %v (server: %v)", err, serverErr(done))
	}
	if conn.Properties["product"] != "kubemq-proxy" || conn.Major != 0 || conn.Minor != 9 {
		t.Errorf("server properties as the client sees them: %v %d-%d", conn.Properties, conn.Major, conn.Minor)
	}
	if conn.Config.FrameSize != interopFrameMax || conn.Config.ChannelMax != 2047 {
		t.Errorf("negotiated frame %d channels %d", conn.Config.FrameSize, conn.Config.ChannelMax)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("channel: %v (server: %v)", err, serverErr(done))
	}

	ts := time.Unix(1700000002, 0)
	err = ch.PublishWithContext(context.Background(), "ex", "a.b", true, false, amqp.Publishing{
		Headers: clientHeaders, ContentType: "text/plain", ContentEncoding: "utf-8", DeliveryMode: amqp.Persistent,
		Priority: 3, CorrelationId: "c1", ReplyTo: "r1", Expiration: "5000", MessageId: "m1", Timestamp: ts,
		Type: "t1", UserId: "guest", AppId: "a1", Body: publishBody,
	})
	if err != nil {
		t.Fatalf("publish: %v", err)
	}
	var pub published
	select {
	case pub = <-pubCh:
	case err := <-done:
		t.Fatalf("server ended before the publish arrived: %v", err)
	}
	if *pub.m != (wire.BasicPublish{Exchange: "ex", RoutingKey: "a.b", Mandatory: true}) {
		t.Errorf("publish method %s", pub.m)
	}
	if !bytes.Equal(pub.body, publishBody) {
		t.Errorf("publish body: %d bytes, want %d", len(pub.body), len(publishBody))
	}
	// The client's amqp.Table/amqp.Decimal values arrive as their wire twins.
	wantHeaders := deliverHeaders
	gotProps := pub.h.Properties
	wantProps := wire.Properties{
		ContentType: "text/plain", ContentEncoding: "utf-8", Headers: wantHeaders, DeliveryMode: 2,
		Priority: 3, CorrelationID: "c1", ReplyTo: "r1", Expiration: "5000", MessageID: "m1", Timestamp: ts.UTC(),
		Type: "t1", UserID: "guest", AppID: "a1",
	}
	wantProps.FlagNonZero()
	if !reflect.DeepEqual(gotProps, wantProps) {
		t.Errorf("publish properties\n got %+v\nwant %+v", gotProps, wantProps)
	}

	deliveries, err := ch.Consume("q", "ctag-1", false, false, false, false, nil)
	if err != nil {
		t.Fatalf("consume: %v (server: %v)", err, serverErr(done))
	}
	var d amqp.Delivery
	select {
	case d = <-deliveries:
	case err := <-done:
		t.Fatalf("server ended before delivering: %v", err)
	}
	if d.ConsumerTag != "ctag-1" || d.DeliveryTag != 42 || !d.Redelivered || d.Exchange != "amq.direct" || d.RoutingKey != "rk" {
		t.Errorf("delivery fields %+v", d)
	}
	if !bytes.Equal(d.Body, deliverBody) {
		t.Errorf("delivery body: %d bytes, want %d", len(d.Body), len(deliverBody))
	}
	if d.ContentType != "application/octet-stream" || d.ContentEncoding != "identity" || d.DeliveryMode != 2 ||
		d.Priority != 7 || d.CorrelationId != "corr" || d.ReplyTo != "reply" || d.Expiration != "1000" ||
		d.MessageId != "mid" || !d.Timestamp.Equal(time.Unix(1700000001, 0)) || d.Type != "type" ||
		d.UserId != "guest" || d.AppId != "app" {
		t.Errorf("delivery properties %+v", d)
	}
	// amqp091-go decodes timestamps in time.Local; compare the instant.
	if tm, ok := d.Headers["time"].(time.Time); ok {
		d.Headers["time"] = tm.UTC()
	}
	if !reflect.DeepEqual(d.Headers, clientHeaders) {
		t.Errorf("delivery headers\n got %#v\nwant %#v", d.Headers, clientHeaders)
	}
	if err := d.Ack(false); err != nil {
		t.Fatalf("ack: %v", err)
	}
	select {
	case ack := <-ackCh:
		if *ack != (wire.BasicAck{DeliveryTag: 42}) {
			t.Errorf("ack %s", ack)
		}
	case err := <-done:
		t.Fatalf("server ended before the ack: %v", err)
	}

	_, err = ch.QueueDeclarePassive("probe.missing", false, false, false, false, nil)
	var ae *amqp.Error
	if !errors.As(err, &ae) || ae.Code != 404 || ae.Reason != "NOT_FOUND - no queue 'probe.missing' in vhost '/'" || ae.Server != true {
		t.Errorf("passive declare of a missing queue: %#v", err)
	}

	if err := conn.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatalf("server script: %v", err)
	}
}

// A refused login, as RabbitMQ does it with authentication_failure_close:
// connection.close 403 in answer to start-ok. amqp091-go surfaces the reply.
func TestInteropRefusedLogin(t *testing.T) {
	ln := listen(t)
	const text = "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. For details see the broker logfile."
	done := serve(t, ln, func(p *peer) error {
		if err := wire.ReadProtocolHeader(p.conn); err != nil {
			return err
		}
		if err := p.send(0, &wire.ConnectionStart{VersionMinor: 9, Mechanisms: "PLAIN", Locales: "en_US",
			ServerProperties: wire.Table{"capabilities": wire.Table{"authentication_failure_close": true}}}); err != nil {
			return err
		}
		if _, err := expect[*wire.ConnectionStartOk](p, 0); err != nil {
			return err
		}
		e := wire.AccessRefused("Login was refused using authentication mechanism PLAIN. For details see the broker logfile.")
		e.Hard = true
		if err := p.send(0, e.CloseMethod()); err != nil {
			return err
		}
		_, err := expect[*wire.ConnectionCloseOk](p, 0)
		return err
	})
	_, err := amqp.DialConfig("amqp://guest:wrong@"+ln.Addr().String()+"/", amqp.Config{Locale: "en_US"})
	var ae *amqp.Error
	if !errors.As(err, &ae) || ae.Code != 403 || ae.Reason != text {
		t.Errorf("dial with a refused login: %#v", err)
	}
	if err := <-done; err != nil {
		t.Fatalf("server script: %v", err)
	}
}

// A client speaking another protocol version gets a typed error, so the
// server can answer with its own header.
func TestInteropWrongProtocolHeader(t *testing.T) {
	ln := listen(t)
	done := serve(t, ln, func(p *peer) error {
		err := wire.ReadProtocolHeader(p.conn)
		if !errors.Is(err, wire.ErrProtocolHeader) {
			return fmt.Errorf("ReadProtocolHeader: %v", err)
		}
		_, err = p.conn.Write(wire.ProtocolHeader[:])
		return err
	})
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := c.Write([]byte("AMQP\x00\x00\x09\x00")); err != nil {
		t.Fatal(err)
	}
	var got [8]byte
	if _, err := io.ReadFull(c, got[:]); err != nil || got != wire.ProtocolHeader {
		t.Errorf("server answered %q, %v", got[:], err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// serverErr reports the script's result if it has ended, for failure messages.
func serverErr(done <-chan error) error {
	select {
	case err := <-done:
		return err
	default:
		return errors.New("still running")
	}
}

// amqp091-go's AMQPLAIN response is table entries without a length prefix;
// DecodeTableFields reads it.
func TestInteropAMQPlainResponse(t *testing.T) {
	auth := &amqp.AMQPlainAuth{Username: "user", Password: "pa\x00ss"}
	got, err := wire.DecodeTableFields([]byte(auth.Response()))
	if err != nil || !reflect.DeepEqual(got, wire.Table{"LOGIN": "user", "PASSWORD": "pa\x00ss"}) {
		t.Fatalf("got %#v, %v", got, err)
	}
}
