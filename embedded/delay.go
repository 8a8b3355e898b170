package embedded

import (
	"cmp"
	"container/heap"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/kubemq-io/kubemq-proxy/kubemqpb"
)

// delayed is a message waiting for its DelaySeconds to pass. With a data directory only this
// index is held (m is nil) and the message is read back from its record when it is due.
type delayed struct {
	id      uint64
	due     int64 // Unix ns
	m       *kubemqpb.QueueMessage
	msgID   string // MessageID
	channel string
	lsn     uint64 // log position that holds the record
	off     int64  // record offset in its segment
	seg     uint32
	n       uint32 // record length
	rc      int32  // Attributes.ReceiveCount, for a record that cannot be read back
}

// newDelayed indexes m, stored as the record at off (n bytes) of segment seg.
func newDelayed(id uint64, m *kubemqpb.QueueMessage, seg uint32, off int64, n int, lsn uint64) *delayed {
	return &delayed{id: id, due: m.Attributes.DelayedTo, m: m, msgID: m.MessageID, channel: m.Channel, lsn: lsn, off: off, seg: seg,
		n: uint32(n), rc: m.Attributes.ReceiveCount}
}

type delayHeap []*delayed

func (h delayHeap) Len() int { return len(h) }
func (h delayHeap) Less(i, j int) bool {
	if h[i].due != h[j].due {
		return h[i].due < h[j].due
	}
	return h[i].id < h[j].id
}
func (h delayHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *delayHeap) Push(x any)   { *h = append(*h, x.(*delayed)) }
func (h *delayHeap) Pop() any {
	old := *h
	n := len(old)
	x := old[n-1]
	old[n-1] = nil
	*h = old[:n-1]
	return x
}

// The real server's delay processor (docs/kubemq.md 9.1), which Options.ScanDelays models: it
// holds at most scanSlots delayed messages, the earliest sent, and every scanInterval re-sends
// those that are due.
const (
	scanSlots    = 1024
	scanInterval = 500 * time.Millisecond
)

// delayer moves delayed messages into their queues when they are due. By default, unlike the
// real server's 500 ms scan with 1024 in-flight slots keyed by MessageID (docs/kubemq.md 9.1), it
// keeps a heap with its own ids and a timer for the earliest due time: delays are exact to the
// timer's resolution, there is no head-of-line blocking and a repeated MessageID loses nothing.
// With Options.ScanDelays it keeps the messages in send order and releases them as the real
// processor does: every 500 ms, those due among the first 1024 (late by up to 500 ms, and
// behind earlier sends with longer delays). Either way a MessageID sent again while an earlier
// copy is still delayed is a hazard (the real server loses one of them): counted, and refused in
// strict mode.
type delayer struct {
	s    *Server
	scan bool
	mu   sync.Mutex     // guards h, fifo, ids and next
	h    delayHeap      // exact mode
	fifo []*delayed     // scan mode, in id (send) order
	ids  map[string]int // pending copies by MessageID
	next uint64
	wake chan struct{}
}

func newDelayer(s *Server) *delayer {
	return &delayer{s: s, scan: s.opts.ScanDelays, ids: map[string]int{}, wake: make(chan struct{}, 1)}
}

// add stores m (Attributes.DelayedTo set) until it is due and returns the log position. ok is
// false when strict mode refuses m because a message with its MessageID is still delayed.
func (d *delayer) add(m *kubemqpb.QueueMessage) (lsn uint64, ok bool) {
	d.mu.Lock()
	if d.ids[m.MessageID] > 0 && d.s.violation(&d.s.strict.delayedID, "a delayed message reuses the MessageID of one still delayed",
		zap.String("channel", m.Channel), zap.String("message_id", m.MessageID)) {
		d.mu.Unlock()
		return 0, false
	}
	d.next++
	lsn, seg, off, n := d.s.logDelayAdd(d.next, m)
	x := newDelayed(d.next, m, seg, off, n, lsn)
	if d.s.store != nil {
		x.m = nil // in the log
	} else {
		d.s.mem.Add(messageSize(m))
	}
	d.ids[m.MessageID]++
	first := true
	if d.scan {
		d.fifo = append(d.fifo, x)
	} else {
		heap.Push(&d.h, x)
		first = d.h[0] == x
	}
	d.mu.Unlock()
	if first && !d.scan {
		d.kick()
	}
	return lsn, true
}

// restore puts back a delayed message found in the log (before start), as an index.
func (d *delayer) restore(x *delayed) {
	d.mu.Lock()
	id := x.id
	if d.scan {
		d.fifo = append(d.fifo, x)
	} else {
		heap.Push(&d.h, x)
	}
	d.ids[x.msgID]++
	if id > d.next {
		d.next = id
	}
	d.mu.Unlock()
}

func (d *delayer) kick() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

func (d *delayer) len() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.h) + len(d.fifo)
}

func (d *delayer) start() {
	if d.scan {
		d.mu.Lock()
		slices.SortFunc(d.fifo, func(a, b *delayed) int { return cmp.Compare(a.id, b.id) })
		d.mu.Unlock()
		d.s.goTracked(d.runScan)
		return
	}
	d.s.goTracked(d.run)
}

// forgetLocked drops the delivered messages from the MessageID count.
func (d *delayer) forgetLocked(due []*delayed) {
	for _, x := range due {
		if d.ids[x.msgID]--; d.ids[x.msgID] <= 0 {
			delete(d.ids, x.msgID)
		}
	}
}

// runScan is the scan mode's loop: every scanInterval it delivers what is due among the first
// scanSlots messages in send order.
func (d *delayer) runScan() {
	tick := time.NewTicker(scanInterval)
	defer tick.Stop()
	for {
		select {
		case <-d.s.ctx.Done():
			return
		case <-tick.C:
		}
		now := d.s.now().UnixNano()
		var due []*delayed
		d.mu.Lock()
		window := min(len(d.fifo), scanSlots)
		kept := d.fifo[:0]
		for _, x := range d.fifo[:window] {
			if x.due <= now {
				due = append(due, x)
			} else {
				kept = append(kept, x)
			}
		}
		if len(due) > 0 {
			n := len(kept) + copy(d.fifo[len(kept):], d.fifo[window:])
			clear(d.fifo[n:])
			d.fifo = d.fifo[:n]
		}
		d.forgetLocked(due)
		d.mu.Unlock()
		if len(due) > 0 {
			d.deliver(due, now)
		}
	}
}

func (d *delayer) run() {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		now := d.s.now().UnixNano()
		var due []*delayed
		wait := time.Hour
		d.mu.Lock()
		for len(d.h) > 0 && d.h[0].due <= now {
			due = append(due, heap.Pop(&d.h).(*delayed))
		}
		d.forgetLocked(due)
		if len(d.h) > 0 {
			wait = time.Duration(d.h[0].due - now)
		}
		d.mu.Unlock()
		if len(due) > 0 {
			d.deliver(due, now)
			continue
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(wait)
		select {
		case <-d.s.ctx.Done():
			return
		case <-d.wake:
		case <-timer.C:
		}
	}
}

// deliver appends due messages to their queues as new copies (new sequence, DelayedTo 0), then
// logs them as done, so a crash in between duplicates rather than loses.
func (d *delayer) deliver(due []*delayed, now int64) {
	ids := make([]uint64, len(due))
	for i, x := range due {
		m := x.m
		if m == nil {
			m = d.load(x)
		} else {
			d.s.mem.Add(-messageSize(m))
		}
		cp := &kubemqpb.QueueMessage{
			MessageID: m.MessageID, ClientID: m.ClientID, Channel: m.Channel, Metadata: m.Metadata,
			Body: m.Body, Tags: m.Tags, Policy: m.Policy,
			Attributes: &kubemqpb.QueueMessageAttributes{
				ReceiveCount: m.Attributes.ReceiveCount, ReRouted: m.Attributes.ReRouted,
				ReRoutedFromQueue: m.Attributes.ReRoutedFromQueue, ExpirationAt: m.Attributes.ExpirationAt,
			},
		}
		q, _ := d.s.lockQueue(m.Channel, false)
		q.appendLocked(cp, now)
		q.mu.Unlock()
		ids[i] = x.id
	}
	d.s.logDelayDone(ids)
	for _, x := range due {
		d.s.releaseSeg(x.seg)
	}
}

// load reads a due message back from the log. A record that cannot be read back is logged and an
// empty message with the index's channel and receive count takes its place (as mustLoad does for
// queue messages), so the delay still ends and nothing panics.
func (d *delayer) load(x *delayed) *kubemqpb.QueueMessage {
	var err error
	if d.s.store == nil {
		err = errServerClosed
	} else {
		var p []byte
		if p, err = d.s.store.readRecord(x.seg, x.off, int(x.n), x.lsn, recDelayAdd); err == nil {
			var r record
			if r, err = decodeRecord(recDelayAdd, p); err == nil && r.id != x.id {
				err = errCorrupt
			}
			if err == nil {
				return r.qm
			}
		}
	}
	d.s.log.Error("cannot read a delayed message back from the log", zap.String("channel", x.channel), zap.Error(err))
	return &kubemqpb.QueueMessage{MessageID: x.msgID, Channel: x.channel, Attributes: &kubemqpb.QueueMessageAttributes{ReceiveCount: x.rc},
		Policy: &kubemqpb.QueueMessagePolicy{}}
}
