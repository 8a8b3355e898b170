package amqp091

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// A queue declared, a binding made or a queue deleted through one replica
// routes the next publish through another at once, however late that one
// reads the registry log (here 400 ms): the method's -ok comes once the
// other replicas have read the change, as in a RabbitMQ cluster. Before,
// the lagging replica dropped the publish as unroutable (confirmed all the
// same, so lost), missed the binding, or routed to the deleted queue.
func TestTopologyReachesReplicasBeforeOk(t *testing.T) {
	rs := newFleetLagging(t, 2, 400*time.Millisecond)
	a, b := rs[0], rs[1]
	cha := confirmChannel(t, a.env, a.dial())
	chb := confirmChannel(t, b.env, b.dial())
	returns := chb.NotifyReturn(make(chan amqp.Return, 4))
	// The exchange first: a publish to an unknown exchange catches up with
	// the log on its own (catchUp); the binding below is what is new.
	if err := cha.ExchangeDeclare("px", "direct", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cha.ExchangeDelete("px", false, false) })
	for i := range 3 {
		q := []string{"pq0", "pq1", "pq2"}[i]
		if _, err := cha.QueueDeclare(q, true, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cha.QueueDelete(q, false, false, false) })
		if !publishWith(t, chb, q, amqp.Publishing{Body: []byte("direct")}) {
			t.Fatalf("%s: publish through the lagging replica nacked", q)
		}
		if err := cha.QueueBind(q, "k"+q, "px", false, nil); err != nil {
			t.Fatal(err)
		}
		dc, err := chb.PublishWithDeferredConfirm("px", "k"+q, true, false, amqp.Publishing{Body: []byte("bound")})
		if err != nil {
			t.Fatal(err)
		}
		if !dc.Wait() {
			t.Fatalf("%s: publish to the new binding nacked", q)
		}
		for _, want := range []string{"direct", "bound"} {
			m, ok := getWithin(t, cha, q, 5*time.Second)
			if !ok {
				t.Fatalf("%s: %q published through the lagging replica right after the change never arrived", q, want)
			}
			if string(m.Body) != want {
				t.Fatalf("%s: got %q, want %q", q, m.Body, want)
			}
		}
	}
	select {
	case r := <-returns:
		t.Fatalf("returned %q (%s): the lagging replica did not know the binding", r.Body, r.ReplyText)
	default:
	}
	// A delete: a mandatory publish right after comes back, as RabbitMQ's.
	if _, err := cha.QueueDelete("pq0", false, false, false); err != nil {
		t.Fatal(err)
	}
	dc, err := chb.PublishWithDeferredConfirm("", "pq0", true, false, amqp.Publishing{Body: []byte("after delete")})
	if err != nil {
		t.Fatal(err)
	}
	dc.Wait()
	select {
	case r := <-returns:
		if r.ReplyCode != amqp.NoRoute {
			t.Fatalf("return %d %s, want 312 NO_ROUTE", r.ReplyCode, r.ReplyText)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a mandatory publish to the queue just deleted through the other replica did not come back")
	}
}
