package amqp091

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Priority queues (x-max-priority, issue 17), each run against the proxy
// and RabbitMQ with the same assertions.

// publishPrio publishes body with priority p (p < 0: no priority) and
// waits for its confirm.
func publishPrio(t *testing.T, ch *amqp.Channel, q, body string, p int) {
	t.Helper()
	m := amqp.Publishing{Body: []byte(body)}
	if p >= 0 {
		m.Priority = uint8(p)
	}
	if !publishWith(t, ch, q, m) {
		t.Fatalf("publish %q nacked", body)
	}
}

func passiveCount(t *testing.T, ch *amqp.Channel, q string) int {
	t.Helper()
	st, err := ch.QueueDeclarePassive(q, false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	return st.Messages
}

func TestPriorityOrder(t *testing.T) {
	brokers(t, func(t *testing.T, e *env) {
		c := e.dial()
		ch := confirmChannel(t, e, c)
		declareArgs(t, ch, "pq", amqp.Table{"x-max-priority": int32(10)})
		publishPrio(t, ch, "pq", "none", -1)
		publishPrio(t, ch, "pq", "p0", 0)
		publishPrio(t, ch, "pq", "p1", 1)
		publishPrio(t, ch, "pq", "p5", 5)
		publishPrio(t, ch, "pq", "p9a", 9)
		publishPrio(t, ch, "pq", "p9b", 9)
		if n := passiveCount(t, ch, "pq"); n != 6 {
			t.Fatalf("count %d, want 6", n)
		}
		_, msgs := consumeWith(t, e, c, "pq", 10, nil)
		got, ds := recvBodies(t, msgs, 6, "pq")
		// No priority counts as 0: FIFO with p0.
		wantSeq(t, got, "p9a", "p9b", "p5", "p1", "none", "p0")
		if ds[0].Priority != 9 || ds[2].Priority != 5 || ds[4].Priority != 0 {
			t.Fatalf("priorities %d %d %d", ds[0].Priority, ds[2].Priority, ds[4].Priority)
		}
		for _, d := range ds {
			if err := d.Ack(false); err != nil {
				t.Fatal(err)
			}
		}
		nothingMore(t, 200*time.Millisecond, "pq", msgs)
	})
}

// A priority above the maximum is the maximum: FIFO with it, and the
// message keeps its own priority property.
func TestPriorityCapped(t *testing.T) {
	brokers(t, func(t *testing.T, e *env) {
		c := e.dial()
		ch := confirmChannel(t, e, c)
		declareArgs(t, ch, "cap", amqp.Table{"x-max-priority": int8(3)})
		publishPrio(t, ch, "cap", "a1", 1)
		publishPrio(t, ch, "cap", "b7", 7)
		publishPrio(t, ch, "cap", "c3", 3)
		publishPrio(t, ch, "cap", "d200", 200)
		_, msgs := consumeWith(t, e, c, "cap", 10, nil)
		got, ds := recvBodies(t, msgs, 4, "cap")
		wantSeq(t, got, "b7", "c3", "d200", "a1")
		if ds[0].Priority != 7 || ds[2].Priority != 200 {
			t.Fatalf("priorities %d %d, want 7 200", ds[0].Priority, ds[2].Priority)
		}
	})
}

// basic.get takes the head of the highest level; its message count
// covers every level.
func TestPriorityGet(t *testing.T) {
	brokers(t, func(t *testing.T, e *env) {
		ch := confirmChannel(t, e, e.dial())
		declareArgs(t, ch, "pg", amqp.Table{"x-max-priority": int64(5)})
		publishPrio(t, ch, "pg", "x1", 1)
		publishPrio(t, ch, "pg", "y4", 4)
		publishPrio(t, ch, "pg", "z0", -1)
		for i, want := range []string{"y4", "x1", "z0"} {
			m, ok, err := ch.Get("pg", false)
			if err != nil || !ok {
				t.Fatalf("get %d: %v %v", i, ok, err)
			}
			if string(m.Body) != want || int(m.MessageCount) != 2-i {
				t.Fatalf("get %d: %q count %d, want %q count %d", i, m.Body, m.MessageCount, want, 2-i)
			}
			if i == 0 { // rejected with requeue: back at the head of its level
				if err := m.Reject(true); err != nil {
					t.Fatal(err)
				}
				m, ok, err = ch.Get("pg", false)
				if err != nil || !ok || string(m.Body) != "y4" || !m.Redelivered {
					t.Fatalf("get after reject: %q %v redelivered %v %v", m.Body, ok, m.Redelivered, err)
				}
			}
			if err := m.Ack(false); err != nil {
				t.Fatal(err)
			}
		}
		if _, ok, err := ch.Get("pg", false); ok || err != nil {
			t.Fatalf("get on the empty queue: %v %v", ok, err)
		}
	})
}

// Prefetch 1: a requeued message goes back to the head of its level; a
// higher one published meanwhile goes first once credit is free.
func TestPriorityPrefetchRequeue(t *testing.T) {
	brokers(t, func(t *testing.T, e *env) {
		c := e.dial()
		pub := confirmChannel(t, e, c)
		declareArgs(t, pub, "pr", amqp.Table{"x-max-priority": int32(10)})
		publishPrio(t, pub, "pr", "a0", 0)
		publishPrio(t, pub, "pr", "b5", 5)
		publishPrio(t, pub, "pr", "c5", 5)
		_, msgs := consumeWith(t, e, c, "pr", 1, nil)
		got, ds := recvBodies(t, msgs, 1, "first")
		if err := ds[0].Nack(false, true); err != nil {
			t.Fatal(err)
		}
		g, ds := recvBodies(t, msgs, 1, "after nack")
		got = append(got, g...)
		if err := ds[0].Ack(false); err != nil {
			t.Fatal(err)
		}
		g, ds = recvBodies(t, msgs, 1, "third")
		got = append(got, g...)
		publishPrio(t, pub, "pr", "d9", 9) // while c5 is out
		nothingMore(t, 100*time.Millisecond, "prefetch 1", msgs)
		if err := ds[0].Ack(false); err != nil {
			t.Fatal(err)
		}
		g, ds = recvBodies(t, msgs, 1, "fourth")
		got = append(got, g...)
		if err := ds[0].Ack(false); err != nil {
			t.Fatal(err)
		}
		g, ds = recvBodies(t, msgs, 1, "fifth")
		got = append(got, g...)
		if err := ds[0].Ack(false); err != nil {
			t.Fatal(err)
		}
		wantSeq(t, got, "b5", "b5*", "c5", "d9", "a0")
	})
}

// Counts, purge and delete cover every level.
func TestPriorityCountsPurgeDelete(t *testing.T) {
	brokers(t, func(t *testing.T, e *env) {
		ch := confirmChannel(t, e, e.dial())
		args := amqp.Table{"x-max-priority": int32(9)}
		declareArgs(t, ch, "pc", args)
		for i, p := range []int{0, 3, 9, 9, 200, -1} {
			publishPrio(t, ch, "pc", string(rune('a'+i)), p)
		}
		if n := passiveCount(t, ch, "pc"); n != 6 {
			t.Fatalf("count %d, want 6", n)
		}
		n, err := ch.QueuePurge("pc", false)
		if err != nil || n != 6 {
			t.Fatalf("purge: %d %v, want 6", n, err)
		}
		if n := passiveCount(t, ch, "pc"); n != 0 {
			t.Fatalf("count after purge %d", n)
		}
		publishPrio(t, ch, "pc", "x", 4)
		publishPrio(t, ch, "pc", "y", 0)
		n, err = ch.QueueDelete("pc", false, false, false)
		if err != nil || n != 2 {
			t.Fatalf("delete: %d %v, want 2", n, err)
		}
		// A new queue of the name starts empty.
		declareArgs(t, ch, "pc", args)
		if n := passiveCount(t, ch, "pc"); n != 0 {
			t.Fatalf("count of the redeclared queue %d", n)
		}
		publishPrio(t, ch, "pc", "z", 4)
		m, ok, err := ch.Get("pc", true)
		if err != nil || !ok || string(m.Body) != "z" {
			t.Fatalf("get from the redeclared queue: %q %v %v", m.Body, ok, err)
		}
	})
}

// Dead-lettering, TTL and drop-head keep working on a priority queue.
func TestPriorityDeadLetter(t *testing.T) {
	brokers(t, func(t *testing.T, e *env) {
		c := e.dial()
		ch := confirmChannel(t, e, c)
		if err := ch.ExchangeDeclare("dlx", "fanout", false, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
		declare(t, ch, "dead")
		if err := ch.QueueBind("dead", "", "dlx", false, nil); err != nil {
			t.Fatal(err)
		}
		declareArgs(t, ch, "work", amqp.Table{"x-max-priority": int32(10), "x-dead-letter-exchange": "dlx"})
		publishPrio(t, ch, "work", "a2", 2)
		publishPrio(t, ch, "work", "b8", 8)
		_, msgs := consumeWith(t, e, c, "work", 10, nil)
		got, ds := recvBodies(t, msgs, 2, "work")
		wantSeq(t, got, "b8", "a2")
		for _, d := range ds {
			if err := d.Reject(false); err != nil {
				t.Fatal(err)
			}
		}
		for _, want := range []string{"b8", "a2"} {
			m, ok := getWithin(t, ch, "dead", 5*time.Second)
			if !ok || string(m.Body) != want {
				t.Fatalf("dead: %q %v, want %q", m.Body, ok, want)
			}
			checkDeath(t, deaths(t, m)[0], 1, reasonRejected, "work", "", []string{"work"}, "")
			if m.Priority == 0 {
				t.Fatalf("dead-lettered %q lost its priority", m.Body)
			}
		}

		// TTL: expired at the head of every level, without consumers.
		declareArgs(t, ch, "ttl", amqp.Table{"x-max-priority": int32(10), "x-dead-letter-exchange": "dlx", "x-message-ttl": int32(200)})
		publishPrio(t, ch, "ttl", "t7", 7)
		publishPrio(t, ch, "ttl", "t0", 0)
		seen := map[string]bool{}
		for range 2 {
			m, ok := getWithin(t, ch, "dead", 5*time.Second)
			if !ok {
				t.Fatalf("expired messages not dead-lettered: %v", seen)
			}
			checkDeath(t, deaths(t, m)[0], 1, reasonExpired, "ttl", "", []string{"ttl"}, "")
			seen[string(m.Body)] = true
		}
		if !seen["t7"] || !seen["t0"] {
			t.Fatalf("dead-lettered %v", seen)
		}
		if n := passiveCount(t, ch, "ttl"); n != 0 {
			t.Fatalf("ttl queue count %d", n)
		}
	})
}

// x-max-length with drop-head on a priority queue removes what would be
// delivered next.
func TestPriorityDropHead(t *testing.T) {
	brokers(t, func(t *testing.T, e *env) {
		c := e.dial()
		ch := confirmChannel(t, e, c)
		declareArgs(t, ch, "ml", amqp.Table{"x-max-priority": int32(10), "x-max-length": int32(2)})
		publishPrio(t, ch, "ml", "a1", 1)
		publishPrio(t, ch, "ml", "b5", 5)
		publishPrio(t, ch, "ml", "c1", 1)
		publishPrio(t, ch, "ml", "d0", 0)
		if n := passiveCount(t, ch, "ml"); n != 2 {
			t.Fatalf("count %d, want 2", n)
		}
		var got []string
		for {
			m, ok, err := ch.Get("ml", true)
			if err != nil {
				t.Fatal(err)
			}
			if !ok {
				break
			}
			got = append(got, string(m.Body))
		}
		wantSeq(t, got, "c1", "d0")
	})
}

// With two replicas the holder of a priority queue serves every level:
// levels stored through the other replica are found in KubeMQ, a consumer
// and counts through that replica see priority order and every level,
// and its requeue and acks reach the level's lease.
func TestForwardedPriority(t *testing.T) {
	rs := newReplicas(t, 2)
	a, b := rs[0], rs[1]
	cha := a.channel(a.dial())
	args := amqp.Table{"x-max-priority": int32(10)}
	if _, err := cha.QueueDeclare("fwd.p", true, false, false, false, args); err != nil {
		t.Fatal(err)
	}
	if _, err := cha.Consume("fwd.p", "ca", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if owner(t, rs, "fwd.p") != a {
		t.Fatal("a should hold the queue")
	}
	if err := cha.Cancel("ca", false); err != nil {
		t.Fatal(err)
	}
	cb := b.dial()
	pub := confirmChannel(t, b.env, cb)
	publishPrio(t, pub, "fwd.p", "p1", 1)
	publishPrio(t, pub, "fwd.p", "p5", 5)
	publishPrio(t, pub, "fwd.p", "p9", 9)
	publishPrio(t, pub, "fwd.p", "n", -1)
	if n := passiveCount(t, pub, "fwd.p"); n != 4 {
		t.Fatalf("count through b: %d, want 4", n)
	}
	chb := b.channel(cb)
	if err := chb.Qos(10, 0, false); err != nil {
		t.Fatal(err)
	}
	msgs, err := chb.Consume("fwd.p", "cb", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, ds := recvBodies(t, msgs, 4, "forwarded")
	wantSeq(t, got, "p9", "p5", "p1", "n")
	if err := ds[0].Nack(false, true); err != nil {
		t.Fatal(err)
	}
	g, ds2 := recvBodies(t, msgs, 1, "requeued")
	wantSeq(t, g, "p9*")
	for _, d := range append(ds[1:], ds2...) {
		if err := d.Ack(false); err != nil {
			t.Fatal(err)
		}
	}
	nothingMore(t, 300*time.Millisecond, "after acks", msgs)
	for _, p := range []int{0, 1, 5, 9} {
		q := b.srv.top.vhost(vhostKey(b.vhost)).lookupQueue("fwd.p")
		if b.m.Lookup(q.levelChannel(p)) != nil {
			t.Fatalf("b consumes level %d itself", p)
		}
	}
	if err := chb.Cancel("cb", false); err != nil {
		t.Fatal(err)
	}
	if n := passiveCount(t, pub, "fwd.p"); n != 0 {
		t.Fatalf("count after acks: %d, want 0", n)
	}
}

// A replica lets a priority queue's levels go with level 0: when the
// queue's last consumer there ends and another replica takes the queue,
// that replica serves every level, in priority order.
func TestPriorityHolderChange(t *testing.T) {
	rs := newReplicas(t, 2)
	a, b := rs[0], rs[1]
	ca := a.dial()
	pa := confirmChannel(t, a.env, ca)
	args := amqp.Table{"x-max-priority": int32(10)}
	if _, err := pa.QueueDeclare("move.p", true, false, false, false, args); err != nil {
		t.Fatal(err)
	}
	publishPrio(t, pa, "move.p", "a1", 1)
	publishPrio(t, pa, "move.p", "a9", 9)
	publishPrio(t, pa, "move.p", "a5", 5)
	cha := a.channel(ca)
	msgs, err := cha.Consume("move.p", "ca", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, ds := recvBodies(t, msgs, 3, "on a")
	wantSeq(t, got, "a9", "a5", "a1")
	for _, d := range ds {
		if err := d.Ack(false); err != nil {
			t.Fatal(err)
		}
	}
	if owner(t, rs, "move.p") != a {
		t.Fatal("a should hold the queue")
	}
	if err := cha.Close(); err != nil {
		t.Fatal(err)
	}
	// a lets level 0 go once its consumer's channel closed and its
	// leases are settled, and every other level with it.
	q := a.srv.top.vhost(vhostKey(a.vhost)).lookupQueue("move.p")
	deadline := time.Now().Add(15 * time.Second)
	held := func(ch string) bool {
		if a.m.Lookup(ch) != nil {
			return true
		}
		m, ok := b.cluster.Owner(ch) // the holding's release, as b sees it
		return ok && m.ID == a.id
	}
	for _, p := range []int{0, 1, 5, 9} {
		for held(q.levelChannel(p)) {
			if time.Now().After(deadline) {
				t.Fatalf("a still consumes level %d of a queue it has no use for", p)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	cb := b.dial()
	pb := confirmChannel(t, b.env, cb)
	publishPrio(t, pb, "move.p", "n", -1)
	publishPrio(t, pb, "move.p", "b5", 5)
	publishPrio(t, pb, "move.p", "b9", 9)
	publishPrio(t, pb, "move.p", "b1", 1)
	chb := b.channel(cb)
	if err := chb.Qos(10, 0, false); err != nil {
		t.Fatal(err)
	}
	mb, err := chb.Consume("move.p", "cb", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, ds = recvBodies(t, mb, 4, "on b")
	wantSeq(t, got, "b9", "b5", "b1", "n")
	for _, d := range ds {
		if err := d.Ack(false); err != nil {
			t.Fatal(err)
		}
	}
	nothingMore(t, 300*time.Millisecond, "after acks", mb)
	qb := b.srv.top.vhost(vhostKey(b.vhost)).lookupQueue("move.p")
	for _, p := range []int{0, 1, 5, 9} {
		if b.m.Lookup(qb.levelChannel(p)) == nil {
			t.Fatalf("b, which holds the queue now, does not consume level %d", p)
		}
	}
}
