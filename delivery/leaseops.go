package delivery

import (
	"time"
)

// Ack settles deliveries. It reports, per id, whether the lease was live and is now acked;
// unknown, stale, nacked or malformed ids report false.
func (c *Consumer) Ack(ids ...string) []bool {
	ok := make([]bool, len(ids))
	var keys [][16]byte
	c.mu.Lock()
	for i, id := range ids {
		l := c.lookupLocked(id)
		if l == nil || l.state != stateOut {
			continue
		}
		c.removeLocked(l)
		ok[i] = true
		if c.opts.Settlements != nil {
			keys = append(keys, l.key)
		}
	}
	owner := c.owner
	c.mu.Unlock()
	c.st.acked.Add(uint64(countTrue(ok)))
	if len(keys) > 0 {
		c.opts.Settlements.Settle(c.queue, owner, keys...)
	}
	return ok
}

func countTrue(b []bool) int {
	n := 0
	for _, x := range b {
		if x {
			n++
		}
	}
	return n
}

// Nack gives a delivery back: with delay <= 0 a fresh copy (Attempt+1) is enqueued at once;
// with delay > 0 the lease is kept and the copy enqueued when the delay has passed (retry
// backoff; the lease record keeps it durable meanwhile). It reports false for an unknown,
// stale or already nacked id.
func (c *Consumer) Nack(id string, delay time.Duration) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.lookupLocked(id)
	if l == nil || l.state != stateOut {
		return false
	}
	if delay <= 0 {
		c.requeueLocked(l)
		return true
	}
	l.state = stateDelayed
	if c.heap.setDeadline(l, time.Now().Add(delay)) {
		wake(c.settleWake)
	}
	return true
}

// Extend moves a delivery's deadline (modifyAckDeadline). A zero deadline removes it; a deadline
// not after now is Nack(id, 0). It reports false for an unknown, stale or nacked id.
func (c *Consumer) Extend(id string, deadline time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.lookupLocked(id)
	if l == nil || l.state != stateOut {
		return false
	}
	if !deadline.IsZero() && !deadline.After(time.Now()) {
		c.requeueLocked(l)
		return true
	}
	if c.heap.setDeadline(l, deadline) {
		wake(c.settleWake)
	}
	return true
}

// Hold promises deliveries to their holder until until, without an engine deadline: lease
// records written from now on tell another owner (a replica, or this process after a crash)
// not to redeliver them before until (plus the record delay). The engine never expires a
// promise; a front-end that runs its own deadlines (Pub/Sub) calls Hold whenever one moves.
// It reports how many ids named live deliveries.
func (c *Consumer) Hold(until time.Time, ids ...string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, id := range ids {
		if l := c.lookupLocked(id); l != nil && l.state == stateOut {
			l.promise = until
			n++
		}
	}
	return n
}

// Release gives deliveries back at once (AMQP requeue on channel close or basic.recover),
// like Nack(id, 0). It reports, per id, whether the lease was live.
func (c *Consumer) Release(ids ...string) []bool {
	ok := make([]bool, len(ids))
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, id := range ids {
		l := c.lookupLocked(id)
		if l == nil || l.state != stateOut {
			continue
		}
		c.requeueLocked(l)
		ok[i] = true
	}
	return ok
}

// Requeue gives deliveries back in place (AMQP's requeue: nack, reject, recover, a closed
// channel): each lease returns to the ready buffer at its original position, so the next Fetch
// of the queue gets it before every message that came after it, and its next delivery is the
// next attempt (Redelivered). No copy is enqueued: the lease stays in the table and its lease
// record keeps it durable, as for a buffered lease. BeforeRedeliver is not consulted (a
// front-end that dead-letters uses Nack). It reports, per id, whether the lease was out.
func (c *Consumer) Requeue(ids ...string) []bool {
	ok := make([]bool, len(ids))
	c.mu.Lock()
	defer c.mu.Unlock()
	back := make([]*lease, 0, len(ids))
	for i, id := range ids {
		l := c.lookupLocked(id)
		if l == nil || l.state != stateOut {
			continue
		}
		c.heap.remove(l)
		l.deadline, l.promise = time.Time{}, time.Time{}
		c.unholdLocked(l)
		l.state, l.d = stateBuffered, nil
		l.attempt++
		l.fresh = true // attempt is now the one of its next delivery
		back = append(back, l)
		ok[i] = true
	}
	c.insertReadyLocked(back)
	c.st.requeued.Add(uint64(len(back)))
	c.serveLocked(time.Now())
	return ok
}

// Purge drops every lease of the ready buffer, and every redelivery copy not yet being stored,
// as if acked (AMQP's queue.purge: ready messages go, deliveries out stay). The front-end
// empties the KubeMQ queue after it; Purge forgets this Consumer's lease records that are due
// back, which that removes (so Ready does not keep discounting them). It returns how many
// leases it dropped.
func (c *Consumer) Purge() int {
	c.mu.Lock()
	n := 0
	var settled [][16]byte // their records are obsolete for the queue's next owner too
	for _, l := range c.ready {
		c.removeLocked(l)
		settled = append(settled, l.key)
		n++
	}
	c.ready = nil
	for _, l := range c.requeue {
		if c.table[l.key] == l {
			c.removeLocked(l)
			settled = append(settled, l.key)
			n++
		}
	}
	c.requeue = nil
	owner := c.owner
	defer func() {
		c.mu.Unlock()
		if st := c.opts.Settlements; st != nil && len(settled) > 0 {
			st.Settle(c.queue, owner, settled...)
		}
	}()
	now := time.Now()
	for id, due := range c.records {
		if !due.After(now) {
			delete(c.records, id)
		}
	}
	c.st.purged.Add(uint64(n))
	return n
}

// ReleaseAll gives back every delivery of every user of this Consumer, plus the ready buffer.
// Front-ends sharing a Consumer use Handle.ReleaseAll instead. It returns how many it released.
func (c *Consumer) ReleaseAll() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.releaseAllLocked(false)
}

// releaseAllLocked requeues every out and buffered lease, and the delayed ones too when
// withDelayed (Close: cutting a retry backoff short beats leaving it to a record).
func (c *Consumer) releaseAllLocked(withDelayed bool) int {
	n := 0
	for _, l := range c.table {
		if l.state == stateOut || (withDelayed && l.state == stateDelayed) {
			c.requeueLocked(l)
			n++
		}
	}
	for _, l := range c.ready {
		c.requeueLocked(l)
		n++
	}
	c.ready = nil
	return n
}

// requeueLocked hands l to the settler for a fresh copy.
func (c *Consumer) requeueLocked(l *lease) {
	c.heap.remove(l)
	l.deadline = time.Time{}
	l.state = stateRequeue
	c.requeue = append(c.requeue, l)
	wake(c.settleWake)
}
