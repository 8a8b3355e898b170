package cluster

import (
	"context"
	"crypto/rand"
	"slices"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
)

func (e *testEnv) ackLog(window time.Duration) *AckLog {
	e.t.Helper()
	a, err := OpenAckLog(AckLogOptions{Client: e.dial(), Channel: e.channel + ".acks", Window: window, FlushEvery: 50 * time.Millisecond, Logger: zaptest.NewLogger(e.t)})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = a.Close(context.Background()) })
	return a
}

func newKey() Key {
	var k Key
	_, _ = rand.Read(k[:])
	return k
}

func syncAcks(t *testing.T, a *AckLog) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.Sync(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestAckLogSettlementsReachOtherReplicas(t *testing.T) {
	e := newTestEnv(t)
	a, b := e.ackLog(time.Minute), e.ackLog(time.Minute)
	x, y := newKey(), newKey()
	acked := make([]Key, 5000) // more than one batch
	for i := range acked {
		acked[i] = newKey()
	}
	other := newKey()
	a.Settle("q", x, acked...)
	syncAcks(t, a) // a's pending settlements are written first
	syncAcks(t, b)
	for i, k := range acked {
		if !b.Settled(x, k) {
			t.Fatalf("settlement %d of %d not seen by another replica", i, len(acked))
		}
	}
	if b.Settled(x, other) || b.Settled(y, acked[0]) {
		t.Fatal("an unsettled lease reads as settled")
	}
	// An owner that retires has every lease settled.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.Retire(ctx, "q", y); err != nil {
		t.Fatal(err)
	}
	syncAcks(t, b)
	if !b.Settled(y, other) {
		t.Fatal("a retired owner's lease reads as unsettled")
	}
	// A replica that starts later reads the window back.
	c := e.ackLog(time.Minute)
	syncAcks(t, c)
	if !c.Settled(x, acked[4999]) || !c.Settled(y, other) {
		t.Fatal("a later replica does not see earlier settlements")
	}
}

func TestAckLogForgetsAfterTheWindow(t *testing.T) {
	e := newTestEnv(t)
	a := e.ackLog(300 * time.Millisecond)
	x, k := newKey(), newKey()
	a.Settle("q", x, k)
	syncAcks(t, a)
	if !a.Settled(x, k) {
		t.Fatal("not settled")
	}
	deadline := time.Now().Add(5 * time.Second)
	for a.Settled(x, k) {
		if time.Now().After(deadline) {
			t.Fatal("a settlement outlived its window")
		}
		time.Sleep(20 * time.Millisecond)
	}
	a.NoteTaken("q", x, 1, 5)
	syncAcks(t, a)
	if len(a.TakenOf("q", time.Time{})) != 1 {
		t.Fatal("a taken range was not read back")
	}
	for len(a.TakenOf("q", time.Time{})) != 0 {
		if time.Now().After(deadline.Add(5 * time.Second)) {
			t.Fatal("a taken range outlived its window")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestAckLogTakenReachesOtherReplicas: the sequence ranges an owner notes taken reach another
// replica, merged where they follow each other, and one that starts later; TakenOf reads them
// by queue and by when they were read.
func TestAckLogTakenReachesOtherReplicas(t *testing.T) {
	e := newTestEnv(t)
	a, b := e.ackLog(time.Minute), e.ackLog(time.Minute)
	x := newKey()
	a.NoteTaken("q", x, 1, 10)
	a.NoteTaken("q", x, 11, 20) // follows: one range
	a.NoteTaken("q", x, 30, 30)
	a.NoteTaken("other", newKey(), 5, 6)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.Retire(ctx, "q", x); err != nil {
		t.Fatal(err)
	}
	syncAcks(t, a) // writes the other owner's range too
	syncAcks(t, b)
	want := [][2]uint64{{1, 20}, {30, 30}}
	if got := b.TakenOf("q", time.Now().Add(-time.Minute)); !slices.Equal(got, want) {
		t.Fatalf("TakenOf(q) = %v, want %v", got, want)
	}
	if got := b.TakenOf("q", time.Now().Add(time.Second)); len(got) != 0 {
		t.Fatalf("TakenOf(q) since later = %v, want none", got)
	}
	if got := b.TakenOf("none", time.Now().Add(-time.Minute)); len(got) != 0 {
		t.Fatalf("TakenOf(none) = %v", got)
	}
	c := e.ackLog(time.Minute)
	syncAcks(t, c)
	if got := c.TakenOf("other", time.Now().Add(-time.Minute)); !slices.Equal(got, [][2]uint64{{5, 6}}) {
		t.Fatalf("a later replica reads TakenOf(other) = %v", got)
	}
}
