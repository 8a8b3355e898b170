package delivery

import (
	"context"
	"time"
)

// Counting a queue's ready messages.
//
// A front-end that reports message counts (AMQP's queue.declare-ok, basic.get-ok) must count
// what a Fetch could get: the messages KubeMQ holds and the leases buffered here (read ahead,
// given back in place, or about to be enqueued again), but not this Consumer's lease records,
// which come back into the same KubeMQ queue once their delay is over and wait there until the
// poll loop reads them. Ready does that. The records are tracked by MessageID from their store
// to their return; one that is due is taken to be in the queue recordGrace after its due time
// (the delay processor hands records back a little late, docs/kubemq.md 9.1), so for about that
// long a returned record may still be counted, and a record the processor hands back later
// than that is not counted while it is still away.

const (
	// recordGrace is how long after its due time a record is taken to be back in its queue.
	recordGrace = time.Second
	// recordForget drops a record from the tracking when it has not come back this long after
	// its due time (a purge removed it, or the backend lost it).
	recordForget = 10 * time.Minute
	// maxTrackedRecords bounds the tracking; records beyond it are counted as messages.
	maxTrackedRecords = 1 << 16
	// readyTries bounds how often Ready takes its counts again because a transfer between
	// KubeMQ and the lease table overlapped them.
	readyTries = 20
)

// Ready returns how many messages of the queue a Fetch could get now: KubeMQ's count of the
// queue less this Consumer's lease records due back there, plus the leases buffered here and
// the redelivery copies on their way to KubeMQ. The two counts are taken while no batch moves
// between KubeMQ and the lease table, so a message is counted once. Records of another owner
// (a replica, or a process that died) are counted until a poll reads them. -1 when KubeMQ
// cannot count the queue (kubemqclient.Ambiguous).
func (c *Consumer) Ready(ctx context.Context) (int64, error) {
	for try := 1; ; try++ {
		before := c.moved.Load()
		if c.moving.Load() > 0 && try < readyTries {
			if !sleepCtx(ctx, time.Millisecond) {
				return 0, ctx.Err()
			}
			continue
		}
		n, err := c.b.Waiting(ctx, c.queue)
		if err != nil {
			return 0, err
		}
		c.mu.Lock()
		local := int64(len(c.ready))
		for _, l := range c.table {
			if l.state == stateRequeue {
				local++
			}
		}
		due := int64(dueRecords(c.records, time.Now()))
		c.mu.Unlock()
		if (c.moving.Load() > 0 || c.moved.Load() != before) && try < readyTries {
			continue
		}
		if n < 0 {
			return -1, nil
		}
		return max(n-due, 0) + local, nil
	}
}

// emptyNow reports whether the queue is known to be empty: nothing buffered or on its way back
// to KubeMQ, and KubeMQ counting no message (its lease records included), with no batch moving
// meanwhile.
func (c *Consumer) emptyNow(ctx context.Context) (bool, error) {
	local := func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		if len(c.ready) > 0 || len(c.requeue) > 0 {
			return false
		}
		for _, l := range c.table {
			if l.state == stateRequeue {
				return false
			}
		}
		return true
	}
	before := c.moved.Load()
	if c.moving.Load() > 0 || !local() {
		return false, nil
	}
	n, err := c.b.Waiting(ctx, c.queue)
	if err != nil {
		return false, err
	}
	return n == 0 && local() && c.moving.Load() == 0 && c.moved.Load() == before, nil
}

// dueRecords counts the tracked records that are due back by now (less recordGrace).
func dueRecords(recs map[string]time.Time, now time.Time) int {
	n := 0
	at := now.Add(-recordGrace)
	for _, due := range recs {
		if !due.After(at) {
			n++
		}
	}
	return n
}

// trackRecords notes delayed messages (lease records, sentinels) just stored.
func (c *Consumer) trackRecords(msgs []Message, stored []bool, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range msgs {
		m := &msgs[i]
		if !stored[i] || m.DelaySeconds <= 0 {
			continue
		}
		if _, ok := m.Tags[TagRecord]; !ok {
			continue
		}
		if c.records == nil {
			c.records = map[string]time.Time{}
		}
		if len(c.records) >= maxTrackedRecords {
			c.forgetRecordsLocked(now)
			if len(c.records) >= maxTrackedRecords {
				return
			}
		}
		c.records[m.ID] = now.Add(time.Duration(m.DelaySeconds) * time.Second)
	}
}

// readBackLocked forgets the tracked records among msgs (read by a Get).
func (c *Consumer) readBackLocked(msgs []*Message) {
	if len(c.records) == 0 {
		return
	}
	for _, m := range msgs {
		delete(c.records, m.ID)
	}
}

// forgetRecordsLocked drops records that never came back.
func (c *Consumer) forgetRecordsLocked(now time.Time) {
	for id, due := range c.records {
		if now.Sub(due) > recordForget {
			delete(c.records, id)
		}
	}
}

// sleepCtx waits d; false when ctx ended first.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
