package gcp

import "time"

// Flow control of a StreamingPull stream.
//
// The client's max_outstanding_messages and max_outstanding_bytes bound
// what it has received and not yet settled. The server cannot see that
// number: it hears of a settlement only when the client sends it, and
// clients batch them (the Go client flushes acks every 100 ms, by unary
// Acknowledge). Counting "delivered and not yet heard settled" against the
// limit would cap a stream at one window per flush interval: 10,000 msg/s
// with the Go client's default of 1,000, whatever the client could do.
// Google's own server treats the numbers as a hint, and the client
// libraries enforce them themselves (the Go client holds surplus messages
// back from the callbacks, extending their leases).
//
// Our decision: a stream may hold the client's limit plus the settlements
// heard from it in the last ackWindow (an estimate of the acks in
// transit, capped at maxAckAllowance). The allowance grows only as fast as
// the client really settles: a client that stops acking is back at its
// own limit within ackWindow, and a slow one gets no more than its limit
// plus a quarter second of its own throughput. Expired leases do not count
// as heard. Above every stream, the per-subscription in-flight ceiling
// (Config.MaxInflightPerSubscription) stays the hard bound.
const (
	ackWindow       = 250 * time.Millisecond
	ackBuckets      = 10
	maxAckAllowance = 100_000
)

// flow is one stream's outstanding count. Guarded by the subRuntime.mu of
// its subscription.
type flow struct {
	maxMsgs, maxBytes int64 // the client's limits (maxBytes 0 = none)
	msgs, bytes       int64 // delivered, not settled
	heard             [ackBuckets]flowBucket
	changed           chan struct{} // cap 1: something was settled
}

// flowBucket counts the settlements heard in one slice of ackWindow.
type flowBucket struct {
	slot        int64 // time / (ackWindow / ackBuckets)
	msgs, bytes int64
}

func flowSlot(t time.Time) int64 { return t.UnixNano() / int64(ackWindow/ackBuckets) }

func newFlow(maxMsgs, maxBytes int64) *flow {
	return &flow{maxMsgs: maxMsgs, maxBytes: max(maxBytes, 0), changed: make(chan struct{}, 1)}
}

// take charges one delivery.
func (f *flow) take(l *lease) {
	if f == nil {
		return
	}
	f.msgs++
	f.bytes += l.bytes
}

// release returns a delivery's share; heard is true when the client
// settled it (ack or nack), false for an expiry or a dropped lease.
func (f *flow) release(l *lease, heard bool) {
	if f == nil {
		return
	}
	f.msgs--
	f.bytes -= l.bytes
	if heard {
		slot := flowSlot(time.Now())
		b := &f.heard[slot%ackBuckets]
		if b.slot != slot {
			*b = flowBucket{slot: slot}
		}
		b.msgs++
		b.bytes += l.bytes
	}
	select {
	case f.changed <- struct{}{}:
	default:
	}
}

// allowance sums the settlements heard within ackWindow of now.
func (f *flow) allowance(now time.Time) (msgs, bytes int64) {
	slot := flowSlot(now)
	for i := range f.heard {
		if b := &f.heard[i]; b.slot > slot-ackBuckets {
			msgs += b.msgs
			bytes += b.bytes
		}
	}
	return min(msgs, maxAckAllowance), bytes
}

// room is how many more messages the stream may take now (at least 0).
// It only shrinks as time passes, so a waiting sender needs no timer:
// every increase comes with a settlement, which signals changed.
func (f *flow) room(now time.Time) int64 {
	am, ab := f.allowance(now)
	if f.maxBytes > 0 && f.bytes >= f.maxBytes+ab {
		return 0
	}
	return max(f.maxMsgs+am-f.msgs, 0)
}
