package delivery

import (
	"context"
	"time"

	"github.com/kubemq-io/kubemq-proxy/kubemqclient"
)

// NewKubeMQBackend adapts a KubeMQ client to Backend.
func NewKubeMQBackend(c *kubemqclient.Client) Backend { return kubemqBackend{c} }

type kubemqBackend struct{ c *kubemqclient.Client }

func (k kubemqBackend) Waiting(ctx context.Context, queue string) (int64, error) {
	info, err := k.c.QueuesInfo(ctx, queue)
	if err != nil {
		return 0, err
	}
	qi, l := info.Lookup(queue) // a queue nobody sent to yet is not listed: 0 waiting
	if l == kubemqclient.Ambiguous {
		return -1, nil
	}
	return qi.Waiting, nil
}

func (k kubemqBackend) Send(ctx context.Context, queue string, msgs []Message) ([]error, error) {
	qm := make([]kubemqclient.QueueMessage, len(msgs))
	for i, m := range msgs {
		qm[i] = kubemqclient.QueueMessage{
			MessageID: m.ID, Channel: queue, Metadata: m.Metadata, Body: m.Body, Tags: m.Tags,
			Policy: kubemqclient.QueuePolicy{Delay: time.Duration(m.DelaySeconds) * time.Second},
		}
	}
	res, err := k.c.SendQueueMessages(ctx, qm)
	if err != nil {
		return nil, err
	}
	out := make([]error, len(res))
	for i, r := range res {
		out[i] = r.Err
	}
	return out, nil
}

func (k kubemqBackend) OpenDownstream(ctx context.Context) (Downstream, error) {
	d, err := k.c.OpenDownstream(ctx)
	if err != nil {
		return nil, err
	}
	return kubemqDownstream{d}, nil
}

func (k kubemqBackend) Retryable(err error) bool { return kubemqclient.IsRetryable(err) }

// OnStateChange passes on the client's readiness (its health pings), making kubemqBackend a
// StateNotifier.
func (k kubemqBackend) OnStateChange(fn func(up bool)) func() { return k.c.OnStateChange(fn) }

type kubemqDownstream struct{ d *kubemqclient.Downstream }

func (k kubemqDownstream) Get(ctx context.Context, queue string, maxItems int, wait time.Duration) (string, []Message, error) {
	tx, err := k.d.Get(ctx, kubemqclient.GetRequest{Channel: queue, MaxItems: maxItems, Wait: wait})
	if err != nil {
		return "", nil, err
	}
	msgs := make([]Message, len(tx.Messages))
	for i := range tx.Messages {
		m := &tx.Messages[i]
		msgs[i] = Message{ID: m.MessageID, Metadata: m.Metadata, Body: m.Body, Tags: m.Tags, Sequence: m.Attributes.Sequence, Stored: unixNano(m.Attributes.Timestamp)}
	}
	return tx.ID, msgs, nil
}

func (k kubemqDownstream) AckAll(_ context.Context, tx string) error { return k.d.AckAll(tx) }
func (k kubemqDownstream) CloseByClient(_ context.Context, tx string) error {
	return k.d.CloseByClient(tx)
}
func (k kubemqDownstream) Sync(ctx context.Context, tx string) error { return k.d.Sync(ctx, tx) }
func (k kubemqDownstream) Close() error                              { return k.d.Close() }
func (k kubemqDownstream) Err() error                                { return k.d.Err() }

// unixNano is t in Unix ns, 0 for the zero time.
func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}
