package delivery

import (
	"context"
	"strconv"
	"time"

	"go.uber.org/zap"
)

// settleLoop owns the deadline timer and enqueues redelivery copies: expired and delayed
// leases move to the requeue list, and each pass stores up to MaxBatch copies in one call.
func (c *Consumer) settleLoop() {
	defer close(c.settleDone)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	bo := backoff{min: 50 * time.Millisecond, max: 2 * time.Second}
	for {
		c.mu.Lock()
		c.expireLocked(time.Now())
		next := c.heap.next()
		k := min(len(c.requeue), c.opts.MaxBatch)
		work := append([]*lease(nil), c.requeue[:k]...)
		clear(c.requeue[:k])
		c.requeue = c.requeue[k:]
		if len(c.requeue) == 0 {
			c.requeue = nil
		}
		c.mu.Unlock()

		if len(work) > 0 {
			if err := c.redeliver(work); err != nil {
				c.log.Warn("enqueue redelivery copies failed; retrying (lease records keep the messages)",
					zap.Int("copies", len(work)), zap.Error(err))
				t := time.NewTimer(bo.next())
				select {
				case <-t.C:
				case <-c.settleCtx.Done():
					t.Stop()
					return
				}
			} else {
				bo.reset()
			}
			c.signalSettled()
			continue
		}
		c.signalSettled()
		if !next.IsZero() {
			timer.Reset(time.Until(next))
		}
		select {
		case <-timer.C:
		case <-c.settleWake:
		case <-c.settleCtx.Done():
			timer.Stop()
			return
		}
		timer.Stop()
	}
}

func (c *Consumer) signalSettled() {
	c.mu.Lock()
	if c.settled != nil {
		close(c.settled)
		c.settled = nil
	}
	c.mu.Unlock()
}

// expireLocked moves every lease whose deadline has passed to the requeue list: an expired
// delivery behaves like Nack(0), a delayed nack is now due.
func (c *Consumer) expireLocked(now time.Time) {
	for len(c.heap) > 0 && !c.heap[0].deadline.After(now) {
		l := c.heap[0]
		c.requeueLocked(l)
	}
}

// redeliver asks BeforeRedeliver about each lease, stores fresh copies of the others in one
// batch and ends their leases. On failure the leases go back to the requeue list.
func (c *Consumer) redeliver(ls []*lease) error {
	msgs := make([]Message, 0, len(ls))
	keep := make([]*lease, 0, len(ls))
	var dropped []*lease
	for _, l := range ls {
		if !l.fresh && !l.hooked && c.opts.BeforeRedeliver != nil {
			d := l.d
			if d == nil {
				d = l.delivery()
			}
			if c.opts.BeforeRedeliver(d) {
				dropped = append(dropped, l)
				continue
			}
			l.hooked = true // asked once, even if the copy must be retried
		}
		keep = append(keep, l)
		msgs = append(msgs, c.copyOf(l))
	}
	var err error
	// From the store until the leases are gone, Ready waits rather than count a copy twice.
	c.moving.Add(1)
	defer func() {
		c.moved.Add(1)
		c.moving.Add(-1)
	}()
	if len(msgs) > 0 {
		ctx, cancel := context.WithTimeout(c.settleCtx, c.opts.StoreTimeout)
		err = c.sendAll(ctx, msgs)
		cancel()
	}
	var settled [][16]byte
	c.mu.Lock()
	for _, l := range dropped {
		if c.table[l.key] == l {
			c.removeLocked(l)
			settled = append(settled, l.key)
		}
	}
	c.st.droppedByHook.Add(uint64(len(dropped)))
	if err == nil {
		for _, l := range keep {
			if c.table[l.key] == l {
				c.removeLocked(l)
				settled = append(settled, l.key)
			}
		}
		c.st.redelivered.Add(uint64(len(keep)))
	} else {
		for _, l := range keep {
			if c.table[l.key] == l && l.state == stateRequeue {
				c.requeue = append(c.requeue, l)
			}
		}
	}
	owner := c.owner
	c.mu.Unlock()
	// A lease given back as a fresh copy, or dead-lettered, is settled: its records are
	// obsolete for the queue's next owner too.
	if st := c.opts.Settlements; st != nil && len(settled) > 0 {
		st.Settle(c.queue, owner, settled...)
	}
	return err
}

// copyOf builds the fresh copy that replaces l in the queue: a new unique MessageID, the next
// attempt (the same one for a lease nobody was handed), the original id and store time in
// reserved tags.
func (c *Consumer) copyOf(l *lease) Message {
	attempt := l.attempt
	if !l.fresh {
		attempt++
	}
	tags := make(map[string]string, len(l.msg.Tags)+3)
	for k, v := range l.msg.Tags {
		tags[k] = v
	}
	tags[TagAttempt] = strconv.FormatUint(uint64(attempt), 10)
	tags[TagMessageID] = l.msg.ID
	if l.msg.Stored != 0 {
		tags[TagStored] = strconv.FormatInt(l.msg.Stored, 10)
	}
	return Message{ID: c.ids.next(), Metadata: l.msg.Metadata, Body: l.msg.Body, Tags: tags}
}

// delivery describes a lease that was never handed out in this process (recovered from a
// dead owner's record), for BeforeRedeliver.
func (l *lease) delivery() *Delivery {
	return &Delivery{
		LeaseID:     l.key.String(),
		Generation:  l.gen,
		Attempt:     int(l.attempt),
		Redelivered: l.attempt > 1,
		MessageID:   l.msg.ID,
		Metadata:    l.msg.Metadata,
		Body:        l.msg.Body,
		Tags:        l.msg.Tags,
		Sequence:    l.seq,
		StoredAt:    storedAt(l.msg.Stored),
	}
}
