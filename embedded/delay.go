package embedded

import (
	"container/heap"
	"sync"
	"time"

	"github.com/kubemq-io/kubemq-proxy/kubemqpb"
)

// delayed is a message waiting for its DelaySeconds to pass.
type delayed struct {
	id  uint64
	due int64 // Unix ns
	m   *kubemqpb.QueueMessage
	seg uint32
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

// delayer moves delayed messages into their queues when they are due. Unlike the real server's
// 500 ms scan with 1024 in-flight slots keyed by MessageID (kubemq-api.md 9.1), it keeps a heap
// with its own ids and a timer for the earliest due time: delays are exact to the timer's
// resolution, there is no head-of-line blocking and a repeated MessageID loses nothing.
type delayer struct {
	s    *Server
	mu   sync.Mutex // guards h and nextID
	h    delayHeap
	next uint64
	wake chan struct{}
}

func newDelayer(s *Server) *delayer {
	return &delayer{s: s, wake: make(chan struct{}, 1)}
}

// add stores m (Attributes.DelayedTo set) until it is due and returns the log position.
func (d *delayer) add(m *kubemqpb.QueueMessage) uint64 {
	d.mu.Lock()
	d.next++
	x := &delayed{id: d.next, due: m.Attributes.DelayedTo, m: m}
	lsn, seg := d.s.logDelayAdd(x.id, m)
	x.seg = seg
	heap.Push(&d.h, x)
	first := d.h[0] == x
	d.mu.Unlock()
	if first {
		d.kick()
	}
	return lsn
}

// restore puts back a delayed message found in the log.
func (d *delayer) restore(id uint64, m *kubemqpb.QueueMessage, seg uint32) {
	d.mu.Lock()
	heap.Push(&d.h, &delayed{id: id, due: m.Attributes.DelayedTo, m: m, seg: seg})
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
	return len(d.h)
}

func (d *delayer) start() { d.s.goTracked(d.run) }

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
		cp := &kubemqpb.QueueMessage{
			MessageID: m.MessageID, ClientID: m.ClientID, Channel: m.Channel, Metadata: m.Metadata,
			Body: m.Body, Tags: m.Tags, Policy: m.Policy,
			Attributes: &kubemqpb.QueueMessageAttributes{
				ReceiveCount: m.Attributes.ReceiveCount, ReRouted: m.Attributes.ReRouted,
				ReRoutedFromQueue: m.Attributes.ReRoutedFromQueue, ExpirationAt: m.Attributes.ExpirationAt,
			},
		}
		q := d.s.getQueue(m.Channel, true)
		q.mu.Lock()
		q.appendLocked(cp, now)
		q.mu.Unlock()
		ids[i] = x.id
	}
	d.s.logDelayDone(ids)
	for _, x := range due {
		d.s.releaseSeg(x.seg)
	}
}
