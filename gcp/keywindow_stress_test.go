package gcp_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
)

// stressSeedEnv repeats a run of TestOrderedRandomSettlement.
const stressSeedEnv = "ORDERED_STRESS_SEED"

const (
	stressAckDeadline = 10 // seconds, subscription and streams
	stressIdle        = 150 * time.Millisecond
	stressNackBudget  = 40
)

// TestOrderedRandomSettlement drives one ordered subscription with a seeded
// random workload (2-3 StreamingPull streams and occasional unary Pulls;
// acks, nacks, acks held back and sent out of order, ack deadlines left to
// expire; publishing in rounds while consuming) and checks from the client
// side that:
//
//  1. a key never skips ahead: when message i is delivered, every earlier
//     message of the key was delivered after the latest failure (nack or
//     expiry) of any message at or before it;
//  2. a key goes back only to its earliest failed message, and otherwise
//     moves on by exactly one (checked when the order is known, see below);
//  3. a key's outstanding messages are never on two consumers at once (a
//     unary Pull call is a consumer of its own);
//  4. in the end every message is acked, nothing more comes, and /state
//     shows nothing out and nothing held.
//
// The client sees each consumer's deliveries in order but not how they
// interleave with other consumers'. A delivery a consumer was handed before
// a failure rewound it (a "tail") can arrive after the key went on
// elsewhere. So after a failure of message f on consumer C, C's deliveries
// of that key after f are suspect until C delivers something it can only
// have been handed afterwards: a message of the key at or before f, or any
// message whose publishing began after the failure took effect. Suspect
// deliveries are acked (a no-op when stale) but not checked, and a key
// with a suspect delivery since its last checked one skips check 2 once.
func TestOrderedRandomSettlement(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv(stressSeedEnv); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: %v", stressSeedEnv, s, err)
		}
		seed = v
	}
	t.Logf("seed %d (%s=%d repeats the workload)", seed, stressSeedEnv, seed)
	rng := rand.New(rand.NewPCG(seed, 0x5eed))

	e := startEnv(t)
	ctx := ctxT(t, 55*time.Second)
	tid, sid := e.id("t"), e.id("s")
	e.createTopic(ctx, tid)
	e.createSub(ctx, &pubsubpb.Subscription{Name: e.subName(sid), Topic: e.topicName(tid),
		EnableMessageOrdering: true, AckDeadlineSeconds: stressAckDeadline})
	c := e.v2()

	// The plan: 3-4 keys, 60-100 messages each, published in 2-3 rounds.
	r := &stressRun{t: t, seed: seed, sc: rawSubscriber(t, e), sub: e.subName(sid), rng: rng, clock: new(atomic.Int64),
		byName: map[string]int{}, fails: map[int][]*stressFailure{}, water: map[int]int64{}, ackIDs: map[string]bool{},
		events: make(chan stressEvent, 64), start: time.Now()}
	nkeys, nrounds := 3+rng.IntN(2), 2+rng.IntN(2)
	r.plan = make([][]int, nrounds)
	for i := range r.plan {
		r.plan[i] = make([]int, nkeys)
	}
	total := 0
	for k := range nkeys {
		name := "key" + strconv.Itoa(k)
		n := 60 + rng.IntN(41)
		total += n
		ks := &stressKey{name: name, prev: -1, msgs: make([]*stressMsg, n)}
		for i := range ks.msgs {
			ks.msgs[i] = &stressMsg{key: k, i: i}
		}
		r.keys = append(r.keys, ks)
		r.byName[name] = k
		for i := range n {
			r.plan[min(i*nrounds/n, nrounds-1)][k]++
		}
	}
	// Expiries are rare and planned: at most one with the full deadline
	// (early, so that the run stays short) and up to two shortened to 1-2 s
	// by a modack, at random points of the run.
	if rng.IntN(2) == 0 {
		r.planExp = append(r.planExp, stressPlannedExpiry{at: 10 + rng.IntN(60), long: true})
	}
	for range rng.IntN(3) {
		r.planExp = append(r.planExp, stressPlannedExpiry{at: 10 + rng.IntN(total)})
	}
	slices.SortFunc(r.planExp, func(a, b stressPlannedExpiry) int { return a.at - b.at })

	wctx, cancel := context.WithTimeout(ctx, 45*time.Second)
	r.ctx = wctx
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() }) // before the env stops

	// Publisher: a round when the checker asks, each key's messages in
	// order, keys interleaved at random, a few at a time as the checker
	// consumes (each event it handles is a credit). A message's publish
	// clock is taken before it is handed to the client: it cannot be
	// delivered earlier.
	pubStart, pubDone := make(chan int, 1), make(chan error, 1)
	r.credits = make(chan struct{}, 8)
	wg.Add(1)
	go func() {
		defer wg.Done()
		p := c.Publisher(tid)
		p.EnableMessageOrdering = true
		defer p.Stop()
		prng := rand.New(rand.NewPCG(seed, 1))
		next := make([]int, nkeys)
		for range r.plan {
			var round int
			select {
			case round = <-pubStart:
			case <-wctx.Done():
				return
			}
			left := slices.Clone(r.plan[round])
			var res []*pubsub.PublishResult
			for {
				var ks []int
				for k, n := range left {
					if n > 0 {
						ks = append(ks, k)
					}
				}
				if len(ks) == 0 {
					break
				}
				if len(res) >= 20 {
					select {
					case <-r.credits:
					case <-wctx.Done():
						return
					}
				}
				k := ks[prng.IntN(len(ks))]
				for range 1 + prng.IntN(min(left[k], 5)) {
					i := next[k]
					next[k]++
					left[k]--
					r.keys[k].msgs[i].pubSeq.Store(r.clock.Add(1))
					res = append(res, p.Publish(wctx, &pubsub.Message{Data: []byte(stressData(k, i)),
						Attributes: map[string]string{"i": strconv.Itoa(i)}, OrderingKey: r.keys[k].name}))
				}
			}
			var err error
			for _, pr := range res {
				if _, perr := pr.Get(wctx); perr != nil && err == nil {
					err = perr
				}
			}
			select {
			case pubDone <- err:
			case <-wctx.Done():
				return
			}
		}
	}()

	// Streams with moderate flow control.
	nstreams := 2 + rng.IntN(2)
	var limits []int
	for s := range nstreams {
		stream, err := r.sc.StreamingPull(wctx)
		if err != nil {
			t.Fatal(err)
		}
		limit := 5 + rng.IntN(21)
		limits = append(limits, limit)
		if err := stream.Send(&pubsubpb.StreamingPullRequest{Subscription: r.sub,
			StreamAckDeadlineSeconds: stressAckDeadline, MaxOutstandingMessages: int64(limit)}); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				resp, err := stream.Recv()
				ev := stressEvent{cons: s, err: err}
				if err == nil {
					ev.msgs = resp.ReceivedMessages
				}
				select {
				case r.events <- ev:
				case <-wctx.Done():
					return
				}
				if err != nil {
					return
				}
			}
		}()
	}
	r.nextCons = nstreams // Pull calls are consumers after the streams
	r.wg = &wg
	t.Logf("%d keys, %d messages in %d rounds, %d streams (max outstanding %v), %d planned expiries",
		nkeys, total, nrounds, nstreams, limits, len(r.planExp))

	idle := time.NewTimer(stressIdle)
	defer idle.Stop()
	idled := false
	for {
		r.maybeRound(pubStart, idled)
		if r.believeDone() {
			if st := subState(t, e, sid); st.Out == 0 && st.Acked == 0 && st.Waiting == 0 {
				break
			}
		}
		idle.Reset(stressIdle)
		idled = false
		select {
		case ev := <-r.events:
			r.handle(ev)
		case err := <-pubDone:
			if err != nil {
				r.failf(nil, "publishing round %d: %v", r.round, err)
			}
			for k, n := range r.plan[r.round] {
				r.published += n
				r.keys[k].published += n
			}
			r.round++
			r.publishing = false
		case <-idle.C:
			// Workload pacing, not synchronisation: send held acks and
			// nacks, and pull now and then, when nothing is happening.
			idled = true
			r.runHolds(true)
			r.flushAcks()
			r.credit()
			if !r.pulling && r.rng.IntN(2) == 0 {
				r.startPull(2*time.Second, r.rng.IntN(2) == 0, 1+r.rng.IntN(8))
			}
		case <-wctx.Done():
			st := subState(t, e, sid)
			r.failf(nil, "the workload did not settle within 45 s (/state: %d out, %d acked-held, %d waiting):\n%s",
				st.Out, st.Acked, st.Waiting, r.unsettled())
		}
	}

	// 4: every message's latest delivery acked; nothing more comes, on the
	// streams or to a Pull, and the proxy holds nothing.
	for _, k := range r.keys {
		for _, m := range k.msgs {
			if m.last == nil || m.last.state != stressAcked {
				r.failf(k, "message %d of key %s: latest delivery not acked", m.i, k.name)
			}
		}
	}
	settled := time.Now()
	r.startPull(time.Second, false, 10)
	quiet := time.NewTimer(time.Second)
	defer quiet.Stop()
	tails := 0
	for done := false; !done || r.pulling; {
		select {
		case ev := <-r.events:
			if ev.err != nil {
				r.handleErr(ev)
			}
			if ev.pull {
				r.pulling = false
			}
			for _, rm := range ev.msgs {
				ki, i := r.byName[rm.GetMessage().GetOrderingKey()], rm.GetMessage().GetAttributes()["i"]
				n, _ := strconv.Atoi(i)
				// Only a tail handed out before a failure, stale since, may
				// still arrive from a stream.
				if ev.pull || !slices.ContainsFunc(r.fails[ev.cons], func(f *stressFailure) bool { return f.key == ki && n > f.thr }) {
					r.failf(r.keys[ki], "message %s of key %s came to consumer %d %v after every message was acked",
						i, rm.GetMessage().GetOrderingKey(), ev.cons, time.Since(settled).Round(time.Millisecond))
				}
				tails++
			}
		case <-quiet.C:
			done = true
		case <-wctx.Done():
			r.failf(nil, "final Pull did not return")
		}
	}
	if st := subState(t, e, sid); st.Out != 0 || st.Acked != 0 || st.Waiting != 0 {
		t.Fatalf("seed %d: after the run /state shows %d out, %d acked-held, %d waiting; want none", seed, st.Out, st.Acked, st.Waiting)
	}
	superseded := 0 // suspect deliveries that were indeed stale
	for _, d := range r.suspects {
		if d.msg.last != d {
			superseded++
		}
	}
	t.Logf("%v: %d deliveries (%d suspect, %d of them superseded later; %d late tails), %d pulls, %d nacks, %d held, %d expiries (%d with the full deadline), %d stale acks",
		time.Since(r.start).Round(time.Millisecond), r.handled, len(r.suspects), superseded, tails, r.pulls, r.nacks, r.held, r.expiries, r.longExpiries, r.staleAcks)
}

func stressData(k, i int) string { return fmt.Sprintf("key%d-%d", k, i) }

type stressEvent struct {
	cons int // consumer: a stream, or one unary Pull call
	pull bool
	msgs []*pubsubpb.ReceivedMessage
	err  error
}

type stressState uint8

const (
	stressOut      stressState = iota // outstanding under its ack id
	stressAcked                       // acked by the test
	stressNacked                      // nacked by the test
	stressExpiring                    // left to expire
	stressStale                       // rewound (a failure at or before it) or superseded
)

// stressDelivery is one hand-out of a message, under one ack id.
type stressDelivery struct {
	msg     *stressMsg
	cons    int
	ackID   string
	seq     int64
	suspect bool // possibly handed out before a failure that rewound it
	// maybeStale: an earlier message of the key is left to expire; its
	// expiry rewinds this one at a time the client cannot see.
	maybeStale bool
	state      stressState
	doneAt     int64 // stressExpiring: seq by which the expiry (or a rewind) had happened
}

// definite reports whether the delivery is certainly outstanding under its
// ack id now.
func (d *stressDelivery) definite() bool {
	return d.state == stressOut && !d.suspect && !d.maybeStale
}

type stressMsg struct {
	key, i   int
	pubSeq   atomic.Int64 // clock when its publishing began; 0: not yet
	last     *stressDelivery
	cur      *stressDelivery // latest checked (not suspect) delivery
	lastSeq  int64           // clock of its latest delivery, suspects included
	failSeq  int64           // clock of its latest failure
	nacks    int
	expiring *stressDelivery // left to expire, not yet seen to have
}

type stressKey struct {
	name      string
	msgs      []*stressMsg
	published int
	prev      int  // number of the latest checked delivery; -1: none
	uncertain bool // a suspect delivery since: the next one is not checked against prev
	pend      []int
	open      []*stressDelivery // stressOut and stressExpiring deliveries
	log       []string
}

func (k *stressKey) logf(format string, args ...any) {
	if len(k.log) == 60 {
		k.log = slices.Delete(k.log, 0, 1)
	}
	k.log = append(k.log, fmt.Sprintf(format, args...))
}

func (k *stressKey) drop(d *stressDelivery) {
	if i := slices.Index(k.open, d); i >= 0 {
		k.open = slices.Delete(k.open, i, i+1)
	}
}

// stressFailure is a failure (nack or expiry) of message thr of a key
// whose messages were out on a consumer. What the consumer was handed of
// the key before it took effect and has not yet arrived is stale: so its
// deliveries of the key after thr are suspect until the failure is
// resolved, by a delivery it was certainly handed afterwards.
type stressFailure struct {
	key, thr int
	start    int64           // clock before it could take effect
	done     int64           // nack: clock by which it had taken effect
	exp      *stressDelivery // expiry: taken effect once its message is seen again
}

func (f *stressFailure) doneAt() int64 {
	if f.exp != nil {
		return f.exp.doneAt
	}
	return f.done
}

type stressPlannedExpiry struct {
	at   int // the checked delivery count at which to leave one to expire
	long bool
}

type stressHold struct {
	d    *stressDelivery
	nack bool
	due  int
}

type stressRun struct {
	t     *testing.T
	seed  uint64
	ctx   context.Context
	wg    *sync.WaitGroup
	sc    pubsubpb.SubscriberClient
	sub   string
	rng   *rand.Rand
	clock *atomic.Int64 // orders deliveries, failures and publishing
	start time.Time

	plan                 [][]int // round -> key -> messages
	round                int     // rounds published
	publishing           bool
	published, delivered int // messages published, messages delivered at least once

	keys   []*stressKey
	byName map[string]int
	// Per consumer: its unresolved failures, and a watermark: every
	// hand-out to it before that clock has arrived.
	fails   map[int][]*stressFailure
	water   map[int]int64
	ackIDs  map[string]bool
	holds   []stressHold
	ackBuf  []string
	planExp []stressPlannedExpiry

	events   chan stressEvent
	credits  chan struct{} // paces publishing
	nextCons int
	pulling  bool

	suspects []*stressDelivery

	handled, checked, pulls, nacks, held, expiries, longExpiries, staleAcks int
}

func (r *stressRun) failf(k *stressKey, format string, args ...any) {
	r.t.Helper()
	msg := fmt.Sprintf(format, args...)
	if k != nil {
		msg += "\nrecent events of " + k.name + ":\n  " + strings.Join(k.log, "\n  ")
	}
	r.t.Fatalf("seed %d (%s=%d repeats it): %s", r.seed, stressSeedEnv, r.seed, msg)
}

// maybeRound starts the next publishing round once most of what was
// published has been delivered (or nothing is happening).
func (r *stressRun) maybeRound(start chan<- int, idled bool) {
	if r.publishing || r.round == len(r.plan) {
		return
	}
	if r.round == 0 || idled || r.delivered*5 >= r.published*3 {
		r.publishing = true
		start <- r.round
	}
}

func (r *stressRun) credit() {
	select {
	case r.credits <- struct{}{}:
	default:
	}
}

func (r *stressRun) startPull(timeout time.Duration, immediate bool, maxMsgs int) {
	id := r.nextCons
	r.nextCons++
	r.pulling = true
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		pctx, cancel := context.WithTimeout(r.ctx, timeout)
		defer cancel()
		resp, err := r.sc.Pull(pctx, &pubsubpb.PullRequest{Subscription: r.sub, MaxMessages: int32(maxMsgs), ReturnImmediately: immediate})
		ev := stressEvent{cons: id, pull: true, err: err}
		if err == nil {
			ev.msgs = resp.ReceivedMessages
		}
		select {
		case r.events <- ev:
		case <-r.ctx.Done():
		}
	}()
}

func (r *stressRun) handleErr(ev stressEvent) {
	r.t.Helper()
	if r.ctx.Err() != nil {
		r.failf(nil, "the workload did not settle within 45 s")
	}
	if ev.pull && status.Code(ev.err) == codes.DeadlineExceeded {
		// The proxy answers a waiting Pull before the client's deadline;
		// a slow machine can miss it. Whatever it handed out comes back
		// after the ack deadline.
		r.t.Logf("Pull: %v", ev.err)
		return
	}
	r.failf(nil, "consumer %d: %v", ev.cons, ev.err)
}

func (r *stressRun) handle(ev stressEvent) {
	if ev.pull {
		r.pulling = false
		r.pulls++
	}
	if ev.err != nil {
		r.handleErr(ev)
		return
	}
	for _, rm := range ev.msgs {
		r.deliver(ev.cons, rm)
		r.runHolds(false)
	}
	r.flushAcks()
	r.credit()
	if !r.pulling && r.rng.IntN(25) == 0 {
		r.startPull(2*time.Second, r.rng.IntN(2) == 0, 1+r.rng.IntN(8))
	}
}

func (r *stressRun) deliver(cons int, rm *pubsubpb.ReceivedMessage) {
	now := r.clock.Add(1)
	r.handled++
	name := rm.GetMessage().GetOrderingKey()
	ki, ok := r.byName[name]
	if !ok {
		r.failf(nil, "consumer %d got a message of ordering key %q", cons, name)
	}
	k := r.keys[ki]
	i, err := strconv.Atoi(rm.GetMessage().GetAttributes()["i"])
	if err != nil || i < 0 || i >= len(k.msgs) {
		r.failf(k, "consumer %d got message %q of key %s", cons, rm.GetMessage().GetAttributes()["i"], name)
	}
	m := k.msgs[i]
	ps := m.pubSeq.Load()
	if ps == 0 || string(rm.GetMessage().GetData()) != stressData(ki, i) {
		r.failf(k, "consumer %d got message %d of key %s, not published as such (data %q)", cons, i, name, rm.GetMessage().GetData())
	}
	if rm.GetAckId() == "" || r.ackIDs[rm.GetAckId()] {
		r.failf(k, "consumer %d got message %d of key %s under ack id %q, empty or used before", cons, i, name, rm.GetAckId())
	}
	r.ackIDs[rm.GetAckId()] = true
	d := &stressDelivery{msg: m, cons: cons, ackID: rm.GetAckId(), seq: now}

	// A consumer gets its hand-outs in order. This one was handed out after
	// its message's publishing began, and, if it is of a failed key at or
	// before the failed message, after the failure took effect (what was
	// out then was later in the key). Either way everything handed to the
	// consumer before has arrived.
	w := max(r.water[cons], ps)
	resolved := func(f *stressFailure) bool { return f.key == ki && i <= f.thr }
	for _, f := range r.fails[cons] {
		if resolved(f) {
			w = max(w, f.start)
		}
	}
	r.water[cons] = w
	r.fails[cons] = slices.DeleteFunc(r.fails[cons], func(f *stressFailure) bool {
		return resolved(f) || (f.doneAt() != 0 && f.doneAt() <= w)
	})
	d.suspect = slices.ContainsFunc(r.fails[cons], func(f *stressFailure) bool { return f.key == ki })
	// A new hand-out of a message left to expire: it did expire (or an
	// earlier failure rewound it).
	if x := m.expiring; x != nil {
		x.doneAt, x.state = now, stressStale
		k.drop(x)
		m.expiring = nil
	}
	if m.lastSeq == 0 {
		r.delivered++
	}
	if d.suspect {
		r.suspects = append(r.suspects, d)
		k.uncertain = true
		k.logf("%d: consumer %d got %d (suspect)", now, cons, i)
	} else {
		k.logf("%d: consumer %d got %d", now, cons, i)
		r.check(k, d)
	}
	m.last, m.lastSeq = d, now
	k.open = append(k.open, d)
	r.decide(k, d)
}

// check applies checks 1-3 to a delivery that is not suspect.
func (r *stressRun) check(k *stressKey, d *stressDelivery) {
	m, i := d.msg, d.msg.i
	r.checked++
	// 3: one consumer per key.
	for _, o := range k.open {
		if o.definite() && o.cons != d.cons {
			r.failf(k, "message %d of key %s went to consumer %d while message %d was outstanding on consumer %d",
				i, k.name, d.cons, o.msg.i, o.cons)
		}
	}
	// A message comes again only after its hand-out failed or was rewound.
	if old := m.cur; old != nil {
		if old.definite() {
			r.failf(k, "message %d of key %s came again (consumer %d) while outstanding on consumer %d", i, k.name, d.cons, old.cons)
		}
		if old.state == stressOut {
			old.state = stressStale
			k.drop(old)
		}
		if r.rng.IntN(4) == 0 { // a stale ack id: must change nothing
			r.ackBuf = append(r.ackBuf, old.ackID)
			r.staleAcks++
		}
	}
	// 1: never ahead of an earlier message's latest (re)delivery.
	var maxFail int64
	failed := -1
	for j := range i {
		mj := k.msgs[j]
		if mj.failSeq > maxFail {
			maxFail, failed = mj.failSeq, j
		}
		if mj.lastSeq == 0 {
			r.failf(k, "key %s skipped ahead: message %d delivered (consumer %d) before message %d ever was", k.name, i, d.cons, j)
		}
		if mj.lastSeq < maxFail {
			r.failf(k, "key %s skipped ahead: message %d delivered (consumer %d) before message %d came again after message %d failed",
				k.name, i, d.cons, j, failed)
		}
	}
	// 2: on to the next message, or back to the earliest failed one.
	if !k.uncertain {
		want := k.prev + 1
		if len(k.pend) > 0 && k.pend[0] <= k.prev {
			want = k.pend[0]
		}
		if i != want {
			r.failf(k, "key %s: message %d delivered (consumer %d) after message %d; want %d (failed and not yet redelivered: %v)",
				k.name, i, d.cons, k.prev, want, k.pend)
		}
	}
	k.pend = slices.DeleteFunc(k.pend, func(f int) bool { return f <= i })
	k.prev, k.uncertain = i, false
	m.cur = d
}

// decide settles a delivery: suspect ones are acked; others are mostly
// acked, sometimes held back (acked or nacked later, out of order),
// nacked, or left to expire.
func (r *stressRun) decide(k *stressKey, d *stressDelivery) {
	if !d.definite() {
		r.ack(k, d)
		return
	}
	for len(r.planExp) > 0 && r.planExp[0].long && time.Since(r.start) > 5*time.Second {
		r.planExp = r.planExp[1:] // too late for a full deadline
	}
	if len(r.planExp) > 0 && r.checked >= r.planExp[0].at {
		long := r.planExp[0].long
		r.planExp = r.planExp[1:]
		r.expire(k, d, long)
		return
	}
	switch f := r.rng.Float64(); {
	case f < 0.06 && r.nacks < stressNackBudget && d.msg.nacks < 2:
		r.nack(k, d)
	case f < 0.18:
		r.held++
		r.holds = append(r.holds, stressHold{d: d, nack: r.rng.IntN(4) == 0, due: r.handled + 1 + r.rng.IntN(10)})
	default:
		r.ack(k, d)
	}
}

func (r *stressRun) runHolds(all bool) {
	var due []stressHold
	r.holds = slices.DeleteFunc(r.holds, func(h stressHold) bool {
		if all || h.due <= r.handled {
			due = append(due, h)
			return true
		}
		return false
	})
	for _, h := range due {
		k := r.keys[h.d.msg.key]
		if h.nack && h.d.definite() && h.d.msg.nacks < 2 && r.nacks < stressNackBudget {
			r.nack(k, h.d)
		} else {
			r.ack(k, h.d) // stale by now, perhaps: then a no-op
		}
	}
}

func (r *stressRun) ack(k *stressKey, d *stressDelivery) {
	if d.state == stressOut {
		d.state = stressAcked
		k.drop(d)
		k.logf("ack %d (consumer %d)", d.msg.i, d.cons)
	} else {
		k.logf("stale ack %d (consumer %d)", d.msg.i, d.cons)
	}
	r.ackBuf = append(r.ackBuf, d.ackID)
}

// flushAcks sends the acks decided so far, in one unary call (it returns
// once the proxy has applied them).
func (r *stressRun) flushAcks() {
	if len(r.ackBuf) == 0 {
		return
	}
	if _, err := r.sc.Acknowledge(r.ctx, &pubsubpb.AcknowledgeRequest{Subscription: r.sub, AckIds: r.ackBuf}); err != nil {
		r.failf(nil, "Acknowledge: %v", err)
	}
	r.ackBuf = r.ackBuf[:0]
}

func (r *stressRun) modack(d *stressDelivery, sec int32) {
	r.flushAcks() // the proxy sees settlements in the order decided
	if _, err := r.sc.ModifyAckDeadline(r.ctx, &pubsubpb.ModifyAckDeadlineRequest{Subscription: r.sub,
		AckIds: []string{d.ackID}, AckDeadlineSeconds: sec}); err != nil {
		r.failf(nil, "ModifyAckDeadline: %v", err)
	}
}

// failed records a failure on the consumer d came from (for a Pull call,
// the rest of its response is what it may make stale).
func (r *stressRun) failed(d *stressDelivery, f *stressFailure) {
	r.fails[d.cons] = append(r.fails[d.cons], f)
}

// nack: the message and every later one of its key that went out come
// again (acked ones included); their ack ids are stale.
func (r *stressRun) nack(k *stressKey, d *stressDelivery) {
	start := r.clock.Add(1)
	r.modack(d, 0)
	c := r.clock.Add(1)
	r.nacks++
	m := d.msg
	m.nacks++
	m.failSeq = c
	d.state = stressNacked
	k.drop(d)
	for _, o := range slices.Clone(k.open) {
		if o.msg.i > m.i {
			if o.state == stressExpiring {
				o.doneAt = c
				o.msg.expiring = nil
			}
			o.state = stressStale
			k.drop(o)
		}
	}
	k.addPend(m.i)
	r.failed(d, &stressFailure{key: m.key, thr: m.i, start: start, done: c})
	k.logf("%d: nack %d (consumer %d)", c, m.i, d.cons)
}

// expire leaves d to expire: with the full deadline, or shortened by a
// modack to 1-2 s.
func (r *stressRun) expire(k *stressKey, d *stressDelivery, long bool) {
	c := r.clock.Add(1)
	if long {
		r.longExpiries++
	} else {
		r.modack(d, int32(1+r.rng.IntN(2)))
	}
	r.expiries++
	m := d.msg
	m.failSeq = c
	m.expiring = d
	d.state = stressExpiring
	for _, o := range k.open {
		if o.msg.i > m.i {
			o.maybeStale = true
		}
	}
	k.addPend(m.i)
	r.failed(d, &stressFailure{key: m.key, thr: m.i, start: c, exp: d})
	k.logf("%d: leave %d to expire (consumer %d, long %v)", c, m.i, d.cons, long)
}

func (k *stressKey) addPend(i int) {
	if j, found := slices.BinarySearch(k.pend, i); !found {
		k.pend = slices.Insert(k.pend, j, i)
	}
}

// believeDone: everything is published, nothing held, and every message
// was delivered (and settled) after the latest failure at or before it.
func (r *stressRun) believeDone() bool {
	if r.round < len(r.plan) || r.publishing || r.pulling || len(r.holds) > 0 || len(r.ackBuf) > 0 {
		return false
	}
	for _, k := range r.keys {
		var maxFail int64
		for _, m := range k.msgs {
			maxFail = max(maxFail, m.failSeq)
			if m.lastSeq == 0 || m.lastSeq < maxFail || m.last.state != stressAcked {
				return false
			}
		}
	}
	return true
}

// unsettled describes what the run still waits for.
func (r *stressRun) unsettled() string {
	var b strings.Builder
	fmt.Fprintf(&b, "rounds published %d of %d (publishing %v), pull running %v, %d held\n", r.round, len(r.plan), r.publishing, r.pulling, len(r.holds))
	for _, k := range r.keys {
		var maxFail int64
		var waiting []int
		for _, m := range k.msgs {
			maxFail = max(maxFail, m.failSeq)
			if m.lastSeq == 0 || m.lastSeq < maxFail || m.last.state != stressAcked {
				waiting = append(waiting, m.i)
			}
		}
		if len(waiting) > 0 {
			fmt.Fprintf(&b, "key %s (%d published) waits for messages %v\n  %s\n", k.name, k.published, waiting, strings.Join(k.log, "\n  "))
		}
	}
	return b.String()
}
