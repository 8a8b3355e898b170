package delivery

import (
	"context"
	"time"
)

// Message is a KubeMQ queue message as this package sends and receives it.
type Message struct {
	ID       string            // KubeMQ MessageID; must be unique for every delayed message
	Metadata string            // KubeMQ Metadata
	Body     []byte            // KubeMQ Body
	Tags     map[string]string // KubeMQ Tags

	Sequence     uint64 // received: Attributes.Sequence of this stored copy (0 = unknown)
	Stored       int64  // received: when KubeMQ stored the original (Unix ns; 0 = unknown), kept across copies
	DelaySeconds int    // sent: Policy.DelaySeconds
}

// Backend is the part of the KubeMQ client the engine needs. *kubemqclient.Client satisfies it
// through NewKubeMQBackend. All methods are safe for concurrent use.
type Backend interface {
	// Waiting returns how many messages wait in queue (QueuesInfo's Waiting count), or -1 when
	// the server cannot tell (kubemqclient.Ambiguous).
	Waiting(ctx context.Context, queue string) (int64, error)
	// Send stores msgs in queue as one batch. A non-nil error means nothing is known to be
	// stored; otherwise results[i] is nil when msgs[i] is stored and its error if not.
	Send(ctx context.Context, queue string, msgs []Message) (results []error, err error)
	// OpenDownstream opens a QueuesDownstream stream.
	OpenDownstream(ctx context.Context) (Downstream, error)
	// Retryable reports whether a failed call may succeed later unchanged (connection lost,
	// server busy); false for deterministic failures such as an invalid argument.
	Retryable(err error) bool
}

// Settlements is a durable record of settled leases that every later owner of a queue reads
// (cluster.AckLog is one). With it a Consumer writes there the leases it settles (acked, or given
// back as a fresh copy, or dropped by BeforeRedeliver) and a marker when it closes with nothing
// leased, and drops the returning entries of other owners that it reports settled instead of
// redelivering them. Owner ids and lease keys are 16 random bytes each.
type Settlements interface {
	// Settle records that owner's leases keys are settled; it must not block.
	Settle(queue string, owner [16]byte, keys ...[16]byte)
	// Retire records that owner closed with every lease settled.
	Retire(ctx context.Context, queue string, owner [16]byte) error
	// Settled reports whether owner's lease key is known settled; it must not block.
	Settled(owner, key [16]byte) bool
	// Sync returns once every settlement written before it is readable through Settled.
	Sync(ctx context.Context) error
}

// TakenLog is an optional interface of Settlements (cluster.AckLog has it). With it a Consumer
// writes there the sequence ranges of the queue's copies it takes and acknowledges, and a new
// Consumer reads them before its first Get and drops copies of them that KubeMQ hands out
// again (taken.go): after a handover, the real KubeMQ's next Get, now the new owner's, can
// receive messages the last owner acknowledged.
type TakenLog interface {
	// NoteTaken records that owner took queue's copies lo..hi and acknowledged them; it must
	// not block.
	NoteTaken(queue string, owner [16]byte, lo, hi uint64)
	// TakenOf reports the ranges of queue noted taken, as read at or after since.
	TakenOf(queue string, since time.Time) [][2]uint64
}

// Owners decides which process consumes each queue when several share one KubeMQ
// (cluster.Cluster does, through an adapter). A Manager with Owners claims a queue before it
// starts its Consumer, gives the Consumer up when the holding is lost, and releases the holding
// when the Consumer closes.
type Owners interface {
	// Claim makes this process the only consumer of queue until the holding is lost or
	// released. When another process consumes the queue, the error wraps ErrNotOwner.
	Claim(ctx context.Context, queue string) (Owned, error)
}

// Owned is one holding of Owners.
type Owned interface {
	// Lost is closed when the queue must no longer be consumed here.
	Lost() <-chan struct{}
	// Release gives the queue up once nothing consumes it here any more.
	Release(ctx context.Context) error
}

// HeldElsewhere is an optional interface of Owned (cluster.Ownership has it).
type HeldElsewhere interface {
	// HeldElsewhereSince reports whether another process held the queue after t (a local time
	// since this process started). It may say so needlessly; it never misses a holding.
	HeldElsewhereSince(t time.Time) bool
}

// StateNotifier is an optional Backend interface. A Backend that can tell when KubeMQ becomes
// unreachable lets the Manager drop every Consumer's leases at once, idle Consumers included (an
// idle Consumer's poll loop would otherwise notice the outage only at its next Get, after the
// front-end has already answered its clients UNAVAILABLE).
type StateNotifier interface {
	// OnStateChange registers fn for every readiness change. fn must return quickly and must
	// not call back into the backend. remove unregisters it.
	OnStateChange(fn func(up bool)) (remove func())
}

// Downstream is one QueuesDownstream stream. The engine uses it from one goroutine at a time,
// with at most one open transaction, and closes it only when no Get is outstanding
// (docs/kubemq.md 8.7). Any error means the stream is no longer usable.
type Downstream interface {
	// Get opens a transaction holding up to maxItems messages of queue. It returns when it
	// holds maxItems messages or wait has passed (the server raises wait to 1 s).
	Get(ctx context.Context, queue string, maxItems int, wait time.Duration) (tx string, msgs []Message, err error)
	// AckAll settles every message of tx.
	AckAll(ctx context.Context, tx string) error
	// CloseByClient gives the unsettled messages of tx back to the queue.
	CloseByClient(ctx context.Context, tx string) error
	// Sync returns when every request sent on the stream before it has been processed.
	Sync(ctx context.Context, tx string) error
	// Close ends the stream.
	Close() error
	// Err is nil while the stream is usable: after a failed call, a non-nil Err means the
	// stream is broken; nil means the server refused the request and the stream goes on.
	Err() error
}
