package amqp091

import (
	"context"
	"time"

	"github.com/kubemq-io/kubemq-proxy/delivery"
	"github.com/kubemq-io/kubemq-proxy/kubemqclient"
)

// engineBackend adapts the KubeMQ client to the lease engine's Backend, for
// a Server built without Options.Deliveries.
type engineBackend struct{ c *kubemqclient.Client }

func (b engineBackend) Waiting(ctx context.Context, queue string) (int64, error) {
	info, err := b.c.QueuesInfo(ctx, queue)
	if err != nil {
		return 0, err
	}
	q, _ := info.Queue(queue)
	return q.Waiting, nil
}

func (b engineBackend) Send(ctx context.Context, queue string, msgs []delivery.Message) ([]error, error) {
	qm := make([]kubemqclient.QueueMessage, len(msgs))
	for i, m := range msgs {
		qm[i] = kubemqclient.QueueMessage{MessageID: m.ID, Channel: queue, Metadata: m.Metadata, Body: m.Body, Tags: m.Tags,
			Policy: kubemqclient.QueuePolicy{Delay: time.Duration(m.DelaySeconds) * time.Second}}
	}
	rs, err := b.c.SendQueueMessages(ctx, qm)
	if err != nil {
		return nil, err
	}
	out := make([]error, len(rs))
	for i, r := range rs {
		out[i] = r.Err
	}
	return out, nil
}

func (b engineBackend) OpenDownstream(ctx context.Context) (delivery.Downstream, error) {
	d, err := b.c.OpenDownstream(ctx)
	if err != nil {
		return nil, err
	}
	return engineDownstream{d}, nil
}

func (b engineBackend) Retryable(err error) bool { return kubemqclient.IsRetryable(err) }

type engineDownstream struct{ d *kubemqclient.Downstream }

func (d engineDownstream) Get(ctx context.Context, queue string, maxItems int, wait time.Duration) (string, []delivery.Message, error) {
	tx, err := d.d.Get(ctx, kubemqclient.GetRequest{Channel: queue, MaxItems: maxItems, Wait: wait})
	if err != nil {
		return "", nil, err
	}
	msgs := make([]delivery.Message, len(tx.Messages))
	for i, m := range tx.Messages {
		msgs[i] = delivery.Message{ID: m.MessageID, Metadata: m.Metadata, Body: m.Body, Tags: m.Tags, Sequence: m.Attributes.Sequence}
	}
	return tx.ID, msgs, nil
}

func (d engineDownstream) AckAll(ctx context.Context, tx string) error { return d.d.AckAll(tx) }
func (d engineDownstream) CloseByClient(ctx context.Context, tx string) error {
	return d.d.CloseByClient(tx)
}
func (d engineDownstream) Sync(ctx context.Context, tx string) error { return d.d.Sync(ctx, tx) }
func (d engineDownstream) Close() error                              { return d.d.Close() }
