package amqp091

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"net"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	streadway "github.com/streadway/amqp"

	"github.com/kubemq-io/kubemq-proxy/amqp091/wire"
	"github.com/kubemq-io/kubemq-proxy/kubemqclient"
)

// selfSigned makes a certificate for localhost and a pool trusting it.
func selfSigned(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "localhost"},
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pool
}

func TestStreadwayClient(t *testing.T) {
	brokers(t, func(t *testing.T, e *env) {
		conn, err := streadway.Dial(e.url())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		if err := ch.ExchangeDeclare("logs", "topic", true, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
		q, err := ch.QueueDeclare("", false, true, true, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := ch.QueueBind(q.Name, "app.*", "logs", false, nil); err != nil {
			t.Fatal(err)
		}
		if err := ch.Confirm(false); err != nil {
			t.Fatal(err)
		}
		confirms := ch.NotifyPublish(make(chan streadway.Confirmation, 4))
		returns := ch.NotifyReturn(make(chan streadway.Return, 1))
		for _, key := range []string{"app.info", "app.debug", "other.info"} {
			if err := ch.Publish("logs", key, key == "other.info", false, streadway.Publishing{Body: []byte(key),
				Headers: streadway.Table{"k": "v"}}); err != nil {
				t.Fatal(err)
			}
		}
		for i := range 3 {
			if c := mustRecv(t, confirms, "confirm"); !c.Ack || c.DeliveryTag != uint64(i+1) {
				t.Fatalf("confirm %+v", c)
			}
		}
		if r := mustRecv(t, returns, "return"); r.ReplyCode != 312 || r.RoutingKey != "other.info" {
			t.Fatalf("return %+v", r)
		}
		if err := ch.Qos(1, 0, false); err != nil {
			t.Fatal(err)
		}
		msgs, err := ch.Consume(q.Name, "", false, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for range 2 {
			d := mustRecv(t, msgs, "delivery")
			if d.Exchange != "logs" || d.Headers["k"] != "v" {
				t.Fatalf("delivery %+v", d)
			}
			got = append(got, d.RoutingKey)
			if err := d.Ack(false); err != nil {
				t.Fatal(err)
			}
		}
		if !slices.Equal(got, []string{"app.info", "app.debug"}) {
			t.Fatalf("got %v", got)
		}
		d, ok, err := ch.Get(q.Name, true)
		if err != nil || ok {
			t.Fatalf("get on drained queue: %v %v %+v", ok, err, d)
		}
	})
}

// While KubeMQ is unreachable, open connections are closed with 320 and new
// ones refused with it at their first method; once it is back, clients reconnect and carry on,
// and nothing they were told is stored is lost.
func TestBackendOutage(t *testing.T) {
	e := newEnv(t)
	conn := e.dial()
	ch := e.channel(conn)
	if _, err := ch.QueueDeclare("survivor", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	publishConfirmed(t, ch, "", "survivor", "before")
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	down := errors.New("test: KubeMQ down")
	e.ready.Store(&down)
	if err := mustRecv(t, closed, "connection close"); err == nil || err.Code != 320 ||
		err.Reason != "CONNECTION_FORCED - KubeMQ backend unavailable: test: KubeMQ down" {
		t.Fatalf("close: %+v", err)
	}
	// A new connection opens and its first method is answered with 320
	// (TestClientsRefusedWhileKubeMQDown has why and every client).
	c, err := amqp.Dial(e.url())
	if err != nil {
		t.Fatalf("dial while down: %v", err)
	}
	if _, err := c.Channel(); amqpCode(err) != 320 {
		t.Fatalf("channel while down: %v", err)
	}
	e.ready.Store(nil)
	conn = e.dial()
	ch = e.channel(conn)
	if got := drain(t, ch, "survivor"); !slices.Equal(got, []string{"before"}) {
		t.Fatalf("after the outage: %v", got)
	}
}

// Durable exchanges, queues, bindings and unconsumed messages survive a
// restart of the front-end (a new process reading the same registry).
func TestRestartKeepsDurableTopology(t *testing.T) {
	e := newEnv(t)
	conn := e.dial()
	ch := e.channel(conn)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(ch.ExchangeDeclare("dur.x", "topic", true, false, false, false, nil))
	must(ch.ExchangeDeclare("dur.x2", "fanout", true, false, false, false, amqp.Table{"alternate-exchange": "dur.ae"}))
	must(ch.ExchangeDeclare("tmp.x", "fanout", false, false, false, false, nil))
	_, err := ch.QueueDeclare("dur.q", true, false, false, false, amqp.Table{"x-message-ttl": int32(60000)})
	must(err)
	_, err = ch.QueueDeclare("tmp.q", false, false, false, false, nil)
	must(err)
	must(ch.QueueBind("dur.q", "a.#", "dur.x", false, nil))
	must(ch.QueueBind("dur.q", "", "tmp.x", false, nil)) // transient: its source is
	must(ch.ExchangeBind("dur.x", "#", "dur.x2", false, nil))
	must(ch.Confirm(false))
	publishConfirmed(t, ch, "dur.x", "a.b", "kept")
	conn.Close()

	e.stopFn()
	e.start()

	ch = e.channel(e.dial())
	if _, err := ch.QueueDeclarePassive("tmp.q", false, false, false, false, nil); amqpCode(err) != 404 {
		t.Fatalf("transient queue after restart: %v", err)
	}
	ch = e.channel(e.dial())
	q, err := ch.QueueDeclarePassive("dur.q", true, false, false, false, nil)
	if err != nil || q.Messages != 1 {
		t.Fatalf("durable queue after restart: %+v %v", q, err)
	}
	// Redeclaring with other arguments is still refused: the arguments survived.
	_, err = ch.QueueDeclare("dur.q", true, false, false, false, nil)
	if amqpCode(err) != 406 {
		t.Fatalf("redeclare without x-message-ttl: %v", err)
	}
	ch = e.channel(e.dial())
	must(ch.Confirm(false))
	publishConfirmed(t, ch, "dur.x2", "a.c", "through e2e") // dur.x2 -> dur.x -> dur.q
	publishConfirmed(t, ch, "dur.x", "zzz", "unrouted")
	if got := drain(t, ch, "dur.q"); !slices.Equal(got, []string{"kept", "through e2e"}) {
		t.Fatalf("after restart: %v", got)
	}
	if err := ch.ExchangeDeclarePassive("tmp.x", "fanout", false, false, false, false, nil); amqpCode(err) != 404 {
		t.Fatalf("transient exchange after restart: %v", err)
	}
}

// Two front-ends on one registry (two replicas) share durable topology: a
// binding declared behind one routes publishes made behind the other.
func TestReplicasShareTopology(t *testing.T) {
	a := newEnv(t)
	b := &env{t: t, kubemq: a.kubemq, conn: a.conn, vhost: a.vhost, regChan: a.regChan, log: a.log}
	b.start()
	cha := a.channel(a.dial())
	if err := cha.ExchangeDeclare("shared.x", "direct", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := cha.QueueDeclare("shared.q", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := cha.QueueBind("shared.q", "k", "shared.x", false, nil); err != nil {
		t.Fatal(err)
	}
	chb := b.channel(b.dial())
	if err := chb.Confirm(false); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if got, _ := b.srv.top.vhost(vhostKey(b.vhost)).routes.Route("shared.x", "k", nil, nil); len(got) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("replica b never saw the topology")
		}
		time.Sleep(10 * time.Millisecond)
	}
	publishConfirmed(t, chb, "shared.x", "k", "via b")
	if got := drain(t, cha, "shared.q"); !slices.Equal(got, []string{"via b"}) {
		t.Fatalf("got %v", got)
	}
}

func TestTLSListener(t *testing.T) {
	e := newEnv(t)
	cert, pool := selfSigned(t)
	lis, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}})
	if err != nil {
		t.Fatal(err)
	}
	go e.srv.Serve(lis)
	conn, err := amqp.DialTLS(fmt.Sprintf("amqps://guest:guest@%s/%s", lis.Addr(), e.vhost), &tls.Config{RootCAs: pool, ServerName: "localhost"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare("tlsq", false, false, true, false, nil); err != nil {
		t.Fatal(err)
	}
}

// A message sent by a native KubeMQ client to an AMQP queue's channel
// reaches AMQP consumers with its tags as headers and its metadata in
// x-kubemq-metadata; an AMQP message read natively carries the documented
// metadata envelope and tags.
func TestNativeKubeMQInterop(t *testing.T) {
	e := newEnv(t)
	ch := e.channel(e.dial())
	channel := kubemqclient.Channel("amqp", e.vhost, "interop")
	ctx := context.Background()
	// Sent before any AMQP client declared the queue: the declare counts it.
	if _, err := e.kc.SendQueueMessage(ctx, kubemqclient.QueueMessage{Channel: channel, Metadata: "native-meta",
		Body: []byte("from kubemq"), Tags: map[string]string{"color": "blue"}}); err != nil {
		t.Fatal(err)
	}
	if q, err := ch.QueueDeclare("interop", true, false, false, false, nil); err != nil || q.Messages != 1 {
		t.Fatalf("declare: %+v %v", q, err)
	}
	d, ok, err := ch.Get("interop", false)
	if err != nil || !ok {
		t.Fatalf("get: %v %v", ok, err)
	}
	if string(d.Body) != "from kubemq" || d.Exchange != "" || d.RoutingKey != "interop" ||
		d.Headers["color"] != "blue" || d.Headers[HeaderKubeMQMeta] != "native-meta" {
		t.Fatalf("native message as delivered: %+v", d)
	}
	d.Ack(false)

	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	dc, err := ch.PublishWithDeferredConfirm("amq.direct", "nope", false, false, amqp.Publishing{})
	if err != nil || !dc.Wait() {
		t.Fatal(err)
	}
	if err := ch.QueueBind("interop", "rk", "amq.direct", false, nil); err != nil {
		t.Fatal(err)
	}
	dc, err = ch.PublishWithDeferredConfirm("amq.direct", "rk", false, false, amqp.Publishing{ContentType: "text/plain",
		CorrelationId: "c1", Headers: amqp.Table{"n": int32(7)}, Body: []byte("from amqp")})
	if err != nil || !dc.Wait() {
		t.Fatal(err)
	}
	res, err := e.kc.ReceiveQueueMessages(ctx, channel, 1, time.Second, false)
	if err != nil || len(res.Messages) != 1 {
		t.Fatalf("native receive: %v %+v", err, res)
	}
	m := res.Messages[0]
	if string(m.Body) != "from amqp" || m.Metadata != `{"amqp_headers":{"n":{"$t":"I","v":7}}}` ||
		m.Tags[TagExchange] != "amq.direct" || m.Tags[TagRoutingKey] != "rk" || m.Tags["content-type"] != "text/plain" ||
		m.Tags["correlation-id"] != "c1" || m.Tags["n"] != "7" {
		t.Fatalf("AMQP message as stored: %+v", m)
	}
}

// A proxy that dies (its KubeMQ streams cut, its memory gone) loses
// nothing: another instance delivers the unconsumed messages at once and
// the ones the dead one had delivered but not seen acknowledged once their
// lease records come back, marked redelivered.
func TestCrashedProxyLosesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for lease records (about 10 s)")
	}
	a := newEnv(t)
	ch := a.channel(a.dial())
	if _, err := ch.QueueDeclare("crash.q", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	publishConfirmed(t, ch, "", "crash.q", "m1", "m2", "m3")
	if err := ch.Qos(2, 0, false); err != nil {
		t.Fatal(err)
	}
	msgs, err := ch.Consume("crash.q", "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	held := map[string]bool{}
	for range 2 {
		held[string(mustRecv(t, msgs, "delivery").Body)] = true
	}
	// "kill -9": the proxy's KubeMQ connection goes away with its leases.
	a.kc.Close()

	b := &env{t: t, kubemq: a.kubemq, conn: a.conn, vhost: a.vhost, regChan: a.regChan, log: a.log}
	b.start()
	bch := b.channel(b.dial())
	got := map[string]bool{}
	bmsgs, err := bch.Consume("crash.q", "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.After(60 * time.Second)
	for len(got) < 3 {
		select {
		case d := <-bmsgs:
			if held[string(d.Body)] && !d.Redelivered {
				t.Errorf("%s was delivered before the crash but not marked redelivered", d.Body)
			}
			got[string(d.Body)] = true
			d.Ack(false)
		case <-deadline:
			t.Fatalf("after the crash got only %v", got)
		}
	}
}

// After Shutdown no goroutine of the front-end is left (connections,
// channels, consumers, writers, publisher lanes, watchers).
func TestShutdownLeavesNoGoroutines(t *testing.T) {
	e := newEnv(t)
	conn := e.dial()
	ch := e.channel(conn)
	if _, err := ch.QueueDeclare("leak.q", false, false, true, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	publishConfirmed(t, ch, "", "leak.q", "a", "b")
	msgs, err := ch.Consume("leak.q", "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	mustRecv(t, msgs, "delivery")
	e.channel(conn) // an idle second channel
	p := e.rawDial()
	p.raw(wire.ProtocolHeader[:]) // one connection stuck in its handshake
	p.recv()
	e.stopFn()
	deadline := time.Now().Add(10 * time.Second)
	for {
		buf := make([]byte, 1<<20)
		stacks := string(buf[:runtime.Stack(buf, true)])
		var left []string
		for _, g := range strings.Split(stacks, "\n\n") {
			if strings.Contains(g, "kubemq-proxy/amqp091.") && !strings.Contains(g, "_test.go") {
				left = append(left, g)
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines left after Shutdown:\n%s", len(left), strings.Join(left, "\n\n"))
		}
		time.Sleep(20 * time.Millisecond)
	}
}
