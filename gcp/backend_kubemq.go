package gcp

import (
	"context"
	"fmt"
	"time"

	"github.com/kubemq-io/kubemq-proxy/kubemqclient"
)

// kubemqBackend is backend over the real client.
type kubemqBackend struct{ c *kubemqclient.Client }

func (b kubemqBackend) appendLog(ctx context.Context, events []kubemqclient.Event) error {
	rs, err := b.c.PublishEvents(ctx, events)
	if err != nil {
		return err
	}
	return kubemqclient.FirstError(rs)
}

func (b kubemqBackend) enqueue(ctx context.Context, msgs []kubemqclient.QueueMessage) error {
	if len(msgs) == 0 {
		return nil
	}
	return sendBatches(ctx, msgs, func(ctx context.Context, batch []kubemqclient.QueueMessage) error {
		rs, err := b.c.SendQueueMessages(ctx, batch)
		if err != nil {
			return err
		}
		return kubemqclient.FirstError(rs)
	})
}

func (b kubemqBackend) queueKnown(ctx context.Context, queue string) (bool, error) {
	info, err := b.c.QueuesInfo(ctx, queue)
	if err != nil {
		return false, err
	}
	// A listing shared with another queue (kubemqclient.Ambiguous) may be this one's.
	_, l := info.Lookup(queue)
	return l != kubemqclient.NotListed, nil
}

// purgeWait is AckAll's wait; the server raises it to 1 s anyway.
const purgeWait = time.Second

// purge empties queue. AckAll always waits its full second, so it runs
// only when QueuesInfo shows something waiting: most creates and deletes
// find no queue at all.
func (b kubemqBackend) purge(ctx context.Context, queue string) error {
	info, err := b.c.QueuesInfo(ctx, queue)
	if err != nil {
		return err
	}
	// A queue KubeMQ cannot count (kubemqclient.Ambiguous) is purged anyway.
	if q, l := info.Lookup(queue); l == kubemqclient.NotListed || (l == kubemqclient.Listed && q.Waiting <= 0) {
		return nil
	}
	_, err = b.c.AckAllQueueMessages(ctx, queue, purgeWait)
	return err
}

// Topic log reading (Seek's replay).
const (
	// logStartSlack starts a replay this much before its time: the server
	// turns StartAtTime into a delta from its own clock, and stores an
	// event a little after the proxy stamped its publish time.
	logStartSlack = 5 * time.Second
	// logProbeWait is how long the last event of a log may take to arrive
	// before the log counts as empty.
	logProbeWait = 2 * time.Second
	// logStall is how long a replay waits for its next event.
	logStall = 10 * time.Second
	// logBatch is how many events fn gets at a time.
	logBatch = 500
)

func (b kubemqBackend) readLog(ctx context.Context, channel string, from time.Time, fn func([]kubemqclient.EventReceive) error) error {
	last, ok, err := b.lastEvent(ctx, channel)
	if err != nil || !ok {
		return err
	}
	startAt := from.Add(-logStartSlack)
	if pt, err := time.Parse(time.RFC3339Nano, last.Tags[TagPublishTime]); err == nil && pt.Before(from) || last.Timestamp.Before(startAt) {
		return nil // nothing is that recent (the server compares store times with startAt)
	}
	start := kubemqclient.StartPosition{Mode: kubemqclient.StartAtTime, Time: startAt}
	var next uint64 // the sequence expected next; 0 until the first event
	for {
		sub, err := b.c.SubscribeEventsStore(ctx, kubemqclient.SubscribeOptions{Channel: channel, Start: start})
		if err != nil {
			return err
		}
		done, err := readEvents(ctx, sub.Recv, &next, last.Sequence, fn)
		sub.Close()
		if err != nil || done {
			return err
		}
		// A gap: the server dropped events it could not push in time (a
		// slow reader, docs/kubemq.md 5.3). Read again from the first one
		// missing.
		start = kubemqclient.StartPosition{Mode: kubemqclient.StartAtSequence, Sequence: next}
	}
}

// lastEvent is the last event a log holds; ok is false for an empty log.
func (b kubemqBackend) lastEvent(ctx context.Context, channel string) (ev kubemqclient.EventReceive, ok bool, err error) {
	sub, err := b.c.SubscribeEventsStore(ctx, kubemqclient.SubscribeOptions{Channel: channel,
		Start: kubemqclient.StartPosition{Mode: kubemqclient.StartFromLast}})
	if err != nil {
		return ev, false, err
	}
	defer sub.Close()
	pctx, cancel := context.WithTimeout(ctx, logProbeWait)
	defer cancel()
	ev, err = sub.Recv(pctx)
	switch {
	case err == nil:
		return ev, true, nil
	case ctx.Err() == nil && pctx.Err() != nil:
		return ev, false, nil // nothing stored
	}
	return ev, false, err
}

// readEvents passes the events recv returns to fn in batches until the
// one numbered last; done is false when it found a gap (next is then the
// first missing).
func readEvents(ctx context.Context, recv func(context.Context) (kubemqclient.EventReceive, error), next *uint64, last uint64, fn func([]kubemqclient.EventReceive) error) (done bool, err error) {
	batch := make([]kubemqclient.EventReceive, 0, logBatch)
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		err := fn(batch)
		batch = batch[:0]
		return err
	}
	for {
		rctx, cancel := context.WithTimeout(ctx, logStall)
		ev, err := recv(rctx)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				err = fmt.Errorf("topic log: no event after sequence %d for %v (want up to %d): %w", *next, logStall, last, err)
			}
			return false, err
		}
		switch {
		case *next != 0 && ev.Sequence < *next:
			continue // already read
		case *next != 0 && ev.Sequence > *next:
			return false, flush()
		}
		batch = append(batch, ev)
		*next = ev.Sequence + 1
		if ev.Sequence >= last {
			return true, flush()
		}
		if len(batch) == logBatch {
			if err := flush(); err != nil {
				return false, err
			}
		}
	}
}
