package amqp091

import (
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/kubemq-io/kubemq-proxy/cluster"
)

// Queue lifetimes across replicas (docs/CLUSTER.md): auto-delete and
// x-expires are judged by the queue's holder, which sees every consumer of
// the fleet and is told of the other replicas' uses, for durable and
// non-durable queues alike.

// testFleet is proxy.Fleet over a replica's ownership log.
type testFleet struct{ c *cluster.Cluster }

func (f testFleet) ID() string { return f.c.ID() }

func (f testFleet) Alive() []string {
	select {
	case <-f.c.Ready():
	default:
		return nil
	}
	var ids []string
	for _, m := range f.c.Members() {
		ids = append(ids, m.ID)
	}
	return ids
}

func (f testFleet) Lease() time.Duration { return f.c.Lease() }

// newFleet starts n replicas that share non-durable topology too (Options.Fleet).
func newFleet(t *testing.T, n int) []*replica {
	t.Helper()
	return newFleetLagging(t, n, 0)
}

// newFleetLagging is newFleet whose replicas after the first read the
// registry log lag late.
func newFleetLagging(t *testing.T, n int, lag time.Duration) []*replica {
	t.Helper()
	first := newEnv(t)
	first.stopFn()
	clusterChan := "amqptest.cluster." + randHex(4)
	secret := "s-" + randHex(8)
	rs := make([]*replica, n)
	for i := range rs {
		if i == 1 {
			first.followDelay = lag
		}
		rs[i] = startReplica(t, first, fmt.Sprintf("r%d", i), clusterChan, secret, func(o *Options) {
			o.Fleet = testFleet{o.Peers.(testPeers).c} // startReplica set Peers first
		})
	}
	return rs
}

// queueCode declares queue q passively through r on a connection of its
// own and returns the reply code (0: the queue is there).
func queueCode(t *testing.T, r *replica, q string) int {
	t.Helper()
	c, err := amqp.Dial(r.url())
	if err != nil {
		t.Fatalf("%s: %v", r.id, err)
	}
	defer c.Close()
	ch, err := c.Channel()
	if err != nil {
		t.Fatalf("%s: %v", r.id, err)
	}
	_, err = ch.QueueDeclarePassive(q, false, false, false, false, nil)
	return amqpCode(err)
}

// knows reports whether r's topology has queue q (a look that is no use
// of q, unlike a passive declare).
func knows(r *replica, q string) bool {
	return r.srv.top.vhost(vhostKey(r.vhost)).lookupQueue(q) != nil
}

// waitGone waits until no replica of rs knows queue q, then checks that a
// passive declare through each answers 404.
func waitGone(t *testing.T, rs []*replica, q string, within time.Duration, what string) {
	t.Helper()
	deadline := time.Now().Add(within)
	for _, r := range rs {
		for knows(r, q) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: queue %s still there on %s after %v", what, q, r.id, within)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	for _, r := range rs {
		if code := queueCode(t, r, q); code != amqp.NotFound {
			t.Fatalf("%s: passive declare of %s on %s: %d, want 404", what, q, r.id, code)
		}
	}
}

// waitKnown waits until every replica of rs knows queue q.
func waitKnown(t *testing.T, rs []*replica, q string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for _, r := range rs {
		for queueCode(t, r, q) != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("%s never learnt of queue %s", r.id, q)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// stillThere checks that every replica knows q and that a message
// published through pub reaches the consumer msgs.
func stillThere(t *testing.T, rs []*replica, pub *replica, q string, msgs <-chan amqp.Delivery, what string) {
	t.Helper()
	for _, r := range rs {
		if code := queueCode(t, r, q); code != 0 {
			t.Fatalf("%s: passive declare of %s on %s: %d", what, q, r.id, code)
		}
	}
	ch := pub.channel(pub.dial())
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	publishConfirmed(t, ch, "", q, what)
	select {
	case d := <-msgs:
		if string(d.Body) != what {
			t.Fatalf("%s: the remaining consumer got %q", what, d.Body)
		}
		d.Ack(false)
	case <-time.After(15 * time.Second):
		t.Fatalf("%s: the remaining consumer got nothing", what)
	}
}

// An auto-delete queue with consumers on two replicas stays while either
// has one, whichever replica declared it and whichever holds it, and goes
// once the last one anywhere is cancelled or its channel closes.
func TestFleetAutoDelete(t *testing.T) {
	for _, durable := range []bool{true, false} {
		t.Run(fmt.Sprintf("durable=%v", durable), func(t *testing.T) {
			rs := newFleet(t, 2)
			a, b := rs[0], rs[1] // a declares
			cha := a.channel(a.dial())
			declareOn := func(q string) {
				if _, err := cha.QueueDeclare(q, durable, true, false, false, nil); err != nil {
					t.Fatal(err)
				}
				waitKnown(t, rs, q)
			}
			consume := func(r *replica, q, tag string) (*amqp.Channel, <-chan amqp.Delivery) {
				ch := r.channel(r.dial())
				msgs, err := ch.Consume(q, tag, false, false, false, false, nil)
				if err != nil {
					t.Fatalf("consume on %s: %v", r.id, err)
				}
				return ch, msgs
			}

			// The declaring replica holds the queue; its consumer goes first,
			// then the other replica's, forwarded to it, by channel close.
			declareOn("ad.1")
			ca, _ := consume(a, "ad.1", "ca")
			if owner(t, rs, "ad.1") != a {
				t.Fatal("a should hold ad.1")
			}
			cb, mb := consume(b, "ad.1", "cb")
			if err := ca.Cancel("ca", false); err != nil {
				t.Fatal(err)
			}
			stillThere(t, rs, a, "ad.1", mb, "ad.1 after the holder's consumer left")
			if err := cb.Close(); err != nil {
				t.Fatal(err)
			}
			waitGone(t, rs, "ad.1", 15*time.Second, "the forwarded last consumer's channel closed")

			// The other replica holds the queue; the declaring replica's
			// consumer (forwarded) goes first, then the holder's.
			declareOn("ad.2")
			cb, mb = consume(b, "ad.2", "cb")
			if owner(t, rs, "ad.2") != b {
				t.Fatal("b should hold ad.2")
			}
			ca, _ = consume(a, "ad.2", "ca")
			if err := ca.Cancel("ca", false); err != nil {
				t.Fatal(err)
			}
			stillThere(t, rs, b, "ad.2", mb, "ad.2 after the declaring replica's consumer left")
			if err := cb.Cancel("cb", false); err != nil {
				t.Fatal(err)
			}
			waitGone(t, rs, "ad.2", 15*time.Second, "the holder's last consumer cancelled")

			// The holder's consumer stays, the forwarded one goes.
			declareOn("ad.3")
			ca, ma := consume(a, "ad.3", "ca")
			owner(t, rs, "ad.3")
			cb, _ = consume(b, "ad.3", "cb")
			if err := cb.Cancel("cb", false); err != nil {
				t.Fatal(err)
			}
			stillThere(t, rs, b, "ad.3", ma, "ad.3 after the forwarded consumer left")
			if err := ca.Cancel("ca", false); err != nil {
				t.Fatal(err)
			}
			waitGone(t, rs, "ad.3", 15*time.Second, "the holder's last consumer cancelled")
		})
	}
}

// A replica that stops (as on SIGTERM) takes its clients' consumers with
// it: an auto-delete queue it holds goes when they were its last consumers
// in the fleet, as a RabbitMQ queue does when its node's connections close,
// and stays when another replica's consumer is left (it moves to the next
// holder). The queues are declared on a replica that keeps running, so the
// sweep of a stopped replica's non-durable queues plays no part.
func TestFleetAutoDeleteHolderStops(t *testing.T) {
	rs := newFleet(t, 3)
	a, b, c := rs[0], rs[1], rs[2]
	chc := c.channel(c.dial())
	for _, q := range []string{"ads.own", "ads.shared"} {
		if _, err := chc.QueueDeclare(q, true, true, false, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	waitKnown(t, rs, "ads.own")
	waitKnown(t, rs, "ads.shared")
	consume := func(r *replica, q string) (*amqp.Channel, <-chan amqp.Delivery) {
		ch := r.channel(r.dial())
		msgs, err := ch.Consume(q, "", false, false, false, false, nil)
		if err != nil {
			t.Fatalf("consume %s on %s: %v", q, r.id, err)
		}
		return ch, msgs
	}

	// a holds ads.own and serves its only consumer.
	consume(a, "ads.own")
	if owner(t, rs, "ads.own") != a {
		t.Fatal("a should hold ads.own")
	}
	// b holds ads.shared; c's consumer of it is forwarded to b.
	consume(b, "ads.shared")
	if owner(t, rs, "ads.shared") != b {
		t.Fatal("b should hold ads.shared")
	}
	cc, mc := consume(c, "ads.shared")

	a.stop()
	waitGone(t, []*replica{b, c}, "ads.own", 15*time.Second, "the holder of its only consumer stopped")

	b.stop()
	stillThere(t, []*replica{c}, c, "ads.shared", mc, "ads.shared after its holder stopped, a consumer left on c")
	if err := cc.Close(); err != nil {
		t.Fatal(err)
	}
	waitGone(t, []*replica{c}, "ads.shared", 15*time.Second, "the last consumer, on the new holder, closed")
}

// A queue with x-expires, used only through the replica that does not
// hold it, stays: a consumer there (forwarded to the holder), redeclares,
// passive declares and gets there start the holder's timer again. Unused
// everywhere, it goes after x-expires.
func TestFleetExpires(t *testing.T) {
	const expires = 1500 * time.Millisecond
	for _, durable := range []bool{true, false} {
		t.Run(fmt.Sprintf("durable=%v", durable), func(t *testing.T) {
			rs := newFleet(t, 2)
			a := rs[0]
			args := amqp.Table{"x-expires": int32(expires / time.Millisecond)}
			if _, err := a.channel(a.dial()).QueueDeclare("exp", durable, false, false, false, args); err != nil {
				t.Fatal(err)
			}
			waitKnown(t, rs, "exp")
			h := owner(t, rs, "exp")
			o := rs[0]
			if h == o {
				o = rs[1]
			}
			ch := o.channel(o.dial())
			uses := []func() error{
				func() error { _, err := ch.QueueDeclare("exp", durable, false, false, false, args); return err },
				func() error { _, err := ch.QueueDeclarePassive("exp", durable, false, false, false, nil); return err },
				func() error { _, _, err := ch.Get("exp", true); return err },
			}
			for i := range 7 {
				time.Sleep(expires / 3)
				if err := uses[i%len(uses)](); err != nil {
					t.Fatalf("use %d through %s (%s holds the queue): %v", i, o.id, h.id, err)
				}
			}
			// A consumer on the other replica keeps it for longer than x-expires.
			cch := o.channel(o.dial())
			if _, err := cch.Consume("exp", "c", false, false, false, false, nil); err != nil {
				t.Fatal(err)
			}
			time.Sleep(2 * expires)
			if got := owner(t, rs, "exp"); got != h {
				t.Fatalf("the holder moved from %s to %s", h.id, got.id)
			}
			if err := cch.Cancel("c", false); err != nil {
				t.Fatalf("cancel after 2 x-expires with a forwarded consumer: %v", err)
			}
			waitGone(t, rs, "exp", expires+10*time.Second, "unused everywhere")
		})
	}
}

// A new holder starts the x-expires timer afresh: the queue still goes
// when its holder stops and another replica takes it over.
func TestFleetExpiresHolderChange(t *testing.T) {
	const expires = 2000 * time.Millisecond
	rs := newFleet(t, 2)
	a := rs[0]
	args := amqp.Table{"x-expires": int32(expires / time.Millisecond)}
	if _, err := a.channel(a.dial()).QueueDeclare("exp.move", true, false, false, false, args); err != nil {
		t.Fatal(err)
	}
	waitKnown(t, rs, "exp.move")
	h := owner(t, rs, "exp.move")
	o := rs[0]
	if h == o {
		o = rs[1]
	}
	h.stop()
	if got := owner(t, []*replica{o}, "exp.move"); got != o {
		t.Fatal("the remaining replica does not hold the queue")
	}
	// Its timer starts when it takes the queue over.
	time.Sleep(expires / 2)
	if !knows(o, "exp.move") {
		t.Fatalf("the queue went within %v of the takeover (x-expires %v)", expires/2, expires)
	}
	waitGone(t, []*replica{o}, "exp.move", expires+10*time.Second, "after the holder changed")
}

// What a declare through one replica made is there at once through
// another, however late that replica reads the registry log (here 300 ms):
// a lookup that finds nothing catches up with the log before it answers
// 404 or deletes nothing.
func TestFleetDeclareVisibleAtOnce(t *testing.T) {
	rs := newFleetLagging(t, 2, 300*time.Millisecond)
	a, b := rs[0], rs[1]
	cha := a.channel(a.dial())
	bc := b.dial()
	onB := func() *amqp.Channel { return b.channel(bc) }
	declareQ := func(q string) {
		if _, err := cha.QueueDeclare(q, true, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	declareX := func(x string) {
		if err := cha.ExchangeDeclare(x, "fanout", true, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
	}

	declareQ("vis.passive")
	if _, err := onB().QueueDeclarePassive("vis.passive", true, false, false, false, nil); err != nil {
		t.Fatalf("passive queue declare: %v", err)
	}
	declareX("vis.xpassive")
	if err := onB().ExchangeDeclarePassive("vis.xpassive", "fanout", true, false, false, false, nil); err != nil {
		t.Fatalf("passive exchange declare: %v", err)
	}
	declareQ("vis.bound")
	declareX("vis.xbind")
	if err := onB().QueueBind("vis.bound", "", "vis.xbind", false, nil); err != nil {
		t.Fatalf("bind: %v", err)
	}
	declareX("vis.xpub")
	pub := onB()
	if err := pub.Confirm(false); err != nil {
		t.Fatal(err)
	}
	publishConfirmed(t, pub, "vis.xpub", "", "publish to a new exchange")
	declareQ("vis.consumed")
	msgs, err := onB().Consume("vis.consumed", "", false, false, false, false, nil)
	if err != nil {
		t.Fatalf("consume: %v", err)
	}
	if err := cha.Confirm(false); err != nil {
		t.Fatal(err)
	}
	publishConfirmed(t, cha, "", "vis.consumed", "hello")
	select {
	case d := <-msgs:
		d.Ack(false)
	case <-time.After(15 * time.Second):
		t.Fatal("the consumer on b got nothing")
	}
	declareQ("vis.deleted")
	if _, err := onB().QueueDelete("vis.deleted", false, false, false); err != nil {
		t.Fatalf("delete: %v", err)
	}
	waitGone(t, rs, "vis.deleted", 15*time.Second, "deleted through b at once")

	if _, err := onB().QueueDeclarePassive("vis.none", true, false, false, false, nil); amqpCode(err) != amqp.NotFound {
		t.Fatalf("passive declare of a queue nobody declared: %v", err)
	}
}
