package amqp091

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/kubemq-io/kubemq-proxy/amqp091/wire"
)

// Dead-lettering, TTL, length limits and x-expires (issue 17), each run
// against the proxy and RabbitMQ with the same assertions.

func declareArgs(t *testing.T, ch *amqp.Channel, q string, args amqp.Table) {
	t.Helper()
	if _, err := ch.QueueDeclare(q, false, false, false, false, args); err != nil {
		t.Fatalf("declare %s: %v", q, err)
	}
}

func publishWith(t *testing.T, ch *amqp.Channel, key string, p amqp.Publishing) bool {
	t.Helper()
	dc, err := ch.PublishWithDeferredConfirm("", key, false, false, p)
	if err != nil {
		t.Fatal(err)
	}
	return dc.Wait()
}

// getWithin polls basic.get until a message comes or d passes.
func getWithin(t *testing.T, ch *amqp.Channel, q string, d time.Duration) (amqp.Delivery, bool) {
	t.Helper()
	end := time.Now().Add(d)
	for {
		m, ok, err := ch.Get(q, true)
		if err != nil {
			t.Fatal(err)
		}
		if ok || time.Now().After(end) {
			return m, ok
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func deaths(t *testing.T, m amqp.Delivery) []amqp.Table {
	t.Helper()
	raw, ok := m.Headers["x-death"].([]any)
	if !ok {
		t.Fatalf("no x-death array in %v", m.Headers)
	}
	var out []amqp.Table
	for _, r := range raw {
		out = append(out, r.(amqp.Table))
	}
	return out
}

// checkDeath compares one x-death entry with RabbitMQ 3.10's fields.
func checkDeath(t *testing.T, d amqp.Table, count int64, reason, queue, exchange string, keys []string, origExp string) {
	t.Helper()
	if d["count"] != count || d["reason"] != reason || d["queue"] != queue || d["exchange"] != exchange {
		t.Fatalf("x-death entry %v, want count %d reason %s queue %s exchange %q", d, count, reason, queue, exchange)
	}
	if ts, ok := d["time"].(time.Time); !ok || time.Since(ts) > time.Minute || time.Since(ts) < -time.Minute {
		t.Fatalf("x-death time %v (%T)", d["time"], d["time"])
	}
	var rks []string
	for _, k := range d["routing-keys"].([]any) {
		rks = append(rks, k.(string))
	}
	if !slices.Equal(rks, keys) {
		t.Fatalf("routing-keys %v, want %v", rks, keys)
	}
	oe, has := d["original-expiration"]
	if (origExp == "") == has || (has && oe != origExp) {
		t.Fatalf("original-expiration %v (present %v), want %q", oe, has, origExp)
	}
	want := 6
	if origExp != "" {
		want++
	}
	if len(d) != want {
		t.Fatalf("x-death entry has %d fields: %v", len(d), d)
	}
}

func TestDeadLetterOnReject(t *testing.T) {
	brokers(t, func(t *testing.T, e *env) {
		c := e.dial()
		ch := confirmChannel(t, e, c)
		if err := ch.ExchangeDeclare("dlx", "direct", false, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
		declare(t, ch, "dead")
		declare(t, ch, "dead-rk")
		if err := ch.QueueBind("dead", "work", "dlx", false, nil); err != nil {
			t.Fatal(err)
		}
		if err := ch.QueueBind("dead-rk", "rk", "dlx", false, nil); err != nil {
			t.Fatal(err)
		}
		declareArgs(t, ch, "work", amqp.Table{"x-dead-letter-exchange": "dlx"})
		declareArgs(t, ch, "work-rk", amqp.Table{"x-dead-letter-exchange": "dlx", "x-dead-letter-routing-key": "rk"})
		declareArgs(t, ch, "plain", nil)
		publishWith(t, ch, "work", amqp.Publishing{Body: []byte("a"), Headers: amqp.Table{"h": "v"}})
		publishWith(t, ch, "work", amqp.Publishing{Body: []byte("b"), Expiration: "60000"})
		publishWith(t, ch, "work-rk", amqp.Publishing{Body: []byte("c")})
		publishWith(t, ch, "plain", amqp.Publishing{Body: []byte("d")})

		cch, msgs := consumeWith(t, e, c, "work", 10, nil)
		got, ds := recvBodies(t, msgs, 2, "work")
		wantSeq(t, got, "a", "b")
		if err := ds[0].Reject(false); err != nil {
			t.Fatal(err)
		}
		if err := ds[1].Nack(false, false); err != nil {
			t.Fatal(err)
		}
		_, rkMsgs := consumeWith(t, e, c, "work-rk", 10, nil)
		_, rds := recvBodies(t, rkMsgs, 1, "work-rk")
		if err := rds[0].Reject(false); err != nil {
			t.Fatal(err)
		}
		_, pmsgs := consumeWith(t, e, c, "plain", 10, nil)
		_, pds := recvBodies(t, pmsgs, 1, "plain")
		if err := pds[0].Reject(false); err != nil { // no DLX: dropped
			t.Fatal(err)
		}
		_ = cch

		m, ok := getWithin(t, ch, "dead", 5*time.Second)
		if !ok || string(m.Body) != "a" {
			t.Fatalf("dead: %q %v", m.Body, ok)
		}
		if m.Exchange != "dlx" || m.RoutingKey != "work" || m.Headers["h"] != "v" {
			t.Fatalf("dead-lettered a: exchange %q key %q headers %v", m.Exchange, m.RoutingKey, m.Headers)
		}
		if m.Headers["x-first-death-reason"] != "rejected" || m.Headers["x-first-death-queue"] != "work" || m.Headers["x-first-death-exchange"] != "" {
			t.Fatalf("x-first-death headers: %v", m.Headers)
		}
		d := deaths(t, m)
		if len(d) != 1 {
			t.Fatalf("x-death %v", d)
		}
		checkDeath(t, d[0], 1, "rejected", "work", "", []string{"work"}, "")

		m, ok = getWithin(t, ch, "dead", 5*time.Second)
		if !ok || string(m.Body) != "b" {
			t.Fatalf("dead: %q %v", m.Body, ok)
		}
		if m.Expiration != "" {
			t.Fatalf("dead-lettered copy keeps expiration %q", m.Expiration)
		}
		checkDeath(t, deaths(t, m)[0], 1, "rejected", "work", "", []string{"work"}, "60000")

		m, ok = getWithin(t, ch, "dead-rk", 5*time.Second)
		if !ok || string(m.Body) != "c" || m.RoutingKey != "rk" {
			t.Fatalf("dead-rk: %q %v key %q", m.Body, ok, m.RoutingKey)
		}
		checkDeath(t, deaths(t, m)[0], 1, "rejected", "work-rk", "", []string{"work-rk"}, "")
		if _, ok := getWithin(t, ch, "plain", 300*time.Millisecond); ok {
			t.Fatal("a rejected message without a DLX came back")
		}
	})
}

// declareRetryLoop declares a retry loop: "work" dead-letters to "wait",
// whose messages expire after ttlMs and dead-letter back to "work".
func declareRetryLoop(t *testing.T, ch *amqp.Channel, ttlMs int32) {
	t.Helper()
	declareArgs(t, ch, "work", amqp.Table{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "wait"})
	declareArgs(t, ch, "wait", amqp.Table{"x-message-ttl": ttlMs, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "work"})
}

// A retry loop: rejected from work, waits in a TTL queue, expires back.
func TestDeadLetterRetryLoop(t *testing.T) {
	brokers(t, func(t *testing.T, e *env) {
		c := e.dial()
		ch := confirmChannel(t, e, c)
		declareRetryLoop(t, ch, 200)
		publishWith(t, ch, "work", amqp.Publishing{Body: []byte("job")})
		_, msgs := consumeWith(t, e, c, "work", 1, nil)
		for round := int64(1); round <= 3; round++ {
			m := mustRecv(t, msgs, fmt.Sprint("round ", round))
			if round == 1 {
				if _, has := m.Headers["x-death"]; has {
					t.Fatalf("first delivery has x-death: %v", m.Headers)
				}
			} else {
				d := deaths(t, m)
				if len(d) != 2 {
					t.Fatalf("round %d: x-death %v", round, d)
				}
				// Newest death first; each entry counts its own deaths.
				checkDeath(t, d[0], round-1, "expired", "wait", "", []string{"wait"}, "")
				checkDeath(t, d[1], round-1, "rejected", "work", "", []string{"work"}, "")
				if m.Headers["x-first-death-reason"] != "rejected" || m.Headers["x-first-death-queue"] != "work" {
					t.Fatalf("x-first-death: %v", m.Headers)
				}
			}
			if err := m.Reject(false); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// A message dead-lettered into a queue with a TTL expires at that TTL,
// also when the queue was empty and its reaper idle: the dead-lettered
// copy wakes it, as a publish does (it used to wait for the reaper's next
// idle look, up to a second).
func TestDeadLetterIntoTTLQueueOnTime(t *testing.T) {
	brokers(t, func(t *testing.T, e *env) {
		c := e.dial()
		ch := confirmChannel(t, e, c)
		declareRetryLoop(t, ch, 100)
		time.Sleep(150 * time.Millisecond) // the empty wait queue had its look
		publishWith(t, ch, "work", amqp.Publishing{Body: []byte("job")})
		_, msgs := consumeWith(t, e, c, "work", 1, nil)
		m := mustRecv(t, msgs, "first delivery")
		rejected := time.Now()
		if err := m.Reject(false); err != nil {
			t.Fatal(err)
		}
		m = mustRecv(t, msgs, "after the wait queue")
		if took := time.Since(rejected); took > 600*time.Millisecond {
			t.Fatalf("back after %v; the wait queue's TTL is 100 ms", took)
		}
		if d := deaths(t, m); len(d) != 2 {
			t.Fatalf("x-death %v", d)
		}
		m.Ack(false)
	})
}

// Automatic deaths that come back to their queue are dropped (a cycle).
func TestDeadLetterCycleDropped(t *testing.T) {
	brokers(t, func(t *testing.T, e *env) {
		c := e.dial()
		ch := confirmChannel(t, e, c)
		declareArgs(t, ch, "self", amqp.Table{"x-message-ttl": int32(100), "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "self"})
		publishWith(t, ch, "self", amqp.Publishing{Body: []byte("x")})
		time.Sleep(600 * time.Millisecond)
		if m, ok := getWithin(t, ch, "self", 700*time.Millisecond); ok {
			t.Fatalf("cycle not dropped: %q %v", m.Body, m.Headers)
		}
	})
}

// Queue TTL and per-message expiration of 200 ms: gone at 0.6 s, from the
// count too; with a DLX they are dead-lettered with reason expired.
func TestMessageTTLMilliseconds(t *testing.T) {
	brokers(t, func(t *testing.T, e *env) {
		c := e.dial()
		ch := confirmChannel(t, e, c)
		declareArgs(t, ch, "qttl", amqp.Table{"x-message-ttl": int32(200)})
		declareArgs(t, ch, "mttl", nil)
		declare(t, ch, "dead")
		declareArgs(t, ch, "dl", amqp.Table{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead"})
		publishWith(t, ch, "qttl", amqp.Publishing{Body: []byte("q")})
		publishWith(t, ch, "mttl", amqp.Publishing{Body: []byte("m"), Expiration: "200"})
		publishWith(t, ch, "mttl", amqp.Publishing{Body: []byte("keep")})
		publishWith(t, ch, "dl", amqp.Publishing{Body: []byte("d"), Expiration: "200"})
		time.Sleep(600 * time.Millisecond)
		for _, q := range []string{"qttl", "dl"} {
			st, err := ch.QueueDeclarePassive(q, false, false, false, false, nil)
			if err != nil {
				t.Fatal(err)
			}
			if st.Messages != 0 {
				t.Fatalf("%s: %d messages at 0.6 s", q, st.Messages)
			}
		}
		if m, ok, err := ch.Get("qttl", true); err != nil || ok {
			t.Fatalf("qttl: got %q %v %v", m.Body, ok, err)
		}
		m, ok, err := ch.Get("mttl", true)
		if err != nil || !ok || string(m.Body) != "keep" {
			t.Fatalf("mttl: got %q %v %v, want keep", m.Body, ok, err)
		}
		m, ok = getWithin(t, ch, "dead", 5*time.Second)
		if !ok || string(m.Body) != "d" {
			t.Fatalf("dead: %q %v", m.Body, ok)
		}
		checkDeath(t, deaths(t, m)[0], 1, "expired", "dl", "", []string{"dl"}, "200")
	})
}

// Messages that expire while a consumer has no credit are expired at the
// head; the consumer never sees them.
func TestExpiredNeverDelivered(t *testing.T) {
	brokers(t, func(t *testing.T, e *env) {
		c := e.dial()
		ch := confirmChannel(t, e, c)
		declareArgs(t, ch, "q", amqp.Table{"x-message-ttl": int32(300)})
		publishWith(t, ch, "q", amqp.Publishing{Body: []byte("1")})
		publishWith(t, ch, "q", amqp.Publishing{Body: []byte("2")})
		_, msgs := consumeWith(t, e, c, "q", 1, nil)
		m := mustRecv(t, msgs, "first")
		time.Sleep(700 * time.Millisecond)
		if err := m.Ack(false); err != nil {
			t.Fatal(err)
		}
		nothingMore(t, 500*time.Millisecond, "after expiry", msgs)
	})
}

func TestMaxLengthDropHead(t *testing.T) {
	brokers(t, func(t *testing.T, e *env) {
		c := e.dial()
		ch := confirmChannel(t, e, c)
		declareArgs(t, ch, "q", amqp.Table{"x-max-length": int32(2)})
		declare(t, ch, "dead")
		declareArgs(t, ch, "qd", amqp.Table{"x-max-length": int32(2), "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead"})
		for _, b := range bodies(4) {
			if !publishWith(t, ch, "q", amqp.Publishing{Body: []byte(b)}) {
				t.Fatal("nack")
			}
			if !publishWith(t, ch, "qd", amqp.Publishing{Body: []byte(b)}) {
				t.Fatal("nack")
			}
		}
		for _, q := range []string{"q", "qd"} {
			var got []string
			for {
				m, ok, err := ch.Get(q, true)
				if err != nil {
					t.Fatal(err)
				}
				if !ok {
					break
				}
				got = append(got, string(m.Body))
			}
			wantSeq(t, got, "3", "4")
		}
		var dead []string
		for range 2 {
			m, ok := getWithin(t, ch, "dead", 5*time.Second)
			if !ok {
				t.Fatalf("dead-lettered: %v", dead)
			}
			dead = append(dead, string(m.Body))
			checkDeath(t, deaths(t, m)[0], 1, "maxlen", "qd", "", []string{"qd"}, "")
		}
		wantSeq(t, dead, "1", "2")
	})
}

func TestMaxLengthRejectPublish(t *testing.T) {
	brokers(t, func(t *testing.T, e *env) {
		c := e.dial()
		ch := confirmChannel(t, e, c)
		declareArgs(t, ch, "q", amqp.Table{"x-max-length": int32(2), "x-overflow": "reject-publish"})
		declare(t, ch, "dead")
		declareArgs(t, ch, "qd", amqp.Table{"x-max-length": int32(1), "x-overflow": "reject-publish-dlx",
			"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead"})
		var acks []bool
		for _, b := range bodies(4) {
			acks = append(acks, publishWith(t, ch, "q", amqp.Publishing{Body: []byte(b)}))
		}
		if !slices.Equal(acks, []bool{true, true, false, false}) {
			t.Fatalf("confirms %v, want ack ack nack nack", acks)
		}
		st, err := ch.QueueDeclarePassive("q", false, false, false, false, nil)
		if err != nil || st.Messages != 2 {
			t.Fatalf("q holds %d (%v), want 2", st.Messages, err)
		}
		// A publisher without confirms: the refused copy is dropped.
		pch := e.channel(c)
		if err := pch.Publish("", "q", false, false, amqp.Publishing{Body: []byte("5")}); err != nil {
			t.Fatal(err)
		}
		publishWith(t, ch, "qd", amqp.Publishing{Body: []byte("x")})
		if publishWith(t, ch, "qd", amqp.Publishing{Body: []byte("y")}) {
			t.Fatal("reject-publish-dlx acked a publish over the limit")
		}
		m, ok := getWithin(t, ch, "dead", 5*time.Second)
		if !ok || string(m.Body) != "y" {
			t.Fatalf("dead: %q %v", m.Body, ok)
		}
		checkDeath(t, deaths(t, m)[0], 1, "maxlen", "qd", "", []string{"qd"}, "")
		var got []string
		for {
			m, ok, err := ch.Get("q", true)
			if err != nil {
				t.Fatal(err)
			}
			if !ok {
				break
			}
			got = append(got, string(m.Body))
		}
		wantSeq(t, got, "1", "2")
	})
}

func TestQueueExpires(t *testing.T) {
	brokers(t, func(t *testing.T, e *env) {
		c := e.dial()
		ch := e.channel(c)
		declareArgs(t, ch, "gone", amqp.Table{"x-expires": int32(1000)})
		time.Sleep(2500 * time.Millisecond)
		_, err := ch.QueueDeclarePassive("gone", false, false, false, false, nil)
		if amqpCode(err) != 404 {
			t.Fatalf("passive declare after x-expires: %v, want 404", err)
		}
	})
}

func TestDeathHeadersUnit(t *testing.T) {
	q := &queue{name: "w"}
	now := time.Unix(1700000000, 0)
	h, keys := deathHeaders(wire.Properties{}, q, "x", "k", reasonRejected, now)
	if !slices.Equal(keys, []string{"k"}) || h["x-first-death-queue"] != "w" {
		t.Fatalf("%v %v", h, keys)
	}
	h2, _ := deathHeaders(wire.Properties{Headers: h}, q, "y", "k2", reasonRejected, now)
	ds := h2["x-death"].([]any)
	if len(ds) != 1 || ds[0].(wire.Table)["count"] != int64(2) || ds[0].(wire.Table)["exchange"] != "x" {
		t.Fatalf("second death: %v", ds)
	}
	if !deathCycle("w", []any{wire.Table{"queue": "w", "reason": reasonExpired}}) {
		t.Fatal("expired back to itself is a cycle")
	}
	if deathCycle("w", []any{wire.Table{"queue": "r", "reason": reasonExpired}, wire.Table{"queue": "w", "reason": reasonRejected}}) {
		t.Fatal("a cycle with a reject is not automatic")
	}
}

// A quorum queue's x-delivery-limit: the message returned once more than
// the limit is dead-lettered with reason delivery_limit.
func TestDeliveryLimitQuorum(t *testing.T) {
	brokers(t, func(t *testing.T, e *env) {
		c := e.dial()
		ch := confirmChannel(t, e, c)
		declare(t, ch, "dead")
		if _, err := ch.QueueDeclare("qq", true, false, false, false, amqp.Table{"x-queue-type": "quorum", "x-delivery-limit": int32(1),
			"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead"}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ch.QueueDelete("qq", false, false, false) })
		publishWith(t, ch, "qq", amqp.Publishing{Body: []byte("m")})
		_, msgs := consumeWith(t, e, c, "qq", 1, nil)
		for i := range 2 {
			m := mustRecv(t, msgs, fmt.Sprint("delivery ", i+1))
			if m.Redelivered != (i > 0) {
				t.Fatalf("delivery %d: redelivered %v", i+1, m.Redelivered)
			}
			if err := m.Nack(false, true); err != nil {
				t.Fatal(err)
			}
		}
		m, ok := getWithin(t, ch, "dead", 5*time.Second)
		if !ok || string(m.Body) != "m" {
			t.Fatalf("dead: %q %v", m.Body, ok)
		}
		checkDeath(t, deaths(t, m)[0], 1, "delivery_limit", "qq", "", []string{"qq"}, "")
		nothingMore(t, 300*time.Millisecond, "after the delivery limit", msgs)
	})
}

// FuzzDeathHeaders: whatever headers a client sent (an x-death of any
// shape included), dead-lettering builds headers that store and decode.
func FuzzDeathHeaders(f *testing.F) {
	seed := func(t wire.Table) []byte {
		b, err := wire.AppendTable(nil, t)
		if err != nil {
			f.Fatal(err)
		}
		return b[4:]
	}
	f.Add(seed(wire.Table{}), "rejected")
	f.Add(seed(wire.Table{"x-death": "not an array"}), "expired")
	f.Add(seed(wire.Table{"x-death": []any{int32(1), wire.Table{"queue": "w", "reason": "expired", "count": "x"}}}), "expired")
	f.Add(seed(wire.Table{"CC": []any{"a", int8(1)}, "x-death": []any{wire.Table{"queue": []byte("w")}}}), "maxlen")
	f.Fuzz(func(t *testing.T, table []byte, reason string) {
		h, err := wire.DecodeTableFields(table)
		if err != nil {
			return
		}
		q := &queue{name: "w", dlrk: "k", hasDLRK: len(table)%2 == 0}
		out, keys := deathHeaders(wire.Properties{Headers: h, Flags: wire.FlagHeaders}, q, "x", "k", reason, time.Now())
		if len(keys) == 0 {
			t.Fatal("no routing key")
		}
		p := wire.Properties{Headers: out, Flags: wire.FlagHeaders}
		meta, tags, err := encodeMessage("dlx", keys[0], &p)
		if err != nil {
			return // a header the store cannot hold: refused, as at publish
		}
		_, _, back := decodeMessage("w", meta, tags)
		if _, ok := back.Headers["x-death"].([]any); !ok {
			t.Fatalf("x-death lost: %v", back.Headers)
		}
		deathCycle("w", back.Headers["x-death"].([]any))
	})
}

// A reject through a replica that forwards the consumer: the holder
// dead-letters the message (Settle REJECT), and a nack with requeue of a
// quorum queue over its delivery limit is dead-lettered there too.
func TestForwardedDeadLetter(t *testing.T) {
	rs := newReplicas(t, 2)
	a, b := rs[0], rs[1]
	ca := a.dial()
	cha := a.channel(ca)
	for _, q := range []string{"fdl.dead", "fdl.dead2"} {
		if _, err := cha.QueueDeclare(q, true, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cha.QueueDeclare("fdl.q", true, false, false, false, amqp.Table{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "fdl.dead"}); err != nil {
		t.Fatal(err)
	}
	if _, err := cha.QueueDeclare("fdl.qq", true, false, false, false, amqp.Table{"x-queue-type": "quorum", "x-delivery-limit": int32(0),
		"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "fdl.dead2"}); err != nil {
		t.Fatal(err)
	}
	// a holds both queues through consumers that take nothing (prefetch 1, one held).
	for _, q := range []string{"fdl.q", "fdl.qq"} {
		hold := a.channel(ca)
		if err := hold.Qos(1, 0, false); err != nil {
			t.Fatal(err)
		}
		hd, err := hold.Consume(q, "", false, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		publishN(t, a.channel(ca), q, 0, 1)
		mustRecv(t, hd, "hold")
		if owner(t, rs, q) != a {
			t.Fatalf("a should hold %s", q)
		}
	}
	cb := b.dial()
	for _, c := range []struct{ q, dead, reason string }{{"fdl.q", "fdl.dead", "rejected"}, {"fdl.qq", "fdl.dead2", "delivery_limit"}} {
		publishN(t, b.channel(cb), c.q, 1, 1)
		chb := b.channel(cb)
		msgs, err := chb.Consume(c.q, "", false, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		m := mustRecv(t, msgs, "forwarded delivery")
		if c.reason == "rejected" {
			err = m.Reject(false)
		} else {
			err = m.Nack(false, true)
		}
		if err != nil {
			t.Fatal(err)
		}
		d, ok := getWithin(t, b.channel(cb), c.dead, 10*time.Second)
		if !ok || string(d.Body) != "m1" {
			t.Fatalf("%s: %q %v", c.dead, d.Body, ok)
		}
		checkDeath(t, deaths(t, d)[0], 1, c.reason, c.q, "", []string{c.q}, "")
	}
}

// Length limits apply to transactional publishes at the commit:
// drop-head keeps the newest; reject-publish drops what would go over the
// limit and reject-publish-dlx dead-letters it, and then the commit fails
// with RabbitMQ's 406 partial tx completion (the copies that fit stay).
func TestMaxLengthTransactional(t *testing.T) {
	brokers(t, func(t *testing.T, e *env) {
		c := e.dial()
		setup := e.channel(c)
		declare(t, setup, "dead")
		declareArgs(t, setup, "rp", amqp.Table{"x-max-length": int32(2), "x-overflow": "reject-publish"})
		declareArgs(t, setup, "rpd", amqp.Table{"x-max-length": int32(1), "x-overflow": "reject-publish-dlx",
			"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead"})
		declareArgs(t, setup, "dh", amqp.Table{"x-max-length": int32(2)})
		if err := setup.Publish("", "rp", false, false, amqp.Publishing{Body: []byte("before")}); err != nil {
			t.Fatal(err)
		}
		commit := func(q string) error {
			ch := e.channel(c)
			if err := ch.Tx(); err != nil {
				t.Fatal(err)
			}
			for i := 1; i <= 4; i++ {
				if err := ch.Publish("", q, false, false, amqp.Publishing{Body: []byte(fmt.Sprint(q, i))}); err != nil {
					t.Fatal(err)
				}
			}
			if n := passiveCount(t, setup, q); n != map[string]int{"rp": 1}[q] {
				t.Fatalf("%s holds %d before the commit", q, n)
			}
			return ch.TxCommit()
		}
		if err := commit("dh"); err != nil {
			t.Fatal(err)
		}
		wantSeq(t, drainGet(t, setup, "dh"), "dh3", "dh4")
		for _, q := range []string{"rp", "rpd"} {
			err := commit(q)
			if amqpCode(err) != 406 || !strings.Contains(err.Error(), "PRECONDITION_FAILED - partial tx completion") {
				t.Fatalf("commit into %s: %v", q, err)
			}
		}
		wantSeq(t, drainGet(t, setup, "rp"), "before", "rp1")
		wantSeq(t, drainGet(t, setup, "rpd"), "rpd1")
		var dead []string
		for range 3 {
			m, ok := getWithin(t, setup, "dead", 5*time.Second)
			if !ok {
				t.Fatalf("dead-lettered: %v", dead)
			}
			dead = append(dead, string(m.Body))
		}
		wantSeq(t, dead, "rpd2", "rpd3", "rpd4")
	})
}
