package delivery

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"
)

// waiter is one Fetch call waiting for deliveries. Owned by Consumer.mu until done is closed.
type waiter struct {
	max       int
	holder    *Handle
	deadline  time.Duration
	hold      time.Duration // promise without an engine deadline (Handle.SetHold)
	readAhead int           // the poll loop may take this many messages for it (Handle.SetReadAhead)
	try       bool          // TryFetch: answered empty once the queue is found empty
	reg       uint64        // Consumer.checks when it was registered
	got       []*Delivery
	err       error
	finished  bool
	done      chan struct{}
}

// Fetch returns 1..max leased messages as soon as at least one is available, or ctx's error.
// Waiting Fetch calls are served in FIFO order. It fails with ErrClosed after Close, and with
// the backend's error (wrapped in ErrLeasesLost when leases were dropped) when KubeMQ fails.
func (c *Consumer) Fetch(ctx context.Context, max int) ([]*Delivery, error) {
	return c.fetch(ctx, max, nil, c.opts.Deadline, 0, 0, false)
}

func (c *Consumer) fetch(ctx context.Context, max int, h *Handle, deadline, hold time.Duration, readAhead int, try bool) ([]*Delivery, error) {
	if max <= 0 {
		return nil, fmt.Errorf("delivery: Fetch max %d must be positive", max)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.closing {
		cause := c.closeCause
		c.mu.Unlock()
		return nil, cause
	}
	if h != nil && h.closed {
		c.mu.Unlock()
		return nil, ErrClosed
	}
	w := &waiter{max: max, holder: h, deadline: deadline, hold: hold, readAhead: readAhead, try: try, reg: c.checks,
		done: make(chan struct{})}
	c.waiters = append(c.waiters, w)
	c.want += max
	c.serveLocked(time.Now())
	poll := !w.finished
	c.mu.Unlock()
	if poll {
		wake(c.pollWake)
	}
	select {
	case <-w.done:
		return w.got, w.err
	case <-ctx.Done():
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !w.finished {
		c.removeWaiterLocked(w)
		return nil, ctx.Err()
	}
	if w.err != nil {
		return nil, w.err
	}
	// Served while ctx ended: give the deliveries back so the next Fetch gets them.
	c.unhandLocked(w.got)
	c.serveLocked(time.Now())
	return nil, ctx.Err()
}

func (c *Consumer) removeWaiterLocked(w *waiter) {
	for i, x := range c.waiters {
		if x == w {
			c.waiters = append(c.waiters[:i], c.waiters[i+1:]...)
			c.want -= w.max
			return
		}
	}
}

// demandLocked is how many more messages the waiters want than the ready buffer holds.
func (c *Consumer) demandLocked() int { return c.want - len(c.ready) }

// serveLocked hands ready leases to waiters, first come first served. When several wait (the
// StreamingPull streams and Pulls of one subscription, forwarded from other replicas or not), a
// batch is shared out evenly among them rather than going whole to the first: otherwise each
// Get's batch (up to MaxBatch) goes to one stream, and the split between the consumers is
// decided a batch at a time.
func (c *Consumer) serveLocked(now time.Time) {
	for len(c.waiters) > 0 && len(c.ready) > 0 {
		w := c.waiters[0]
		n := len(c.waiters)
		k := min(w.max, (len(c.ready)+n-1)/n)
		ds := make([]*Delivery, k)
		for i := range k {
			ds[i] = c.handOutLocked(c.ready[i], w, now)
			c.ready[i] = nil
		}
		c.ready = c.ready[k:]
		if len(c.ready) == 0 {
			c.ready = nil
		}
		c.finishWaiterLocked(w, ds, nil)
	}
}

func (c *Consumer) finishWaiterLocked(w *waiter, ds []*Delivery, err error) {
	c.waiters[0] = nil
	c.waiters = c.waiters[1:]
	c.want -= w.max
	w.got, w.err, w.finished = ds, err, true
	close(w.done)
}

// foundEmptyLocked answers empty every TryFetch registered before look chk began: the poll
// loop found the queue empty (nothing buffered, nothing in KubeMQ) at a look that began after
// them.
func (c *Consumer) foundEmptyLocked(chk uint64) {
	keep := c.waiters[:0]
	for _, w := range c.waiters {
		if !w.try || w.reg >= chk {
			keep = append(keep, w)
			continue
		}
		c.want -= w.max
		w.got, w.err, w.finished = nil, nil, true
		close(w.done)
	}
	clear(c.waiters[len(keep):])
	c.waiters = keep
}

// failWaiters ends every waiting Fetch with err.
func (c *Consumer) failWaitersLocked(err error) {
	for len(c.waiters) > 0 {
		c.finishWaiterLocked(c.waiters[0], nil, err)
	}
	c.waiters = nil
}

func (c *Consumer) handOutLocked(l *lease, w *waiter, now time.Time) *Delivery {
	l.state = stateOut
	l.fresh = false
	l.holder = w.holder
	if w.holder != nil {
		w.holder.leases[l.key] = l
	}
	var dl time.Time
	if w.deadline > 0 {
		dl = now.Add(w.deadline)
		if c.heap.setDeadline(l, dl) {
			wake(c.settleWake)
		}
	} else if w.hold > 0 {
		l.promise = now.Add(w.hold)
	}
	l.d = &Delivery{
		LeaseID:     l.key.String(),
		Generation:  l.gen,
		Attempt:     int(l.attempt),
		Deadline:    dl,
		Redelivered: l.attempt > 1,
		MessageID:   l.msg.ID,
		Metadata:    l.msg.Metadata,
		Body:        l.msg.Body,
		Tags:        l.msg.Tags,
		Sequence:    l.seq,
		StoredAt:    storedAt(l.msg.Stored),
	}
	c.st.delivered.Add(1)
	return l.d
}

// Unfetch puts deliveries that never reached a client (fetched beyond a window, or the send to
// the client failed) back at the front of the ready buffer for the next Fetch: no copy is
// enqueued and the attempt does not count. Deliveries no longer out are skipped. It returns how
// many went back.
func (c *Consumer) Unfetch(ds ...*Delivery) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.unhandLocked(ds)
	c.serveLocked(time.Now())
	return n
}

// unhandLocked puts deliveries that never reached a client back at the front of the buffer.
func (c *Consumer) unhandLocked(ds []*Delivery) int {
	back := make([]*lease, 0, len(ds))
	for _, d := range ds {
		k, _ := parseLeaseID(d.LeaseID)
		l := c.table[k]
		if l == nil || l.d != d || l.state != stateOut {
			continue
		}
		c.heap.remove(l)
		l.deadline, l.promise = time.Time{}, time.Time{}
		c.unholdLocked(l)
		l.state, l.fresh, l.d = stateBuffered, true, nil
		back = append(back, l)
		c.st.delivered.Add(^uint64(0))
	}
	c.insertReadyLocked(back)
	return len(back)
}

// insertReadyLocked puts leases back into the ready buffer at their positions: the buffer
// stays in the order the queue gave the messages, so a message given back is delivered before
// every later one, as if it had never left the queue.
func (c *Consumer) insertReadyLocked(ls []*lease) {
	if len(ls) == 0 {
		return
	}
	slices.SortFunc(ls, func(a, b *lease) int { return cmp.Compare(a.pos, b.pos) })
	if len(c.ready) == 0 || ls[len(ls)-1].pos < c.ready[0].pos {
		c.ready = append(ls, c.ready...) // the usual case: all of them before the buffer
		return
	}
	merged := make([]*lease, 0, len(c.ready)+len(ls))
	i, j := 0, 0
	for i < len(ls) && j < len(c.ready) {
		if ls[i].pos < c.ready[j].pos {
			merged = append(merged, ls[i])
			i++
		} else {
			merged = append(merged, c.ready[j])
			j++
		}
	}
	merged = append(merged, ls[i:]...)
	c.ready = append(merged, c.ready[j:]...)
}

func (c *Consumer) unholdLocked(l *lease) {
	if l.holder != nil {
		delete(l.holder.leases, l.key)
		l.holder = nil
	}
}
