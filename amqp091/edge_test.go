package amqp091

import (
	"errors"
	"reflect"
	"slices"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Edge semantics, checked on both brokers.

func expectCode(t *testing.T, err error, code int, what string) {
	t.Helper()
	if amqpCode(err) != code {
		t.Fatalf("%s: got %v, want %d", what, err, code)
	}
}

// eventually retries check until it holds (RabbitMQ does some things, such
// as auto-delete, asynchronously).
func eventually(t *testing.T, what string, check func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !check() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: never happened", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestEdgeSemantics(t *testing.T) {
	brokers(t, func(t *testing.T, e *env) {
		conn := e.dial()
		fresh := func() *amqp.Channel {
			ch := e.channel(conn)
			return ch
		}
		confirmed := func() *amqp.Channel {
			ch := fresh()
			if err := ch.Confirm(false); err != nil {
				t.Fatal(err)
			}
			return ch
		}

		t.Run("declare-ok counts", func(t *testing.T) {
			ch := confirmed()
			if _, err := ch.QueueDeclare("cnt", false, false, false, false, nil); err != nil {
				t.Fatal(err)
			}
			publishConfirmed(t, ch, "", "cnt", "a", "b")
			c2 := fresh()
			if _, err := c2.Consume("cnt", "x", false, false, false, false, nil); err != nil {
				t.Fatal(err)
			}
			eventually(t, "counts", func() bool {
				q, err := ch.QueueDeclarePassive("cnt", false, false, false, false, nil)
				return err == nil && q.Consumers == 1 && q.Messages == 0
			})
			c2.Close()
			eventually(t, "messages back after the consumer's channel closed", func() bool {
				q, err := ch.QueueDeclarePassive("cnt", false, false, false, false, nil)
				return err == nil && q.Consumers == 0 && q.Messages == 2
			})
		})

		t.Run("if-unused with a consumer", func(t *testing.T) {
			ch := fresh()
			if _, err := ch.QueueDeclare("used", false, false, false, false, nil); err != nil {
				t.Fatal(err)
			}
			if _, err := ch.Consume("used", "", false, false, false, false, nil); err != nil {
				t.Fatal(err)
			}
			_, err := fresh().QueueDelete("used", true, false, false)
			expectCode(t, err, 406, "delete if-unused")
		})

		t.Run("auto-delete queue goes with its last consumer", func(t *testing.T) {
			ch := fresh()
			if _, err := ch.QueueDeclare("ad.q", false, true, false, false, nil); err != nil {
				t.Fatal(err)
			}
			if _, err := ch.Consume("ad.q", "c", false, false, false, false, nil); err != nil {
				t.Fatal(err)
			}
			if err := ch.Cancel("c", false); err != nil {
				t.Fatal(err)
			}
			eventually(t, "auto-delete", func() bool {
				_, err := fresh().QueueDeclarePassive("ad.q", false, true, false, false, nil)
				return amqpCode(err) == 404
			})
		})

		t.Run("auto-delete exchange goes with its last binding", func(t *testing.T) {
			ch := fresh()
			if err := ch.ExchangeDeclare("ad.x", "fanout", false, true, false, false, nil); err != nil {
				t.Fatal(err)
			}
			if _, err := ch.QueueDeclare("ad.bound", false, false, false, false, nil); err != nil {
				t.Fatal(err)
			}
			if err := ch.QueueBind("ad.bound", "", "ad.x", false, nil); err != nil {
				t.Fatal(err)
			}
			if err := ch.QueueUnbind("ad.bound", "", "ad.x", nil); err != nil {
				t.Fatal(err)
			}
			eventually(t, "exchange auto-delete", func() bool {
				err := fresh().ExchangeDeclarePassive("ad.x", "fanout", false, true, false, false, nil)
				return amqpCode(err) == 404
			})
		})

		t.Run("missing ends of bindings", func(t *testing.T) {
			// Unbinding is idempotent in RabbitMQ 3.10, missing ends included
			// (found by this differential test).
			if err := fresh().QueueUnbind("nobody", "k", "amq.direct", nil); err != nil {
				t.Fatalf("unbind a missing queue: %v", err)
			}
			if err := fresh().QueueUnbind("nobody", "k", "no.such.x", nil); err != nil {
				t.Fatalf("unbind from a missing exchange: %v", err)
			}
			if err := fresh().ExchangeUnbind("no.dst", "k", "no.src", false, nil); err != nil {
				t.Fatalf("e2e unbind of missing exchanges: %v", err)
			}
			err := fresh().ExchangeBind("nowhere.x", "k", "amq.direct", false, nil)
			var ae *amqp.Error
			if !errors.As(err, &ae) || ae.Code != 404 || ae.Reason != "NOT_FOUND - no exchange 'nowhere.x' in vhost '"+e.vhost+"'" {
				t.Fatalf("e2e bind to a missing destination: %v", err)
			}
			err = fresh().ExchangeBind("amq.fanout", "k", "", false, nil)
			expectCode(t, err, 403, "e2e bind from the default exchange")
		})

		t.Run("mandatory through an e2e binding that leads nowhere", func(t *testing.T) {
			ch := confirmed()
			if err := ch.ExchangeDeclare("e2e.src", "topic", false, false, false, false, nil); err != nil {
				t.Fatal(err)
			}
			if err := ch.ExchangeDeclare("e2e.dst", "fanout", false, false, false, false, nil); err != nil {
				t.Fatal(err)
			}
			if err := ch.ExchangeBind("e2e.dst", "#", "e2e.src", false, nil); err != nil {
				t.Fatal(err)
			}
			returns := ch.NotifyReturn(make(chan amqp.Return, 1))
			dc, err := ch.PublishWithDeferredConfirm("e2e.src", "k", true, false, amqp.Publishing{Body: []byte("x")})
			if err != nil || !dc.Wait() {
				t.Fatal(err)
			}
			if r := mustRecv(t, returns, "return"); r.ReplyCode != 312 {
				t.Fatalf("return %+v", r)
			}
		})

		t.Run("publish to a missing queue without mandatory", func(t *testing.T) {
			ch := confirmed()
			dc, err := ch.PublishWithDeferredConfirm("", "no-such-queue", false, false, amqp.Publishing{Body: []byte("x")})
			if err != nil || !dc.Wait() {
				t.Fatalf("%v", err)
			}
		})

		t.Run("nack multiple and recover", func(t *testing.T) {
			ch := confirmed()
			if _, err := ch.QueueDeclare("nm", false, false, false, false, nil); err != nil {
				t.Fatal(err)
			}
			publishConfirmed(t, ch, "", "nm", "1", "2", "3")
			c := fresh()
			msgs, err := c.Consume("nm", "", false, false, false, false, nil)
			if err != nil {
				t.Fatal(err)
			}
			var last amqp.Delivery
			for range 3 {
				last = mustRecv(t, msgs, "delivery")
			}
			if err := last.Nack(true, true); err != nil { // all three back
				t.Fatal(err)
			}
			var again []string
			for range 3 {
				d := mustRecv(t, msgs, "redelivery")
				if !d.Redelivered {
					t.Errorf("%s not redelivered", d.Body)
				}
				again = append(again, string(d.Body))
			}
			slices.Sort(again)
			if !slices.Equal(again, []string{"1", "2", "3"}) {
				t.Fatalf("after nack multiple: %v", again)
			}
			if err := c.Recover(true); err != nil {
				t.Fatal(err)
			}
			for range 3 {
				d := mustRecv(t, msgs, "after recover")
				if !d.Redelivered {
					t.Errorf("%s not redelivered after recover", d.Body)
				}
				d.Ack(false)
			}
		})

		t.Run("ack multiple with tag 0 acks everything", func(t *testing.T) {
			ch := confirmed()
			if _, err := ch.QueueDeclare("am0", false, false, false, false, nil); err != nil {
				t.Fatal(err)
			}
			publishConfirmed(t, ch, "", "am0", "1", "2")
			c := fresh()
			for range 2 {
				if _, ok, err := c.Get("am0", false); err != nil || !ok {
					t.Fatalf("get: %v %v", ok, err)
				}
			}
			if err := c.Ack(0, true); err != nil {
				t.Fatal(err)
			}
			if err := c.Close(); err != nil {
				t.Fatalf("close after ack-all: %v", err)
			}
			if got := drain(t, fresh(), "am0"); len(got) != 0 {
				t.Fatalf("still there: %v", got)
			}
		})

		t.Run("global prefetch spans the channel's consumers", func(t *testing.T) {
			ch := confirmed()
			for _, q := range []string{"gp1", "gp2"} {
				if _, err := ch.QueueDeclare(q, false, false, false, false, nil); err != nil {
					t.Fatal(err)
				}
				publishConfirmed(t, ch, "", q, q+"a", q+"b")
			}
			c := fresh()
			if err := c.Qos(1, 0, true); err != nil {
				t.Fatal(err)
			}
			m1, err := c.Consume("gp1", "", false, false, false, false, nil)
			if err != nil {
				t.Fatal(err)
			}
			m2, err := c.Consume("gp2", "", false, false, false, false, nil)
			if err != nil {
				t.Fatal(err)
			}
			var got amqp.Delivery
			select {
			case got = <-m1:
			case got = <-m2:
			case <-time.After(10 * time.Second):
				t.Fatal("no delivery")
			}
			select {
			case d := <-m1:
				t.Fatalf("second delivery %s beyond the channel's prefetch 1", d.Body)
			case d := <-m2:
				t.Fatalf("second delivery %s beyond the channel's prefetch 1", d.Body)
			case <-time.After(300 * time.Millisecond):
			}
			got.Ack(false)
			select {
			case <-m1:
			case <-m2:
			case <-time.After(10 * time.Second):
				t.Fatal("no delivery after the ack")
			}
		})

		t.Run("passive declare of another connection's exclusive queue", func(t *testing.T) {
			q, err := fresh().QueueDeclare("", false, true, true, false, nil)
			if err != nil {
				t.Fatal(err)
			}
			other := e.channel(e.dial())
			_, err = other.QueueDeclarePassive(q.Name, false, true, true, false, nil)
			expectCode(t, err, 405, "passive declare of a locked queue")
		})

		t.Run("cancel of an unknown consumer tag", func(t *testing.T) {
			if err := fresh().Cancel("never-was", false); err != nil {
				t.Fatal(err)
			}
		})
	})
}

func expectReply(t *testing.T, err error, code int, text string) {
	t.Helper()
	var ae *amqp.Error
	if !errors.As(err, &ae) || ae.Code != code || ae.Reason != text {
		t.Fatalf("got %v\nwant %d %q", err, code, text)
	}
}

func TestEdgeSemanticsArgs(t *testing.T) {
	brokers(t, func(t *testing.T, e *env) {
		conn := e.dial()
		fresh := func() *amqp.Channel { return e.channel(conn) }
		vh := e.vhost

		t.Run("queue argument differs", func(t *testing.T) {
			ch := fresh()
			if _, err := ch.QueueDeclare("ttlq", false, false, false, false, amqp.Table{"x-message-ttl": int32(1000)}); err != nil {
				t.Fatal(err)
			}
			_, err := fresh().QueueDeclare("ttlq", false, false, false, false, amqp.Table{"x-message-ttl": int32(2000)})
			expectReply(t, err, 406, "PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue 'ttlq' in vhost '"+vh+"': received '2000' but current is '1000'")
			_, err = fresh().QueueDeclare("ttlq", false, false, false, false, nil)
			expectReply(t, err, 406, "PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue 'ttlq' in vhost '"+vh+"': received none but current is the value '1000' of type 'signedint'")
			// Another integer width with the same value is equivalent.
			if _, err := fresh().QueueDeclare("ttlq", false, false, false, false, amqp.Table{"x-message-ttl": int64(1000)}); err != nil {
				t.Fatalf("same value as long: %v", err)
			}
			// Arguments RabbitMQ does not compare may differ.
			if _, err := fresh().QueueDeclare("ttlq", false, false, false, false, amqp.Table{"x-message-ttl": int32(1000), "x-custom": "v"}); err != nil {
				t.Fatalf("extra unknown argument: %v", err)
			}
		})

		t.Run("exchange alternate-exchange differs", func(t *testing.T) {
			ch := fresh()
			if err := ch.ExchangeDeclare("aex", "direct", false, false, false, false, amqp.Table{"alternate-exchange": "a1"}); err != nil {
				t.Fatal(err)
			}
			err := fresh().ExchangeDeclare("aex", "direct", false, false, false, false, amqp.Table{"alternate-exchange": "a2"})
			expectReply(t, err, 406, "PRECONDITION_FAILED - inequivalent arg 'alternate-exchange' for exchange 'aex' in vhost '"+vh+"': received 'a2' but current is 'a1'")
			err = fresh().ExchangeDeclare("aex", "direct", true, false, false, false, amqp.Table{"alternate-exchange": "a1"})
			expectReply(t, err, 406, "PRECONDITION_FAILED - inequivalent arg 'durable' for exchange 'aex' in vhost '"+vh+"': received 'true' but current is 'false'")
			// A passive declare ignores type and flags.
			if err := fresh().ExchangeDeclarePassive("aex", "fanout", true, true, false, false, nil); err != nil {
				t.Fatalf("passive with other type: %v", err)
			}
		})

		t.Run("queue auto_delete differs", func(t *testing.T) {
			if _, err := fresh().QueueDeclare("adq2", false, false, false, false, nil); err != nil {
				t.Fatal(err)
			}
			_, err := fresh().QueueDeclare("adq2", false, true, false, false, nil)
			expectReply(t, err, 406, "PRECONDITION_FAILED - inequivalent arg 'auto_delete' for queue 'adq2' in vhost '"+vh+"': received 'true' but current is 'false'")
		})

		t.Run("exclusive redeclare from the owner without exclusive", func(t *testing.T) {
			ch := fresh()
			if _, err := ch.QueueDeclare("exq", false, false, true, false, nil); err != nil {
				t.Fatal(err)
			}
			_, err := ch.QueueDeclare("exq", false, false, false, false, nil)
			expectCode(t, err, 405, "owner redeclaring without exclusive")
		})

		t.Run("consume from a missing queue", func(t *testing.T) {
			_, err := fresh().Consume("ghost", "", false, false, false, false, nil)
			expectReply(t, err, 404, "NOT_FOUND - no queue 'ghost' in vhost '"+vh+"'")
		})

		t.Run("exchange if-unused with only an e2e binding to it", func(t *testing.T) {
			ch := fresh()
			for _, x := range []string{"iu.src", "iu.dst"} {
				if err := ch.ExchangeDeclare(x, "fanout", false, false, false, false, nil); err != nil {
					t.Fatal(err)
				}
			}
			if err := ch.ExchangeBind("iu.dst", "", "iu.src", false, nil); err != nil {
				t.Fatal(err)
			}
			// iu.dst is only a destination: not in use.
			if err := fresh().ExchangeDelete("iu.dst", true, false); err != nil {
				t.Fatalf("delete a destination-only exchange if-unused: %v", err)
			}
			if err := ch.ExchangeDeclare("iu.dst2", "fanout", false, false, false, false, nil); err != nil {
				t.Fatal(err)
			}
			if err := ch.ExchangeBind("iu.dst2", "", "iu.src", false, nil); err != nil {
				t.Fatal(err)
			}
			err := fresh().ExchangeDelete("iu.src", true, false)
			expectReply(t, err, 406, "PRECONDITION_FAILED - exchange 'iu.src' in vhost '"+vh+"' in use")
		})

		t.Run("deleting a queue drops its bindings", func(t *testing.T) {
			ch := fresh()
			if err := ch.Confirm(false); err != nil {
				t.Fatal(err)
			}
			if _, err := ch.QueueDeclare("rebound", false, false, false, false, nil); err != nil {
				t.Fatal(err)
			}
			if err := ch.QueueBind("rebound", "k", "amq.direct", false, nil); err != nil {
				t.Fatal(err)
			}
			if err := ch.QueueBind("rebound", "k", "amq.direct", false, nil); err != nil {
				t.Fatalf("binding twice: %v", err)
			}
			if _, err := ch.QueueDelete("rebound", false, false, false); err != nil {
				t.Fatal(err)
			}
			if _, err := ch.QueueDeclare("rebound", false, false, false, false, nil); err != nil {
				t.Fatal(err)
			}
			publishConfirmed(t, ch, "amq.direct", "k", "old binding?")
			if got := drain(t, ch, "rebound"); len(got) != 0 {
				t.Fatalf("routed through a binding of the deleted queue: %v", got)
			}
		})

		t.Run("get no-ack and message count", func(t *testing.T) {
			ch := fresh()
			if err := ch.Confirm(false); err != nil {
				t.Fatal(err)
			}
			if _, err := ch.QueueDeclare("gna", false, false, false, false, nil); err != nil {
				t.Fatal(err)
			}
			publishConfirmed(t, ch, "", "gna", "1", "2", "3")
			d, ok, err := ch.Get("gna", true)
			if err != nil || !ok || d.MessageCount != 2 {
				t.Fatalf("get: %v %v %d", ok, err, d.MessageCount)
			}
			n, err := ch.QueuePurge("gna", false)
			if err != nil || n != 2 {
				t.Fatalf("purge: %d %v", n, err)
			}
			if got := drain(t, ch, "gna"); len(got) != 0 {
				t.Fatalf("after purge: %v", got)
			}
		})
	})
}

// Every basic property and header type survives the trip through the
// broker exactly as RabbitMQ returns it.
func TestPropertiesRoundTrip(t *testing.T) {
	brokers(t, func(t *testing.T, e *env) {
		ch := e.channel(e.dial())
		if err := ch.Confirm(false); err != nil {
			t.Fatal(err)
		}
		if _, err := ch.QueueDeclare("props", false, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
		ts := time.Unix(1700000000, 0)
		pub := amqp.Publishing{
			ContentType: "application/json", ContentEncoding: "gzip", DeliveryMode: 2, Priority: 5,
			CorrelationId: "corr", ReplyTo: "replies", Expiration: "600000", MessageId: "mid", Timestamp: ts,
			Type: "kind", UserId: "guest", AppId: "app",
			Headers: amqp.Table{
				"bool": true, "int8": int8(-1), "int16": int16(-300), "int32": int32(-70000), "int64": int64(1 << 40),
				"float32": float32(1.5), "float64": 2.25, "string": "s", "bytes": []byte{1, 2, 3},
				"decimal": amqp.Decimal{Scale: 2, Value: 12345}, "time": ts, "nested": amqp.Table{"a": int32(1)},
				"array": []interface{}{"x", int32(2), true}, "void": nil,
			},
			Body: []byte("payload"),
		}
		dc, err := ch.PublishWithDeferredConfirm("", "props", false, false, pub)
		if err != nil || !dc.Wait() {
			t.Fatal(err)
		}
		d, ok, err := ch.Get("props", true)
		if err != nil || !ok {
			t.Fatalf("get: %v %v", ok, err)
		}
		got := amqp.Publishing{ContentType: d.ContentType, ContentEncoding: d.ContentEncoding, DeliveryMode: d.DeliveryMode,
			Priority: d.Priority, CorrelationId: d.CorrelationId, ReplyTo: d.ReplyTo, Expiration: d.Expiration,
			MessageId: d.MessageId, Timestamp: d.Timestamp, Type: d.Type, UserId: d.UserId, AppId: d.AppId,
			Headers: d.Headers, Body: d.Body}
		if !reflect.DeepEqual(got, pub) {
			t.Fatalf("round trip:\n got %#v\nwant %#v", got, pub)
		}
	})
}
