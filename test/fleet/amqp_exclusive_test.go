package fleet

import (
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

func (r *replica) amqpChannel(t testing.TB) (*amqp.Connection, *amqp.Channel) {
	t.Helper()
	c, err := amqp.Dial(r.amqpURL())
	if err != nil {
		t.Fatalf("%s: %v", r.name, err)
	}
	t.Cleanup(func() { c.Close() })
	ch, err := c.Channel()
	if err != nil {
		t.Fatalf("%s: %v", r.name, err)
	}
	return c, ch
}

func amqpCode(err error) int {
	var e *amqp.Error
	if errors.As(err, &e) {
		return e.Code
	}
	return 0
}

// TestAMQPFleetExclusiveDelete: an exclusive consumer on one replica excludes the consumers
// of every other replica (403), whichever replica holds the queue; a queue.delete through a
// third replica cancels the consumers of every replica (basic.cancel) and purges the queue.
func TestAMQPFleetExclusiveDelete(t *testing.T) {
	f := newFleet(t, 3)
	q := f.setupAMQP(t)
	r0, r1, r2 := f.replicas[0], f.replicas[1], f.replicas[2]

	// r0's exclusive consumer (r0 then holds the queue) excludes r1's and r2's.
	_, ch0 := r0.amqpChannel(t)
	if _, err := ch0.Consume(q, "x0", false, true, false, false, nil); err != nil {
		t.Fatalf("exclusive consume on %s: %v", r0.name, err)
	}
	for _, r := range []*replica{r1, r2} {
		_, ch := r.amqpChannel(t)
		if _, err := ch.Consume(q, "c-"+r.name, false, false, false, false, nil); amqpCode(err) != amqp.AccessRefused {
			t.Errorf("consume on %s beside %s's exclusive consumer: %v, want 403", r.name, r0.name, err)
		}
	}
	if err := ch0.Cancel("x0", false); err != nil {
		t.Fatal(err)
	}

	// Now r1's exclusive consumer, forwarded to the holder, excludes r0's and r2's.
	_, ch1 := r1.amqpChannel(t)
	if err := ch1.Qos(10, 0, false); err != nil {
		t.Fatal(err)
	}
	ds, err := ch1.Consume(q, "x1", false, true, false, false, nil)
	if err != nil {
		t.Fatalf("exclusive consume on %s: %v", r1.name, err)
	}
	cancelled := ch1.NotifyCancel(make(chan string, 1))
	for _, r := range []*replica{r0, r2} {
		_, ch := r.amqpChannel(t)
		if _, err := ch.Consume(q, "c-"+r.name, false, false, false, false, nil); amqpCode(err) != amqp.AccessRefused {
			t.Errorf("consume on %s beside %s's exclusive consumer: %v, want 403", r.name, r1.name, err)
		}
	}
	// It gets what is published through any replica.
	_, pch := r2.amqpChannel(t)
	for i := range 30 {
		if err := pch.Publish("", q, false, false, amqp.Publishing{Body: []byte{byte(i)}}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 30 {
		select {
		case d := <-ds:
			if err := d.Ack(false); err != nil {
				t.Fatal(err)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("%s's exclusive consumer got %d of 30 messages", r1.name, i)
		}
	}

	// Messages left in the queue, then queue.delete through r2.
	for range 20 {
		if err := ch0.Publish("", q, false, false, amqp.Publishing{Body: []byte("left"), DeliveryMode: amqp.Persistent}); err != nil {
			t.Fatal(err)
		}
	}
	_, dch := r2.amqpChannel(t)
	if _, err := dch.QueueDelete(q, false, false, false); err != nil {
		t.Fatalf("queue.delete through %s: %v", r2.name, err)
	}
	select {
	case tag := <-cancelled:
		if tag != "x1" {
			t.Errorf("basic.cancel for %q, want x1", tag)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("%s's consumer was not cancelled after the queue's delete through %s", r1.name, r2.name)
	}
	// Gone on every replica.
	for _, r := range f.replicas {
		deadline := time.Now().Add(30 * time.Second)
		for {
			_, ch := r.amqpChannel(t)
			_, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
			if amqpCode(err) == amqp.NotFound {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s still knows %s after its delete: %v", r.name, q, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	// Declared again, it is empty: the purge ran where the messages were.
	_, ch := r1.amqpChannel(t)
	if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	got, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got.Messages != 0 {
		t.Errorf("the queue declared again after its delete has %d messages, want 0", got.Messages)
	}
	ds2, err := ch.Consume(q, "again", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case d := <-ds2:
		t.Errorf("a message of the deleted queue came back: %q", d.Body)
	case <-time.After(3 * time.Second):
	}
	f.checkProblems()
}
