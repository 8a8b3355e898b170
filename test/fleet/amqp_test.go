package fleet

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// AMQP across the fleet: one durable queue, an amqp091-go consumer on every replica. One
// replica holds the queue's KubeMQ consumer; the others forward their consumers to it.

func (r *replica) amqpURL() string { return "amqp://guest:guest@" + r.addr("amqp") + "/" }

// setupAMQP declares the run's durable queue through the first replica and waits until every
// replica knows it (the registry).
func (f *fleet) setupAMQP(t testing.TB) string {
	t.Helper()
	return f.declareQueue(t, "fleet-"+f.suffix, f.replicas)
}

// declareQueue declares durable queue q through the first of rs and waits until every other
// one knows it.
func (f *fleet) declareQueue(t testing.TB, q string, rs []*replica) string {
	t.Helper()
	c, err := amqp.Dial(rs[0].amqpURL())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ch, err := c.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	for _, r := range rs[1:] {
		deadline := time.Now().Add(30 * time.Second)
		for {
			err := func() error {
				c, err := amqp.Dial(r.amqpURL())
				if err != nil {
					return err
				}
				defer c.Close()
				ch, err := c.Channel()
				if err != nil {
					return err
				}
				_, err = ch.QueueDeclarePassive(q, true, false, false, false, nil)
				return err
			}()
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s never saw queue %s: %v", r.name, q, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return q
}

// consumeOn runs an amqp091-go consumer of q on r until ctx ends, connecting again whenever
// its connection closes (the replica stopped, or closed it with 320). On ctx's end it closes
// its channel and connection cleanly, so what it holds unacked goes back.
func consumeOn(ctx context.Context, t testing.TB, wg *sync.WaitGroup, r *replica, q string, l *ledger) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			err := consumeOnce(ctx, r, q, l)
			if err != nil && ctx.Err() == nil {
				t.Logf("%s: consumer ended: %v; again", r.name, err)
				select {
				case <-time.After(200 * time.Millisecond):
				case <-ctx.Done():
				}
			}
		}
	}()
}

func consumeOnce(ctx context.Context, r *replica, q string, l *ledger) error {
	c, err := amqp.Dial(r.amqpURL())
	if err != nil {
		return err
	}
	defer c.Close()
	ch, err := c.Channel()
	if err != nil {
		return err
	}
	if err := ch.Qos(100, 0, false); err != nil {
		return err
	}
	ds, err := ch.ConsumeWithContext(ctx, q, "", false, false, false, false, nil)
	if err != nil {
		return err
	}
	closed := c.NotifyClose(make(chan *amqp.Error, 1))
	chClosed := ch.NotifyClose(make(chan *amqp.Error, 1))
	cancelled := ch.NotifyCancel(make(chan string, 1))
	for {
		select {
		case d, ok := <-ds:
			if !ok {
				// The deliveries end with the connection, the channel, or a basic.cancel
				// from the server, which leaves both open.
				select {
				case e := <-closed:
					return closeErr("connection", e)
				case e := <-chClosed:
					return closeErr("channel", e)
				case tag, ok := <-cancelled:
					if !ok { // closed by the channel's shutdown: the close says why
						select {
						case e := <-closed:
							return closeErr("connection", e)
						case e := <-chClosed:
							return closeErr("channel", e)
						case <-ctx.Done():
							return nil
						}
					}
					l.serverCancel()
					return fmt.Errorf("the server cancelled consumer %s (basic.cancel)", tag)
				case <-ctx.Done():
					return nil
				}
			}
			l.deliver(d.MessageId, r.name)
			if err := d.Ack(false); err != nil {
				return err
			}
			l.ack(d.MessageId)
		case <-ctx.Done():
			_ = ch.Close()
			return nil
		}
	}
}

// closeErr is the error of a connection or channel that closed with e (nil: closed by the
// client).
func closeErr(what string, e *amqp.Error) error {
	if e != nil {
		return e
	}
	return errors.New(what + " closed")
}

// confirmWait bounds the wait for one publisher confirm.
const confirmWait = 2 * time.Minute

// publishAMQP sends n confirmed 1 KiB messages (message id 0..n-1) through the replicas in
// turn, and returns their ids; fault, if set, runs once half of them are confirmed, after
// which only the last replica publishes.
func (f *fleet) publishAMQP(t testing.TB, q string, n int, fault func()) []string {
	t.Helper()
	chs := make([]*amqp.Channel, len(f.replicas))
	for i, r := range f.replicas {
		c, err := amqp.Dial(r.amqpURL())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if chs[i], err = c.Channel(); err != nil {
			t.Fatal(err)
		}
		if err := chs[i].Confirm(false); err != nil {
			t.Fatal(err)
		}
	}
	body := make([]byte, 1024)
	ids := make([]string, n)
	ctx := context.Background()
	var pending []*amqp.DeferredConfirmation
	wait := func() {
		for _, d := range pending {
			wctx, cancel := context.WithTimeout(ctx, confirmWait)
			ok, err := d.WaitContext(wctx)
			cancel()
			if !ok || err != nil {
				t.Fatalf("publish %d not confirmed: %v %v", d.DeliveryTag, ok, err)
			}
		}
		pending = pending[:0]
	}
	for i := range n {
		if i == n/2 && fault != nil {
			wait()
			fault()
		}
		ids[i] = strconv.Itoa(i)
		ch := chs[i%len(chs)]
		if fault != nil && i >= n/2 {
			ch = chs[len(chs)-1]
		}
		d, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", q, false, false, amqp.Publishing{MessageId: ids[i], Body: body, DeliveryMode: amqp.Persistent})
		if err != nil {
			t.Fatalf("publish: %v", err)
		}
		pending = append(pending, d)
		if len(pending) >= 300 {
			wait()
		}
	}
	wait()
	return ids
}

// startConsumers starts a consumer on every replica, the first one's first so that it holds
// the queue and the others forward.
func (f *fleet) startConsumers(ctx context.Context, t testing.TB, wg *sync.WaitGroup, q string, l *ledger, skip int) {
	for i, r := range f.replicas {
		if i == skip {
			continue
		}
		consumeOn(ctx, t, wg, r, q, l)
		if i == 0 {
			time.Sleep(2 * time.Second)
		}
	}
}

// TestAMQPFleet: three replicas (FLEET_REPLICAS), an AMQP consumer of one queue on each, no
// fault: every message once, and the work shared within 20 % of even.
func TestAMQPFleet(t *testing.T) {
	f := newFleet(t, replicas(t))
	q := f.setupAMQP(t)
	l := newLedger()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	f.startConsumers(ctx, t, &wg, q, l, -1)
	n := messages(t)
	start := time.Now()
	ids := f.publishAMQP(t, q, n, nil)
	l.waitFor(t, n, 5*time.Minute)
	took := time.Since(start)
	// Records of acked leases come back a record delay later: none may bring a message back.
	time.Sleep(15 * time.Second)
	cancel()
	wg.Wait()
	dups, afterAck, split := l.report(t, ids)
	t.Logf("FLEET amqp %d messages in %v, %d duplicates (%d of acked messages), per replica:%s", n, took.Round(time.Millisecond), dups, afterAck, split)
	if !f.excused(dups, "duplicate deliveries") {
		t.Errorf("%d duplicate deliveries without any fault", dups)
	}
	even := float64(n) / float64(len(f.replicas))
	l.mu.Lock()
	for _, r := range f.replicas {
		if got := float64(l.byReplica[r.name]); math.Abs(got-even) > 0.2*even {
			t.Errorf("%s got %d deliveries, more than 20%% off an even share (%.0f)", r.name, l.byReplica[r.name], even)
		}
	}
	l.mu.Unlock()
	f.checkProblems()
}

// TestAMQPFleetKill: the replica that holds the queue is killed (-9) mid-run and started
// again: nothing is lost.
func TestAMQPFleetKill(t *testing.T) { amqpKill(t, 0, "the holder") }

// TestAMQPFleetKillForwarder: a replica that forwards its consumer to the holder is killed (-9)
// mid-run and started again: the holder puts back what the link had out; nothing is lost.
func TestAMQPFleetKillForwarder(t *testing.T) { amqpKill(t, 1, "a forwarder") }

func amqpKill(t *testing.T, victimIndex int, what string) {
	f := newFleet(t, faultReplicas(t))
	q := f.setupAMQP(t)
	l := newLedger()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	f.startConsumers(ctx, t, &wg, q, l, -1)
	n := messages(t)
	victim := f.replicas[victimIndex]
	var killed time.Time
	ids := f.publishAMQP(t, q, n, func() {
		l.mark()
		killed = time.Now()
		victim.p.Kill()
		time.Sleep(time.Second)
		victim.start()
	})
	l.waitFor(t, n, 5*time.Minute)
	time.Sleep(15 * time.Second)
	cancel()
	wg.Wait()
	dups, afterAck, split := l.report(t, ids)
	t.Logf("FLEET amqp kill -9 of %s: %d messages, %d duplicates (%d of acked messages: %s), longest pause in deliveries after the kill %v, all delivered %v after it, per replica:%s",
		what, n, dups, afterAck, l.ackedSpan(afterAck), l.gap().Round(time.Millisecond), l.lastAt().Sub(killed).Round(time.Millisecond), split)
	f.checkProblems()
}

// TestAMQPFleetStop: the replica that holds the queue is stopped (SIGTERM) mid-run, after its
// own client's consumer: nothing is lost, no message comes twice, and the others' forwarded
// consumers go on.
func TestAMQPFleetStop(t *testing.T) {
	f := newFleet(t, faultReplicas(t))
	q := f.setupAMQP(t)
	l := newLedger()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	vctx, vcancel := context.WithCancel(ctx)
	var vwg sync.WaitGroup
	consumeOn(vctx, t, &vwg, f.replicas[0], q, l)
	time.Sleep(2 * time.Second)
	f.startConsumers(ctx, t, &wg, q, l, 0)
	n := messages(t)
	victim := f.replicas[0]
	var stopped time.Time
	ids := f.publishAMQP(t, q, n, func() {
		// A pod stops: its application's consumer first, then the sidecar.
		l.mark()
		vcancel()
		vwg.Wait()
		stopped = time.Now()
		if err := victim.p.Stop(30 * time.Second); err != nil {
			t.Errorf("%s: %v", victim.name, err)
		}
		t.Logf("%s stopped in %v", victim.name, time.Since(stopped).Round(time.Millisecond))
	})
	l.waitFor(t, n, 5*time.Minute)
	time.Sleep(15 * time.Second)
	cancel()
	wg.Wait()
	dups, afterAck, split := l.report(t, ids)
	t.Logf("FLEET amqp SIGTERM: %d messages, %d duplicates (%d of acked messages), longest pause in deliveries after the stop %v, per replica:%s",
		n, dups, afterAck, l.gap().Round(time.Millisecond), split)
	if !f.excused(afterAck, "deliveries of acked messages") {
		t.Errorf("%d deliveries of acked messages after a graceful stop", afterAck)
	}
	f.checkProblems()
}
