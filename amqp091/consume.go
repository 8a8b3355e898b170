package amqp091

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/kubemq-io/kubemq-proxy/amqp091/peerpb"
	"github.com/kubemq-io/kubemq-proxy/amqp091/wire"
	"github.com/kubemq-io/kubemq-proxy/delivery"
)

const (
	// fetchBatch caps the credit of a consumer without a prefetch limit
	// (or in no-ack mode), and so one lease fetch for it.
	fetchBatch = 256
	// maxFetch caps one fetch of a queue's dispatcher for all its consumers.
	maxFetch = 1024
	// getWait bounds basic.get's wait for the lease engine to find a
	// message or the queue empty; after it the answer is get-empty.
	getWait = 5 * time.Second
	// replyToQueue is RabbitMQ's direct reply-to pseudo queue.
	replyToQueue = "amq.rabbitmq.reply-to"
	// readAhead is how many messages the lease engine may take from KubeMQ
	// at once for a queue's consumers when they want fewer (a prefetch-1
	// consumer would otherwise pay a KubeMQ round trip per message). The
	// extra ones wait in the engine's ready buffer, which every consumer and
	// basic.get of the queue shares and message counts include, so reading
	// ahead changes nothing a client can observe.
	readAhead = 64
)

// consumer is one basic.consume. Its queue's dispatcher delivers to it
// within its credit. Three kinds: a client's consumer served here (ch set,
// fwd nil), a client's consumer forwarded to the replica that holds the
// queue (ch and fwd set: deliveries come over fwd, see forward.go), and on
// that replica, another replica's forwarded consumer (peer set, ch nil: see
// peer.go), which the dispatcher serves like a local one within the credit
// the other replica grants.
type consumer struct {
	ch        *channel  // nil for another replica's consumer
	peer      *peerLink // another replica's consumer: its link; nil otherwise
	tag       string
	q         *queue
	d         *dispatcher      // the queue's dispatcher it is registered with; nil while forwarded (guarded by q.vh.mu)
	h         *delivery.Handle // the handle on q for settlements (guarded by ch.dmu once forwarding began)
	noAck     bool
	exclusive bool
	priority  int64  // x-priority: higher first; RabbitMQ's default is 0
	prefetch  uint16 // per-consumer limit; 0 = none

	// Guarded by ch.dmu (peer.mu for another replica's consumer).
	outstanding int
	stopped     bool
	fwd         *fwdLink      // the link it is forwarded over now; nil when served here
	done        chan struct{} // closed when stopped (forwarded consumers)
	moved       chan struct{} // a forwarded consumer served here: closed when this replica lost the queue (relocate)

	forwarded bool // began as a forwarded consumer (then d is guarded by q.vh.mu); set before it is shared

	// Owned by the dispatcher's goroutine.
	served uint64 // the dispatcher's count when it last delivered to it
}

func (ch *channel) consume(m *wire.BasicConsume) error {
	c := ch.c
	if m.ConsumerTag != "" {
		if _, dup := ch.consumers[m.ConsumerTag]; dup {
			return wire.NotAllowed("attempt to reuse consumer tag '%s'", m.ConsumerTag)
		}
	}
	if m.Queue == replyToQueue {
		// RabbitMQ keeps the reply consumer apart from the channel's
		// consumers: its tag does not count as in use by them.
		return ch.consumeReplyTo(m)
	}
	q, err := ch.queueFor(m.Queue)
	if err != nil {
		return err
	}
	prio, err := consumerPriority(m.Arguments, q.name, c.vhostName)
	if err != nil {
		return err
	}
	h, pc, err := ch.resolve(q)
	if err != nil {
		return err
	}
	tag := m.ConsumerTag
	if tag == "" {
		tag = genName("amq.ctag")
	}
	cs := &consumer{ch: ch, tag: tag, q: q, h: h, noAck: m.NoAck, exclusive: m.Exclusive, priority: prio,
		prefetch: ch.consumerPrefetch}
	vh := q.vh
	vh.mu.Lock()
	if q.deleted {
		vh.mu.Unlock()
		return errNoQueue(q.name, c.vhostName)
	}
	if m.Exclusive && q.singleActive {
		vh.mu.Unlock()
		return errSingleActiveExclusive(q.name, c.vhostName)
	}
	if q.exclusiveConsumer || (m.Exclusive && len(q.consumers) > 0) {
		vh.mu.Unlock()
		return wire.AccessRefused("%s in exclusive use", rsQueue(q.name, c.vhostName))
	}
	q.consumers[cs] = struct{}{}
	q.hadConsumer = true
	q.touch()
	if m.Exclusive {
		q.exclusiveConsumer = true
	}
	if h != nil {
		if q.disp == nil {
			q.disp = newDispatcher(c.srv, q)
		}
		cs.d = q.disp
	}
	vh.mu.Unlock()
	if q.autoDelete {
		c.srv.usesChanged()
	}
	var l *fwdLink
	if h == nil {
		// Another replica holds the queue: the consumer is forwarded to it.
		// Its refusals (exclusive use, no queue) answer the consume; a
		// holder that cannot be reached now is resolved again by the
		// consumer's goroutine.
		cs.done, cs.forwarded = make(chan struct{}), true
		l, err = ch.openLink(pc, q, cs)
		var ae *wire.Error
		if errors.As(err, &ae) {
			vh.mu.Lock()
			delete(q.consumers, cs)
			if m.Exclusive {
				q.exclusiveConsumer = false
			}
			vh.mu.Unlock()
			return ae
		}
		cs.fwd = l // nil when the link failed: the goroutine resolves the holder anew
	}
	ch.consumers[tag] = cs
	if !m.NoWait {
		ch.send(&wire.BasicConsumeOk{ConsumerTag: tag})
	}
	c.srv.m.consumers.Inc()
	c.nConsumers.Add(1)
	ch.viewConsumers.Add(1)
	// Registered after consume-ok is queued: its first delivery follows it.
	if cs.forwarded {
		c.srv.goForward(cs, l, cs.done)
		return nil
	}
	cs.d.add(cs)
	return nil
}

// consumerPriority reads basic.consume's x-priority as RabbitMQ 3.10 does:
// an integer of any width, anything else refused with 406.
func consumerPriority(args wire.Table, queue, vhost string) (int64, error) {
	v, ok := args["x-priority"]
	if !ok {
		return 0, nil
	}
	n, isInt := intArg(v)
	if !isInt {
		return 0, wire.PreconditionFailed("invalid arg 'x-priority' for %s: \"expected integer, got %s\"", rsQueue(queue, vhost), wire.ErlangType(v))
	}
	return n, nil
}

func (ch *channel) cancel(m *wire.BasicCancel) error {
	if ch.cancelReplyTo(m.ConsumerTag) {
		if !m.NoWait {
			ch.send(&wire.BasicCancelOk{ConsumerTag: m.ConsumerTag})
		}
		return nil
	}
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

// relocate goes on with cs, a consumer served here, after this replica lost its queue
// (failConsumers): what the channel has out through the lost holding is void (detach), and cs
// is served from then on as a forwarded consumer (forward.go), which finds the queue's new
// holder, or claims the queue here again. The client sees a pause, and what it held
// unacknowledged comes again, redelivered, as when a forwarded consumer's holder changes
// (channel's goroutine).
func (ch *channel) relocate(cs *consumer) {
	if ch.consumers[cs.tag] != cs {
		return // cancelled meanwhile
	}
	if cs.forwarded {
		// A forwarded consumer served here: its goroutine detaches it and resolves the holder
		// anew (serveHere).
		ch.dmu.Lock()
		if cs.moved != nil {
			close(cs.moved)
			cs.moved = nil
		}
		ch.dmu.Unlock()
		return
	}
	ch.dmu.Lock()
	if cs.stopped || ch.stopped {
		ch.dmu.Unlock()
		return
	}
	cs.done, cs.forwarded = make(chan struct{}), true
	done := cs.done
	ch.dmu.Unlock()
	ch.detach(cs)
	ch.heldHandle(cs.q) // drops the channel's handle on the lost holding
	ch.log.Info("consumer moves to the queue's new holder", zap.String("queue", cs.q.name), zap.String("tag", cs.tag))
	ch.c.srv.goForward(cs, nil, done)
}

// detach takes cs off the dispatcher that served it here, retired when its holding of the
// queue was lost (failConsumers), and voids the channel's deliveries made through a holding that
// was lost: a settlement of one changes nothing (settleRejects skips it), it comes again from the
// queue's next holder (its lease records), redelivered, and it no longer counts against a
// prefetch, as a forwarded delivery whose link ended (fwdLink.void). Any goroutine.
func (ch *channel) detach(cs *consumer) {
	q := cs.q
	q.vh.mu.Lock()
	if cs.d != nil {
		cs.d.remove(cs)
		cs.d = nil
	}
	q.vh.mu.Unlock()
	ch.dmu.Lock()
	hs := map[*delivery.Handle]struct{}{}
	for _, u := range ch.unacked {
		if u.fwd == nil && !u.void {
			hs[u.h] = struct{}{}
		}
	}
	ch.dmu.Unlock()
	dead := map[*delivery.Handle]bool{}
	for h := range hs {
		dead[h] = !h.Usable() // not under dmu: the lease engine's lock is not taken under it
	}
	ch.dmu.Lock()
	for _, u := range ch.unacked {
		if u.fwd == nil && !u.void && dead[u.h] {
			ch.voidLocked(u)
		}
	}
	ch.dmu.Unlock()
}

// voidLocked marks u void: its holding or link is gone, it comes again, and it no longer counts
// against a prefetch. The caller holds dmu.
func (ch *channel) voidLocked(u *unacked) {
	u.void = true
	ch.voided++
	if u.cons != nil {
		u.cons.outstanding--
	}
}

// stopConsumer ends cs: no delivery reaches it once this returns. Its
// unacknowledged deliveries stay with the channel, as in RabbitMQ. An
// auto-delete queue that lost its last consumer is deleted.
func (ch *channel) stopConsumer(cs *consumer) {
	ch.dmu.Lock()
	cs.stopped = true
	l := cs.fwd
	if cs.done != nil {
		close(cs.done)
		cs.done = nil
	}
	ch.dmu.Unlock()
	if l != nil {
		l.cancel() // its deliveries may still be settled over it
	}
	ch.c.srv.m.consumers.Dec()
	ch.c.nConsumers.Add(-1)
	ch.viewConsumers.Add(-1)
	q := cs.q
	judge := ch.c.srv.judges(q)
	q.vh.mu.Lock()
	delete(q.consumers, cs)
	if cs.exclusive {
		q.exclusiveConsumer = false
	}
	if cs.d != nil {
		cs.d.remove(cs)
		if q.disp == cs.d && cs.d.empty() {
			q.disp = nil
			cs.d.stop()
		}
	}
	// With replicas, the queue's holder judges: a forwarded consumer's end
	// reaches it over the consumer's link (peer.go).
	drop := q.autoDelete && q.hadConsumer && len(q.consumers) == 0 && !q.deleted && judge
	q.vh.mu.Unlock()
	q.touch() // x-expires counts from the last consumer's end
	if drop {
		ch.c.srv.dropQueueAsync(q, "auto-delete queue lost its last consumer", ch.log)
	}
}

// dispatcher delivers one queue's messages to its consumers in this
// process as RabbitMQ's queue process does: each message goes to a
// consumer with credit of the highest priority present, round-robin among
// consumers of that priority. It fetches for all of them at once through
// a lease handle of its own (reading ahead, see readAhead); what no
// consumer can take goes back to the head of the queue, uncounted.
type dispatcher struct {
	srv    *Server
	q      *queue
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
	kick   chan struct{} // cap 1: credit may have been freed

	mu        sync.Mutex
	consumers []*consumer // registered and not removed, in registration order; the goroutine reads a copy
	// lost: the dispatcher's holding of the queue was lost (another replica serves it now);
	// a consumer added later is moved on at once (evict).
	lost   error
	single bool      // x-single-active-consumer: only active receives (singleactive.go)
	active *consumer // the single active consumer; nil when none or not single

	list atomic.Pointer[[]*consumer]
	// localDepth is the largest per-consumer prefetch among the consumers
	// of list served on this replica that acknowledge; 0 when there is
	// none. Other replicas' consumers are kept to it (peerLink.roomLocked).
	localDepth atomic.Int64
	count      uint64 // deliveries made (the goroutine's)
}

// newDispatcher starts q's dispatcher; the caller holds q.vh.mu.
func newDispatcher(s *Server, q *queue) *dispatcher {
	d := &dispatcher{srv: s, q: q, done: make(chan struct{}), kick: make(chan struct{}, 1), single: q.singleActive}
	d.ctx, d.cancel = context.WithCancel(s.ctx)
	empty := []*consumer{}
	d.list.Store(&empty)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		d.run()
	}()
	return d
}

func (d *dispatcher) add(cs *consumer) {
	d.mu.Lock()
	if err := d.lost; err != nil {
		d.mu.Unlock()
		d.evict(cs, err, true)
		return
	}
	d.consumers = append(d.consumers, cs)
	d.publishLocked()
	d.mu.Unlock()
	d.wake()
}

func (d *dispatcher) remove(cs *consumer) {
	d.mu.Lock()
	d.consumers = slices.DeleteFunc(d.consumers, func(x *consumer) bool { return x == cs })
	if d.active == cs {
		d.active = nil
	}
	d.publishLocked()
	d.mu.Unlock()
	d.wake()
}

// publishLocked stores the list the goroutine delivers to: every consumer,
// or with a single active consumer that one alone.
func (d *dispatcher) publishLocked() {
	l := []*consumer{}
	if !d.single {
		l = slices.Clone(d.consumers)
	} else {
		if d.active == nil {
			d.active = nextActive(d.consumers)
		}
		if d.active != nil {
			l = append(l, d.active)
		}
	}
	depth := 0
	for _, cs := range l {
		if cs.peer == nil && !cs.noAck {
			depth = max(depth, int(cs.prefetch))
		}
	}
	d.localDepth.Store(int64(depth))
	d.list.Store(&l)
}

// empty reports whether no consumer is registered.
func (d *dispatcher) empty() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.consumers) == 0
}

// stop ends the dispatcher; what it fetched and did not deliver goes back.
func (d *dispatcher) stop() { d.cancel() }

func (d *dispatcher) wake() {
	select {
	case d.kick <- struct{}{}:
	default:
	}
}

func (d *dispatcher) run() {
	defer close(d.done)
	h, err := d.srv.deliveries.Acquire(d.ctx, d.q.channel)
	// Another replica holds the queue: wait for its hold to lapse (see handleFor).
	for wait := time.Now().Add(ownerWait); errors.Is(err, delivery.ErrNotOwner) && time.Now().Before(wait); {
		if _, ok := d.srv.remote(d.q.channel); ok {
			break // the consumers go on through the holder (failConsumers)
		}
		select {
		case <-time.After(250 * time.Millisecond):
		case <-d.ctx.Done():
			return
		}
		h, err = d.srv.deliveries.Acquire(d.ctx, d.q.channel)
	}
	if err != nil {
		if d.ctx.Err() == nil {
			d.failConsumers(err)
		}
		return
	}
	defer h.Close()
	h.SetReadAhead(readAhead)
	if d.q.isPriority() {
		d.runLevels(h)
		return
	}
	for {
		credit := d.credit()
		if credit == 0 {
			select {
			case <-d.kick:
				continue
			case <-d.ctx.Done():
				return
			}
		}
		d.q.waitPeek(d.ctx)
		gen := d.q.reap.peeks.Load()
		ds, err := h.Fetch(d.ctx, credit)
		if err == nil && !d.q.inOrder(gen) {
			h.Unfetch(ds...) // the reaper had the head: fetch again, in order
			continue
		}
		if err != nil {
			if d.fetchFailed(err) {
				return
			}
			continue
		}
		if ds = d.srv.liveOnly(d.q, h, ds); len(ds) == 0 {
			continue
		}
		if rest := d.distribute(ds, nil); len(rest) > 0 {
			h.Unfetch(rest...)
		}
	}
}

// fetchFailed handles a fetch that failed: the dispatcher stops (true) when it is closing or
// its handle is, or when this replica lost the queue (its consumers move on, see
// failConsumers); else its consumers are failed and it waits for a kick before going on.
func (d *dispatcher) fetchFailed(err error) (stop bool) {
	if d.ctx.Err() != nil || errors.Is(err, delivery.ErrClosed) {
		return true
	}
	if d.failConsumers(err) {
		return true
	}
	select { // the consumers' connections are closing
	case <-d.kick:
		return false
	case <-d.ctx.Done():
		return true
	}
}

// handedOver reports whether err says that this replica no longer holds the queue while
// another replica can serve it: its consumers then go on through that one.
func (d *dispatcher) handedOver(err error) bool {
	return d.srv.peers != nil && (errors.Is(err, delivery.ErrHandedOver) || errors.Is(err, delivery.ErrNotOwner))
}

// failConsumers ends what the consumers get from this dispatcher after its lease engine failed.
// When this replica lost the queue (handedOver: another replica claimed it, or this one's
// ownership lease lapsed) the dispatcher is retired and its consumers move on (evict): the
// client's consumers are served as forwarded ones, which find the queue's new holder; other
// replicas' links end, and those replicas resolve the holder anew. It returns true then. On any
// other failure (KubeMQ lost) the client's connections are closed with 320: their deliveries
// are void.
func (d *dispatcher) failConsumers(err error) (retired bool) {
	retired = d.handedOver(err)
	if retired {
		d.srv.log.Info("queue lost to another replica: its consumers here go on through the holder",
			zap.String("queue", d.q.name), zap.Error(err))
		d.q.vh.mu.Lock()
		if d.q.disp == d {
			d.q.disp = nil // a later consume starts another dispatcher
		}
		d.q.vh.mu.Unlock()
	} else {
		d.srv.log.Warn("consumer fetch failed", zap.String("queue", d.q.name), zap.Error(err))
	}
	d.mu.Lock()
	if retired {
		d.lost = err
	}
	all := slices.Clone(d.consumers)
	d.mu.Unlock()
	for _, cs := range all {
		d.evict(cs, err, retired)
	}
	return retired
}

// evict ends cs's service by d after d's lease engine failed with err; moved: the queue went to
// another replica (failConsumers).
func (d *dispatcher) evict(cs *consumer, err error, moved bool) {
	switch {
	case cs.peer != nil:
		cs.peer.fail(err)
	case moved:
		ch := cs.ch
		ch.post(func() { ch.relocate(cs) })
	default:
		cs.ch.c.fail(backendError(err))
	}
}

// credit is what the registered consumers may take now, together.
func (d *dispatcher) credit() int {
	n := 0
	for _, cs := range *d.list.Load() {
		mu := cs.mu()
		mu.Lock()
		if cs.activeLocked() {
			n += cs.creditLocked()
		}
		mu.Unlock()
	}
	return min(n, maxFetch)
}

// distribute delivers ds in order, each to the consumer RabbitMQ would
// pick; it returns what no consumer could take. h is the handle ds came
// through when it is not the consumers' own (a priority level); nil
// otherwise.
func (d *dispatcher) distribute(ds []*delivery.Delivery, h *delivery.Handle) []*delivery.Delivery {
	order := slices.Clone(*d.list.Load())
	// Highest priority first; within a priority, the one served longest ago.
	slices.SortStableFunc(order, func(a, b *consumer) int {
		if c := cmp.Compare(b.priority, a.priority); c != 0 {
			return c
		}
		return cmp.Compare(a.served, b.served)
	})
	for i, dl := range ds {
		dec := decodeDelivery(d.q.name, dl)
		dec.h = h
		taken := -1
		for j, cs := range order {
			if cs.deliver(dl, &dec) {
				taken = j
				break
			}
		}
		if taken < 0 {
			return ds[i:]
		}
		// Served: to the back of its priority.
		d.count++
		cs := order[taken]
		cs.served = d.count
		end := taken + 1
		for end < len(order) && order[end].priority == cs.priority {
			end++
		}
		copy(order[taken:end-1], order[taken+1:end])
		order[end-1] = cs
	}
	return nil
}

// mu is the mutex that guards cs's delivery state.
func (cs *consumer) mu() *sync.Mutex {
	if cs.peer != nil {
		return &cs.peer.mu
	}
	return &cs.ch.dmu
}

// activeLocked reports whether cs may still get deliveries.
func (cs *consumer) activeLocked() bool {
	if cs.peer != nil {
		return !cs.stopped
	}
	return !cs.stopped && !cs.ch.stopped
}

// creditLocked is how many more deliveries cs may have in flight.
func (cs *consumer) creditLocked() int {
	if cs.peer != nil {
		return max(min(cs.peer.credit, fetchBatch, cs.peer.roomLocked()), 0)
	}
	if cs.noAck {
		return fetchBatch
	}
	n := fetchBatch
	if cs.prefetch > 0 {
		n = min(n, int(cs.prefetch)-cs.outstanding)
	}
	if g := cs.ch.globalPrefetch; g > 0 {
		// Credit granted to the channel's forwarded consumers is taken.
		n = min(n, int(g)-(len(cs.ch.unacked)-cs.ch.voided)-cs.ch.fwdInflight)
	}
	return max(n, 0)
}

type decoded struct {
	exchange, key string
	props         wire.Properties
	h             *delivery.Handle // the handle it came through, when not the consumer's (a priority level)
}

func decodeDelivery(queue string, d *delivery.Delivery) decoded {
	var dec decoded
	dec.exchange, dec.key, dec.props = decodeMessage(queue, d.Metadata, d.Tags)
	return dec
}

// deliver sends d to the client if cs may take it now. The tag is minted
// and the frame queued under dmu, so delivery tags reach the wire in
// increasing order and never after the consumer stopped.
func (cs *consumer) deliver(d *delivery.Delivery, dec *decoded) bool {
	if cs.peer != nil {
		return cs.peer.deliver(cs, d)
	}
	ch := cs.ch
	h := cs.h
	if dec.h != nil {
		h = dec.h
	}
	ch.dmu.Lock()
	if cs.stopped || ch.stopped || cs.creditLocked() == 0 {
		ch.dmu.Unlock()
		return false
	}
	ch.nextTag++
	tag := ch.nextTag
	if !cs.noAck {
		ch.unacked[tag] = &unacked{d: d, h: h, cons: cs, queue: cs.q, tag: tag}
		ch.order = append(ch.order, tag)
		cs.outstanding++
	}
	// Counted first, so a client that has the message sees it counted.
	ch.c.srv.m.delivered.Inc()
	cs.q.delivered(len(d.Body))
	ch.c.srv.m.firstDelivery(d)
	ch.c.w.send(outFrame{channel: ch.id, m: &wire.BasicDeliver{ConsumerTag: cs.tag, DeliveryTag: tag,
		Redelivered: d.Redelivered, Exchange: dec.exchange, RoutingKey: dec.key}, props: &dec.props, body: d.Body})
	ch.dmu.Unlock()
	if cs.noAck {
		h.Ack(d.LeaseID)
	}
	return true
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
	q.touch()
	h, pc, err := ch.resolve(q)
	if err != nil {
		return err
	}
	if h == nil {
		return ch.getForwarded(q, pc, m)
	}
	return ch.getHere(q, h, m)
}

// getHere is basic.get of a queue this replica holds.
func (ch *channel) getHere(q *queue, h *delivery.Handle, m *wire.BasicGet) error {
	c := ch.c
	// RabbitMQ orders a channel's methods: what it published is in the
	// queue before the get looks.
	if err := ch.awaitPublishes(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(c.ctx, getWait)
	ds, h, err := c.srv.tryFetchTop(ctx, q, h)
	cancel()
	if err != nil {
		if c.ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
			ch.send(&wire.BasicGetEmpty{})
			return nil
		}
		return err
	}
	if len(ds) == 0 {
		ch.send(&wire.BasicGetEmpty{})
		return nil
	}
	d := ds[0]
	if len(ds) > 1 {
		h.Unfetch(ds[1:]...)
	}
	left, err := c.srv.handleReady(c.ctx, q, h)
	if err != nil {
		h.Unfetch(d)
		return err
	}
	dec := decodeDelivery(q.name, d)
	ch.dmu.Lock()
	ch.nextTag++
	tag := ch.nextTag
	if !m.NoAck {
		ch.unacked[tag] = &unacked{d: d, h: h, queue: q, tag: tag}
		ch.order = append(ch.order, tag)
	}
	c.srv.m.delivered.Inc()
	q.delivered(len(d.Body))
	c.srv.m.firstDelivery(d)
	ch.c.w.send(outFrame{channel: ch.id, m: &wire.BasicGetOk{DeliveryTag: tag, Redelivered: d.Redelivered, Exchange: dec.exchange,
		RoutingKey: dec.key, MessageCount: uint32(min(max(left, 0), 1<<32-1))}, props: &dec.props, body: d.Body})
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
		switch {
		case u.void:
			ch.voided--
		case u.cons != nil:
			u.cons.outstanding--
		}
		if u.fwd != nil {
			u.fwd.held--
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
		switch {
		case u.void:
			ch.voided++
		case u.cons != nil:
			u.cons.outstanding++
		}
		if u.fwd != nil {
			u.fwd.held++
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
	for _, u := range us {
		u.queue.nAcked.Add(1)
	}
	ch.c.srv.nAcked.Add(uint64(len(us)))
	if ch.tx != nil {
		for _, u := range us {
			ch.tx.settles = append(ch.tx.settles, u)
			ch.tx.requeue = append(ch.tx.requeue, false)
			ch.tx.reject = append(ch.tx.reject, false)
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
	rj := make([]bool, len(us))
	for i := range rq {
		rq[i], rj[i] = requeue, !requeue
	}
	if ch.tx != nil {
		ch.tx.settles = append(ch.tx.settles, us...)
		ch.tx.requeue = append(ch.tx.requeue, rq...)
		ch.tx.reject = append(ch.tx.reject, rj...)
	} else {
		ch.settleRejects(us, rq, rj)
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

// settle applies settlements to the lease engine: an ack ends the lease,
// a requeue puts the message back at its place in the queue (ahead of
// everything published after it), as RabbitMQ does. A requeued delivery
// of a queue deleted meanwhile is dropped, as in RabbitMQ.
func (ch *channel) settle(us []*unacked, requeue []bool) { ch.settleRejects(us, requeue, nil) }

// settleRejects is settle where reject[i] marks a reject or nack without
// requeue: dead-lettered when the queue has a dead-letter exchange (the
// lease is acked once the dead-lettered copies are stored), otherwise
// dropped like an ack.
func (ch *channel) settleRejects(us []*unacked, requeue, reject []bool) {
	type batch struct{ ack, back []string }
	var one [1]struct {
		h *delivery.Handle
		b batch
	}
	var by map[*delivery.Handle]*batch
	get := func(h *delivery.Handle) *batch {
		if one[0].h == nil || one[0].h == h {
			one[0].h = h
			return &one[0].b
		}
		if by == nil {
			by = map[*delivery.Handle]*batch{}
		}
		b := by[h]
		if b == nil {
			b = &batch{}
			by[h] = b
		}
		return b
	}
	type keys struct{ ack, back, reject []uint64 }
	var fwd map[*fwdLink]*keys
	for i, u := range us {
		if u.void && u.fwd == nil {
			continue // its holding was lost (detach): it comes again from the queue's next holder
		}
		rejected := reject != nil && reject[i]
		if u.fwd != nil {
			if fwd == nil {
				fwd = map[*fwdLink]*keys{}
			}
			k := fwd[u.fwd]
			if k == nil {
				k = &keys{}
				fwd[u.fwd] = k
			}
			switch {
			case requeue != nil && requeue[i] && !u.queue.isDeleted():
				k.back = append(k.back, u.key)
			case rejected && u.queue.hasDLX:
				// The holder dead-letters it (it has the message).
				k.reject = append(k.reject, u.key)
			default:
				k.ack = append(k.ack, u.key)
			}
			continue
		}
		switch {
		case requeue != nil && requeue[i] && u.queue.overDeliveryLimit(u.d) && !u.queue.isDeleted():
			ch.c.srv.remove(u.queue, u.h, u.d, reasonDeliveryLimit)
			ch.c.srv.m.acked.Inc()
		case requeue != nil && requeue[i] && !u.queue.isDeleted():
			b := get(u.h)
			b.back = append(b.back, u.d.LeaseID)
		case rejected && u.queue.hasDLX:
			ch.c.srv.rejectToDLX(u.queue, u.h, u.d)
			ch.c.srv.m.acked.Inc()
		default:
			b := get(u.h)
			b.ack = append(b.ack, u.d.LeaseID)
		}
	}
	apply := func(h *delivery.Handle, b *batch) {
		if len(b.ack) > 0 {
			h.Ack(b.ack...)
			ch.c.srv.m.acked.Add(float64(len(b.ack)))
		}
		if len(b.back) > 0 {
			h.Requeue(b.back...)
			ch.c.srv.m.requeued.Add(float64(len(b.back)))
		}
	}
	if one[0].h != nil {
		apply(one[0].h, &one[0].b)
	}
	for h, b := range by {
		apply(h, b)
	}
	for l, k := range fwd {
		l.settle(peerpb.Settle_ACK, k.ack...)
		l.settle(peerpb.Settle_REQUEUE, k.back...)
		l.settle(peerpb.Settle_REJECT, k.reject...)
		// Soon (ch.run: once no command is queued, or with the link's next
		// request): a holder that stops settles what it has heard of, and
		// requeues the rest.
		ch.flushSoon(l, false)
		ch.c.srv.m.acked.Add(float64(len(k.ack) + len(k.reject)))
		ch.c.srv.m.requeued.Add(float64(len(k.back)))
		ch.dmu.Lock()
		idle := l.cancelled && l.held == 0
		ch.dmu.Unlock()
		if idle {
			l.close()
		}
	}
}

// kickConsumers tells the dispatchers of the channel's consumers that
// credit may have been freed.
func (ch *channel) kickConsumers() {
	for _, cs := range ch.consumers {
		if !cs.forwarded {
			cs.d.wake()
			continue
		}
		ch.dmu.Lock()
		l := cs.fwd
		if l != nil {
			// The read-ahead fills the freed slots now; the holder hears of
			// them with the settlements, once no command is queued
			// (flushLinks): one credit per run of acks, not one per ack.
			l.handLocked()
		}
		ch.dmu.Unlock()
		if l != nil {
			ch.flushSoon(l, true)
			continue
		}
		cs.q.vh.mu.Lock()
		d := cs.d
		cs.q.vh.mu.Unlock()
		if d != nil {
			d.wake()
		}
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
		ch.viewPrefetch.Store(uint32(m.PrefetchCount))
		ch.globalPrefetch = 0
	}
	ch.dmu.Unlock()
	ch.send(&wire.BasicQosOk{})
	ch.kickConsumers()
	return nil
}
