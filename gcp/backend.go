package gcp

import (
	"context"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/kubemq-io/kubemq-proxy/kubemqclient"
)

// backend is what the publish path needs from KubeMQ. Each call returns
// only when every item is stored (or the events-store server accepted it),
// and fails as a whole when any item failed.
type backend interface {
	// appendLog writes events to topic logs (events store, streamed).
	appendLog(ctx context.Context, events []kubemqclient.Event) error
	// enqueue stores queue messages (batched).
	enqueue(ctx context.Context, msgs []kubemqclient.QueueMessage) error
	// purge drops everything waiting in a queue.
	purge(ctx context.Context, queue string) error
	// queueKnown reports whether KubeMQ lists the queue (it has ever been
	// sent to or read from).
	queueKnown(ctx context.Context, queue string) (bool, error)
	// readLog calls fn, in batches and in sequence order, with the events
	// of a topic log from about from (a little earlier: callers filter by
	// publish time) up to the last event stored when it starts; not at all
	// when none is that recent.
	readLog(ctx context.Context, channel string, from time.Time, fn func([]kubemqclient.EventReceive) error) error
	// lastLogEvent is the last event of an events-store channel; ok is
	// false when it holds none.
	lastLogEvent(ctx context.Context, channel string) (ev kubemqclient.EventReceive, ok bool, err error)
	// readAll calls fn with the first n events of an events-store channel,
	// in batches and in order (fewer if fewer are retained).
	readAll(ctx context.Context, channel string, n uint64, fn func([]kubemqclient.EventReceive) error) error
	// move takes every message waiting in queue from and stores it, in
	// order, in queue to, calling visit (may be nil) with each on the way
	// (one it does not keep is taken from from and dropped); it reports how
	// many it moved. Nobody else may read from meanwhile. acked (may be nil)
	// is given the sequences of each batch once it is acknowledged in from.
	move(ctx context.Context, from, to string, visit func(*kubemqclient.QueueMessage) (keep bool, err error), acked func(seqs []uint64)) (int, error)
}

// Batch bounds for one SendQueueMessages call: KubeMQ takes at most 100
// MiB per gRPC message; a publish fanned out to many subscriptions is cut
// into batches and sent a few at a time.
const (
	maxBatchMessages = 1000
	maxBatchBytes    = 4 << 20
	batchParallelism = 4
)

// queueBatches cuts msgs into batches within the bounds above.
func queueBatches(msgs []kubemqclient.QueueMessage) [][]kubemqclient.QueueMessage {
	var out [][]kubemqclient.QueueMessage
	start, size := 0, 0
	for i, m := range msgs {
		n := len(m.Body) + len(m.Metadata) + len(m.Channel) + len(m.MessageID)
		for k, v := range m.Tags {
			n += len(k) + len(v)
		}
		if i > start && (i-start >= maxBatchMessages || size+n > maxBatchBytes) {
			out = append(out, msgs[start:i])
			start, size = i, 0
		}
		size += n
	}
	if start < len(msgs) {
		out = append(out, msgs[start:])
	}
	return out
}

// sendBatches sends the batches with bounded parallelism; the first
// failure is the result.
func sendBatches(ctx context.Context, msgs []kubemqclient.QueueMessage, send func(context.Context, []kubemqclient.QueueMessage) error) error {
	batches := queueBatches(msgs)
	if len(batches) == 1 {
		return send(ctx, batches[0])
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(batchParallelism)
	for _, b := range batches {
		g.Go(func() error { return send(gctx, b) })
	}
	return g.Wait()
}
