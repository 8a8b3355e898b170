package gcp

import (
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/kubemq-io/kubemq-proxy/delivery"
)

// Ordering keys across a restart, a crash or a backend outage.
//
// While a key's messages are leased, durable copies of them sit in lease
// records (delivery package). When the leases are lost (the process died,
// or KubeMQ was unreachable and the lease table was dropped) those
// messages come back from their records later, and as fresh copies at the
// tail of the queue, behind later messages of the same key that a new
// runtime may already have fetched. Two measures keep a key in order:
//
//   - A recovery hold: a runtime that starts on a subscription created
//     before this process, or that another replica consumed since this
//     process created or last recovered it (delivery.Handle.
//     HeldElsewhereSince), or that lost its leases, holds every keyed
//     message until every lease record written before has come back at
//     least once, so that the engine has reported what it carries. It
//     stores a sentinel record (delivery.Handle.Sentinel) with the
//     records' delay: records of one delay come back in the order they
//     were stored, so the sentinel's return means the earlier ones have
//     returned, however backed up the server's delay machinery is
//     (docs/kubemq.md 9.1). The hold lasts at least RecordDelay+
//     recoverySlack (records written with a longer delay by another
//     configuration), and sentinelGrace beyond the sentinel's return (the
//     real server releases due messages in batches, in no order within
//     one). It ends at the latest after awaitSlack, should the sentinel
//     not come back here (another replica received it on every return, or
//     the server lost it).
//   - Awaited messages: the engine reports each message it finds in a
//     record it cannot settle itself (another owner's: bounced until that
//     lease could have expired; an earlier incarnation's: redelivered at
//     once). The key then waits until that message arrives again, or until
//     it is overdue (awaitSlack after its announced redelivery).
//
// Meanwhile a key's pending messages are kept sorted by publish order
// (publish time, then message id), so the returning ones go first. What
// this cannot repair: a message whose return is later than the hold's cap
// or its await allowance, a record that came back to another replica, and
// a key whose held messages fill the subscription's in-flight ceiling
// before the returning ones are fetched (the engine then stops polling, so
// neither they nor the sentinel can come back: the hold ends at its least
// end, ceilingReachedLocked); these then continue out of order rather than
// stall.
const (
	recoverySlack = 5 * time.Second
	recoveryTick  = 250 * time.Millisecond
	sentinelGrace = time.Second
)

// awaitSlack is how long after its announced redelivery a returning
// message may take to reach this runtime: the engine redelivers it on the
// record's next return (one record delay) and enqueues it at the tail.
func (r *subRuntime) awaitSlack() time.Duration { return r.window + 30*time.Second }

// msgOrder is a message's place in its key: publish time, then id.
type msgOrder struct {
	t  int64 // publish time, Unix ns
	id string
}

func orderOf(tags map[string]string) msgOrder {
	o := msgOrder{id: tags[TagMessageID]}
	if t, err := time.Parse(time.RFC3339Nano, tags[TagPublishTime]); err == nil {
		o.t = t.UnixNano()
	}
	return o
}

// compare orders by publish time, then by id. Ids of one process share a
// fixed-width prefix followed by a counter, so among those a shorter id is
// the earlier one.
func (a msgOrder) compare(b msgOrder) int {
	if a.t != b.t {
		if a.t < b.t {
			return -1
		}
		return 1
	}
	if sameProcess(a.id, b.id) && len(a.id) != len(b.id) {
		if len(a.id) < len(b.id) {
			return -1
		}
		return 1
	}
	return strings.Compare(a.id, b.id)
}

// beginRecoveryLocked holds keyed messages until the lease records written
// before now have come back (see above).
func (r *subRuntime) beginRecoveryLocked(now time.Time) {
	if r.closed {
		return
	}
	r.recoverUntil = now.Add(r.window)
	r.recoverCap = now.Add(r.awaitSlack())
	r.sentinel = r.h.Sentinel() // under mu: it neither blocks nor calls back
	select {                    // the sweep releases the keys when it ends, and waits for the sentinel
	case r.wake <- struct{}{}:
	default:
	}
}

// sentinelBackLocked ends the wait for the sentinel ch, if it is the
// current recovery's.
func (r *subRuntime) sentinelBackLocked(ch <-chan struct{}, now time.Time) {
	if ch == nil || ch != r.sentinel {
		return
	}
	r.sentinel = nil
	if t := now.Add(sentinelGrace); t.After(r.recoverUntil) {
		r.recoverUntil = t
	}
}

// ceilingReachedLocked is called while the recovery's sentinel is out and
// the subscription's in-flight ceiling stops its fetches. When no lease can
// free room by itself (none is out to a client, ready to go out or in a
// retry backoff: every one is held), the engine stops polling and the
// sentinel cannot come back before the cap; the hold then ends at its least
// end instead (the limit the package comment names).
func (r *subRuntime) ceilingReachedLocked() {
	for _, l := range r.leases {
		switch l.state {
		case leaseOut, leaseReady, leaseBackoff:
			return
		}
	}
	r.sentinel = nil
	r.s.log.Warn("ordering recovery: the in-flight ceiling is full of held messages; the hold ends without waiting for earlier lease records",
		zap.String("subscription", r.id), zap.Int("held", len(r.leases)))
}

// recoveryEndLocked is when the recovery hold ends, as far as known now.
func (r *subRuntime) recoveryEndLocked() time.Time {
	if r.sentinel != nil && r.recoverCap.After(r.recoverUntil) {
		return r.recoverCap
	}
	return r.recoverUntil
}

// recoveringLocked reports whether some key may be held.
func (r *subRuntime) recoveringLocked(now time.Time) bool {
	return now.Before(r.recoveryEndLocked().Add(recoveryTick)) || len(r.awaiting) > 0
}

// keyHeldLocked reports whether the key's next message must wait: the
// recovery hold is on, or an earlier message is still on its way back.
// Overdue awaited messages are forgotten here.
func (r *subRuntime) keyHeldLocked(key string, now time.Time) bool {
	if now.Before(r.recoveryEndLocked()) {
		return true
	}
	w, ok := r.awaiting[key]
	if !ok {
		return false // the usual case: no map write per keyed message
	}
	for id, giveUp := range w {
		if now.After(giveUp) {
			delete(w, id)
		}
	}
	if len(w) == 0 {
		delete(r.awaiting, key)
		return false
	}
	return true
}

// admitKeyedLocked files a fresh keyed lease: true when it joins its
// key's window and may be handed out to stream f now; otherwise it waits in
// the key's pending list, in publish order.
func (r *subRuntime) admitKeyedLocked(l *lease, f *flow, now time.Time) bool {
	if w := r.awaiting[l.key]; w != nil {
		delete(w, l.d.Tags[TagMessageID]) // an awaited message is back
	}
	ks := r.keys[l.key]
	if ks == nil {
		ks = &keyState{}
		r.keys[l.key] = ks
	}
	if len(ks.pending) == 0 && ks.admits() && !ks.queued() && ks.takes(f) && !r.keyHeldLocked(l.key, now) {
		ks.window = append(ks.window, l)
		return true
	}
	// Only pending messages are compared, so only they need their order
	// (a time parse): the usual path skips it.
	l.order = orderOf(l.d.Tags)
	l.state = leasePending
	i, _ := slices.BinarySearchFunc(ks.pending, l, func(p, l *lease) int {
		if c := p.order.compare(l.order); c != 0 {
			return c
		}
		return -1 // after equals: arrival order
	})
	ks.pending = slices.Insert(ks.pending, i, l)
	if r.advanceKeyLocked(l.key, ks, now) {
		r.notifyLocked()
	}
	return false
}

// holds reports whether the message o is in the key's window or among its
// pending messages (every keyed lease is in one or the other). pending is
// sorted by publish order, so it is searched, not scanned.
func (ks *keyState) holds(o msgOrder) bool {
	if ks.inWindow(o.id) {
		return true
	}
	_, found := slices.BinarySearchFunc(ks.pending, o, func(p *lease, o msgOrder) int { return p.order.compare(o) })
	return found
}

// releaseKeysLocked admits the pending messages of every key that is no
// longer held.
func (r *subRuntime) releaseKeysLocked(now time.Time) {
	moved := false
	for key, ks := range r.keys {
		if len(ks.pending) > 0 && r.advanceKeyLocked(key, ks, now) {
			moved = true
		}
	}
	for key := range r.awaiting {
		if _, ok := r.keys[key]; !ok {
			r.keyHeldLocked(key, now) // forgets overdue ones
		}
	}
	if moved {
		r.notifyLocked()
	}
}

// unsettled is the engine's report of a keyed message that will come back
// from a lease record (delivery.UnsettledFunc): its key waits for it.
func (r *subRuntime) unsettled(m *delivery.Message, redeliverAt time.Time) {
	key, id := m.Tags[TagOrderingKey], m.Tags[TagMessageID]
	if key == "" || id == "" {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	if ks := r.keys[key]; ks != nil && ks.holds(orderOf(m.Tags)) {
		return // a copy is already here
	}
	w := r.awaiting[key]
	if w == nil {
		w = map[string]time.Time{}
		r.awaiting[key] = w
	}
	w[id] = redeliverAt.Add(r.awaitSlack())
	select { // the sweep watches for the await to end
	case r.wake <- struct{}{}:
	default:
	}
}

// keyMark is a message of a key the engine brought: its id and KubeMQ sequence.
type keyMark struct {
	id  string
	seq uint64
}

// idPrefix is the length of idGen's fixed-width prefix: ids that share it
// come from one process and order by their counter.
const idPrefix = 16

// sameProcess reports whether two message ids were minted by one idGen.
func sameProcess(a, b string) bool {
	return len(a) > idPrefix && len(b) > idPrefix && a[:idPrefix] == b[:idPrefix]
}

// markKey is lastFresh's key: the ordering key and the publishing process
// (id's prefix, a substring: building the key allocates nothing).
type markKey struct{ key, process string }

func markKeyOf(key, id string) markKey {
	if len(id) <= idPrefix {
		return markKey{key: key}
	}
	return markKey{key, id[:idPrefix]}
}

// chainWait bounds how long a key waits for a message that a later one of
// its key names as its previous (TagPrevID) and that KubeMQ has not handed
// out yet (keychain.go).
const chainWait = 2 * time.Second

// clockSkew is how far the clocks of the replica that published a message
// and of the one that holds its subscription may differ for
// awaitPrevLocked to judge by the message's publish time; a larger
// difference can make a key wait chainWait for a message that went out
// before this runtime began.
const clockSkew = 2 * time.Second

// awaitPrevLocked, for a fresh keyed lease l, holds its key back until the
// message l's link names as its previous arrives, when this runtime has
// not seen that one and should have: KubeMQ handed out a later send first
// (docs/kubemq.md 10.6). It should have when it has seen earlier messages
// of the key from that process, or, having seen none, when l was published
// more than chainSpan plus clockSkew after the runtime began to see every
// fresh message (marksFrom): the publisher names only a message stored
// within chainSpan before (keychain.go), so that one was stored after this
// runtime took the subscription and can have come through no other. A key
// first seen sooner after a start or a takeover cannot tell, and waits for
// nothing (what the recovery hold sorts is then its protection).
func (r *subRuntime) awaitPrevLocked(l *lease, now time.Time) {
	prev, id := l.d.Tags[TagPrevID], l.d.Tags[TagMessageID]
	if !sameProcess(prev, id) {
		return
	}
	last, ok := r.lastFresh[markKeyOf(l.key, id)]
	switch {
	case ok && (msgOrder{id: last.id}).compare(msgOrder{id: prev}) >= 0:
		return // prev came already
	case !ok && orderOf(l.d.Tags).t <= r.marksFrom.Add(chainSpan+clockSkew).UnixNano():
		return // prev may have gone out before this runtime began
	}
	if ks := r.keys[l.key]; ks != nil && ks.holdsID(prev) {
		return
	}
	w := r.awaiting[l.key]
	if w == nil {
		w = map[string]time.Time{}
		r.awaiting[l.key] = w
	}
	if _, ok := w[prev]; !ok {
		w[prev] = now.Add(chainWait)
		if r.chainWaits++; r.chainWaits <= 10 {
			r.s.log.Warn("ordering key: KubeMQ handed out a message before the one published ahead of it; the key waits for that one",
				zap.String("subscription", r.id), zap.String("key", l.key), zap.String("message_id", id),
				zap.Uint64("sequence", l.d.Sequence), zap.String("waiting_for", prev), zap.Duration("at_most", chainWait))
		}
	}
	select { // the sweep watches for the await to end
	case r.wake <- struct{}{}:
	default:
	}
}

// holdsID is holds for a message whose publish time is unknown: pending is
// scanned (only awaitPrevLocked asks, rarely).
func (ks *keyState) holdsID(id string) bool {
	if ks.inWindow(id) {
		return true
	}
	for _, p := range ks.pending {
		if p.d.Tags[TagMessageID] == id {
			return true
		}
	}
	return false
}

// inWindow reports whether the message id is in the key's window.
func (ks *keyState) inWindow(id string) bool {
	for _, w := range ks.window {
		if w.d.Tags[TagMessageID] == id {
			return true
		}
	}
	return false
}

// maxKeyMarks bounds lastFresh: past it the marks start over.
const maxKeyMarks = 10_000

// checkKeyOrderLocked logs a key's first delivery that the engine brought after a later
// message of the key published through the same replica (ids of one process order by
// publish): KubeMQ handed the queue out in another order than it was stored. The first ten
// per runtime are logged, with held: whether the key was waiting then (awaitPrevLocked), so
// that its later messages wait behind this one and the subscriber gets the key in order; if
// not, the later one may have gone out already.
func (r *subRuntime) checkKeyOrderLocked(l *lease) {
	id := l.d.Tags[TagMessageID]
	mk := markKeyOf(l.key, id)
	last, ok := r.lastFresh[mk]
	if ok && sameProcess(id, last.id) && (msgOrder{id: id}).compare(msgOrder{id: last.id}) < 0 {
		held := len(r.awaiting[l.key]) > 0 // the later ones wait in pending, sorted behind it
		if r.orderWarnings < 10 {
			r.orderWarnings++
			r.s.log.Warn("ordering key: KubeMQ handed out a message after a later one of its key", zap.String("subscription", r.id),
				zap.String("key", l.key), zap.String("message_id", id), zap.Uint64("sequence", l.d.Sequence),
				zap.String("after_message_id", last.id), zap.Uint64("after_sequence", last.seq), zap.Bool("held", held))
		}
		return
	}
	if r.lastFresh == nil || len(r.lastFresh) >= maxKeyMarks {
		if r.lastFresh != nil {
			r.marksFrom = time.Now() // what was seen before is forgotten
		}
		r.lastFresh = map[markKey]keyMark{}
	}
	r.lastFresh[mk] = keyMark{id: id, seq: l.d.Sequence}
}
