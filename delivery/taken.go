package delivery

import (
	"cmp"
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
// capture reading the queue during a Pause. The Consumer remembers the sequences it took and
// acknowledged in the last takenKeep, as ranges. Its own Gets drop a message whose sequence is
// among them (prepare, within retakenWindow), and another reader asks Taken.
//
// A sequence names one stored copy of a message in one queue, and KubeMQ numbers a queue's
// copies upwards: a redelivery or requeue of a message is a new copy under a new sequence, so
// only a second delivery of the same copy is dropped. A queue's numbering starts again only
// when the queue itself is gone: the embedded server removes a queue idle for its purge
// interval, far longer than the window, and a KubeMQ restarted on an empty store breaks the
// stream, which clears the ring (pollFailed).

// takenKeep is how long a taken sequence is remembered at least: the longest window a reader
// asks for (a snapshot's capture, 30 s). maxTakenRanges bounds the memory: a Consumer takes a
// queue's copies mostly in sequence order, so consecutive batches merge into one range, and
// only gaps (copies another reader took, delayed messages) make new ones.
const (
	takenKeep      = 30 * time.Second
	maxTakenRanges = 4096
)

// retakenWindow is how long the poll loop drops copies of a batch it acknowledged. The copies
// seen on the real server came within 2.5 s of the acknowledgement.
const retakenWindow = 10 * time.Second

// takenRange is the sequences lo..hi, both included, the last of them acknowledged at at
// (Unix nanoseconds).
type takenRange struct {
	lo, hi uint64
	at     int64
}

// noteTaken remembers the sequences of msgs, a batch just acknowledged to KubeMQ.
func (c *Consumer) noteTaken(msgs []Message, now time.Time) {
	seqs := make([]uint64, 0, len(msgs))
	for i := range msgs {
		if s := msgs[i].Sequence; s != 0 {
			seqs = append(seqs, s)
		}
	}
	c.noteSeqs(seqs, now)
}

// NoteTaken records sequences of the queue's copies that another reader took from KubeMQ and
// acknowledged (a snapshot's capture moving the queue while the Consumer is paused): the
// Consumer's Gets drop copies of them that KubeMQ hands out again, as they drop copies of its
// own batches. Only acknowledged copies may be given: a copy given back to the queue keeps its
// sequence and would be dropped.
func (c *Consumer) NoteTaken(seqs []uint64) {
	c.noteSeqs(slices.Clone(seqs), time.Now())
}

// noteSeqs remembers seqs (sorted here), just acknowledged to KubeMQ, and writes them to the
// TakenLog if there is one.
func (c *Consumer) noteSeqs(seqs []uint64, now time.Time) {
	seqs = slices.DeleteFunc(seqs, func(s uint64) bool { return s == 0 })
	if len(seqs) == 0 {
		return
	}
	slices.Sort(seqs)
	var runs [][2]uint64 // consecutive sequences, as first and last
	for _, s := range seqs {
		if n := len(runs); n > 0 && s <= runs[n-1][1]+1 {
			runs[n-1][1] = max(runs[n-1][1], s)
			continue
		}
		runs = append(runs, [2]uint64{s, s})
	}
	c.mu.Lock()
	owner := c.owner
	c.addTakenLocked(runs, now)
	c.mu.Unlock()
	if tl, ok := c.opts.Settlements.(TakenLog); ok {
		for _, r := range runs {
			tl.NoteTaken(c.queue, owner, r[0], r[1])
		}
	}
}

// addTakenLocked adds runs, taken at now, merging a run into the last range it continues, and
// forgets what is past takenKeep and the oldest ranges past maxTakenRanges. A range's time is
// its last acknowledgement, so ranges stay in time order. c.mu must be held.
func (c *Consumer) addTakenLocked(runs [][2]uint64, now time.Time) {
	at := now.UnixNano()
	for _, r := range runs {
		if n := len(c.taken); n > 0 && r[0] >= c.taken[n-1].lo && r[0] <= c.taken[n-1].hi+1 {
			last := &c.taken[n-1]
			last.hi = max(last.hi, r[1])
			last.at = at
			continue
		}
		c.taken = append(c.taken, takenRange{lo: r[0], hi: r[1], at: at})
	}
	drop := max(len(c.taken)-maxTakenRanges, 0)
	cut := now.Add(-takenKeep).UnixNano()
	for drop < len(c.taken) && c.taken[drop].at < cut {
		drop++
	}
	if drop > 0 {
		c.taken = slices.Delete(c.taken, 0, drop)
	}
}

// Taken reports, for the sequences of the queue's stored copies, which ones the Consumer took
// from KubeMQ and acknowledged within the last window (at most takenKeep): a copy of one of
// them that another reader receives is a second delivery of a message the Consumer already
// holds or has settled (see the top of this file). The answer is fixed when Taken is called;
// call it while the Consumer is paused, so that nothing is taken meanwhile.
func (c *Consumer) Taken(window time.Duration) func(seq uint64) bool {
	c.mu.Lock()
	t := c.takenSinceLocked(time.Now().Add(-window))
	t.ranges = slices.Clone(t.ranges)
	c.mu.Unlock()
	return t.has
}

// takenSet is the sequences of some acknowledged batches.
type takenSet struct {
	ranges []takenRange
	hi     uint64 // the highest sequence in ranges
}

// takenSinceLocked is the ranges acknowledged at or after since, a view of c.taken: use it
// under c.mu, or clone it.
func (c *Consumer) takenSinceLocked(since time.Time) takenSet {
	at := since.UnixNano()
	i, _ := slices.BinarySearchFunc(c.taken, at, func(r takenRange, at int64) int { return cmp.Compare(r.at, at) })
	t := takenSet{ranges: c.taken[i:]}
	for _, r := range t.ranges {
		t.hi = max(t.hi, r.hi)
	}
	return t
}

func (t takenSet) has(seq uint64) bool {
	if seq == 0 || seq > t.hi {
		return false // the usual case: a copy stored after everything taken
	}
	for i := len(t.ranges) - 1; i >= 0; i-- {
		if r := t.ranges[i]; seq >= r.lo && seq <= r.hi {
			return true
		}
	}
	return false
}

// seedTaken adds the ranges the queue's earlier owners noted taken (TakenLog), read before the
// first Get, as taken now.
func (c *Consumer) seedTaken(rs [][2]uint64, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.addTakenLocked(rs, now)
}
