package amqp091

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	streadway "github.com/streadway/amqp"

	"github.com/kubemq-io/kubemq-proxy/amqp091/wire"
	"github.com/kubemq-io/kubemq-proxy/delivery"
)

// Delivery semantics RabbitMQ applications rely on (issue 16), each run
// against the proxy and RabbitMQ with the same assertions.

func declare(t *testing.T, ch *amqp.Channel, q string) {
	t.Helper()
	if _, err := ch.QueueDeclare(q, false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
}

func confirmChannel(t *testing.T, e *env, c *amqp.Connection) *amqp.Channel {
	t.Helper()
	ch := e.channel(c)
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	return ch
}

func consumeWith(t *testing.T, e *env, c *amqp.Connection, q string, prefetch int, args amqp.Table) (*amqp.Channel, <-chan amqp.Delivery) {
	t.Helper()
	ch := e.channel(c)
	if err := ch.Qos(prefetch, 0, false); err != nil {
		t.Fatal(err)
	}
	msgs, err := ch.Consume(q, "", false, false, false, false, args)
	if err != nil {
		t.Fatal(err)
	}
	return ch, msgs
}

// nothingMore fails if a delivery arrives on any of msgs within d.
func nothingMore(t *testing.T, d time.Duration, what string, msgs ...<-chan amqp.Delivery) {
	t.Helper()
	deadline := time.After(d)
	for {
		for i, m := range msgs {
			select {
			case x := <-m:
				t.Fatalf("%s: consumer %d got %q", what, i, x.Body)
			default:
			}
		}
		select {
		case <-deadline:
			return
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func bodies(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprint(i + 1)
	}
	return out
}

// Item 2: a channel's later methods observe its earlier publishes, with
// no publisher confirms: basic.get finds the message just published, a
// declare counts it.
func TestPublishThenGetOnOneChannel(t *testing.T) {
	brokers(t, func(t *testing.T, e *env) {
		ch := e.channel(e.dial())
		declare(t, ch, "pg")
		for i := range 20 {
			body := fmt.Sprint("m", i)
			if err := ch.Publish("", "pg", false, false, amqp.Publishing{Body: []byte(body)}); err != nil {
				t.Fatal(err)
			}
			d, ok, err := ch.Get("pg", true)
			if err != nil || !ok || string(d.Body) != body {
				t.Fatalf("get %d right after its publish: ok=%v err=%v body=%q", i, ok, err, d.Body)
			}
		}
		// Five more without confirms, then get until get-empty: all five.
		for _, b := range bodies(5) {
			if err := ch.Publish("", "pg", false, false, amqp.Publishing{Body: []byte(b)}); err != nil {
				t.Fatal(err)
			}
		}
		if got := drain(t, ch, "pg"); !slices.Equal(got, bodies(5)) {
			t.Fatalf("drained right after 5 publishes: %v", got)
		}
	})
}

// Item 4: two consumers of equal prefetch share a queue round-robin, the
// first one's reading ahead notwithstanding: in each round each gets one
// message, 5 and 5 of 10.
func TestFairRoundRobin(t *testing.T) {
	brokers(t, func(t *testing.T, e *env) {
		conn := e.dial()
		pub := confirmChannel(t, e, conn)
		declare(t, pub, "rr")
		publishConfirmed(t, pub, "", "rr", bodies(10)...)
		_, a := consumeWith(t, e, conn, "rr", 1, nil)
		da := mustRecv(t, a, "a's first delivery")
		_, b := consumeWith(t, e, conn, "rr", 1, nil)
		db := mustRecv(t, b, "b's first delivery, a still holding one")
		var order []string
		counts := [2]int{}
		for round := 0; ; round++ {
			order = append(order, string(da.Body), string(db.Body))
			counts[0]++
			counts[1]++
			nothingMore(t, 50*time.Millisecond, "beyond prefetch 1", a, b)
			if round == 4 {
				break
			}
			da.Ack(false)
			db.Ack(false)
			da = mustRecv(t, a, "a's next")
			db = mustRecv(t, b, "b's next")
		}
		da.Ack(false)
		db.Ack(false)
		slices.Sort(order)
		if counts != [2]int{5, 5} || !slices.Equal(order, []string{"1", "10", "2", "3", "4", "5", "6", "7", "8", "9"}) {
			t.Fatalf("counts %v, messages %v", counts, order)
		}
		nothingMore(t, 200*time.Millisecond, "after the queue ran dry", a, b)

		// Both consuming with room for all ten before they are published:
		// each gets every other one.
		declare(t, pub, "rr2")
		_, c := consumeWith(t, e, conn, "rr2", 10, nil)
		_, d := consumeWith(t, e, conn, "rr2", 10, nil)
		publishConfirmed(t, pub, "", "rr2", bodies(10)...)
		cb, cds := recvBodies(t, c, 5, "c")
		db2, dds := recvBodies(t, d, 5, "d")
		nothingMore(t, 200*time.Millisecond, "more than half", c, d)
		wantSeq(t, cb, "1", "3", "5", "7", "9")
		wantSeq(t, db2, "2", "4", "6", "8", "10")
		cds[4].Ack(true)
		dds[4].Ack(true)
	})
}

// Item 4: reading ahead changes no count: a declare counts the messages a
// prefetch-1 consumer has not been given, and a message published after
// its cancel, at once; a lease record back in the queue is not counted.
func TestCountsIgnoreReadAhead(t *testing.T) {
	brokers(t, func(t *testing.T, e *env) {
		conn := e.dial()
		pub := confirmChannel(t, e, conn)
		declare(t, pub, "cnt2")
		publishConfirmed(t, pub, "", "cnt2", "1", "2", "3")
		count := func(want int, what string) {
			t.Helper()
			q, err := pub.QueueDeclarePassive("cnt2", false, false, false, false, nil)
			if err != nil || q.Messages != want {
				t.Fatalf("%s: %d messages (%v), want %d", what, q.Messages, err, want)
			}
		}
		cch := e.channel(conn)
		if err := cch.Qos(1, 0, false); err != nil {
			t.Fatal(err)
		}
		msgs, err := cch.Consume("cnt2", "c", false, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		d := mustRecv(t, msgs, "delivery")
		count(2, "one delivered and unacked")
		// The proxy's lease record of the batch comes back into the KubeMQ
		// queue after 10 s; it is no message.
		time.Sleep(12 * time.Second)
		count(2, "after the lease-record delay")
		if err := cch.Cancel("c", false); err != nil {
			t.Fatal(err)
		}
		publishConfirmed(t, pub, "", "cnt2", "4")
		count(3, "published after the cancel")
		if string(d.Body) != "1" {
			t.Fatalf("first delivery %q", d.Body)
		}
		d.Ack(false)
		if got := drain(t, pub, "cnt2"); !slices.Equal(got, []string{"2", "3", "4"}) {
			t.Fatalf("left: %v", got)
		}
	})
}

// recvBodies receives n deliveries and returns "body" or "body*" when
// redelivered.
func recvBodies(t *testing.T, msgs <-chan amqp.Delivery, n int, what string) ([]string, []amqp.Delivery) {
	t.Helper()
	var out []string
	var ds []amqp.Delivery
	for range n {
		d := mustRecv(t, msgs, what)
		b := string(d.Body)
		if d.Redelivered {
			b += "*"
		}
		out = append(out, b)
		ds = append(ds, d)
	}
	return out, ds
}

func wantSeq(t *testing.T, got []string, want ...string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

// Item 5: a nacked or rejected message with requeue, a recover, a closed
// channel's unacked messages and a rejected get go back to their original
// position, in publish order, flagged redelivered.
func TestRequeueInPlace(t *testing.T) {
	brokers(t, func(t *testing.T, e *env) {
		conn := e.dial()
		pub := confirmChannel(t, e, conn)

		t.Run("nack and reject, prefetch 1", func(t *testing.T) {
			declare(t, pub, "rq1")
			publishConfirmed(t, pub, "", "rq1", bodies(5)...)
			_, msgs := consumeWith(t, e, conn, "rq1", 1, nil)
			got, ds := recvBodies(t, msgs, 1, "first")
			ds[0].Nack(false, true)
			g, ds2 := recvBodies(t, msgs, 1, "after nack")
			got = append(got, g...)
			ds2[0].Reject(true)
			g, ds3 := recvBodies(t, msgs, 1, "after reject")
			got = append(got, g...)
			ds3[0].Ack(false)
			for range 4 {
				g, d := recvBodies(t, msgs, 1, "rest")
				got = append(got, g...)
				d[0].Ack(false)
			}
			wantSeq(t, got, "1", "1*", "1*", "2", "3", "4", "5")
		})

		t.Run("nack multiple and recover", func(t *testing.T) {
			declare(t, pub, "rq2")
			publishConfirmed(t, pub, "", "rq2", bodies(5)...)
			ch, msgs := consumeWith(t, e, conn, "rq2", 3, nil)
			got, ds := recvBodies(t, msgs, 3, "first three")
			ds[2].Nack(true, true) // 1, 2 and 3 back
			g, ds := recvBodies(t, msgs, 3, "after nack multiple")
			got = append(got, g...)
			ds[1].Ack(false) // 2 done: room for 4
			g, _ = recvBodies(t, msgs, 1, "after ack")
			got = append(got, g...)
			if err := ch.Recover(true); err != nil { // 1, 3 and 4 back
				t.Fatal(err)
			}
			g, ds = recvBodies(t, msgs, 3, "after recover")
			got = append(got, g...)
			ds[2].Ack(true)
			g, ds = recvBodies(t, msgs, 1, "last")
			got = append(got, g...)
			ds[0].Ack(false)
			wantSeq(t, got, "1", "2", "3", "1*", "2*", "3*", "4", "1*", "3*", "4*", "5")
		})

		t.Run("closed channel", func(t *testing.T) {
			declare(t, pub, "rq3")
			publishConfirmed(t, pub, "", "rq3", bodies(5)...)
			ach, a := consumeWith(t, e, conn, "rq3", 2, nil)
			got, _ := recvBodies(t, a, 2, "a")
			if err := ach.Close(); err != nil {
				t.Fatal(err)
			}
			_, b := consumeWith(t, e, conn, "rq3", 0, nil)
			g, ds := recvBodies(t, b, 5, "b")
			got = append(got, g...)
			ds[4].Ack(true)
			wantSeq(t, got, "1", "2", "1*", "2*", "3", "4", "5")
		})

		t.Run("get and reject", func(t *testing.T) {
			declare(t, pub, "rq4")
			publishConfirmed(t, pub, "", "rq4", bodies(3)...)
			ch := e.channel(conn)
			var got []string
			for _, requeue := range []bool{true, true, false, false, false} {
				d, ok, err := ch.Get("rq4", false)
				if err != nil || !ok {
					t.Fatalf("get: %v %v", ok, err)
				}
				b := string(d.Body)
				if d.Redelivered {
					b += "*"
				}
				got = append(got, b)
				if requeue {
					d.Reject(true)
				} else {
					d.Ack(false)
				}
			}
			wantSeq(t, got, "1", "1*", "1*", "2", "3")
		})
	})
}

// Item 6: consumer priorities. A higher-priority consumer with capacity
// gets every message; a lower one gets what the higher cannot take; a
// non-integer x-priority is refused as RabbitMQ refuses it.
func TestConsumerPriorities(t *testing.T) {
	brokers(t, func(t *testing.T, e *env) {
		conn := e.dial()
		pub := confirmChannel(t, e, conn)

		t.Run("higher takes all", func(t *testing.T) {
			declare(t, pub, "cp1")
			_, low := consumeWith(t, e, conn, "cp1", 0, amqp.Table{"x-priority": int32(1)})
			_, high := consumeWith(t, e, conn, "cp1", 0, amqp.Table{"x-priority": int32(10)})
			publishConfirmed(t, pub, "", "cp1", bodies(20)...)
			_, ds := recvBodies(t, high, 20, "high")
			nothingMore(t, 300*time.Millisecond, "low priority while high has capacity", low, high)
			ds[19].Ack(true)
		})

		t.Run("lower takes what higher cannot", func(t *testing.T) {
			declare(t, pub, "cp2")
			_, low := consumeWith(t, e, conn, "cp2", 0, nil)
			_, high := consumeWith(t, e, conn, "cp2", 2, amqp.Table{"x-priority": int64(5)})
			publishConfirmed(t, pub, "", "cp2", bodies(10)...)
			hb, hds := recvBodies(t, high, 2, "high")
			lb, lds := recvBodies(t, low, 8, "low")
			nothingMore(t, 300*time.Millisecond, "beyond", low, high)
			wantSeq(t, append(hb, lb...), "1", "2", "3", "4", "5", "6", "7", "8", "9", "10")
			hds[1].Ack(true)
			lds[7].Ack(true)
		})

		t.Run("non-integer x-priority", func(t *testing.T) {
			declare(t, pub, "cp3")
			ch := e.channel(conn)
			_, err := ch.Consume("cp3", "", false, false, false, false, amqp.Table{"x-priority": "high"})
			expectReply(t, err, 406, "PRECONDITION_FAILED - invalid arg 'x-priority' for queue 'cp3' in vhost '"+e.vhost+"': \"expected integer, got longstr\"")
			ch = e.channel(conn)
			_, err = ch.Consume("cp3", "", false, false, false, false, amqp.Table{"x-priority": 1.5})
			expectReply(t, err, 406, "PRECONDITION_FAILED - invalid arg 'x-priority' for queue 'cp3' in vhost '"+e.vhost+"': \"expected integer, got double\"")
		})
	})
}

// Item 8: channel_max limits how many channels are open at once, as in
// RabbitMQ 3.10: opening one more is 530 NOT_ALLOWED; channel numbers above
// channel_max are accepted, and a closed channel frees its place.
func TestChannelMax(t *testing.T) {
	brokers(t, func(t *testing.T, e *env) {
		p := e.rawDial()
		p.openAs(e.vhost, 3)
		for _, id := range []uint16{1, 7, 3000} {
			p.openChannel(id)
		}
		p.send(7, &wire.ChannelClose{ReplyCode: 200, ReplyText: "bye"})
		if m, ok := p.recv().(*wire.ChannelCloseOk); !ok {
			t.Fatalf("channel.close: %v", m)
		}
		p.openChannel(9)
		p.send(10, &wire.ChannelOpen{})
		p.expectClose(530, "NOT_ALLOWED - number of channels opened (3) has reached the negotiated channel_max (3)")
	})
}

// Item 1: a queue deleted while it had unacked deliveries (and messages
// read ahead), then declared again, is a new, empty queue: the old
// deliveries given back later are gone with the old queue.
func TestDeletedQueueLeavesNothing(t *testing.T) {
	brokers(t, func(t *testing.T, e *env) {
		conn := e.dial()
		pub := confirmChannel(t, e, conn)
		declare(t, pub, "inc")
		publishConfirmed(t, pub, "", "inc", bodies(5)...)
		hold, msgs := consumeWith(t, e, conn, "inc", 3, nil)
		recvBodies(t, msgs, 3, "held")
		other := e.dial() // the holder is not told: another connection deletes
		if n, err := e.channel(other).QueueDelete("inc", false, false, false); err != nil || n != 2 {
			t.Fatalf("delete: %d %v, want the 2 ready ones purged", n, err)
		}
		declare(t, pub, "inc")
		if err := hold.Close(); err != nil { // gives the three back: to no queue
			t.Fatal(err)
		}
		publishConfirmed(t, pub, "", "inc", "new")
		q, err := pub.QueueDeclarePassive("inc", false, false, false, false, nil)
		if err != nil || q.Messages != 1 {
			t.Fatalf("new queue holds %d (%v), want 1", q.Messages, err)
		}
		_, fresh := consumeWith(t, e, conn, "inc", 0, nil)
		got, ds := recvBodies(t, fresh, 1, "new queue")
		wantSeq(t, got, "new")
		nothingMore(t, 500*time.Millisecond, "an old message in the new queue", fresh)
		ds[0].Ack(false)
	})
}

// withRecordDelay gives an env a lease engine of its own with a short
// lease-record delay, so records come back within the test.
func withRecordDelay(t *testing.T, d time.Duration) func(*Options) {
	return func(o *Options) {
		m, err := delivery.NewManager(delivery.NewKubeMQBackend(o.Client), delivery.Options{RecordDelay: d, Logger: o.Logger}, nil)
		if err != nil {
			t.Fatal(err)
		}
		o.Deliveries = m
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			m.Close(ctx)
		})
	}
}

// Item 1, across a crash: the lease records of a proxy that died holding
// deliveries of a queue never reach the queue declared again under that
// name after a restart deleted it (they come back to the old incarnation's
// KubeMQ queue). Proxy only: it needs a crash.
func TestDeletedQueueAfterCrash(t *testing.T) {
	a := newEnv(t, withRecordDelay(t, time.Second))
	ch := a.channel(a.dial())
	if _, err := ch.QueueDeclare("crash.inc", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	publishConfirmed(t, ch, "", "crash.inc", "old1", "old2", "old3")
	if err := ch.Qos(2, 0, false); err != nil {
		t.Fatal(err)
	}
	msgs, err := ch.Consume("crash.inc", "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	recvBodies(t, msgs, 2, "held by the proxy that dies")
	a.kc.Close() // "kill -9"

	b := &env{t: t, kubemq: a.kubemq, conn: a.conn, vhost: a.vhost, regChan: a.regChan, log: a.log}
	b.start(withRecordDelay(t, time.Second))
	bch := confirmChannel(t, b, b.dial())
	if _, err := bch.QueueDelete("crash.inc", false, false, false); err != nil {
		t.Fatal(err)
	}
	if _, err := bch.QueueDeclare("crash.inc", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	publishConfirmed(t, bch, "", "crash.inc", "new")
	_, fresh := consumeWith(t, b, b.dial(), "crash.inc", 0, nil)
	got, ds := recvBodies(t, fresh, 1, "new queue")
	wantSeq(t, got, "new")
	ds[0].Ack(false)
	// The dead proxy's records are due after 1 s and taken over after its
	// hold (2 s) and another record delay: well within 8 s.
	nothingMore(t, 8*time.Second, "the dead proxy's deliveries in the new queue", fresh)
	// A restart keeps the incarnation: the queue is still the new one.
	b.stopFn()
	c := &env{t: t, kubemq: a.kubemq, conn: a.conn, vhost: a.vhost, regChan: a.regChan, log: a.log}
	c.start()
	cch := confirmChannel(t, c, c.dial())
	publishConfirmed(t, cch, "", "crash.inc", "after restart")
	if got := drain(t, cch, "crash.inc"); !slices.Equal(got, []string{"after restart"}) {
		t.Fatalf("after a restart: %v", got)
	}
}

// Item 3: a connection closed while frames are still on their way (more
// connection.close frames from concurrent Close calls, publishes from
// other goroutines) gets close-ok, not a reset: streadway's own
// concurrent-close test, and a close racing a publisher, with streadway
// and amqp091-go.
func TestCloseWhileFramesArrive(t *testing.T) {
	brokers(t, func(t *testing.T, e *env) {
		for round := range 5 {
			conn, err := streadway.Dial(e.url())
			if err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			for range 32 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					// A call that finds the connection closed returns
					// ErrClosed; one that passed that check just before
					// another call's close-ok shut the client down fails to
					// write its own connection.close on the closed socket (a
					// race inside the client, more likely the faster the
					// broker answers). A reply from the broker other than
					// close-ok, or a reset, is what must not happen.
					err := conn.Close()
					if err != nil && err != streadway.ErrClosed && !errors.Is(err, net.ErrClosed) {
						t.Errorf("round %d: concurrent Close: %v", round, err)
					}
				}()
			}
			wg.Wait()
		}
		body := make([]byte, 1000)
		for round := range 5 {
			conn, err := streadway.Dial(e.url())
			if err != nil {
				t.Fatal(err)
			}
			ch, err := conn.Channel()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := ch.QueueDeclare("cwp", false, false, false, false, nil); err != nil {
				t.Fatal(err)
			}
			stop := make(chan struct{})
			published := make(chan int)
			go func() {
				n := 0
				defer func() { published <- n }()
				for {
					select {
					case <-stop:
						return
					default:
					}
					if ch.Publish("", "cwp", false, false, streadway.Publishing{Body: body}) != nil {
						return
					}
					n++
				}
			}()
			time.Sleep(20 * time.Millisecond)
			if err := conn.Close(); err != nil {
				t.Errorf("round %d: Close while publishing: %v", round, err)
			}
			close(stop)
			<-published
		}
		for round := range 5 {
			conn := e.dial()
			ch := e.channel(conn)
			for range 2000 {
				if err := ch.Publish("", "cwp", false, false, amqp.Publishing{Body: body}); err != nil {
					t.Fatal(err)
				}
			}
			if err := conn.Close(); err != nil {
				t.Errorf("round %d: amqp091-go Close after 2000 publishes: %v", round, err)
			}
		}
	})
}
