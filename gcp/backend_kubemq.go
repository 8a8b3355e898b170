package gcp

import (
	"context"
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
	_, ok := info.Queue(queue)
	return ok, nil
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
	if q, ok := info.Queue(queue); !ok || q.Waiting <= 0 {
		return nil
	}
	_, err = b.c.AckAllQueueMessages(ctx, queue, purgeWait)
	return err
}
