package delivery

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// closeTimeout bounds how long a Manager waits for a Consumer's redelivery copies when it
// closes an unused Consumer.
const closeTimeout = 30 * time.Second

// maxRetired bounds the identities a Manager keeps for queues without a Consumer. Losing one
// costs only duplicates (the next Consumer treats the old records as foreign).
const maxRetired = 4096

// Manager hands out one Consumer per queue, shared through Handles and reference counted: two
// Consumers of one queue in one process would open two transactions on it (docs/kubemq.md 8.8).
// A Consumer whose last Handle is closed stays open while it still has live leases (acks may
// still come, e.g. Pub/Sub's unary Acknowledge) for at most Options.Linger, then closes.
type Manager struct {
	b    Backend
	opts Options
	log  *zap.Logger

	// mu guards queues, retired, closedTotals and closed.
	mu           sync.Mutex
	queues       map[string]*managed
	retired      map[string]*identity
	closedTotals Stats           // counters of Consumers already closed
	labelled     map[string]bool // queues with a label of their own in the per-queue series
	closed       bool
	wg           sync.WaitGroup // linger goroutines and the outage watcher
	ctx          context.Context
	cancel       context.CancelFunc
	down         chan struct{} // cap 1: the backend reported KubeMQ unreachable
	unwatch      func()        // removes the readiness hook; nil without one
}

// managed is one queue's Consumer and its users. Guarded by Manager.mu.
type managed struct {
	queue    string
	c        *Consumer     // nil while the queue is being claimed
	own      Owned         // the holding of the queue (Options.Owners); nil without Owners
	claimed  chan struct{} // closed once the claim is decided (Options.Owners)
	refs     int
	closing  bool
	done     chan struct{} // closed once c is closed and forgotten
	lingerCh chan struct{} // closed when a user comes back during linger
}

// NewManager creates a Manager whose Consumers all use opts. With metrics non-nil it registers
// a collector of the Manager's totals (kubemq_proxy_delivery_*).
func NewManager(b Backend, opts Options, metrics prometheus.Registerer) (*Manager, error) {
	if b == nil {
		return nil, errors.New("delivery: nil backend")
	}
	check := opts
	if err := check.setDefaults(); err != nil {
		return nil, err
	}
	m := &Manager{b: b, opts: opts, log: check.Logger.Named("delivery"),
		queues: map[string]*managed{}, retired: map[string]*identity{}}
	m.ctx, m.cancel = context.WithCancel(context.Background())
	if metrics != nil {
		if err := metrics.Register(collector{m}); err != nil {
			return nil, fmt.Errorf("delivery: register metrics: %w", err)
		}
	}
	if sn, ok := b.(StateNotifier); ok {
		m.down = make(chan struct{}, 1)
		m.unwatch = sn.OnStateChange(func(up bool) {
			if !up {
				wake(m.down)
			}
		})
		m.wg.Add(1)
		go m.watchOutages()
	}
	return m, nil
}

// watchOutages drops the leases of every open Consumer each time the backend reports KubeMQ
// unreachable (the hook itself must not block, so the work happens here).
func (m *Manager) watchOutages() {
	defer m.wg.Done()
	for {
		select {
		case <-m.down:
		case <-m.ctx.Done():
			return
		}
		for _, c := range m.consumers() {
			c.backendLost()
		}
	}
}

// consumers returns the open Consumers.
func (m *Manager) consumers() []*Consumer {
	m.mu.Lock()
	defer m.mu.Unlock()
	cs := make([]*Consumer, 0, len(m.queues))
	for _, e := range m.queues {
		if e.c != nil {
			cs = append(cs, e.c)
		}
	}
	return cs
}

// Acquire returns a Handle on queue's Consumer, starting it if needed. If the queue's previous
// Consumer is still closing, Acquire waits for it (ctx bounds the wait). With Options.Owners it
// claims the queue first: when another process consumes it, the error wraps ErrNotOwner.
func (m *Manager) Acquire(ctx context.Context, queue string) (*Handle, error) {
	for {
		m.mu.Lock()
		if m.closed {
			m.mu.Unlock()
			return nil, ErrClosed
		}
		e := m.queues[queue]
		var wait chan struct{}
		switch {
		case e != nil && e.closing:
			wait = e.done
		case e != nil && e.c == nil:
			wait = e.claimed
		}
		if wait != nil {
			m.mu.Unlock()
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		if e == nil {
			var err error
			if e, err = m.startLocked(ctx, queue); err != nil {
				m.mu.Unlock()
				return nil, err
			}
		}
		e.refs++
		if e.lingerCh != nil {
			close(e.lingerCh)
			e.lingerCh = nil
		}
		m.mu.Unlock()
		h := &Handle{m: m, e: e, c: e.c, leases: map[leaseKey]*lease{}}
		e.c.mu.Lock()
		h.deadline = e.c.opts.Deadline
		e.c.handles[h] = struct{}{}
		e.c.mu.Unlock()
		return h, nil
	}
}

// startLocked starts queue's Consumer (claiming the queue first with Options.Owners, with mu
// released meanwhile). Called and returns with mu held.
func (m *Manager) startLocked(ctx context.Context, queue string) (*managed, error) {
	e := &managed{queue: queue, done: make(chan struct{})}
	if m.opts.Owners != nil {
		e.claimed = make(chan struct{})
		m.queues[queue] = e
		m.mu.Unlock()
		own, err := m.opts.Owners.Claim(ctx, queue)
		m.mu.Lock()
		close(e.claimed)
		if err == nil && m.closed {
			err = ErrClosed
			m.mu.Unlock()
			_ = own.Release(ctx)
			m.mu.Lock()
		}
		if err != nil {
			delete(m.queues, queue)
			close(e.done)
			if errors.Is(err, ErrClosed) || errors.Is(err, ErrNotOwner) {
				return nil, err
			}
			return nil, fmt.Errorf("delivery: claim %s: %w", queue, err)
		}
		e.own = own
	}
	prev := m.retired[queue]
	delete(m.retired, queue)
	c, err := newConsumer(m.b, queue, m.opts, prev)
	if err != nil {
		delete(m.queues, queue)
		close(e.done)
		if e.own != nil {
			m.mu.Unlock()
			_ = e.own.Release(ctx)
			m.mu.Lock()
		}
		return nil, err
	}
	e.c = c
	m.queues[queue] = e
	m.queueLabelLocked(queue) // labels go to queues in the order their Consumers start
	if e.own != nil {
		m.bg(func() { m.watchOwnership(e) })
	}
	return e, nil
}

// bg runs f on a goroutine the Manager's Close waits for.
func (m *Manager) bg(f func()) {
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		f()
	}()
}

// watchOwnership gives e's Consumer up when its holding is lost: its users' waiting and later
// Fetch calls fail with ErrHandedOver, its leases go back to the queue.
func (m *Manager) watchOwnership(e *managed) {
	select {
	case <-e.own.Lost():
	case <-e.done:
		return
	case <-m.ctx.Done():
		return // Close gives it up
	}
	m.mu.Lock()
	if e.closing {
		m.mu.Unlock()
		return
	}
	e.closing = true
	if e.lingerCh != nil {
		close(e.lingerCh)
		e.lingerCh = nil
	}
	m.mu.Unlock()
	m.log.Warn("queue handed over: this process's holding was lost", zap.String("queue", e.queue))
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	if err := e.c.closeWith(ctx, ErrHandedOver); err != nil {
		m.log.Warn("close consumer", zap.String("queue", e.queue), zap.Error(err))
	}
	m.forget(e)
}

// forget removes e, whose Consumer is closed, and keeps its identity and counters.
func (m *Manager) forget(e *managed) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.queues[e.queue] == e {
		delete(m.queues, e.queue)
	}
	if len(m.retired) >= maxRetired {
		for k := range m.retired {
			delete(m.retired, k)
			break
		}
	}
	m.retired[e.queue] = e.c.identity()
	m.addClosedLocked(e.c)
	close(e.done)
}

// Lookup returns queue's Consumer if one is open (to route an ack that arrives outside any
// Handle), or nil.
func (m *Manager) Lookup(queue string) *Consumer {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e := m.queues[queue]; e != nil && !e.closing {
		return e.c
	}
	return nil
}

// Ready is Consumer.Ready for queue whether or not it has a Consumer here: without one, it is
// KubeMQ's count less the lease records the queue's last Consumer left due back. -1 when
// KubeMQ cannot count the queue.
func (m *Manager) Ready(ctx context.Context, queue string) (int64, error) {
	if c := m.Lookup(queue); c != nil {
		return c.Ready(ctx)
	}
	n, err := m.b.Waiting(ctx, queue)
	if err != nil || n < 0 {
		return n, err
	}
	m.mu.Lock()
	if id := m.retired[queue]; id != nil {
		n -= int64(dueRecords(id.records, time.Now()))
	}
	m.mu.Unlock()
	return max(n, 0), nil
}

// Stats returns the stats of every open Consumer.
func (m *Manager) Stats() []Stats {
	cs := m.consumers()
	out := make([]Stats, len(cs))
	for i, c := range cs {
		out[i] = c.Stats()
	}
	return out
}

// release drops one user of e; the last one starts the linger.
func (m *Manager) release(e *managed) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e.refs--
	if e.refs > 0 || e.closing || m.closed {
		return
	}
	back := make(chan struct{})
	e.lingerCh = back
	empty := e.c.emptyChan()
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		t := time.NewTimer(m.opts.Linger)
		if m.opts.Linger <= 0 {
			t.Reset(10 * time.Minute)
		}
		defer t.Stop()
		select {
		case <-empty:
		case <-t.C:
		case <-back:
			return
		case <-m.ctx.Done():
			return
		}
		m.retire(e)
	}()
}

// Retire closes queue's Consumer now rather than after the linger, once its last Handle is
// closed: what it fetched but never handed out goes back to the queue (Close), and the next
// Acquire starts a fresh Consumer with its identity. It returns when that Consumer is closed,
// false if it still has users (or got one meanwhile). A queue with no Consumer reports true.
func (m *Manager) Retire(queue string) bool {
	m.mu.Lock()
	e := m.queues[queue]
	switch {
	case e == nil:
		m.mu.Unlock()
		return true
	case e.closing:
		done := e.done
		m.mu.Unlock()
		<-done
		return true
	case e.refs > 0 || e.c == nil: // in use, or being claimed by an Acquire
		m.mu.Unlock()
		return false
	}
	if e.lingerCh != nil {
		close(e.lingerCh) // the linger goroutine leaves it to us
		e.lingerCh = nil
	}
	m.mu.Unlock()
	m.retire(e)
	select {
	case <-e.done:
		return true
	default:
		return false
	}
}

// retire closes e's Consumer unless it has users again, and keeps its identity for the next one.
func (m *Manager) retire(e *managed) {
	m.mu.Lock()
	if e.refs > 0 || e.closing {
		m.mu.Unlock()
		return
	}
	e.closing = true
	m.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	if err := e.c.Close(ctx); err != nil {
		m.log.Warn("close consumer", zap.String("queue", e.queue), zap.Error(err))
	}
	m.releaseHolding(ctx, e)
	m.forget(e)
}

// releaseHolding gives e's holding up (Options.Owners) once its Consumer is closed.
func (m *Manager) releaseHolding(ctx context.Context, e *managed) {
	if e.own == nil {
		return
	}
	if err := e.own.Release(ctx); err != nil {
		m.log.Warn("release queue", zap.String("queue", e.queue), zap.Error(err))
	}
}

// addClosedLocked keeps a closed Consumer's counters in the totals.
func (m *Manager) addClosedLocked(c *Consumer) {
	st := c.Stats()
	st.Leases, st.Out, st.Buffered, st.Waiters = 0, 0, 0, 0
	m.closedTotals.add(st)
}

// Close closes every Consumer (giving their leases back, bounded by ctx) and refuses further
// Acquire calls. Idempotent.
func (m *Manager) Close(ctx context.Context) error {
	m.mu.Lock()
	m.closed = true
	var es []*managed
	for _, e := range m.queues {
		// A queue still being claimed gives itself up when the claim returns.
		if !e.closing && e.c != nil {
			e.closing = true
			es = append(es, e)
		}
	}
	m.mu.Unlock()
	if m.unwatch != nil {
		m.unwatch()
	}
	m.cancel()
	m.wg.Wait()
	var wg sync.WaitGroup
	errs := make([]error, len(es))
	for i, e := range es {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = e.c.Close(ctx)
			m.releaseHolding(ctx, e)
			m.mu.Lock()
			if m.queues[e.queue] == e {
				delete(m.queues, e.queue)
			}
			m.addClosedLocked(e.c)
			close(e.done)
			m.mu.Unlock()
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Handle is one user's share of a queue's Consumer: Fetch through it records which deliveries
// the user holds, so ReleaseAll gives back only those (an AMQP channel closing). Ack, Nack,
// Extend and Release work by lease id on the whole Consumer. Safe for concurrent use.
type Handle struct {
	m *Manager
	e *managed
	c *Consumer

	// Guarded by c.mu.
	leases    map[leaseKey]*lease
	deadline  time.Duration
	hold      time.Duration
	readAhead int
	closed    bool
}

// Consumer returns the shared Consumer.
func (h *Handle) Consumer() *Consumer { return h.c }

// HeldElsewhereSince reports whether another process consumed the queue after t (a local time
// since this process started), as the Manager's Owners can tell (HeldElsewhere); false without
// Owners, or with Owners that cannot tell. It may say so needlessly, never miss one.
func (h *Handle) HeldElsewhereSince(t time.Time) bool {
	x, ok := h.e.own.(HeldElsewhere)
	return ok && x.HeldElsewhereSince(t)
}

// Gone returns a channel closed once the Consumer h shares is closed and forgotten: the queue
// is no longer consumed here through it (its last Handle closed and its leases settled, or its
// holding lost). A later Acquire starts another Consumer, with another Gone.
func (h *Handle) Gone() <-chan struct{} { return h.e.done }

// Usable reports whether h may still fetch and settle: false once h is closed or the Consumer it
// shares is closing (its holding lost, the backend lost for good, the Manager closing). A
// front-end that keeps a Handle across requests acquires another when this turns false; a
// settlement through an unusable Handle changes nothing (what it names comes again).
func (h *Handle) Usable() bool {
	h.c.mu.Lock()
	defer h.c.mu.Unlock()
	return !h.closed && !h.c.closing
}

// SetDeadline sets the lease deadline of later Fetch calls through h (0 = none).
func (h *Handle) SetDeadline(d time.Duration) {
	h.c.mu.Lock()
	defer h.c.mu.Unlock()
	h.deadline = max(d, 0)
}

// SetHold makes later Fetch calls through h promise their deliveries for d without an engine
// deadline (see Consumer.Hold): the front-end runs the deadlines, the lease records carry them.
// It applies only while h's deadline is 0; 0 = no promise (records then say HoldExpiry).
func (h *Handle) SetHold(d time.Duration) {
	h.c.mu.Lock()
	defer h.c.mu.Unlock()
	h.hold = max(d, 0)
}

// SetReadAhead lets later Fetch calls through h make the poll loop take up to n messages from
// KubeMQ at once even when fewer are wanted (0 = only what is wanted). The extra ones wait in
// the ready buffer, shared by every Fetch of the queue and counted by Ready, so reading ahead
// changes neither what a client observes nor who gets which message; it saves a lease-engine
// round trip per message for a consumer that takes one at a time.
func (h *Handle) SetReadAhead(n int) {
	h.c.mu.Lock()
	defer h.c.mu.Unlock()
	h.readAhead = min(max(n, 0), h.c.opts.MaxBatch)
}

// Fetch is Consumer.Fetch with h's deadline, recording the deliveries as h's.
func (h *Handle) Fetch(ctx context.Context, max int) ([]*Delivery, error) {
	return h.fetch(ctx, max, false)
}

// TryFetch is Fetch that does not wait for messages to arrive: it returns 1..max deliveries
// when the queue has messages, and none (with a nil error) when it has none: at once when
// nothing is buffered and KubeMQ counts no message (asked with ctx), else once the poll loop
// has found the queue empty (KubeMQ's count; where KubeMQ cannot count the queue, a Get short
// of its size) at a look that began after the call (AMQP's basic.get). Waiting Fetch calls registered before it are served
// first. ctx bounds the call as for Fetch.
func (h *Handle) TryFetch(ctx context.Context, max int) ([]*Delivery, error) {
	if empty, err := h.c.emptyNow(ctx); err != nil || empty {
		return nil, err
	}
	return h.fetch(ctx, max, true)
}

func (h *Handle) fetch(ctx context.Context, max int, try bool) ([]*Delivery, error) {
	h.c.mu.Lock()
	closed, dl, hold, ahead := h.closed, h.deadline, h.hold, h.readAhead
	h.c.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	return h.c.fetch(ctx, max, h, dl, hold, ahead, try)
}

// UnsettledFunc is told of a message found in a lease record that this Consumer's live lease
// table does not hold: an entry of another owner (a replica, or this process before a crash),
// bounced until redeliverAt, or of an earlier incarnation (before an outage), redelivered at
// once (redeliverAt is then the time it was found). Either way the message will come back
// through Fetch as a fresh delivery, unless a BeforeRedeliver hook drops it. It runs on the
// poll loop outside every lock, before the deliveries of the same Get are handed out, and must
// not block or modify m.
type UnsettledFunc func(m *Message, redeliverAt time.Time)

// OnUnsettled installs f on the queue's Consumer (nil removes it; the last call wins). A
// front-end that keeps an order among deliveries (Pub/Sub ordering keys) uses it to hold back
// later messages until the returning ones arrive.
func (h *Handle) OnUnsettled(f UnsettledFunc) {
	if f == nil {
		h.c.unsettled.Store(nil)
		return
	}
	h.c.unsettled.Store(&f)
}

// RecordDelay is the delay of the Consumer's lease records: every record written before now
// has come back within about this long (plus the backend's lateness).
func (h *Handle) RecordDelay() time.Duration { return h.c.opts.RecordDelay }

// Hold is Consumer.Hold.
func (h *Handle) Hold(until time.Time, ids ...string) int { return h.c.Hold(until, ids...) }

// Holds reports whether id is a lease of h's queue that is live here (delivered and not
// settled): a front-end that serves one queue from several KubeMQ queues finds a delivery's
// Handle with it.
func (h *Handle) Holds(id string) bool {
	c := h.c
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lookupLocked(id) != nil
}

// Ack is Consumer.Ack.
func (h *Handle) Ack(ids ...string) []bool { return h.c.Ack(ids...) }

// Nack is Consumer.Nack.
func (h *Handle) Nack(id string, delay time.Duration) bool { return h.c.Nack(id, delay) }

// Extend is Consumer.Extend.
func (h *Handle) Extend(id string, deadline time.Time) bool { return h.c.Extend(id, deadline) }

// Release is Consumer.Release.
func (h *Handle) Release(ids ...string) []bool { return h.c.Release(ids...) }

// Requeue is Consumer.Requeue.
func (h *Handle) Requeue(ids ...string) []bool { return h.c.Requeue(ids...) }

// Purge is Consumer.Purge.
func (h *Handle) Purge() int { return h.c.Purge() }

// Ready is Consumer.Ready.
func (h *Handle) Ready(ctx context.Context) (int64, error) { return h.c.Ready(ctx) }

// Unfetch is Consumer.Unfetch.
func (h *Handle) Unfetch(ds ...*Delivery) int { return h.c.Unfetch(ds...) }

// ReleaseAll gives back every delivery fetched through h and not yet settled. It returns how
// many it released.
func (h *Handle) ReleaseAll() int {
	h.c.mu.Lock()
	defer h.c.mu.Unlock()
	n := 0
	for _, l := range h.leases {
		if l.state == stateOut {
			h.c.requeueLocked(l)
			n++
		}
	}
	return n
}

// Close ends h: its waiting Fetch calls fail with ErrClosed; its deliveries stay leased (ack
// them, or call ReleaseAll first). The last Handle's Close lets the Consumer close once its
// leases are settled. Idempotent.
func (h *Handle) Close() {
	c := h.c
	c.mu.Lock()
	if h.closed {
		c.mu.Unlock()
		return
	}
	h.closed = true
	delete(c.handles, h)
	for i := 0; i < len(c.waiters); {
		w := c.waiters[i]
		if w.holder != h {
			i++
			continue
		}
		c.waiters = append(c.waiters[:i], c.waiters[i+1:]...)
		c.want -= w.max
		w.err, w.finished = ErrClosed, true
		close(w.done)
	}
	c.mu.Unlock()
	h.m.release(h.e)
}
