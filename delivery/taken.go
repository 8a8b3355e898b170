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
// sequence (docs/kubemq.md 8.8, 10.4). A reader of the queue right after the poll loop, as a
// snapshot's capture during a Pause, may so receive a message the loop has already taken and
// acknowledged. The Consumer remembers the sequences of the last batches it acknowledged, as
// ranges, so such a reader can tell those copies apart (Taken). The same was seen between the
// poll loop's own Gets, which do not consult the ring yet.

// takenBatches is how many acknowledged batches the Consumer remembers.
const takenBatches = 16

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
	since := time.Now().Add(-window)
	var rs []seqRange
	c.mu.Lock()
	for _, b := range c.taken {
		if !b.at.IsZero() && !b.at.Before(since) {
			rs = append(rs, b.ranges...)
		}
	}
	c.mu.Unlock()
	return func(seq uint64) bool {
		for _, r := range rs {
			if seq >= r.lo && seq <= r.hi {
				return true
			}
		}
		return false
	}
}
