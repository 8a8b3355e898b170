package amqp091

import (
	"slices"
	"strconv"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Single active consumer (issue 17), against the proxy and RabbitMQ alike.

var sacArgs = amqp.Table{"x-single-active-consumer": true}

func takeBodies(t *testing.T, msgs <-chan amqp.Delivery, n int, what string) ([]string, []amqp.Delivery) {
	t.Helper()
	var out []string
	var ds []amqp.Delivery
	for range n {
		d := mustRecv(t, msgs, what)
		out = append(out, string(d.Body))
		ds = append(ds, d)
	}
	return out, ds
}

// TestSingleActiveConsumer: the first consumer receives everything while
// the others wait; when it cancels, the waiting consumer of the highest
// priority takes over and gets what the first one leaves unacknowledged
// when its channel closes; when that one's channel closes, the next.
func TestSingleActiveConsumer(t *testing.T) {
	brokers(t, func(t *testing.T, e *env) {
		conn := e.dial()
		pub := confirmChannel(t, e, conn)
		if _, err := pub.QueueDeclare("sac", false, false, false, false, sacArgs); err != nil {
			t.Fatal(err)
		}
		chA, a := consumeWith(t, e, e.dial(), "sac", 10, nil)
		_, b := consumeWith(t, e, e.dial(), "sac", 10, nil)
		chC, c := consumeWith(t, e, e.dial(), "sac", 10, amqp.Table{"x-priority": int32(5)})
		if q, err := pub.QueueDeclare("sac", false, false, false, false, sacArgs); err != nil || q.Consumers != 3 {
			t.Fatalf("declare-ok: %+v %v", q, err)
		}
		publishConfirmed(t, pub, "", "sac", bodies(5)...)
		got, ds := takeBodies(t, a, 5, "the active consumer's deliveries")
		if !slices.Equal(got, bodies(5)) {
			t.Fatalf("active consumer got %v", got)
		}
		nothingMore(t, 300*time.Millisecond, "waiting consumers", b, c)
		if err := ds[1].Ack(true); err != nil { // 1 and 2
			t.Fatal(err)
		}
		// Cancelled: the priority-5 consumer, registered last, takes over.
		if err := chA.Cancel(ds[0].ConsumerTag, false); err != nil {
			t.Fatal(err)
		}
		publishConfirmed(t, pub, "", "sac", "6", "7")
		if got, _ := takeBodies(t, c, 2, "the new active consumer's deliveries"); !slices.Equal(got, []string{"6", "7"}) {
			t.Fatalf("new active consumer got %v", got)
		}
		nothingMore(t, 300*time.Millisecond, "waiting consumer b", b)
		// The cancelled consumer's channel closes: its unacked 3..5 go to c.
		chA.Close()
		got, ds = takeBodies(t, c, 3, "requeued deliveries")
		slices.Sort(got)
		if !slices.Equal(got, []string{"3", "4", "5"}) || !ds[0].Redelivered {
			t.Fatalf("after the first channel closed, c got %v (redelivered %v)", got, ds[0].Redelivered)
		}
		if err := ds[2].Ack(true); err != nil { // everything c has: 6, 7, 3..5
			t.Fatal(err)
		}
		nothingMore(t, 300*time.Millisecond, "waiting consumer b", b)
		// The second active consumer's channel closes: b is the last one.
		chC.Close()
		publishConfirmed(t, pub, "", "sac", "8")
		if d := mustRecv(t, b, "the last consumer's delivery"); string(d.Body) != "8" || d.Redelivered {
			t.Fatalf("b got %q (redelivered %v)", d.Body, d.Redelivered)
		}
	})
}

// TestSingleActiveConsumerRefusals: an exclusive consume of a
// single-active-consumer queue is refused as RabbitMQ 3.10 refuses it;
// the argument must be a boolean.
func TestSingleActiveConsumerRefusals(t *testing.T) {
	brokers(t, func(t *testing.T, e *env) {
		ch := e.channel(e.dial())
		if _, err := ch.QueueDeclare("sacx", false, false, false, false, sacArgs); err != nil {
			t.Fatal(err)
		}
		_, err := ch.Consume("sacx", "", false, true, false, false, nil)
		if amqpCode(err) != 403 || err.(*amqp.Error).Reason != "ACCESS_REFUSED - queue 'sacx' in vhost '"+e.vhost+"' in exclusive use" {
			t.Fatalf("exclusive consume: %v", err)
		}
		ch = e.channel(e.dial())
		_, err = ch.QueueDeclare("sacy", false, false, false, false, amqp.Table{"x-single-active-consumer": "yes"})
		if amqpCode(err) != 406 || err.(*amqp.Error).Reason != "PRECONDITION_FAILED - invalid arg 'x-single-active-consumer' for queue 'sacy' in vhost '"+e.vhost+"': {unacceptable_type,longstr}" {
			t.Fatalf("string x-single-active-consumer: %v", err)
		}
	})
}

// TestSingleActiveConsumerAcrossReplicas: consumers on two replicas of a
// durable single-active-consumer queue: one receives, the other takes
// over when its channel closes.
func TestSingleActiveConsumerAcrossReplicas(t *testing.T) {
	rs := newReplicas(t, 2)
	ch0 := rs[0].channel(rs[0].dial())
	if _, err := ch0.QueueDeclare("sac.r", true, false, false, false, sacArgs); err != nil {
		t.Fatal(err)
	}
	first, a := consumeWith(t, rs[0].env, rs[0].dial(), "sac.r", 5, nil)
	_ = owner(t, rs, "sac.r")
	_, b := consumeWith(t, rs[1].env, rs[1].dial(), "sac.r", 5, nil)
	pub := rs[1].channel(rs[1].dial())
	publishN(t, pub, "sac.r", 0, 10)
	got, _ := takeBodies(t, a, 5, "the active consumer's deliveries")
	want := make([]string, 5)
	for i := range want {
		want[i] = "m" + strconv.Itoa(i)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("active consumer got %v", got)
	}
	nothingMore(t, 500*time.Millisecond, "the waiting consumer on the other replica", b)
	first.Close()
	got, _ = takeBodies(t, b, 5, "the consumer that took over")
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("the consumer that took over got %v first", got)
	}
}
