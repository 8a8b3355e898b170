package amqp091

import (
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// holdReadAhead keeps a forwarded consumer's read-ahead however long its client waits (the
// tests that look at the buffer itself); restored after the replicas stopped.
func holdReadAhead(t *testing.T) {
	old := fwdReadAheadHold
	fwdReadAheadHold = time.Hour
	t.Cleanup(func() { fwdReadAheadHold = old })
}

// readyThrough waits until queue counts want ready messages through r (passive declare-ok).
func readyThrough(t *testing.T, r *replica, queue string, want int) {
	t.Helper()
	ch := r.channel(r.dial())
	deadline := time.Now().Add(10 * time.Second)
	for {
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		if q.Messages == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s counts %d ready through %s, want %d", queue, q.Messages, r.id, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// releaseHold cancels holdOn's consumer (its channel keeps the unacknowledged message it got):
// the holder keeps the queue (the other replica's consumer is registered there) with no consumer
// of its own, so a forwarded consumer's read-ahead is not kept to the depth of one
// (TestForwardedReadAheadKeptToLocalDepth).
func releaseHold(t *testing.T, hold *amqp.Channel, name string) {
	t.Helper()
	if err := hold.Cancel("hold."+name, false); err != nil {
		t.Fatal(err)
	}
}

// linkOut waits until r, the holder of queue name, has want deliveries out on its one link.
func linkOut(t *testing.T, r *replica, name string, want int) {
	t.Helper()
	l := holderLink(t, r, name)
	deadline := time.Now().Add(10 * time.Second)
	for l.outstanding() != want {
		if time.Now().After(deadline) {
			t.Fatalf("holder has %d out on the link for %s, want %d", l.outstanding(), name, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A forwarded consumer reads ahead beyond its client's prefetch, but the buffer is not the
// client's: its client never gets more than its prefetch, message counts through either
// replica count the buffer as ready, and a cancel or a channel closing gives it back to the
// queue without the redelivered flag (only what the client had comes again redelivered).
func TestForwardedReadAheadReturned(t *testing.T) {
	holdReadAhead(t)
	rs := newReplicas(t, 2)
	a, b := rs[0], rs[1]
	for _, how := range []string{"cancel", "close"} {
		t.Run(how, func(t *testing.T) {
			name := "ra." + how
			ca := a.dial()
			const n = 20
			_, hold := holdOn(t, rs, a, ca, name, n)
			chb := b.channel(b.dial())
			if err := chb.Qos(2, 0, false); err != nil {
				t.Fatal(err)
			}
			db, err := chb.Consume(name, "fwd", false, false, false, false, nil)
			if err != nil {
				t.Fatal(err)
			}
			var held []string
			for range 2 {
				d := mustRecv(t, db, "forwarded delivery")
				if d.Redelivered {
					t.Fatalf("first delivery of %s redelivered", d.MessageId)
				}
				held = append(held, d.MessageId)
			}
			// The holder's own consumer keeps the link to its depth; without it the link reads
			// ahead.
			releaseHold(t, hold, name)
			// The read-ahead (4: twice the prefetch) is ready in the counts, through both replicas.
			readyThrough(t, a, name, n-3)
			readyThrough(t, b, name, n-3)
			select {
			case d := <-db:
				t.Fatalf("client got %s beyond its prefetch of 2", d.MessageId)
			case <-time.After(200 * time.Millisecond):
			}
			// The holder has 6 out on the link: the client's 2 and the read-ahead.
			linkOut(t, a, name, 6)
			if how == "cancel" {
				if err := chb.Cancel("fwd", false); err != nil {
					t.Fatal(err)
				}
			} else {
				if err := chb.Close(); err != nil {
					t.Fatal(err)
				}
			}
			// Everything but what a client holds is ready at once.
			want := n - 3
			if how == "close" {
				want = n - 1 // the client's two came back too
			}
			readyThrough(t, a, name, want)
			chc := a.channel(ca)
			dc, err := chc.Consume(name, "after", false, false, false, false, nil)
			if err != nil {
				t.Fatal(err)
			}
			var got []int
			for range want {
				d := mustRecv(t, dc, "delivery after "+how)
				was := slices.Contains(held, d.MessageId)
				if d.Redelivered != was {
					t.Fatalf("after %s: %s redelivered=%v, want %v (the client had it: %v)", how, d.MessageId, d.Redelivered, was, was)
				}
				k, _ := strconv.Atoi(d.MessageId)
				got = append(got, k)
				_ = d.Ack(false)
			}
			slices.Sort(got)
			for i, k := range got {
				if k != n-want+i {
					t.Fatalf("after %s got %v, want %d..%d", how, got, n-want, n-1)
				}
			}
			if err := chc.Cancel("after", false); err != nil {
				t.Fatal(err)
			}
			if how == "cancel" {
				// The client still holds its two, and settles them over the link: they do not
				// come back when its channel closes.
				if err := chb.Ack(0, true); err != nil {
					t.Fatal(err)
				}
				if err := chb.Close(); err != nil {
					t.Fatal(err)
				}
				time.Sleep(100 * time.Millisecond)
				readyThrough(t, a, name, 0)
			}
			_ = hold.Close()
		})
	}
}

// A client slower than the link does not keep messages from the queue's other consumers: a
// read-ahead that waited fwdReadAheadHold goes back to the queue, not redelivered, and a
// consumer on the holder that is free gets it.
func TestForwardedReadAheadStale(t *testing.T) {
	rs := newReplicas(t, 2)
	a, b := rs[0], rs[1]
	ca := a.dial()
	_, hold := holdOn(t, rs, a, ca, "ra.stale", 4)
	chb := b.channel(b.dial())
	if err := chb.Qos(1, 0, false); err != nil {
		t.Fatal(err)
	}
	db, err := chb.Consume("ra.stale", "slow", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if d := mustRecv(t, db, "slow"); d.MessageId != "1" {
		t.Fatalf("slow got %s first", d.MessageId)
	}
	releaseHold(t, hold, "ra.stale")
	linkOut(t, a, "ra.stale", 3) // "1" and the read-ahead "2" and "3"
	// The slow client never acks; the two messages its replica read ahead go back.
	free := a.channel(ca)
	if err := free.Qos(5, 0, false); err != nil {
		t.Fatal(err)
	}
	df, err := free.Consume("ra.stale", "free", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Both come, not redelivered. Their order depends on whether the link had taken both
	// when the free consumer started (a slow backend can leave "3" on the holder a moment
	// longer, and the free consumer then has it before "2" comes back).
	got := map[string]bool{}
	for range 2 {
		d := mustRecv(t, df, "free consumer")
		if d.Redelivered || (d.MessageId != "2" && d.MessageId != "3") || got[d.MessageId] {
			t.Fatalf("free consumer got %s (redelivered %v), want 2 and 3 not redelivered", d.MessageId, d.Redelivered)
		}
		got[d.MessageId] = true
	}
}

// A forwarded consumer that acknowledges at once gets at most its prefetch (read-ahead or
// not), and consumers of equal speed on the holder and on another replica split a queue
// within 20 % of even.
func TestForwardedReadAheadPrefetchAndSplit(t *testing.T) {
	rs := newReplicas(t, 2)
	a, b := rs[0], rs[1]
	ca := a.dial()
	if _, err := a.channel(ca).QueueDeclare("ra.split", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	const prefetch, n = 5, 600
	type side struct {
		ch *amqp.Channel
		ds <-chan amqp.Delivery
	}
	open := func(r *replica, tag string) side {
		ch := r.channel(r.dial())
		if err := ch.Qos(prefetch, 0, false); err != nil {
			t.Fatal(err)
		}
		ds, err := ch.Consume("ra.split", tag, false, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		return side{ch, ds}
	}
	sa := open(a, "local")
	if owner(t, rs, "ra.split") != a {
		t.Fatal("a should hold the queue")
	}
	sb := open(b, "forwarded")
	var mu sync.Mutex
	per := map[string]int{}
	seen := map[string]bool{}
	done := make(chan struct{})
	total := 0
	run := func(tag string, s side) {
		received, acked := 0, 0
		for d := range s.ds {
			received++
			if out := received - acked; out > prefetch {
				mu.Lock()
				if total < n {
					t.Errorf("%s: %d unacknowledged at the client, prefetch %d", tag, out, prefetch)
				}
				mu.Unlock()
			}
			time.Sleep(time.Millisecond) // equal work per message
			if err := d.Ack(false); err != nil {
				return // the test is over
			}
			acked++
			mu.Lock()
			if total == n {
				mu.Unlock()
				return // the test is over
			}
			if seen[d.MessageId] {
				t.Errorf("%s: %s again", tag, d.MessageId)
			}
			seen[d.MessageId] = true
			per[tag]++
			total++
			if total == n {
				close(done)
			}
			mu.Unlock()
		}
	}
	go run("local", sa)
	go run("forwarded", sb)
	publishN(t, a.channel(ca), "ra.split", 0, n)
	select {
	case <-done:
	case <-time.After(25 * time.Second):
		t.Fatalf("received %d of %d", total, n)
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("split: %v", per)
	for tag, k := range per {
		if k < n*4/10 {
			t.Fatalf("%s got %d of %d: not within 20 %% of an even split (%v)", tag, k, n, per)
		}
	}
}

// While the holder serves a consumer of its own that acknowledges within a prefetch, a
// forwarded consumer's link has no more out than the larger of its client's prefetch and that
// consumer's: its read-ahead would otherwise take a larger share of every batch than the local
// consumer's prefetch allows it (TestAMQPFleet measured 0.73-0.91 of an even share for the
// holder's consumer). With the local consumer gone, the read-ahead comes back.
func TestForwardedReadAheadKeptToLocalDepth(t *testing.T) {
	holdReadAhead(t)
	rs := newReplicas(t, 2)
	a, b := rs[0], rs[1]
	ca := a.dial()
	const name, n = "ra.depth", 40
	if _, err := a.channel(ca).QueueDeclare(name, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	waitKnown(t, rs, name)
	local, dl := consumeWith(t, a.env, ca, name, 4, nil)
	if owner(t, rs, name) != a {
		t.Fatal("a should hold the queue")
	}
	_, df := consumeWith(t, b.env, b.dial(), name, 3, nil)
	publishN(t, a.channel(ca), name, 0, n)
	for range 4 {
		mustRecv(t, dl, "local")
	}
	for range 3 {
		mustRecv(t, df, "forwarded")
	}
	// The link: the client's 3 and one read ahead (the local consumer's depth is 4).
	linkOut(t, a, name, 4)
	time.Sleep(200 * time.Millisecond)
	if out := holderLink(t, a, name).outstanding(); out != 4 {
		t.Fatalf("holder has %d out on the link, want 4 (the local consumer's prefetch)", out)
	}
	readyThrough(t, a, name, n-4-3)
	// The local consumer goes with its channel (its 4 back in the queue): the link reads ahead
	// twice its client's prefetch.
	if err := local.Close(); err != nil {
		t.Fatal(err)
	}
	linkOut(t, a, name, 3+6)
	readyThrough(t, a, name, n-3)
}
