package amqp091

import (
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Direct reply-to (issue 17), against the proxy and RabbitMQ alike.

// TestDirectReplyTo: a requester consuming amq.rabbitmq.reply-to gets the
// replies published to its rewritten reply_to through the default
// exchange, on another connection; the name declares passively while the
// requester consumes and not after; a mandatory reply comes back
// unroutable (RabbitMQ 3.10 stores it in no queue) yet is delivered; a
// confirmed reply is acked; a reply after basic.cancel is dropped.
func TestDirectReplyTo(t *testing.T) {
	brokers(t, func(t *testing.T, e *env) {
		req := e.channel(e.dial())
		replies, err := req.Consume(replyToQueue, "rq", true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		declare(t, req, "rpc")
		if err := req.Publish("", "rpc", false, false, amqp.Publishing{ReplyTo: replyToQueue, CorrelationId: "c1", Body: []byte("ping")}); err != nil {
			t.Fatal(err)
		}

		resp := confirmChannel(t, e, e.dial())
		returns := resp.NotifyReturn(make(chan amqp.Return, 4))
		var d amqp.Delivery
		for deadline := time.Now().Add(10 * time.Second); ; {
			var ok bool
			if d, ok, err = resp.Get("rpc", true); err != nil {
				t.Fatal(err)
			} else if ok {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("request never arrived")
			}
			time.Sleep(20 * time.Millisecond)
		}
		name := d.ReplyTo
		if !strings.HasPrefix(name, replyToQueue+".") || len(name) <= len(replyToQueue)+1 {
			t.Fatalf("reply_to %q: not rewritten to a reply name", name)
		}
		q, err := resp.QueueDeclarePassive(name, false, false, false, false, nil)
		if err != nil || q.Consumers != 1 || q.Messages != 0 || q.Name != name {
			t.Fatalf("passive declare of the reply name: %+v %v", q, err)
		}
		if q, err := resp.QueueDeclare(replyToQueue, false, false, false, false, nil); err != nil || q.Consumers != 1 {
			t.Fatalf("declare of amq.rabbitmq.reply-to: %+v %v", q, err)
		}

		// A plain reply, confirmed.
		dc, err := resp.PublishWithDeferredConfirm("", name, false, false, amqp.Publishing{CorrelationId: "c1", Body: []byte("pong")})
		if err != nil {
			t.Fatal(err)
		}
		if !dc.Wait() {
			t.Fatal("reply nacked")
		}
		r := mustRecv(t, replies, "reply")
		if string(r.Body) != "pong" || r.CorrelationId != "c1" || r.Exchange != "" || r.RoutingKey != name || r.ConsumerTag != "rq" || r.Redelivered {
			t.Fatalf("reply %+v", r)
		}

		// Mandatory: delivered, and returned as unroutable.
		if err := resp.Publish("", name, true, false, amqp.Publishing{Body: []byte("m")}); err != nil {
			t.Fatal(err)
		}
		if r := mustRecv(t, replies, "mandatory reply"); string(r.Body) != "m" {
			t.Fatalf("mandatory reply %q", r.Body)
		}
		ret := mustRecv(t, returns, "return of the mandatory reply")
		if ret.ReplyCode != 312 || ret.ReplyText != "NO_ROUTE" || ret.RoutingKey != name {
			t.Fatalf("return %+v", ret)
		}

		// Several in a row keep their order.
		for _, b := range bodies(20) {
			if err := resp.Publish("", name, false, false, amqp.Publishing{Body: []byte(b)}); err != nil {
				t.Fatal(err)
			}
		}
		for _, b := range bodies(20) {
			if r := mustRecv(t, replies, "reply "+b); string(r.Body) != b {
				t.Fatalf("reply %q, want %q", r.Body, b)
			}
		}

		// Cancelled: replies are dropped and the name no longer declares.
		if err := req.Cancel("rq", false); err != nil {
			t.Fatal(err)
		}
		if err := resp.Publish("", name, false, false, amqp.Publishing{Body: []byte("late")}); err != nil {
			t.Fatal(err)
		}
		// The client closes the cancelled consumer's channel; nothing came before.
		select {
		case r, ok := <-replies:
			if ok {
				t.Fatalf("reply after cancel: %q", r.Body)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the client did not end the cancelled consumer")
		}
		_, err = resp.QueueDeclarePassive(name, false, false, false, false, nil)
		if amqpCode(err) != 404 || !strings.Contains(err.Error(), "NOT_FOUND - no queue '"+name+"' in vhost '"+e.vhost+"'") {
			t.Fatalf("passive declare after cancel: %v", err)
		}
		// The channel may consume again, under a new name.
		replies, err = req.Consume(replyToQueue, "", true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := req.Publish("", "rpc", false, false, amqp.Publishing{ReplyTo: replyToQueue, Body: []byte("again")}); err != nil {
			t.Fatal(err)
		}
		resp2 := e.channel(e.dial())
		for deadline := time.Now().Add(10 * time.Second); ; {
			var ok bool
			if d, ok, err = resp2.Get("rpc", true); err != nil {
				t.Fatal(err)
			} else if ok {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("second request never arrived")
			}
			time.Sleep(20 * time.Millisecond)
		}
		if d.ReplyTo == name || !strings.HasPrefix(d.ReplyTo, replyToQueue+".") {
			t.Fatalf("second reply name %q (first %q)", d.ReplyTo, name)
		}
		if err := resp2.Publish("", d.ReplyTo, false, false, amqp.Publishing{Body: []byte("pong2")}); err != nil {
			t.Fatal(err)
		}
		if r := mustRecv(t, replies, "second reply"); string(r.Body) != "pong2" {
			t.Fatalf("second reply %q", r.Body)
		}
		// In a transaction the reply goes out at once (RabbitMQ hands it over
		// while routing), rollback or not.
		if err := resp2.Tx(); err != nil {
			t.Fatal(err)
		}
		if err := resp2.Publish("", d.ReplyTo, false, false, amqp.Publishing{Body: []byte("in-tx")}); err != nil {
			t.Fatal(err)
		}
		if r := mustRecv(t, replies, "reply in a transaction"); string(r.Body) != "in-tx" {
			t.Fatalf("reply in a transaction %q", r.Body)
		}
		if err := resp2.TxRollback(); err != nil {
			t.Fatal(err)
		}
		// A closed requester channel: replies dropped, name gone.
		req.Close()
		if err := resp2.Publish("", d.ReplyTo, false, false, amqp.Publishing{Body: []byte("x")}); err != nil {
			t.Fatal(err)
		}
		if _, err := resp2.QueueDeclarePassive(d.ReplyTo, false, false, false, false, nil); amqpCode(err) != 404 {
			t.Fatalf("passive declare after the requester's channel closed: %v", err)
		}
	})
}

// TestDirectReplyToMisuse: RabbitMQ 3.10's refusals, codes and texts.
func TestDirectReplyToMisuse(t *testing.T) {
	brokers(t, func(t *testing.T, e *env) {
		cases := []struct {
			name string
			run  func(ch *amqp.Channel) error
			code int
			text string
		}{
			{"publish with reply-to before consuming", func(ch *amqp.Channel) error {
				if err := ch.Publish("", "nowhere", false, false, amqp.Publishing{ReplyTo: replyToQueue, Body: []byte("x")}); err != nil {
					return err
				}
				_, err := ch.QueueDeclare("probe.after", false, false, false, false, nil)
				return err
			}, 406, "PRECONDITION_FAILED - fast reply consumer does not exist"},
			{"consume in ack mode", func(ch *amqp.Channel) error {
				_, err := ch.Consume(replyToQueue, "", false, false, false, false, nil)
				return err
			}, 406, "PRECONDITION_FAILED - reply consumer cannot acknowledge"},
			{"second consumer", func(ch *amqp.Channel) error {
				if _, err := ch.Consume(replyToQueue, "", true, false, false, false, nil); err != nil {
					return err
				}
				_, err := ch.Consume(replyToQueue, "", true, false, false, false, nil)
				return err
			}, 406, "PRECONDITION_FAILED - reply consumer already set"},
			{"basic.get", func(ch *amqp.Channel) error {
				_, _, err := ch.Get(replyToQueue, true)
				return err
			}, 404, "NOT_FOUND - no queue 'amq.rabbitmq.reply-to' in vhost '" + e.vhost + "'"},
			{"declare an unknown reply name", func(ch *amqp.Channel) error {
				_, err := ch.QueueDeclarePassive(replyToQueue+".bogus", false, false, false, false, nil)
				return err
			}, 404, "NOT_FOUND - no queue 'amq.rabbitmq.reply-to.bogus' in vhost '" + e.vhost + "'"},
			{"consume with a tag in use", func(ch *amqp.Channel) error {
				declare(t, ch, "probe.tag")
				if _, err := ch.Consume("probe.tag", "t1", true, false, false, false, nil); err != nil {
					return err
				}
				_, err := ch.Consume(replyToQueue, "t1", true, false, false, false, nil)
				return err
			}, 530, "NOT_ALLOWED - attempt to reuse consumer tag 't1'"},
		}
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				conn := e.dial()
				ch := e.channel(conn)
				closed := ch.NotifyClose(make(chan *amqp.Error, 1))
				err := closeOvertook(t, c.run(ch), closed)
				var ae *amqp.Error
				if !errors.As(err, &ae) {
					t.Fatalf("error %v (%T), want %d %q", err, err, c.code, c.text)
				}
				if ae.Code != c.code || ae.Reason != c.text {
					t.Fatalf("got  %d %q\nwant %d %q", ae.Code, ae.Reason, c.code, c.text)
				}
			})
		}
		// Publishing reply_to amq.rabbitmq.reply-to without consuming is
		// refused; with a consumer on another channel of the connection too.
		conn := e.dial()
		a := e.channel(conn)
		if _, err := a.Consume(replyToQueue, "", true, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
		b := e.channel(conn)
		closed := b.NotifyClose(make(chan *amqp.Error, 1))
		b.Publish("", "nowhere", false, false, amqp.Publishing{ReplyTo: replyToQueue})
		if ae := mustRecv(t, closed, "close of the channel without a reply consumer"); ae.Code != 406 {
			t.Fatalf("got %v", ae)
		}
	})
}

// TestDirectReplyToAcrossReplicas: a reply published through another
// replica reaches the requester's channel over the peer port, in order,
// and the reply name declares there while the requester consumes.
func TestDirectReplyToAcrossReplicas(t *testing.T) {
	rs := newReplicas(t, 2)
	req := rs[0].channel(rs[0].dial())
	replies, err := req.Consume(replyToQueue, "", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Durable: the other replica shares only durable topology.
	if _, err := req.QueueDeclare("rpc.x", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := req.Publish("", "rpc.x", false, false, amqp.Publishing{ReplyTo: replyToQueue, Body: []byte("ping")}); err != nil {
		t.Fatal(err)
	}
	resp := rs[1].channel(rs[1].dial())
	var d amqp.Delivery
	for deadline := time.Now().Add(20 * time.Second); ; {
		var ok bool
		if d, ok, err = resp.Get("rpc.x", true); err != nil {
			t.Fatal(err)
		} else if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("request never arrived")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if q, err := resp.QueueDeclarePassive(d.ReplyTo, false, false, false, false, nil); err != nil || q.Consumers != 1 {
		t.Fatalf("passive declare of the reply name on the other replica: %+v %v", q, err)
	}
	for _, b := range bodies(50) {
		if err := resp.Publish("", d.ReplyTo, false, false, amqp.Publishing{CorrelationId: b, Headers: amqp.Table{"n": b}, Body: []byte(b)}); err != nil {
			t.Fatal(err)
		}
	}
	for _, b := range bodies(50) {
		r := mustRecv(t, replies, "reply "+b)
		if string(r.Body) != b || r.CorrelationId != b || r.Headers["n"] != b || r.RoutingKey != d.ReplyTo {
			t.Fatalf("reply %q %+v, want %q", r.Body, r, b)
		}
	}
	req.Close()
	if _, err := resp.QueueDeclarePassive(d.ReplyTo, false, false, false, false, nil); amqpCode(err) != 404 {
		t.Fatalf("passive declare after the requester closed: %v", err)
	}
}

// FuzzParseReplyName: any routing key after the reply prefix parses or is
// refused, never panics; what parses names a key and, when it names a
// replica, the node part is that address encoded as reply names carry it.
func FuzzParseReplyName(f *testing.F) {
	for _, s := range []string{"-.abc", "MTI3LjAuMC4xOjc5NDY.k", "bogus", ".k", "-.", "", "!!!.k", "-.a.b", "MTI3.x.y"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		addr, key, ok := parseReplyName(s)
		if !ok {
			return
		}
		if key == "" {
			t.Fatalf("%q: empty key", s)
		}
		node := "-"
		if addr != "" {
			node = base64.RawURLEncoding.EncodeToString([]byte(addr))
		}
		if want := node + "." + key; want != s {
			t.Fatalf("%q parsed as %q %q, which names %q", s, addr, key, want)
		}
	})
}

// TestPythonPikaDirectReplyTo: pika's RPC over direct reply-to.
func TestPythonPikaDirectReplyTo(t *testing.T) {
	py := pythonWithPika(t)
	brokers(t, func(t *testing.T, e *env) { runClient(t, e, py, "pika_rpc.py") })
}

// BenchmarkDirectReplyTo: RPC over direct reply-to, a requester with up to
// 64 requests outstanding and a responder (no-ack) on another connection,
// replies counted at the requester; the proxy and RabbitMQ in the same run.
func BenchmarkDirectReplyTo(b *testing.B) {
	for _, tg := range benchTargets(b) {
		b.Run(tg.name, func(b *testing.B) {
			_, req := benchDial(b, tg.url)
			_, srv := benchDial(b, tg.url)
			q := benchQueue(b, req, "rpc")
			replies, err := req.Consume(replyToQueue, "", true, false, false, false, nil)
			if err != nil {
				b.Fatal(err)
			}
			if err := srv.Qos(256, 0, false); err != nil {
				b.Fatal(err)
			}
			reqs, err := srv.Consume(q, "", true, false, false, false, nil)
			if err != nil {
				b.Fatal(err)
			}
			done := make(chan error, 1)
			go func() {
				for d := range reqs {
					if err := srv.Publish("", d.ReplyTo, false, false, amqp.Publishing{CorrelationId: d.CorrelationId, Body: d.Body}); err != nil {
						done <- err
						return
					}
				}
				done <- nil
			}()
			body := make([]byte, 128)
			const window = 64
			b.ResetTimer()
			start := time.Now()
			sent, got := 0, 0
			for got < b.N {
				for sent < b.N && sent-got < window {
					if err := req.Publish("", q, false, false, amqp.Publishing{ReplyTo: replyToQueue, CorrelationId: "c", Body: body}); err != nil {
						b.Fatal(err)
					}
					sent++
				}
				select {
				case <-replies:
					got++
				case err := <-done:
					b.Fatalf("responder ended: %v", err)
				case <-time.After(30 * time.Second):
					b.Fatalf("%d of %d replies", got, b.N)
				}
			}
			report(b, start, b.N, "rpc/s")
		})
	}
}
