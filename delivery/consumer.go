package delivery

import (
	"context"
	cryptorand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
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
	// OldestOut is the earliest time KubeMQ stored a message handed out and not yet settled
	// (zero when none is out or none has a known store time): the oldest unacked message's age
	// is the time since.
	OldestOut time.Time `json:",omitzero"`

	Gets             uint64 // downstream Gets
	Received         uint64 // data messages received (after deduplication)
	DuplicateSeqs    uint64 // repeated sequences dropped from Get responses
	Retaken          uint64 // copies of messages already taken and acked, got again and dropped (taken.go)
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
	gets, received, dupSeqs, retaken, delivered, acked, redelivered, droppedByHook,
	recordsStored, entriesStored, recordsReturned, rearmed, obsolete, bounced, recovered,
	corrupt, storeFailures, leasesLost, resets, transient, recordTimeouts, requeued, purged,
	sentinelsStored, sentinelsReturned, sentinelsBounced, sentinelsDropped atomic.Uint64
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
	// highSeq is the highest KubeMQ sequence of a data message a Get brought (poll loop only):
	// one below it is out of send order (prepare logs it).
	highSeq uint64
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

	pollWake chan struct{} // cap 1: demand appeared (or a pause)
	// pauseSem (cap 1) is held by the caller of Pause from the request to resume; pauseReq is
	// its request (pause.go), guarded by mu.
	pauseSem chan struct{}
	pauseReq *pauseReq
	// taken: the sequences acknowledged lately (taken.go), in time order.
	taken      []takenRange
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
		pauseSem:   make(chan struct{}, 1),
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

// Stats returns a snapshot of the Consumer's gauges and counters.
func (c *Consumer) Stats() Stats {
	c.mu.Lock()
	s := Stats{Queue: c.queue, Leases: len(c.table), Buffered: len(c.ready), Waiters: len(c.waiters)}
	for _, l := range c.table {
		if l.state == stateOut {
			s.Out++
			if st := storedAt(l.msg.Stored); !st.IsZero() && (s.OldestOut.IsZero() || st.Before(s.OldestOut)) {
				s.OldestOut = st
			}
		}
	}
	c.mu.Unlock()
	s.Gets = c.st.gets.Load()
	s.Received = c.st.received.Load()
	s.DuplicateSeqs = c.st.dupSeqs.Load()
	s.Retaken = c.st.retaken.Load()
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
