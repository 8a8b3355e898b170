package gcp

import (
	"container/heap"
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/kubemq-io/kubemq-proxy/delivery"
)

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

// maxKeyWindow bounds a key's window: the redeliveries one failure can
// cause.
const maxKeyWindow = 1000

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
	// lastFresh is the latest first delivery the engine brought per key (bounded; ordering.go
	// checkKeyOrderLocked), orderWarnings how many times one came after a later one.
	lastFresh map[markKey]keyMark
	// marksFrom: lastFresh holds every first delivery since (the runtime's start, or the
	// last time lastFresh started over).
	marksFrom     time.Time
	chainWaits    int // how many times a key waited for a message KubeMQ handed out late
	orderWarnings int
	sentinel      <-chan struct{}                 // nil once back (or when no recovery ran)
	awaiting      map[string]map[string]time.Time // key -> message id -> give up at
	window        time.Duration                   // least recovery hold after a (re)start
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
		s: s, id: e.id, uid: e.uid, h: h, start: time.Now(), marksFrom: time.Now(), lastUsed: time.Now(),
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
			if l.key != "" && d.Attempt <= 1 {
				r.awaitPrevLocked(l, now)
				r.checkKeyOrderLocked(l)
			}
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
	if l.gen == 0 && l.d.Attempt <= 1 && !l.d.StoredAt.IsZero() {
		r.s.m.deliveryLatency.Observe(max(now.Sub(l.d.StoredAt), 0).Seconds())
	}
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

// ack settles ack ids; unknown and stale ones are ignored (plain
// subscriptions, as Google: acking an expired id "may succeed"). An
// ordered message acked while an earlier one of its key is unsettled is
// held, and settled with the earlier ones.
func (r *subRuntime) ack(ids []string) { r.settleAcks(ids, false) }

// settleAcks is ack; strict (exactly-once, eod.go) also refuses leases
// whose deadline has passed, and reports the ids that settled nothing,
// for those acked "{ack id} {message id}", and the ack ids of those acked
// ahead of an earlier message of their ordering key (held until it is
// settled).
func (r *subRuntime) settleAcks(ids []string, strict bool) (missed, acked, unordered []string) {
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
			if strict {
				unordered = append(unordered, id)
			}
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
	return missed, acked, unordered
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

// Attributes Google stamps on dead-lettered copies.
const (
	attrDLSourceSubscription        = "CloudPubSubDeadLetterSourceSubscription"
	attrDLSourceSubscriptionProject = "CloudPubSubDeadLetterSourceSubscriptionProject"
	attrDLSourceDeliveryCount       = "CloudPubSubDeadLetterSourceDeliveryCount"
	attrDLSourceTopicPublishTime    = "CloudPubSubDeadLetterSourceTopicPublishTime"
)

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
