package delivery

import (
	"slices"
	"time"
)

// Sequences taken.
//
// When a transaction is settled the real KubeMQ closes the Get's consumer-group member at once
// and applies the acknowledgements separately; if the close wins, a message whose
// acknowledgement is still pending goes to another open member, delivered again with the same
// sequence (docs/kubemq.md 8.8, 10.4). The next reader of the queue may so receive a message the
// Consumer has already taken and acknowledged: the poll loop's own next Get, or a snapshot's
// capture reading the queue during a Pause. The Consumer remembers the sequences of the last
// batches it acknowledged, as ranges. Its own Gets drop a message whose sequence is among them
// (prepare, within retakenWindow), and another reader asks Taken.
//
// A sequence names one stored copy of a message in one queue, and KubeMQ numbers a queue's
// copies upwards: a redelivery or requeue of a message is a new copy under a new sequence, so
// only a second delivery of the same copy is dropped. A queue's numbering starts again only
// when the queue itself is gone: the embedded server removes a queue idle for its purge
// interval, far longer than the window, and a KubeMQ restarted on an empty store breaks the
// stream, which clears the ring (pollFailed).

// takenBatches is how many acknowledged batches the Consumer remembers.
const takenBatches = 16

// retakenWindow is how long the poll loop drops copies of a batch it acknowledged. The copies
// seen on the real server came within 2.5 s of the acknowledgement.
const retakenWindow = 10 * time.Second

// seqRange is the sequences lo..hi, both included.
type seqRange struct{ lo, hi uint64 }

type takenBatch struct {
	at     time.Time
	ranges []seqRange
}

// noteTaken remembers the sequences of msgs, a batch just acknowledged to KubeMQ.
func (c *Consumer) noteTaken(msgs []Message, now time.Time) {
	seqs := make([]uint64, 0, len(msgs))
	for i := range msgs {
		if s := msgs[i].Sequence; s != 0 {
			seqs = append(seqs, s)
		}
	}
	if len(seqs) == 0 {
		return
	}
	slices.Sort(seqs)
	var rs []seqRange
	for _, s := range seqs {
		if n := len(rs); n > 0 && s <= rs[n-1].hi+1 {
			rs[n-1].hi = max(rs[n-1].hi, s)
			continue
		}
		rs = append(rs, seqRange{s, s})
	}
	c.mu.Lock()
	c.taken[c.takenNext] = takenBatch{at: now, ranges: rs}
	c.takenNext = (c.takenNext + 1) % takenBatches
	c.mu.Unlock()
}

// Taken reports, for the sequences of the queue's stored copies, which ones the Consumer took
// from KubeMQ and acknowledged within the last window (up to its last 16 batches): a copy of
// one of them that another reader receives is a second delivery of a message the Consumer
// already holds or has settled (see the top of this file). The answer is fixed when Taken is
// called; call it while the Consumer is paused, so that nothing is taken meanwhile.
func (c *Consumer) Taken(window time.Duration) func(seq uint64) bool {
	c.mu.Lock()
	t := c.takenSinceLocked(time.Now().Add(-window))
	c.mu.Unlock()
	return t.has
}

// takenSet is the sequences of some acknowledged batches.
type takenSet struct {
	ranges []seqRange
	hi     uint64 // the highest sequence in ranges
}

// takenSinceLocked collects the batches acknowledged at or after since. c.mu must be held.
func (c *Consumer) takenSinceLocked(since time.Time) takenSet {
	var t takenSet
	for _, b := range c.taken {
		if b.at.IsZero() || b.at.Before(since) {
			continue
		}
		t.ranges = append(t.ranges, b.ranges...)
		t.hi = max(t.hi, b.ranges[len(b.ranges)-1].hi)
	}
	return t
}

func (t takenSet) has(seq uint64) bool {
	if seq == 0 || seq > t.hi {
		return false // the usual case: a copy stored after everything taken
	}
	for _, r := range t.ranges {
		if seq >= r.lo && seq <= r.hi {
			return true
		}
	}
	return false
}
