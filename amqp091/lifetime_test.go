package amqp091

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Queue lifetimes: x-expires and auto-delete. Here on one broker, against
// the proxy and RabbitMQ with the same assertions; across replicas in
// lifetime_fleet_test.go.

// Every use of a queue with x-expires starts its timer again: a passive
// declare, a redeclare, a basic.get (empty or not), a consumer while it
// lasts. Once nothing uses it, it goes after x-expires.
func TestQueueExpiresUses(t *testing.T) {
	const expires = 1200 * time.Millisecond
	brokers(t, func(t *testing.T, e *env) {
		ch := e.channel(e.dial())
		args := amqp.Table{"x-expires": int32(expires / time.Millisecond)}
		declareArgs(t, ch, "uses", args)
		// Each use comes every third of x-expires, for twice x-expires.
		uses := []struct {
			name string
			use  func() error
		}{
			{"passive declare", func() error {
				_, err := ch.QueueDeclarePassive("uses", false, false, false, false, nil)
				return err
			}},
			{"redeclare", func() error {
				_, err := ch.QueueDeclare("uses", false, false, false, false, args)
				return err
			}},
			{"basic.get", func() error {
				_, _, err := ch.Get("uses", true)
				return err
			}},
		}
		for _, u := range uses {
			for range 6 {
				time.Sleep(expires / 3)
				if err := u.use(); err != nil {
					t.Fatalf("%s every %v: %v (the queue expired meanwhile)", u.name, expires/3, err)
				}
			}
		}
		cch := e.channel(e.dial())
		if _, err := cch.Consume("uses", "c", false, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * expires)
		if err := cch.Cancel("c", false); err != nil {
			t.Fatalf("cancel after 2 x-expires with a consumer: %v", err)
		}
		time.Sleep(expires + 1300*time.Millisecond)
		if _, err := ch.QueueDeclarePassive("uses", false, false, false, false, nil); amqpCode(err) != 404 {
			t.Fatalf("passive declare after x-expires unused: %v, want 404", err)
		}
	})
}
