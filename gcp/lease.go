package gcp

import (
	"container/heap"
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/kubemq-io/kubemq-proxy/delivery"
	"github.com/kubemq-io/kubemq-proxy/gcp/limits"
	"github.com/kubemq-io/kubemq-proxy/gcp/names"
)

// Ack ids are "<engine lease id>.<generation>". The engine mints a lease
// per delivery copy; the generation counts this package's own re-deliveries
// of the same lease (ordered keys redeliver in place), so an ack or modack
// that names an earlier generation, a settled lease or a lease of a dead
// process matches nothing and is a no-op (so a nack followed by a late
// receipt modack cannot re-lease the message).
func ackID(leaseID string, gen uint32) string {
	return leaseID + "." + strconv.FormatUint(uint64(gen), 10)
}

func parseAckID(id string) (leaseID string, gen uint32, ok bool) {
	i := strings.LastIndexByte(id, '.')
	if i <= 0 {
		return "", 0, false
	}
	g, err := strconv.ParseUint(id[i+1:], 10, 32)
	if err != nil {
		return "", 0, false
	}
	return id[:i], uint32(g), true
}

type leaseState uint8

const (
	leaseOut        leaseState = iota + 1 // handed to a client, deadline running
	leasePending                          // ordered: waits behind earlier messages of its key
	leaseBackoff                          // ordered: failed, waiting out its retry backoff
	leaseReady                            // ordered: may be handed out (again)
	leaseAcked                            // ordered: acked, settled once every earlier message of its key is
	leaseDeadLetter                       // out of attempts: being forwarded to the dead-letter topic
)

// lease is this package's view of one engine delivery. Owned by
// subRuntime.mu.
type lease struct {
	d        *delivery.Delivery
	gen      uint32
	attempt  int // delivery attempt of the current hand-out
	state    leaseState
	deadline time.Time // out: ack deadline; backoff: end of the backoff
	flow     *flow     // the stream holding it (flow control); nil for Pull
	bytes    int64
	key      string // ordering key; "" = unordered
	order    msgOrder
	hidx     int // index in subRuntime.heap; -1 when not in it
}

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

// maxKeyWindow bounds a key's window: the redeliveries one failure can
// cause.
const maxKeyWindow = 1000

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

var (
	errSubGone       = errors.New("subscription deleted or detached")
	errRuntimeClosed = errors.New("subscription runtime closed")
)

// subRuntime is one subscription's delivery state on this replica: a
// delivery.Handle on the subscription's queue (engine deadlines off: this
// type runs the ack deadlines so that expiry can honour the retry policy and
// the dead-letter policy) and the table of leases out to clients.
type subRuntime struct {
	s     *Server
	id    string
	uid   string
	h     *delivery.Handle
	start time.Time

	// Metrics of this subscription (its label is bounded by metrics.sub).
	delivered, deliveredBytes, acked, nacked, expired prometheus.Counter
	deadLettered, dlFailed                            prometheus.Counter

	mu      sync.Mutex // guards everything below
	leases  map[string]*lease
	heap    leaseHeap
	keys    map[string]*keyState // ordered subscriptions only
	ready   []*lease             // ordered: messages to hand out (again), in order
	ordered bool                 // enable_message_ordering (immutable)
	// Ordering recovery (ordering.go): keyed messages wait until
	// recoverUntil, while the recovery's sentinel is out (at most until
	// recoverCap), and while an earlier message of their key is known to be
	// on its way back from a lease record.
	recoverUntil time.Time
	recoverCap   time.Time
	sentinel     <-chan struct{}                 // nil once back (or when no recovery ran)
	awaiting     map[string]map[string]time.Time // key -> message id -> give up at
	window       time.Duration                   // least recovery hold after a (re)start
	// users and lastUsed are guarded by s.rtMu (see Server.runtime).
	users    int
	lastUsed time.Time
	changed  chan struct{} // closed and replaced when room or ready work appears
	closed   bool
	endErr   error         // what fetch reports once closed (errRuntimeClosed unless end says)
	hold     time.Duration // the engine hold last set on h
	timer    *time.Timer
	wake     chan struct{} // cap 1: the earliest deadline moved
	fetchSem chan struct{} // cap 1: ordered: the one fetch taking from the engine
	eod      eodAcks       // exactly-once: message ids acked lately (eod.go)

	done chan struct{}
	wg   sync.WaitGroup
}

func newSubRuntime(s *Server, e *subEntry, h *delivery.Handle) *subRuntime {
	label := s.m.sub(e.id)
	r := &subRuntime{
		s: s, id: e.id, uid: e.uid, h: h, start: time.Now(), lastUsed: time.Now(),
		delivered:      s.m.delivered.WithLabelValues(label),
		deliveredBytes: s.m.deliveredBytes.WithLabelValues(label),
		acked:          s.m.acked.WithLabelValues(label),
		nacked:         s.m.nacked.WithLabelValues(label),
		expired:        s.m.expired.WithLabelValues(label),
		deadLettered:   s.m.deadLettered.WithLabelValues(label),
		dlFailed:       s.m.dlFailed.WithLabelValues(label),
		leases:         map[string]*lease{},
		keys:           map[string]*keyState{},
		ordered:        e.proto.GetEnableMessageOrdering(),
		awaiting:       map[string]map[string]time.Time{},
		window:         h.RecordDelay() + recoverySlack,
		changed:        make(chan struct{}),
		wake:           make(chan struct{}, 1),
		fetchSem:       make(chan struct{}, 1),
		done:           make(chan struct{}),
	}
	r.wg.Add(1)
	go r.sweep()
	return r
}

// entry is the subscription's current settings (they may be updated while
// it runs); nil when it is gone.
func (r *subRuntime) entry() *subEntry {
	e, ok := r.s.cat.sub(r.id)
	if !ok || e.uid != r.uid {
		return nil
	}
	return e
}

func (r *subRuntime) notifyLocked() {
	close(r.changed)
	r.changed = make(chan struct{})
}

// fetch hands out up to max messages, waiting until at least one is
// available or ctx ends. f (may be nil) is charged for them; deadline is
// the ack deadline they get.
func (r *subRuntime) fetch(ctx context.Context, max int, f *flow, deadline time.Duration) ([]*pubsubpb.ReceivedMessage, error) {
	for {
		e := r.entry()
		if e == nil || e.proto.GetDetached() {
			return nil, errSubGone
		}
		r.mu.Lock()
		if r.closed {
			err := r.endErr
			r.mu.Unlock()
			if err == nil {
				err = errRuntimeClosed
			}
			return nil, err
		}
		if r.s.draining.Load() {
			// Shutting down: nothing new goes out; the stream stays open for the settlements
			// of what is out until the server stops.
			changed := r.changed
			r.mu.Unlock()
			select {
			case <-changed:
				continue
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		if out, ids := r.handReadyLocked(e, max, f, deadline); len(out) > 0 {
			r.mu.Unlock()
			// Redelivered in place: the lease records promise the new deadline.
			r.h.Hold(time.Now().Add(deadline), ids...)
			return out, nil
		}
		room := min(max, r.s.cfg.MaxInflightPerSubscription-len(r.leases))
		if room <= 0 && r.sentinel != nil {
			r.ceilingReachedLocked()
		}
		changed := r.changed
		setHold := r.hold != deadline
		r.hold = deadline
		r.mu.Unlock()
		if setHold {
			// Records of messages fetched from now on carry the ack deadline,
			// so a crash redelivers them after it (not after HoldExpiry).
			r.h.SetHold(deadline)
		}
		if room <= 0 {
			// The in-flight ceiling: the tail stays in KubeMQ until
			// something is settled.
			select {
			case <-changed:
				continue
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		ordered := e.proto.GetEnableMessageOrdering()
		if err := r.loadAcked(ctx, e); err != nil { // exactly-once (eod.go)
			return nil, err
		}
		if ordered {
			// One fetch at a time takes an ordered subscription's messages
			// from the engine and files them: two fetches filing their
			// shares of one engine hand-out in either order (or one giving
			// its surplus back while the other takes what follows it)
			// would let a key's later message go out before an earlier one.
			select {
			case r.fetchSem <- struct{}{}:
			case <-changed:
				continue // ready work may be this fetch's
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		release := func() {
			if ordered {
				<-r.fetchSem
			}
		}
		fctx, cancel := context.WithCancel(ctx)
		if ordered {
			// A message that became ready to go out must not wait behind
			// a Fetch that waits for new messages.
			go func() {
				select {
				case <-changed:
					cancel()
				case <-fctx.Done():
				}
			}()
		}
		ds, err := r.h.Fetch(fctx, room)
		cancel()
		if err == nil {
			ds = r.dropAcked(e, ds) // exactly-once (eod.go)
		}
		if err != nil {
			release()
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			if errors.Is(err, context.Canceled) {
				continue // woken for ready work
			}
			if errors.Is(err, delivery.ErrClosed) && r.isClosed() {
				continue // the runtime ended (seek, delete, shutdown): the loop says why
			}
			if errors.Is(err, delivery.ErrLeasesLost) {
				r.reset()
			}
			if errors.Is(err, delivery.ErrHandedOver) {
				r.s.handedOver(r)
			}
			return nil, err
		}
		r.mu.Lock()
		// Concurrent fetches of one subscription (its streams and Pulls)
		// each sized their Fetch from the same free room; what would pass
		// the ceiling goes back to the engine untouched (no attempt counted).
		var surplus []*delivery.Delivery
		if free := r.s.cfg.MaxInflightPerSubscription - len(r.leases); len(ds) > free {
			if free < 0 {
				free = 0
			}
			ds, surplus = ds[:free], ds[free:]
		}
		out := r.acceptLocked(e, ds, f, deadline)
		r.mu.Unlock()
		if len(surplus) > 0 {
			r.h.Unfetch(surplus...)
		}
		release()
		if len(out) > 0 {
			return out, nil
		}
	}
}

// acceptLocked turns fresh engine deliveries into leases: handed out now,
// or queued behind an earlier message of their ordering key.
func (r *subRuntime) acceptLocked(e *subEntry, ds []*delivery.Delivery, f *flow, deadline time.Duration) []*pubsubpb.ReceivedMessage {
	ordered := e.proto.GetEnableMessageOrdering()
	now := time.Now()
	var out []*pubsubpb.ReceivedMessage
	for _, d := range ds {
		l := &lease{d: d, attempt: d.Attempt, hidx: -1, bytes: int64(len(d.Body))}
		for k, v := range d.Tags {
			l.bytes += int64(len(k) + len(v))
		}
		if ordered {
			l.key = d.Tags[TagOrderingKey]
		}
		r.leases[d.LeaseID] = l
		if l.key != "" && !r.admitKeyedLocked(l, f, now) {
			continue // waits behind earlier messages of its key, or for the key's recovery
		}
		out = append(out, r.handOutLocked(e, l, f, deadline, now))
	}
	return out
}

// handReadyLocked hands out ordered messages that are ready to go out
// (again) to stream f, in order, skipping keys whose messages are out on
// another stream, and returns their engine lease ids.
func (r *subRuntime) handReadyLocked(e *subEntry, max int, f *flow, deadline time.Duration) ([]*pubsubpb.ReceivedMessage, []string) {
	if len(r.ready) == 0 {
		return nil, nil
	}
	now := time.Now()
	var out []*pubsubpb.ReceivedMessage
	var ids []string
	keep := r.ready[:0] // in place: keep never passes the entry being read
	for i, l := range r.ready {
		if len(out) == max {
			keep = append(keep, r.ready[i:]...)
			break
		}
		if ks := r.keys[l.key]; ks != nil && !ks.takes(f) {
			keep = append(keep, l)
			continue
		}
		out = append(out, r.handOutLocked(e, l, f, deadline, now))
		ids = append(ids, l.d.LeaseID)
	}
	clear(r.ready[len(keep):])
	r.ready = keep
	return out, ids
}

func (r *subRuntime) handOutLocked(e *subEntry, l *lease, f *flow, deadline time.Duration, now time.Time) *pubsubpb.ReceivedMessage {
	r.delivered.Inc()
	r.deliveredBytes.Add(float64(l.bytes))
	l.gen++
	l.state = leaseOut
	l.flow = f
	f.take(l)
	if l.key != "" {
		if ks := r.keys[l.key]; ks != nil {
			ks.out++
			ks.owner = f
		}
	}
	r.setDeadlineLocked(l, now.Add(deadline))
	rm := &pubsubpb.ReceivedMessage{
		AckId:   ackID(l.d.LeaseID, l.gen),
		Message: decodeMessage(l.d.Body, l.d.Tags, l.d.MessageID, l.d.StoredAt, now),
	}
	if e.proto.GetDeadLetterPolicy() != nil {
		rm.DeliveryAttempt = int32(l.attempt)
	}
	return rm
}

func (r *subRuntime) setDeadlineLocked(l *lease, t time.Time) {
	l.deadline = t
	if l.hidx >= 0 {
		heap.Fix(&r.heap, l.hidx)
	} else {
		heap.Push(&r.heap, l)
	}
	if r.heap[0] == l {
		select {
		case r.wake <- struct{}{}:
		default:
		}
	}
}

func (r *subRuntime) unheapLocked(l *lease) {
	if l.hidx >= 0 {
		heap.Remove(&r.heap, l.hidx)
	}
}

// lookupLocked finds the lease an ack id names, if it is out under that
// generation.
func (r *subRuntime) lookupLocked(id string) *lease {
	lid, gen, ok := parseAckID(id)
	if !ok {
		return nil
	}
	l := r.leases[lid]
	if l == nil || l.gen != gen || l.state != leaseOut {
		return nil
	}
	return l
}

// leaveOutLocked is called before an ordered lease that is out changes
// state: its key's count of out messages, and the key's stream.
func (r *subRuntime) leaveOutLocked(l *lease) {
	if l.key == "" || l.state != leaseOut {
		return
	}
	if ks := r.keys[l.key]; ks != nil {
		ks.out--
		if ks.out == 0 {
			ks.owner = nil
		}
	}
}

// forgetLocked removes a settled lease and lets its key move on. heard
// is true when the client settled it (ack, nack), false when it expired.
func (r *subRuntime) forgetLocked(l *lease, heard bool) {
	r.leaveOutLocked(l)
	r.unheapLocked(l)
	delete(r.leases, l.d.LeaseID)
	l.flow.release(l, heard)
	l.flow = nil
	if l.key != "" {
		if ks := r.keys[l.key]; ks != nil {
			switch i := ks.index(l); {
			case i == 0:
				ks.window[0] = nil
				ks.window = ks.window[1:]
			case i > 0:
				ks.window = slices.Delete(ks.window, i, i+1)
			}
			r.advanceKeyLocked(l.key, ks, time.Now())
		}
	}
	if len(r.leases) == 0 {
		select { // the sweep starts timing the idle runtime
		case r.wake <- struct{}{}:
		default:
		}
	}
	r.notifyLocked()
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

// ack settles ack ids; unknown and stale ones are ignored (plain
// subscriptions, as Google: acking an expired id "may succeed"). An
// ordered message acked while an earlier one of its key is unsettled is
// held, and settled with the earlier ones.
func (r *subRuntime) ack(ids []string) { r.settleAcks(ids, false) }

// settleAcks is ack; strict (exactly-once, eod.go) also refuses leases
// whose deadline has passed, and reports the ids that settled nothing and,
// for those acked, "{ack id} {message id}".
func (r *subRuntime) settleAcks(ids []string, strict bool) (missed, acked []string) {
	settled := make([]string, 0, len(ids))
	n := 0
	now := time.Now()
	r.mu.Lock()
	for _, id := range ids {
		l := r.lookupLocked(id)
		if l == nil || strict && !now.Before(l.deadline) {
			if strict {
				missed = append(missed, id)
			}
			continue
		}
		n++
		if strict {
			acked = append(acked, id+" "+pubsubID(l.d))
		}
		var ks *keyState
		if l.key != "" {
			ks = r.keys[l.key]
		}
		if ks != nil && ks.index(l) > 0 {
			r.leaveOutLocked(l)
			r.unheapLocked(l)
			l.flow.release(l, true)
			l.flow = nil
			l.state = leaseAcked
			continue
		}
		r.forgetLocked(l, true)
		settled = append(settled, l.d.LeaseID)
		if ks != nil {
			settled = append(settled, r.settleAckedHeadLocked(ks)...)
		}
	}
	r.mu.Unlock()
	if len(settled) > 0 {
		r.h.Ack(settled...)
	}
	if n > 0 {
		r.acked.Add(float64(n))
	}
	return missed, acked
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

// modack extends deadlines (seconds > 0) or nacks (0).
func (r *subRuntime) modack(ids []string, seconds int32) { r.modackLeases(ids, seconds, false) }

// modackLeases is modack; strict (exactly-once, eod.go) also refuses
// leases whose deadline has passed, and reports the ids that matched
// nothing.
func (r *subRuntime) modackLeases(ids []string, seconds int32, strict bool) (missed []string) {
	now := time.Now()
	live := func(id string) *lease {
		l := r.lookupLocked(id)
		if l == nil || strict && !now.Before(l.deadline) {
			if strict {
				missed = append(missed, id)
			}
			return nil
		}
		return l
	}
	if seconds == 0 {
		r.mu.Lock()
		var failed []failure
		for _, id := range ids {
			if l := live(id); l != nil {
				failed = append(failed, failure{l, l.gen})
			}
		}
		r.mu.Unlock()
		r.nacked.Add(float64(len(failed)))
		r.fail(failed, false)
		return missed
	}
	t := now.Add(time.Duration(seconds) * time.Second)
	held := make([]string, 0, len(ids))
	r.mu.Lock()
	for _, id := range ids {
		if l := live(id); l != nil {
			r.setDeadlineLocked(l, t)
			held = append(held, l.d.LeaseID)
		}
	}
	r.mu.Unlock()
	if len(held) > 0 {
		r.h.Hold(t, held...)
	}
	return missed
}

// backoff is the retry policy's delay after a failed attempt: exponential
// from minimum_backoff, clamped to maximum_backoff; 0 without a policy
// (redeliver at once).
func backoff(e *subEntry, attempt int) time.Duration {
	b, ok, err := limits.RetryPolicy(e.proto.GetRetryPolicy())
	if !ok || err != nil {
		return 0
	}
	d := b.Min
	for i := 1; i < attempt && d < b.Max; i++ {
		d *= 2
		if d <= 0 {
			d = b.Max
		}
	}
	return min(d, b.Max)
}

// failure names one hand-out of a lease (its generation) whose attempt
// failed.
type failure struct {
	l   *lease
	gen uint32
}

// fail handles hand-outs whose attempt failed (nack or expiry): dead-letter
// after the last attempt, otherwise redeliver after the retry backoff.
// Each is re-checked under the lock, since an ack, a modack or a newer
// hand-out of the same lease (after its key was rewound) may have raced
// in. An ordered key's failures are taken in its order: the earliest
// rewinds the later ones, which then go out again rather than fail.
func (r *subRuntime) fail(fs []failure, expired bool) {
	if len(fs) == 0 {
		return
	}
	e := r.entry()
	if e == nil {
		return // gone: its queue is purged, nothing to redeliver
	}
	var dead []*lease
	type nack struct {
		id    string
		delay time.Duration
	}
	var nacks []nack
	var holds []nack     // ordered messages waiting out a backoff in place
	var settled []string // acked messages that waited only for a dead-lettered one
	now := time.Now()
	r.mu.Lock()
	r.sortFailuresLocked(fs)
	for _, fl := range fs {
		l := fl.l
		if r.leases[l.d.LeaseID] != l || l.state != leaseOut || l.gen != fl.gen || (expired && l.deadline.After(now)) {
			continue
		}
		var ks *keyState
		if l.key != "" {
			ks = r.keys[l.key]
		}
		r.leaveOutLocked(l)
		if max := maxAttempts(e); max > 0 && l.attempt >= max {
			// Taken out of circulation, and out of its key's window: the
			// key's later messages go on as they are, since it will not
			// come again. Forgotten once the dead-letter copy is stored.
			r.unheapLocked(l)
			l.state = leaseDeadLetter
			l.flow.release(l, !expired)
			l.flow = nil
			if ks != nil {
				if i := ks.index(l); i >= 0 {
					ks.window = slices.Delete(ks.window, i, i+1)
				}
				settled = append(settled, r.settleAckedHeadLocked(ks)...)
				r.advanceKeyLocked(l.key, ks, now)
				r.notifyLocked()
			}
			dead = append(dead, l)
			continue
		}
		delay := backoff(e, l.attempt)
		if ks != nil {
			// Ordered: redeliver in place; its key's later messages that
			// went out go out again after it.
			r.rewindKeyLocked(ks, l)
			l.flow.release(l, !expired)
			l.flow = nil
			l.attempt++
			l.gen++ // the failed hand-out's ack id is now stale
			if delay <= 0 {
				r.unheapLocked(l)
				l.state = leaseReady
				r.ready = append([]*lease{l}, r.ready...)
				r.advanceKeyLocked(l.key, ks, now)
				r.notifyLocked()
			} else {
				l.state = leaseBackoff
				r.setDeadlineLocked(l, now.Add(delay))
				holds = append(holds, nack{l.d.LeaseID, delay})
			}
			continue
		}
		r.forgetLocked(l, !expired)
		nacks = append(nacks, nack{l.d.LeaseID, delay})
	}
	r.mu.Unlock()
	if len(settled) > 0 {
		r.h.Ack(settled...)
	}
	for _, n := range nacks {
		r.h.Nack(n.id, n.delay)
	}
	for _, h := range holds {
		r.h.Hold(now.Add(h.delay), h.id)
	}
	if len(dead) > 0 {
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			r.deadLetter(e, dead, 0)
		}()
	}
}

// sortFailuresLocked puts the failures of each ordering key in the order
// of its window (publish order): dead-lettered messages of a key reach the
// dead-letter topic in order, and when the earliest failure is redelivered
// the later ones of its key are rewound behind it rather than failed.
func (r *subRuntime) sortFailuresLocked(fs []failure) {
	if len(fs) < 2 || !r.ordered {
		return
	}
	// Window positions, one pass per key (a whole window may expire at once).
	pos := map[*lease]int{}
	for _, f := range fs {
		if ks := r.keys[f.l.key]; ks != nil && f.l.key != "" && len(ks.window) > 0 {
			if _, done := pos[ks.window[0]]; !done {
				for i, w := range ks.window {
					pos[w] = i
				}
			}
		}
	}
	at := func(l *lease) int {
		if i, ok := pos[l]; ok {
			return i
		}
		return -1
	}
	slices.SortStableFunc(fs, func(a, b failure) int {
		if c := strings.Compare(a.l.key, b.l.key); c != 0 {
			return c
		}
		return at(a.l) - at(b.l)
	})
}

// maxAttempts is the dead-letter policy's limit, 0 without a policy.
func maxAttempts(e *subEntry) int {
	n, ok, err := limits.DeadLetterAttempts(e.proto.GetDeadLetterPolicy())
	if !ok || err != nil {
		return 0
	}
	return int(n)
}

// Attributes Google stamps on dead-lettered copies.
const (
	attrDLSourceSubscription        = "CloudPubSubDeadLetterSourceSubscription"
	attrDLSourceSubscriptionProject = "CloudPubSubDeadLetterSourceSubscriptionProject"
	attrDLSourceDeliveryCount       = "CloudPubSubDeadLetterSourceDeliveryCount"
	attrDLSourceTopicPublishTime    = "CloudPubSubDeadLetterSourceTopicPublishTime"
)

// deadLetter republishes each message to the dead-letter topic through the
// normal publish path, then acks the original. When that is impossible
// (topic gone, backend down) the message is never dropped:
//   - on an ordered subscription it stays out of circulation and
//     dead-lettering is tried again after a backoff (tries counts the
//     failures so far), as its key's later messages have gone on without
//     it: delivering it again would put it behind them. Its lease record
//     keeps it durable meanwhile. Should the subscription lose its
//     dead-letter policy, it is delivered again;
//   - otherwise it is delivered again, and dead-lettered when that fails.
func (r *subRuntime) deadLetter(e *subEntry, ls []*lease, tries int) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sn, _ := names.ParseSubscription(e.proto.GetName())
	var err error
	var t *topicEntry
	if tn, perr := names.ParseTopic(e.proto.GetDeadLetterPolicy().GetDeadLetterTopic()); perr != nil {
		err = perr
	} else if te, ok := r.s.cat.topic(tn.ID); !ok {
		err = notFound(tn.ID)
	} else {
		t = te
	}
	if err == nil {
		msgs := make([]*pubsubpb.PubsubMessage, len(ls))
		for i, l := range ls {
			m := decodeMessage(l.d.Body, l.d.Tags, l.d.MessageID, l.d.StoredAt, time.Now())
			attrs := make(map[string]string, len(m.Attributes)+4)
			for k, v := range m.Attributes {
				attrs[k] = v
			}
			attrs[attrDLSourceSubscription] = sn.String()
			attrs[attrDLSourceSubscriptionProject] = sn.Project
			attrs[attrDLSourceDeliveryCount] = strconv.Itoa(l.attempt)
			if m.PublishTime != nil {
				attrs[attrDLSourceTopicPublishTime] = m.PublishTime.AsTime().UTC().Format(time.RFC3339Nano)
			}
			msgs[i] = &pubsubpb.PubsubMessage{Data: m.Data, Attributes: attrs, OrderingKey: m.OrderingKey}
		}
		_, err = r.s.publish(ctx, t, msgs)
	}
	if err != nil {
		r.dlFailed.Add(float64(len(ls)))
	}
	r.mu.Lock()
	if err != nil && r.ordered && !r.closed && e.proto.GetDeadLetterPolicy() != nil {
		var keep []*lease // those a reset (backend outage) has not dropped
		for _, l := range ls {
			if r.leases[l.d.LeaseID] == l {
				keep = append(keep, l)
			}
		}
		r.mu.Unlock()
		if len(keep) > 0 {
			r.deadLetterLater(keep, tries, err)
		}
		return
	}
	ids := make([]string, 0, len(ls))
	for _, l := range ls {
		ids = append(ids, l.d.LeaseID)
		if r.leases[l.d.LeaseID] == l {
			r.forgetLocked(l, false)
		}
	}
	r.mu.Unlock()
	if err != nil {
		r.s.log.Warn("dead-lettering failed; the messages are redelivered", zap.String("subscription", r.id), zap.Error(err))
		for _, id := range ids {
			r.h.Nack(id, 0)
		}
		return
	}
	r.deadLettered.Add(float64(len(ls)))
	r.h.Ack(ids...)
}

// deadLetterLater tries dead-lettering ls again after a backoff that
// grows with tries (1 s doubling to 1 min), unless the runtime closes
// first (its leases were then released or settled). Called from a
// deadLetter call, whose own count holds r.wg open for the Add.
func (r *subRuntime) deadLetterLater(ls []*lease, tries int, cause error) {
	delay := min(time.Second<<min(tries, 6), time.Minute)
	r.s.log.Warn("dead-lettering failed; tried again later", zap.String("subscription", r.id),
		zap.Int("messages", len(ls)), zap.Duration("in", delay), zap.Error(cause))
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		t := time.NewTimer(delay)
		defer t.Stop()
		select {
		case <-r.done:
			return
		case <-t.C:
		}
		if e := r.entry(); e != nil {
			r.deadLetter(e, ls, tries+1)
		}
	}()
}

// sweep expires ack deadlines and ends ordered backoffs.
func (r *subRuntime) sweep() {
	defer r.wg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		r.mu.Lock()
		sentinel := r.sentinel
		var expired []failure
		now := time.Now()
		for len(r.heap) > 0 && !r.heap[0].deadline.After(now) {
			l := heap.Pop(&r.heap).(*lease)
			switch l.state {
			case leaseOut:
				expired = append(expired, failure{l, l.gen})
			case leaseBackoff:
				l.state = leaseReady
				r.ready = append(r.ready, l)
				if ks := r.keys[l.key]; ks != nil {
					r.advanceKeyLocked(l.key, ks, now) // its key's later messages follow it
				}
				r.notifyLocked()
			}
		}
		next := time.Hour
		if len(r.heap) > 0 {
			next = time.Until(r.heap[0].deadline)
		}
		if r.recoveringLocked(now) {
			r.releaseKeysLocked(now)
			next = min(next, recoveryTick)
		}
		idle := len(r.leases) == 0
		r.mu.Unlock()
		if idle {
			r.s.retireIdle(r, now)
			next = min(next, r.s.cfg.RuntimeIdle/4)
		}
		// Expired leases were popped; fail wants them out, so they go
		// through it with a fresh look under the lock.
		if len(expired) > 0 {
			r.expired.Add(float64(len(expired)))
			r.fail(expired, true)
		}
		timer.Reset(next)
		select {
		case <-r.done:
			return
		case <-r.wake:
			if !timer.Stop() {
				<-timer.C
			}
		case <-sentinel:
			if !timer.Stop() {
				<-timer.C
			}
			r.mu.Lock()
			r.sentinelBackLocked(sentinel, time.Now())
			r.mu.Unlock()
		case <-timer.C:
		}
	}
}

// reset drops every lease after the engine lost them (backend outage):
// their lease records bring the messages back; outstanding ack ids die.
func (r *subRuntime) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, l := range r.leases {
		l.flow.release(l, false)
	}
	r.leases = map[string]*lease{}
	r.heap = nil
	r.keys = map[string]*keyState{}
	r.ready = nil
	if r.ordered {
		// The dropped leases come back from their records, behind
		// whatever is fetched meanwhile.
		r.beginRecoveryLocked(time.Now())
	}
	r.notifyLocked()
}

func (r *subRuntime) isClosed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.closed
}

// end closes r, taken out of s.runtimes, settling its leases as consumed;
// its fetches report err.
func (r *subRuntime) end(err error) {
	r.mu.Lock()
	if r.endErr == nil {
		r.endErr = err
	}
	r.mu.Unlock()
	r.close(true)
}

// close stops the runtime. drop settles every lease as consumed (the
// subscription is deleted, detached or seeked); otherwise leases go back
// to the queue for redelivery.
func (r *subRuntime) close(drop bool) {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	r.closed = true
	ids := make([]string, 0, len(r.leases))
	for id := range r.leases {
		ids = append(ids, id)
	}
	r.leases = map[string]*lease{}
	r.heap = nil
	r.notifyLocked()
	r.mu.Unlock()
	close(r.done)
	r.wg.Wait()
	if drop {
		r.h.Ack(ids...)
	} else {
		r.h.Release(ids...)
	}
	r.h.Close()
}

// leaseHeap orders leases by deadline.
type leaseHeap []*lease

func (h leaseHeap) Len() int           { return len(h) }
func (h leaseHeap) Less(i, j int) bool { return h[i].deadline.Before(h[j].deadline) }
func (h leaseHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].hidx = i
	h[j].hidx = j
}
func (h *leaseHeap) Push(x any) {
	l := x.(*lease)
	l.hidx = len(*h)
	*h = append(*h, l)
}
func (h *leaseHeap) Pop() any {
	old := *h
	l := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	l.hidx = -1
	return l
}
