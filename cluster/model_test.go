package cluster

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"go.uber.org/zap"
)

// TestOwnershipModel runs the ownership protocol in simulated time: replicas that heartbeat,
// claim, release, crash, restart (and so read the log from a window), events stamped by a server
// with delays and stalls. It checks, at every step, that no two replicas act on one queue
// (safety), and that every replica's view, once read up to now, names the same live holder as a
// view that read the whole log, after every event (agreement).
func TestOwnershipModel(t *testing.T) {
	seeds := 150
	if v := os.Getenv("MODEL_SEEDS"); v != "" {
		fmt.Sscanf(v, "%d", &seeds)
	}
	if testing.Short() {
		seeds = 20
	}
	if v := os.Getenv("MODEL_TRACE"); v != "" {
		fmt.Sscanf(v, "%d:%s", &traceSeed, &traceQueue)
	}
	for seed := range seeds {
		runModel(t, uint64(seed))
		if t.Failed() {
			return
		}
	}
}

type simEvent struct {
	seq uint64
	ts  time.Time
	ev  logEvent
}

type simReplica struct {
	c       *Cluster
	read    int // log events applied
	startAt time.Time
	dead    bool
	stalled time.Time // its writes are lost until then (a KubeMQ that does not take them)
	nextHB  time.Time
	// lastArrival: when its latest write reaches the server.
	lastArrival time.Time
	claims      []simClaim // in flight
}

type simClaim struct {
	queue string
	n     uint64
}

func newSimCluster(id string, opts Options) *Cluster {
	opts.ReplicaID = id
	return &Cluster{
		opts: opts, log: zap.NewNop(),
		holders: map[string]*holding{}, maybe: map[string]unknownClaim{}, elsewhere: map[string]time.Time{}, members: map[string]*member{}, owned: map[string]*Ownership{},
		sent: map[uint64]time.Time{}, pending: map[uint64]chan claimResult{}, claiming: map[string]chan struct{}{},
		readyCh: make(chan struct{}),
	}
}

func runModel(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 7))
	opts := Options{Lease: 2 * time.Second, Heartbeat: 200 * time.Millisecond, StopSlack: 800 * time.Millisecond}
	queues := []string{"q0", "q1", "q2"}
	epoch := time.Unix(1_000_000, 0)
	now := epoch
	var log []simEvent
	inflight := []simEvent{} // sent, not yet stamped (ts = arrival)
	full := newSimCluster("observer", opts)
	full.ready, full.warmFrom = true, epoch
	fullRead := 0
	var reps []*simReplica
	var hist []map[string]holding // the whole-log view's holders after each event
	dumpLog = func(q string) {
		for _, e := range log {
			if e.ev.Queue == q || e.ev.Kind == "sync" || len(e.ev.Holds) > 0 {
				t.Logf("%d %v %s %s q=%s c=%d holds=%v", e.seq, e.ts.Sub(epoch), e.ev.Kind, e.ev.Replica, e.ev.Queue, e.ev.Claim, e.ev.Holds)
			}
		}
		for _, r := range reps {
			t.Logf("%s start %v dead %v warmFrom %v", r.c.opts.ReplicaID, r.startAt.Sub(epoch), r.dead, r.c.warmFrom.Sub(epoch))
		}
	}
	nextID := 0
	start := func() {
		id := fmt.Sprintf("r%d", nextID)
		nextID++
		r := &simReplica{c: newSimCluster(id, opts), startAt: now, nextHB: now}
		// It reads from a window before now: skip what is older.
		for r.read < len(log) && log[r.read].ts.Before(now.Add(-opts.window())) {
			r.read++
		}
		r.c.syncNonce = id
		send(&inflight, rng, now, r, logEvent{Kind: "sync", Nonce: id})
		reps = append(reps, r)
	}
	for range 3 {
		start()
	}
	step := 10 * time.Millisecond
	for now.Before(epoch.Add(90 * time.Second)) {
		now = now.Add(step)
		// The server stamps what has arrived, in arrival order.
		kept := inflight[:0]
		for _, e := range inflight {
			if !e.ts.After(now) {
				e.seq = uint64(len(log) + 1)
				log = append(log, e)
			} else {
				kept = append(kept, e)
			}
		}
		inflight = kept
		// Views read what was stamped (a replica reads with a small lag).
		for fullRead < len(log) {
			e := log[fullRead]
			full.logTime = e.ts
			full.applyLocked(e.seq, e.ts, &e.ev)
			fullRead++
			snap := map[string]holding{}
			for q, h := range full.holders {
				snap[q] = *h
			}
			hist = append(hist, snap)
		}
		for _, r := range reps {
			if r.dead {
				continue
			}
			for r.read < len(log) && log[r.read].ts.Before(now.Add(-time.Duration(rng.IntN(30))*time.Millisecond)) {
				e := log[r.read]
				if e.ts.After(r.c.logTime) {
					r.c.logTime = e.ts
				}
				r.c.readLocked(readEvent{e.seq, e.ts, e.ev})
				r.read++
				// A claim read back ends its Claim call (judged or not).
				kept := r.claims[:0]
				for _, cl := range r.claims {
					if e.ev.Kind == "claim" && e.ev.Replica == r.c.opts.ReplicaID && e.ev.N == cl.n {
						delete(r.c.pending, cl.n)
						delete(r.c.claiming, cl.queue)
						continue
					}
					kept = append(kept, cl)
				}
				r.claims = kept
				if traceSeed == int(seed) && (e.ev.Queue == traceQueue || len(e.ev.Holds) > 0 || e.ev.Kind == "sync") {
					t.Logf("trace %s applied %d %s %s ready=%v -> %+v maybe %+v", r.c.opts.ReplicaID, e.seq, e.ev.Kind, e.ev.Replica, r.c.ready, r.c.holders[traceQueue], r.c.maybe[traceQueue])
				}
				if r.c.ready {
					checkAgreement(t, seed, r, hist[e.seq-1], e, queues)
				}
			}
		}
		// Each replica acts.
		for _, r := range reps {
			if r.dead {
				continue
			}
			c := r.c
			// Lost holdings (watchLeases).
			for _, q := range queues {
				if o := c.owned[q]; o != nil && now.Sub(o.confirmed) > opts.Lease-opts.StopSlack {
					c.endLocked(o)
				}
			}
			if !c.ready {
				continue
			}
			if !now.Before(r.nextHB) {
				r.nextHB = now.Add(opts.Heartbeat)
				c.counter++
				var holds []hold
				for _, q := range queues {
					if o := c.owned[q]; o != nil {
						holds = append(holds, hold{Queue: o.queue, Claim: o.claim})
					}
				}
				c.sent[c.counter] = now
				if now.After(r.stalled) {
					send(&inflight, rng, now, r, logEvent{Kind: "hb", Holds: holds, N: c.counter})
				}
			}
			switch x := rng.IntN(1000); {
			case x < 15: // claim a queue it does not hold
				q := queues[rng.IntN(len(queues))]
				// As Claim: one claim of a queue in flight at a time.
				if c.owned[q] == nil && c.claiming[q] == nil && (c.liveHolderLocked(q) == nil || rng.IntN(4) == 0) {
					c.counter++
					n := c.counter
					c.sent[n] = now
					c.pending[n] = make(chan claimResult, 1)
					c.claiming[q] = make(chan struct{})
					r.claims = append(r.claims, simClaim{q, n})
					send(&inflight, rng, now, r, logEvent{Kind: "claim", Queue: q, N: n})
				}
			case x < 20: // release one
				for _, q := range queues {
					if o := c.owned[q]; o != nil {
						c.endLocked(o)
						send(&inflight, rng, now, r, logEvent{Kind: "release", Queue: o.queue, Claim: o.claim})
						break
					}
				}
			case x < 22: // its writes stall for a while
				r.stalled = now.Add(time.Duration(500+rng.IntN(3000)) * time.Millisecond)
			case x < 23: // crash, and a new replica starts
				r.dead = true
				start()
			}
		}
		// Safety: at most one replica acts on a queue.
		for _, q := range queues {
			var acting []string
			for _, r := range reps {
				if o := r.c.owned[q]; !r.dead && o != nil && now.Sub(o.confirmed) <= opts.Lease-opts.StopSlack {
					acting = append(acting, r.c.opts.ReplicaID)
				}
			}
			if len(acting) > 1 {
				t.Fatalf("seed %d at %v: %v all act on %s", seed, now.Sub(epoch), acting, q)
			}
		}
	}
}

// send puts ev on its way to the server: it arrives after a short delay, or a long one now and
// then.
func send(inflight *[]simEvent, rng *rand.Rand, now time.Time, r *simReplica, ev logEvent) {
	ev.Replica = r.c.opts.ReplicaID
	ev.Addr = ev.Replica + ":1"
	// Through JSON, as on the wire.
	b, _ := json.Marshal(ev)
	var back logEvent
	_ = json.Unmarshal(b, &back)
	d := time.Duration(rng.IntN(40)) * time.Millisecond
	if rng.IntN(50) == 0 {
		d = time.Duration(rng.IntN(1500)) * time.Millisecond
	}
	// One replica's writes arrive in order (Cluster.publish writes one at a time).
	at := now.Add(d)
	if !at.After(r.lastArrival) {
		at = r.lastArrival.Add(time.Millisecond)
	}
	r.lastArrival = at
	*inflight = append(*inflight, simEvent{ts: at, ev: back})
}

var dumpLog func(q string)

var traceSeed, traceQueue = -1, ""

func checkAgreement(t *testing.T, seed uint64, r *simReplica, whole map[string]holding, e simEvent, queues []string) {
	live := func(h *holding) *holding {
		if h == nil || e.ts.Sub(h.last) > r.c.opts.Lease {
			return nil
		}
		return h
	}
	self := r.c.opts.ReplicaID
	for _, q := range queues {
		a := live(r.c.holders[q])
		var b *holding
		if h, ok := whole[q]; ok {
			b = live(&h)
		}
		// A view may know less than the whole log, but only on the safe side: it must never
		// let a claim through that the log refuses, nor count itself the holder of a queue
		// another replica holds.
		var bad string
		switch {
		case b != nil && a == nil && !r.c.maybe[q].blocks(e.ts):
			bad = "takes as free"
		case a != nil && a.replica == self && (b == nil || b.replica != self || b.claim != a.claim):
			bad = "takes itself for the holder of"
		}
		if bad != "" {
			if dumpLog != nil {
				dumpLog(q)
			}
			t.Fatalf("seed %d after seq %d (%s from %s): %s %s %s (held by %+v), the whole log says %+v",
				seed, e.seq, e.ev.Kind, e.ev.Replica, self, bad, q, a, b)
		}
	}
}
