package delivery

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// fakeSettlements is an in-memory Settlements shared by the Consumers of a test.
type fakeSettlements struct {
	mu      sync.Mutex
	keys    map[[16]byte]map[[16]byte]bool
	retired map[[16]byte]bool
	syncs   int
	taken   map[string][][2]uint64 // TakenLog: by queue, as noted
}

func newFakeSettlements() *fakeSettlements {
	return &fakeSettlements{keys: map[[16]byte]map[[16]byte]bool{}, retired: map[[16]byte]bool{}}
}

func (s *fakeSettlements) Settle(queue string, owner [16]byte, keys ...[16]byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.keys[owner] == nil {
		s.keys[owner] = map[[16]byte]bool{}
	}
	for _, k := range keys {
		s.keys[owner][k] = true
	}
}

func (s *fakeSettlements) Retire(ctx context.Context, queue string, owner [16]byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.retired[owner] = true
	return nil
}

func (s *fakeSettlements) Settled(owner, key [16]byte) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.retired[owner] || s.keys[owner][key]
}

func (s *fakeSettlements) NoteTaken(queue string, owner [16]byte, lo, hi uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.taken == nil {
		s.taken = map[string][][2]uint64{}
	}
	s.taken[queue] = append(s.taken[queue], [2]uint64{lo, hi})
}

func (s *fakeSettlements) TakenOf(queue string, since time.Time) [][2]uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.taken[queue])
}

func (s *fakeSettlements) Sync(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.syncs++
	return nil
}

// fakeOwners grants or refuses claims as a test says.
type fakeOwners struct {
	mu       sync.Mutex
	refuse   map[string]bool
	holdings map[string]*fakeOwned
	released []string
}

type fakeOwned struct {
	o     *fakeOwners
	queue string
	lost  chan struct{}
	once  sync.Once
}

var errFakeOwned = errors.New("fake owners: another replica holds the queue")

func (o *fakeOwners) Claim(ctx context.Context, queue string) (Owned, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.refuse[queue] {
		return nil, errors.Join(ErrNotOwner, errFakeOwned)
	}
	h := &fakeOwned{o: o, queue: queue, lost: make(chan struct{})}
	if o.holdings == nil {
		o.holdings = map[string]*fakeOwned{}
	}
	o.holdings[queue] = h
	return h, nil
}

func (h *fakeOwned) Lost() <-chan struct{} { return h.lost }

func (h *fakeOwned) Release(ctx context.Context) error {
	h.once.Do(func() { close(h.lost) })
	h.o.mu.Lock()
	defer h.o.mu.Unlock()
	h.o.released = append(h.o.released, h.queue)
	return nil
}

func (h *fakeOwned) lose() { h.once.Do(func() { close(h.lost) }) }

// The next owner of a queue drops the records of leases its last owner settled (acked, or given
// back as a fresh copy) and redelivers the rest at once, not after their expiry.
func TestSettlementsReachTheNextOwner(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeKubeMQ(t)
		st := newFakeSettlements()
		f.send(t, testQueue, ids(30, "m")...)
		owners := &fakeOwners{}
		a, acl := newTestConsumer(t, f, Options{Settlements: st, Owners: owners, HoldExpiry: time.Hour})
		got := fetchFor(t, a, 30, time.Second)
		if len(got) != 30 {
			t.Fatalf("got %d", len(got))
		}
		settled := map[string]bool{}
		for i, d := range got {
			switch i % 3 {
			case 0:
				a.Ack(d.LeaseID)
				settled[d.MessageID] = true
			case 1:
				a.Release(d.LeaseID) // a fresh copy: the record is obsolete, the copy comes
			}
		}
		synctest.Wait() // copies stored, poll loop idle
		acl.kill()
		defer func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			_ = a.Close(ctx) // dead: it can give nothing back
		}()
		start := time.Now()
		b, _ := newTestConsumer(t, f, Options{Settlements: st, Owners: owners, HoldExpiry: time.Hour})
		defer closeConsumer(t, b)
		again := fetchFor(t, b, 20, 15*time.Second)
		took := time.Since(start)
		again = append(again, fetchFor(t, b, 1, 30*time.Second)...) // nothing more may come
		counts := map[string]int{}
		for _, d := range again {
			counts[d.MessageID]++
			if settled[d.MessageID] {
				t.Errorf("%s was acked by the last owner and came back", d.MessageID)
			}
		}
		if len(counts) != 20 {
			t.Errorf("%d distinct messages came back, want the 20 not acked", len(counts))
		}
		for id, n := range counts {
			if n != 1 {
				t.Errorf("%s came back %d times", id, n)
			}
		}
		// One record delay, not the hour the last owner promised.
		if took > 12*time.Second {
			t.Errorf("leftovers came back after %v", took)
		}
		b.Ack(leaseIDs(again)...)
		if s := b.Stats(); s.EntriesBounced != 0 {
			t.Errorf("bounced %d entries of a past owner", s.EntriesBounced)
		}
		if st.syncs == 0 {
			t.Error("the new owner did not sync the settlements before judging records")
		}
		checkNoViolations(t, f)
	})
}

// An owner that closes with everything settled is retired: none of its records brings
// anything back.
func TestRetiredOwnerRecordsAreObsolete(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeKubeMQ(t)
		st := newFakeSettlements()
		f.send(t, testQueue, ids(10, "m")...)
		owners := &fakeOwners{}
		a, _ := newTestConsumer(t, f, Options{Settlements: st, Owners: owners})
		got := fetchFor(t, a, 10, time.Second)
		a.Ack(leaseIDs(got[:5])...)
		closeConsumer(t, a) // the other 5 go back as fresh copies
		b, _ := newTestConsumer(t, f, Options{Settlements: st, Owners: owners})
		defer closeConsumer(t, b)
		again := fetchFor(t, b, 10, 30*time.Second)
		if len(again) != 5 {
			t.Fatalf("%d came back, want the 5 given back", len(again))
		}
		b.Ack(leaseIDs(again)...)
		if s := b.Stats(); s.EntriesRecovered != 0 {
			t.Errorf("%d entries of a retired owner recovered", s.EntriesRecovered)
		}
	})
}

// With Owners a Manager claims a queue before consuming it, refuses one another process holds,
// gives its Consumer up (leases back, waiters told) when the holding is lost, and releases the
// holding when the Consumer closes.
func TestManagerOwnership(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeKubeMQ(t)
		f.send(t, testQueue, ids(4, "m")...)
		owners := &fakeOwners{refuse: map[string]bool{"q.other": true}}
		m, err := NewManager(f.client(), Options{Owners: owners, Settlements: newFakeSettlements(), Linger: time.Second}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close(context.Background())
		if _, err := m.Acquire(context.Background(), "q.other"); !errors.Is(err, ErrNotOwner) || !errors.Is(err, errFakeOwned) {
			t.Fatalf("Acquire of a queue another process holds: %v", err)
		}
		h, err := m.Acquire(context.Background(), testQueue)
		if err != nil {
			t.Fatal(err)
		}
		got := fetchFor(t, h, 4, time.Second)
		if len(got) != 4 {
			t.Fatalf("got %d", len(got))
		}
		waiting := make(chan error, 1)
		go func() {
			_, err := h.Fetch(context.Background(), 10)
			waiting <- err
		}()
		synctest.Wait()
		owners.mu.Lock()
		held := owners.holdings[testQueue]
		owners.mu.Unlock()
		if !h.Usable() {
			t.Fatal("Handle unusable while the holding stands")
		}
		held.lose()
		if err := <-waiting; !errors.Is(err, ErrHandedOver) {
			t.Fatalf("waiting Fetch after the holding was lost: %v", err)
		}
		if _, err := h.Fetch(context.Background(), 1); !errors.Is(err, ErrHandedOver) {
			t.Fatalf("Fetch after the holding was lost: %v", err)
		}
		time.Sleep(2 * time.Second) // the poll loop's last Get ends, and the Consumer closes
		synctest.Wait()
		if h.Ack(got[0].LeaseID)[0] {
			t.Error("ack accepted after the handover")
		}
		if h.Usable() {
			t.Error("Handle usable after the handover")
		}
		if r, _ := f.stored(testQueue); r != 4 {
			t.Errorf("%d messages back in the queue after the handover, want 4", r)
		}
		h.Close()
		// A new Acquire claims again; the closing Consumer releases its holding.
		h2, err := m.Acquire(context.Background(), testQueue)
		if err != nil {
			t.Fatal(err)
		}
		if !h2.Usable() || h.Usable() {
			t.Errorf("after a new Acquire: new Handle usable %v, closed one %v", h2.Usable(), h.Usable())
		}
		again := fetchFor(t, h2, 4, 30*time.Second)
		h2.Ack(leaseIDs(again)...)
		h2.Close()
		time.Sleep(2 * time.Second) // the linger ends: the Consumer closes, the holding goes
		synctest.Wait()
		owners.mu.Lock()
		defer owners.mu.Unlock()
		if len(owners.released) == 0 || owners.released[len(owners.released)-1] != testQueue {
			t.Errorf("holding not released after the Consumer closed: %v", owners.released)
		}
		checkNoViolations(t, f)
	})
}
