package delivery

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// messageIDs lists the MessageIDs of ds in order.
func messageIDs(ds []*Delivery) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.MessageID
	}
	return out
}

func acquire(t *testing.T, m *Manager) *Handle {
	t.Helper()
	h, err := m.Acquire(context.Background(), testQueue)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// TestRequeueInPlace: a requeued delivery goes back to its original position in the ready
// buffer (before everything that came after it, in the order the queue gave them), comes back
// as the next attempt, and no copy is enqueued; closing the Consumer with it buffered keeps the
// attempt in the copy.
func TestRequeueInPlace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeKubeMQ(t)
		f.send(t, testQueue, ids(6, "m")...)
		m := newTestManager(t, f.client(), Options{})
		h := acquire(t, m)
		defer h.Close()
		h.SetReadAhead(6)
		first := fetchFor(t, h, 4, time.Second) // m0..m3 out, m4 m5 buffered
		if got := messageIDs(first); len(got) != 4 || got[0] != "m0" || got[3] != "m3" {
			t.Fatalf("first fetch %v", got)
		}
		if st := h.Consumer().Stats(); st.Buffered != 2 {
			t.Fatalf("buffered %d, want 2 read ahead", st.Buffered)
		}
		// Given back out of order: they return in queue order, ahead of m4 and m5.
		if ok := h.Requeue(first[2].LeaseID, first[0].LeaseID); !ok[0] || !ok[1] {
			t.Fatalf("Requeue = %v", ok)
		}
		if ok := h.Requeue(first[2].LeaseID); ok[0] {
			t.Error("second Requeue of the same delivery accepted")
		}
		if ok := h.Ack(first[0].LeaseID); ok[0] {
			t.Error("ack of a requeued delivery accepted")
		}
		again := fetchFor(t, h, 4, time.Second)
		want := []string{"m0", "m2", "m4", "m5"}
		if got := messageIDs(again); len(got) != 4 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] || got[3] != want[3] {
			t.Fatalf("after requeue got %v, want %v", got, want)
		}
		for i, d := range again {
			redelivered := i < 2
			if d.Redelivered != redelivered || d.Attempt != map[bool]int{true: 2, false: 1}[redelivered] {
				t.Errorf("%s: attempt %d redelivered %v", d.MessageID, d.Attempt, d.Redelivered)
			}
		}
		if r, _ := f.stored(testQueue); r != 0 {
			t.Errorf("%d messages in KubeMQ: a requeue enqueued a copy", r)
		}
		st := h.Consumer().Stats()
		if st.Redelivered != 0 || st.Requeued != 2 {
			t.Errorf("stats: %d copies, %d requeued; want 0 and 2", st.Redelivered, st.Requeued)
		}
		// m2 requeued again and left buffered: a Consumer that closes enqueues it with its
		// attempt (3) kept.
		h.Requeue(again[1].LeaseID)
		h.Ack(first[1].LeaseID, first[3].LeaseID, again[0].LeaseID, again[2].LeaseID, again[3].LeaseID)
		h.Close()
		if !m.Retire(testQueue) {
			t.Fatal("Retire = false")
		}
		h2 := acquire(t, m)
		defer h2.Close()
		last := fetchFor(t, h2, 1, 2*time.Second)
		if len(last) != 1 || last[0].MessageID != "m2" || last[0].Attempt != 3 {
			t.Fatalf("after close got %+v", last)
		}
		h2.Ack(last[0].LeaseID)
		checkNoViolations(t, f)
	})
}

// TestRequeuedLeaseSurvivesCrash: a requeued delivery keeps its lease record, re-armed while
// the Consumer polls; after a crash the record brings it back once.
func TestRequeuedLeaseSurvivesCrash(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeKubeMQ(t)
		f.send(t, testQueue, "m0", "m1")
		c, cl := newTestConsumer(t, f, Options{RecordDelay: 2 * time.Second})
		ds := fetchFor(t, c, 2, time.Second)
		c.Requeue(ds[0].LeaseID)
		got := fetchFor(t, c, 1, time.Second)
		if len(got) != 1 || got[0].MessageID != "m0" || got[0].Attempt != 2 {
			t.Fatalf("fetch after requeue: %+v", got)
		}
		// A Fetch waits past two record delays: the records come back and are re-armed.
		if more := fetchFor(t, c, 1, 5*time.Second); len(more) != 0 {
			t.Fatalf("delivered again while out: %v", messageIDs(more))
		}
		if st := c.Stats(); st.EntriesRearmed < 2 {
			t.Errorf("entries re-armed: %d", st.EntriesRearmed)
		}
		c.Requeue(got[0].LeaseID) // buffered when the process dies
		cl.kill()
		c2, _ := newTestConsumer(t, f, Options{RecordDelay: 2 * time.Second})
		defer closeConsumer(t, c2)
		back := fetchFor(t, c2, 3, 30*time.Second)
		seen := map[string]int{}
		for _, d := range back {
			seen[d.MessageID]++
			if !d.Redelivered {
				t.Errorf("%s not redelivered after the crash", d.MessageID)
			}
		}
		if seen["m0"] != 1 || seen["m1"] != 1 || len(back) != 2 {
			t.Fatalf("after the crash: %v", seen)
		}
		c2.Ack(leaseIDs(back)...)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		c.Close(ctx) // the dead process's Consumer: its copies cannot be stored
	})
}

// TestReadAheadIsShared: what one handle's Fetch read ahead waits in the ready buffer, where
// Ready counts it and any Fetch of the queue (another handle's, a TryFetch) gets it at once.
func TestReadAheadIsShared(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeKubeMQ(t)
		f.send(t, testQueue, ids(10, "m")...)
		m := newTestManager(t, f.client(), Options{})
		a, b := acquire(t, m), acquire(t, m)
		defer a.Close()
		defer b.Close()
		a.SetReadAhead(8)
		one := fetchFor(t, a, 1, time.Second)
		if len(one) != 1 || one[0].MessageID != "m0" {
			t.Fatalf("a got %v", messageIDs(one))
		}
		st := a.Consumer().Stats()
		if st.Buffered != 7 {
			t.Fatalf("buffered %d, want 7", st.Buffered)
		}
		if n, err := m.Ready(context.Background(), testQueue); err != nil || n != 9 {
			t.Fatalf("Ready = %d %v, want 9 (7 buffered, 2 in KubeMQ)", n, err)
		}
		gets := st.Gets
		got := fetchFor(t, b, 5, time.Second)
		if ids := messageIDs(got); len(ids) != 5 || ids[0] != "m1" || ids[4] != "m5" {
			t.Fatalf("b got %v", ids)
		}
		try, err := b.TryFetch(context.Background(), 2)
		if err != nil || len(try) != 2 || try[0].MessageID != "m6" {
			t.Fatalf("TryFetch = %v %v", messageIDs(try), err)
		}
		if st := a.Consumer().Stats(); st.Gets != gets {
			t.Errorf("%d more Gets for buffered messages", st.Gets-gets)
		}
		a.Ack(leaseIDs(one)...)
		b.Ack(leaseIDs(got)...)
		b.Ack(leaseIDs(try)...)
		checkNoViolations(t, f)
	})
}

// TestTryFetch: TryFetch answers at once on an empty queue (no Get waiting its second), takes
// what the queue holds, leaves messages to the Fetch calls waiting before it, and reads lease
// records back (re-arming or dropping them) on the way to an empty answer.
func TestTryFetch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeKubeMQ(t)
		m := newTestManager(t, f.client(), Options{RecordDelay: 2 * time.Second})
		h := acquire(t, m)
		defer h.Close()
		start := time.Now()
		ds, err := h.TryFetch(context.Background(), 1)
		if err != nil || len(ds) != 0 {
			t.Fatalf("TryFetch on an empty queue: %v %v", ds, err)
		}
		if d := time.Since(start); d > 100*time.Millisecond {
			t.Errorf("TryFetch on an empty queue took %v", d)
		}
		f.send(t, testQueue, "m0", "m1")
		ds, err = h.TryFetch(context.Background(), 1)
		if err != nil || len(ds) != 1 || ds[0].MessageID != "m0" {
			t.Fatalf("TryFetch: %v %v", messageIDs(ds), err)
		}
		// A Fetch waiting first gets m1; the TryFetch behind it is answered empty.
		fetched := make(chan []*Delivery, 1)
		go func() {
			got, _ := h.Fetch(context.Background(), 1)
			fetched <- got
		}()
		synctest.Wait()
		try := make(chan []*Delivery, 1)
		go func() {
			got, err := h.TryFetch(context.Background(), 1)
			if err != nil {
				t.Error(err)
			}
			try <- got
		}()
		synctest.Wait()
		if got := <-fetched; len(got) != 1 || got[0].MessageID != "m1" {
			t.Fatalf("Fetch got %v", messageIDs(got))
		} else {
			h.Ack(got[0].LeaseID)
		}
		if got := <-try; len(got) != 0 {
			t.Fatalf("TryFetch behind a Fetch got %v", messageIDs(got))
		}
		// m0 held past its record's return: the record waits in KubeMQ; TryFetch reads it
		// (re-arms it) and answers empty.
		time.Sleep(3500 * time.Millisecond)
		if f.visible(testQueue) == 0 {
			t.Fatal("no record came back")
		}
		ds2, err := h.TryFetch(context.Background(), 1)
		if err != nil || len(ds2) != 0 {
			t.Fatalf("TryFetch with only a record waiting: %v %v", messageIDs(ds2), err)
		}
		if st := h.Consumer().Stats(); st.EntriesRearmed == 0 {
			t.Errorf("record not re-armed: %+v", st)
		}
		h.Ack(ds[0].LeaseID)
		checkNoViolations(t, f)
	})
}

// TestReadyCounts: Ready counts KubeMQ's messages and the buffered leases, not the deliveries
// out, and not this Consumer's lease records once they are back in the queue (nor, through the
// Manager, those of a retired Consumer); Purge drops the buffered ones.
func TestReadyCounts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeKubeMQ(t)
		f.send(t, testQueue, ids(5, "m")...)
		m := newTestManager(t, f.client(), Options{RecordDelay: 2 * time.Second})
		h := acquire(t, m)
		h.SetReadAhead(3)
		ready := func() int64 {
			t.Helper()
			n, err := m.Ready(context.Background(), testQueue)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
		if n := ready(); n != 5 {
			t.Fatalf("Ready = %d, want 5", n)
		}
		out := fetchFor(t, h, 1, time.Second) // m0 out, m1 m2 buffered, m3 m4 in KubeMQ
		if n := ready(); n != 4 {
			t.Fatalf("Ready = %d, want 4", n)
		}
		// The batch's record comes back into the queue: not a message.
		time.Sleep(4 * time.Second)
		if r := f.visible(testQueue); r != 3 {
			t.Fatalf("KubeMQ holds %d, want 2 messages and 1 record", r)
		}
		if n := ready(); n != 4 {
			t.Fatalf("Ready with a record back = %d, want 4", n)
		}
		h.Requeue(out[0].LeaseID)
		if n := ready(); n != 5 {
			t.Fatalf("Ready after requeue = %d, want 5", n)
		}
		if n := h.Purge(); n != 3 {
			t.Fatalf("Purge dropped %d, want 3", n)
		}
		if n := ready(); n != 3 {
			t.Fatalf("Ready after Purge = %d, want 3 in KubeMQ (2 messages, the record no longer tracked)", n)
		}
		// Retired with a record on its way: the Manager still discounts it when it is back.
		all, err := h.TryFetch(context.Background(), 3) // reads the record back too
		if err != nil {
			t.Fatal(err)
		}
		ids := messageIDs(all)
		if len(ids) != 2 || ids[0] != "m3" || ids[1] != "m4" {
			t.Fatalf("after purge got %v", ids)
		}
		h.Ack(leaseIDs(all)...)
		h.Close()
		if !m.Retire(testQueue) {
			t.Fatal("Retire = false")
		}
		time.Sleep(4 * time.Second)
		if f.visible(testQueue) == 0 {
			r, d := f.stored(testQueue)
			t.Fatalf("the last batch record did not come back: %d %d %+v", r, d, h.Consumer().Stats())
		}
		if n := ready(); n != 0 {
			t.Fatalf("Ready of a retired queue with its records back = %d, want 0", n)
		}
		if st := h.Consumer().Stats(); st.Purged != 3 {
			t.Errorf("Purged = %d", st.Purged)
		}
		checkNoViolations(t, f)
	})
}

// TestReadyWhileBatchesMove: a count taken while batches of 37 move from KubeMQ into the buffer
// counts each message once: never more than were ready before it began, never fewer than
// remain after it (less a Fetch of 3 in progress).
func TestReadyWhileBatchesMove(t *testing.T) {
	f := newFakeKubeMQ(t)
	const n = 3000
	for i := 0; i < n; i += 100 {
		f.send(t, testQueue, ids(100, "m"+string(rune('a'+i/100))+"-")...)
	}
	m := newTestManager(t, f.client(), Options{MaxBatch: 50})
	h := acquire(t, m)
	defer h.Close()
	h.SetReadAhead(37)
	var taken atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for taken.Load() < n {
			ds, err := h.Fetch(ctx, 3)
			if err != nil {
				if !errors.Is(err, context.Canceled) {
					t.Error(err)
				}
				return
			}
			taken.Add(int64(len(ds)))
			h.Ack(leaseIDs(ds)...)
		}
	}()
	counts := 0
	for taken.Load() < n {
		before := taken.Load()
		got, err := m.Ready(ctx, testQueue)
		after := taken.Load()
		if err != nil {
			t.Fatal(err)
		}
		// A Fetch of up to 3 may have been handed out and not yet counted in taken.
		if got > n-before || got < n-after-3 {
			t.Fatalf("Ready = %d with %d..%d taken: want %d..%d", got, before, after, n-after-3, n-before)
		}
		counts++
	}
	cancel()
	wg.Wait()
	t.Logf("%d counts while %d messages moved", counts, n)
	checkNoViolations(t, f)
}
