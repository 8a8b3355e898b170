package amqp091

import (
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/kubemq-io/kubemq-proxy/amqp091/wire"
)

// What a client sent before it closed its connection, or before the
// method that made the server close it, is done: RabbitMQ's channels
// handle their methods in order, and the close comes after them. A client
// that acks and closes at once (a worker that exits) must not see its
// messages again; one that publishes and closes must find them stored.

// closingRounds repeats the close scenarios: whether the methods are still
// queued in the channel when the close arrives is a race.
const closingRounds = 4

func TestAcksBeforeConnectionCloseAreApplied(t *testing.T) {
	brokers(t, func(t *testing.T, e *env) {
		ch, q := confirmedQueue(t, e)
		const n = 300
		for round := range closingRounds {
			bodies := make([]string, n)
			for i := range bodies {
				bodies[i] = fmt.Sprint(round, "-", i)
			}
			resent := sendsResent(e)
			publishConfirmed(t, ch, "", q.Name, bodies...)
			c2, err := amqp.Dial(e.url())
			if err != nil {
				t.Fatal(err)
			}
			ch2 := e.channel(c2)
			if err := ch2.Qos(n, 0, false); err != nil {
				t.Fatal(err)
			}
			ds, err := ch2.Consume(q.Name, "", false, false, false, false, nil)
			if err != nil {
				t.Fatal(err)
			}
			for range n {
				d := mustRecv(t, ds, "delivery")
				if err := d.Ack(false); err != nil {
					t.Fatal(err)
				}
			}
			if err := c2.Close(); err != nil {
				t.Fatal(err)
			}
			noneLeft(t, e, round, n, drain(t, ch, q.Name), resent)
		}
	})
}

func TestPublishesBeforeConnectionCloseAreStored(t *testing.T) {
	brokers(t, func(t *testing.T, e *env) {
		ch := e.channel(e.dial())
		q, err := ch.QueueDeclare("closing-"+randHex(4), false, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		const n = 300
		for round := range closingRounds {
			c2, err := amqp.Dial(e.url())
			if err != nil {
				t.Fatal(err)
			}
			ch2 := e.channel(c2)
			for i := range n {
				if err := ch2.Publish("", q.Name, false, false, amqp.Publishing{Body: []byte(fmt.Sprint(round, "-", i))}); err != nil {
					t.Fatal(err)
				}
			}
			if err := c2.Close(); err != nil {
				t.Fatal(err)
			}
			// RabbitMQ stores them by the close-ok, but its queue may count
			// them a moment later: wait a little, never for ever.
			var got []string
			for deadline := time.Now().Add(5 * time.Second); len(got) < n && time.Now().Before(deadline); {
				got = append(got, drain(t, ch, q.Name)...)
				if len(got) < n {
					time.Sleep(20 * time.Millisecond)
				}
			}
			if len(got) != n {
				t.Fatalf("round %d: %d of %d messages published before the connection closed are stored", round, len(got), n)
			}
		}
	})
}

// TestMethodAfterChannelClose: a client acks, closes its channel and
// sends one more method on it in the same write (amqp091-go does this when
// a consume's context ends while the channel closes: its basic.cancel goes
// out after the channel.close). The acks stand. The proxy closes the
// connection with 504; RabbitMQ drops the method while the channel is
// stopping (504 once it has stopped), after which amqp091-go's
// Channel.Close can wait for ever, so the proxy keeps the error
// (conn.go, handleChannelMethod).
func TestMethodAfterChannelClose(t *testing.T) {
	brokersNamed(t, func(t *testing.T, e *env, rabbit bool) {
		settleThen(t, e, func(t *testing.T, p *peer) {
			writeMethods(t, p, 1, &wire.ChannelClose{ReplyCode: 200, ReplyText: "bye"}, &wire.BasicCancel{ConsumerTag: "c"})
			if rabbit {
				expectMethod[*wire.ChannelCloseOk](t, p, "channel.close-ok")
				writeMethods(t, p, 0, &wire.ConnectionClose{ReplyCode: 200, ReplyText: "bye"})
				switch m := p.recv().(type) {
				case *wire.ConnectionCloseOk: // dropped
				case *wire.ConnectionClose: // the channel had stopped
					if m.ReplyCode != 504 {
						t.Fatalf("connection.close %d %s", m.ReplyCode, m.ReplyText)
					}
				default:
					t.Fatalf("got %v", m)
				}
				return
			}
			expect504(t, p)
		})
	})
}

// TestAcksBeforeConnectionErrorAreApplied: acks followed in the same write
// by a method that closes the connection (504, a method on a channel that
// was never opened): the acks, which came first, stand.
func TestAcksBeforeConnectionErrorAreApplied(t *testing.T) {
	brokers(t, func(t *testing.T, e *env) {
		settleThen(t, e, func(t *testing.T, p *peer) {
			writeMethods(t, p, 9, &wire.QueueDeclare{Queue: "x"})
			expect504(t, p)
		})
	})
}

// expect504 reads until connection.close, which must be 504, answers it
// and waits for the server to hang up (a channel.close-ok may come first).
func expect504(t *testing.T, p *peer) {
	t.Helper()
	for {
		m := p.recv()
		if _, ok := m.(*wire.ChannelCloseOk); ok {
			continue
		}
		cl, ok := m.(*wire.ConnectionClose)
		if !ok || cl.ReplyCode != 504 {
			t.Fatalf("got %v, want connection.close 504", m)
		}
		break
	}
	p.send(0, &wire.ConnectionCloseOk{})
	p.expectEOF()
}

// brokersNamed is brokers, telling the scenario which broker it runs on.
func brokersNamed(t *testing.T, scenario func(t *testing.T, e *env, rabbit bool)) {
	t.Run("proxy", func(t *testing.T) { scenario(t, newEnv(t), false) })
	t.Run("rabbitmq", func(t *testing.T) { scenario(t, rabbitEnv(t), true) })
}

// confirmedQueue declares a fresh queue on a channel in confirm mode.
func confirmedQueue(t *testing.T, e *env) (*amqp.Channel, amqp.Queue) {
	t.Helper()
	ch := e.channel(e.dial())
	q, err := ch.QueueDeclare("closing-"+randHex(4), false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	return ch, q
}

// settleThen consumes messages with a raw peer, acks each of them and, in
// the same write, sends what end does; then no message may be left.
func settleThen(t *testing.T, e *env, end func(t *testing.T, p *peer)) {
	ch, q := confirmedQueue(t, e)
	for round := range closingRounds {
		const n = 50
		bodies := make([]string, n)
		for i := range bodies {
			bodies[i] = fmt.Sprint(round, "-", i)
		}
		resent := sendsResent(e)
		publishConfirmed(t, ch, "", q.Name, bodies...)
		p := e.rawDialFor(t)
		p.openAs(e.vhost, 10)
		p.openChannel(1)
		p.send(1, &wire.BasicQos{PrefetchCount: n})
		expectMethod[*wire.BasicQosOk](t, p, "basic.qos-ok")
		p.send(1, &wire.BasicConsume{Queue: q.Name, ConsumerTag: "c"})
		expectMethod[*wire.BasicConsumeOk](t, p, "basic.consume-ok")
		for tag := uint64(1); tag <= n; tag++ {
			if got := p.recvDelivery().DeliveryTag; got != tag {
				t.Fatalf("delivery tag %d, want %d", got, tag)
			}
		}
		for tag := uint64(1); tag <= n; tag++ {
			if err := p.fw.WriteMethod(1, &wire.BasicAck{DeliveryTag: tag}); err != nil {
				t.Fatal(err)
			}
		}
		end(t, p)
		p.nc.Close()
		noneLeft(t, e, round, n, drain(t, ch, q.Name), resent)
	}
}

// noneLeft fails unless left, what the queue held after a round's n messages
// were acked, is empty, or is no more than the stores e's KubeMQ client sent
// again since resent: a store KubeMQ left unanswered, sent again, is stored
// twice (docs/kubemq.md 10.2, the real server), a copy and not an acked message.
func noneLeft(t *testing.T, e *env, round, n int, left []string, resent int64) {
	t.Helper()
	if again := sendsResent(e) - resent; len(left) > 0 && int64(len(left)) <= again {
		t.Logf("KNOWN LIMIT (docs/kubemq.md 10.2): round %d: %d copies of messages whose store was sent again", round, len(left))
	} else if len(left) != 0 {
		t.Fatalf("round %d: %d of %d acked messages are back in the queue (first %q)", round, len(left), n, left[0])
	}
}

// sendsResent is how many stores e's KubeMQ client sent again after KubeMQ left them
// unanswered (0 on RabbitMQ).
func sendsResent(e *env) int64 {
	if e.kc == nil {
		return 0
	}
	return e.kc.SendsResent()
}

// writeMethods writes ms on channel and flushes them with what p's writer
// holds, in one write.
func writeMethods(t *testing.T, p *peer, channel uint16, ms ...wire.Method) {
	t.Helper()
	for _, m := range ms {
		if err := p.fw.WriteMethod(channel, m); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.fw.Flush(); err != nil {
		t.Fatal(err)
	}
}

// recvDelivery reads a basic.deliver with its header and body frames.
func (p *peer) recvDelivery() *wire.BasicDeliver {
	p.t.Helper()
	m := p.recv()
	d, ok := m.(*wire.BasicDeliver)
	if !ok {
		p.t.Fatalf("got %v, want basic.deliver", m)
	}
	f, err := p.fr.ReadFrame()
	if err != nil || f.Type != wire.FrameHeader {
		p.t.Fatalf("want a content header, got %v %v", f, err)
	}
	size, _ := wire.ContentBodySize(f.Payload)
	for got := uint64(0); got < size; {
		f, err := p.fr.ReadFrame()
		if err != nil || f.Type != wire.FrameBody {
			p.t.Fatalf("want a content body, got %v %v", f, err)
		}
		got += uint64(len(f.Payload))
	}
	return d
}

// expectMethod reads the next method and fails unless it is a T.
func expectMethod[T wire.Method](t *testing.T, p *peer, what string) {
	t.Helper()
	if m := p.recv(); !isA[T](m) {
		t.Fatalf("got %v, want %s", m, what)
	}
}

func isA[T wire.Method](m wire.Method) bool {
	_, ok := m.(T)
	return ok
}
