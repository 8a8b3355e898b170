package gcp

import (
	"slices"
	"time"
)

// keyState is one ordering key's place in a subscription (Google's
// semantics: a key's messages go out in order, several at a time; when one
// fails, it and every later one that went out are delivered again, in
// order, including those already acked).
//
// window holds the key's messages from its earliest unsettled one on, in
// publish order: out, acked (held: settled only once every earlier one is,
// so that a failure before them can still redeliver them), ready to go out
// or waiting out a backoff. Once one is ready or in backoff, none after it
// is out or acked. pending holds later messages, fetched but not yet
// admitted, in publish order. All the key's out messages are on one stream
// (owner): a client processes a key in order only within a stream.
// Owned by subRuntime.mu.
type keyState struct {
	window  []*lease
	pending []*lease
	owner   *flow // the stream holding the key's out messages
	out     int   // window entries out
}

// admits reports whether the window takes the key's next message: it is
// not full, and its last entry is not waiting out a backoff (what follows
// it waits in pending).
func (ks *keyState) admits() bool {
	n := len(ks.window)
	return n == 0 || (n < maxKeyWindow && ks.window[n-1].state != leaseBackoff)
}

// queued reports whether some window entry waits to go out (again): a
// fresh message of the key goes behind it.
func (ks *keyState) queued() bool {
	n := len(ks.window)
	return n > 0 && (ks.window[n-1].state == leaseReady || ks.window[n-1].state == leaseBackoff)
}

// takes reports whether stream f may be handed the key's messages now.
func (ks *keyState) takes(f *flow) bool { return ks.out == 0 || ks.owner == f }

func (ks *keyState) index(l *lease) int {
	for i, w := range ks.window {
		if w == l {
			return i
		}
	}
	return -1
}

// advanceKeyLocked admits the key's pending messages to its window as
// ready (handed out by the next fetches, in order), unless the key is held
// for recovery, and forgets an idle key. It reports whether it admitted any.
func (r *subRuntime) advanceKeyLocked(key string, ks *keyState, now time.Time) bool {
	if len(ks.window) == 0 && len(ks.pending) == 0 {
		delete(r.keys, key)
		return false
	}
	if len(ks.pending) == 0 || !ks.admits() || r.keyHeldLocked(key, now) {
		return false
	}
	for len(ks.pending) > 0 && ks.admits() {
		next := ks.pending[0]
		ks.pending[0] = nil
		ks.pending = ks.pending[1:]
		next.state = leaseReady
		ks.window = append(ks.window, next)
		r.ready = append(r.ready, next)
	}
	return true
}

// rewindKeyLocked takes every message of l's key after l out of its window
// (out, acked or waiting to go out) and back to the front of pending: they
// go out again after l, in order, under new ack ids (Google redelivers a
// key's later messages after a failed one, acked or not).
func (r *subRuntime) rewindKeyLocked(ks *keyState, l *lease) {
	i := ks.index(l)
	if i < 0 || i == len(ks.window)-1 {
		return
	}
	rest := ks.window[i+1:]
	back := make([]*lease, 0, len(rest)+len(ks.pending))
	readied := false
	for _, w := range rest {
		switch w.state {
		case leaseOut:
			r.leaveOutLocked(w)
			r.unheapLocked(w)
			w.flow.release(w, false)
			w.flow = nil
			w.attempt++ // delivery_attempt counts deliveries (Google)
		case leaseAcked:
			w.attempt++
		case leaseBackoff:
			r.unheapLocked(w)
		case leaseReady:
			readied = true
		}
		w.gen++ // its outstanding ack id is stale
		w.state = leasePending
		w.order = orderOf(w.d.Tags)
		back = append(back, w)
	}
	if readied { // r.ready holds no other pending lease
		r.ready = slices.DeleteFunc(r.ready, func(x *lease) bool { return x.state == leasePending })
	}
	clear(rest)
	ks.window = ks.window[:i+1]
	// Usually all of them precede pending; a message that came back late
	// from a lease record may not (recovery), and pending stays sorted.
	ks.pending = append(back, ks.pending...)
	if len(back) < len(ks.pending) {
		slices.SortStableFunc(ks.pending, func(a, b *lease) int { return a.order.compare(b.order) })
	}
}

// settleAckedHeadLocked forgets the acked messages at the head of a key's
// window (nothing unsettled is before them any more) and returns their
// engine lease ids, to be acked.
func (r *subRuntime) settleAckedHeadLocked(ks *keyState) []string {
	var ids []string
	for len(ks.window) > 0 && ks.window[0].state == leaseAcked {
		a := ks.window[0]
		r.forgetLocked(a, true)
		ids = append(ids, a.d.LeaseID)
	}
	return ids
}
