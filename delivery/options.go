package delivery

import (
	"fmt"
	"time"

	"go.uber.org/zap"
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
	// MetricsQueueLabels (Manager only) is how many distinct queues get their own queue label
	// in the per-queue series (kubemq_proxy_delivery_queue_*), first come first labelled;
	// later queues share the label "_other". Default 100; negative: every queue is "_other".
	MetricsQueueLabels int
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
	if o.MetricsQueueLabels == 0 {
		o.MetricsQueueLabels = 100
	}
	if o.Linger <= 0 {
		o.Linger = 10 * time.Minute
	}
	return nil
}
