package delivery

import "context"

// waitIdle returns once the poll loop waits for demand, so no Get is outstanding.
func (c *Consumer) waitIdle(ctx context.Context) error {
	c.mu.Lock()
	ch := make(chan struct{})
	c.idle = ch
	c.mu.Unlock()
	wake(c.pollWake)
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
