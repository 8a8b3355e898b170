package amqp091

import (
	"context"
	"errors"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/kubemq-io/kubemq-proxy/amqp091/wire"
	"github.com/kubemq-io/kubemq-proxy/delivery"
)

const (
	// fetchBatch caps one lease fetch for a consumer without a prefetch
	// limit (or in no-ack mode).
	fetchBatch = 256
	// getWait bounds basic.get's wait for a message KubeMQ reported as
	// waiting; after it the answer is get-empty.
	getWait = 3 * time.Second
	// uncountedGetWait bounds basic.get on a queue KubeMQ cannot count
	// (kubemqclient.Ambiguous): one Get of the poll loop, which waits a
	// second on an empty queue.
	uncountedGetWait = 1500 * time.Millisecond
	// replyToQueue is RabbitMQ's direct reply-to pseudo queue.
	replyToQueue = "amq.rabbitmq.reply-to"
	// readAhead is how many leases a consumer with a small prefetch window
	// fetches at once while it is its queue's only consumer here: the extra
	// ones wait in pending (still queued as far as the client can tell) so
	// a prefetch-1 consumer does not pay a lease-engine round trip per
	// message. They go back to the front of the queue, uncounted, when
	// another consumer appears or this one stops.
	readAhead = 32
)

// consumer is one basic.consume. Its goroutine fetches leases from the
// queue within the prefetch credit and delivers them.
type consumer struct {
	ch        *channel
	tag       string
	q         *queue
	h         *delivery.Handle
	noAck     bool
	exclusive bool
	prefetch  uint16 // per-consumer limit; 0 = none
	ctx       context.Context
	cancel    context.CancelFunc
	done      chan struct{}
	kick      chan struct{} // cap 1: credit may have been freed

	// Guarded by ch.dmu.
	outstanding int
	pending     []*delivery.Delivery // fetched beyond the channel-wide limit, not yet delivered
}

func (ch *channel) consume(m *wire.BasicConsume) error {
	c := ch.c
	if m.ConsumerTag != "" {
		if _, dup := ch.consumers[m.ConsumerTag]; dup {
			return wire.NotAllowed("attempt to reuse consumer tag '%s'", m.ConsumerTag)
		}
	}
	if m.Queue == replyToQueue {
		return wire.NotImplemented("direct reply-to (%s) is not supported", replyToQueue)
	}
	q, err := ch.queueFor(m.Queue)
	if err != nil {
		return err
	}
	h, err := ch.handleFor(q)
	if err != nil {
		return err
	}
	tag := m.ConsumerTag
	if tag == "" {
		tag = genName("amq.ctag")
	}
	cs := &consumer{ch: ch, tag: tag, q: q, h: h, noAck: m.NoAck, exclusive: m.Exclusive, prefetch: ch.consumerPrefetch,
		done: make(chan struct{}), kick: make(chan struct{}, 1)}
	vh := q.vh
	vh.mu.Lock()
	if q.deleted {
		vh.mu.Unlock()
		return errNoQueue(q.name, c.vhostName)
	}
	if q.exclusiveConsumer || (m.Exclusive && len(q.consumers) > 0) {
		vh.mu.Unlock()
		return wire.AccessRefused("%s in exclusive use", rsQueue(q.name, c.vhostName))
	}
	others := make([]*consumer, 0, len(q.consumers))
	for o := range q.consumers {
		others = append(others, o)
	}
	q.consumers[cs] = struct{}{}
	q.hadConsumer = true
	if m.Exclusive {
		q.exclusiveConsumer = true
	}
	vh.mu.Unlock()
	// A consumer reading ahead gives its held deliveries back now that it
	// has company.
	for _, o := range others {
		o.wake()
	}
	ch.consumers[tag] = cs
	if !m.NoWait {
		ch.send(&wire.BasicConsumeOk{ConsumerTag: tag})
	}
	cs.ctx, cs.cancel = context.WithCancel(c.ctx)
	c.srv.m.consumers.Inc()
	c.nConsumers.Add(1)
	go cs.run()
	return nil
}

func (ch *channel) cancel(m *wire.BasicCancel) error {
	if cs := ch.consumers[m.ConsumerTag]; cs != nil {
		delete(ch.consumers, m.ConsumerTag)
		ch.stopConsumer(cs)
	}
	if !m.NoWait {
		ch.send(&wire.BasicCancelOk{ConsumerTag: m.ConsumerTag})
	}
	return nil
}

// cancelByServer ends a consumer whose queue went away, telling clients
// that understand basic.cancel from the server.
func (ch *channel) cancelByServer(cs *consumer, why string) {
	if ch.consumers[cs.tag] != cs {
		return
	}
	delete(ch.consumers, cs.tag)
	ch.stopConsumer(cs)
	ch.log.Debug("consumer cancelled by the server", zap.String("tag", cs.tag), zap.String("reason", why))
	if ch.c.cancelNotify {
		ch.send(&wire.BasicCancel{ConsumerTag: cs.tag, NoWait: true})
	}
}

// stopConsumer ends cs's goroutine and gives back what it fetched but never
// delivered. Its unacknowledged deliveries stay with the channel, as in
// RabbitMQ. An auto-delete queue that lost its last consumer is deleted.
func (ch *channel) stopConsumer(cs *consumer) {
	cs.cancel()
	<-cs.done
	ch.c.srv.m.consumers.Dec()
	ch.c.nConsumers.Add(-1)
	ch.dmu.Lock()
	pending := cs.pending
	cs.pending = nil
	ch.dmu.Unlock()
	cs.giveBack(pending)
	flushBuffered(cs.h)
	q := cs.q
	q.vh.mu.Lock()
	delete(q.consumers, cs)
	if cs.exclusive {
		q.exclusiveConsumer = false
	}
	drop := q.autoDelete && q.hadConsumer && len(q.consumers) == 0 && !q.deleted
	q.vh.mu.Unlock()
	if drop {
		ch.c.srv.dropQueueAsync(q, "auto-delete queue lost its last consumer", ch.log)
	}
}

func (cs *consumer) run() {
	defer close(cs.done)
	for {
		n := cs.waitCredit()
		if n == 0 {
			return
		}
		if cs.deliverPending(n) {
			continue
		}
		want := n
		if cs.mayReadAhead() {
			want = max(n, readAhead)
		}
		ds, err := cs.h.Fetch(cs.ctx, want)
		if err != nil {
			if cs.ctx.Err() != nil || errors.Is(err, delivery.ErrClosed) {
				cs.giveBack(ds)
				return
			}
			cs.ch.log.Warn("consumer fetch failed", zap.String("queue", cs.q.name), zap.Error(err))
			cs.ch.c.fail(backendError(err))
			return
		}
		cs.deliver(ds)
	}
}

// giveBack returns deliveries the client never saw to the front of the
// queue; the attempt does not count, so they are not "redelivered".
func (cs *consumer) giveBack(ds []*delivery.Delivery) {
	if len(ds) > 0 {
		cs.h.Unfetch(ds...)
	}
}

func (cs *consumer) wake() {
	select {
	case cs.kick <- struct{}{}:
	default:
	}
}

// mayReadAhead reports whether cs may fetch beyond its credit: it has a
// window (no-ack consumers fetch in bulk anyway) and no other consumer of
// its queue in this process would be starved by it.
func (cs *consumer) mayReadAhead() bool {
	if cs.noAck {
		return false
	}
	cs.q.vh.mu.Lock()
	alone := len(cs.q.consumers) == 1
	cs.q.vh.mu.Unlock()
	return alone && cs.q.getters.Load() == 0
}

// reclaimReadAhead makes the consumers of q in this process give back what
// they read ahead, for a basic.get that found the queue empty; it reports
// whether any held something, and waits briefly for it to be back.
func (q *queue) reclaimReadAhead(h *delivery.Handle) bool {
	q.vh.mu.Lock()
	cs := make([]*consumer, 0, len(q.consumers))
	for c := range q.consumers {
		cs = append(cs, c)
	}
	q.vh.mu.Unlock()
	held := false
	for _, c := range cs {
		c.ch.dmu.Lock()
		held = held || len(c.pending) > 0
		c.ch.dmu.Unlock()
		c.wake()
	}
	if !held {
		return false
	}
	deadline := time.Now().Add(time.Second)
	for h.Consumer().Stats().Buffered == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	return true
}

// creditLocked is how many more deliveries cs may have in flight.
func (cs *consumer) creditLocked() int {
	if cs.noAck {
		return fetchBatch
	}
	n := fetchBatch
	if cs.prefetch > 0 {
		n = min(n, int(cs.prefetch)-cs.outstanding)
	}
	if g := cs.ch.globalPrefetch; g > 0 {
		n = min(n, int(g)-len(cs.ch.unacked))
	}
	return max(n, 0)
}

// waitCredit waits until cs may fetch, and returns how many. While some
// of its deliveries are still unacknowledged it waits for half its window
// to be free: every fetch costs the lease engine a KubeMQ round trip or
// several, so refilling one message at a time as acks trickle in would
// starve a fast consumer. The client stays busy with the other half.
func (cs *consumer) waitCredit() int {
	for {
		cs.ch.dmu.Lock()
		n := cs.creditLocked()
		low := cs.lowWaterLocked()
		out := cs.outstanding
		held := len(cs.pending)
		cs.ch.dmu.Unlock()
		if n > 0 && (n >= low || out == 0 || held > 0) {
			return n
		}
		if held > 0 && !cs.mayReadAhead() {
			cs.ch.dmu.Lock()
			back := cs.pending
			cs.pending = nil
			cs.ch.dmu.Unlock()
			cs.giveBack(back)
		}
		select {
		case <-cs.kick:
		case <-cs.ctx.Done():
			return 0
		}
	}
}

// lowWaterLocked is the credit worth a fetch while deliveries are out.
func (cs *consumer) lowWaterLocked() int {
	limit := int(cs.prefetch)
	if g := int(cs.ch.globalPrefetch); g > 0 && (limit == 0 || g < limit) {
		limit = g
	}
	if cs.noAck || limit == 0 {
		return 1
	}
	return max(1, limit/2)
}

// deliverPending delivers held-back deliveries first; it reports whether
// there were any.
func (cs *consumer) deliverPending(n int) bool {
	alone := cs.mayReadAhead()
	cs.ch.dmu.Lock()
	if len(cs.pending) == 0 {
		cs.ch.dmu.Unlock()
		return false
	}
	if !cs.noAck && cs.ch.globalPrefetch == 0 && !alone {
		// Read ahead while alone; now the queue has other consumers here,
		// give the held ones back so they get their share.
		back := cs.pending
		cs.pending = nil
		cs.ch.dmu.Unlock()
		cs.giveBack(back)
		return false
	}
	k := min(n, len(cs.pending))
	ds := slices.Clone(cs.pending[:k])
	cs.pending = cs.pending[k:]
	cs.ch.dmu.Unlock()
	cs.deliver(ds)
	return true
}

type decoded struct {
	exchange, key string
	props         wire.Properties
}

// deliver sends ds to the client within the current credit (the rest is
// held back). Tags are minted and frames queued under dmu, so delivery
// tags reach the wire in increasing order.
func (cs *consumer) deliver(ds []*delivery.Delivery) {
	if len(ds) == 0 {
		return
	}
	ch := cs.ch
	dec := make([]decoded, len(ds))
	for i, d := range ds {
		dec[i].exchange, dec[i].key, dec[i].props = decodeMessage(cs.q.name, d.Metadata, d.Tags)
	}
	var acks []string
	ch.dmu.Lock()
	if ch.stopped || cs.ctx.Err() != nil {
		ch.dmu.Unlock()
		cs.giveBack(ds)
		return
	}
	allowed := cs.creditLocked()
	if cs.noAck {
		allowed = len(ds)
	}
	for i, d := range ds {
		if i >= allowed {
			cs.pending = append(cs.pending, ds[i:]...)
			break
		}
		ch.nextTag++
		tag := ch.nextTag
		if cs.noAck {
			acks = append(acks, d.LeaseID)
		} else {
			ch.unacked[tag] = &unacked{d: d, h: cs.h, cons: cs, queue: cs.q, tag: tag}
			ch.order = append(ch.order, tag)
			cs.outstanding++
		}
		// Counted first, so a client that has the message sees it counted.
		ch.c.srv.m.delivered.Inc()
		cs.q.counters().out(len(d.Body))
		ch.c.w.send(outFrame{channel: ch.id, m: &wire.BasicDeliver{ConsumerTag: cs.tag, DeliveryTag: tag,
			Redelivered: d.Redelivered, Exchange: dec[i].exchange, RoutingKey: dec[i].key}, props: &dec[i].props, body: d.Body})
	}
	ch.dmu.Unlock()
	if len(acks) > 0 {
		cs.h.Ack(acks...)
	}
}

func (ch *channel) get(m *wire.BasicGet) error {
	c := ch.c
	if m.Queue == replyToQueue {
		return errNoQueue(replyToQueue, c.vhostName)
	}
	q, err := ch.queueFor(m.Queue)
	if err != nil {
		return err
	}
	h, err := ch.handleFor(q)
	if err != nil {
		return err
	}
	waiting, known, err := c.srv.waiting(c.ctx, q)
	if err != nil {
		return err
	}
	// A queue KubeMQ cannot count is asked directly (the Fetch below).
	if known && waiting == 0 {
		st := h.Consumer().Stats()
		if st.Buffered == 0 && st.Leases-st.Out > 0 {
			// Deliveries just given back (nack, reject, recover) are being
			// stored again: RabbitMQ would already have them in the queue.
			waitRequeued(h, requeueWait)
			if waiting, _, err = c.srv.waiting(c.ctx, q); err != nil {
				return err
			}
			st = h.Consumer().Stats()
		}
		if waiting == 0 && st.Buffered == 0 {
			q.getters.Add(1)
			defer q.getters.Add(-1)
			if !q.reclaimReadAhead(h) {
				ch.send(&wire.BasicGetEmpty{})
				return nil
			}
		}
	}
	wait := getWait
	if !known {
		wait = uncountedGetWait
	}
	ctx, cancel := context.WithTimeout(c.ctx, wait)
	ds, err := h.Fetch(ctx, 1)
	cancel()
	if err != nil {
		if c.ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
			ch.send(&wire.BasicGetEmpty{})
			return nil
		}
		return err
	}
	d := ds[0]
	for _, extra := range ds[1:] {
		h.Release(extra.LeaseID)
	}
	ex, rk, props := decodeMessage(q.name, d.Metadata, d.Tags)
	left := uint32(0)
	if waiting > 0 {
		left = waiting - 1
	}
	ch.dmu.Lock()
	ch.nextTag++
	tag := ch.nextTag
	if !m.NoAck {
		ch.unacked[tag] = &unacked{d: d, h: h, queue: q, tag: tag}
		ch.order = append(ch.order, tag)
	}
	c.srv.m.delivered.Inc()
	q.counters().out(len(d.Body))
	ch.c.w.send(outFrame{channel: ch.id, m: &wire.BasicGetOk{DeliveryTag: tag, Redelivered: d.Redelivered, Exchange: ex,
		RoutingKey: rk, MessageCount: left}, props: &props, body: d.Body})
	ch.dmu.Unlock()
	if m.NoAck {
		h.Ack(d.LeaseID)
	}
	return nil
}

// take removes and returns the deliveries an ack, nack or reject names,
// in delivery order, as RabbitMQ's collect_acks does: with multiple, every
// outstanding tag up to and including tag (which must be outstanding,
// unless it is 0: everything).
func (ch *channel) take(tag uint64, multiple bool) ([]*unacked, error) {
	ch.dmu.Lock()
	defer ch.dmu.Unlock()
	var out []*unacked
	switch {
	case multiple && tag == 0:
		for _, t := range ch.order {
			if u := ch.unacked[t]; u != nil {
				out = append(out, u)
			}
		}
	case multiple:
		if ch.unacked[tag] == nil {
			return nil, wire.PreconditionFailed("unknown delivery tag %d", tag)
		}
		for _, t := range ch.order {
			if t > tag {
				break
			}
			if u := ch.unacked[t]; u != nil {
				out = append(out, u)
			}
		}
	default:
		u := ch.unacked[tag]
		if u == nil {
			return nil, wire.PreconditionFailed("unknown delivery tag %d", tag)
		}
		out = []*unacked{u}
	}
	for _, u := range out {
		delete(ch.unacked, u.tag)
		if u.cons != nil {
			u.cons.outstanding--
		}
	}
	ch.compactOrderLocked()
	return out, nil
}

// compactOrderLocked drops settled tags from the front of order, and
// rebuilds it when most of it is settled.
func (ch *channel) compactOrderLocked() {
	i := 0
	for i < len(ch.order) && ch.unacked[ch.order[i]] == nil {
		i++
	}
	ch.order = ch.order[i:]
	if len(ch.order) > 64 && len(ch.unacked) < len(ch.order)/2 {
		live := make([]uint64, 0, len(ch.unacked))
		for _, t := range ch.order {
			if ch.unacked[t] != nil {
				live = append(live, t)
			}
		}
		ch.order = live
	}
}

// restore makes settled deliveries unacknowledged again (tx.rollback).
func (ch *channel) restore(us []*unacked) {
	ch.dmu.Lock()
	for _, u := range us {
		ch.unacked[u.tag] = u
		ch.order = append(ch.order, u.tag)
		if u.cons != nil {
			u.cons.outstanding++
		}
	}
	slices.Sort(ch.order)
	ch.order = slices.Compact(ch.order)
	ch.dmu.Unlock()
}

func (ch *channel) ack(tag uint64, multiple bool) error {
	us, err := ch.take(tag, multiple)
	if err != nil {
		return err
	}
	if ch.tx != nil {
		for _, u := range us {
			ch.tx.settles = append(ch.tx.settles, u)
			ch.tx.requeue = append(ch.tx.requeue, false)
		}
	} else {
		ch.settle(us, nil)
	}
	ch.kickConsumers()
	return nil
}

func (ch *channel) nack(tag uint64, multiple, requeue bool) error {
	us, err := ch.take(tag, multiple)
	if err != nil {
		return err
	}
	rq := make([]bool, len(us))
	for i := range rq {
		rq[i] = requeue
	}
	if ch.tx != nil {
		ch.tx.settles = append(ch.tx.settles, us...)
		ch.tx.requeue = append(ch.tx.requeue, rq...)
	} else {
		ch.settle(us, rq)
	}
	ch.kickConsumers()
	return nil
}

func (ch *channel) recover(requeue bool) error {
	if !requeue {
		return wire.NotImplemented("requeue=false")
	}
	us, _ := ch.take(0, true)
	rq := make([]bool, len(us))
	for i := range rq {
		rq[i] = true
	}
	ch.settle(us, rq)
	ch.kickConsumers()
	return nil
}

// settle applies settlements to the lease engine: an ack (or a reject
// without requeue: there is no dead-lettering) ends the lease, a requeue
// gives the message back for redelivery.
func (ch *channel) settle(us []*unacked, requeue []bool) {
	if len(us) == 1 {
		// The common case (one basic.ack per delivery) without the grouping.
		u := us[0]
		if requeue != nil && requeue[0] {
			u.h.Release(u.d.LeaseID)
			ch.c.srv.m.requeued.Inc()
		} else {
			u.h.Ack(u.d.LeaseID)
			ch.c.srv.m.acked.Inc()
		}
		return
	}
	type batch struct{ ack, release []string }
	by := map[*delivery.Handle]*batch{}
	for i, u := range us {
		b := by[u.h]
		if b == nil {
			b = &batch{}
			by[u.h] = b
		}
		if requeue != nil && requeue[i] {
			b.release = append(b.release, u.d.LeaseID)
		} else {
			b.ack = append(b.ack, u.d.LeaseID)
		}
	}
	for h, b := range by {
		if len(b.ack) > 0 {
			h.Ack(b.ack...)
			ch.c.srv.m.acked.Add(float64(len(b.ack)))
		}
		if len(b.release) > 0 {
			h.Release(b.release...)
			ch.c.srv.m.requeued.Add(float64(len(b.release)))
		}
	}
}

func (ch *channel) kickConsumers() {
	for _, cs := range ch.consumers {
		cs.wake()
	}
}

func (ch *channel) qos(m *wire.BasicQos) error {
	if m.PrefetchSize != 0 {
		return wire.NotImplemented("prefetch_size!=0 (%d)", m.PrefetchSize)
	}
	ch.dmu.Lock()
	if m.Global {
		ch.globalPrefetch = m.PrefetchCount
	} else {
		// RabbitMQ: the per-consumer limit for later consumers, and no
		// channel-wide limit any more.
		ch.consumerPrefetch = m.PrefetchCount
		ch.globalPrefetch = 0
	}
	ch.dmu.Unlock()
	ch.send(&wire.BasicQosOk{})
	ch.kickConsumers()
	return nil
}
