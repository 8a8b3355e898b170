package delivery

import (
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

// TestNoteTakenRanges: the sequences of one batch are kept as ranges, in any order and with
// repeats, and the ring keeps the last takenBatches batches.
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
	if got := c.taken[0].ranges; len(got) != 2 {
		t.Errorf("ranges %v, want 5-7 and 9", got)
	}
	for i := range takenBatches {
		c.noteTaken([]Message{{Sequence: uint64(100 + i)}}, now)
	}
	taken = c.Taken(time.Minute)
	if taken(5) || !taken(100) || !taken(100+takenBatches-1) {
		t.Errorf("the ring kept the wrong batches")
	}
}
