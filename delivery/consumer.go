package delivery

import (
	"cmp"
	"context"
	cryptorand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// Errors returned by Fetch and Close.
var (
	// ErrClosed: the Consumer (or Handle) is closed.
	ErrClosed = errors.New("delivery: consumer closed")
	// ErrLeasesLost wraps the backend error after which the lease table was dropped: every
	// Delivery handed out before is void (its ack is ignored) and comes back through its
	// lease record. Front-ends tell their clients (gRPC UNAVAILABLE, AMQP connection close).
	ErrLeasesLost = errors.New("delivery: backend lost, leases dropped")
	// ErrBackendDown is the cause wrapped in ErrLeasesLost when the backend's readiness signal
	// (StateNotifier) reported KubeMQ unreachable.
	ErrBackendDown = errors.New("delivery: KubeMQ reported unreachable")
	// ErrNotOwner: another process consumes the queue (Options.Owners); the error wraps the
	// Owners' own, which says which.
	ErrNotOwner = errors.New("delivery: another process consumes the queue")
	// ErrHandedOver: this process's holding of the queue was lost (Options.Owners), the
	// Consumer closed and gave its leases back; another process consumes the queue now.
	ErrHandedOver = errors.New("delivery: the queue was handed over to another process")
)

// Options configure a Consumer (and every Consumer of a Manager).
type Options struct {
	Logger *zap.Logger // nil = zap.NewNop()

	// RecordDelay is the delay of every lease record, in whole seconds (default 10 s). A
	// record of a live lease is re-armed each time it returns, so longer deadlines never need
	// a longer KubeMQ delay (docs/kubemq.md 9.4 rule 2).
	RecordDelay time.Duration
	// HoldExpiry is how far ahead a lease without a deadline is promised in its record at
	// each re-arm (default 2*RecordDelay): another owner (a replica, or this process after a
	// crash) redelivers the entry once HoldExpiry+RecordDelay have passed since the record was
	// written without it coming back to its owner. Longer values make redelivery after a
	// crash slower and duplicates across replicas rarer (see the package documentation).
	HoldExpiry time.Duration
	// MaxBatch caps one Get (default 500, at most 1024).
	MaxBatch int
	// MaxRecordBytes caps the body of one lease record (default 4 MiB); a batch that needs
	// more is split over several records. A single larger message gets a record of its own.
	MaxRecordBytes int
	// Deadline is the lease deadline of Consumer.Fetch and the initial one of a Handle;
	// 0 = no deadline (AMQP).
	Deadline time.Duration
	// StoreTimeout bounds the retries of one record or copy store (default 30 s). A record
	// that cannot be stored by then gives its transaction back to the queue.
	StoreTimeout time.Duration
	// StreamRecycle replaces the downstream stream after this many Gets (default 10000): the
	// real server keeps one entry per Get until the stream ends (docs/kubemq.md 8.1).
	StreamRecycle int
	// Linger (Manager only) keeps an unused Consumer that still has live leases open for acks
	// at most this long (default 10 min); it closes as soon as its lease table is empty.
	Linger time.Duration

	// BeforeRedeliver, if set, is called before every redelivery copy is enqueued (Nack,
	// expiry, Release, and leases recovered from a dead owner's records) with the Delivery as
	// it was handed out (Attempt = the attempt that failed). Returning true drops the message
	// instead (the caller has dead-lettered it). It runs outside every lock, on the
	// Consumer's settler goroutine, and must not call the Consumer's Close.
	BeforeRedeliver func(d *Delivery) (drop bool)
	// OnLeasesLost, if set, is called (outside every lock) after the lease table was dropped
	// because the backend failed, with the error and the number of leases dropped.
	OnLeasesLost func(err error, leases int)

	// Settlements, if set, records settled leases durably for the queue's next owner (see the
	// interface).
	Settlements Settlements
	// Owners (Manager only), if set, makes every Consumer of the Manager the only consumer of
	// its queue across the processes that share the KubeMQ (see the interface). Entries of
	// another owner in returning records are then that owner's leftovers: redelivered at once
	// unless Settlements reports them settled, instead of bounced until their expiry.
	Owners Owners
}

func (o *Options) setDefaults() error {
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	if o.RecordDelay == 0 {
		o.RecordDelay = 10 * time.Second
	}
	if o.RecordDelay < time.Second || o.RecordDelay%time.Second != 0 || o.RecordDelay > time.Hour {
		return fmt.Errorf("delivery: RecordDelay %v must be whole seconds in 1s..1h", o.RecordDelay)
	}
	if o.HoldExpiry == 0 {
		o.HoldExpiry = 2 * o.RecordDelay
	}
	if o.HoldExpiry < o.RecordDelay {
		return fmt.Errorf("delivery: HoldExpiry %v below RecordDelay %v", o.HoldExpiry, o.RecordDelay)
	}
	if o.MaxBatch == 0 {
		o.MaxBatch = 500
	}
	if o.MaxBatch < 1 || o.MaxBatch > 1024 {
		return fmt.Errorf("delivery: MaxBatch %d out of 1..1024", o.MaxBatch)
	}
	if o.MaxRecordBytes == 0 {
		o.MaxRecordBytes = 4 << 20
	}
	if o.MaxRecordBytes < 1024 {
		return fmt.Errorf("delivery: MaxRecordBytes %d below 1024", o.MaxRecordBytes)
	}
	if o.Deadline < 0 {
		return fmt.Errorf("delivery: negative Deadline %v", o.Deadline)
	}
	if o.StoreTimeout <= 0 {
		o.StoreTimeout = 30 * time.Second
	}
	if o.StreamRecycle <= 0 {
		o.StreamRecycle = 10000
	}
	if o.Linger <= 0 {
		o.Linger = 10 * time.Minute
	}
	return nil
}

// Delivery is one leased message handed out by Fetch. It is immutable: its fields (Body and
// Tags included) must not be modified.
type Delivery struct {
	LeaseID     string    // opaque, unguessable, minted per delivery
	Generation  uint32    // the lease's record generation at hand-out (informative)
	Attempt     int       // delivery attempt counted by the proxy: 1 on first delivery
	Deadline    time.Time // expiry at hand-out; zero = none. Extend does not update it
	Redelivered bool      // Attempt > 1

	MessageID string            // MessageID of the original KubeMQ message, stable across copies
	Metadata  string            // KubeMQ Metadata
	Body      []byte            // KubeMQ Body
	Tags      map[string]string // KubeMQ Tags without the reserved "_kmqp_" tags
	Sequence  uint64            // KubeMQ sequence of the copy delivered (diagnostic)
	StoredAt  time.Time         // when KubeMQ stored the original, stable across copies; zero = unknown
}

// storedAt is Message.Stored as a time; zero when unknown.
func storedAt(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// Stats is a snapshot of a Consumer's gauges and counters (for /metrics).
type Stats struct {
	Queue    string
	Leases   int // live leases: buffered + out + delayed + being requeued
	Out      int // handed out and not yet settled
	Buffered int // recorded, waiting for a Fetch
	Waiters  int // Fetch calls waiting

	Gets             uint64 // downstream Gets
	Received         uint64 // data messages received (after deduplication)
	DuplicateSeqs    uint64 // repeated sequences dropped from Get responses
	Delivered        uint64 // deliveries handed out
	Acked            uint64
	Redelivered      uint64 // copies enqueued (nack, expiry, release, recovery)
	DroppedByHook    uint64 // redeliveries BeforeRedeliver dropped
	RecordsStored    uint64 // lease record messages stored
	EntriesStored    uint64 // entries in them
	RecordsReturned  uint64 // lease records received back
	EntriesRearmed   uint64 // own live entries written again
	EntriesObsolete  uint64 // own settled entries dropped
	EntriesBounced   uint64 // foreign entries written back unchanged
	EntriesRecovered uint64 // foreign or dead-owner entries turned into redeliveries
	RecordsCorrupt   uint64 // records (or tails of records) that could not be decoded
	StoreFailures    uint64 // batches given back to the queue because the record failed
	LeasesLost       uint64 // leases dropped by backend failures
	Resets           uint64 // lease-table drops
	// TransientRefusals counts Gets the server refused for now on a stream that went on
	// (retried after a backoff; nothing held was given up).
	TransientRefusals uint64
	// RecordTimeouts counts record stores the backend left unanswered within one attempt
	// (sent again under fresh ids).
	RecordTimeouts uint64
	// Requeued counts deliveries given back in place (Requeue) and Purged buffered leases
	// dropped by Purge.
	Requeued, Purged uint64
	// Sentinel records (sentinel.go): stored (own and foreign ones stored again), own ones
	// received back, foreign ones stored again, and expired foreign ones dropped.
	SentinelsStored, SentinelsReturned, SentinelsBounced, SentinelsDropped uint64
}

type counters struct {
	gets, received, dupSeqs, delivered, acked, redelivered, droppedByHook,
	recordsStored, entriesStored, recordsReturned, rearmed, obsolete, bounced, recovered,
	corrupt, storeFailures, leasesLost, resets, transient, recordTimeouts, requeued, purged,
	sentinelsStored, sentinelsReturned, sentinelsBounced, sentinelsDropped atomic.Uint64
}

// waiter is one Fetch call waiting for deliveries. Owned by Consumer.mu until done is closed.
type waiter struct {
	max       int
	holder    *Handle
	deadline  time.Duration
	hold      time.Duration // promise without an engine deadline (Handle.SetHold)
	readAhead int           // the poll loop may take this many messages for it (Handle.SetReadAhead)
	try       bool          // TryFetch: answered empty once the queue is found empty
	reg       uint64        // Consumer.checks when it was registered
	got       []*Delivery
	err       error
	finished  bool
	done      chan struct{}
}

// Consumer leases the messages of one KubeMQ queue. At most one Consumer per queue may exist in
// a process (two would open two transactions on one queue, docs/kubemq.md 8.8): use a Manager.
// All methods are safe for concurrent use.
type Consumer struct {
	queue string
	b     Backend
	opts  Options
	log   *zap.Logger
	ids   idGen
	st    counters
	// exclusive: no other process consumes the queue while this Consumer runs (Options.Owners).
	exclusive bool
	// closeCause is what waiting Fetch calls get when the Consumer closes (ErrClosed, or
	// ErrHandedOver); set once, before closing.
	closeCause error

	// mu guards the lease table and everything that refers to leases: owner, table, ready,
	// waiters, want, heap, requeue, handles, closing, emptyCh, sentinels.
	mu         sync.Mutex
	owner      ownerID
	pastOwners []ownerID // earlier incarnations of this Consumer: their entries are recovered at once
	table      map[leaseKey]*lease
	ready      []*lease // recorded leases waiting for a Fetch, FIFO
	waiters    []*waiter
	want       int // sum of waiters' max
	heap       leaseHeap
	requeue    []*lease // leases whose copy the settler must enqueue
	handles    map[*Handle]struct{}
	closing    bool
	// unsure: lease records of this owner may exist for leases not (yet) in the table (a
	// batch between storing its records and committing). A table drop must then change the
	// owner, so those records are recovered rather than taken for settled leases.
	unsure  bool
	emptyCh chan struct{} // closed when the table becomes empty (Manager linger)
	// sentinels: this Consumer's sentinels on their way, by id (sentinel.go).
	sentinels map[string]ownSentinel
	// nextPos numbers leases in the order the queue gave them (lease.pos).
	nextPos uint64
	// checks numbers the poll loop's looks at the queue (a QueuesInfo or a Get), so that a
	// TryFetch is answered empty only by a look that began after it (ready.go).
	checks uint64
	// records: this Consumer's delayed messages (lease records, sentinels) stored and not yet
	// read back, by MessageID: when they are due (ready.go).
	records map[string]time.Time
	bg      sync.WaitGroup // sentinel stores
	settled chan struct{}  // closed (and dropped) each time the settler finishes a pass
	idle    chan struct{}  // closed (and dropped) when the poll loop waits for demand (tests)

	pollWake   chan struct{} // cap 1: demand appeared
	settleWake chan struct{} // cap 1: requeue work or an earlier deadline
	// staleStream: the backend went down since the poll loop's stream was opened; the loop
	// replaces the stream before its next Get.
	staleStream atomic.Bool
	// unsettled is the hook set by Handle.OnUnsettled (nil = none).
	unsettled atomic.Pointer[UnsettledFunc]
	// moving counts transfers in progress between KubeMQ and the lease table (a batch acked
	// and not yet buffered, redelivery copies being stored), moved those completed: Ready
	// takes its two counts while neither changes (ready.go).
	moving atomic.Int32
	moved  atomic.Uint64

	pollCtx, settleCtx       context.Context
	pollCancel, settleCancel context.CancelFunc
	pollDone, settleDone     chan struct{}
	closeOnce                sync.Once
	closeErr                 error
	closed                   chan struct{}
}

// NewConsumer starts a Consumer for queue. The poll loop runs only while a Fetch waits.
func NewConsumer(b Backend, queue string, opts Options) (*Consumer, error) {
	return newConsumer(b, queue, opts, nil)
}

// identity is what a closed Consumer leaves to the next Consumer of its queue in this process:
// its owner id when it closed clean (every lease settled, so its returning records are all
// obsolete and must be dropped, not redelivered), and the ids of incarnations whose leases were
// abandoned (their records are recovered at once).
type identity struct {
	owner   ownerID
	clean   bool
	past    []ownerID
	records map[string]time.Time // delayed messages stored and not read back (Consumer.records)
}

func newConsumer(b Backend, queue string, opts Options, prev *identity) (*Consumer, error) {
	if b == nil {
		return nil, errors.New("delivery: nil backend")
	}
	if queue == "" {
		return nil, errors.New("delivery: empty queue name")
	}
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	c := &Consumer{
		queue:      queue,
		b:          b,
		opts:       opts,
		exclusive:  opts.Owners != nil,
		closeCause: ErrClosed,
		log:        opts.Logger.Named("delivery").With(zap.String("queue", queue)),
		ids:        newIDGen(),
		owner:      newOwner(),
		table:      map[leaseKey]*lease{},
		handles:    map[*Handle]struct{}{},
		pollWake:   make(chan struct{}, 1),
		settleWake: make(chan struct{}, 1),
		pollDone:   make(chan struct{}),
		settleDone: make(chan struct{}),
		closed:     make(chan struct{}),
	}
	if prev != nil {
		c.pastOwners = append(c.pastOwners, prev.past...)
		// With Settlements a clean close was recorded there (Retire): the next Consumer takes
		// a fresh id, whose records can never be mistaken for the retired one's.
		if prev.clean && opts.Settlements == nil {
			c.owner = prev.owner
		} else {
			c.pastOwners = append(c.pastOwners, prev.owner)
		}
		if n := len(c.pastOwners); n > maxPastOwners {
			c.pastOwners = c.pastOwners[n-maxPastOwners:]
		}
		c.records = prev.records
	}
	c.pollCtx, c.pollCancel = context.WithCancel(context.Background())
	c.settleCtx, c.settleCancel = context.WithCancel(context.Background())
	go c.pollLoop()
	go c.settleLoop()
	return c, nil
}

// Queue returns the KubeMQ queue name.
func (c *Consumer) Queue() string { return c.queue }

// Fetch returns 1..max leased messages as soon as at least one is available, or ctx's error.
// Waiting Fetch calls are served in FIFO order. It fails with ErrClosed after Close, and with
// the backend's error (wrapped in ErrLeasesLost when leases were dropped) when KubeMQ fails.
func (c *Consumer) Fetch(ctx context.Context, max int) ([]*Delivery, error) {
	return c.fetch(ctx, max, nil, c.opts.Deadline, 0, 0, false)
}

func (c *Consumer) fetch(ctx context.Context, max int, h *Handle, deadline, hold time.Duration, readAhead int, try bool) ([]*Delivery, error) {
	if max <= 0 {
		return nil, fmt.Errorf("delivery: Fetch max %d must be positive", max)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.closing {
		cause := c.closeCause
		c.mu.Unlock()
		return nil, cause
	}
	if h != nil && h.closed {
		c.mu.Unlock()
		return nil, ErrClosed
	}
	w := &waiter{max: max, holder: h, deadline: deadline, hold: hold, readAhead: readAhead, try: try, reg: c.checks,
		done: make(chan struct{})}
	c.waiters = append(c.waiters, w)
	c.want += max
	c.serveLocked(time.Now())
	poll := !w.finished
	c.mu.Unlock()
	if poll {
		wake(c.pollWake)
	}
	select {
	case <-w.done:
		return w.got, w.err
	case <-ctx.Done():
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !w.finished {
		c.removeWaiterLocked(w)
		return nil, ctx.Err()
	}
	if w.err != nil {
		return nil, w.err
	}
	// Served while ctx ended: give the deliveries back so the next Fetch gets them.
	c.unhandLocked(w.got)
	c.serveLocked(time.Now())
	return nil, ctx.Err()
}

func (c *Consumer) removeWaiterLocked(w *waiter) {
	for i, x := range c.waiters {
		if x == w {
			c.waiters = append(c.waiters[:i], c.waiters[i+1:]...)
			c.want -= w.max
			return
		}
	}
}

// demandLocked is how many more messages the waiters want than the ready buffer holds.
func (c *Consumer) demandLocked() int { return c.want - len(c.ready) }

// serveLocked hands ready leases to waiters, first come first served.
func (c *Consumer) serveLocked(now time.Time) {
	for len(c.waiters) > 0 && len(c.ready) > 0 {
		w := c.waiters[0]
		k := min(w.max, len(c.ready))
		ds := make([]*Delivery, k)
		for i := range k {
			ds[i] = c.handOutLocked(c.ready[i], w, now)
			c.ready[i] = nil
		}
		c.ready = c.ready[k:]
		if len(c.ready) == 0 {
			c.ready = nil
		}
		c.finishWaiterLocked(w, ds, nil)
	}
}

func (c *Consumer) finishWaiterLocked(w *waiter, ds []*Delivery, err error) {
	c.waiters[0] = nil
	c.waiters = c.waiters[1:]
	c.want -= w.max
	w.got, w.err, w.finished = ds, err, true
	close(w.done)
}

// foundEmptyLocked answers empty every TryFetch registered before look chk began: the poll
// loop found the queue empty (nothing buffered, nothing in KubeMQ) at a look that began after
// them.
func (c *Consumer) foundEmptyLocked(chk uint64) {
	keep := c.waiters[:0]
	for _, w := range c.waiters {
		if !w.try || w.reg >= chk {
			keep = append(keep, w)
			continue
		}
		c.want -= w.max
		w.got, w.err, w.finished = nil, nil, true
		close(w.done)
	}
	clear(c.waiters[len(keep):])
	c.waiters = keep
}

// failWaiters ends every waiting Fetch with err.
func (c *Consumer) failWaitersLocked(err error) {
	for len(c.waiters) > 0 {
		c.finishWaiterLocked(c.waiters[0], nil, err)
	}
	c.waiters = nil
}

func (c *Consumer) handOutLocked(l *lease, w *waiter, now time.Time) *Delivery {
	l.state = stateOut
	l.fresh = false
	l.holder = w.holder
	if w.holder != nil {
		w.holder.leases[l.key] = l
	}
	var dl time.Time
	if w.deadline > 0 {
		dl = now.Add(w.deadline)
		if c.heap.setDeadline(l, dl) {
			wake(c.settleWake)
		}
	} else if w.hold > 0 {
		l.promise = now.Add(w.hold)
	}
	l.d = &Delivery{
		LeaseID:     l.key.String(),
		Generation:  l.gen,
		Attempt:     int(l.attempt),
		Deadline:    dl,
		Redelivered: l.attempt > 1,
		MessageID:   l.msg.ID,
		Metadata:    l.msg.Metadata,
		Body:        l.msg.Body,
		Tags:        l.msg.Tags,
		Sequence:    l.seq,
		StoredAt:    storedAt(l.msg.Stored),
	}
	c.st.delivered.Add(1)
	return l.d
}

// Unfetch puts deliveries that never reached a client (fetched beyond a window, or the send to
// the client failed) back at the front of the ready buffer for the next Fetch: no copy is
// enqueued and the attempt does not count. Deliveries no longer out are skipped. It returns how
// many went back.
func (c *Consumer) Unfetch(ds ...*Delivery) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.unhandLocked(ds)
	c.serveLocked(time.Now())
	return n
}

// unhandLocked puts deliveries that never reached a client back at the front of the buffer.
func (c *Consumer) unhandLocked(ds []*Delivery) int {
	back := make([]*lease, 0, len(ds))
	for _, d := range ds {
		k, _ := parseLeaseID(d.LeaseID)
		l := c.table[k]
		if l == nil || l.d != d || l.state != stateOut {
			continue
		}
		c.heap.remove(l)
		l.deadline, l.promise = time.Time{}, time.Time{}
		c.unholdLocked(l)
		l.state, l.fresh, l.d = stateBuffered, true, nil
		back = append(back, l)
		c.st.delivered.Add(^uint64(0))
	}
	c.insertReadyLocked(back)
	return len(back)
}

// insertReadyLocked puts leases back into the ready buffer at their positions: the buffer
// stays in the order the queue gave the messages, so a message given back is delivered before
// every later one, as if it had never left the queue.
func (c *Consumer) insertReadyLocked(ls []*lease) {
	if len(ls) == 0 {
		return
	}
	slices.SortFunc(ls, func(a, b *lease) int { return cmp.Compare(a.pos, b.pos) })
	if len(c.ready) == 0 || ls[len(ls)-1].pos < c.ready[0].pos {
		c.ready = append(ls, c.ready...) // the usual case: all of them before the buffer
		return
	}
	merged := make([]*lease, 0, len(c.ready)+len(ls))
	i, j := 0, 0
	for i < len(ls) && j < len(c.ready) {
		if ls[i].pos < c.ready[j].pos {
			merged = append(merged, ls[i])
			i++
		} else {
			merged = append(merged, c.ready[j])
			j++
		}
	}
	merged = append(merged, ls[i:]...)
	c.ready = append(merged, c.ready[j:]...)
}

func (c *Consumer) unholdLocked(l *lease) {
	if l.holder != nil {
		delete(l.holder.leases, l.key)
		l.holder = nil
	}
}

// removeLocked ends l.
func (c *Consumer) removeLocked(l *lease) {
	c.heap.remove(l)
	c.unholdLocked(l)
	delete(c.table, l.key)
	if len(c.table) == 0 && c.emptyCh != nil {
		close(c.emptyCh)
		c.emptyCh = nil
	}
}

// lookupLocked finds the lease behind a LeaseID; nil for unknown or malformed ids.
func (c *Consumer) lookupLocked(id string) *lease {
	k, ok := parseLeaseID(id)
	if !ok {
		return nil
	}
	return c.table[k]
}

// Ack settles deliveries. It reports, per id, whether the lease was live and is now acked;
// unknown, stale, nacked or malformed ids report false.
func (c *Consumer) Ack(ids ...string) []bool {
	ok := make([]bool, len(ids))
	var keys [][16]byte
	c.mu.Lock()
	for i, id := range ids {
		l := c.lookupLocked(id)
		if l == nil || l.state != stateOut {
			continue
		}
		c.removeLocked(l)
		ok[i] = true
		if c.opts.Settlements != nil {
			keys = append(keys, l.key)
		}
	}
	owner := c.owner
	c.mu.Unlock()
	c.st.acked.Add(uint64(countTrue(ok)))
	if len(keys) > 0 {
		c.opts.Settlements.Settle(c.queue, owner, keys...)
	}
	return ok
}

func countTrue(b []bool) int {
	n := 0
	for _, x := range b {
		if x {
			n++
		}
	}
	return n
}

// Nack gives a delivery back: with delay <= 0 a fresh copy (Attempt+1) is enqueued at once;
// with delay > 0 the lease is kept and the copy enqueued when the delay has passed (retry
// backoff; the lease record keeps it durable meanwhile). It reports false for an unknown,
// stale or already nacked id.
func (c *Consumer) Nack(id string, delay time.Duration) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.lookupLocked(id)
	if l == nil || l.state != stateOut {
		return false
	}
	if delay <= 0 {
		c.requeueLocked(l)
		return true
	}
	l.state = stateDelayed
	if c.heap.setDeadline(l, time.Now().Add(delay)) {
		wake(c.settleWake)
	}
	return true
}

// Extend moves a delivery's deadline (modifyAckDeadline). A zero deadline removes it; a deadline
// not after now is Nack(id, 0). It reports false for an unknown, stale or nacked id.
func (c *Consumer) Extend(id string, deadline time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.lookupLocked(id)
	if l == nil || l.state != stateOut {
		return false
	}
	if !deadline.IsZero() && !deadline.After(time.Now()) {
		c.requeueLocked(l)
		return true
	}
	if c.heap.setDeadline(l, deadline) {
		wake(c.settleWake)
	}
	return true
}

// Hold promises deliveries to their holder until until, without an engine deadline: lease
// records written from now on tell another owner (a replica, or this process after a crash)
// not to redeliver them before until (plus the record delay). The engine never expires a
// promise; a front-end that runs its own deadlines (Pub/Sub) calls Hold whenever one moves.
// It reports how many ids named live deliveries.
func (c *Consumer) Hold(until time.Time, ids ...string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, id := range ids {
		if l := c.lookupLocked(id); l != nil && l.state == stateOut {
			l.promise = until
			n++
		}
	}
	return n
}

// Release gives deliveries back at once (AMQP requeue on channel close or basic.recover),
// like Nack(id, 0). It reports, per id, whether the lease was live.
func (c *Consumer) Release(ids ...string) []bool {
	ok := make([]bool, len(ids))
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, id := range ids {
		l := c.lookupLocked(id)
		if l == nil || l.state != stateOut {
			continue
		}
		c.requeueLocked(l)
		ok[i] = true
	}
	return ok
}

// Requeue gives deliveries back in place (AMQP's requeue: nack, reject, recover, a closed
// channel): each lease returns to the ready buffer at its original position, so the next Fetch
// of the queue gets it before every message that came after it, and its next delivery is the
// next attempt (Redelivered). No copy is enqueued: the lease stays in the table and its lease
// record keeps it durable, as for a buffered lease. BeforeRedeliver is not consulted (a
// front-end that dead-letters uses Nack). It reports, per id, whether the lease was out.
func (c *Consumer) Requeue(ids ...string) []bool {
	ok := make([]bool, len(ids))
	c.mu.Lock()
	defer c.mu.Unlock()
	back := make([]*lease, 0, len(ids))
	for i, id := range ids {
		l := c.lookupLocked(id)
		if l == nil || l.state != stateOut {
			continue
		}
		c.heap.remove(l)
		l.deadline, l.promise = time.Time{}, time.Time{}
		c.unholdLocked(l)
		l.state, l.d = stateBuffered, nil
		l.attempt++
		l.fresh = true // attempt is now the one of its next delivery
		back = append(back, l)
		ok[i] = true
	}
	c.insertReadyLocked(back)
	c.st.requeued.Add(uint64(len(back)))
	c.serveLocked(time.Now())
	return ok
}

// Purge drops every lease of the ready buffer, and every redelivery copy not yet being stored,
// as if acked (AMQP's queue.purge: ready messages go, deliveries out stay). The front-end
// empties the KubeMQ queue after it; Purge forgets this Consumer's lease records that are due
// back, which that removes (so Ready does not keep discounting them). It returns how many
// leases it dropped.
func (c *Consumer) Purge() int {
	c.mu.Lock()
	n := 0
	var settled [][16]byte // their records are obsolete for the queue's next owner too
	for _, l := range c.ready {
		c.removeLocked(l)
		settled = append(settled, l.key)
		n++
	}
	c.ready = nil
	for _, l := range c.requeue {
		if c.table[l.key] == l {
			c.removeLocked(l)
			settled = append(settled, l.key)
			n++
		}
	}
	c.requeue = nil
	owner := c.owner
	defer func() {
		c.mu.Unlock()
		if st := c.opts.Settlements; st != nil && len(settled) > 0 {
			st.Settle(c.queue, owner, settled...)
		}
	}()
	now := time.Now()
	for id, due := range c.records {
		if !due.After(now) {
			delete(c.records, id)
		}
	}
	c.st.purged.Add(uint64(n))
	return n
}

// ReleaseAll gives back every delivery of every user of this Consumer, plus the ready buffer.
// Front-ends sharing a Consumer use Handle.ReleaseAll instead. It returns how many it released.
func (c *Consumer) ReleaseAll() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.releaseAllLocked(false)
}

// releaseAllLocked requeues every out and buffered lease, and the delayed ones too when
// withDelayed (Close: cutting a retry backoff short beats leaving it to a record).
func (c *Consumer) releaseAllLocked(withDelayed bool) int {
	n := 0
	for _, l := range c.table {
		if l.state == stateOut || (withDelayed && l.state == stateDelayed) {
			c.requeueLocked(l)
			n++
		}
	}
	for _, l := range c.ready {
		c.requeueLocked(l)
		n++
	}
	c.ready = nil
	return n
}

// requeueLocked hands l to the settler for a fresh copy.
func (c *Consumer) requeueLocked(l *lease) {
	c.heap.remove(l)
	l.deadline = time.Time{}
	l.state = stateRequeue
	c.requeue = append(c.requeue, l)
	wake(c.settleWake)
}

// Stats returns a snapshot of the Consumer's gauges and counters.
func (c *Consumer) Stats() Stats {
	c.mu.Lock()
	s := Stats{Queue: c.queue, Leases: len(c.table), Buffered: len(c.ready), Waiters: len(c.waiters)}
	for _, l := range c.table {
		if l.state == stateOut {
			s.Out++
		}
	}
	c.mu.Unlock()
	s.Gets = c.st.gets.Load()
	s.Received = c.st.received.Load()
	s.DuplicateSeqs = c.st.dupSeqs.Load()
	s.Delivered = c.st.delivered.Load()
	s.Acked = c.st.acked.Load()
	s.Redelivered = c.st.redelivered.Load()
	s.DroppedByHook = c.st.droppedByHook.Load()
	s.RecordsStored = c.st.recordsStored.Load()
	s.EntriesStored = c.st.entriesStored.Load()
	s.RecordsReturned = c.st.recordsReturned.Load()
	s.EntriesRearmed = c.st.rearmed.Load()
	s.EntriesObsolete = c.st.obsolete.Load()
	s.EntriesBounced = c.st.bounced.Load()
	s.EntriesRecovered = c.st.recovered.Load()
	s.RecordsCorrupt = c.st.corrupt.Load()
	s.StoreFailures = c.st.storeFailures.Load()
	s.LeasesLost = c.st.leasesLost.Load()
	s.TransientRefusals = c.st.transient.Load()
	s.RecordTimeouts = c.st.recordTimeouts.Load()
	s.Requeued = c.st.requeued.Load()
	s.Purged = c.st.purged.Load()
	s.Resets = c.st.resets.Load()
	s.SentinelsStored = c.st.sentinelsStored.Load()
	s.SentinelsReturned = c.st.sentinelsReturned.Load()
	s.SentinelsBounced = c.st.sentinelsBounced.Load()
	s.SentinelsDropped = c.st.sentinelsDropped.Load()
	return s
}

// Close stops the Consumer: waiting Fetch calls fail with ErrClosed, the poll loop finishes its
// current Get and closes its stream, every lease (out, buffered, or nacked with a delay) is
// given back as a fresh copy, and the settler stops once those copies are stored or ctx ends
// (lease records then bring the rest back). Idempotent. A Consumer obtained through a Manager
// is closed by the Manager (Handle.Close, Manager.Close), never directly.
func (c *Consumer) Close(ctx context.Context) error { return c.closeWith(ctx, ErrClosed) }

// closeWith is Close whose waiting Fetch calls get cause. With Settlements, a Consumer that
// closes with every lease settled records it (Retire), so the queue's next owner drops all of
// its records.
func (c *Consumer) closeWith(ctx context.Context, cause error) error {
	c.closeOnce.Do(func() {
		c.mu.Lock()
		c.closing = true
		c.closeCause = cause
		c.failWaitersLocked(cause)
		c.mu.Unlock()
		c.pollCancel()
		<-c.pollDone
		c.mu.Lock()
		c.releaseAllLocked(true)
		c.mu.Unlock()
		c.closeErr = c.drainRequeue(ctx)
		c.settleCancel()
		<-c.settleDone
		c.bg.Wait()
		c.mu.Lock()
		clean, owner := len(c.table) == 0 && !c.unsure, c.owner
		c.mu.Unlock()
		if st := c.opts.Settlements; st != nil && clean && c.closeErr == nil {
			if err := st.Retire(ctx, c.queue, owner); err != nil {
				c.log.Warn("closing clean not recorded; the next owner redelivers what this one settled lately", zap.Error(err))
			}
		}
		close(c.closed)
	})
	<-c.closed
	return c.closeErr
}

// drainRequeue waits until the settler has enqueued every pending copy, or ctx ends.
func (c *Consumer) drainRequeue(ctx context.Context) error {
	for {
		c.mu.Lock()
		pending := 0
		for _, l := range c.table {
			if l.state == stateRequeue {
				pending++
			}
		}
		if c.settled == nil {
			c.settled = make(chan struct{})
		}
		settled := c.settled
		c.mu.Unlock()
		if pending == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("delivery: close %s: %d redeliveries left to their lease records: %w", c.queue, pending, ctx.Err())
		case <-settled:
		}
	}
}

// resetLocked drops the whole lease table after a backend failure: the records bring every
// message back. The owner id changes, so records of the old table are recovered, not dropped;
// with nothing leased (and no batch in flight) it stays, so the records of settled leases
// still read as obsolete and an idle Consumer's outage causes no duplicates.
func (c *Consumer) resetLocked() int {
	n := len(c.table)
	if n == 0 && !c.unsure {
		return 0
	}
	c.unsure = false
	c.pastOwners = append(c.pastOwners, c.owner)
	if len(c.pastOwners) > maxPastOwners {
		c.pastOwners = c.pastOwners[1:]
	}
	c.owner = newOwner()
	for _, l := range c.table {
		l.hi = -1
	}
	c.table = map[leaseKey]*lease{}
	c.ready, c.heap, c.requeue = nil, nil, nil
	for h := range c.handles {
		clear(h.leases)
	}
	if c.emptyCh != nil {
		close(c.emptyCh)
		c.emptyCh = nil
	}
	c.st.resets.Add(1)
	c.st.leasesLost.Add(uint64(n))
	return n
}

// backendLost drops the lease table when the backend reports KubeMQ unreachable (the
// Manager's readiness hook), so that an idle Consumer does not keep leases its front-end can no
// longer honour; waiting Fetch calls fail with ErrLeasesLost. The poll loop replaces its stream
// before the next Get.
func (c *Consumer) backendLost() {
	c.staleStream.Store(true)
	c.mu.Lock()
	if c.closing {
		c.mu.Unlock()
		return
	}
	n := c.resetLocked()
	waiting := len(c.waiters)
	c.mu.Unlock()
	if n == 0 && waiting == 0 {
		return
	}
	lost := fmt.Errorf("%w: %w", ErrLeasesLost, ErrBackendDown)
	c.log.Warn("KubeMQ unreachable; lease table dropped, lease records will bring the messages back", zap.Int("leases", n))
	if c.opts.OnLeasesLost != nil {
		c.opts.OnLeasesLost(lost, n)
	}
	c.mu.Lock()
	c.failWaitersLocked(lost)
	c.mu.Unlock()
}

// maxPastOwners bounds the dead incarnations a Consumer remembers.
const maxPastOwners = 16

// identity returns what the next Consumer of this queue inherits; valid after Close.
func (c *Consumer) identity() *identity {
	c.mu.Lock()
	defer c.mu.Unlock()
	return &identity{owner: c.owner, clean: len(c.table) == 0, past: append([]ownerID(nil), c.pastOwners...),
		records: c.records}
}

// emptyChan returns a channel closed once the lease table is empty.
func (c *Consumer) emptyChan() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.table) == 0 {
		ch := make(chan struct{})
		close(ch)
		return ch
	}
	if c.emptyCh == nil {
		c.emptyCh = make(chan struct{})
	}
	return c.emptyCh
}

func wake(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

func newOwner() ownerID {
	var o ownerID
	_, _ = cryptorand.Read(o[:]) // never fails on supported platforms (Go 1.24+)
	return o
}

// idGen mints MessageIDs unique across processes: a random prefix per Consumer and a counter
// (the delay machinery is keyed by MessageID server-wide, docs/kubemq.md 9.1).
type idGen struct {
	prefix string
	n      *atomic.Uint64
}

func newIDGen() idGen {
	var b [8]byte
	_, _ = cryptorand.Read(b[:])
	return idGen{prefix: "kmqp-" + hex.EncodeToString(b[:]) + "-", n: new(atomic.Uint64)}
}

func (g idGen) next() string {
	var buf [48]byte
	b := append(buf[:0], g.prefix...)
	return string(strconv.AppendUint(b, g.n.Add(1), 36))
}
