package amqp091

import (
	"fmt"
	"slices"
	"sort"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

func TestPublishConsumeAck(t *testing.T) {
	brokers(t, func(t *testing.T, e *env) {
		c := e.dial()
		ch := e.channel(c)
		q, err := ch.QueueDeclare("", false, false, true, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(q.Name) != len("amq.gen-")+22 {
			t.Fatalf("server-named queue %q", q.Name)
		}
		for i := range 3 {
			err := ch.Publish("", q.Name, false, false, amqp.Publishing{ContentType: "text/plain", Body: []byte(fmt.Sprint("m", i)),
				Headers: amqp.Table{"n": int32(i)}, DeliveryMode: amqp.Persistent, MessageId: fmt.Sprint("id", i)})
			if err != nil {
				t.Fatal(err)
			}
		}
		msgs, err := ch.Consume(q.Name, "", false, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 3 {
			d := mustRecv(t, msgs, "delivery")
			if string(d.Body) != fmt.Sprint("m", i) || d.ContentType != "text/plain" || d.Headers["n"] != int32(i) ||
				d.DeliveryMode != amqp.Persistent || d.MessageId != fmt.Sprint("id", i) || d.Redelivered ||
				d.Exchange != "" || d.RoutingKey != q.Name {
				t.Fatalf("delivery %d: %+v", i, d)
			}
			if err := d.Ack(false); err != nil {
				t.Fatal(err)
			}
		}
		if err := ch.Close(); err != nil {
			t.Fatal(err)
		}
	})
}

// publishConfirmed publishes with confirms and waits for every ack.
func publishConfirmed(t *testing.T, ch *amqp.Channel, exchange, key string, bodies ...string) {
	t.Helper()
	for _, b := range bodies {
		dc, err := ch.PublishWithDeferredConfirm(exchange, key, false, false, amqp.Publishing{Body: []byte(b)})
		if err != nil {
			t.Fatal(err)
		}
		if dc == nil {
			t.Fatal("channel not in confirm mode")
		}
		if !dc.Wait() {
			t.Fatalf("publish %q nacked", b)
		}
	}
}

// drain gets every message waiting in q (basic.get until get-empty).
func drain(t *testing.T, ch *amqp.Channel, q string) []string {
	t.Helper()
	var out []string
	for {
		d, ok, err := ch.Get(q, true)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			sort.Strings(out)
			return out
		}
		out = append(out, string(d.Body))
	}
}

func TestExchangeTypesRouting(t *testing.T) {
	brokers(t, func(t *testing.T, e *env) {
		ch := e.channel(e.dial())
		if err := ch.Confirm(false); err != nil {
			t.Fatal(err)
		}
		for _, x := range []struct{ name, kind string }{{"dx", "direct"}, {"fx", "fanout"}, {"tx", "topic"}, {"hx", "headers"}} {
			if err := ch.ExchangeDeclare(x.name, x.kind, false, false, false, false, nil); err != nil {
				t.Fatal(err)
			}
		}
		for _, q := range []string{"q1", "q2", "q3"} {
			if _, err := ch.QueueDeclare(q, false, false, false, false, nil); err != nil {
				t.Fatal(err)
			}
		}
		binds := []struct {
			q, key, x string
			args      amqp.Table
		}{
			{"q1", "red", "dx", nil}, {"q2", "blue", "dx", nil},
			{"q1", "", "fx", nil}, {"q3", "", "fx", nil},
			{"q1", "a.*", "tx", nil}, {"q2", "a.#", "tx", nil}, {"q3", "#.z", "tx", nil},
			{"q1", "", "hx", amqp.Table{"x-match": "all", "k": "v", "n": int32(1)}},
			{"q2", "", "hx", amqp.Table{"x-match": "any", "k": "v", "n": int32(2)}},
		}
		for _, b := range binds {
			if err := ch.QueueBind(b.q, b.key, b.x, false, b.args); err != nil {
				t.Fatal(err)
			}
		}
		// e2e: fx also feeds tx.
		if err := ch.ExchangeBind("tx", "", "fx", false, nil); err != nil {
			t.Fatal(err)
		}
		pub := func(x, key string, h amqp.Table, body string) {
			dc, err := ch.PublishWithDeferredConfirm(x, key, false, false, amqp.Publishing{Headers: h, Body: []byte(body)})
			if err != nil || !dc.Wait() {
				t.Fatalf("publish %s: %v", body, err)
			}
		}
		pub("dx", "red", nil, "d-red")
		pub("dx", "blue", nil, "d-blue")
		pub("dx", "green", nil, "d-green")
		pub("fx", "a.b", nil, "f")                                  // fx -> q1, q3; fx -> tx: a.b -> q1 (a.*), q2 (a.#); q1 once
		pub("tx", "a.b.z", nil, "t")                                // q2 (a.#), q3 (#.z)
		pub("hx", "", amqp.Table{"k": "v", "n": int32(1)}, "h-all") // q1 and q2 (any k=v)
		pub("hx", "", amqp.Table{"n": int64(2)}, "h-any")           // q2
		pub("hx", "", amqp.Table{"k": "x"}, "h-none")
		want := map[string][]string{
			"q1": {"d-red", "f", "h-all"},
			"q2": {"d-blue", "f", "h-all", "h-any", "t"},
			"q3": {"f", "t"},
		}
		for q, w := range want {
			if got := drain(t, ch, q); !slices.Equal(got, w) {
				t.Errorf("%s: got %v, want %v", q, got, w)
			}
		}
		// Unbinding stops the flow; deleting the e2e binding too.
		if err := ch.QueueUnbind("q1", "red", "dx", nil); err != nil {
			t.Fatal(err)
		}
		if err := ch.ExchangeUnbind("tx", "", "fx", false, nil); err != nil {
			t.Fatal(err)
		}
		pub("dx", "red", nil, "d-red2")
		pub("fx", "a.b", nil, "f2")
		if got := drain(t, ch, "q1"); !slices.Equal(got, []string{"f2"}) {
			t.Errorf("q1 after unbind: %v", got)
		}
		if got := drain(t, ch, "q2"); len(got) != 0 {
			t.Errorf("q2 after e2e unbind: %v", got)
		}
	})
}

func TestConfirmsAndReturns(t *testing.T) {
	brokers(t, func(t *testing.T, e *env) {
		ch := e.channel(e.dial())
		if err := ch.Confirm(false); err != nil {
			t.Fatal(err)
		}
		returns := ch.NotifyReturn(make(chan amqp.Return, 1))
		confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 100))
		q, err := ch.QueueDeclare("cq", false, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		const n = 50
		for i := range n {
			if err := ch.Publish("", q.Name, false, false, amqp.Publishing{Body: []byte(fmt.Sprint(i))}); err != nil {
				t.Fatal(err)
			}
		}
		// Unroutable and mandatory: basic.return 312 NO_ROUTE, then the ack.
		if err := ch.Publish("", "nowhere", true, false, amqp.Publishing{Body: []byte("lost"), MessageId: "m1"}); err != nil {
			t.Fatal(err)
		}
		for i := range n + 1 {
			c := mustRecv(t, confirms, "confirm")
			if c.DeliveryTag != uint64(i+1) || !c.Ack {
				t.Fatalf("confirm %d: %+v", i, c)
			}
		}
		r := mustRecv(t, returns, "return")
		if r.ReplyCode != 312 || r.ReplyText != "NO_ROUTE" || r.RoutingKey != "nowhere" || string(r.Body) != "lost" || r.MessageId != "m1" {
			t.Fatalf("return: %+v", r)
		}
		// Every acked message is stored.
		q, err = ch.QueueDeclarePassive("cq", false, false, false, false, nil)
		if err != nil || q.Messages != n {
			t.Fatalf("queue holds %d messages (%v), want %d", q.Messages, err, n)
		}
	})
}

func TestGetAndGetEmpty(t *testing.T) {
	brokers(t, func(t *testing.T, e *env) {
		ch := e.channel(e.dial())
		if _, err := ch.QueueDeclare("gq", false, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
		if _, ok, err := ch.Get("gq", false); err != nil || ok {
			t.Fatalf("get on empty queue: ok=%v err=%v", ok, err)
		}
		if err := ch.Confirm(false); err != nil {
			t.Fatal(err)
		}
		publishConfirmed(t, ch, "", "gq", "one", "two")
		d, ok, err := ch.Get("gq", false)
		if err != nil || !ok || string(d.Body) != "one" || d.MessageCount != 1 || d.Redelivered {
			t.Fatalf("first get: ok=%v err=%v %+v", ok, err, d)
		}
		// Reject with requeue: it comes back, redelivered.
		if err := d.Reject(true); err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		for range 2 {
			d, ok, err := ch.Get("gq", false)
			if err != nil || !ok {
				t.Fatalf("get: ok=%v err=%v", ok, err)
			}
			seen[string(d.Body)] = d.Redelivered
			if err := d.Ack(false); err != nil {
				t.Fatal(err)
			}
		}
		if len(seen) != 2 || !seen["one"] || seen["two"] {
			t.Fatalf("redelivered flags: %v", seen)
		}
		if _, ok, err := ch.Get("gq", true); err != nil || ok {
			t.Fatalf("drained queue: ok=%v err=%v", ok, err)
		}
	})
}

func TestNackAndRequeueOnClose(t *testing.T) {
	brokers(t, func(t *testing.T, e *env) {
		conn := e.dial()
		ch := e.channel(conn)
		if _, err := ch.QueueDeclare("nq", false, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
		if err := ch.Confirm(false); err != nil {
			t.Fatal(err)
		}
		publishConfirmed(t, ch, "", "nq", "a", "b", "c")
		msgs, err := ch.Consume("nq", "c1", false, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]amqp.Delivery{}
		for range 3 {
			d := mustRecv(t, msgs, "delivery")
			got[string(d.Body)] = d
		}
		// a: nack without requeue (dropped); b: nack with requeue; c: left unacked.
		if err := got["a"].Nack(false, false); err != nil {
			t.Fatal(err)
		}
		if err := got["b"].Nack(false, true); err != nil {
			t.Fatal(err)
		}
		d := mustRecv(t, msgs, "redelivery of b")
		if string(d.Body) != "b" || !d.Redelivered {
			t.Fatalf("redelivery: %q redelivered=%v", d.Body, d.Redelivered)
		}
		// Closing the channel gives b (again unacked) and c back.
		if err := ch.Close(); err != nil {
			t.Fatal(err)
		}
		ch2 := e.channel(conn)
		var bodies []string
		for {
			d, ok, err := ch2.Get("nq", false)
			if err != nil {
				t.Fatal(err)
			}
			if !ok {
				break
			}
			if !d.Redelivered {
				t.Errorf("%q not marked redelivered", d.Body)
			}
			bodies = append(bodies, string(d.Body))
			d.Ack(false)
		}
		sort.Strings(bodies)
		if !slices.Equal(bodies, []string{"b", "c"}) {
			t.Fatalf("after close: %v", bodies)
		}
	})
}

func TestPrefetchAndRoundRobin(t *testing.T) {
	brokers(t, func(t *testing.T, e *env) {
		conn := e.dial()
		pch := e.channel(conn)
		if _, err := pch.QueueDeclare("pq", false, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
		if err := pch.Confirm(false); err != nil {
			t.Fatal(err)
		}
		bodies := make([]string, 10)
		for i := range bodies {
			bodies[i] = fmt.Sprint(i)
		}
		publishConfirmed(t, pch, "", "pq", bodies...)

		// Two consumers with prefetch 1 on separate channels share the queue.
		type cons struct {
			ch   *amqp.Channel
			msgs <-chan amqp.Delivery
		}
		var cs []cons
		for i := range 2 {
			ch := e.channel(conn)
			if err := ch.Qos(1, 0, false); err != nil {
				t.Fatal(err)
			}
			msgs, err := ch.Consume("pq", fmt.Sprint("c", i), false, false, false, false, nil)
			if err != nil {
				t.Fatal(err)
			}
			cs = append(cs, cons{ch, msgs})
		}
		counts := [2]int{}
		total := 0
		for total < 10 {
			for i, c := range cs {
				select {
				case d := <-c.msgs:
					// Prefetch 1: nothing more may arrive before this ack.
					select {
					case extra := <-c.msgs:
						t.Fatalf("consumer %d got %q beyond prefetch 1", i, extra.Body)
					default:
					}
					counts[i]++
					total++
					d.Ack(false)
				case <-time.After(5 * time.Millisecond):
				}
			}
		}
		if counts[0] == 0 || counts[1] == 0 {
			t.Fatalf("one consumer got everything: %v", counts)
		}
	})
}

func TestConsumerCancelNotification(t *testing.T) {
	brokers(t, func(t *testing.T, e *env) {
		conn := e.dial()
		ch := e.channel(conn)
		if _, err := ch.QueueDeclare("doomed", false, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
		cancels := ch.NotifyCancel(make(chan string, 1))
		if _, err := ch.Consume("doomed", "watcher", false, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
		other := e.channel(e.dial())
		if _, err := other.QueueDelete("doomed", false, false, false); err != nil {
			t.Fatal(err)
		}
		if tag := mustRecv(t, cancels, "basic.cancel"); tag != "watcher" {
			t.Fatalf("cancelled %q", tag)
		}
	})
}

func TestExclusiveQueue(t *testing.T) {
	brokers(t, func(t *testing.T, e *env) {
		owner := e.channel(e.dial())
		q, err := owner.QueueDeclare("", false, true, true, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		other := e.channel(e.dial())
		_, err = other.Consume(q.Name, "", false, false, false, false, nil)
		want := "RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '" + q.Name + "' in vhost '" + e.vhost + "'. It could be originally declared on another connection or the exclusive property value does not match that of the original declaration."
		if amqpCode(err) != 405 || err.(*amqp.Error).Reason != want {
			t.Fatalf("consume from another connection: %v", err)
		}
		// Publishing to it from anywhere is fine.
		pub := e.channel(e.dial())
		if err := pub.Confirm(false); err != nil {
			t.Fatal(err)
		}
		publishConfirmed(t, pub, "", q.Name, "x")
		if got := drain(t, owner, q.Name); !slices.Equal(got, []string{"x"}) {
			t.Fatalf("owner got %v", got)
		}
	})
}

func TestTransactions(t *testing.T) {
	brokers(t, func(t *testing.T, e *env) {
		ch := e.channel(e.dial())
		if _, err := ch.QueueDeclare("txq", false, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
		if err := ch.Tx(); err != nil {
			t.Fatal(err)
		}
		ch.Publish("", "txq", false, false, amqp.Publishing{Body: []byte("rolled back")})
		if err := ch.TxRollback(); err != nil {
			t.Fatal(err)
		}
		ch.Publish("", "txq", false, false, amqp.Publishing{Body: []byte("committed")})
		if got := drain(t, ch, "txq"); len(got) != 0 {
			t.Fatalf("visible before commit: %v", got)
		}
		if err := ch.TxCommit(); err != nil {
			t.Fatal(err)
		}
		d, ok, err := ch.Get("txq", false)
		if err != nil || !ok || string(d.Body) != "committed" {
			t.Fatalf("after commit: %v %v %q", ok, err, d.Body)
		}
		// An ack inside a rolled-back transaction is undone.
		d.Ack(false)
		if err := ch.TxRollback(); err != nil {
			t.Fatal(err)
		}
		if err := ch.Close(); err != nil {
			t.Fatal(err)
		}
		ch = e.channel(e.dial())
		if got := drain(t, ch, "txq"); !slices.Equal(got, []string{"committed"}) {
			t.Fatalf("after rollback of the ack: %v", got)
		}
	})
}

// Per-message expiration and x-message-ttl: expired messages are not
// delivered. (The proxy's expiry has whole-second granularity.)
func TestMessageTTL(t *testing.T) {
	brokers(t, func(t *testing.T, e *env) {
		ch := e.channel(e.dial())
		if _, err := ch.QueueDeclare("ttl.q", false, false, false, false, amqp.Table{"x-message-ttl": int32(1000)}); err != nil {
			t.Fatal(err)
		}
		if _, err := ch.QueueDeclare("ttl.plain", false, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
		if err := ch.Confirm(false); err != nil {
			t.Fatal(err)
		}
		publishConfirmed(t, ch, "", "ttl.q", "queue ttl")
		dc, err := ch.PublishWithDeferredConfirm("", "ttl.plain", false, false, amqp.Publishing{Expiration: "1000", Body: []byte("msg ttl")})
		if err != nil || !dc.Wait() {
			t.Fatal(err)
		}
		publishConfirmed(t, ch, "", "ttl.plain", "kept")
		// Expiry is about time passing: wait it out (2.5 TTLs).
		time.Sleep(2500 * time.Millisecond)
		if got := drain(t, ch, "ttl.q"); len(got) != 0 {
			t.Errorf("ttl.q: %v delivered after its x-message-ttl", got)
		}
		if got := drain(t, ch, "ttl.plain"); !slices.Equal(got, []string{"kept"}) {
			t.Errorf("ttl.plain: got %v, want only the message without expiration", got)
		}
	})
}

// A prefetch-1 consumer that is its queue's only consumer fetches ahead;
// what it held but never delivered goes back uncounted: not redelivered,
// and a consumer that joins gets its share at once.
func TestReadAheadIsInvisible(t *testing.T) {
	brokers(t, func(t *testing.T, e *env) {
		conn := e.dial()
		ch := e.channel(conn)
		if _, err := ch.QueueDeclare("ra", false, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
		if err := ch.Confirm(false); err != nil {
			t.Fatal(err)
		}
		publishConfirmed(t, ch, "", "ra", "1", "2", "3", "4", "5", "6")
		a := e.channel(conn)
		if err := a.Qos(1, 0, false); err != nil {
			t.Fatal(err)
		}
		am, err := a.Consume("ra", "a", false, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		first := mustRecv(t, am, "first delivery")
		// A second consumer, while a holds its one unacked delivery: it
		// must get messages without a acking.
		b := e.channel(conn)
		if err := b.Qos(1, 0, false); err != nil {
			t.Fatal(err)
		}
		bm, err := b.Consume("ra", "b", false, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		d := mustRecv(t, bm, "delivery to the second consumer")
		if d.Redelivered {
			t.Errorf("%s marked redelivered", d.Body)
		}
		d.Ack(false)
		first.Ack(false)
		// Stop both; everything left is still undelivered.
		if err := a.Cancel("a", false); err != nil {
			t.Fatal(err)
		}
		if err := b.Cancel("b", false); err != nil {
			t.Fatal(err)
		}
		for {
			d, ok, err := ch.Get("ra", false)
			if err != nil {
				t.Fatal(err)
			}
			if !ok {
				break
			}
			// What a and b had in flight when cancelled stays unacked with
			// their channels; everything else was never delivered.
			if d.Redelivered {
				t.Errorf("%s marked redelivered though never delivered", d.Body)
			}
			d.Ack(false)
		}
	})
}

// basic.get sees messages a consumer of the same queue has not been given
// yet (in the proxy: ones it read ahead).
func TestGetBesideAConsumer(t *testing.T) {
	brokers(t, func(t *testing.T, e *env) {
		conn := e.dial()
		ch := e.channel(conn)
		if _, err := ch.QueueDeclare("gbc", false, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
		if err := ch.Confirm(false); err != nil {
			t.Fatal(err)
		}
		publishConfirmed(t, ch, "", "gbc", "1", "2", "3")
		cch := e.channel(conn)
		if err := cch.Qos(1, 0, false); err != nil {
			t.Fatal(err)
		}
		msgs, err := cch.Consume("gbc", "", false, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		mustRecv(t, msgs, "delivery") // held unacked: the consumer gets no more
		d, ok, err := ch.Get("gbc", false)
		if err != nil || !ok || d.Redelivered {
			t.Fatalf("get beside a consumer: ok=%v err=%v redelivered=%v", ok, err, d.Redelivered)
		}
		d.Ack(false)
	})
}

// Redeclaring an exclusive queue that was declared durable is fine, as in
// RabbitMQ 3.10 (found by this differential test: the proxy used to store
// exclusive queues as non-durable and refused it with 406).
func TestExclusiveDurableRedeclare(t *testing.T) {
	brokers(t, func(t *testing.T, e *env) {
		ch := e.channel(e.dial())
		if _, err := ch.QueueDeclare("exdur", true, false, true, false, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := ch.QueueDeclare("exdur", true, false, true, false, nil); err != nil {
			t.Fatalf("redeclare: %v", err)
		}
	})
}
