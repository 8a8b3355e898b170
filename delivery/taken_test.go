package delivery

import (
	"context"
	"strconv"
	"testing"
	"time"
)

// TestTakenRemembersAckedBatches: Taken reports the sequences of the batches the Consumer
// took and acknowledged within the window, and no others.
func TestTakenRemembersAckedBatches(t *testing.T) {
	f := newFakeKubeMQ(t)
	c, _ := newTestConsumer(t, f, Options{})
	defer closeConsumer(t, c)
	f.send(t, testQueue, ids(10, "a")...)
	out := fetchFor(t, c, 10, 10*time.Second)
	if len(out) != 10 {
		t.Fatalf("fetched %d of 10", len(out))
	}
	taken := c.Taken(time.Minute)
	var hi uint64
	for _, d := range out {
		if d.Sequence == 0 {
			t.Fatalf("delivery %s has no sequence", d.MessageID)
		}
		if !taken(d.Sequence) {
			t.Errorf("sequence %d of %s not reported taken", d.Sequence, d.MessageID)
		}
		hi = max(hi, d.Sequence)
	}
	if taken(0) || taken(hi+1000) {
		t.Errorf("sequences never taken reported taken")
	}
	time.Sleep(20 * time.Millisecond)
	if old := c.Taken(10 * time.Millisecond); old(out[0].Sequence) {
		t.Errorf("a batch taken before the window reported taken")
	}
}

// TestNoteTakenRanges: the sequences taken are kept as ranges, in any order and with repeats;
// consecutive batches merge into one range; what is older than takenKeep, and the oldest ranges
// past maxTakenRanges, are forgotten.
func TestNoteTakenRanges(t *testing.T) {
	c := &Consumer{}
	now := time.Now()
	c.noteTaken([]Message{{Sequence: 7}, {Sequence: 5}, {Sequence: 6}, {Sequence: 6}, {Sequence: 9}, {}}, now)
	taken := c.Taken(time.Minute)
	for s, want := range map[uint64]bool{4: false, 5: true, 6: true, 7: true, 8: false, 9: true, 10: false, 0: false} {
		if taken(s) != want {
			t.Errorf("taken(%d) = %v, want %v", s, !want, want)
		}
	}
	if len(c.taken) != 2 {
		t.Errorf("ranges %v, want 5-7 and 9", c.taken)
	}
	c.noteTaken([]Message{{Sequence: 10}, {Sequence: 11}}, now.Add(time.Second))
	if len(c.taken) != 2 || c.taken[1].hi != 11 {
		t.Errorf("ranges %v, want 5-7 and 9-11", c.taken)
	}
	c.noteTaken([]Message{{Sequence: 20}}, now.Add(takenKeep+time.Millisecond))
	if len(c.taken) != 2 || c.taken[0].lo != 9 {
		t.Errorf("after takenKeep: ranges %v, want 9-11 and 20", c.taken)
	}
	at := now.Add(takenKeep)
	for i := range maxTakenRanges + 10 {
		c.noteTaken([]Message{{Sequence: uint64(100 + 2*i)}}, at)
	}
	if len(c.taken) != maxTakenRanges || c.taken[0].lo != uint64(100+20) {
		t.Errorf("%d ranges from %d, want %d from %d", len(c.taken), c.taken[0].lo, maxTakenRanges, 100+20)
	}
}

// TestGetDropsRetakenCopies: when acknowledged messages come back to the queue's head under
// their own sequences (the real server's settlement race, emulated by the fake), the poll loop
// drops them: every message is delivered once, and a nacked message, a new copy, still comes
// back.
func TestGetDropsRetakenCopies(t *testing.T) {
	f := newFakeKubeMQ(t)
	echoes := 0
	f.ackEcho = func(_ string, msgs []Message) int {
		if echoes >= 6 {
			return 0
		}
		echoes++
		return 2
	}
	c, _ := newTestConsumer(t, f, Options{})
	defer closeConsumer(t, c)
	seen := map[string]int{}
	var out []*Delivery
	for round := range 4 {
		f.send(t, testQueue, ids(10, "r"+strconv.Itoa(round)+"-")...)
		got := fetchFor(t, c, 10, 10*time.Second)
		if len(got) != 10 {
			t.Fatalf("round %d: fetched %d of 10", round, len(got))
		}
		out = append(out, got...)
	}
	extra := fetchFor(t, c, 1, 1500*time.Millisecond)
	for _, d := range append(out, extra...) {
		seen[d.MessageID]++
		if seen[d.MessageID] > 1 {
			t.Errorf("%s delivered %d times", d.MessageID, seen[d.MessageID])
		}
	}
	if len(extra) != 0 {
		t.Errorf("%d deliveries after all 40", len(extra))
	}
	st := c.Stats()
	if st.Retaken == 0 || echoes == 0 {
		t.Errorf("the fake echoed %d batches and the Consumer dropped %d copies", echoes, st.Retaken)
	}
	if st.Received != 40 {
		t.Errorf("received %d data messages for 40", st.Received)
	}
	if !c.Nack(out[0].LeaseID, 0) {
		t.Fatalf("Nack %s refused", out[0].MessageID)
	}
	back := fetchFor(t, c, 1, 10*time.Second)
	if len(back) != 1 || back[0].MessageID != out[0].MessageID {
		t.Fatalf("after a nack got %v, want %s again", back, out[0].MessageID)
	}
}

// TestBrokenStreamForgetsTaken: a broken stream (which a KubeMQ restarted on an empty store
// causes, numbering the queue's copies from 1 again) clears the sequences taken before it.
func TestBrokenStreamForgetsTaken(t *testing.T) {
	f := newFakeKubeMQ(t)
	c, cl := newTestConsumer(t, f, Options{})
	defer closeConsumer(t, c)
	f.send(t, testQueue, ids(5, "a")...)
	out := fetchFor(t, c, 5, 10*time.Second)
	if len(out) != 5 || !c.Taken(time.Minute)(out[0].Sequence) {
		t.Fatalf("fetched %d of 5, first taken %v", len(out), len(out) > 0 && c.Taken(time.Minute)(out[0].Sequence))
	}
	cl.breakStreams()
	deadline := time.Now().Add(10 * time.Second)
	for c.Stats().Resets == 0 && time.Now().Before(deadline) {
		// Demand makes the poll loop use the stream; the Fetch fails with the lost leases.
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		c.Fetch(ctx, 1)
		cancel()
	}
	if c.Stats().Resets == 0 {
		t.Fatal("the Consumer did not notice the broken stream")
	}
	if c.Taken(time.Minute)(out[0].Sequence) {
		t.Error("a sequence taken before the broken stream is still reported taken")
	}
}

// TestTakenPassesToTheNextOwner: with a TakenLog, a Consumer notes the sequence ranges it takes
// there, and the queue's next Consumer drops copies of them that KubeMQ hands out again (the
// real server's settlement race across a handover), delivering everything else.
func TestTakenPassesToTheNextOwner(t *testing.T) {
	f := newFakeKubeMQ(t)
	st := newFakeSettlements()
	a, _ := newTestConsumer(t, f, Options{Settlements: st})
	f.send(t, testQueue, ids(10, "a")...)
	out := fetchFor(t, a, 10, 10*time.Second)
	if len(out) != 10 {
		t.Fatalf("fetched %d of 10", len(out))
	}
	a.Ack(leaseIDs(out)...)
	closeConsumer(t, a)
	noted := st.TakenOf(testQueue, time.Time{})
	if len(noted) == 0 {
		t.Fatal("the first Consumer noted nothing taken")
	}
	// KubeMQ hands three of the acknowledged copies out again, under their sequences.
	f.mu.Lock()
	q := f.queue(testQueue)
	for _, d := range out[:3] {
		q.ready = append(q.ready, Message{ID: d.MessageID, Sequence: d.Sequence, Body: d.Body})
	}
	f.mu.Unlock()
	f.send(t, testQueue, ids(5, "b")...)
	b, _ := newTestConsumer(t, f, Options{Settlements: st})
	defer closeConsumer(t, b)
	got := fetchFor(t, b, 6, 3*time.Second)
	if len(got) != 5 {
		t.Errorf("the next Consumer delivered %d messages, want the 5 new ones", len(got))
	}
	for _, d := range got {
		if d.MessageID[0] != 'b' {
			t.Errorf("the next Consumer delivered %s again", d.MessageID)
		}
	}
	if n := b.Stats().Retaken; n != 3 {
		t.Errorf("Retaken %d, want 3", n)
	}
}

// TestNoteTakenByAnotherReader: sequences another reader took and acknowledged (NoteTaken)
// are dropped by the Consumer's Gets as its own are.
func TestNoteTakenByAnotherReader(t *testing.T) {
	f := newFakeKubeMQ(t)
	c, _ := newTestConsumer(t, f, Options{})
	defer closeConsumer(t, c)
	f.send(t, testQueue, ids(5, "a")...) // sequences 1..5
	c.NoteTaken([]uint64{2, 1, 0})
	got := fetchFor(t, c, 5, 2*time.Second)
	if len(got) != 3 || got[0].MessageID != "a2" {
		t.Errorf("delivered %d messages from %v, want a2, a3, a4", len(got), got)
	}
	if n := c.Stats().Retaken; n != 2 {
		t.Errorf("Retaken %d, want 2", n)
	}
}
