package delivery

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/zap/zaptest"
)

// notifyingClient is a fake connection with a readiness signal (StateNotifier), as
// NewKubeMQBackend gives one.
type notifyingClient struct {
	*fakeClient
	mu    sync.Mutex
	hooks map[int]func(bool)
	n     int
}

func (c *notifyingClient) OnStateChange(fn func(up bool)) func() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.hooks == nil {
		c.hooks = map[int]func(bool){}
	}
	id := c.n
	c.n++
	c.hooks[id] = fn
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		delete(c.hooks, id)
	}
}

func (c *notifyingClient) set(up bool) {
	c.mu.Lock()
	hs := make([]func(bool), 0, len(c.hooks))
	for _, h := range c.hooks {
		hs = append(hs, h)
	}
	c.mu.Unlock()
	for _, h := range hs {
		h(up)
	}
}

func newTestManager(t *testing.T, b Backend, opts Options) *Manager {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = zaptest.NewLogger(t)
	}
	m, err := NewManager(b, opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		m.Close(ctx)
	})
	return m
}

// TestBackendDownDropsIdleLeases: a Consumer whose poll loop is idle (its deliveries are out,
// nobody fetches) hears of an outage from the readiness signal, drops its leases and replaces
// its stream; the lease records bring the messages back.
func TestBackendDownDropsIdleLeases(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeKubeMQ(t)
		f.send(t, testQueue, ids(5, "m")...)
		cl := &notifyingClient{fakeClient: f.client()}
		var lost atomic.Int64
		m := newTestManager(t, cl, Options{RecordDelay: time.Second, OnLeasesLost: func(err error, n int) {
			if !errors.Is(err, ErrLeasesLost) || !errors.Is(err, ErrBackendDown) {
				t.Errorf("OnLeasesLost err = %v", err)
			}
			lost.Add(int64(n))
		}})
		h, err := m.Acquire(context.Background(), testQueue)
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		first := fetchFor(t, h, 5, time.Second)
		if len(first) != 5 {
			t.Fatalf("fetched %d", len(first))
		}
		synctest.Wait() // idle: no Get outstanding
		cl.breakStreams()
		cl.set(false)
		synctest.Wait()
		if lost.Load() != 5 {
			t.Fatalf("OnLeasesLost reported %d leases, want 5", lost.Load())
		}
		if h.Ack(first[0].LeaseID)[0] {
			t.Error("ack of a dropped lease accepted")
		}
		cl.set(true)
		again := fetchFor(t, h, 5, 10*time.Second)
		if len(again) != 5 {
			t.Fatalf("recovered %d of 5", len(again))
		}
		h.Ack(leaseIDs(again)...)
		checkNoViolations(t, f)
	})
}

// TestBackendDownIdleWithoutLeases: an outage while nothing is leased changes nothing, so the
// records of acked messages still read as settled (no duplicates).
func TestBackendDownIdleWithoutLeases(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeKubeMQ(t)
		f.send(t, testQueue, ids(5, "m")...)
		cl := &notifyingClient{fakeClient: f.client()}
		m := newTestManager(t, cl, Options{RecordDelay: time.Second})
		h, err := m.Acquire(context.Background(), testQueue)
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		got := fetchFor(t, h, 5, time.Second)
		h.Ack(leaseIDs(got)...)
		synctest.Wait()
		cl.set(false)
		synctest.Wait()
		cl.set(true)
		if again := fetchFor(t, h, 1, 5*time.Second); len(again) != 0 {
			t.Fatalf("acked message redelivered after an idle outage: %s", again[0].MessageID)
		}
		if st := h.Consumer().Stats(); st.Resets != 0 || st.EntriesObsolete != 5 {
			t.Errorf("stats after an idle outage: %+v", st)
		}
		checkNoViolations(t, f)
	})
}

// TestHoldPromisesInRecords: without an engine deadline, the hold of the Handle and later Hold
// calls are what the lease records promise, so another owner (a process after a crash) waits
// for them, not for HoldExpiry.
func TestHoldPromisesInRecords(t *testing.T) {
	for _, tc := range []struct {
		name    string
		hold    time.Duration
		extend  time.Duration // Hold(now+extend) right after the fetch; 0 = none
		atLeast time.Duration // no redelivery by the other owner before this, from the fetch
	}{
		{"no hold", 0, 0, 2 * time.Second}, // HoldExpiry = 2 * RecordDelay
		{"hold", 6 * time.Second, 0, 6 * time.Second},
		{"extended", 6 * time.Second, 12 * time.Second, 12 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := newFakeKubeMQ(t)
				f.send(t, testQueue, "m0")
				a := newTestManager(t, f.client(), Options{RecordDelay: time.Second})
				acl := a.b.(*fakeClient)
				h, err := a.Acquire(context.Background(), testQueue)
				if err != nil {
					t.Fatal(err)
				}
				h.SetHold(tc.hold)
				got := fetchFor(t, h, 1, time.Second)
				if len(got) != 1 {
					t.Fatalf("fetched %d", len(got))
				}
				start := time.Now()
				if tc.extend > 0 {
					if n := h.Hold(start.Add(tc.extend), got[0].LeaseID); n != 1 {
						t.Fatalf("Hold = %d", n)
					}
				}
				// Records return only to a Consumer that polls: keep a Fetch waiting, so the
				// first record comes back after RecordDelay and is re-armed with the promise.
				fctx, cancel := context.WithCancel(context.Background())
				go h.Fetch(fctx, 1)
				time.Sleep(1500 * time.Millisecond)
				cancel()
				synctest.Wait()
				acl.kill() // the owner dies
				b, _ := newTestConsumer(t, f, Options{RecordDelay: time.Second})
				defer closeConsumer(t, b)
				ds := fetchFor(t, b, 1, time.Minute)
				if len(ds) != 1 {
					t.Fatal("message not recovered")
				}
				took := time.Since(start)
				t.Logf("recovered by the new owner after %v", took)
				if took < tc.atLeast || took > tc.atLeast+4*time.Second {
					t.Errorf("recovered after %v, want %v plus at most a few record delays", took, tc.atLeast)
				}
				b.Ack(ds[0].LeaseID)
				checkNoViolations(t, f)
			})
		})
	}
}
