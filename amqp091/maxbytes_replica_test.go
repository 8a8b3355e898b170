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
