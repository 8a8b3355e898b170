package gcp

import (
	"context"
	"maps"
	"slices"
	"time"

	"github.com/kubemq-io/kubemq-proxy/kubemqclient"
)

// The backend side of snapshots (snapshot.go).

// moveBatch is how many messages move takes per transaction.
const moveBatch = 1000

func (b kubemqBackend) lastLogEvent(ctx context.Context, channel string) (kubemqclient.EventReceive, bool, error) {
	return b.lastEvent(ctx, channel)
}

func (b kubemqBackend) readAll(ctx context.Context, channel string, n uint64, fn func([]kubemqclient.EventReceive) error) error {
	if n == 0 {
		return nil
	}
	if _, ok, err := b.lastEvent(ctx, channel); err != nil || !ok {
		return err // nothing retained
	}
	start := kubemqclient.StartPosition{Mode: kubemqclient.StartFromFirst}
	var next uint64
	for {
		sub, err := b.c.SubscribeEventsStore(ctx, kubemqclient.SubscribeOptions{Channel: channel, Start: start})
		if err != nil {
			return err
		}
		done, err := readEvents(ctx, sub.Recv, &next, n, fn)
		sub.Close()
		if err != nil || done {
			return err
		}
		start = kubemqclient.StartPosition{Mode: kubemqclient.StartAtSequence, Sequence: next}
	}
}

// move reads from with one transaction at a time on a stream of its own
// (the queue's lease engine must not be reading: docs/kubemq.md 8.8),
// stores each batch in to (in order, one batch after the other) and only
// then acknowledges it, so a failure or a crash leaves every message in
// one of the two queues. Each Get is sized from QueuesInfo's count, so it
// answers at once, and once the count is used up a barrier and a new
// count tell whether the queue is empty: the empty Get that would say so
// waits a full second (docs/kubemq.md 8.2, 9.4 rule 4).
//
// visit, when set, sees each message first: keep false acknowledges it without storing it
// in to; an error ends the move with the transaction given back. acked, when set, is given the
// sequences of each batch once the batch is acknowledged in from.
func (b kubemqBackend) move(ctx context.Context, from, to string, visit func(*kubemqclient.QueueMessage) (keep bool, err error), acked func(seqs []uint64)) (int, error) {
	known, err := b.waitingIn(ctx, from)
	if err != nil || known == 0 {
		return 0, err
	}
	d, err := b.c.OpenDownstream(ctx)
	if err != nil {
		return 0, err
	}
	defer d.Close()
	// A Get is never abandoned: closing the stream with one outstanding
	// can strand its messages (docs/kubemq.md 8.7); its wait is short.
	gctx := context.WithoutCancel(ctx)
	n := 0
	lastTx := ""
	// The sequences of the last batches taken, to tell a second copy of one of them.
	var recent [4]map[uint64]struct{}
	next := 0
	for {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		if known == 0 {
			// Counted out: once the last ack is processed, count again.
			if err := d.Sync(gctx, lastTx); err != nil {
				return n, err
			}
			if known, err = b.waitingIn(ctx, from); err != nil || known == 0 {
				return n, err
			}
		}
		size := moveBatch
		if known > 0 {
			size = int(min(known, moveBatch))
		}
		tx, err := d.Get(gctx, kubemqclient.GetRequest{Channel: from, MaxItems: size, Wait: time.Second})
		if err != nil {
			return n, err
		}
		if len(tx.Messages) == 0 {
			return n, nil
		}
		if known > 0 {
			known = max(known-int64(len(tx.Messages)), 0)
		}
		out := make([]kubemqclient.QueueMessage, 0, len(tx.Messages))
		batch := make(map[uint64]struct{}, len(tx.Messages))
		for i := range tx.Messages {
			m := &tx.Messages[i]
			if seq := m.Attributes.Sequence; seq != 0 {
				// Get drops repeats inside one answer; a copy moved by an earlier Get
				// came again because the server had not applied its acknowledgement
				// when this Get came (docs/kubemq.md 8.8, 10.4): acknowledged, not
				// stored again.
				if movedRecently(recent, seq) {
					continue
				}
				batch[seq] = struct{}{}
			}
			if visit != nil {
				keep, err := visit(m)
				if err != nil {
					_ = d.CloseByClient(tx.ID)
					return n, err
				}
				if !keep {
					continue
				}
			}
			out = append(out, kubemqclient.QueueMessage{MessageID: m.MessageID, Channel: to, Metadata: m.Metadata, Body: m.Body, Tags: m.Tags})
		}
		for _, batch := range queueBatches(out) {
			rs, err := b.c.SendQueueMessages(ctx, batch)
			if err == nil {
				err = kubemqclient.FirstError(rs)
			}
			if err != nil {
				// Whatever of this batch was stored in to may come
				// twice: at-least-once.
				_ = d.CloseByClient(tx.ID)
				return n, err
			}
		}
		if err := d.AckAll(tx.ID); err != nil {
			return n, err
		}
		if acked != nil && len(batch) > 0 {
			acked(slices.Collect(maps.Keys(batch)))
		}
		recent[next%len(recent)] = batch
		next++
		lastTx = tx.ID
		n += len(out)
	}
}

// waitingIn is QueuesInfo's count of queue: 0 when it is not listed, -1
// when the server cannot count it (kubemqclient.Ambiguous).
func (b kubemqBackend) waitingIn(ctx context.Context, queue string) (int64, error) {
	info, err := b.c.QueuesInfo(ctx, queue)
	if err != nil {
		return 0, err
	}
	switch q, l := info.Lookup(queue); l {
	case kubemqclient.NotListed:
		return 0, nil
	case kubemqclient.Listed:
		return max(q.Waiting, 0), nil
	}
	return -1, nil
}

// movedRecently reports whether seq is in one of the batch sets.
func movedRecently(recent [4]map[uint64]struct{}, seq uint64) bool {
	for _, b := range recent {
		if _, ok := b[seq]; ok {
			return true
		}
	}
	return false
}
