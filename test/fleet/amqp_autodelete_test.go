package fleet

import (
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// TestAMQPFleetAutoDeleteHolderKilled: the replica that holds two auto-delete queues dies
// (kill -9) and comes back. The queue whose only consumer was its client's goes on every
// replica, as RabbitMQ deletes an auto-delete queue when its last consumer's connection
// drops; the queue that also has a consumer on another replica stays, serves it from the next
// holder, and goes when that consumer is cancelled.
func TestAMQPFleetAutoDeleteHolderKilled(t *testing.T) {
	f := newFleet(t, 3)
	r0, r1, r2 := f.replicas[0], f.replicas[1], f.replicas[2]
	own, shared := "ad-own-"+f.suffix, "ad-shared-"+f.suffix
	_, dch := r2.amqpChannel(t)
	for _, q := range []string{own, shared} {
		if _, err := dch.QueueDeclare(q, true, true, false, false, nil); err != nil {
			t.Fatal(err)
		}
		waitQueue(t, f.replicas, q, true)
	}
	_, pch := r2.amqpChannel(t)
	receives := func(q string, ds <-chan amqp.Delivery, who string) {
		t.Helper()
		body := "to " + who
		if err := pch.Publish("", q, false, false, amqp.Publishing{Body: []byte(body)}); err != nil {
			t.Fatal(err)
		}
		// A message acked just before the holder died may come again first (the crash loses
		// its last 250 ms of settlements).
		deadline := time.After(60 * time.Second)
		for {
			select {
			case d := <-ds:
				if err := d.Ack(false); err != nil {
					t.Fatal(err)
				}
				if string(d.Body) == body {
					return
				}
				if !d.Redelivered {
					t.Fatalf("%s got %q (not redelivered), want %q", who, d.Body, body)
				}
			case <-deadline:
				t.Fatalf("%s got nothing from %s", who, q)
			}
		}
	}
	// r0's consumers come first: r0 holds both queues; r1's consumer of the shared one is
	// forwarded to it.
	_, c0 := r0.amqpChannel(t)
	for _, q := range []string{own, shared} {
		ds, err := c0.Consume(q, "", false, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		receives(q, ds, r0.name+" on "+q)
	}
	_, c1 := r1.amqpChannel(t)
	ds1, err := c1.Consume(shared, "c1", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}

	killed := time.Now()
	r0.p.Kill()
	time.Sleep(time.Second)
	r0.start()
	defer func() {
		if t.Failed() {
			t.Logf("the sweeper's view, from every log:%s", f.grepLogs("sweeps the fleet", "auto-delete queue", "ownership log"))
		}
	}()

	waitQueue(t, f.replicas, own, false)
	gone := time.Since(killed)
	receives(shared, ds1, r1.name+" after the holder died")
	waitQueue(t, f.replicas, shared, true)
	if err := c1.Cancel("c1", false); err != nil {
		t.Fatal(err)
	}
	waitQueue(t, f.replicas, shared, false)
	t.Logf("FLEET amqp auto-delete queue whose only consumer died with its holder: gone %v after the kill -9 (cluster.lease %v)",
		gone.Round(100*time.Millisecond), lease)
	f.checkProblems()
}

// waitQueue waits up to a minute until a passive declare of q through every replica of rs
// finds it (there) or answers 404 (not there).
func waitQueue(t *testing.T, rs []*replica, q string, there bool) {
	t.Helper()
	for _, r := range rs {
		waitFor(t, time.Minute, fmt.Sprintf("%s: queue %s there=%v", r.name, q, there), func() bool {
			code := passive(t, r, q)
			return there && code == 0 || !there && code == amqp.NotFound
		})
	}
}
