package amqp091

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/kubemq-io/kubemq-proxy/delivery"
	"github.com/kubemq-io/kubemq-proxy/kubemqclient"
)

// Priority queues (x-max-priority), as RabbitMQ 3.10's classic queues:
// a message's level is its priority property, 0 without one, capped at
// the queue's maximum. Each level is a KubeMQ queue of its own: level 0 is
// the queue's channel (q.channel), level p > 0 is the channel with one more
// token "p<p>" (levelChannel). The queue's dispatcher hands out from the
// highest level that holds a message, FIFO within a level (runLevels);
// basic.get takes the head of the highest such level; counts, purge and
// delete cover every level. A level is used once a copy was stored in it:
// this process notes the levels it stores in, and KubeMQ lists the levels
// stored in by others (another replica, an earlier process), which the
// dispatcher looks up while it waits (levelScan).
//
// Channel names: a queue's channel is amqp.{vhost}.{name} or, for a later
// incarnation, amqp.{vhost}.{name}.{n} with n all digits
// (queueChannel); kubemqclient.Channel encodes a name as exactly one token.
// A level channel adds a token "p" + digits, which no incarnation token
// (digits only) and no further token of a queue channel (there is none) can
// be, so no two queues, levels or incarnations share a channel. The token
// ends in a digit, so KubeMQ lists the channel under its own name
// (docs/kubemq.md 10.1).

// levelScan is how often a waiting dispatcher of a priority queue asks
// KubeMQ which levels hold messages stored elsewhere.
const levelScan = time.Second

// prioLevels is a priority queue's per-process level state.
type prioLevels struct {
	seen [4]atomic.Uint64 // levels this process stored copies in (a bit per level)
	note chan struct{}    // cap 1: a level was seen for the first time

	mu      sync.Mutex
	handles map[int]*delivery.Handle // levels above 0 this process acquired
	base    <-chan struct{}          // Gone of the level-0 Consumer the handles go with
	closed  bool                     // the queue is gone: no more handles
}

func newPrioLevels() *prioLevels {
	return &prioLevels{note: make(chan struct{}, 1), handles: map[int]*delivery.Handle{}}
}

// isPriority reports whether q keeps its messages in priority levels.
func (q *queue) isPriority() bool { return q.maxPriority > 0 }

// levelOf is the level of a message with tags in q: its priority, 0
// without one (or when it cannot be read), at most q's maximum.
func (q *queue) levelOf(tags map[string]string) int {
	v, ok := tags[tagPriority]
	if !ok {
		return 0
	}
	p, err := strconv.Atoi(v)
	if err != nil || p <= 0 {
		return 0
	}
	return min(p, q.maxPriority)
}

// levelChannel is the KubeMQ channel of q's level p.
func (q *queue) levelChannel(p int) string {
	if p == 0 {
		return q.channel
	}
	lv := "p" + strconv.Itoa(p)
	if q.incarnation == 0 {
		return kubemqclient.Channel("amqp", q.vh.key, q.name, lv)
	}
	return kubemqclient.Channel("amqp", q.vh.key, q.name, strconv.FormatUint(q.incarnation, 10), lv)
}

// storeChannel is the channel a copy with tags is stored in, noting its
// level as used.
func (q *queue) storeChannel(tags map[string]string) string {
	if !q.isPriority() {
		return q.channel
	}
	p := q.levelOf(tags)
	if p > 0 {
		w, bit := &q.prio.seen[p/64], uint64(1)<<(p%64)
		if w.Load()&bit == 0 {
			w.Or(bit)
			select {
			case q.prio.note <- struct{}{}:
			default:
			}
		}
	}
	return q.levelChannel(p)
}

// levelHandle returns this process's lease handle on q's level p > 0,
// acquiring it on first use; h0 is the caller's handle on level 0. The
// level handles go with level 0's engine Consumer here: they are closed
// when it is (watchLevels), so that the replica that takes level 0 over
// also gets the other levels, and when level 0 is consumed through
// another Consumer meanwhile. Deleting the queue closes them too.
func (s *Server) levelHandle(ctx context.Context, q *queue, p int, h0 *delivery.Handle) (*delivery.Handle, error) {
	lv := q.prio
	lv.mu.Lock()
	defer lv.mu.Unlock()
	if lv.closed {
		return nil, errNoQueue(q.name, q.vh.displayName())
	}
	if base := h0.Gone(); base != lv.base {
		select {
		case <-base:
			return nil, delivery.ErrClosed // h0's Consumer is gone (handed over): so is the caller
		default:
		}
		for _, h := range lv.handles {
			h.Close() // they went with an earlier level-0 Consumer
		}
		lv.handles, lv.base = map[int]*delivery.Handle{}, base
		s.wg.Add(1)
		go s.watchLevels(q, base)
	}
	if h := lv.handles[p]; h != nil {
		return h, nil
	}
	h, err := s.deliveries.Acquire(ctx, q.levelChannel(p))
	if err != nil {
		return nil, err
	}
	h.SetReadAhead(readAhead)
	lv.handles[p] = h
	return h, nil
}

// watchLevels closes q's level handles once the level-0 Consumer they go
// with (base) is gone, unless they went with another one meanwhile. Their
// engine Consumers then close once their leases are settled (acks reach
// them through the handles the deliveries came with) and give their
// holding up.
func (s *Server) watchLevels(q *queue, base <-chan struct{}) {
	defer s.wg.Done()
	select {
	case <-base:
	case <-s.ctx.Done():
		return // shutdown closes every engine Consumer
	}
	lv := q.prio
	lv.mu.Lock()
	if lv.base != base {
		lv.mu.Unlock()
		return
	}
	hs := lv.handles
	lv.handles, lv.base = map[int]*delivery.Handle{}, nil
	lv.mu.Unlock()
	for _, h := range hs {
		h.Close()
	}
}

// closeLevels releases q's level handles (q was deleted).
func (q *queue) closeLevels() {
	if !q.isPriority() {
		return
	}
	lv := q.prio
	lv.mu.Lock()
	hs := lv.handles
	lv.handles, lv.closed = map[int]*delivery.Handle{}, true
	lv.mu.Unlock()
	for _, h := range hs {
		h.Close()
	}
}

// dropLevel forgets h, q's handle on level p, which can no longer fetch.
func (q *queue) dropLevel(p int, h *delivery.Handle) {
	lv := q.prio
	lv.mu.Lock()
	if lv.handles[p] == h {
		delete(lv.handles, p)
	}
	lv.mu.Unlock()
	h.Close()
}

// via returns the handle that holds d's lease: h (q's level-0 handle the
// caller has), or the handle of the level d came from.
func (q *queue) via(h *delivery.Handle, d *delivery.Delivery) *delivery.Handle {
	if !q.isPriority() || h.Holds(d.LeaseID) {
		return h
	}
	lv := q.prio
	lv.mu.Lock()
	defer lv.mu.Unlock()
	if x := lv.handles[q.levelOf(d.Tags)]; x != nil && x.Holds(d.LeaseID) {
		return x
	}
	for _, x := range lv.handles {
		if x.Holds(d.LeaseID) {
			return x
		}
	}
	return h
}

// usedLevels returns q's levels that may hold messages, highest first:
// level 0, the levels this process stored in or holds a handle on, and
// those KubeMQ lists (stored in by anyone).
func (s *Server) usedLevels(ctx context.Context, q *queue) ([]int, error) {
	used := map[int]bool{0: true}
	for p := 1; p <= q.maxPriority; p++ {
		if q.prio.seen[p/64].Load()&(uint64(1)<<(p%64)) != 0 {
			used[p] = true
		}
	}
	q.prio.mu.Lock()
	for p := range q.prio.handles {
		used[p] = true
	}
	q.prio.mu.Unlock()
	names := make([]string, 0, q.maxPriority)
	for p := 1; p <= q.maxPriority; p++ {
		if !used[p] {
			names = append(names, q.levelChannel(p))
		}
	}
	if len(names) > 0 {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		info, err := s.b.QueuesInfo(ctx, names...)
		cancel()
		if err != nil {
			return nil, err
		}
		for p := 1; p <= q.maxPriority; p++ {
			if used[p] {
				continue
			}
			if _, l := info.Lookup(q.levelChannel(p)); l != kubemqclient.NotListed {
				used[p] = true
			}
		}
	}
	out := make([]int, 0, len(used))
	for p := range used {
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b int) int { return b - a })
	return out, nil
}

// levelsReady is localReadyCount over every used level of priority queue q.
func (s *Server) levelsReady(ctx context.Context, q *queue) (n uint32, known bool, err error) {
	ps, err := s.usedLevels(ctx, q)
	if err != nil {
		return 0, false, err
	}
	var total uint64
	known = true
	for _, p := range ps {
		c, k, err := s.localReadyCount(ctx, q.levelChannel(p))
		if err != nil {
			return 0, false, err
		}
		known = known && k
		total += uint64(c)
	}
	return uint32(min(total, 1<<32-1)), known, nil
}

// levelsPurge is localPurge over every used level of priority queue q.
func (s *Server) levelsPurge(ctx context.Context, q *queue) (uint32, error) {
	ps, err := s.usedLevels(ctx, q)
	if err != nil {
		return 0, err
	}
	var total uint64
	for _, p := range ps {
		n, err := s.localPurge(ctx, q.levelChannel(p))
		if err != nil {
			return 0, err
		}
		total += uint64(n)
	}
	return uint32(min(total, 1<<32-1)), nil
}

// queueReady is localReadyCount of q, every level of a priority queue.
func (s *Server) queueReady(ctx context.Context, q *queue) (uint32, bool, error) {
	if q.isPriority() {
		return s.levelsReady(ctx, q)
	}
	return s.localReadyCount(ctx, q.channel)
}

// queuePurge is localPurge of q, every level of a priority queue; a
// deleted queue's level handles are released afterwards.
func (s *Server) queuePurge(ctx context.Context, q *queue) (uint32, error) {
	if !q.isPriority() {
		return s.localPurge(ctx, q.channel)
	}
	n, err := s.levelsPurge(ctx, q)
	if q.isDeleted() {
		q.closeLevels()
	}
	return n, err
}

// tryFetchTop is tryFetchLive over priority queue q's levels: the head of
// the highest level that holds a live message, with the handle it came
// through (h0 for level 0).
func (s *Server) tryFetchTop(ctx context.Context, q *queue, h0 *delivery.Handle) ([]*delivery.Delivery, *delivery.Handle, error) {
	if !q.isPriority() {
		ds, err := s.tryFetchLive(ctx, q, h0)
		return ds, h0, err
	}
	ps, err := s.usedLevels(ctx, q)
	if err != nil {
		return nil, nil, err
	}
	for _, p := range ps {
		h := h0
		if p > 0 {
			if h, err = s.levelHandle(ctx, q, p, h0); err != nil {
				return nil, nil, err
			}
		}
		ds, err := s.tryFetchLive(ctx, q, h)
		if err != nil || len(ds) > 0 {
			return ds, h, err
		}
	}
	return nil, h0, nil
}

// level is one priority level as the dispatcher serves it.
type level struct {
	p     int
	h     *delivery.Handle
	empty bool // found empty: a watcher waits for its next message
}

// runLevels is run for a priority queue: every round takes from the
// highest level that holds a message, up to the consumers' credit. A
// level found empty is not asked again until its watcher (a Fetch that
// waits) sees a message arrive, which it gives back in place.
func (d *dispatcher) runLevels(h0 *delivery.Handle) {
	q := d.q
	lv := map[int]*level{0: {p: 0, h: h0}}
	order := []*level{lv[0]}
	woke := make(chan int, q.maxPriority+1)
	var watchers sync.WaitGroup
	defer watchers.Wait()
	wctx, wcancel := context.WithCancel(d.ctx)
	defer wcancel() // before the Wait: the watchers end with it
	watch := func(l *level) {
		l.empty = true
		watchers.Add(1)
		go func() {
			defer watchers.Done()
			ds, err := l.h.Fetch(wctx, 1)
			if err == nil {
				l.h.Unfetch(ds...)
			}
			if wctx.Err() == nil {
				woke <- l.p
			}
		}()
	}
	var scanned time.Time
	missing := false // a used level could not be acquired (another replica still has it)
	scan := func() {
		scanned = time.Now()
		missing = false
		ps, err := d.srv.usedLevels(d.ctx, q)
		if err != nil {
			if d.ctx.Err() == nil {
				d.srv.log.Warn("listing priority levels failed", zap.String("queue", q.name), zap.Error(err))
			}
			return
		}
		for _, p := range ps {
			if lv[p] != nil {
				continue
			}
			h, err := d.srv.levelHandle(d.ctx, q, p, h0)
			if err != nil {
				if d.ctx.Err() == nil {
					d.srv.log.Warn("acquiring a priority level failed", zap.String("queue", q.name), zap.Int("level", p), zap.Error(err))
				}
				missing = true
				continue
			}
			lv[p] = &level{p: p, h: h}
			order = append(order, lv[p])
		}
		slices.SortFunc(order, func(a, b *level) int { return b.p - a.p })
	}
	wake := func(p int) {
		if l := lv[p]; l != nil {
			l.empty = false
		}
	}
	scan()
	for {
		// Levels whose watcher saw a message are asked again.
		for drained := false; !drained; {
			select {
			case p := <-woke:
				wake(p)
			default:
				drained = true
			}
		}
		select {
		case <-q.prio.note:
			scan()
		default:
			if missing && time.Since(scanned) >= levelScan {
				scan() // also while lower levels keep it busy
			}
		}
		credit := d.credit()
		if credit == 0 {
			select {
			case <-d.kick:
			case p := <-woke:
				wake(p)
			case <-d.ctx.Done():
				return
			}
			continue
		}
		served := false
		for _, l := range order {
			if l.empty {
				continue
			}
			q.waitPeek(d.ctx)
			gen := q.reap.peeks.Load()
			ds, err := l.h.TryFetch(d.ctx, credit)
			if err != nil && l.p > 0 && d.ctx.Err() == nil && errors.Is(err, delivery.ErrClosed) {
				// The level's engine consumer closed (its hold lapsed): taken
				// again by the next scan.
				q.dropLevel(l.p, l.h)
				delete(lv, l.p)
				order = slices.DeleteFunc(order, func(x *level) bool { return x == l })
				served = true
				break
			}
			if err != nil {
				if d.fetchFailed(err) {
					return
				}
				served = true
				break
			}
			if len(ds) == 0 {
				watch(l)
				continue
			}
			served = true
			if l.p == 0 && !q.inOrder(gen) {
				l.h.Unfetch(ds...) // the reaper had the head: fetch again, in order
				break
			}
			if ds = d.srv.liveOnly(q, l.h, ds); len(ds) == 0 {
				break
			}
			if rest := d.distribute(ds, l.h); len(rest) > 0 {
				l.h.Unfetch(rest...)
			}
			break
		}
		if served {
			continue
		}
		wait := time.NewTimer(max(levelScan-time.Since(scanned), time.Millisecond))
		select {
		case <-d.kick:
		case p := <-woke:
			wake(p)
		case <-q.prio.note:
			scan()
		case <-wait.C:
			scan()
		case <-d.ctx.Done():
			wait.Stop()
			return
		}
		wait.Stop()
	}
}

// handleReady is h.Ready, over every level of a priority queue q.
func (s *Server) handleReady(ctx context.Context, q *queue, h *delivery.Handle) (int64, error) {
	if !q.isPriority() {
		return h.Ready(ctx)
	}
	n, known, err := s.levelsReady(ctx, q)
	if err != nil || !known {
		return -1, err
	}
	return int64(n), nil
}

// leaseIDs groups the lease ids of ds by the handle that holds each (h,
// or a level's of a priority queue).
func (q *queue) leaseIDs(h *delivery.Handle, ds []*delivery.Delivery) map[*delivery.Handle][]string {
	out := map[*delivery.Handle][]string{}
	for _, d := range ds {
		x := q.via(h, d)
		out[x] = append(out[x], d.LeaseID)
	}
	return out
}

// viaHandles groups ds by the lease handle each came through (see via).
func (q *queue) viaHandles(h *delivery.Handle, ds []*delivery.Delivery) map[*delivery.Handle][]*delivery.Delivery {
	out := map[*delivery.Handle][]*delivery.Delivery{}
	for _, d := range ds {
		x := q.via(h, d)
		out[x] = append(out[x], d)
	}
	return out
}

// trimLevels is trim of priority queue q, which counts n ready messages:
// its messages are taken in delivery order (highest level first, FIFO
// within one) and all but the longest tail of that order within the
// limits (x-max-length, x-max-length-bytes) are dropped, or
// dead-lettered: drop-head removes what would be delivered next, as
// RabbitMQ's priority queue does. A reject-publish queue's pass only
// counts the bytes (q's byte ledger).
func (s *Server) trimLevels(q *queue, h0 *delivery.Handle, n int64) {
	ps, err := s.usedLevels(s.ctx, q)
	if err != nil {
		return
	}
	type held struct {
		d *delivery.Delivery
		h *delivery.Handle
	}
	mark := q.bytes.mark()
	q.reap.peeks.Add(1)
	q.reap.peeking.Store(true)
	defer q.reap.peeking.Store(false)
	var got []held
	for _, p := range ps {
		h := h0
		if p > 0 {
			if h, err = s.levelHandle(s.ctx, q, p, h0); err != nil {
				break
			}
		}
		for int64(len(got)) < n {
			ctx, cancel := context.WithTimeout(s.ctx, getWait)
			ds, err := h.TryFetch(ctx, int(min(n-int64(len(got)), maxFetch)))
			cancel()
			if err != nil || len(ds) == 0 {
				break
			}
			for _, d := range ds {
				got = append(got, held{d, h})
			}
		}
	}
	sizes := make([]int, len(got))
	for i, x := range got {
		sizes[i] = len(x.d.Body)
	}
	keep := len(got) // a reject-publish queue's scan of its bytes
	if q.overflow == "drop-head" {
		keep = q.keepOf(sizes)
	}
	if q.limitsBytes() {
		q.bytes.rebuild(sizes[len(sizes)-keep:], mark)
	}
	back := map[*delivery.Handle][]*delivery.Delivery{}
	for _, x := range got[len(got)-keep:] {
		back[x.h] = append(back[x.h], x.d)
	}
	for h, ds := range back {
		h.Unfetch(ds...)
	}
	for _, x := range got[:len(got)-keep] {
		s.remove(q, x.h, x.d, reasonMaxLen)
	}
}

// expireHeads is expireHead of every level of q (h is level 0's handle):
// each level expires at its head, as RabbitMQ's priority queue does; it
// returns the earliest next expiry.
func (s *Server) expireHeads(q *queue, h0 *delivery.Handle) (time.Time, bool) {
	if !q.isPriority() {
		return s.expireHead(q, h0)
	}
	ps, err := s.usedLevels(s.ctx, q)
	if err != nil {
		return time.Now().Add(reapIdle), true
	}
	var next time.Time
	found := false
	for _, p := range ps {
		h := h0
		if p > 0 {
			if h, err = s.levelHandle(s.ctx, q, p, h0); err != nil {
				continue
			}
		}
		if t, ok := s.expireHead(q, h); ok && (!found || t.Before(next)) {
			next, found = t, true
		}
	}
	return next, found
}
