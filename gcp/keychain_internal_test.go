package gcp

import (
	"maps"
	"slices"
	"strconv"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/kubemq-io/kubemq-proxy/delivery"
)

// TestKeyChainsLinkAndUnlink: each copy names the previous one of its
// subscription and key; a publish that was not stored is taken out of the
// chain, unless a later message of the key was linked meanwhile.
func TestKeyChainsLinkAndUnlink(t *testing.T) {
	var c keyChains
	now := time.Now()
	if l := c.link("q", "k", "1", now); l.prev != "" {
		t.Fatalf("first link names %q", l.prev)
	}
	c.link("q2", "k", "x", now) // another subscription: a chain of its own
	l2 := c.link("q", "k", "2", now)
	l3 := c.link("q", "k", "3", now)
	if l2.prev != "1" || l3.prev != "2" {
		t.Fatalf("links %+v %+v", l2, l3)
	}
	c.unlink([]chainLink{l2, l3}) // the batch 2, 3 failed
	if l := c.link("q", "k", "4", now); l.prev != "1" {
		t.Fatalf("after a failed batch the next links to %q, want 1", l.prev)
	}
	l5 := c.link("q", "k", "5", now)
	c.link("q", "k", "6", now) // a concurrent publish linked after 5
	c.unlink([]chainLink{l5})
	if l := c.link("q", "k", "7", now); l.prev != "6" {
		t.Fatalf("an unlink undid a later link: next links to %q, want 6", l.prev)
	}
	if l := c.link("q2", "k", "y", now); l.prev != "x" {
		t.Fatalf("q2's chain: %q", l.prev)
	}
	// A previous message stored more than chainSpan before is not named, but the chain goes
	// on from the new one; an unlink of that one restores the old one.
	later := now.Add(chainSpan + time.Millisecond)
	l8 := c.link("q", "k", "8", later)
	if l8.prev != "" {
		t.Fatalf("a link to a message stored %v before: %q", chainSpan+time.Millisecond, l8.prev)
	}
	c.unlink([]chainLink{l8})
	if l := c.link("q", "k", "9", now.Add(time.Second)); l.prev != "7" {
		t.Fatalf("after unlinking 8 the next links to %q, want 7", l.prev)
	}
	if l := c.link("q", "k", "10", later); l.prev != "9" {
		t.Fatalf("within chainSpan: %q, want 9", l.prev)
	}
}

// TestPublishLinksOrderedCopies: copies in an ordered subscription carry
// the previous message of their key stored there (a filtered-out one is
// not in the chain); an unordered subscription's copies and unkeyed
// messages carry no link.
func TestPublishLinksOrderedCopies(t *testing.T) {
	e := newRTEnv(t, Config{})
	e.createTopic("t")
	all := e.createSub(&pubsubpb.Subscription{Name: e.sub("all"), Topic: e.topic("t")})
	even := e.createSub(&pubsubpb.Subscription{Name: e.sub("even"), Topic: e.topic("t"), Filter: `attributes.even = "y"`})
	if _, err := (&subscriber{s: e.s}).CreateSubscription(e.ctx, &pubsubpb.Subscription{Name: e.sub("plain"), Topic: e.topic("t"), AckDeadlineSeconds: 60}); err != nil {
		t.Fatal(err)
	}
	var msgs []*pubsubpb.PubsubMessage
	for i := range 5 {
		a := map[string]string{"i": strconv.Itoa(i)}
		if i%2 == 0 {
			a["even"] = "y"
		}
		msgs = append(msgs, &pubsubpb.PubsubMessage{Data: []byte("m"), Attributes: a, OrderingKey: "k"})
	}
	resp, err := (&publisher{s: e.s}).Publish(e.ctx, &pubsubpb.PublishRequest{Topic: e.topic("t"), Messages: msgs})
	if err != nil {
		t.Fatal(err)
	}
	_, err = (&publisher{s: e.s}).Publish(e.ctx, &pubsubpb.PublishRequest{Topic: e.topic("t"), Messages: []*pubsubpb.PubsubMessage{
		{Data: []byte("m"), Attributes: map[string]string{"i": "5", "even": "y"}}}})
	if err != nil {
		t.Fatal(err)
	}
	ids := resp.GetMessageIds()
	prevs := func(rt *subRuntime, n int) map[int]string {
		f := newFlow(100, 0)
		out := map[int]string{}
		for _, m := range e.take(rt, f, n) {
			rt.mu.Lock()
			out[msgNum(m)] = leaseOf(rt, m.GetAckId()).d.Tags[TagPrevID]
			rt.mu.Unlock()
			if _, leaked := m.GetMessage().GetAttributes()[TagPrevID]; leaked {
				t.Fatalf("the link reached the subscriber: %v", m.GetMessage().GetAttributes())
			}
		}
		return out
	}
	if got, want := prevs(all, 6), map[int]string{0: "", 1: ids[0], 2: ids[1], 3: ids[2], 4: ids[3], 5: ""}; !maps.Equal(got, want) {
		t.Fatalf("ordered subscription's links %v, want %v", got, want)
	}
	if got, want := prevs(even, 4), map[int]string{0: "", 2: ids[0], 4: ids[2], 5: ""}; !maps.Equal(got, want) {
		t.Fatalf("filtered subscription's links %v, want %v", got, want)
	}
	se, _ := e.s.cat.sub("sub-plain")
	plain, release, err := e.s.runtime(e.ctx, se)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if got := prevs(plain, 6); !maps.Equal(got, map[int]string{0: "", 1: "", 2: "", 3: "", 4: "", 5: ""}) {
		t.Fatalf("unordered subscription's links %v", got)
	}
}

// TestKeyWaitsForLinkedMessage: KubeMQ hands out messages 3 and 4 of a
// key before 1 and 2 (docs/kubemq.md 10.6). Message 3 names 2 as its
// previous one, which the runtime has not seen although it saw 0: the key
// waits, and the subscriber gets 1, 2, 3, 4 in order once 1 and 2 come.
// A linked message that never comes holds its key for chainWait only; a
// runtime that has seen nothing of a key from that process waits for
// nothing.
func TestKeyWaitsForLinkedMessage(t *testing.T) {
	e, rt, f, ids := newChainFixture(t, 8)
	now := time.Now()
	msg := func(key, id, prev string, i int) *delivery.Delivery { return f.msg(key, id, prev, i, now) }
	accept := f.accept
	if got := accept(msg("k", ids[0], "", 0)); !slices.Equal(got, []int{0}) {
		t.Fatalf("first message: handed out %v", got)
	}
	if got := accept(msg("k", ids[3], ids[2], 3), msg("k", ids[4], ids[3], 4)); len(got) != 0 {
		t.Fatalf("3 and 4 before 1 and 2: handed out %v at once", got)
	}
	if got := accept(msg("k", ids[1], ids[0], 1), msg("k", ids[2], ids[1], 2)); len(got) != 0 {
		t.Fatalf("1 and 2 went out ahead of the pending ones: %v", got)
	}
	if got := nums(e.take(rt, f.flow, 4)); !slices.Equal(got, []int{1, 2, 3, 4}) {
		t.Fatalf("the key went out as %v, want 1 2 3 4", got)
	}
	// 5 never comes: 6 waits for it at most chainWait.
	start := time.Now()
	if got := accept(msg("k", ids[6], ids[5], 6)); len(got) != 0 {
		t.Fatalf("6 handed out at once although 5 did not come: %v", got)
	}
	if got := nums(e.take(rt, f.flow, 1)); !slices.Equal(got, []int{6}) {
		t.Fatalf("got %v, want 6", got)
	}
	if waited := time.Since(start); waited < chainWait-100*time.Millisecond || waited > chainWait+3*time.Second {
		t.Fatalf("6 waited %v for the message it names, want about %v", waited, chainWait)
	}
	// Another key, first seen with a link: nothing to compare with, no wait.
	if got := accept(msg("k2", ids[7], ids[5], 7)); !slices.Equal(got, []int{7}) {
		t.Fatalf("a key's first message here: handed out %v", got)
	}
}

// TestKeyFirstSeenWaitsForLinkedMessage: a runtime that has seen nothing of a key yet waits for
// the message a copy names when that copy was published more than chainSpan (plus clockSkew)
// after the runtime began to see every message: the named one was stored after that, so it
// must come here (KubeMQ made it visible late). A copy published sooner after the start, or
// after the runtime's marks started over, names one that may have gone out before: no wait.
func TestKeyFirstSeenWaitsForLinkedMessage(t *testing.T) {
	e, rt, fx, ids := newChainFixture(t, 6)
	msg, accept, f := fx.msg, fx.accept, fx.flow
	now := time.Now()
	// Just started: a key first seen with a link goes out at once.
	if got := accept(msg("fresh", ids[1], ids[0], 1, now)); !slices.Equal(got, []int{1}) {
		t.Fatalf("first seen %v after the start: handed out %v, want 1 at once", time.Since(rt.start).Round(time.Millisecond), got)
	}
	// The runtime began long enough ago: 3 names 2, which must come here.
	rt.mu.Lock()
	rt.marksFrom = now.Add(-(chainSpan + clockSkew + time.Second))
	rt.mu.Unlock()
	if got := accept(msg("k", ids[3], ids[2], 3, now)); len(got) != 0 {
		t.Fatalf("3 handed out before the 2 it names: %v", got)
	}
	if got := accept(msg("k", ids[2], "", 2, now.Add(-time.Millisecond))); len(got) != 0 {
		t.Fatalf("2 went out ahead of 3's wait ending: %v", got)
	}
	if got := nums(e.take(rt, f, 2)); !slices.Equal(got, []int{2, 3}) {
		t.Fatalf("the key went out as %v, want 2 3", got)
	}
	// Published before marksFrom + chainSpan + clockSkew: the named one may have gone out
	// before, no wait.
	if got := accept(msg("k2", ids[5], ids[4], 5, now.Add(-2*time.Second))); !slices.Equal(got, []int{5}) {
		t.Fatalf("published before the runtime saw everything: handed out %v, want 5 at once", got)
	}
}

// chainFixture feeds an ordered subscription's runtime fresh deliveries of keyed messages, as
// the lease engine would.
type chainFixture struct {
	rt   *subRuntime
	se   *subEntry
	flow *flow
	n    int
}

// newChainFixture is a runtime of a new subscription "s" of topic "t" and n message ids of one
// publishing process, in publish order.
func newChainFixture(t *testing.T, n int) (*rtEnv, *subRuntime, *chainFixture, []string) {
	e := newRTEnv(t, Config{})
	e.createTopic("t")
	rt := e.createSub(&pubsubpb.Subscription{Name: e.sub("s"), Topic: e.topic("t")})
	se, _ := e.s.cat.sub("sub-s")
	g := newIDGen()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = g.next()
	}
	return e, rt, &chainFixture{rt: rt, se: se, flow: newFlow(1000, 0)}, ids
}

// msg is message id of key (attribute i), naming prev as its previous one unless "".
func (f *chainFixture) msg(key, id, prev string, i int, published time.Time) *delivery.Delivery {
	f.n++
	tags := map[string]string{TagMessageID: id, TagPublishTime: formatPublishTime(published), TagOrderingKey: key, "i": strconv.Itoa(i)}
	if prev != "" {
		tags[TagPrevID] = prev
	}
	return &delivery.Delivery{LeaseID: "test-lease-" + strconv.Itoa(f.n), Attempt: 1, MessageID: id, Body: []byte("m"), Tags: tags, Sequence: uint64(f.n)}
}

// accept hands ds to the runtime and returns the numbers of those it handed out at once.
func (f *chainFixture) accept(ds ...*delivery.Delivery) []int {
	f.rt.mu.Lock()
	defer f.rt.mu.Unlock()
	return nums(f.rt.acceptLocked(f.se, ds, f.flow, time.Minute))
}
