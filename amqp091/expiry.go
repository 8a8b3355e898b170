package amqp091

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/kubemq-io/kubemq-proxy/amqp091/peerpb"
	"github.com/kubemq-io/kubemq-proxy/delivery"
)

// Message expiry at millisecond precision and x-expires.
//
// A stored copy carries its expiry (tagExpiresAt). Every hand-out (a
// consumer's delivery, basic.get, a forwarded get) drops or dead-letters
// the expired messages it meets instead of delivering them. A queue with a
// TTL, or one that was sent a message with an expiration, also has a
// reaper: while no consumer of the queue could take its head, the reaper
// looks at the head and expires it when its time comes, as RabbitMQ's
// queue process does (messages expire at the head; with a queue TTL the
// head is always the first to expire). The reaper also deletes a queue
// with x-expires that went unused for that long.
//
// With replicas, the queue's holder alone judges x-expires (judges): every
// consumer of the fleet is one of its consumers, forwarded basic.get calls
// reach it, and a queue.declare through another replica tells it with the
// count it asks for (QueueRequest.use). So that somebody judges a queue
// nobody consumes, every replica's reaper of a queue with x-expires holds
// it when nobody does (expiryHold); a replica that becomes the holder
// starts the timer afresh, as a new RabbitMQ queue leader does.

// reaper is a queue's expiry goroutine state.
type reaper struct {
	mu      sync.Mutex // guards running, trims
	running bool
	trims   []func()      // drop-head trims requested: called when done (limits.go)
	msgTTL  atomic.Bool   // a message with an expiration was sent to the queue
	kick    chan struct{} // cap 1: look again now (set on first start)
	lastUse atomic.Int64  // Unix ns of the last use (x-expires): declare, consume, get, consumer gone
	// peeks counts the reaper's looks at the head, peeking is set during
	// one: the head is out of the queue then, so a hand-out that fetched
	// meanwhile may hold later messages and gives them back (inOrder).
	peeks   atomic.Uint64
	peeking atomic.Bool
	// heldBy is the lease engine consumer of q that the reaper's last
	// expiryHold found (reaper goroutine only): a different one means this
	// replica took q (over) since, and the x-expires timer starts afresh.
	heldBy *delivery.Consumer
}

// inOrder reports whether messages fetched from q since peeks read gen
// are in queue order: no reaper look at the head overlapped the fetch.
// Otherwise the caller gives them back and fetches again, after waitPeek.
func (q *queue) inOrder(gen uint64) bool {
	return !q.reap.peeking.Load() && q.reap.peeks.Load() == gen
}

// waitPeek waits until the reaper's look at q's head is over.
func (q *queue) waitPeek(ctx context.Context) {
	for q.reap.peeking.Load() && ctx.Err() == nil {
		time.Sleep(time.Millisecond)
	}
}

// reapIdle is how often a reaper looks at a queue whose head does not
// expire (or that is empty): messages sent through other replicas, or
// taken by a consumer, change the head without telling it.
const reapIdle = time.Second

// used records a use of q for x-expires.
func (q *queue) touch() { q.reap.lastUse.Store(time.Now().UnixNano()) }

// needsReaper reports whether q has anything for a reaper to do.
func (q *queue) needsReaper() bool {
	return q.hasTTL || q.expires > 0 || q.reap.msgTTL.Load() || q.dropsHead() || q.limitsBytes()
}

// dropsHead reports whether q trims its head to its length limit.
func (q *queue) dropsHead() bool { return q.limitsLength() && q.overflow == "drop-head" }

// takeTrims returns the trims requested so far.
func (r *reaper) takeTrims() []func() {
	r.mu.Lock()
	defer r.mu.Unlock()
	t := r.trims
	r.trims = nil
	return t
}

// startReaper runs q's reaper if q needs one and it is not running.
func (s *Server) startReaper(q *queue) {
	if !q.needsReaper() {
		return
	}
	q.reap.mu.Lock()
	if q.reap.running {
		q.reap.mu.Unlock()
		select {
		case q.reap.kick <- struct{}{}:
		default:
		}
		return
	}
	if q.reap.kick == nil {
		q.reap.kick = make(chan struct{}, 1)
	}
	// Not once Shutdown began: a store completing after it (a dead-lettered
	// copy the publisher flushes at the end) must not start a goroutine
	// Shutdown no longer waits for.
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		q.reap.mu.Unlock()
		return
	}
	s.wg.Add(1)
	s.mu.Unlock()
	q.reap.running = true
	q.reap.mu.Unlock()
	go func() {
		defer s.wg.Done()
		s.reap(q)
	}()
}

func (s *Server) reap(q *queue) {
	var h *delivery.Handle
	var hold *delivery.Handle // with replicas and x-expires: this replica's hold on q (expiryHold)
	defer func() {
		if h != nil {
			h.Close()
		}
		if hold != nil {
			hold.Close()
		}
		q.reap.mu.Lock()
		trims := q.reap.trims
		q.reap.trims = nil
		q.reap.running = false
		q.reap.mu.Unlock()
		for _, f := range trims {
			f() // nobody trims any more: the channels need not wait
		}
	}()
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-q.reap.kick:
		case <-s.ctx.Done():
			return
		}
		if q.isDeleted() {
			return
		}
		wait := reapIdle
		judge := q.expires > 0
		if judge && s.peers != nil {
			hold = s.expiryHold(q, hold)
		}
		if judge && s.judges(q) && (s.peers == nil || hold != nil) {
			if idle := time.Since(time.Unix(0, q.reap.lastUse.Load())); q.unused() && idle >= q.expires {
				s.dropQueue(q, "queue expired (x-expires)", s.log)
				return
			} else if left := q.expires - idle; left > 0 && left < wait {
				wait = left
			}
		}
		trims := q.reap.takeTrims()
		head := (q.hasTTL || q.reap.msgTTL.Load()) && !q.consumersCanTake()
		if head || len(trims) > 0 {
			if h == nil {
				var err error
				h, err = s.deliveries.Acquire(s.ctx, q.channel)
				if err == nil {
					h.SetReadAhead(readAhead) // the head one by one, from the engine's buffer
				} else {
					// Another replica holds the queue: its hand-outs and
					// its reaper expire the messages.
					h = nil
					if !errors.Is(err, delivery.ErrNotOwner) && s.ctx.Err() == nil {
						s.log.Debug("reaper: cannot consume queue", zap.String("queue", q.name), zap.Error(err))
					}
				}
			}
			if h != nil && len(trims) > 0 {
				s.trim(q, h)
			} else if len(trims) > 0 && q.dropsHead() {
				// The holder trims: only its reaper can take the head.
				s.queueRemote(s.ctx, q, peerpb.QueueRequest_TRIM, false)
			}
			for _, f := range trims {
				f()
			}
			if h != nil && head {
				if next, ok := s.expireHeads(q, h); ok {
					wait = min(wait, max(time.Until(next), time.Millisecond))
				}
			}
		} else if h != nil && !q.dropsHead() {
			h.Close() // consumers take the messages now; they expire them
			h = nil
		}
		t.Reset(wait)
	}
}

// expiryHold returns this replica's hold on q (h while it lasts, else a
// new one, claiming q when nobody holds it), or nil while another replica
// holds q. A replica that did not hold q before starts q's x-expires timer
// afresh: the uses it saw are not all of them.
func (s *Server) expiryHold(q *queue, h *delivery.Handle) *delivery.Handle {
	cur := s.deliveries.Lookup(q.channel)
	if h != nil {
		if cur != nil && cur == h.Consumer() {
			return h
		}
		h.Close() // the holding was lost (handed over, KubeMQ lost)
	}
	if cur == nil {
		if _, other := s.peers.Owner(q.channel); other {
			return nil
		}
	}
	ctx, cancel := context.WithTimeout(s.ctx, 10*time.Second)
	h, err := s.deliveries.Acquire(ctx, q.channel)
	cancel()
	if err != nil {
		if !errors.Is(err, delivery.ErrNotOwner) && s.ctx.Err() == nil {
			s.log.Debug("x-expires: cannot hold queue", zap.String("queue", q.name), zap.Error(err))
		}
		return nil
	}
	// Compared with what the reaper saw last, not with cur: the queue may
	// have come to this replica through another path (a handover from a
	// stopping holder, a consumer or a get here) since the reaper's last
	// look, and the uses before that were seen elsewhere.
	if c := h.Consumer(); c != q.reap.heldBy {
		q.reap.heldBy = c
		q.touch()
	}
	return h
}

// useRemote tells the replica that holds q, when another one does, of a
// use of q here that asks it nothing (a queue.declare with no-wait), on a
// tracked goroutine.
func (s *Server) useRemote(q *queue) {
	if s.peers == nil {
		return
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.queueRemote(s.ctx, q, peerpb.QueueRequest_COUNT, true)
	}()
}

// unused reports whether q has no consumers (x-expires).
func (q *queue) unused() bool {
	q.vh.mu.Lock()
	defer q.vh.mu.Unlock()
	return len(q.consumers) == 0
}

// consumersCanTake reports whether a consumer of q in this process could
// take a message now: its dispatcher expires the head then.
func (q *queue) consumersCanTake() bool {
	q.vh.mu.Lock()
	d := q.disp
	q.vh.mu.Unlock()
	return d != nil && d.credit() > 0
}

// expireHead expires q's head messages whose time has passed; it returns
// when the new head expires (ok false: it does not, or q is empty).
func (s *Server) expireHead(q *queue, h *delivery.Handle) (time.Time, bool) {
	q.reap.peeks.Add(1)
	q.reap.peeking.Store(true)
	defer q.reap.peeking.Store(false)
	for range 64 {
		ctx, cancel := context.WithTimeout(s.ctx, getWait)
		ds, err := h.TryFetch(ctx, readAhead)
		cancel()
		if err != nil || len(ds) == 0 {
			return time.Time{}, false
		}
		// In queue order: expired ones go until the first that is not,
		// which is the head again (later ones wait for it, as in RabbitMQ).
		now := time.Now()
		for i, d := range ds {
			if q.expired(d, now) {
				s.expire(q, h, d)
				continue
			}
			h.Unfetch(ds[i:]...)
			return q.expiresAt(d)
		}
	}
	return time.Now(), true
}

// expire drops d, which expired in q, or dead-letters it (reason expired).
func (s *Server) expire(q *queue, h *delivery.Handle, d *delivery.Delivery) {
	s.remove(q, h, d, reasonExpired)
}

// remove takes d out of q for reason (expired, maxlen): acked at once
// without a dead-letter exchange, otherwise once dead-lettered.
func (s *Server) remove(q *queue, h *delivery.Handle, d *delivery.Delivery, reason string) {
	h = q.via(h, d)
	if !q.hasDLX || q.isDeleted() {
		s.m.dropped.WithLabelValues(reason).Inc()
		h.Ack(d.LeaseID)
		return
	}
	s.deadLetter(q, d, reason, func(ok bool) { s.settleDeath(q, h, d, ok) })
}

// rejectToDLX dead-letters a rejected delivery; its lease is acked once
// the dead-lettered copies are stored.
func (s *Server) rejectToDLX(q *queue, h *delivery.Handle, d *delivery.Delivery) {
	h = q.via(h, d)
	s.deadLetter(q, d, reasonRejected, func(ok bool) { s.settleDeath(q, h, d, ok) })
}

// settleDeath ends a dead-lettered lease: acked when its copies are
// stored, otherwise given back to its place in q (never lost).
func (s *Server) settleDeath(q *queue, h *delivery.Handle, d *delivery.Delivery, ok bool) {
	if ok {
		h.Ack(d.LeaseID)
		return
	}
	s.log.Warn("dead-lettering failed: message kept in its queue", zap.String("queue", q.name))
	h.Requeue(d.LeaseID)
}

// liveOnly expires the expired deliveries of ds (fetched from q through h)
// and returns the others, in order.
func (s *Server) liveOnly(q *queue, h *delivery.Handle, ds []*delivery.Delivery) []*delivery.Delivery {
	now := time.Now()
	out := ds[:0]
	for _, d := range ds {
		if q.expired(d, now) {
			s.expire(q, h, d)
			continue
		}
		out = append(out, d)
	}
	return out
}

// tryFetchLive is h.TryFetch(ctx, 1) that expires what it meets first.
func (s *Server) tryFetchLive(ctx context.Context, q *queue, h *delivery.Handle) ([]*delivery.Delivery, error) {
	for {
		q.waitPeek(ctx)
		gen := q.reap.peeks.Load()
		ds, err := h.TryFetch(ctx, 1)
		if err != nil || len(ds) == 0 {
			return ds, err
		}
		if !q.inOrder(gen) {
			h.Unfetch(ds...)
			continue
		}
		if live := s.liveOnly(q, h, ds); len(live) > 0 {
			return live, nil
		}
	}
}

// overDeliveryLimit reports whether returning d to q would exceed q's
// x-delivery-limit (a quorum queue's delivery count: the returns so far,
// this one included, rabbit_fifo's delivery_count > delivery_limit).
func (q *queue) overDeliveryLimit(d *delivery.Delivery) bool {
	return q.deliveryLimit >= 0 && int64(d.Attempt) > q.deliveryLimit
}
