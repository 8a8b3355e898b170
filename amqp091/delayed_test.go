package amqp091

import (
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/kubemq-io/kubemq-proxy/amqp091/wire"
)

// The x-delayed-message exchange type (delayed.go). RabbitMQ's plugin is
// not part of Debian's rabbitmq-server, so these run against the proxy
// only, with the plugin's documented semantics.

func declareDelayed(t *testing.T, ch *amqp.Channel, name, typ string, durable bool) {
	t.Helper()
	if err := ch.ExchangeDeclare(name, "x-delayed-message", durable, false, false, false, amqp.Table{"x-delayed-type": typ}); err != nil {
		t.Fatalf("declare %s: %v", name, err)
	}
}

func TestDelayedExchangeDeclare(t *testing.T) {
	e := newEnv(t)
	c := e.dial()
	for _, args := range []amqp.Table{nil, {"x-delayed-type": "nope"}, {"x-delayed-type": int32(1)}, {"x-delayed-type": "x-delayed-message"}} {
		ch := e.channel(c)
		err := ch.ExchangeDeclare("dx", "x-delayed-message", false, false, false, false, args)
		if amqpCode(err) != 406 || !strings.Contains(err.Error(), "PRECONDITION_FAILED - Invalid argument, 'x-delayed-type' must be an existing exchange type") {
			t.Fatalf("declare with %v: %v", args, err)
		}
	}
	ch := e.channel(c)
	declareDelayed(t, ch, "dx", "topic", false)
	declareDelayed(t, ch, "dx", "topic", false) // equivalent
	if err := ch.ExchangeDeclarePassive("dx", "x-delayed-message", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	err := ch.ExchangeDeclare("dx", "topic", false, false, false, false, nil)
	want := "inequivalent arg 'type' for exchange 'dx' in vhost '" + e.vhost + "': received 'topic' but current is 'x-delayed-message'"
	if amqpCode(err) != 406 || !strings.Contains(err.Error(), want) {
		t.Fatalf("redeclare as topic: %v", err)
	}
	ch = e.channel(c)
	if err := ch.ExchangeDeclare("plain", "direct", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	err = ch.ExchangeDeclare("plain", "x-delayed-message", false, false, false, false, amqp.Table{"x-delayed-type": "direct"})
	if amqpCode(err) != 406 || !strings.Contains(err.Error(), "received 'x-delayed-message' but current is 'direct'") {
		t.Fatalf("redeclare direct as delayed: %v", err)
	}
}

// recvTimed receives one delivery with the time it arrived.
func recvTimed(t *testing.T, msgs <-chan amqp.Delivery, what string) (amqp.Delivery, time.Time) {
	t.Helper()
	d := mustRecv(t, msgs, what)
	return d, time.Now()
}

func TestDelayedExchangeRouting(t *testing.T) {
	e := newEnv(t)
	c := e.dial()
	ch := confirmChannel(t, e, c)
	returns := ch.NotifyReturn(make(chan amqp.Return, 16))
	declareDelayed(t, ch, "dx", "direct", false)
	declare(t, ch, "dq")
	if err := ch.QueueBind("dq", "k", "dx", false, nil); err != nil {
		t.Fatal(err)
	}
	_, msgs := consumeWith(t, e, c, "dq", 100, nil)
	type pub struct {
		body  string
		key   string
		delay any // nil: no header
		ms    int64
	}
	pubs := []pub{
		{"late", "k", int32(700), 700},
		{"early", "k", "250", 250},
		{"float", "k", 400.9, 400},
		{"rebound", "k2", int64(300), 300},
		{"unbound", "k3", int16(200), 200},
		{"now", "k", nil, 0},
		{"zero", "k", int32(0), 0},
		{"negative", "k", int32(-5), 0},
		{"text", "k", "abc", 0},
		{"huge", "k", int64(1 << 32), 0},
	}
	start := time.Now()
	for _, p := range pubs {
		m := amqp.Publishing{Body: []byte(p.body)}
		if p.delay != nil {
			m.Headers = amqp.Table{"x-delay": p.delay}
		}
		dc, err := ch.PublishWithDeferredConfirm("dx", p.key, true, false, m)
		if err != nil {
			t.Fatal(err)
		}
		if !dc.Wait() {
			t.Fatalf("%s nacked", p.body)
		}
	}
	// Bound after the publish: the delayed message routes by the bindings
	// as they are when it is due.
	if err := ch.QueueBind("dq", "k2", "dx", false, nil); err != nil {
		t.Fatal(err)
	}
	// Every delayed publish routes to nothing at publish time: returned.
	var returned []string
	for range 5 {
		r := mustRecv(t, returns, "return")
		if r.ReplyCode != 312 || r.ReplyText != "NO_ROUTE" {
			t.Fatalf("return %d %s", r.ReplyCode, r.ReplyText)
		}
		returned = append(returned, string(r.Body))
	}
	wantSeq(t, returned, "late", "early", "float", "rebound", "unbound")
	var got []string
	for range 5 {
		d, _ := recvTimed(t, msgs, "undelayed")
		if _, has := d.Headers["x-delay"]; has && string(d.Body) == "now" {
			t.Fatalf("now has x-delay %v", d.Headers)
		}
		got = append(got, string(d.Body))
		d.Ack(false)
	}
	wantSeq(t, got, "now", "zero", "negative", "text", "huge")
	got = got[:0]
	for range 4 {
		d, at := recvTimed(t, msgs, "delayed")
		var p pub
		for _, x := range pubs {
			if x.body == string(d.Body) {
				p = x
			}
		}
		if at.Before(start.Add(time.Duration(p.ms) * time.Millisecond)) {
			t.Fatalf("%s arrived %v after the first publish, before its delay %d ms", p.body, at.Sub(start), p.ms)
		}
		var xd int64
		switch v := d.Headers["x-delay"].(type) {
		case int32:
			xd = int64(v)
		case int64:
			xd = v
		}
		if xd != -p.ms || d.Exchange != "dx" || d.RoutingKey != p.key {
			t.Fatalf("%s: x-delay %v (%T), exchange %q key %q", p.body, d.Headers["x-delay"], d.Headers["x-delay"], d.Exchange, d.RoutingKey)
		}
		got = append(got, string(d.Body))
		d.Ack(false)
	}
	wantSeq(t, got, "early", "rebound", "float", "late")
	nothingMore(t, 300*time.Millisecond, "unbound", msgs)
}

// Exchange-to-exchange bindings from a delayed exchange route the due
// message onwards, topic rules apply; deleting the exchange drops what it
// still holds.
func TestDelayedExchangeTopicE2EDelete(t *testing.T) {
	e := newEnv(t)
	c := e.dial()
	ch := confirmChannel(t, e, c)
	declareDelayed(t, ch, "dt", "topic", false)
	if err := ch.ExchangeDeclare("fan", "fanout", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	declare(t, ch, "q1")
	declare(t, ch, "q2")
	if err := ch.ExchangeBind("fan", "a.*", "dt", false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind("q1", "", "fan", false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind("q2", "#.z", "dt", false, nil); err != nil {
		t.Fatal(err)
	}
	for _, p := range []struct{ key, body string }{{"a.b", "ab"}, {"x.y.z", "xyz"}, {"b.c", "none"}} {
		dc, err := ch.PublishWithDeferredConfirm("dt", p.key, false, false, amqp.Publishing{Body: []byte(p.body), Headers: amqp.Table{"x-delay": int32(150)}})
		if err != nil || !dc.Wait() {
			t.Fatalf("publish %s: %v", p.body, err)
		}
	}
	if m, ok := getWithin(t, ch, "q1", 5*time.Second); !ok || string(m.Body) != "ab" {
		t.Fatalf("q1: %q %v", m.Body, ok)
	}
	if m, ok := getWithin(t, ch, "q2", 5*time.Second); !ok || string(m.Body) != "xyz" {
		t.Fatalf("q2: %q %v", m.Body, ok)
	}
	dc, err := ch.PublishWithDeferredConfirm("dt", "a.b", false, false, amqp.Publishing{Body: []byte("gone"), Headers: amqp.Table{"x-delay": int32(800)}})
	if err != nil || !dc.Wait() {
		t.Fatal(err)
	}
	if err := ch.ExchangeDelete("dt", false, false); err != nil {
		t.Fatal(err)
	}
	declareDelayed(t, ch, "dt", "topic", false)
	if err := ch.ExchangeBind("fan", "a.*", "dt", false, nil); err != nil {
		t.Fatal(err)
	}
	if m, ok := getWithin(t, ch, "q1", 1500*time.Millisecond); ok {
		t.Fatalf("a deleted exchange's delayed message arrived: %q", m.Body)
	}
}

// Delayed messages survive a proxy restart: stored in KubeMQ, routed by
// the next process when due.
func TestDelayedExchangeRestart(t *testing.T) {
	e := newEnv(t)
	ch := confirmChannel(t, e, e.dial())
	declareDelayed(t, ch, "ddur", "fanout", true)
	if _, err := ch.QueueDeclare("dqdur", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind("dqdur", "", "ddur", false, nil); err != nil {
		t.Fatal(err)
	}
	dc, err := ch.PublishWithDeferredConfirm("ddur", "", false, false, amqp.Publishing{Body: []byte("kept"), Headers: amqp.Table{"x-delay": int32(3000)}})
	if err != nil || !dc.Wait() {
		t.Fatal(err)
	}
	e.stopFn()
	e.start()
	ch = e.channel(e.dial())
	m, ok := getWithin(t, ch, "dqdur", 20*time.Second)
	if !ok || string(m.Body) != "kept" || m.Headers["x-delay"] != int32(-3000) {
		t.Fatalf("after restart: %q %v headers %v", m.Body, ok, m.Headers)
	}
}

func TestDelayedExchangePika(t *testing.T) {
	py := pythonWithPika(t)
	runClient(t, newEnv(t), py, "pika_delayed.py")
}

// FuzzParseDelay: any x-delay header value is either a delay within the
// plugin's range or no delay, never a panic; a string is read as the
// integer it holds.
func FuzzParseDelay(f *testing.F) {
	for _, s := range []string{"250", "0", "-5", "abc", "4294967295", "4294967296", "", "1e3", " 7"} {
		f.Add(s, int64(0), 0.0)
	}
	f.Add("", int64(1500), 2.5)
	f.Add("", int64(-1), 1e300)
	f.Fuzz(func(t *testing.T, s string, n int64, x float64) {
		for _, v := range []any{s, n, int32(n), int16(n), int8(n), uint8(n), x, float32(x), []byte(s), true, nil} {
			ms, ok := parseDelay(wire.Table{"x-delay": v})
			if ok && (ms <= 0 || ms > maxDelay) {
				t.Fatalf("%#v: delay %d accepted", v, ms)
			}
			if !ok && ms > 0 && ms <= maxDelay {
				if _, isStr := v.(string); !isStr {
					if _, isInt := intArg(v); isInt {
						t.Fatalf("%#v: delay %d refused", v, ms)
					}
				}
			}
		}
		if ms, ok := parseDelay(wire.Table{"x-delay": s}); ok {
			if want, err := strconv.ParseInt(s, 10, 64); err != nil || want != ms {
				t.Fatalf("%q read as %d", s, ms)
			}
		}
	})
}

// A due message whose queue is full under reject-publish: the publisher
// was confirmed at the publish, so at the release the copy is dropped, or
// dead-lettered (reason maxlen) under reject-publish-dlx, as the plugin's
// release into RabbitMQ's queue does; drop-head trims (by bytes too).
func TestDelayedExchangeRejectPublish(t *testing.T) {
	e := newEnv(t)
	c := e.dial()
	ch := confirmChannel(t, e, c)
	declareDelayed(t, ch, "dx", "direct", false)
	declare(t, ch, "dead")
	declareArgs(t, ch, "full", amqp.Table{"x-max-length": int32(1), "x-overflow": "reject-publish"})
	declareArgs(t, ch, "fulldlx", amqp.Table{"x-max-length-bytes": int32(4), "x-overflow": "reject-publish-dlx",
		"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead"})
	declareArgs(t, ch, "head", amqp.Table{"x-max-length-bytes": int32(4)})
	for _, q := range []string{"full", "fulldlx", "head"} {
		if err := ch.QueueBind(q, q, "dx", false, nil); err != nil {
			t.Fatal(err)
		}
		if !publishWith(t, ch, q, amqp.Publishing{Body: []byte("old")}) {
			t.Fatalf("%s: nack", q)
		}
		dc, err := ch.PublishWithDeferredConfirm("dx", q, false, false, amqp.Publishing{Body: []byte("late"), Headers: amqp.Table{"x-delay": int32(200)}})
		if err != nil || !dc.Wait() {
			t.Fatalf("%s: delayed publish not confirmed: %v", q, err)
		}
	}
	m, ok := getWithin(t, ch, "dead", 5*time.Second)
	if !ok || string(m.Body) != "late" {
		t.Fatalf("dead: %q %v", m.Body, ok)
	}
	checkDeath(t, deaths(t, m)[0], 1, "maxlen", "fulldlx", "dx", []string{"fulldlx"}, "")
	// head: the due message trims the older one. Its copy is stored when
	// head's byte ledger has both; a trim requested then ends after the
	// one the release requested.
	q := e.srv.top.vhost(vhostKey(e.vhost)).lookupQueue("head")
	for end := time.Now().Add(5 * time.Second); q.bytes.mark() < 2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the due message was not stored in head")
		}
	}
	trimmed := make(chan struct{}, 1)
	e.srv.requestTrim(q, func() { trimmed <- struct{}{} })
	mustRecv(t, trimmed, "trim")
	wantSeq(t, drainGet(t, ch, "head"), "late")
	for _, q := range []string{"full", "fulldlx"} {
		wantSeq(t, drainGet(t, ch, q), "old")
	}
}
