package gcp

// Tests of the ordered key window (lease.go keyState) that drive a
// subRuntime directly, so that interleavings the RPC layer makes possible
// (two RPCs of one subscription running at once) are reproduced step by
// step instead of by timing.

import (
	"container/heap"
	"context"
	"fmt"
	"math"
	"math/rand"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap/zaptest"
	"google.golang.org/protobuf/types/known/durationpb"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/kubemq-io/kubemq-proxy/delivery"
	"github.com/kubemq-io/kubemq-proxy/embedded"
	"github.com/kubemq-io/kubemq-proxy/internal/kubemqtest"
	"github.com/kubemq-io/kubemq-proxy/kubemqclient"
	"github.com/kubemq-io/kubemq-proxy/registry"
)

// rtEnv is a front-end (not serving) over the suite's KubeMQ.
type rtEnv struct {
	t   *testing.T
	s   *Server
	ctx context.Context
}

// newRTEnv is a Server on $KUBEMQ_ADDRESS or a strict embedded server; mods may change its
// Options (Client is set).
func newRTEnv(t *testing.T, cfg Config, mods ...func(*Options)) *rtEnv {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	log := zaptest.NewLogger(t)
	opts := kubemqclient.Options{Logger: log.Named("kubemq"),
		MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, PingInterval: 200 * time.Millisecond}
	// $KUBEMQ_ADDRESS, else an embedded server, reached as the other gcp
	// suites reach it (in process unless $KUBEMQ_LINK=tcp).
	if kubemqtest.External() {
		opts.Address = kubemqtest.Address(t)
	} else {
		addr, ksrv := kubemqtest.StartEmbedded(t, embedded.Options{Strict: true})
		kubemqtest.CheckStrict(t, ksrv)
		opts.Address = addr
		if kubemqtest.InProcess(true) {
			opts.Conn = ksrv.Channel(embedded.SharePayloads())
		}
	}
	kc, err := kubemqclient.Dial(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { kc.Close() })
	if err := kc.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	reg, err := registry.Open(ctx, registry.Options{Client: kc, Channel: kubemqclient.Channel("kubemq-proxy-test.gcp-window", strconv.FormatInt(time.Now().UnixNano(), 36)), Logger: log.Named("registry")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })
	if err := reg.WaitReplayed(ctx); err != nil {
		t.Fatal(err)
	}
	o := Options{Client: kc, Registry: reg, Logger: log.Named("gcp"), Config: cfg}
	for _, f := range mods {
		f(&o)
	}
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer scancel()
		s.Shutdown(sctx)
	})
	return &rtEnv{t: t, s: s, ctx: ctx}
}

func (e *rtEnv) topic(id string) string { return "projects/proj/topics/topic-" + id }
func (e *rtEnv) sub(id string) string   { return "projects/proj/subscriptions/sub-" + id }

func (e *rtEnv) createTopic(id string) {
	e.t.Helper()
	if _, err := (&publisher{s: e.s}).CreateTopic(e.ctx, &pubsubpb.Topic{Name: e.topic(id)}); err != nil {
		e.t.Fatal(err)
	}
}

// createSub creates an ordered subscription (with ack deadline 60 s unless
// set) and returns its delivery runtime here.
func (e *rtEnv) createSub(sub *pubsubpb.Subscription) *subRuntime {
	e.t.Helper()
	sub.EnableMessageOrdering = true
	if sub.AckDeadlineSeconds == 0 {
		sub.AckDeadlineSeconds = 60
	}
	if _, err := (&subscriber{s: e.s}).CreateSubscription(e.ctx, sub); err != nil {
		e.t.Fatal(err)
	}
	id := sub.Name[len("projects/proj/subscriptions/"):]
	se, ok := e.s.cat.sub(id)
	if !ok {
		e.t.Fatalf("subscription %s not in the catalogue", id)
	}
	rt, release, err := e.s.runtime(e.ctx, se)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(release)
	return rt
}

// publish publishes messages i = from..from+n-1 of key, one request each.
func (e *rtEnv) publish(topic, key string, from, n int) {
	e.t.Helper()
	for i := from; i < from+n; i++ {
		_, err := (&publisher{s: e.s}).Publish(e.ctx, &pubsubpb.PublishRequest{Topic: e.topic(topic), Messages: []*pubsubpb.PubsubMessage{
			{Data: []byte("m"), Attributes: map[string]string{"i": strconv.Itoa(i)}, OrderingKey: key},
		}})
		if err != nil {
			e.t.Fatal(err)
		}
	}
}

// take fetches until n messages came (fails at the deadline).
func (e *rtEnv) take(rt *subRuntime, f *flow, n int) []*pubsubpb.ReceivedMessage {
	e.t.Helper()
	var got []*pubsubpb.ReceivedMessage
	for len(got) < n {
		ctx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
		ms, err := rt.fetch(ctx, n-len(got), f, 60*time.Second)
		cancel()
		if err != nil {
			e.t.Fatalf("fetch: %v (had %d of %d)", err, len(got), n)
		}
		got = append(got, ms...)
	}
	return got
}

func msgNum(m *pubsubpb.ReceivedMessage) int {
	n, _ := strconv.Atoi(m.GetMessage().GetAttributes()["i"])
	return n
}

func nums(ms []*pubsubpb.ReceivedMessage) []int {
	out := make([]int, len(ms))
	for i, m := range ms {
		out[i] = msgNum(m)
	}
	return out
}

func leaseOf(rt *subRuntime, ackID string) *lease {
	lid, _, _ := parseAckID(ackID)
	return rt.leases[lid]
}

// waitCount waits up to 10 s for c to reach want and returns its value:
// the dead-letter counters move after the copy is stored (or refused),
// which a delivery on the dead-letter subscription may precede.
func waitCount(c prometheus.Counter, want float64) float64 {
	for end := time.Now().Add(10 * time.Second); testutil.ToFloat64(c) < want && time.Now().Before(end); {
		time.Sleep(5 * time.Millisecond)
	}
	return testutil.ToFloat64(c)
}

// deadLetteredSub creates topics "t" and "dlq" and the ordered
// subscription "s" on t that dead-letters to dlq after 5 attempts.
func (e *rtEnv) deadLetteredSub() *subRuntime {
	e.t.Helper()
	e.createTopic("t")
	e.createTopic("dlq")
	return e.createSub(&pubsubpb.Subscription{Name: e.sub("s"), Topic: e.topic("t"),
		DeadLetterPolicy: &pubsubpb.DeadLetterPolicy{DeadLetterTopic: e.topic("dlq"), MaxDeliveryAttempts: 5}})
}

// TestDeadLetterKeepsKeyOrder: the last attempt of two messages of one
// key fails in one call (a client's batched nack, ids in any order; or two
// leases expiring together, popped from the heap in any order). Both go to
// the dead-letter topic; an ordered subscription on it must get them in
// publish order. Each earlier round's nack of message 0 redelivers 1 too,
// and delivery_attempt counts those deliveries.
func TestDeadLetterKeepsKeyOrder(t *testing.T) {
	e := newRTEnv(t, Config{})
	rt := e.deadLetteredSub()
	dl := e.createSub(&pubsubpb.Subscription{Name: e.sub("dl"), Topic: e.topic("dlq")})
	e.publish("t", "k", 0, 2)
	f := newFlow(100, 0)
	for attempt := 1; attempt <= 5; attempt++ {
		ms := e.take(rt, f, 2)
		if got := nums(ms); !slices.Equal(got, []int{0, 1}) {
			t.Fatalf("attempt %d: got %v, want [0 1]", attempt, got)
		}
		if ms[0].DeliveryAttempt != int32(attempt) || ms[1].DeliveryAttempt != int32(attempt) {
			t.Fatalf("attempt %d: delivery_attempt %d and %d", attempt, ms[0].DeliveryAttempt, ms[1].DeliveryAttempt)
		}
		// The later message's id first (the Go client nacks from a map).
		rt.modack([]string{ms[1].AckId, ms[0].AckId}, 0)
	}
	got := nums(e.take(dl, newFlow(100, 0), 2))
	if !slices.Equal(got, []int{0, 1}) {
		t.Fatalf("dead-letter subscription got key k as %v, want [0 1]", got)
	}
	if n, f := waitCount(rt.deadLettered, 2), testutil.ToFloat64(rt.dlFailed); n != 2 || f != 0 {
		t.Errorf("dead_lettered_messages_total %v, dead_letter_failures_total %v, want 2 and 0", n, f)
	}
}

// TestDeadLetterFailureKeepsKeyOrder: when the dead-letter topic is gone,
// a message of an ordered key that used up its attempts is not delivered
// again (its key went on without it, so it would arrive behind later
// messages); dead-lettering is tried again until the topic is back.
func TestDeadLetterFailureKeepsKeyOrder(t *testing.T) {
	e := newRTEnv(t, Config{})
	rt := e.deadLetteredSub()
	if _, err := (&publisher{s: e.s}).DeleteTopic(e.ctx, &pubsubpb.DeleteTopicRequest{Topic: e.topic("dlq")}); err != nil {
		t.Fatal(err)
	}
	e.publish("t", "k", 0, 2)
	f := newFlow(100, 0)
	for attempt := 1; attempt <= 5; attempt++ {
		ms := e.take(rt, f, 2)
		if got := nums(ms); !slices.Equal(got, []int{0, 1}) {
			t.Fatalf("attempt %d: got %v, want [0 1]", attempt, got)
		}
		rt.ack([]string{ms[1].AckId}) // held behind 0
		rt.modack([]string{ms[0].AckId}, 0)
	}
	// 0 failed its last attempt and could not be dead-lettered; 1 was
	// acked. The key goes on with 2, and 0 must not come back.
	e.publish("t", "k", 2, 1)
	if got := nums(e.take(rt, f, 1)); !slices.Equal(got, []int{2}) {
		t.Fatalf("after the failed dead-lettering: got %v, want [2]", got)
	}
	ctx, cancel := context.WithTimeout(e.ctx, 2500*time.Millisecond) // past the first retry (1 s)
	more, err := rt.fetch(ctx, 10, f, 60*time.Second)
	cancel()
	if len(more) > 0 || err == nil {
		t.Fatalf("delivered again: %v (err %v), want nothing until the fetch times out", nums(more), err)
	}
	if f, n := waitCount(rt.dlFailed, 2), testutil.ToFloat64(rt.deadLettered); n != 0 || f < 2 {
		t.Errorf("dead_lettered_messages_total %v, dead_letter_failures_total %v, want 0 and at least 2 (a retry after 1 s)", n, f)
	}
	for _, ss := range e.s.State().(State).Subscriptions {
		if ss.ID == "sub-s" && (ss.DeadLettering != 1 || ss.Out != 1) {
			t.Errorf("/state of the subscription: %+v, want 1 dead-lettering and 1 (message 2) out", ss)
		}
	}
	// The topic is back: the next retry (after 2 s) dead-letters 0.
	e.createTopic("dlq")
	dl := e.createSub(&pubsubpb.Subscription{Name: e.sub("dl"), Topic: e.topic("dlq")})
	got := e.take(dl, newFlow(100, 0), 1)
	if nums(got)[0] != 0 || got[0].GetMessage().GetAttributes()[attrDLSourceDeliveryCount] != "5" {
		t.Fatalf("dead-letter subscription got %v %v", nums(got), got[0].GetMessage().GetAttributes())
	}
	if n := waitCount(rt.deadLettered, 1); n != 1 {
		t.Errorf("dead_lettered_messages_total %v, want 1", n)
	}
}

// TestStaleNackAfterRewind: two nacks of one subscription run at
// once (two streams, or a stream and a unary ModifyAckDeadline). modack
// looks its leases up under the lock and fails them after unlocking it.
// In between, the other nack rewinds the key, and a fetch hands the
// rewound message out again under a new ack id. The first nack, meant for
// the earlier delivery, must not fail the new one (an ack id names one
// delivery).
func TestStaleNackAfterRewind(t *testing.T) {
	e := newRTEnv(t, Config{})
	e.createTopic("t")
	rt := e.createSub(&pubsubpb.Subscription{Name: e.sub("s"), Topic: e.topic("t")})
	e.publish("t", "k", 0, 2)
	f := newFlow(100, 0)
	first := e.take(rt, f, 2)

	// RPC 1: modack(nack of message 1), up to its unlock.
	rt.mu.Lock()
	stale := rt.lookupLocked(first[1].AckId)
	rt.mu.Unlock()
	if stale == nil {
		t.Fatal("message 1 not out")
	}
	staleGen := stale.gen
	// RPC 2: nack of message 0; 0 and 1 go out again.
	rt.modack([]string{first[0].AckId}, 0)
	again := e.take(rt, f, 2)
	if got := nums(again); !slices.Equal(got, []int{0, 1}) {
		t.Fatalf("after the nack of 0: got %v", got)
	}
	// RPC 1 goes on: fail what it looked up.
	rt.nacked.Add(1)
	rt.fail([]failure{{stale, staleGen}}, false)

	rt.mu.Lock()
	live := rt.lookupLocked(again[1].AckId) != nil
	attempt := leaseOf(rt, again[1].AckId).attempt
	rt.mu.Unlock()
	if !live || attempt != 2 { // its second delivery, not failed again
		t.Fatalf("message 1's new delivery was failed by the nack of its previous one: ack id live %v, attempt %d (want 2)", live, attempt)
	}
}

// expire does what the sweep does with overdue leases: pops them from
// the heap and fails them as expired.
func expire(rt *subRuntime, ls ...*lease) {
	rt.mu.Lock()
	now := time.Now()
	var popped []failure
	for _, l := range ls {
		if l.state == leaseOut && l.hidx >= 0 {
			heap.Remove(&rt.heap, l.hidx)
			l.deadline = now.Add(-time.Millisecond)
			popped = append(popped, failure{l, l.gen})
		}
	}
	rt.mu.Unlock()
	rt.expired.Add(float64(len(popped)))
	rt.fail(popped, true)
}

// checkKeys checks keyState's invariants under rt.mu; seq gives a lease's
// number within its key.
func checkKeys(rt *subRuntime, seq func(*lease) int) error {
	inHeap := map[*lease]bool{}
	for i, l := range rt.heap {
		if l.hidx != i {
			return fmt.Errorf("heap index of %d is %d, at %d", seq(l), l.hidx, i)
		}
		inHeap[l] = true
	}
	inReady := map[*lease]int{}
	for _, l := range rt.ready {
		inReady[l]++
		if l.state != leaseReady {
			return fmt.Errorf("r.ready holds %d in state %d", seq(l), l.state)
		}
		if inReady[l] > 1 {
			return fmt.Errorf("r.ready holds %d twice", seq(l))
		}
	}
	seen := map[*lease]bool{}
	for key, ks := range rt.keys {
		out := 0
		after := false // a ready or backoff entry was seen
		last := -1
		for i, l := range ks.window {
			seen[l] = true
			if rt.leases[l.d.LeaseID] != l {
				return fmt.Errorf("key %s: window entry %d is not a lease", key, seq(l))
			}
			if seq(l) <= last {
				return fmt.Errorf("key %s: window out of order at %d: %d after %d", key, i, seq(l), last)
			}
			last = seq(l)
			switch l.state {
			case leaseOut:
				out++
				if after {
					return fmt.Errorf("key %s: %d out after a ready/backoff entry", key, seq(l))
				}
				if l.flow != ks.owner {
					return fmt.Errorf("key %s: %d out on a stream other than the owner", key, seq(l))
				}
				if !inHeap[l] {
					return fmt.Errorf("key %s: %d out but not in the heap", key, seq(l))
				}
			case leaseAcked:
				if after {
					return fmt.Errorf("key %s: %d acked after a ready/backoff entry", key, seq(l))
				}
				if i == 0 {
					return fmt.Errorf("key %s: acked %d heads the window", key, seq(l))
				}
			case leaseReady:
				after = true
				if inReady[l] != 1 {
					return fmt.Errorf("key %s: ready %d not in r.ready", key, seq(l))
				}
			case leaseBackoff:
				after = true
				if !inHeap[l] {
					return fmt.Errorf("key %s: backoff %d not in the heap", key, seq(l))
				}
				if i != len(ks.window)-1 {
					return fmt.Errorf("key %s: backoff %d not last", key, seq(l))
				}
			default:
				return fmt.Errorf("key %s: window entry %d in state %d", key, seq(l), l.state)
			}
		}
		if out != ks.out {
			return fmt.Errorf("key %s: ks.out %d, %d out", key, ks.out, out)
		}
		if out == 0 && ks.owner != nil {
			return fmt.Errorf("key %s: owner set with nothing out", key)
		}
		for _, l := range ks.pending {
			seen[l] = true
			if l.state != leasePending {
				return fmt.Errorf("key %s: pending %d in state %d", key, seq(l), l.state)
			}
			if seq(l) <= last {
				return fmt.Errorf("key %s: pending %d not after %d", key, seq(l), last)
			}
			last = seq(l)
		}
		// r.ready lists the key's ready entries in window order.
		var rs []int
		for _, l := range rt.ready {
			if l.key == key {
				rs = append(rs, seq(l))
			}
		}
		if !slices.IsSorted(rs) {
			return fmt.Errorf("key %s: r.ready out of order: %v", key, rs)
		}
	}
	for _, l := range rt.leases {
		// Only a message being dead-lettered has left its key.
		if l.key != "" && !seen[l] && l.state != leaseDeadLetter {
			return fmt.Errorf("lease %d (state %d) in no window or pending list", seq(l), l.state)
		}
		if seen[l] && l.state == leaseDeadLetter {
			return fmt.Errorf("lease %d is being dead-lettered but still in its key", seq(l))
		}
		if (l.state == leaseOut || l.state == leaseBackoff) != inHeap[l] {
			return fmt.Errorf("lease %d state %d, in heap %v", seq(l), l.state, inHeap[l])
		}
	}
	return nil
}

// TestKeyWindowModel drives one ordered subscription with random
// fetches (two streams and unary Pulls), acks, nacks and expiries, and
// checks after every step: keyState's invariants, that a key is only out
// to one stream, that a stream never skips ahead in a key, and that a
// message leaves the runtime (is settled) only after every earlier message
// of its key. At the end everything is acked in order and must settle.
func TestKeyWindowModel(t *testing.T) {
	for _, seed := range []int64{1, 2, 3, 4} {
		t.Run("seed"+strconv.FormatInt(seed, 10), func(t *testing.T) { keyWindowModel(t, seed, modelOpts{}) })
	}
	t.Run("deadletter", func(t *testing.T) { keyWindowModel(t, 7, modelOpts{deadLetter: true}) })
	t.Run("backoff", func(t *testing.T) { keyWindowModel(t, 8, modelOpts{backoff: true}) })
	t.Run("ceiling", func(t *testing.T) { keyWindowModel(t, 9, modelOpts{ceiling: 6, streamMax: 3}) })
	t.Run("all", func(t *testing.T) {
		keyWindowModel(t, 10, modelOpts{deadLetter: true, backoff: true, ceiling: 8, streamMax: 4})
	})
}

type modelOpts struct {
	deadLetter, backoff bool
	ceiling             int   // MaxInflightPerSubscription (0 = default)
	streamMax           int64 // streams' max outstanding messages (0 = no limit)
}

func keyWindowModel(t *testing.T, seed int64, o modelOpts) {
	deadLetter := o.deadLetter
	e := newRTEnv(t, Config{MaxInflightPerSubscription: o.ceiling})
	e.createTopic("t")
	sub := &pubsubpb.Subscription{Name: e.sub("s"), Topic: e.topic("t")}
	if o.backoff {
		sub.RetryPolicy = &pubsubpb.RetryPolicy{MinimumBackoff: durationpb.New(20 * time.Millisecond), MaximumBackoff: durationpb.New(80 * time.Millisecond)}
	}
	if deadLetter {
		e.createTopic("dlq")
		e.createSub(&pubsubpb.Subscription{Name: e.sub("dl"), Topic: e.topic("dlq")})
		sub.DeadLetterPolicy = &pubsubpb.DeadLetterPolicy{DeadLetterTopic: e.topic("dlq"), MaxDeliveryAttempts: 5}
	}
	rt := e.createSub(sub)
	keys := []string{"k1", "k2"}
	const perKey = 25
	resent := e.s.be.(kubemqBackend).c.SendsResent()
	for _, k := range keys {
		e.publish("t", k, 0, perKey)
	}
	if e.s.be.(kubemqBackend).c.SendsResent() != resent {
		// KubeMQ left a send unanswered and the client sent it again: the queue may hold a
		// message twice (at-least-once, seen on a loaded real KubeMQ), and the model's checks
		// assume each message once.
		t.Skip("KubeMQ left a send unanswered and the resend may have stored a message twice; the model needs each message once")
	}
	rng := rand.New(rand.NewSource(seed))
	seqOf := map[*lease]int{}
	seq := func(l *lease) int {
		if n, ok := seqOf[l]; ok {
			return n
		}
		n, _ := strconv.Atoi(l.d.Tags["i"])
		seqOf[l] = n
		return n
	}
	var stats struct{ delivered, heldAcks, maxWindow, keyMoves int }
	defer func() { t.Logf("stats: %+v", stats) }()
	everSeen := map[string]map[int]bool{} // key -> seqs that were leases here
	settledUpTo := map[string]int{}       // key -> seqs below are settled
	check := func(step string) {
		t.Helper()
		rt.mu.Lock()
		defer rt.mu.Unlock()
		if err := checkKeys(rt, seq); err != nil {
			t.Fatalf("after %s: %v", step, err)
		}
		for _, ks := range rt.keys {
			stats.maxWindow = max(stats.maxWindow, len(ks.window))
			for _, l := range ks.window {
				if l.state == leaseAcked {
					stats.heldAcks++
				}
			}
		}
		live := map[string]map[int]bool{}
		for _, l := range rt.leases {
			if l.key == "" {
				continue
			}
			if everSeen[l.key] == nil {
				everSeen[l.key] = map[int]bool{}
			}
			everSeen[l.key][seq(l)] = true
			if live[l.key] == nil {
				live[l.key] = map[int]bool{}
			}
			live[l.key][seq(l)] = true
		}
		for _, k := range keys {
			for n := range everSeen[k] {
				if !live[k][n] && n >= settledUpTo[k] {
					// n left: every earlier one must have left too.
					for m := settledUpTo[k]; m < n; m++ {
						if live[k][m] {
							if deadLetter {
								continue // a dead-lettered message leaves early by design
							}
							t.Fatalf("after %s: key %s: %d settled while %d is not", step, k, n, m)
						}
					}
				}
			}
			for everSeen[k][settledUpTo[k]] && !live[k][settledUpTo[k]] {
				settledUpTo[k]++
			}
		}
	}

	type got struct {
		m    *pubsubpb.ReceivedMessage
		flow *flow
	}
	var held []got                       // what clients hold (ack ids may be stale)
	lastOn := map[*flow]map[string]int{} // stream -> key -> last number received
	lastKeyFlow := map[string]*flow{}
	smax := int64(1 << 40)
	if o.streamMax > 0 {
		smax = o.streamMax
	}
	streams := []*flow{newFlow(smax, 0), newFlow(smax, 0)}
	fetch := func(f *flow, max int) {
		t.Helper()
		rt.mu.Lock()
		room := f.room(time.Now())
		rt.mu.Unlock()
		if room <= 0 {
			return // the stream's fetch loop waits for room
		}
		max = int(min(int64(max), room))
		ctx, cancel := context.WithTimeout(e.ctx, 30*time.Millisecond)
		ms, _ := rt.fetch(ctx, max, f, 60*time.Second)
		cancel()
		for _, m := range ms {
			k, n := m.Message.OrderingKey, msgNum(m)
			if lastOn[f] == nil {
				lastOn[f] = map[string]int{}
			}
			rt.mu.Lock()
			if prev, ok := lastOn[f][k]; ok && n > prev+1 {
				// Skipping ahead is fine only over settled messages.
				ks := rt.keys[k]
				for _, l := range rt.leases {
					dead := ks == nil || (ks.index(l) < 0 && !slices.Contains(ks.pending, l)) // dead-lettering
					if l.key == k && seq(l) > prev && seq(l) < n && !dead {
						rt.mu.Unlock()
						t.Fatalf("key %s skipped ahead on one stream: %d after %d while %d is unsettled", k, n, prev, seq(l))
					}
				}
			}
			lastOn[f][k] = n
			stats.delivered++
			if lastKeyFlow[k] != f {
				stats.keyMoves++
				lastKeyFlow[k] = f
			}
			// No other stream holds a live delivery of the key.
			for _, h := range held {
				if h.flow != f && h.m.Message.OrderingKey == k && rt.lookupLocked(h.m.AckId) != nil {
					rt.mu.Unlock()
					t.Fatalf("key %s: %d handed to a stream while %d is out on another", k, n, msgNum(h.m))
				}
			}
			rt.mu.Unlock()
			held = append(held, got{m, f})
		}
		check("fetch")
	}
	pick := func() (got, bool) {
		if len(held) == 0 {
			return got{}, false
		}
		i := rng.Intn(len(held))
		g := held[i]
		held = slices.Delete(held, i, i+1)
		return g, true
	}
	for step := 0; step < 400; step++ {
		switch r := rng.Intn(10); {
		case r < 3:
			fetch(streams[rng.Intn(len(streams))], 1+rng.Intn(8))
		case r < 4:
			fetch(newFlow(math.MaxInt64, 0), 1+rng.Intn(8)) // a unary Pull
		case r < 7:
			if g, ok := pick(); ok {
				rt.ack([]string{g.m.AckId})
				check("ack")
			}
		case r < 9:
			var ids []string
			for range 1 + rng.Intn(3) {
				if g, ok := pick(); ok {
					ids = append(ids, g.m.AckId)
				}
			}
			if len(ids) > 0 {
				rt.modack(ids, 0)
				check("nack")
			}
		default:
			var ls []*lease
			rt.mu.Lock()
			for range 1 + rng.Intn(3) {
				if len(held) == 0 {
					break
				}
				if l := rt.lookupLocked(held[rng.Intn(len(held))].m.AckId); l != nil {
					ls = append(ls, l)
				}
			}
			rt.mu.Unlock()
			expire(rt, ls...)
			check("expiry")
		}
	}
	// Drain: ack whatever is live, fetch the rest, until all settled.
	deadline := time.Now().Add(30 * time.Second)
	for {
		rt.mu.Lock()
		var ids []string
		for _, h := range held {
			if rt.lookupLocked(h.m.AckId) != nil {
				ids = append(ids, h.m.AckId)
			}
		}
		n := len(rt.leases)
		rt.mu.Unlock()
		if len(ids) > 0 {
			rt.ack(ids)
			check("drain ack")
		}
		held = held[:0]
		done := true
		for _, k := range keys {
			if settledUpTo[k] < perKey {
				done = false
			}
		}
		if done && n == 0 {
			break
		}
		if time.Now().After(deadline) {
			rt.mu.Lock()
			st := fmt.Sprintf("leases %d, ready %d, heap %d, keys %d, settled %v", len(rt.leases), len(rt.ready), len(rt.heap), len(rt.keys), settledUpTo)
			for k, ks := range rt.keys {
				st += fmt.Sprintf("; %s: window %d pending %d out %d owner %v", k, len(ks.window), len(ks.pending), ks.out, ks.owner != nil)
			}
			rt.mu.Unlock()
			t.Fatalf("not all settled: %s", st)
		}
		fetch(streams[0], 50)
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if len(rt.ready) != 0 || len(rt.heap) != 0 || len(rt.keys) != 0 {
		t.Fatalf("left behind: ready %d, heap %d, keys %d", len(rt.ready), len(rt.heap), len(rt.keys))
	}
}

// TestRewindKeepsPendingSorted: pending is kept sorted by publish order
// (binary searches in admitKeyedLocked and holds rely on it), also when a
// rewind puts the window's later messages back while pending holds a
// message published before them (one that came back late while the key
// was held).
func TestRewindKeepsPendingSorted(t *testing.T) {
	e := newRTEnv(t, Config{})
	e.createTopic("t")
	rt := e.createSub(&pubsubpb.Subscription{Name: e.sub("s"), Topic: e.topic("t")})
	early := formatPublishTime(time.Now().Add(-time.Hour))
	e.publish("t", "k", 1, 2)
	f := newFlow(100, 0)
	out := e.take(rt, f, 2) // 1 and 2 out
	// The engine reports another message of the key on its way back: the
	// key is held.
	rt.unsettled(&delivery.Message{Tags: map[string]string{TagOrderingKey: "k", TagMessageID: "x", TagPublishTime: early}}, time.Now().Add(time.Hour))
	// Message 0 (published before 1 and 2) comes back late: pending.
	b := &delivery.Delivery{LeaseID: "late-0", Attempt: 1, Body: []byte("m"),
		Tags: map[string]string{TagOrderingKey: "k", TagMessageID: "late-0", TagPublishTime: early, "i": "0"}}
	se, _ := e.s.cat.sub("sub-s")
	rt.mu.Lock()
	if got := rt.acceptLocked(se, []*delivery.Delivery{b}, f, time.Minute); len(got) != 0 {
		rt.mu.Unlock()
		t.Fatal("the late message went out while its key is held")
	}
	rt.mu.Unlock()
	rt.modack([]string{out[0].AckId}, 0) // rewinds 2 into pending
	rt.mu.Lock()
	defer rt.mu.Unlock()
	ks := rt.keys["k"]
	var order []string
	for _, l := range ks.pending {
		order = append(order, l.d.Tags["i"])
	}
	sorted := slices.IsSortedFunc(ks.pending, func(a, b *lease) int { return a.order.compare(b.order) })
	if !sorted || !ks.holds(orderOf(b.Tags)) {
		t.Fatalf("pending after the rewind: %v (sorted %v); holds the late message: %v", order, sorted, ks.holds(orderOf(b.Tags)))
	}
}
