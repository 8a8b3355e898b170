package fleet

import (
	"strconv"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// TestAMQPFleetDirectReplyTo: a requester on one replica process, a
// responder on another: the request goes through the durable queue, the
// replies through the responder's replica straight to the requester's
// channel (amqp091's peer Reply call), in order.
func TestAMQPFleetDirectReplyTo(t *testing.T) {
	f := newFleet(t, 2)
	q := f.setupAMQP(t)
	r0, r1 := f.replicas[0], f.replicas[1]

	_, req := r0.amqpChannel(t)
	replies, err := req.Consume("amq.rabbitmq.reply-to", "", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := req.Publish("", q, false, false, amqp.Publishing{ReplyTo: "amq.rabbitmq.reply-to", Body: []byte("ping")}); err != nil {
		t.Fatal(err)
	}
	_, resp := r1.amqpChannel(t)
	var d amqp.Delivery
	for deadline := time.Now().Add(30 * time.Second); ; {
		var ok bool
		if d, ok, err = resp.Get(q, true); err != nil {
			t.Fatal(err)
		} else if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the request never arrived")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if st, err := resp.QueueDeclarePassive(d.ReplyTo, false, false, false, false, nil); err != nil || st.Consumers != 1 {
		t.Fatalf("passive declare of reply name %q through %s: %+v %v", d.ReplyTo, r1.name, st, err)
	}
	const n = 100
	for i := range n {
		if err := resp.Publish("", d.ReplyTo, false, false, amqp.Publishing{CorrelationId: strconv.Itoa(i), Body: []byte("pong")}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range n {
		select {
		case r := <-replies:
			if r.CorrelationId != strconv.Itoa(i) || string(r.Body) != "pong" {
				t.Fatalf("reply %d: %q %q", i, r.CorrelationId, r.Body)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("reply %d of %d never arrived", i, n)
		}
	}
	f.checkProblems()
}
