package cluster

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/kubemq-io/kubemq-proxy/internal/kubemqtest"
	"github.com/kubemq-io/kubemq-proxy/kubemqclient"
)

// testOpts are short leases, so takeovers take seconds.
func testOpts() Options {
	return Options{Lease: 2 * time.Second, Heartbeat: 200 * time.Millisecond, StopSlack: 800 * time.Millisecond}
}

type testEnv struct {
	t       *testing.T
	addr    string
	channel string
}

func newTestEnv(t *testing.T) *testEnv {
	return &testEnv{t: t, addr: kubemqtest.Address(t), channel: "clustertest.owners." + randomID()}
}

func (e *testEnv) dial() *kubemqclient.Client {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := kubemqclient.Dial(ctx, kubemqclient.Options{Address: e.addr, Logger: zaptest.NewLogger(e.t).Named("kubemq")})
	if err != nil {
		e.t.Fatal(err)
	}
	if err := c.WaitReady(ctx); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { c.Close() })
	return c
}

// replica opens a Cluster on its own client; it is closed at cleanup unless the test did.
func (e *testEnv) replica(id string, mod ...func(*Options)) *Cluster {
	e.t.Helper()
	o := testOpts()
	o.Client, o.Channel, o.ReplicaID, o.Advertise = e.dial(), e.channel, id, id+".peer:7946"
	o.Logger = zaptest.NewLogger(e.t)
	for _, f := range mod {
		f(&o)
	}
	c, err := Open(o)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = c.Close(context.Background()) })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := c.WaitReady(ctx); err != nil {
		e.t.Fatalf("replica %s not ready: %v", id, err)
	}
	return c
}

func claim(t *testing.T, c *Cluster, q string) (*Ownership, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return c.Claim(ctx, q)
}

// waitOwner waits until every view names the same live owner of q, and returns it.
func waitOwner(t *testing.T, q string, cs ...*Cluster) Member {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var first Member
		agree := true
		for i, c := range cs {
			m, ok := c.Owner(q)
			if !ok || (i > 0 && m != first) {
				agree = false
				break
			}
			if i == 0 {
				first = m
			}
		}
		if agree {
			return first
		}
		if time.Now().After(deadline) {
			for _, c := range cs {
				m, ok := c.Owner(q)
				t.Logf("%s sees %+v %v", c.ID(), m, ok)
			}
			t.Fatalf("views of %s's owner do not agree", q)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestClaimRaceHasOneWinner(t *testing.T) {
	e := newTestEnv(t)
	cs := []*Cluster{e.replica("a"), e.replica("b"), e.replica("c")}
	for round := range 5 {
		q := fmt.Sprintf("clustertest.q%d.%s", round, randomID())
		var wg sync.WaitGroup
		owns := make([]*Ownership, len(cs))
		errs := make([]error, len(cs))
		for i, c := range cs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				owns[i], errs[i] = claim(t, c, q)
			}()
		}
		wg.Wait()
		winner := -1
		for i := range cs {
			var oe *OwnedError
			switch {
			case errs[i] == nil:
				if winner >= 0 {
					t.Fatalf("round %d: %s and %s both own %s", round, cs[winner].ID(), cs[i].ID(), q)
				}
				winner = i
			case errors.As(errs[i], &oe):
			default:
				t.Fatalf("round %d: %s: %v", round, cs[i].ID(), errs[i])
			}
		}
		if winner < 0 {
			t.Fatalf("round %d: nobody owns %s: %v", round, q, errs)
		}
		for i := range cs {
			var oe *OwnedError
			if i != winner && (!errors.As(errs[i], &oe) || oe.Owner.ID != cs[winner].ID() || oe.Owner.Addr != cs[winner].ID()+".peer:7946") {
				t.Errorf("round %d: %s was told %v, want owned by %s", round, cs[i].ID(), errs[i], cs[winner].ID())
			}
		}
		if m := waitOwner(t, q, cs...); m.ID != cs[winner].ID() {
			t.Fatalf("round %d: views agree on %s, the winner is %s", round, m.ID, cs[winner].ID())
		}
		_ = owns[winner].Release(context.Background())
	}
}

func TestReleaseHandsOverAtOnce(t *testing.T) {
	e := newTestEnv(t)
	a, b := e.replica("a"), e.replica("b")
	q := "clustertest.rel." + randomID()
	o, err := claim(t, a, q)
	if err != nil {
		t.Fatal(err)
	}
	waitOwner(t, q, a, b)
	if _, err := claim(t, b, q); err == nil {
		t.Fatal("b claimed a queue a holds")
	}
	if err := o.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-o.Lost():
	default:
		t.Fatal("a released holding is not Lost")
	}
	start := time.Now()
	for {
		_, err := claim(t, b, q)
		if err == nil {
			break
		}
		if time.Since(start) > time.Second {
			t.Fatalf("b still refused %v after a's release (a lease is %v): %v", time.Since(start), a.Lease(), err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if m := waitOwner(t, q, a, b); m.ID != "b" {
		t.Fatalf("owner %s after the handover", m.ID)
	}
}

// HeldElsewhereSince tells a new owner whether another replica held the queue after a time: after
// a handover yes, for a queue only it ever held no, and for a time after the other's holding no.
func TestHeldElsewhereSince(t *testing.T) {
	e := newTestEnv(t)
	a, b := e.replica("a"), e.replica("b")
	q, mine := "clustertest.elsewhere."+randomID(), "clustertest.mine."+randomID()
	start := time.Now()
	ob, err := claim(t, b, q)
	if err != nil {
		t.Fatal(err)
	}
	waitOwner(t, q, a, b)
	if err := ob.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	var oa *Ownership
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if oa, err = claim(t, a, q); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a cannot claim %s after b released it: %v", q, err)
		}
	}
	afterB := time.Now()
	if !oa.HeldElsewhereSince(start) {
		t.Fatal("a's holding does not say that b held the queue since before b's claim")
	}
	if oa.HeldElsewhereSince(afterB) {
		t.Fatal("a's holding says another replica held the queue after a took it")
	}
	om, err := claim(t, a, mine)
	if err != nil {
		t.Fatal(err)
	}
	waitOwner(t, mine, a, b)
	time.Sleep(3 * a.opts.Heartbeat) // a's own heartbeats naming it are read back
	if om.HeldElsewhereSince(start) {
		t.Fatal("a queue only a held is said to have been held elsewhere")
	}
	if ob2, err := claim(t, b, mine); err == nil {
		t.Fatalf("b claimed %s, which a holds: %v", mine, ob2.Queue())
	}
}

// A replica that dies holding a queue (no release, no more heartbeats) loses it a lease after its
// last heartbeat, not before.
func TestTakeoverAfterALease(t *testing.T) {
	e := newTestEnv(t)
	a, b := e.replica("a"), e.replica("b")
	q := "clustertest.crash." + randomID()
	o, err := claim(t, a, q)
	if err != nil {
		t.Fatal(err)
	}
	waitOwner(t, q, a, b)
	a.kill()
	select {
	case <-o.Lost():
	default:
		t.Fatal("a killed replica's holding is not Lost")
	}
	died := time.Now()
	var owned time.Duration
	for {
		_, err := claim(t, b, q)
		if err == nil {
			owned = time.Since(died)
			break
		}
		var oe *OwnedError
		if !errors.As(err, &oe) {
			t.Fatal(err)
		}
		if time.Since(died) > 3*a.Lease() {
			t.Fatalf("no takeover %v after a died", time.Since(died))
		}
		time.Sleep(50 * time.Millisecond)
	}
	// a's last heartbeat may have gone out just before it died.
	if owned < a.Lease()-2*a.opts.Heartbeat {
		t.Fatalf("b took over %v after a died, within a lease (%v)", owned, a.Lease())
	}
	t.Logf("takeover %v after the owner died (lease %v)", owned, a.Lease())
}

// A holder whose heartbeats stop being written is told to stop (Lost) before anyone else can
// claim the queue, StopSlack ahead of the lease's end.
func TestLostBeforeAnotherClaimCanWin(t *testing.T) {
	e := newTestEnv(t)
	a, b := e.replica("a"), e.replica("b")
	q := "clustertest.cut." + randomID()
	o, err := claim(t, a, q)
	if err != nil {
		t.Fatal(err)
	}
	waitOwner(t, q, a, b)
	a.mu.Lock()
	a.mute = true // heartbeats are no longer written (a KubeMQ that stopped taking them)
	a.mu.Unlock()
	cut := time.Now()
	var lostAt time.Duration
	for lostAt == 0 {
		select {
		case <-o.Lost():
			lostAt = time.Since(cut)
		default:
			if _, err := claim(t, b, q); err == nil {
				t.Fatalf("b won %v after the cut, before a was told to stop", time.Since(cut))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	var wonAt time.Duration
	for wonAt == 0 {
		if _, err := claim(t, b, q); err == nil {
			wonAt = time.Since(cut)
		} else if time.Since(cut) > 3*a.Lease() {
			t.Fatalf("b never won: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if wonAt-lostAt < a.opts.StopSlack/2 {
		t.Fatalf("a told to stop %v after the cut, b won at %v: less than the stop slack apart", lostAt, wonAt)
	}
	t.Logf("a stopped %v after its heartbeats stopped; b won at %v", lostAt, wonAt)
}

// A replica that starts after a queue was claimed learns its owner from the heartbeats.
func TestLateReplicaSeesTheOwner(t *testing.T) {
	e := newTestEnv(t)
	a := e.replica("a")
	q := "clustertest.late." + randomID()
	if _, err := claim(t, a, q); err != nil {
		t.Fatal(err)
	}
	// Longer than the window a new replica reads back: the claim itself is out of its view.
	time.Sleep(a.opts.window() + time.Second)
	b := e.replica("b")
	if m, ok := b.Owner(q); !ok || m.ID != "a" || m.Addr != "a.peer:7946" {
		t.Fatalf("b sees owner %+v %v", m, ok)
	}
	var oe *OwnedError
	if _, err := claim(t, b, q); !errors.As(err, &oe) || oe.Owner.ID != "a" {
		t.Fatalf("b's claim: %v", err)
	}
	if got := b.Members(); len(got) != 2 {
		t.Fatalf("members %v", got)
	}
}

// A graceful leave: holdings released, then Close; the others see the replica gone at once.
func TestCloseLeaves(t *testing.T) {
	e := newTestEnv(t)
	a, b := e.replica("a"), e.replica("b")
	q := "clustertest.leave." + randomID()
	o, err := claim(t, a, q)
	if err != nil {
		t.Fatal(err)
	}
	if err := o.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(b.Members()) != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("members after a left: %v", b.Members())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := claim(t, b, q); err != nil {
		t.Fatal(err)
	}
}

// kill stops c as a crash would: nothing more is written, holdings end locally.
func (c *Cluster) kill() {
	c.mu.Lock()
	c.closed = true
	for _, o := range c.owned {
		c.endLocked(o)
	}
	c.mu.Unlock()
	c.cancel()
	c.wg.Wait()
}

// uses makes a replica report a fixed set of consumed queues.
func uses(qs ...string) func(*Cluster) {
	return func(c *Cluster) { c.ReportUses(func() []string { return append([]string(nil), qs...) }) }
}

// waitOrphaned polls c.Orphaned until it equals want (in order), for at most d, and returns how
// long that took.
func waitOrphaned(t *testing.T, c *Cluster, d time.Duration, want ...string) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		got := c.Orphaned()
		if fmt.Sprint(got) == fmt.Sprint(want) && (len(got) > 0) == (len(want) > 0) {
			return time.Since(start)
		}
		if time.Since(start) > d {
			t.Fatalf("%s: orphaned %q after %v, want %q", c.ID(), got, d, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A replica that dies leaves the queues only its clients consumed orphaned, once it has been
// silent for two leases, and for two leases after that; a queue another replica's clients still
// consume is not.
func TestOrphanedAfterACrash(t *testing.T) {
	e := newTestEnv(t)
	a, b, c := e.replica("a"), e.replica("b"), e.replica("c")
	uses("q1", "q2")(a)
	uses("q2")(b)
	uses()(c)
	time.Sleep(3 * a.opts.Heartbeat) // every replica has reported its uses
	for _, v := range []*Cluster{a, b, c} {
		if got := v.Orphaned(); len(got) != 0 {
			t.Fatalf("%s: orphaned %q while everybody is alive", v.ID(), got)
		}
	}
	a.kill()
	took := waitOrphaned(t, b, 4*a.Lease(), "q1")
	if took < 2*a.Lease()-2*a.opts.Heartbeat {
		t.Fatalf("orphaned %v after the replica died, before two leases (%v)", took, 2*a.Lease())
	}
	waitOrphaned(t, c, time.Second, "q1")
	t.Logf("orphaned %v after the replica died (lease %v)", took, a.Lease())
	waitOrphaned(t, b, 3*a.Lease())
}

// A replica heard under a new process without a clean stop orphans its earlier clients' queues at
// once; a clean stop orphans nothing.
func TestOrphanedAtRestart(t *testing.T) {
	e := newTestEnv(t)
	a, b := e.replica("a"), e.replica("b")
	uses("q1")(a)
	uses()(b)
	time.Sleep(3 * a.opts.Heartbeat)
	a.kill()
	a2 := e.replica("a")
	uses()(a2)
	took := waitOrphaned(t, b, 2*a.Lease(), "q1")
	if took > a.Lease() {
		t.Fatalf("orphaned %v after the restart, want well within a lease", took)
	}
	waitOrphaned(t, a2, time.Second, "q1")

	// A clean stop: the restarted process leaves nothing behind.
	uses("q3")(a2)
	time.Sleep(3 * a.opts.Heartbeat)
	if err := a2.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	a3 := e.replica("a")
	uses()(a3)
	time.Sleep(2*a.Lease() + 5*a.opts.Heartbeat)
	for _, q := range b.Orphaned() {
		if q == "q3" {
			t.Fatalf("orphaned %q after a clean stop", b.Orphaned())
		}
	}
}

// Nothing is orphaned while a replica that may be alive has not reported what it consumes.
func TestOrphanedWaitsForUnknownUses(t *testing.T) {
	e := newTestEnv(t)
	a, b, c := e.replica("a"), e.replica("b"), e.replica("c")
	uses("q1")(a)
	uses()(b)
	time.Sleep(3 * a.opts.Heartbeat)
	a.kill()
	time.Sleep(2*a.Lease() + 3*a.opts.Heartbeat)
	if got := b.Orphaned(); len(got) != 0 {
		t.Fatalf("orphaned %q while c has not reported its uses", got)
	}
	uses()(c)
	waitOrphaned(t, b, 2*a.Lease(), "q1")
}

// A replica alone that crashes is a whole broker restarting: whether it comes back under its id
// or another, the queues its clients consumed are not orphaned.
func TestLoneCrashOrphansNothing(t *testing.T) {
	e := newTestEnv(t)
	a := e.replica("a")
	x := e.replica("x")
	uses("q1")(a)
	uses("q2")(x)
	time.Sleep(3 * a.opts.Heartbeat)
	a.kill()
	x.kill()
	a2 := e.replica("a") // same id
	y := e.replica("y")  // a new id
	uses()(a2)
	uses()(y)
	for end := time.Now().Add(3 * a.Lease()); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		for _, v := range []*Cluster{a2, y} {
			if got := v.Orphaned(); len(got) != 0 {
				t.Fatalf("%s: orphaned %q after the whole fleet restarted", v.ID(), got)
			}
		}
	}
}
