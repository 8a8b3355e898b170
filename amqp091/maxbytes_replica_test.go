package amqp091

import (
	"slices"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

// x-max-length-bytes with reject-publish through a replica that does not
// hold the queue: the holder counts the ready messages (one is out to its
// consumer, not counted), the publishing replica's ledger knows their
// sizes (it stored them all).
func TestMaxLengthBytesThroughReplica(t *testing.T) {
	rs := newReplicas(t, 2)
	a, b := rs[0], rs[1]
	cha := a.channel(a.dial())
	if _, err := cha.QueueDeclare("rb", true, false, false, false, amqp.Table{"x-max-length-bytes": int32(10), "x-overflow": "reject-publish"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cha.QueueDelete("rb", false, false, false) })
	if err := cha.Qos(1, 0, false); err != nil {
		t.Fatal(err)
	}
	held, err := cha.Consume("rb", "hold", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	owner(t, rs, "rb")
	cb := b.dial()
	chb := confirmChannel(t, b.env, cb)
	if !publishWith(t, chb, "rb", amqp.Publishing{Body: []byte("hold")}) {
		t.Fatal("nack into the empty queue")
	}
	if m := mustRecv(t, held, "held"); string(m.Body) != "hold" {
		t.Fatalf("held %q", m.Body)
	}
	var acks []bool
	for _, body := range []string{"aaaa", "bbbb", "cc", "d"} {
		acks = append(acks, publishWith(t, chb, "rb", amqp.Publishing{Body: []byte(body)}))
	}
	if want := []bool{true, true, true, false}; !slices.Equal(acks, want) {
		t.Fatalf("confirms %v, want %v", acks, want)
	}
}

// x-max-length with drop-head through a replica that does not hold the
// queue: the holder trims it (a TRIM request on the peer link), before the
// publishing channel's later methods run, so its basic.get finds the
// newest two only, as on one RabbitMQ node.
func TestMaxLengthDropHeadThroughReplica(t *testing.T) {
	rs := newReplicas(t, 2)
	a, b := rs[0], rs[1]
	cha := confirmChannel(t, a.env, a.dial())
	if _, err := cha.QueueDeclare("rdh", true, false, false, false, amqp.Table{"x-max-length": int32(2)}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cha.QueueDelete("rdh", false, false, false) })
	if !publishWith(t, cha, "rdh", amqp.Publishing{Body: []byte("0")}) {
		t.Fatal("publish 0 nacked")
	}
	if o := owner(t, rs, "rdh"); o != a {
		t.Fatalf("queue held by %s, want %s (its trim)", o.id, a.id)
	}
	chb := confirmChannel(t, b.env, b.dial())
	for _, body := range []string{"1", "2", "3", "4"} {
		if !publishWith(t, chb, "rdh", amqp.Publishing{Body: []byte(body)}) {
			t.Fatalf("publish %s nacked", body)
		}
	}
	var got []string
	for {
		d, ok, err := chb.Get("rdh", true)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		got = append(got, string(d.Body))
	}
	if want := []string{"3", "4"}; !slices.Equal(got, want) {
		t.Fatalf("got %v through the other replica, want %v", got, want)
	}
}

// The same when the publishing replica does not know the sizes of the
// ready messages (another replica stored them): it asks the holder for
// their bytes (QueueRequest BYTES), which scans them, and does not guess
// them from the sizes it knows.
func TestMaxLengthBytesThroughReplicaUnknownSizes(t *testing.T) {
	rs := newReplicas(t, 2)
	a, b := rs[0], rs[1]
	cha := confirmChannel(t, a.env, a.dial())
	if _, err := cha.QueueDeclare("rbu", true, false, false, false, amqp.Table{"x-max-length-bytes": int32(10), "x-overflow": "reject-publish"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cha.QueueDelete("rbu", false, false, false) })
	hold := a.channel(a.dial())
	if err := hold.Qos(1, 0, false); err != nil {
		t.Fatal(err)
	}
	held, err := hold.Consume("rbu", "hold", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if o := owner(t, rs, "rbu"); o != a {
		t.Fatalf("queue held by %s, want %s", o.id, a.id)
	}
	if !publishWith(t, cha, "rbu", amqp.Publishing{Body: []byte("h")}) {
		t.Fatal("nack into the empty queue")
	}
	mustRecv(t, held, "held") // out to the consumer: not counted
	if !publishWith(t, cha, "rbu", amqp.Publishing{Body: []byte("aaaaaaa")}) {
		t.Fatal("7 bytes into the empty queue nacked")
	}
	chb := confirmChannel(t, b.env, b.dial())
	var acks []bool
	for _, body := range []string{"bb", "cc", "d"} {
		acks = append(acks, publishWith(t, chb, "rbu", amqp.Publishing{Body: []byte(body)}))
	}
	// 7+2 = 9; 9+2 > 10; 9+1 = 10.
	if want := []bool{true, false, true}; !slices.Equal(acks, want) {
		t.Fatalf("confirms through b %v, want %v", acks, want)
	}
}
