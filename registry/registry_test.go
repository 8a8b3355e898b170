package registry_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/kubemq-io/kubemq-proxy/embedded"

	"github.com/kubemq-io/kubemq-proxy/internal/kubemqtest"
	"github.com/kubemq-io/kubemq-proxy/kubemqclient"
	"github.com/kubemq-io/kubemq-proxy/registry"
)

func dial(t testing.TB, addr string) *kubemqclient.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := kubemqclient.Dial(ctx, kubemqclient.Options{Address: addr, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func open(t *testing.T, c *kubemqclient.Client, channel string) *registry.Registry {
	t.Helper()
	return openLate(t, c, channel, 0)
}

// openLate is open for a replica that reads the log delay late
// (Options.FollowDelay).
func openLate(t *testing.T, c *kubemqclient.Client, channel string, delay time.Duration) *registry.Registry {
	t.Helper()
	r, err := registry.Open(context.Background(), registry.Options{Client: c, Channel: channel,
		Logger: zaptest.NewLogger(t), FollowDelay: delay})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := r.WaitReplayed(ctx); err != nil {
		t.Fatalf("replay: %v", err)
	}
	return r
}

// uniqueChannel keeps runs against a shared external KubeMQ apart.
func uniqueChannel(t *testing.T) string {
	return kubemqclient.Channel("kubemq-proxy-test.registry", t.Name(), time.Now().Format("150405.000000000"))
}

// waitFor polls the in-memory view; the registry applies remote writes on
// its own goroutine, so there is no event to wait on from outside.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func value(t *testing.T, r *registry.Registry, kind, key string) (string, bool) {
	raw, ok := r.Get(kind, key)
	if !ok {
		return "", false
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		t.Fatal(err)
	}
	return s, true
}

func TestReplicasSeeEachOther(t *testing.T) {
	addr := kubemqtest.Address(t)
	ch := uniqueChannel(t)
	a := open(t, dial(t, addr), ch)
	defer a.Close()
	b := open(t, dial(t, addr), ch)
	defer b.Close()
	ctx := context.Background()

	changes := make(chan registry.Change, 16)
	cancel := b.OnChange(func(c registry.Change) { changes <- c })
	defer cancel()

	if err := a.Put(ctx, "topic", "t1", "from-a"); err != nil {
		t.Fatal(err)
	}
	select {
	case c := <-changes:
		if c.Local || c.Record.Key != "t1" || c.Record.Kind != "topic" {
			t.Fatalf("unexpected change %+v", c)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("b never saw a's write")
	}
	if v, ok := value(t, b, "topic", "t1"); !ok || v != "from-a" {
		t.Fatalf("b sees %q %v", v, ok)
	}

	// Last writer wins on both replicas.
	if err := b.Put(ctx, "topic", "t1", "from-b"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a to see b's overwrite", func() bool { v, _ := value(t, a, "topic", "t1"); return v == "from-b" })

	if err := a.Delete(ctx, "topic", "t1"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b to see the delete", func() bool { _, ok := b.Get("topic", "t1"); return !ok })
	if got := b.List("topic"); len(got) != 0 {
		t.Fatalf("deleted record still listed: %+v", got)
	}
}

func TestRestartReplaysEverything(t *testing.T) {
	addr := kubemqtest.Address(t)
	ch := uniqueChannel(t)
	ctx := context.Background()
	a := open(t, dial(t, addr), ch)
	for i := 0; i < 50; i++ {
		if err := a.Put(ctx, "queue", string(rune('a'+i%26))+string(rune('a'+i/26)), i); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Delete(ctx, "queue", "aa"); err != nil {
		t.Fatal(err)
	}
	if err := a.Put(ctx, "exchange", "x", "direct"); err != nil {
		t.Fatal(err)
	}
	// A snapshot rewrites the same records; replay must still converge.
	if err := a.Snapshot(ctx); err != nil {
		t.Fatal(err)
	}
	want := a.List("queue")
	a.Close()

	b := open(t, dial(t, addr), ch)
	defer b.Close()
	got := b.List("queue")
	if len(got) != 49 || len(got) != len(want) {
		t.Fatalf("replayed %d queue records, want 49 (%d before restart)", len(got), len(want))
	}
	for i := range got {
		if got[i].Key != want[i].Key || string(got[i].Value) != string(want[i].Value) {
			t.Fatalf("record %d: got %+v want %+v", i, got[i], want[i])
		}
	}
	if _, ok := b.Get("queue", "aa"); ok {
		t.Fatal("deleted record came back after replay")
	}
	if v, ok := value(t, b, "exchange", "x"); !ok || v != "direct" {
		t.Fatalf("exchange x = %q %v", v, ok)
	}
}

// TestSnapshotOfLargeRecords: a snapshot is cut into events small enough
// for KubeMQ however large the records (here 1 MiB each, 20 MiB in all,
// through a client that sends at most 8 MiB at once).
func TestSnapshotOfLargeRecords(t *testing.T) {
	addr := kubemqtest.Address(t)
	ch := uniqueChannel(t)
	ctx := context.Background()
	dialSmall := func() *kubemqclient.Client {
		c, err := kubemqclient.Dial(ctx, kubemqclient.Options{Address: addr, Logger: zaptest.NewLogger(t), MaxMessageBytes: 8 << 20})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	a := open(t, dialSmall(), ch)
	big := strings.Repeat("x", 1<<20)
	for i := range 20 {
		if err := a.Put(ctx, "schema", fmt.Sprint(i), big); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Snapshot(ctx); err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	a.Close()
	b := open(t, dialSmall(), ch)
	defer b.Close()
	if got := b.List("schema"); len(got) != 20 {
		t.Fatalf("replayed %d records, want 20", len(got))
	}
}

func TestSnapshotNeverOverridesNewerWrite(t *testing.T) {
	addr := kubemqtest.Address(t)
	ch := uniqueChannel(t)
	ctx := context.Background()
	a := open(t, dial(t, addr), ch)
	defer a.Close()
	b := open(t, dial(t, addr), ch)
	defer b.Close()
	if err := a.Put(ctx, "sub", "s", "v1"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b to see v1", func() bool { v, _ := value(t, b, "sub", "s"); return v == "v1" })
	if err := b.Put(ctx, "sub", "s", "v2"); err != nil {
		t.Fatal(err)
	}
	// a may not have seen v2 yet; its snapshot carries v1's old version.
	if err := a.Snapshot(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a to converge on v2", func() bool { v, _ := value(t, a, "sub", "s"); return v == "v2" })
	c := open(t, dial(t, addr), ch)
	defer c.Close()
	if v, _ := value(t, c, "sub", "s"); v != "v2" {
		t.Fatalf("a fresh replica sees %q, want v2", v)
	}
}

// TestWriteVisibleToWatchersOnReturn: when Put returns, every OnChange
// watcher has seen the record, even when the registry's own follow stream
// delivers the same record first (it races the writer's local apply). The
// front-ends read their catalogues right after a write.
func TestWriteVisibleToWatchersOnReturn(t *testing.T) {
	var c *kubemqclient.Client
	if kubemqtest.External() {
		c = dial(t, kubemqtest.Address(t))
	} else {
		// In process, as the proxy reaches its embedded server: the
		// follow stream then often hears of a write before Put returns.
		_, srv := kubemqtest.StartEmbedded(t, embedded.Options{})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var err error
		c, err = kubemqclient.Dial(ctx, kubemqclient.Options{Address: "embedded", Logger: zaptest.NewLogger(t), Conn: srv.Channel(embedded.SharePayloads())})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
	}
	r := open(t, c, uniqueChannel(t))
	defer r.Close()
	var mu sync.Mutex
	seen := map[string]bool{}
	cancel := r.OnChange(func(c registry.Change) {
		if !c.Local {
			// A moment on the follow stream's changes widens the window
			// in which a writer, finding its record already merged, could
			// return before this watcher has run: without it the race is
			// too narrow for the test to fail without the fix.
			time.Sleep(time.Millisecond)
		}
		mu.Lock()
		seen[c.Record.Key] = true
		mu.Unlock()
	})
	defer cancel()
	ctx, done := context.WithTimeout(context.Background(), 60*time.Second)
	defer done()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 100 {
				key := fmt.Sprintf("w%d-%d", w, i)
				if err := r.Put(ctx, "k", key, "v"); err != nil {
					errs <- err
					return
				}
				mu.Lock()
				ok := seen[key]
				mu.Unlock()
				if !ok {
					errs <- fmt.Errorf("Put(%s) returned before the watchers saw it", key)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// TestPutIfOneWinner: two replicas writing one record conditionally on the same base, at once:
// exactly one succeeds, the other gets ErrConflict, and both (and a third replica started
// afterwards) hold the winner's value; a write on a stale base fails, one on the current base
// succeeds, and a conditional creation fails once the record exists.
func TestPutIfOneWinner(t *testing.T) {
	addr := kubemqtest.Address(t)
	ch := uniqueChannel(t)
	a := open(t, dial(t, addr), ch)
	defer a.Close()
	b := open(t, dial(t, addr), ch)
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := a.PutIf(ctx, "iam", "k", "v0", registry.Base{}); err != nil {
		t.Fatalf("conditional creation: %v", err)
	}
	if err := b.PutIf(ctx, "iam", "k", "again", registry.Base{}); !errors.Is(err, registry.ErrConflict) {
		t.Fatalf("second conditional creation: %v, want ErrConflict", err)
	}
	waitFor(t, "b to see v0", func() bool { v, _ := value(t, b, "iam", "k"); return v == "v0" })
	for round := range 5 {
		base := a.BaseOf("iam", "k")
		if bb := b.BaseOf("iam", "k"); bb != base {
			t.Fatalf("round %d: bases differ: %+v %+v", round, base, bb)
		}
		va, vb := fmt.Sprintf("a%d", round), fmt.Sprintf("b%d", round)
		errs := make(chan error, 2)
		go func() { errs <- a.PutIf(ctx, "iam", "k", va, base) }()
		go func() { errs <- b.PutIf(ctx, "iam", "k", vb, base) }()
		ea, eb := <-errs, <-errs
		won := 0
		for _, err := range []error{ea, eb} {
			switch {
			case err == nil:
				won++
			case !errors.Is(err, registry.ErrConflict):
				t.Fatalf("round %d: %v", round, err)
			}
		}
		if won != 1 {
			t.Fatalf("round %d: %d writers won", round, won)
		}
		waitFor(t, "both replicas to agree", func() bool {
			x, _ := value(t, a, "iam", "k")
			y, _ := value(t, b, "iam", "k")
			return x == y && (x == va || x == vb)
		})
		if err := a.PutIf(ctx, "iam", "k", "stale", base); !errors.Is(err, registry.ErrConflict) {
			t.Fatalf("round %d: write on a stale base: %v", round, err)
		}
	}
	want, _ := value(t, a, "iam", "k")
	c := open(t, dial(t, addr), ch)
	defer c.Close()
	if got, _ := value(t, c, "iam", "k"); got != want {
		t.Fatalf("a replica started afterwards holds %q, want %q", got, want)
	}
	if err := c.PutIf(ctx, "iam", "k", "from-c", c.BaseOf("iam", "k")); err != nil {
		t.Fatalf("write on the current base: %v", err)
	}
	waitFor(t, "a to see c's write", func() bool { v, _ := value(t, a, "iam", "k"); return v == "from-c" })
}

// CatchUp makes a write of another replica visible, however late this
// replica reads the log.
func TestCatchUp(t *testing.T) {
	addr := kubemqtest.Address(t)
	ch := uniqueChannel(t)
	a := open(t, dial(t, addr), ch)
	defer a.Close()
	b := openLate(t, dial(t, addr), ch, 100*time.Millisecond)
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := range 3 {
		key := fmt.Sprintf("q%d", i)
		if err := a.Put(ctx, "queue", key, key); err != nil {
			t.Fatal(err)
		}
		if _, ok := value(t, b, "queue", key); ok {
			t.Fatalf("%s: b saw the write before reading the log (the delay did not hold it back)", key)
		}
		if err := b.CatchUp(ctx); err != nil {
			t.Fatal(err)
		}
		if v, ok := value(t, b, "queue", key); !ok || v != key {
			t.Fatalf("%s: after CatchUp b has %q, %v", key, v, ok)
		}
	}
	// Nothing new: it returns once the last event is applied, which it is.
	quick, cancel2 := context.WithTimeout(ctx, 2*time.Second)
	defer cancel2()
	if err := b.CatchUp(quick); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkCatchUp is what a lookup that finds nothing pays with replicas.
func BenchmarkCatchUp(b *testing.B) {
	addr := kubemqtest.Address(b)
	c := dial(b, addr)
	r, err := registry.Open(context.Background(), registry.Options{Client: c, Channel: kubemqclient.Channel("kubemq-proxy-test.registry", "bench", time.Now().Format("150405.000000000"))})
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := r.WaitReplayed(ctx); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		if err := r.CatchUp(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
