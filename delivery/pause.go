package delivery

import (
	"context"
	"fmt"
)

// Pausing a Consumer's reads.
//
// A caller that must read the queue itself (a Pub/Sub snapshot listing what the queue holds)
// cannot open a transaction next to the poll loop's (docs/kubemq.md 8.8). Pause stops the
// poll loop between two Gets, once every settlement it sent has been processed, so that no
// transaction of this Consumer is open on the queue; leases, deadlines, acks and redelivery
// copies go on as before, and Fetch calls are served from the ready buffer. Nothing is given
// back and no stream ends.

// pauseReq is one pending or granted pause. Guarded by Consumer.mu until granted is closed.
type pauseReq struct {
	granted chan struct{} // closed by the poll loop once it stands still
	resumed chan struct{} // closed by resume
	err     error         // set before granted is closed: the pause could not be served
}

// Pause stops the poll loop between Gets and returns when it stands still with no
// transaction open on the queue. resume lets it go on; it must be called (once) when err is
// nil. Pauses of one Consumer run one after the other.
func (c *Consumer) Pause(ctx context.Context) (resume func(), err error) {
	select {
	case c.pauseSem <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-c.pollDone:
		return nil, ErrClosed
	}
	p := &pauseReq{granted: make(chan struct{}), resumed: make(chan struct{})}
	c.mu.Lock()
	c.pauseReq = p
	c.mu.Unlock()
	wake(c.pollWake)
	done := func() {
		c.mu.Lock()
		if c.pauseReq == p {
			c.pauseReq = nil
		}
		c.mu.Unlock()
		close(p.resumed)
		<-c.pauseSem
		wake(c.pollWake)
	}
	select {
	case <-p.granted:
		if p.err != nil {
			done()
			return nil, p.err
		}
		return done, nil
	case <-ctx.Done():
		done()
		return nil, ctx.Err()
	case <-c.pollDone:
		done()
		return nil, ErrClosed
	}
}

// pausePending reports whether a pause waits for the poll loop.
func (c *Consumer) pausePending() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pauseReq != nil && !c.pauseReq.grantedLocked()
}

func (p *pauseReq) grantedLocked() bool {
	select {
	case <-p.granted:
		return true
	default:
		return false
	}
}

// servePause, run by the poll loop between Gets, stands still for a pending pause until it is
// resumed. The settlements sent on ds since its last barrier are made processed first. It
// returns false when the Consumer closes meanwhile; broken reports that ds failed (the caller
// treats it as any broken stream, after the pause).
func (c *Consumer) servePause(ds Downstream, st *pollState) (ok bool, broken error) {
	c.mu.Lock()
	p := c.pauseReq
	c.mu.Unlock()
	if p == nil || p.grantedLocked() {
		return true, nil
	}
	if ds != nil && st.unsynced > 0 && st.lastTx != "" {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(c.pollCtx), opTimeout)
		err := ds.Sync(ctx, st.lastTx)
		cancel()
		if err != nil {
			broken = fmt.Errorf("delivery: sync %s before a pause: %w", c.queue, err)
			p.err = broken
		}
	}
	// The queue changes while the loop stands still: its count is taken again afterwards.
	*st = pollState{}
	close(p.granted)
	if broken != nil {
		return true, broken
	}
	select {
	case <-p.resumed:
		return true, nil
	case <-c.pollCtx.Done():
		return false, nil
	}
}

// LeasedMessages calls fn with the message of every live lease: buffered, handed out, delayed
// after a nack or being copied back to the queue. The messages are immutable; fn runs under
// the Consumer's lock and must not call into it.
func (c *Consumer) LeasedMessages(fn func(*Message)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, l := range c.table {
		fn(&l.msg)
	}
}
