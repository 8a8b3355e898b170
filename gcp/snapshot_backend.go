package gcp

import (
	"context"
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
// (the queue's lease engine must not be running: docs/kubemq.md 8.8),
// stores each batch in to (in order, one batch after the other) and only
// then acknowledges it, so a failure or a crash leaves every message in
// one of the two queues.
func (b kubemqBackend) move(ctx context.Context, from, to string, visit func(*kubemqclient.QueueMessage) error) (int, error) {
	info, err := b.c.QueuesInfo(ctx, from)
	if err != nil {
		return 0, err
	}
	if q, l := info.Lookup(from); l == kubemqclient.NotListed || (l == kubemqclient.Listed && q.Waiting <= 0) {
		return 0, nil
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
	for {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		tx, err := d.Get(gctx, kubemqclient.GetRequest{Channel: from, MaxItems: moveBatch, Wait: time.Second})
		if err != nil {
			return n, err
		}
		if len(tx.Messages) == 0 {
			return n, nil
		}
		out := make([]kubemqclient.QueueMessage, len(tx.Messages))
		for i := range tx.Messages {
			m := &tx.Messages[i]
			if visit != nil {
				if err := visit(m); err != nil {
					_ = d.CloseByClient(tx.ID)
					return n, err
				}
			}
			out[i] = kubemqclient.QueueMessage{MessageID: m.MessageID, Channel: to, Metadata: m.Metadata, Body: m.Body, Tags: m.Tags}
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
		n += len(out)
	}
}
