package delivery

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/zap/zaptest"
)

const testQueue = "q.test"

func newTestConsumer(t *testing.T, f *fakeKubeMQ, opts Options) (*Consumer, *fakeClient) {
	t.Helper()
	cl := f.client()
	if opts.Logger == nil {
		opts.Logger = zaptest.NewLogger(t)
	}
	if opts.RecordDelay == 0 {
		opts.RecordDelay = 10 * time.Second
	}
	c, err := NewConsumer(cl, testQueue, opts)
	if err != nil {
		t.Fatalf("NewConsumer: %v", err)
	}
	return c, cl
}

func closeConsumer(t *testing.T, c *Consumer) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.Close(ctx); err != nil {
		t.Errorf("Close: %v", err)
	}
}

// fetchFor collects deliveries until n arrived or d has passed.
func fetchFor(t *testing.T, c interface {
	Fetch(context.Context, int) ([]*Delivery, error)
}, n int, d time.Duration) []*Delivery {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var out []*Delivery
	for len(out) < n {
		ds, err := c.Fetch(ctx, n-len(out))
		if err != nil {
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("Fetch: %v", err)
			}
			break
		}
		out = append(out, ds...)
	}
	return out
}

func ids(n int, prefix string) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = prefix + strconv.Itoa(i)
	}
	return out
}

func leaseIDs(ds []*Delivery) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.LeaseID
	}
	return out
}

func checkNoViolations(t *testing.T, f *fakeKubeMQ) {
	t.Helper()
	if v := f.Violations(); len(v) > 0 {
		t.Errorf("hazardous patterns used: %v", v)
	}
}

func TestLoneMessagePromptDelivery(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeKubeMQ(t)
		c, _ := newTestConsumer(t, f, Options{})
		defer closeConsumer(t, c)
		type res struct {
			ds  []*Delivery
			at  time.Time
			err error
		}
		got := make(chan res, 1)
		go func() {
			ds, err := c.Fetch(context.Background(), 10)
			got <- res{ds, time.Now(), err}
		}()
		time.Sleep(2500 * time.Millisecond) // the poll loop is idling in MaxItems=1 Gets
		sent := time.Now()
		f.send(t, testQueue, "m1")
		r := <-got
		if r.err != nil || len(r.ds) != 1 {
			t.Fatalf("Fetch = %d deliveries, %v", len(r.ds), r.err)
		}
		if lat := r.at.Sub(sent); lat > 10*time.Millisecond {
			t.Errorf("lone message took %v, want immediate", lat)
		}
		d := r.ds[0]
		if d.MessageID != "m1" || string(d.Body) != "body-m1" || d.Tags["k"] != "m1" || d.Attempt != 1 || d.Redelivered {
			t.Errorf("delivery = %+v", d)
		}
		if len(d.Tags) != 1 {
			t.Errorf("reserved tags leaked: %v", d.Tags)
		}
		if ok := c.Ack(d.LeaseID); !ok[0] {
			t.Errorf("Ack = false")
		}
		checkNoViolations(t, f)
	})
}

func TestBacklogDrainsInBatches(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeKubeMQ(t)
		f.send(t, testQueue, ids(2000, "m")...)
		c, _ := newTestConsumer(t, f, Options{})
		defer closeConsumer(t, c)
		start := time.Now()
		var all []*Delivery
		for len(all) < 2000 {
			ds, err := c.Fetch(context.Background(), 500)
			if err != nil {
				t.Fatal(err)
			}
			all = append(all, ds...)
			c.Ack(leaseIDs(ds)...)
		}
		if el := time.Since(start); el > 10*time.Millisecond {
			t.Errorf("draining took %v of fake time: some Get waited", el)
		}
		st := c.Stats()
		if st.Gets > 5 || st.RecordsStored > 5 {
			t.Errorf("Gets %d, records %d for 2000 messages in batches of 500", st.Gets, st.RecordsStored)
		}
		seen := map[string]bool{}
		for _, d := range all {
			if seen[d.MessageID] {
				t.Errorf("duplicate %s", d.MessageID)
			}
			seen[d.MessageID] = true
		}
		checkNoViolations(t, f)
	})
}

// A queue the server cannot count (its QueuesInfo entry is shared with another queue) still
// drains in large batches: Get sizes double while they come back full.
func TestBacklogDrainsWithoutACount(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeKubeMQ(t)
		f.uncounted = true
		f.send(t, testQueue, ids(2000, "m")...)
		c, _ := newTestConsumer(t, f, Options{})
		defer closeConsumer(t, c)
		start := time.Now()
		n := 0
		for n < 2000 {
			ds, err := c.Fetch(context.Background(), 500)
			if err != nil {
				t.Fatal(err)
			}
			n += len(ds)
			c.Ack(leaseIDs(ds)...)
		}
		if st := c.Stats(); st.Gets > 16 {
			t.Errorf("%d Gets for 2000 messages", st.Gets)
		}
		// Only the Get that finds the backlog's end short waits its second.
		if el := time.Since(start); el > 1100*time.Millisecond {
			t.Errorf("draining took %v of fake time: more than one Get waited", el)
		}
		// An empty queue: a Get of 1 waits its second; the next message comes at once.
		got := make(chan []*Delivery, 1)
		go func() {
			ds, _ := c.Fetch(context.Background(), 10)
			got <- ds
		}()
		time.Sleep(3 * time.Second)
		f.send(t, testQueue, "late")
		synctest.Wait()
		if ds := <-got; len(ds) != 1 || ds[0].MessageID != "late" {
			t.Fatalf("after the backlog: %v", ds)
		}
		checkNoViolations(t, f)
	})
}

func TestAckedNeverRedelivered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeKubeMQ(t)
		f.send(t, testQueue, ids(300, "m")...)
		c, _ := newTestConsumer(t, f, Options{})
		defer closeConsumer(t, c)
		ds := fetchFor(t, c, 300, time.Second)
		if len(ds) != 300 {
			t.Fatalf("got %d", len(ds))
		}
		for _, ok := range c.Ack(leaseIDs(ds)...) {
			if !ok {
				t.Fatal("ack refused")
			}
		}
		// Records come back after 10 s and must be dropped as obsolete.
		if more := fetchFor(t, c, 1, 45*time.Second); len(more) != 0 {
			t.Errorf("acked message redelivered: %+v", more[0])
		}
		st := c.Stats()
		if st.RecordsReturned == 0 || st.EntriesObsolete != 300 {
			t.Errorf("records returned %d, obsolete entries %d; want >0 and 300", st.RecordsReturned, st.EntriesObsolete)
		}
		if r, d := f.stored(testQueue); r != 0 || d != 0 {
			t.Errorf("queue still holds %d ready + %d delayed", r, d)
		}
		checkNoViolations(t, f)
	})
}

func TestNackRedeliversWithNextAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeKubeMQ(t)
		f.send(t, testQueue, "m1")
		c, _ := newTestConsumer(t, f, Options{})
		defer closeConsumer(t, c)
		d := fetchFor(t, c, 1, time.Second)[0]
		time.Sleep(time.Second) // so that a copy stored now has a later time than the original
		if !c.Nack(d.LeaseID, 0) {
			t.Fatal("Nack = false")
		}
		if c.Nack(d.LeaseID, 0) || c.Ack(d.LeaseID)[0] {
			t.Error("a nacked lease accepted a second settlement")
		}
		start := time.Now()
		r := fetchFor(t, c, 1, time.Second)
		if len(r) != 1 {
			t.Fatal("not redelivered")
		}
		if el := time.Since(start); el > 10*time.Millisecond {
			t.Errorf("redelivery after nack took %v", el)
		}
		d2 := r[0]
		if d2.MessageID != "m1" || d2.Attempt != 2 || !d2.Redelivered || string(d2.Body) != "body-m1" ||
			d2.Tags["k"] != "m1" || len(d2.Tags) != 1 || d2.LeaseID == d.LeaseID {
			t.Errorf("redelivery = %+v", d2)
		}
		if d.StoredAt.IsZero() || !d2.StoredAt.Equal(d.StoredAt) {
			t.Errorf("stored at %v, redelivered copy %v: want the original's", d.StoredAt, d2.StoredAt)
		}
		c.Nack(d2.LeaseID, 0)
		d3 := fetchFor(t, c, 1, time.Second)[0]
		if d3.Attempt != 3 {
			t.Errorf("third delivery attempt = %d", d3.Attempt)
		}
		c.Ack(d3.LeaseID)
		if more := fetchFor(t, c, 1, 40*time.Second); len(more) != 0 {
			t.Errorf("unexpected redelivery %+v", more[0])
		}
		checkNoViolations(t, f)
	})
}

func TestNackWithDelay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeKubeMQ(t)
		f.send(t, testQueue, "m1")
		c, _ := newTestConsumer(t, f, Options{})
		defer closeConsumer(t, c)
		d := fetchFor(t, c, 1, time.Second)[0]
		start := time.Now()
		c.Nack(d.LeaseID, 35*time.Second) // longer than the record delay: re-armed meanwhile
		r := fetchFor(t, c, 1, time.Minute)
		if len(r) != 1 {
			t.Fatal("not redelivered")
		}
		if el := time.Since(start); el < 35*time.Second || el > 36*time.Second {
			t.Errorf("redelivered after %v, want 35s", el)
		}
		if r[0].Attempt != 2 {
			t.Errorf("attempt %d", r[0].Attempt)
		}
		if st := c.Stats(); st.EntriesRearmed < 3 {
			t.Errorf("re-armed %d times during a 35 s backoff with 10 s records", st.EntriesRearmed)
		}
		c.Ack(r[0].LeaseID)
		checkNoViolations(t, f)
	})
}

func TestExpiryAndExtend(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeKubeMQ(t)
		f.send(t, testQueue, "exp", "ext")
		c, _ := newTestConsumer(t, f, Options{Deadline: 5 * time.Second})
		defer closeConsumer(t, c)
		ds := fetchFor(t, c, 2, time.Second)
		if len(ds) != 2 {
			t.Fatalf("got %d", len(ds))
		}
		byID := map[string]*Delivery{ds[0].MessageID: ds[0], ds[1].MessageID: ds[1]}
		if dl := byID["exp"].Deadline; dl.IsZero() || dl.Sub(time.Now()) != 5*time.Second {
			t.Errorf("deadline %v", dl)
		}
		ext := byID["ext"]
		// Keep extending "ext" for a minute; "exp" expires after 5 s.
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				case <-time.After(3 * time.Second):
					if !c.Extend(ext.LeaseID, time.Now().Add(5*time.Second)) {
						t.Error("Extend = false on a live lease")
					}
				}
			}
		}()
		start := time.Now()
		r := fetchFor(t, c, 1, 10*time.Second)
		if len(r) != 1 || r[0].MessageID != "exp" || r[0].Attempt != 2 {
			t.Fatalf("expiry redelivery = %+v", r)
		}
		if el := time.Since(start); el < 5*time.Second || el > 5*time.Second+10*time.Millisecond {
			t.Errorf("expired after %v", el)
		}
		c.Ack(r[0].LeaseID)
		if more := fetchFor(t, c, 1, time.Minute); len(more) != 0 {
			t.Errorf("extended lease redelivered: %+v", more[0])
		}
		close(stop)
		wg.Wait()
		if !c.Ack(ext.LeaseID)[0] {
			t.Error("ack after a minute of extensions refused")
		}
		// Extend to now is a nack.
		f.send(t, testQueue, "now")
		d := fetchFor(t, c, 1, time.Second)[0]
		if !c.Extend(d.LeaseID, time.Now()) {
			t.Error("Extend(now) = false")
		}
		if r := fetchFor(t, c, 1, time.Second); len(r) != 1 || r[0].Attempt != 2 {
			t.Errorf("Extend(now) did not redeliver: %+v", r)
		} else {
			c.Ack(r[0].LeaseID)
		}
		checkNoViolations(t, f)
	})
}

func TestStaleAndUnknownIDsIgnored(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeKubeMQ(t)
		f.send(t, testQueue, "m1")
		c, _ := newTestConsumer(t, f, Options{})
		defer closeConsumer(t, c)
		d := fetchFor(t, c, 1, time.Second)[0]
		for _, id := range []string{"", "nonsense", "AAAAAAAAAAAAAAAAAAAAAA", d.LeaseID + "x", "\x00\xff"} {
			if c.Ack(id)[0] || c.Nack(id, 0) || c.Extend(id, time.Now().Add(time.Hour)) || c.Release(id)[0] {
				t.Errorf("id %q accepted", id)
			}
		}
		if got := c.Ack(d.LeaseID, d.LeaseID); !got[0] || got[1] {
			t.Errorf("Ack(id, id) = %v, want [true false]", got)
		}
		if c.Nack(d.LeaseID, 0) || c.Extend(d.LeaseID, time.Now().Add(time.Hour)) || c.Release(d.LeaseID)[0] {
			t.Error("acked id accepted again")
		}
		if _, err := c.Fetch(context.Background(), 0); err == nil {
			t.Error("Fetch(0) accepted")
		}
	})
}

func TestBeforeRedeliverDrops(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeKubeMQ(t)
		f.send(t, testQueue, "m1")
		var seen []int
		var mu sync.Mutex
		c, _ := newTestConsumer(t, f, Options{BeforeRedeliver: func(d *Delivery) bool {
			mu.Lock()
			defer mu.Unlock()
			seen = append(seen, d.Attempt)
			return d.Attempt >= 3 // dead-letter after the third attempt
		}})
		defer closeConsumer(t, c)
		for want := 1; want <= 3; want++ {
			r := fetchFor(t, c, 1, time.Second)
			if len(r) != 1 || r[0].Attempt != want {
				t.Fatalf("attempt %d: got %+v", want, r)
			}
			c.Nack(r[0].LeaseID, 0)
		}
		if r := fetchFor(t, c, 1, 40*time.Second); len(r) != 0 {
			t.Errorf("dropped message delivered again: %+v", r[0])
		}
		mu.Lock()
		defer mu.Unlock()
		if fmt.Sprint(seen) != "[1 2 3]" {
			t.Errorf("hook saw attempts %v", seen)
		}
		if st := c.Stats(); st.DroppedByHook != 1 || st.Leases != 0 {
			t.Errorf("stats %+v", st)
		}
	})
}

// TestCrashRecovery abandons a Consumer with unacked leases (its connection dies, nothing is
// settled) and checks that a new Consumer redelivers every unacked message.
func TestCrashRecovery(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeKubeMQ(t)
		const n = 200
		f.send(t, testQueue, ids(n, "m")...)
		a, acl := newTestConsumer(t, f, Options{Deadline: 30 * time.Second})
		got := fetchFor(t, a, n, time.Second)
		if len(got) != n {
			t.Fatalf("got %d", len(got))
		}
		acked := map[string]bool{}
		stored := map[string]time.Time{}
		for i, d := range got {
			stored[d.MessageID] = d.StoredAt
			if i%2 == 0 {
				a.Ack(d.LeaseID)
				acked[d.MessageID] = true
			}
		}
		synctest.Wait() // a's poll loop is idle: no Get outstanding
		acl.kill()
		b, _ := newTestConsumer(t, f, Options{Deadline: 30 * time.Second})
		defer closeConsumer(t, b)
		counts := map[string]int{}
		deadline := time.Now().Add(2 * time.Minute)
		for time.Now().Before(deadline) {
			ds := fetchFor(t, b, n, time.Until(deadline))
			for _, d := range ds {
				counts[d.MessageID]++
				if d.Attempt != 2 || !d.Redelivered {
					t.Errorf("recovered %s with attempt %d", d.MessageID, d.Attempt)
				}
				if s := stored[d.MessageID]; s.IsZero() || !d.StoredAt.Equal(s) {
					t.Errorf("recovered %s stored at %v, first delivered stored at %v", d.MessageID, d.StoredAt, s)
				}
			}
			b.Ack(leaseIDs(ds)...)
		}
		dups := 0
		for i := range n {
			id := "m" + strconv.Itoa(i)
			switch {
			case !acked[id] && counts[id] == 0:
				t.Errorf("unacked %s lost", id)
			case counts[id] > 1:
				t.Errorf("%s redelivered %d times", id, counts[id])
			case acked[id] && counts[id] == 1:
				dups++
			}
		}
		t.Logf("crash: %d unacked recovered, %d acked redelivered (expected duplicates)", n/2, dups)
		if dups != n/2 {
			t.Errorf("acked duplicates = %d; a foreign owner cannot know about acks, want %d", dups, n/2)
		}
		// The dead consumer cannot give anything back: Close gives up at its deadline.
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if err := a.Close(ctx); err == nil {
			t.Error("Close of a consumer whose connection died reported success")
		}
		checkNoViolations(t, f)
	})
}

func TestOutageDropsLeasesAndRecovers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeKubeMQ(t)
		f.send(t, testQueue, ids(10, "m")...)
		var lost atomic.Int64
		c, cl := newTestConsumer(t, f, Options{OnLeasesLost: func(err error, n int) {
			if !errors.Is(err, ErrLeasesLost) {
				t.Errorf("OnLeasesLost err = %v", err)
			}
			lost.Add(int64(n))
		}})
		defer closeConsumer(t, c)
		first := fetchFor(t, c, 10, time.Second)
		synctest.Wait()
		cl.breakStreams()
		// The next poll finds the stream broken: waiters are told and the table is dropped.
		_, err := c.Fetch(context.Background(), 1)
		if !errors.Is(err, ErrLeasesLost) || !errors.Is(err, errFakeDown) {
			t.Fatalf("Fetch after outage = %v", err)
		}
		if lost.Load() != 10 {
			t.Errorf("OnLeasesLost reported %d leases", lost.Load())
		}
		if c.Ack(leaseIDs(first)...)[0] {
			t.Error("ack of a dropped lease accepted")
		}
		// The records come back and, being a dead incarnation's, are redelivered at once.
		again := fetchFor(t, c, 10, 30*time.Second)
		if len(again) != 10 {
			t.Fatalf("recovered %d of 10", len(again))
		}
		for _, d := range again {
			if d.Attempt != 2 {
				t.Errorf("attempt %d", d.Attempt)
			}
		}
		c.Ack(leaseIDs(again)...)
		checkNoViolations(t, f)
	})
}

// A Get the server refuses for now (the real server's Error 302 under load) on a stream that goes
// on is retried: leases held stay valid, the waiting Fetch gets its messages, nothing is reset.
func TestTransientGetRefusal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeKubeMQ(t)
		f.send(t, testQueue, ids(10, "m")...)
		c, _ := newTestConsumer(t, f, Options{MaxBatch: 5})
		defer closeConsumer(t, c)
		first := fetchFor(t, c, 5, time.Second)
		if len(first) != 5 {
			t.Fatalf("first fetch got %d", len(first))
		}
		refusals := 3
		f.mu.Lock()
		f.getFail = func(string) error {
			if refusals == 0 {
				return nil
			}
			refusals--
			return errFakeBusy
		}
		f.mu.Unlock()
		second := fetchFor(t, c, 5, 30*time.Second)
		if len(second) != 5 {
			t.Fatalf("second fetch got %d of 5", len(second))
		}
		for i, ok := range c.Ack(leaseIDs(first)...) {
			if !ok {
				t.Errorf("lease %d of the first fetch lost across the refusals", i)
			}
		}
		c.Ack(leaseIDs(second)...)
		if st := c.Stats(); st.TransientRefusals != 3 || st.Resets != 0 || st.LeasesLost != 0 {
			t.Errorf("stats %+v", st)
		}
		checkNoViolations(t, f)
	})
}

func TestRecordStoreFailureGivesBatchBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeKubeMQ(t)
		f.send(t, testQueue, ids(5, "m")...)
		var fail atomic.Bool
		fail.Store(true)
		f.sendFail = func(q string, msgs []Message) ([]error, error) {
			if fail.Load() {
				return nil, errFakeBad // not retryable: given back at once
			}
			return nil, nil
		}
		c, _ := newTestConsumer(t, f, Options{})
		defer closeConsumer(t, c)
		_, err := c.Fetch(context.Background(), 5)
		if !errors.Is(err, errFakeBad) {
			t.Fatalf("Fetch = %v, want the store error", err)
		}
		if r, _ := f.stored(testQueue); r != 5 {
			t.Errorf("%d messages back in the queue, want 5", r)
		}
		fail.Store(false)
		if got := fetchFor(t, c, 5, 10*time.Second); len(got) != 5 {
			t.Errorf("after recovery got %d", len(got))
		} else {
			c.Ack(leaseIDs(got)...)
		}
		if st := c.Stats(); st.StoreFailures == 0 {
			t.Errorf("stats %+v", st)
		}
		checkNoViolations(t, f)
	})
}

func TestRecordRetryUsesFreshIDs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeKubeMQ(t)
		f.send(t, testQueue, "m1")
		n := 0
		f.sendFail = func(q string, msgs []Message) ([]error, error) {
			n++
			if n <= 2 {
				return []error{errFakeDown}, nil // retryable, per message
			}
			return nil, nil
		}
		c, _ := newTestConsumer(t, f, Options{})
		defer closeConsumer(t, c)
		d := fetchFor(t, c, 1, 10*time.Second)
		if len(d) != 1 {
			t.Fatal("not delivered after retried record stores")
		}
		c.Ack(d[0].LeaseID)
		checkNoViolations(t, f) // a repeated delayed MessageID would be reported
	})
}

// TestDuplicateRecordsCollapse: a record stored twice (the send failed ambiguously and was
// retried under a new id) must not make the lease's records multiply at every return.
func TestDuplicateRecordsCollapse(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeKubeMQ(t)
		f.send(t, testQueue, "m1")
		first := true
		f.ambiguous = func(q string, msgs []Message) bool {
			if first && msgs[0].Tags[TagRecord] != "" {
				first = false
				return true
			}
			return false
		}
		c, _ := newTestConsumer(t, f, Options{})
		defer closeConsumer(t, c)
		d := fetchFor(t, c, 1, time.Second)
		if len(d) != 1 {
			t.Fatal("not delivered")
		}
		if _, delayed := f.stored(testQueue); delayed != 2 {
			t.Fatalf("%d records stored, want the duplicate too", delayed)
		}
		// Both copies return while nobody polls, so one Get takes them together; then four
		// more record cycles with a fetcher polling (ending between two returns, at 62 s).
		// The lease stays live throughout.
		time.Sleep(15 * time.Second)
		if r := fetchFor(t, c, 10, 47*time.Second); len(r) != 0 {
			t.Fatalf("held message redelivered: %+v", r[0])
		}
		if _, delayed := f.stored(testQueue); delayed != 1 {
			t.Errorf("%d records pending for one lease after five cycles, want 1", delayed)
		}
		if st := c.Stats(); st.EntriesRearmed > 7 || st.EntriesObsolete < 1 {
			t.Errorf("one lease re-armed %d times in five cycles (%d dropped): duplicate entries survive",
				st.EntriesRearmed, st.EntriesObsolete)
		}
		if !c.Ack(d[0].LeaseID)[0] {
			t.Error("ack refused")
		}
		if r := fetchFor(t, c, 1, 30*time.Second); len(r) != 0 {
			t.Errorf("acked message redelivered: %+v", r[0])
		}
		checkNoViolations(t, f)
	})
}

func TestStreamRecycle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeKubeMQ(t)
		c, cl := newTestConsumer(t, f, Options{StreamRecycle: 2})
		defer closeConsumer(t, c)
		for i := range 10 {
			f.send(t, testQueue, "m"+strconv.Itoa(i))
			ds := fetchFor(t, c, 1, 5*time.Second)
			if len(ds) != 1 {
				t.Fatalf("message %d not delivered", i)
			}
			c.Ack(ds[0].LeaseID)
		}
		cl.mu.Lock()
		streams := len(cl.streams)
		cl.mu.Unlock()
		if streams < 5 {
			t.Errorf("%d streams opened for 10+ Gets with StreamRecycle 2", streams)
		}
		checkNoViolations(t, f)
	})
}

func TestReleaseAndClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeKubeMQ(t)
		f.send(t, testQueue, ids(6, "m")...)
		c, _ := newTestConsumer(t, f, Options{})
		ds := fetchFor(t, c, 3, time.Second)
		if got := c.Release(ds[0].LeaseID); !got[0] {
			t.Error("Release = false")
		}
		c.Nack(ds[1].LeaseID, time.Hour)
		// One out (ds[2]), one delayed (ds[1]), one released; the rest never fetched.
		closeConsumer(t, c)
		if _, err := c.Fetch(context.Background(), 1); !errors.Is(err, ErrClosed) {
			t.Errorf("Fetch after Close = %v", err)
		}
		if r, _ := f.stored(testQueue); r != 6 {
			t.Errorf("after Close %d messages ready, want all 6 back", r)
		}
		c2, _ := newTestConsumer(t, f, Options{})
		defer closeConsumer(t, c2)
		again := fetchFor(t, c2, 6, time.Second)
		att := map[string]int{}
		for _, d := range again {
			att[d.MessageID] = d.Attempt
		}
		for _, d := range ds {
			if att[d.MessageID] != 2 {
				t.Errorf("%s came back with attempt %d, want 2", d.MessageID, att[d.MessageID])
			}
		}
		if len(again) != 6 {
			t.Errorf("got %d back", len(again))
		}
		c2.Ack(leaseIDs(again)...)
		checkNoViolations(t, f)
	})
}

func TestUnfetch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeKubeMQ(t)
		f.send(t, testQueue, ids(4, "m")...)
		c, _ := newTestConsumer(t, f, Options{Deadline: 3 * time.Second})
		defer closeConsumer(t, c)
		ds := fetchFor(t, c, 4, time.Second)
		if n := c.Unfetch(ds[2], ds[3]); n != 2 {
			t.Fatalf("Unfetch = %d", n)
		}
		if n := c.Unfetch(ds[2]); n != 0 {
			t.Errorf("second Unfetch = %d", n)
		}
		if c.Ack(ds[2].LeaseID)[0] {
			t.Error("ack of an unfetched delivery accepted")
		}
		c.Ack(ds[0].LeaseID, ds[1].LeaseID)
		// Same messages, not counted as attempts, and no expiry while buffered (the first
		// deadline passes during the sleep).
		time.Sleep(5 * time.Second)
		again := fetchFor(t, c, 2, time.Second)
		if len(again) != 2 || again[0].MessageID != ds[2].MessageID || again[1].MessageID != ds[3].MessageID ||
			again[0].Attempt != 1 || again[0].Redelivered {
			t.Fatalf("after Unfetch got %+v", again)
		}
		c.Ack(leaseIDs(again)...)
		if st := c.Stats(); st.Redelivered != 0 || st.Delivered != 4 {
			t.Errorf("stats %+v", st)
		}
		checkNoViolations(t, f)
	})
}

func TestFetchFIFOAndCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeKubeMQ(t)
		c, _ := newTestConsumer(t, f, Options{})
		defer closeConsumer(t, c)
		// A cancelled waiter leaves no demand behind.
		ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
		if _, err := c.Fetch(ctx, 5); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Fetch = %v", err)
		}
		cancel()
		// Three waiters of one message each, queued in order, get the three messages in
		// queue order.
		got := make([]chan string, 3)
		for i := range 3 {
			got[i] = make(chan string, 1)
			go func() {
				ds, err := c.Fetch(context.Background(), 1)
				if err != nil || len(ds) != 1 {
					t.Errorf("waiter %d: %v", i, err)
					got[i] <- ""
					return
				}
				c.Ack(ds[0].LeaseID)
				got[i] <- ds[0].MessageID
			}()
			synctest.Wait() // waiter i is queued before waiter i+1
		}
		f.send(t, testQueue, ids(3, "m")...)
		for i := range 3 {
			if id := <-got[i]; id != "m"+strconv.Itoa(i) {
				t.Errorf("waiter %d got %q", i, id)
			}
		}
		checkNoViolations(t, f)
	})
}

// TestRandomWorkload: ack 93 %, nack 5 %, ignore 2 % (deadline expiry), messages arriving while
// consuming; every message must end acked, none lost.
func TestRandomWorkload(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeKubeMQ(t)
		const n = 3000
		c, _ := newTestConsumer(t, f, Options{Deadline: 4 * time.Second})
		defer closeConsumer(t, c)
		go func() {
			for i := 0; i < n; i += 100 {
				f.send(t, testQueue, ids(100, "m"+strconv.Itoa(i)+"-")...)
				time.Sleep(50 * time.Millisecond)
			}
		}()
		rng := rand.New(rand.NewPCG(1, 2))
		acked := map[string]int{}
		deliveries := 0
		var mu sync.Mutex
		var wg sync.WaitGroup
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		for w := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := rand.New(rand.NewPCG(uint64(w), 9))
				for {
					ds, err := c.Fetch(ctx, 1+r.IntN(50))
					if err != nil {
						return
					}
					time.Sleep(time.Duration(r.IntN(200)) * time.Millisecond)
					mu.Lock()
					deliveries += len(ds)
					for _, d := range ds {
						switch p := rng.IntN(100); {
						case p < 93:
							if c.Ack(d.LeaseID)[0] {
								acked[d.MessageID]++
							}
						case p < 98:
							c.Nack(d.LeaseID, time.Duration(rng.IntN(3))*time.Second)
						}
					}
					done := len(acked) == n
					mu.Unlock()
					if done {
						cancel()
					}
				}
			}()
		}
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		for i := 0; i < n; i += 100 {
			for _, id := range ids(100, "m"+strconv.Itoa(i)+"-") {
				if acked[id] == 0 {
					t.Errorf("%s never acked (lost)", id)
				}
			}
		}
		dups := 0
		for _, k := range acked {
			dups += k - 1
		}
		st := c.Stats()
		t.Logf("%d deliveries for %d messages; acked twice: %d; stats %+v", deliveries, n, dups, st)
		if dups != 0 {
			t.Errorf("%d messages acked twice: a settled lease came back", dups)
		}
		checkNoViolations(t, f)
	})
}

// The real KubeMQ now and then leaves a delayed send unanswered for half a minute while other
// sends go through: a record store that hangs is sent again after recordAttempt, so the batch
// waiting on it is delivered seconds late, not StoreTimeout late.
func TestUnansweredRecordStoreIsSentAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeKubeMQ(t)
		var hung atomic.Int32
		f.sendHang = func(_ string, msgs []Message) bool {
			return msgs[0].DelaySeconds > 0 && hung.Add(1) == 1 // the first record store only
		}
		c, _ := newTestConsumer(t, f, Options{})
		defer closeConsumer(t, c)
		f.send(t, testQueue, "m1")
		start := time.Now()
		ds, err := c.Fetch(context.Background(), 10)
		if err != nil || len(ds) != 1 || ds[0].MessageID != "m1" {
			t.Fatalf("Fetch = %v, %v", ds, err)
		}
		if took := time.Since(start); took < recordAttempt || took > recordAttempt+2*time.Second {
			t.Errorf("delivered after %v, want about %v (one unanswered attempt)", took, recordAttempt)
		}
		if s := c.Stats(); s.RecordTimeouts != 1 || s.StoreFailures != 0 {
			t.Errorf("RecordTimeouts %d, StoreFailures %d; want 1, 0", s.RecordTimeouts, s.StoreFailures)
		}
		c.Ack(ds[0].LeaseID)
		checkNoViolations(t, f)
	})
}
