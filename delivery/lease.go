package delivery

import (
	"container/heap"
	"encoding/base64"
	"time"
)

// leaseState is where a lease is in its life.
type leaseState uint8

const (
	// stateBuffered: recorded and waiting in the ready buffer; nobody holds it yet.
	stateBuffered leaseState = iota
	// stateOut: handed out by Fetch; Ack, Nack, Extend and Release apply.
	stateOut
	// stateDelayed: nacked with a delay; a copy is enqueued at deadline.
	stateDelayed
	// stateRequeue: a fresh copy is being enqueued; the lease ends when it is stored.
	stateRequeue
)

// lease is one message this process holds. Owned by Consumer.mu; msg is immutable.
type lease struct {
	key      leaseKey
	gen      uint32 // bumped on every re-arm; a returning entry is current only if it matches
	attempt  uint32 // the attempt this lease is (or will be) delivered as
	state    leaseState
	fresh    bool      // never handed out: a release re-enqueues it with the same attempt
	hooked   bool      // BeforeRedeliver already let this redelivery through
	deadline time.Time // stateOut: expiry (zero = none); stateDelayed: redelivery time
	promise  time.Time // stateOut without deadline: held until then (Hold); zero = none
	hi       int       // index in the deadline heap, -1 when not in it
	holder   *Handle   // the Handle whose Fetch took it, if any
	d        *Delivery // what the holder got (nil before hand-out, except adopted leases)
	msg      Message   // the original message: ID, Metadata, Body, Tags without reserved tags
	seq      uint64    // sequence of the copy this lease came from (diagnostic)
	pos      uint64    // arrival order in this Consumer: the ready buffer is kept sorted by it
}

// LeaseID returns the text form of a lease key: 22 characters of URL-safe base64.
func (k leaseKey) String() string { return base64.RawURLEncoding.EncodeToString(k[:]) }

// parseLeaseID reverses leaseKey.String; ok is false for anything that is not a lease id.
func parseLeaseID(s string) (k leaseKey, ok bool) {
	if len(s) != 22 {
		return k, false
	}
	n, err := base64.RawURLEncoding.Decode(k[:], []byte(s))
	return k, err == nil && n == 16
}

// leaseHeap orders the leases that have a deadline, earliest first. One heap and one timer per
// Consumer drive every expiry.
type leaseHeap []*lease

func (h leaseHeap) Len() int           { return len(h) }
func (h leaseHeap) Less(i, j int) bool { return h[i].deadline.Before(h[j].deadline) }
func (h leaseHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].hi = i
	h[j].hi = j
}
func (h *leaseHeap) Push(x any) {
	l := x.(*lease)
	l.hi = len(*h)
	*h = append(*h, l)
}
func (h *leaseHeap) Pop() any {
	old := *h
	n := len(old) - 1
	l := old[n]
	old[n] = nil
	l.hi = -1
	*h = old[:n]
	return l
}

// setDeadline puts l in the heap at t (or takes it out for a zero t). It reports whether l is
// now the earliest deadline, so the caller can wake the timer.
func (h *leaseHeap) setDeadline(l *lease, t time.Time) (earliest bool) {
	l.deadline = t
	switch {
	case t.IsZero():
		if l.hi >= 0 {
			heap.Remove(h, l.hi)
		}
		return false
	case l.hi >= 0:
		heap.Fix(h, l.hi)
	default:
		heap.Push(h, l)
	}
	return l.hi == 0
}

func (h *leaseHeap) remove(l *lease) {
	if l.hi >= 0 {
		heap.Remove(h, l.hi)
	}
}

// next returns the earliest deadline, or zero.
func (h leaseHeap) next() time.Time {
	if len(h) == 0 {
		return time.Time{}
	}
	return h[0].deadline
}
