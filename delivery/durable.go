package delivery

import "context"

// SyncSettlements returns once every ack given to c before the call is durable in the
// settlement log (Options.Settlements), so the queue's next owner drops the acked leases'
// records even after a crash. Without a settlement log it returns at once: an ack is then
// durable only once its lease record has come back and been dropped.
func (c *Consumer) SyncSettlements(ctx context.Context) error {
	if c.opts.Settlements == nil {
		return nil
	}
	return c.opts.Settlements.Sync(ctx)
}
