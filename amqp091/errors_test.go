package amqp091

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/kubemq-io/kubemq-proxy/amqp091/wire"
	"github.com/kubemq-io/kubemq-proxy/delivery"
	"github.com/kubemq-io/kubemq-proxy/kubemqclient"
)

// TestRabbitMQReplies checks the reply codes and texts RabbitMQ 3.10.8 gives
// (recorded from a RabbitMQ 3.10.8 node, and checked again against one
// when rabbitmq-server is installed), with vhost '/' replaced
// by the test's vhost.
func TestRabbitMQReplies(t *testing.T) {
	brokers(t, func(t *testing.T, e *env) {
		vh := e.vhost
		cases := []struct {
			name string
			run  func(ch *amqp.Channel) error
			code int
			text string
		}{
			{"queue.declare passive missing", func(ch *amqp.Channel) error {
				_, err := ch.QueueDeclarePassive("probe.missing", false, false, false, false, nil)
				return err
			}, 404, "NOT_FOUND - no queue 'probe.missing' in vhost '" + vh + "'"},
			{"exchange.declare bogus type", func(ch *amqp.Channel) error {
				return ch.ExchangeDeclare("probe.x", "x-bogus", false, false, false, false, nil)
			}, 503, "COMMAND_INVALID - unknown exchange type 'x-bogus'"},
			{"queue.declare amq.* name", func(ch *amqp.Channel) error {
				_, err := ch.QueueDeclare("amq.probe", false, false, false, false, nil)
				return err
			}, 403, "ACCESS_REFUSED - queue name 'amq.probe' contains reserved prefix 'amq.*'"},
			{"queue redeclare inequivalent durable", func(ch *amqp.Channel) error {
				if _, err := ch.QueueDeclare("probe.q1", false, false, false, false, nil); err != nil {
					return err
				}
				_, err := ch.QueueDeclare("probe.q1", true, false, false, false, nil)
				return err
			}, 406, "PRECONDITION_FAILED - inequivalent arg 'durable' for queue 'probe.q1' in vhost '" + vh + "': received 'true' but current is 'false'"},
			{"publish to missing exchange", func(ch *amqp.Channel) error {
				if err := ch.Publish("probe.noex", "k", false, false, amqp.Publishing{Body: []byte("x")}); err != nil {
					return err
				}
				_, err := ch.QueueDeclare("probe.after", false, false, false, false, nil) // a sync call sees the close
				return err
			}, 404, "NOT_FOUND - no exchange 'probe.noex' in vhost '" + vh + "'"},
			{"ack unknown delivery tag", func(ch *amqp.Channel) error {
				ch.Ack(999, false)
				_, err := ch.QueueDeclare("probe.after", false, false, false, false, nil)
				return err
			}, 406, "PRECONDITION_FAILED - unknown delivery tag 999"},
			{"basic.recover(requeue=false)", func(ch *amqp.Channel) error {
				return ch.Recover(false)
			}, 540, "NOT_IMPLEMENTED - requeue=false"},
			{"basic.qos prefetch_size=1024", func(ch *amqp.Channel) error {
				return ch.Qos(0, 1024, false)
			}, 540, "NOT_IMPLEMENTED - prefetch_size!=0 (1024)"},
			{"publish immediate=true", func(ch *amqp.Channel) error {
				if err := ch.Publish("", "x", false, true, amqp.Publishing{Body: []byte("x")}); err != nil {
					return err
				}
				_, err := ch.QueueDeclare("probe.after", false, false, false, false, nil)
				return err
			}, 540, "NOT_IMPLEMENTED - immediate=true"},
			{"channel.flow(active=false)", func(ch *amqp.Channel) error {
				return ch.Flow(false)
			}, 540, "NOT_IMPLEMENTED - active=false"},
			{"queue.bind to default exchange", func(ch *amqp.Channel) error {
				if _, err := ch.QueueDeclare("probe.b", false, false, false, false, nil); err != nil {
					return err
				}
				return ch.QueueBind("probe.b", "k", "", false, nil)
			}, 403, "ACCESS_REFUSED - operation not permitted on the default exchange"},
			{"exchange.declare reserved amq.* name", func(ch *amqp.Channel) error {
				return ch.ExchangeDeclare("amq.probe", "direct", false, false, false, false, nil)
			}, 403, "ACCESS_REFUSED - exchange name 'amq.probe' contains reserved prefix 'amq.*'"},
			{"exchange.declare amq.direct as topic", func(ch *amqp.Channel) error {
				return ch.ExchangeDeclare("amq.direct", "topic", true, false, false, false, nil)
			}, 406, "PRECONDITION_FAILED - inequivalent arg 'type' for exchange 'amq.direct' in vhost '" + vh + "': received 'topic' but current is 'direct'"},
			{"x-queue-type=stream non-durable", func(ch *amqp.Channel) error {
				_, err := ch.QueueDeclare("probe.stream", false, false, false, false, amqp.Table{"x-queue-type": "stream"})
				return err
			}, 406, "PRECONDITION_FAILED - invalid property 'non-durable' for queue 'probe.stream' in vhost '" + vh + "'"},
			{"x-queue-type=quorum non-durable", func(ch *amqp.Channel) error {
				_, err := ch.QueueDeclare("probe.quorum", false, false, false, false, amqp.Table{"x-queue-type": "quorum"})
				return err
			}, 406, "PRECONDITION_FAILED - invalid property 'non-durable' for queue 'probe.quorum' in vhost '" + vh + "'"},
			{"x-queue-type=bogus", func(ch *amqp.Channel) error {
				_, err := ch.QueueDeclare("probe.bogusqt", true, false, false, false, amqp.Table{"x-queue-type": "bogus"})
				return err
			}, 406, "PRECONDITION_FAILED - invalid arg 'x-queue-type' for queue 'probe.bogusqt' in vhost '" + vh + "': \"unsupported queue type 'bogus'\""},
			{"x-expires=0", func(ch *amqp.Channel) error {
				_, err := ch.QueueDeclare("probe.exp0", false, false, false, false, amqp.Table{"x-expires": int32(0)})
				return err
			}, 406, "PRECONDITION_FAILED - invalid arg 'x-expires' for queue 'probe.exp0' in vhost '" + vh + "': {value_zero,0}"},
			{"x-message-ttl=-1", func(ch *amqp.Channel) error {
				_, err := ch.QueueDeclare("probe.ttlneg", false, false, false, false, amqp.Table{"x-message-ttl": int32(-1)})
				return err
			}, 406, "PRECONDITION_FAILED - invalid arg 'x-message-ttl' for queue 'probe.ttlneg' in vhost '" + vh + "': {value_negative,-1}"},
			{"x-overflow=bogus", func(ch *amqp.Channel) error {
				_, err := ch.QueueDeclare("probe.ovf", false, false, false, false, amqp.Table{"x-overflow": "bogus"})
				return err
			}, 406, "PRECONDITION_FAILED - invalid arg 'x-overflow' for queue 'probe.ovf' in vhost '" + vh + "': invalid_overflow"},
			{"x-max-priority=300", func(ch *amqp.Channel) error {
				_, err := ch.QueueDeclare("probe.prio", false, false, false, false, amqp.Table{"x-max-priority": int32(300)})
				return err
			}, 406, "PRECONDITION_FAILED - invalid arg 'x-max-priority' for queue 'probe.prio' in vhost '" + vh + "': {max_value_exceeded,300}"},
			{"queue.delete if-empty on non-empty", func(ch *amqp.Channel) error {
				if _, err := ch.QueueDeclare("probe.ne", false, false, false, false, nil); err != nil {
					return err
				}
				if err := ch.Confirm(false); err != nil {
					return err
				}
				dc, err := ch.PublishWithDeferredConfirm("", "probe.ne", false, false, amqp.Publishing{Body: []byte("x")})
				if err != nil {
					return err
				}
				dc.Wait()
				_, err = ch.QueueDelete("probe.ne", false, true, false)
				return err
			}, 406, "PRECONDITION_FAILED - queue 'probe.ne' in vhost '" + vh + "' not empty"},
			{"basic.get on amq.rabbitmq.reply-to", func(ch *amqp.Channel) error {
				_, _, err := ch.Get("amq.rabbitmq.reply-to", true)
				return err
			}, 404, "NOT_FOUND - no queue 'amq.rabbitmq.reply-to' in vhost '" + vh + "'"},
			{"confirm.select after tx.select", func(ch *amqp.Channel) error {
				if err := ch.Tx(); err != nil {
					return err
				}
				return ch.Confirm(false)
			}, 406, "PRECONDITION_FAILED - cannot switch from tx to confirm mode"},
			{"consume exclusive twice", func(ch *amqp.Channel) error {
				if _, err := ch.QueueDeclare("probe.cex", false, false, false, false, nil); err != nil {
					return err
				}
				if _, err := ch.Consume("probe.cex", "a", false, true, false, false, nil); err != nil {
					return err
				}
				_, err := ch.Consume("probe.cex", "b", false, true, false, false, nil)
				return err
			}, 403, "ACCESS_REFUSED - queue 'probe.cex' in vhost '" + vh + "' in exclusive use"},
			{"consume duplicate consumer tag", func(ch *amqp.Channel) error {
				if _, err := ch.QueueDeclare("probe.dup", false, false, false, false, nil); err != nil {
					return err
				}
				if _, err := ch.Consume("probe.dup", "same", false, false, false, false, nil); err != nil {
					return err
				}
				_, err := ch.Consume("probe.dup", "same", false, false, false, false, nil)
				return err
			}, 530, "NOT_ALLOWED - attempt to reuse consumer tag 'same'"},
			{"bind to missing queue", func(ch *amqp.Channel) error {
				return ch.QueueBind("probe.nq", "k", "amq.direct", false, nil)
			}, 404, "NOT_FOUND - no queue 'probe.nq' in vhost '" + vh + "'"},
			{"publish to internal exchange", func(ch *amqp.Channel) error {
				if err := ch.ExchangeDeclare("probe.int", "fanout", false, false, true, false, nil); err != nil {
					return err
				}
				if err := ch.Publish("probe.int", "", false, false, amqp.Publishing{Body: []byte("x")}); err != nil {
					return err
				}
				_, err := ch.QueueDeclare("probe.after", false, false, false, false, nil)
				return err
			}, 403, "ACCESS_REFUSED - cannot publish to internal exchange 'probe.int' in vhost '" + vh + "'"},
			{"delete system exchange", func(ch *amqp.Channel) error {
				return ch.ExchangeDelete("amq.topic", false, false)
			}, 403, "ACCESS_REFUSED - deletion of system exchange 'amq.topic' in vhost '" + vh + "' not allowed"},
			{"headers binding with bad x-match", func(ch *amqp.Channel) error {
				if _, err := ch.QueueDeclare("probe.h", false, false, false, false, nil); err != nil {
					return err
				}
				return ch.QueueBind("probe.h", "", "amq.headers", false, amqp.Table{"x-match": "bogus"})
			}, 406, `PRECONDITION_FAILED - Invalid x-match field value <<"bogus">>; expected all, any, all-with-x, or any-with-x`},
			{"user-id spoofing", func(ch *amqp.Channel) error {
				if err := ch.Publish("", "x", false, false, amqp.Publishing{UserId: "admin", Body: []byte("x")}); err != nil {
					return err
				}
				_, err := ch.QueueDeclare("probe.after", false, false, false, false, nil)
				return err
			}, 406, "PRECONDITION_FAILED - user_id property set to 'admin' but authenticated user was 'guest'"},
			{"invalid expiration", func(ch *amqp.Channel) error {
				if err := ch.Publish("", "x", false, false, amqp.Publishing{Expiration: "abc", Body: []byte("x")}); err != nil {
					return err
				}
				_, err := ch.QueueDeclare("probe.after", false, false, false, false, nil)
				return err
			}, 406, "PRECONDITION_FAILED - invalid expiration 'abc': no_integer"},
		}
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				conn := e.dial()
				ch := e.channel(conn)
				closed := ch.NotifyClose(make(chan *amqp.Error, 1))
				err := closeOvertook(t, c.run(ch), closed)
				if err == nil {
					t.Fatalf("no error, want %d %q", c.code, c.text)
				}
				var ae *amqp.Error
				if !errors.As(err, &ae) {
					t.Fatalf("error %v (%T), want an AMQP exception", err, err)
				}
				if ae.Code != c.code || ae.Reason != c.text {
					t.Fatalf("got  %d %q\nwant %d %q", ae.Code, ae.Reason, c.code, c.text)
				}
			})
		}

		// Soft successes RabbitMQ gives.
		conn := e.dial()
		ch := e.channel(conn)
		if n, err := ch.QueueDelete("probe.never", false, false, false); err != nil || n != 0 {
			t.Fatalf("queue.delete missing queue: %d %v", n, err)
		}
		if _, err := ch.QueueDeclare("probe.unk", false, false, false, false, amqp.Table{"x-whatever": "v"}); err != nil {
			t.Fatalf("unknown x-arg: %v", err)
		}
		if err := ch.Qos(5, 0, true); err != nil {
			t.Fatalf("qos global: %v", err)
		}
		if err := ch.ExchangeDelete("probe.noex", false, false); err != nil {
			t.Fatalf("exchange.delete missing: %v", err)
		}
		if err := ch.QueueUnbind("probe.unk", "nokey", "amq.direct", nil); err != nil {
			t.Fatalf("unbind missing binding: %v", err)
		}
	})
}

func TestBackendErrorMapping(t *testing.T) {
	cases := []struct {
		err  error
		code uint16
		hard bool
	}{
		{&kubemqclient.Error{Op: "x", Msg: "down", Retryable: true}, wire.ReplyInternalError, true},
		{delivery.ErrLeasesLost, wire.ReplyConnectionForced, true},
		{delivery.ErrClosed, wire.ReplyConnectionForced, true},
		{errors.New("boom"), wire.ReplyInternalError, true},
		{wire.NotFound("x"), wire.ReplyNotFound, false},
		{fmt.Errorf("declare: %w", kubemqclient.ErrResourceExhausted), wire.ReplyResourceError, true},
	}
	for _, c := range cases {
		got := asAMQP(c.err)
		if got.Code != c.code || got.Hard != c.hard {
			t.Errorf("%v: got %d hard=%v, want %d hard=%v", c.err, got.Code, got.Hard, c.code, c.hard)
		}
	}
	if !strings.HasPrefix(errBackendDown("x").Text, "CONNECTION_FORCED - ") {
		t.Error(errBackendDown("x").Text)
	}
}

// closeOvertook returns err, the error of a call that was to observe the
// server closing its channel or connection, or, when the close overtook the
// call, the error the channel was closed with (from closed, its NotifyClose):
// the client then says the channel is closed, or, after a connection
// exception, its write found the socket the server had closed.
func closeOvertook(t *testing.T, err error, closed chan *amqp.Error) error {
	t.Helper()
	var opErr *net.OpError
	if errors.Is(err, amqp.ErrClosed) || errors.As(err, &opErr) {
		if ae := mustRecv(t, closed, "channel close"); ae != nil {
			return ae
		}
	}
	return err
}
