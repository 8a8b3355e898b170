package fleet

import (
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// TestAMQPFleetTransientTopology: non-durable exchanges, exclusive and non-durable queues and
// their bindings are seen by every replica, as by every node of a RabbitMQ cluster. The
// publish/subscribe pattern: each subscriber binds a server-named exclusive queue to a
// non-durable fanout exchange through its own replica, and a publisher on another replica
// reaches all of them; another replica's connection may not use an exclusive queue (405); the
// queue goes with its connection, and the non-durable queues of a replica that died go after
// the fleet's grace, while its exchange stays with the others.
func TestAMQPFleetTransientTopology(t *testing.T) {
	f := newFleet(t, 3)
	r0, r1, r2 := f.replicas[0], f.replicas[1], f.replicas[2]
	x := "logs-" + f.suffix

	// A subscriber on r0 and one on r1, each with its exclusive server-named queue.
	type sub struct {
		c  *amqp.Connection
		q  string
		ds <-chan amqp.Delivery
	}
	subscribe := func(r *replica) sub {
		c, ch := r.amqpChannel(t)
		if err := ch.ExchangeDeclare(x, "fanout", false, false, false, false, nil); err != nil {
			t.Fatalf("%s: exchange.declare: %v", r.name, err)
		}
		q, err := ch.QueueDeclare("", false, true, true, false, nil)
		if err != nil {
			t.Fatalf("%s: queue.declare: %v", r.name, err)
		}
		if err := ch.QueueBind(q.Name, "", x, false, nil); err != nil {
			t.Fatalf("%s: queue.bind: %v", r.name, err)
		}
		ds, err := ch.Consume(q.Name, "", true, true, false, false, nil)
		if err != nil {
			t.Fatalf("%s: consume: %v", r.name, err)
		}
		return sub{c, q.Name, ds}
	}
	s1, s0 := subscribe(r1), subscribe(r0) // r1 declares the exchange

	// The publisher on r2 declares the exchange too (equivalent) and publishes.
	_, pch := r2.amqpChannel(t)
	if err := pch.ExchangeDeclare(x, "fanout", false, false, false, false, nil); err != nil {
		t.Fatalf("%s: exchange.declare: %v", r2.name, err)
	}
	const n = 20
	publish := func(tag string) {
		t.Helper()
		for i := range n {
			if err := pch.Publish(x, "", false, false, amqp.Publishing{Body: fmt.Appendf(nil, "%s-%d", tag, i)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	receive := func(s sub, who, tag string) {
		t.Helper()
		for i := range n {
			select {
			case d := <-s.ds:
				if want := fmt.Sprintf("%s-%d", tag, i); string(d.Body) != want {
					t.Fatalf("%s got %q, want %q", who, d.Body, want)
				}
			case <-time.After(30 * time.Second):
				t.Fatalf("%s got %d of %d messages published through %s", who, i, n, r2.name)
			}
		}
	}
	// Bindings written through r0 and r1 reach r2 through the registry: wait for them.
	waitFor(t, 30*time.Second, "r2 knows both subscribers' queues", func() bool {
		return passive(t, r2, s0.q) == amqp.ResourceLocked && passive(t, r2, s1.q) == amqp.ResourceLocked
	})
	publish("a")
	receive(s0, r0.name+"'s subscriber", "a")
	receive(s1, r1.name+"'s subscriber", "a")

	// Another replica's connection may not consume from or delete an exclusive queue.
	_, ch := r2.amqpChannel(t)
	if _, err := ch.Consume(s0.q, "", true, false, false, false, nil); amqpCode(err) != amqp.ResourceLocked {
		t.Errorf("consume on %s of %s's exclusive queue: %v, want 405", r2.name, r0.name, err)
	}

	// A non-durable queue declared on r1 with a dead-letter exchange: every replica knows its
	// arguments.
	work := "work-" + f.suffix
	_, ch1 := r1.amqpChannel(t)
	if _, err := ch1.QueueDeclare(work, false, false, false, false, amqp.Table{"x-max-length": int32(5)}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "r0 knows the non-durable queue", func() bool { return passive(t, r0, work) == 0 })
	_, ch0 := r0.amqpChannel(t)
	if _, err := ch0.QueueDeclare(work, false, false, false, false, amqp.Table{"x-max-length": int32(6)}); amqpCode(err) != amqp.PreconditionFailed {
		t.Errorf("redeclare on %s with other arguments: %v, want 406", r0.name, err)
	}

	// r1's subscriber leaves: its exclusive queue is gone on every replica.
	s1.c.Close()
	waitFor(t, 30*time.Second, "the closed subscriber's queue gone on "+r2.name, func() bool { return passive(t, r2, s1.q) == amqp.NotFound })
	publish("b")
	receive(s0, r0.name+"'s subscriber", "b")

	// r1 dies: its non-durable queue goes after the fleet's grace; the exchange it declared
	// stays, taken over by another replica, with its bindings.
	// The kill waits until r1's lease engine let the deleted queue go: a kill -9 while a Get
	// waits is a stream ended mid-Get, which the strict backend counts.
	time.Sleep(5 * time.Second)
	r1.p.Kill()
	waitFor(t, 90*time.Second, "the dead replica's queue gone on "+r2.name, func() bool { return passive(t, r2, work) == amqp.NotFound })
	for _, r := range []*replica{r0, r2} {
		_, ch := r.amqpChannel(t)
		if err := ch.ExchangeDeclarePassive(x, "fanout", false, false, false, false, nil); err != nil {
			t.Errorf("%s: the exchange after the replica that declared it died: %v", r.name, err)
		}
	}
	time.Sleep(10 * time.Second) // past a takeover
	publish("c")
	receive(s0, r0.name+"'s subscriber", "c")
	r1.start()
	f.checkProblems()
}

// passive declares queue q passively on r and returns the AMQP reply code (0: it exists and
// this connection may use it).
func passive(t *testing.T, r *replica, q string) int {
	t.Helper()
	c, err := amqp.Dial(r.amqpURL())
	if err != nil {
		t.Fatalf("%s: %v", r.name, err)
	}
	defer c.Close()
	ch, err := c.Channel()
	if err != nil {
		t.Fatalf("%s: %v", r.name, err)
	}
	_, err = ch.QueueDeclarePassive(q, false, false, false, false, nil)
	return amqpCode(err)
}

// waitFor polls cond until it holds, or fails the test after d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
