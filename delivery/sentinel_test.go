package delivery

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// poll keeps a Fetch waiting on c (so its poll loop runs) and acks what it gets, until stop is
// closed; it returns the MessageIDs delivered.
func poll(t *testing.T, c *Consumer, stop <-chan struct{}) (delivered func() []string) {
	t.Helper()
	var mu sync.Mutex
	var got []string
	done := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			ds, err := c.Fetch(ctx, 100)
			if err != nil {
				if !errors.Is(err, context.Canceled) && !errors.Is(err, ErrClosed) {
					t.Errorf("Fetch: %v", err)
				}
				return
			}
			mu.Lock()
			for _, d := range ds {
				got = append(got, d.MessageID)
			}
			mu.Unlock()
			c.Ack(leaseIDs(ds)...)
		}
	}()
	go func() {
		<-stop
		cancel()
	}()
	return func() []string {
		<-done
		mu.Lock()
		defer mu.Unlock()
		return got
	}
}

func waitClosed(ch <-chan struct{}, d time.Duration) bool {
	select {
	case <-ch:
		return true
	case <-time.After(d):
		return false
	}
}

// TestSentinelComesBackAfterEarlierRecords: a Consumer's sentinel comes back to it after the
// record delay, never as a delivery, and only after the records another owner stored before it
// were reported to the OnUnsettled hook.
func TestSentinelComesBackAfterEarlierRecords(t *testing.T) {
	addr, checkStrict := testServer(t)
	q := uniqueQueue(t)

	t.Run("own", func(t *testing.T) {
		cl := dial(t, addr)
		c := kubemqConsumer(t, cl, q+".own", Options{})
		defer closeWithin(t, c, 10*time.Second)
		stop := make(chan struct{})
		delivered := poll(t, c, stop)
		start := time.Now()
		ch := c.sentinel()
		if !waitClosed(ch, 10*time.Second) {
			t.Fatalf("sentinel not back after 10 s: %+v", c.Stats())
		}
		if el := time.Since(start); el < 900*time.Millisecond {
			t.Errorf("sentinel back after %v, before its 1 s delay", el)
		}
		close(stop)
		if got := delivered(); len(got) != 0 {
			t.Errorf("sentinel delivered as a message: %v", got)
		}
		if st := c.Stats(); st.SentinelsStored != 1 || st.SentinelsReturned != 1 || st.RecordsCorrupt != 0 {
			t.Errorf("stats: %+v", st)
		}
	})

	t.Run("after a dead owner's records", func(t *testing.T) {
		const n = 20
		clA := dial(t, addr)
		produce(t, clA.Client, q, ids(n, "m"), 64)
		a := kubemqConsumer(t, clA, q, Options{HoldExpiry: time.Minute})
		if held := fetchFor(t, a, n, 20*time.Second); len(held) != n {
			t.Fatalf("fetched %d of %d", len(held), n)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := a.waitIdle(ctx); err != nil {
			t.Fatal(err)
		}
		clA.cut(true) // A dies holding every message; its records keep returning

		clB := dial(t, addr)
		b := kubemqConsumer(t, clB, q, Options{})
		defer closeWithin(t, b, 10*time.Second)
		var mu sync.Mutex
		reported := map[string]bool{}
		h := UnsettledFunc(func(m *Message, _ time.Time) {
			mu.Lock()
			defer mu.Unlock()
			reported[m.ID] = true
		})
		b.unsettled.Store(&h)
		ch := b.sentinel()
		stop := make(chan struct{})
		delivered := poll(t, b, stop)
		if !waitClosed(ch, 15*time.Second) {
			t.Fatalf("sentinel not back after 15 s: %+v", b.Stats())
		}
		mu.Lock()
		atReturn := len(reported)
		mu.Unlock()
		close(stop)
		delivered()
		if atReturn != n {
			t.Errorf("sentinel back when %d of the dead owner's %d messages were reported", atReturn, n)
		}
		ctx2, cancel2 := context.WithTimeout(context.Background(), time.Second)
		defer cancel2()
		_ = a.Close(ctx2)
	})

	t.Run("foreign", func(t *testing.T) {
		old := sentinelLife
		defer func() { sentinelLife = old }()
		qf := q + ".foreign"
		clA, clB := dial(t, addr), dial(t, addr)
		a := kubemqConsumer(t, clA, qf, Options{})
		defer closeWithin(t, a, 10*time.Second)
		ch := a.sentinel() // A does not poll: only B sees it
		b := kubemqConsumer(t, clB, qf, Options{})
		stop := make(chan struct{})
		delivered := poll(t, b, stop)
		deadline := time.Now().Add(20 * time.Second) // a shared backend's delay processor may be backed up
		for b.Stats().SentinelsBounced == 0 && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		close(stop)
		delivered()
		closeWithin(t, b, 10*time.Second)
		if st := b.Stats(); st.SentinelsBounced == 0 || st.SentinelsReturned != 0 {
			t.Fatalf("B did not store A's sentinel again: %+v", st)
		}
		// A polls now: its sentinel, stored again by B, reaches it.
		stopA := make(chan struct{})
		deliveredA := poll(t, a, stopA)
		if !waitClosed(ch, 20*time.Second) {
			t.Errorf("A's sentinel did not come back through B: %+v", a.Stats())
		}
		close(stopA)
		deliveredA()

		// A sentinel whose writer is gone circulates until its expiry, then is dropped.
		sentinelLife = 3 * time.Second
		deadline = time.Now().Add(10 * time.Second)
		c := kubemqConsumer(t, clA, qf+".gone", Options{})
		c.sentinel()
		for c.Stats().SentinelsStored == 0 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		closeWithin(t, c, 10*time.Second)
		d := kubemqConsumer(t, clB, qf+".gone", Options{})
		defer closeWithin(t, d, 10*time.Second)
		stopD := make(chan struct{})
		deliveredD := poll(t, d, stopD)
		deadline = time.Now().Add(30 * time.Second)
		for d.Stats().SentinelsDropped == 0 && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		close(stopD)
		if got := deliveredD(); len(got) != 0 {
			t.Errorf("sentinel delivered as a message: %v", got)
		}
		// Stored again while young (unless the backend's delay processor held it back
		// for longer than its life), dropped once expired.
		if st := d.Stats(); st.SentinelsDropped != 1 {
			t.Errorf("an expired foreign sentinel: %+v", st)
		}
	})
	checkStrict()
}
