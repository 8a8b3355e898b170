package delivery

import (
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"

	"github.com/kubemq-io/kubemq-proxy/embedded"
	"github.com/kubemq-io/kubemq-proxy/internal/kubemqtest"
	"github.com/kubemq-io/kubemq-proxy/kubemqclient"
)

// These tests run against kubemqtest's server: the embedded one in strict mode, or a real
// KubeMQ when $KUBEMQ_ADDRESS is set. Nothing here relies on embedded-only behaviour; the
// strict-mode counters are checked only when the server is embedded.

// testServer returns a server address and a check that no hazardous pattern was used.
func testServer(t testing.TB) (addr string, checkStrict func()) {
	t.Helper()
	if kubemqtest.External() {
		return kubemqtest.Address(t), func() {}
	}
	addr, srv := kubemqtest.StartEmbedded(t, embedded.Options{Strict: true, DataDir: t.TempDir()})
	return addr, func() {
		t.Helper()
		if st := srv.StrictStats(); st.Total() != 0 {
			t.Errorf("strict mode tripped: %+v", st)
		}
	}
}

// conn is a KubeMQ client whose TCP connections a test can cut, like a process kill (kill)
// or a network blip after which the client reconnects (cut).
type conn struct {
	*kubemqclient.Client
	mu    sync.Mutex
	conns []net.Conn
	dead  bool
}

func dial(t testing.TB, addr string) *conn {
	t.Helper()
	c := &conn{}
	dialer := func(ctx context.Context, a string) (net.Conn, error) {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.dead {
			return nil, errors.New("test: connection killed")
		}
		nc, err := (&net.Dialer{}).DialContext(ctx, "tcp", a)
		if err == nil {
			c.conns = append(c.conns, nc)
		}
		return nc, err
	}
	cl, err := kubemqclient.Dial(context.Background(), kubemqclient.Options{
		Address: addr, Logger: zaptest.NewLogger(t), CloseTimeout: 2 * time.Second,
		DialOptions: []grpc.DialOption{grpc.WithContextDialer(dialer)},
	})
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := cl.WaitReady(ctx); err != nil {
		t.Fatalf("wait ready: %v", err)
	}
	c.Client = cl
	t.Cleanup(func() { _ = cl.Close() })
	return c
}

// cut closes the open TCP connections; kill also refuses new ones (the process is gone).
func (c *conn) cut(kill bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.dead = c.dead || kill
	for _, nc := range c.conns {
		_ = nc.Close()
	}
	c.conns = nil
}

func uniqueQueue(t testing.TB) string {
	return "delivery-test." + strconv.FormatUint(rand.Uint64(), 36)
}

func produce(t testing.TB, cl *kubemqclient.Client, queue string, ids []string, size int) {
	t.Helper()
	body := make([]byte, size)
	for len(ids) > 0 {
		n := min(len(ids), 100)
		msgs := make([]kubemqclient.QueueMessage, n)
		for i, id := range ids[:n] {
			b := body
			if size == 0 {
				b = []byte("body-" + id)
			}
			msgs[i] = kubemqclient.QueueMessage{MessageID: id, Channel: queue, Body: b, Tags: map[string]string{"k": id}}
		}
		res, err := cl.SendQueueMessages(context.Background(), msgs)
		if err == nil {
			err = kubemqclient.FirstError(res)
		}
		if err != nil {
			t.Fatalf("produce: %v", err)
		}
		ids = ids[n:]
	}
}

func kubemqConsumer(t testing.TB, cl *conn, queue string, opts Options) *Consumer {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = zaptest.NewLogger(t)
	}
	if opts.RecordDelay == 0 {
		opts.RecordDelay = time.Second
	}
	c, err := NewConsumer(NewKubeMQBackend(cl.Client), queue, opts)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func closeWithin(t testing.TB, c *Consumer, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	if err := c.Close(ctx); err != nil {
		t.Errorf("Close: %v", err)
	}
}

// collect fetches and acks until quiet has passed without a delivery (or max passed), and
// counts deliveries per MessageID. A Fetch error fails the test unless it is one of tolerate.
func collect(t testing.TB, c *Consumer, counts map[string]int, quiet, max time.Duration, tolerate ...error) {
	t.Helper()
	end := time.Now().Add(max)
	for time.Now().Before(end) {
		ctx, cancel := context.WithTimeout(context.Background(), quiet)
		ds, err := c.Fetch(ctx, 500)
		cancel()
		if errors.Is(err, context.DeadlineExceeded) {
			return
		}
		if err != nil && !slices.ContainsFunc(tolerate, func(e error) bool { return errors.Is(err, e) }) {
			t.Fatalf("Fetch: %v", err)
		}
		for _, d := range ds {
			counts[d.MessageID]++
		}
		c.Ack(leaseIDs(ds)...)
	}
}

func TestKubeMQLoneMessageAndBacklog(t *testing.T) {
	addr, checkStrict := testServer(t)
	cl := dial(t, addr)
	q := uniqueQueue(t)
	c := kubemqConsumer(t, cl, q, Options{})
	defer closeWithin(t, c, 10*time.Second)

	// A lone message arriving while the poll loop idles in a 1 s Get comes out well before
	// that Get's wait: MaxItems=1 returns on arrival.
	got := make(chan []*Delivery, 1)
	go func() {
		ds, err := c.Fetch(context.Background(), 10)
		if err != nil {
			t.Error(err)
		}
		got <- ds
	}()
	time.Sleep(1500 * time.Millisecond) // let the loop reach an idle Get (the property under test)
	start := time.Now()
	produce(t, cl.Client, q, []string{"lone"}, 0)
	ds := <-got
	lat := time.Since(start)
	if len(ds) != 1 || ds[0].MessageID != "lone" || string(ds[0].Body) != "body-lone" || ds[0].Tags["k"] != "lone" || ds[0].Attempt != 1 {
		t.Fatalf("lone delivery = %+v", ds)
	}
	if lat > 900*time.Millisecond {
		t.Errorf("lone message took %v: the Get waited instead of returning on arrival", lat)
	}
	t.Logf("lone message latency %v", lat)
	c.Ack(ds[0].LeaseID)

	// A backlog drains in batches.
	const n = 5000
	produce(t, cl.Client, q, ids(n, "b"), 1024)
	before := c.Stats()
	counts := map[string]int{}
	for total := 0; total < n; {
		ds, err := c.Fetch(context.Background(), 500)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range ds {
			counts[d.MessageID]++
		}
		total += len(ds)
		c.Ack(leaseIDs(ds)...)
	}
	after := c.Stats()
	if gets := after.Gets - before.Gets; gets > n/500+5 {
		t.Errorf("%d Gets for a %d backlog with MaxBatch 500", gets, n)
	}
	if recs := after.RecordsStored - before.RecordsStored; recs > n/500+5 {
		t.Errorf("%d records for a %d backlog: not one per batch", recs, n)
	}
	for _, id := range ids(n, "b") {
		if counts[id] != 1 {
			t.Errorf("%s delivered %d times", id, counts[id])
		}
	}
	checkStrict()
}

func TestKubeMQSettlement(t *testing.T) {
	addr, checkStrict := testServer(t)
	cl := dial(t, addr)
	q := uniqueQueue(t)
	c := kubemqConsumer(t, cl, q, Options{Deadline: 2 * time.Second})
	defer closeWithin(t, c, 10*time.Second)
	produce(t, cl.Client, q, []string{"ack", "nack", "delay", "expire", "extend"}, 0)
	ds := fetchFor(t, c, 5, 10*time.Second)
	if len(ds) != 5 {
		t.Fatalf("got %d of 5", len(ds))
	}
	by := map[string]*Delivery{}
	for _, d := range ds {
		by[d.MessageID] = d
	}
	nackAt := time.Now()
	if !c.Ack(by["ack"].LeaseID)[0] || !c.Nack(by["nack"].LeaseID, 0) || !c.Nack(by["delay"].LeaseID, 3*time.Second) {
		t.Fatal("settlement refused")
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // keep "extend" alive for the whole test
		defer wg.Done()
		tk := time.NewTicker(500 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tk.C:
				if !c.Extend(by["extend"].LeaseID, time.Now().Add(2*time.Second)) {
					t.Error("Extend refused")
				}
			}
		}
	}()
	// Over 8 s (8 record delays): nack comes back at once, expire after its 2 s deadline,
	// delay after 3 s; ack and extend never.
	seen := map[string][]*Delivery{}
	end := time.Now().Add(8 * time.Second)
	for time.Now().Before(end) {
		ctx, cancel := context.WithDeadline(context.Background(), end)
		r, err := c.Fetch(ctx, 10)
		cancel()
		if err != nil {
			break
		}
		for _, d := range r {
			seen[d.MessageID] = append(seen[d.MessageID], d)
			if d.MessageID == "nack" {
				if lat := time.Since(nackAt); lat > time.Second {
					t.Errorf("nack redelivered after %v", lat)
				}
			}
			if d.MessageID == "delay" {
				if lat := time.Since(nackAt); lat < 3*time.Second {
					t.Errorf("delayed nack redelivered after %v, before its 3 s", lat)
				}
			}
			c.Ack(d.LeaseID)
		}
	}
	close(stop)
	wg.Wait()
	for _, id := range []string{"nack", "delay", "expire"} {
		if r := seen[id]; len(r) != 1 || r[0].Attempt != 2 || !r[0].Redelivered || r[0].Tags["k"] != id || len(r[0].Tags) != 1 {
			t.Errorf("%s redeliveries = %+v", id, r)
		}
	}
	for _, id := range []string{"ack", "extend"} {
		if len(seen[id]) != 0 {
			t.Errorf("%s redelivered: %+v", id, seen[id][0])
		}
	}
	if !c.Ack(by["extend"].LeaseID)[0] {
		t.Error("extended lease not ackable after 8 s")
	}
	if c.Ack(by["ack"].LeaseID)[0] || c.Nack("bogus", 0) {
		t.Error("stale or unknown id accepted")
	}
	if st := c.Stats(); st.EntriesRearmed == 0 || st.EntriesObsolete == 0 {
		t.Errorf("records were not re-armed and dropped: %+v", st)
	}
	checkStrict()
}

// TestKubeMQCrash abandons a Consumer holding unacked leases (its connections are cut, nothing
// is settled: kill -9) and checks that a new Consumer (new owner) redelivers every unacked
// message; acked ones may come back as duplicates, which are counted.
func TestKubeMQCrash(t *testing.T) {
	addr, checkStrict := testServer(t)
	q := uniqueQueue(t)
	const n = 1000
	clA := dial(t, addr)
	produce(t, clA.Client, q, ids(n, "m"), 256)
	a := kubemqConsumer(t, clA, q, Options{})
	held := fetchFor(t, a, n, 20*time.Second)
	if len(held) != n {
		t.Fatalf("fetched %d of %d", len(held), n)
	}
	acked := map[string]bool{}
	for i, d := range held {
		if i%3 != 0 {
			a.Ack(d.LeaseID)
			acked[d.MessageID] = true
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.waitIdle(ctx); err != nil { // a real crash may also hit a waiting Get; strict mode would flag that
		t.Fatal(err)
	}
	clA.cut(true)

	clB := dial(t, addr)
	b := kubemqConsumer(t, clB, q, Options{})
	defer closeWithin(t, b, 10*time.Second)
	counts := map[string]int{}
	collect(t, b, counts, 5*time.Second, time.Minute)
	lost, dups, unackedBack := 0, 0, 0
	for _, id := range ids(n, "m") {
		switch {
		case !acked[id] && counts[id] == 0:
			lost++
		case !acked[id]:
			unackedBack++
			dups += counts[id] - 1
		default:
			dups += counts[id]
		}
	}
	t.Logf("crash: %d unacked redelivered, %d lost, %d duplicate deliveries (acked before the crash or repeated)", unackedBack, lost, dups)
	if lost != 0 {
		t.Errorf("%d unacked messages lost", lost)
	}
	// The records were another owner's: bounced while their leases could still be held, then
	// recovered.
	if st := b.Stats(); st.EntriesBounced == 0 || st.EntriesRecovered < uint64(unackedBack) {
		t.Errorf("foreign records not bounced then recovered: %+v", st)
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), time.Second)
	defer cancel2()
	_ = a.Close(ctx2) // its connection is gone; it can give nothing back
	checkStrict()
}

// TestKubeMQOutage cuts the consumer's connection (a backend blip): the lease table is
// dropped, the front-end is told, and every unacked message comes back through its record.
func TestKubeMQOutage(t *testing.T) {
	addr, checkStrict := testServer(t)
	cl := dial(t, addr)
	q := uniqueQueue(t)
	var lostN atomic.Int64
	c := kubemqConsumer(t, cl, q, Options{OnLeasesLost: func(err error, n int) { lostN.Add(int64(n)) }})
	defer closeWithin(t, c, 10*time.Second)
	produce(t, cl.Client, q, ids(50, "m"), 0)
	first := fetchFor(t, c, 50, 10*time.Second)
	if len(first) != 50 {
		t.Fatalf("got %d", len(first))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.waitIdle(ctx); err != nil {
		t.Fatal(err)
	}
	cl.cut(false)
	var err error
	for err == nil { // the next poll finds the stream broken
		var ds []*Delivery
		ds, err = c.Fetch(ctx, 1)
		if len(ds) > 0 {
			t.Fatalf("delivery before the outage was noticed: %+v", ds[0])
		}
	}
	// Either the readiness hook dropped the leases first (ErrLeasesLost) or
	// the poll met the broken connection first (a retryable Unavailable);
	// both tell the front-end the backend is gone. In the second case the
	// drop follows: from the broken stream, or from the readiness hook.
	if !errors.Is(err, ErrLeasesLost) && !errors.Is(err, kubemqclient.ErrUnavailable) {
		t.Fatalf("Fetch after cut = %v, want ErrLeasesLost or Unavailable", err)
	}
	// The poll loop runs only while a Fetch waits, and a cut the client
	// reconnects from at once may never reach the readiness hook: keep
	// fetching until the broken stream is found. Until the client has
	// reconnected, a Fetch may still hear of the outage (the second of the
	// two signals above); the messages come back from their lease records
	// either way.
	counts := map[string]int{}
	for end := time.Now().Add(15 * time.Second); lostN.Load() == 0 && time.Now().Before(end); {
		collect(t, c, counts, 200*time.Millisecond, 200*time.Millisecond, ErrLeasesLost, kubemqclient.ErrUnavailable)
	}
	if lostN.Load() != 50 || c.Ack(first[0].LeaseID)[0] {
		t.Errorf("lost %d leases, stale ack accepted %v", lostN.Load(), c.Ack(first[0].LeaseID)[0])
	}
	collect(t, c, counts, 4*time.Second, time.Minute, ErrLeasesLost, kubemqclient.ErrUnavailable)
	for _, id := range ids(50, "m") {
		if counts[id] != 1 {
			t.Errorf("%s came back %d times", id, counts[id])
		}
	}
	checkStrict()
}

// TestKubeMQRandomWorkload: ack 93 %, nack 5 %, ignore 2 % (deadline expiry) while a producer
// sends; every message must end acked.
func TestKubeMQRandomWorkload(t *testing.T) {
	addr, checkStrict := testServer(t)
	cl := dial(t, addr)
	q := uniqueQueue(t)
	c := kubemqConsumer(t, cl, q, Options{Deadline: 2 * time.Second})
	defer closeWithin(t, c, 10*time.Second)
	const n = 4000
	all := ids(n, "w")
	go func() {
		for i := 0; i < n; i += 200 {
			produce(t, cl.Client, q, all[i:i+200], 512)
			time.Sleep(50 * time.Millisecond)
		}
	}()
	var mu sync.Mutex
	acked := map[string]int{}
	deliveries, nacks, ignored := 0, 0, 0
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 7))
			for ctx.Err() == nil {
				ds, err := c.Fetch(ctx, 1+r.IntN(100))
				if err != nil {
					if ctx.Err() == nil {
						t.Errorf("Fetch: %v", err)
					}
					return
				}
				time.Sleep(time.Duration(r.IntN(20)) * time.Millisecond)
				mu.Lock()
				deliveries += len(ds)
				for _, d := range ds {
					switch p := r.IntN(100); {
					case p < 93:
						if c.Ack(d.LeaseID)[0] {
							acked[d.MessageID]++
						}
					case p < 98:
						nacks++
						c.Nack(d.LeaseID, time.Duration(r.IntN(2))*time.Second)
					default:
						ignored++
					}
				}
				if len(acked) == n {
					cancel()
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	lost, twice := 0, 0
	for _, id := range all {
		if acked[id] == 0 {
			lost++
		}
		if acked[id] > 1 {
			twice++
		}
	}
	t.Logf("%d messages, %d deliveries, %d nacks, %d ignored; lost %d; acked twice %d; stats %+v",
		n, deliveries, nacks, ignored, lost, twice, c.Stats())
	if lost != 0 {
		t.Errorf("%d messages never acked", lost)
	}
	if twice != 0 {
		t.Errorf("%d messages delivered again after their ack", twice)
	}
	checkStrict()
}

// TestKubeMQManager: one Consumer per queue shared by Handles; ReleaseAll gives back only the
// handle's deliveries; a Consumer that closed clean passes its owner to the next one, whose
// returning records of acked leases are then dropped rather than redelivered.
// newKubeMQManager is a Manager on cl, closed at the end of the test.
func newKubeMQManager(t *testing.T, cl *conn, opts Options, reg prometheus.Registerer) *Manager {
	t.Helper()
	opts.Logger = zaptest.NewLogger(t)
	m, err := NewManager(NewKubeMQBackend(cl.Client), opts, reg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := m.Close(ctx); err != nil {
			t.Error(err)
		}
	})
	return m
}

func TestKubeMQManager(t *testing.T) {
	addr, checkStrict := testServer(t)
	cl := dial(t, addr)
	q := uniqueQueue(t)
	reg := prometheus.NewPedanticRegistry()
	m := newKubeMQManager(t, cl, Options{RecordDelay: time.Second}, reg)
	ctx := context.Background()
	h1, err := m.Acquire(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	h2, _ := m.Acquire(ctx, q)
	if h1.Consumer() != h2.Consumer() || m.Lookup(q) != h1.Consumer() {
		t.Fatal("two consumers for one queue")
	}
	produce(t, cl.Client, q, ids(20, "m"), 0)
	d1 := fetchFor(t, h1, 10, 10*time.Second)
	d2 := fetchFor(t, h2, 10, 10*time.Second)
	if len(d1) != 10 || len(d2) != 10 {
		t.Fatalf("fetched %d + %d", len(d1), len(d2))
	}
	if n := h1.ReleaseAll(); n != 10 {
		t.Errorf("h1.ReleaseAll = %d", n)
	}
	back := fetchFor(t, h2, 10, 10*time.Second)
	if len(back) != 10 {
		t.Fatalf("released deliveries came back %d of 10", len(back))
	}
	for _, d := range back {
		if d.Attempt != 2 {
			t.Errorf("released %s came back with attempt %d", d.MessageID, d.Attempt)
		}
	}
	h2.Ack(leaseIDs(d2)...)
	h2.Ack(leaseIDs(back)...)
	old := h1.Consumer()
	h1.Close()
	h2.Close()
	// The table is empty: the Consumer closes; the next Acquire gets a new one.
	var h3 *Handle
	for {
		h3, err = m.Acquire(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		if h3.Consumer() != old {
			break
		}
		h3.Close()
		<-old.closed
	}
	defer h3.Close()
	// Records of the 20 acked leases return within a few seconds and must be dropped.
	if r := fetchFor(t, h3, 1, 4*time.Second); len(r) != 0 {
		t.Errorf("acked message redelivered after a clean consumer restart: %+v", r[0])
	}
	if st := h3.Consumer().Stats(); st.EntriesRecovered != 0 || st.EntriesBounced != 0 {
		t.Errorf("records of the clean predecessor treated as foreign: %+v", st)
	}
	// Counters survive the first Consumer's close.
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	vals := map[string]float64{}
	for _, mf := range mfs {
		for _, mt := range mf.GetMetric() {
			switch {
			case mt.GetCounter() != nil:
				vals[mf.GetName()] += mt.GetCounter().GetValue()
			case mt.GetGauge() != nil:
				vals[mf.GetName()] += mt.GetGauge().GetValue()
			}
		}
	}
	if vals["kubemq_proxy_delivery_acked_total"] != 20 || vals["kubemq_proxy_delivery_consumers"] != 1 ||
		vals["kubemq_proxy_delivery_records_stored_total"] == 0 {
		t.Errorf("metrics %v", vals)
	}
	checkStrict()
}

// TestKubeMQManagerRetire: Retire closes a queue's Consumer at once when its last Handle is
// closed (not after the linger), refuses while a Handle is open, and the next Consumer keeps
// the identity, so the records of leases acked before are dropped when they return.
func TestKubeMQManagerRetire(t *testing.T) {
	addr, checkStrict := testServer(t)
	cl := dial(t, addr)
	q := uniqueQueue(t)
	m := newKubeMQManager(t, cl, Options{RecordDelay: time.Second, Linger: time.Hour}, nil)
	if !m.Retire("no-such-queue") {
		t.Error("Retire of a queue without a Consumer = false")
	}
	ctx := context.Background()
	h, err := m.Acquire(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	produce(t, cl.Client, q, ids(5, "m"), 0)
	ds := fetchFor(t, h, 5, 10*time.Second)
	if len(ds) != 5 {
		t.Fatalf("fetched %d of 5", len(ds))
	}
	h.Ack(leaseIDs(ds)...)
	if m.Retire(q) {
		t.Fatal("Retire with an open Handle = true")
	}
	old := h.Consumer()
	h.Close()
	if !m.Retire(q) {
		t.Fatal("Retire after the last Handle closed = false")
	}
	select {
	case <-old.closed:
	default:
		t.Fatal("Retire returned before the Consumer closed")
	}
	h2, err := m.Acquire(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	defer h2.Close()
	if h2.Consumer() == old {
		t.Fatal("Acquire after Retire returned the closed Consumer")
	}
	if r := fetchFor(t, h2, 1, 3*time.Second); len(r) != 0 {
		t.Errorf("acked message redelivered after Retire: %+v", r[0])
	}
	if st := h2.Consumer().Stats(); st.EntriesRecovered != 0 || st.EntriesBounced != 0 {
		t.Errorf("records of the retired Consumer treated as foreign: %+v", st)
	}
	checkStrict()
}

// TestQueueMetricsLabelled: the lease engine's per-queue series carry the KubeMQ queue as a
// label up to Options.MetricsQueueLabels queues; later queues are summed under "_other".
func TestQueueMetricsLabelled(t *testing.T) {
	addr, checkStrict := testServer(t)
	cl := dial(t, addr)
	reg := prometheus.NewPedanticRegistry()
	m := newKubeMQManager(t, cl, Options{RecordDelay: time.Second, MetricsQueueLabels: 1}, reg)
	ctx := context.Background()
	q1, q2, q3 := uniqueQueue(t)+"a", uniqueQueue(t)+"b", uniqueQueue(t)+"c"
	held := map[string]int{q1: 3, q2: 2, q3: 4}
	for _, q := range []string{q1, q2, q3} { // q1 first: it gets the one label
		h, err := m.Acquire(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		produce(t, cl.Client, q, ids(held[q]+1, q), 0)
		ds := fetchFor(t, h, held[q]+1, 10*time.Second)
		if len(ds) != held[q]+1 {
			t.Fatalf("%s: fetched %d", q, len(ds))
		}
		h.Ack(ds[0].LeaseID)
	}
	want := map[string]float64{q1: 3, "_other": 6}
	acked := map[string]float64{q1: 1, "_other": 2}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, mf := range mfs {
		switch mf.GetName() {
		case "kubemq_proxy_delivery_queue_leases_out", "kubemq_proxy_delivery_queue_acked_total":
		default:
			continue
		}
		if len(mf.GetMetric()) != 2 {
			t.Errorf("%s: %d series, want 2 (one labelled queue and _other)", mf.GetName(), len(mf.GetMetric()))
		}
		for _, s := range mf.GetMetric() {
			label := s.GetLabel()[0].GetValue()
			exp, got := want[label], s.GetGauge().GetValue()
			if mf.GetName() == "kubemq_proxy_delivery_queue_acked_total" {
				exp, got = acked[label], s.GetCounter().GetValue()
			}
			if got != exp {
				t.Errorf("%s{queue=%q} = %v, want %v", mf.GetName(), label, got, exp)
			}
			seen++
		}
	}
	if seen != 4 {
		t.Errorf("saw %d per-queue values, want 4", seen)
	}
	checkStrict()
}
