package kubemqclient

import (
	"context"
	"sync"

	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/kubemq-io/kubemq-proxy/kubemqpb"
)

// Upstream sends queue-message batches over one QueuesUpstream stream. Send
// is safe for concurrent, pipelined use: each call is one request, and
// responses (which the server may return out of order) are matched by
// request id. A broken stream fails the calls in flight with a retryable
// error and is re-opened by the next Send.
type Upstream struct {
	c *Client

	mu     sync.Mutex // guards gen and closed
	gen    *upGen
	closed bool
}

// upGen is one QueuesUpstream stream. Its pending table is guarded by mu;
// Send calls are serialised by sendMu; the reader goroutine owns Recv.
type upGen struct {
	stream grpc.BidiStreamingClient[kubemqpb.QueuesUpstreamRequest, kubemqpb.QueuesUpstreamResponse]
	cancel context.CancelFunc
	done   chan struct{} // closed when the reader exits

	sendMu sync.Mutex

	mu      sync.Mutex
	pending map[string]chan upReply
	dead    error
	calls   int           // Send calls using this stream
	idle    chan struct{} // closed when calls drops to 0 (set by Close)
}

type upReply struct {
	resp *kubemqpb.QueuesUpstreamResponse
	err  error
}

// OpenUpstream opens an upstream sender. ctx bounds only the opening; the
// stream lives until Close or Client.Close.
func (c *Client) OpenUpstream(ctx context.Context) (*Upstream, error) {
	u := &Upstream{c: c}
	if !c.track(u) {
		return nil, closedErr("OpenUpstream")
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if _, err := u.openLocked(ctx); err != nil {
		c.untrack(u)
		return nil, err
	}
	return u, nil
}

func (u *Upstream) openLocked(ctx context.Context) (*upGen, error) {
	const op = "OpenUpstream"
	if err := ctx.Err(); err != nil {
		return nil, wrapErr(op, err)
	}
	sctx, cancel := context.WithCancel(u.c.ctx)
	t := u.c.startOp()
	stream, err := u.c.rpc.QueuesUpstream(sctx)
	if err != nil {
		cancel()
		err = u.c.observe(wrapErr(op, err))
		t.end(OpUpstreamOpen, err)
		return nil, err
	}
	t.end(OpUpstreamOpen, nil)
	g := &upGen{stream: stream, cancel: cancel, done: make(chan struct{}), pending: map[string]chan upReply{}}
	u.gen = g
	u.c.goTracked(func() { u.read(g) })
	return g, nil
}

func (u *Upstream) read(g *upGen) {
	defer close(g.done)
	for {
		resp, err := g.stream.Recv()
		if err != nil {
			g.fail(u.c.observe(wrapErr("Upstream", err)))
			return
		}
		u.c.hear()
		g.mu.Lock()
		ch, ok := g.pending[resp.GetRefRequestID()]
		delete(g.pending, resp.GetRefRequestID())
		g.mu.Unlock()
		if !ok {
			u.c.log.Debug("upstream response for no waiting call (cancelled)", zap.String("ref", resp.GetRefRequestID()))
			continue
		}
		ch <- upReply{resp: resp}
	}
}

// fail ends the stream and fails every call waiting on it.
func (g *upGen) fail(err error) {
	g.mu.Lock()
	if g.dead == nil {
		g.dead = err
	}
	pending := g.pending
	g.pending = nil
	g.mu.Unlock()
	for _, ch := range pending {
		ch <- upReply{err: err}
	}
	g.cancel()
}

// Send stores msgs as one batch and returns one result per message, in
// order. The error is for the call as a whole (validation, stream failure,
// a response-level refusal); per-message refusals are in the results.
func (u *Upstream) Send(ctx context.Context, msgs []QueueMessage) ([]SendResult, error) {
	const op = "UpstreamSend"
	if len(msgs) == 0 {
		return nil, nil
	}
	pms, err := u.c.queueMessagesToPB(op, msgs)
	if err != nil {
		return nil, err
	}
	u.mu.Lock()
	if u.closed {
		u.mu.Unlock()
		return nil, closedErr(op)
	}
	g := u.gen
	if g == nil || g.isDead() {
		if g, err = u.openLocked(ctx); err != nil {
			u.mu.Unlock()
			return nil, err
		}
	}
	u.mu.Unlock()

	id := u.c.ids.next()
	ch := make(chan upReply, 1)
	t := u.c.startOp()
	g.mu.Lock()
	if g.dead != nil {
		err := g.dead
		g.mu.Unlock()
		t.end(OpUpstreamSend, err)
		return nil, err
	}
	g.pending[id] = ch
	g.calls++
	g.mu.Unlock()
	defer g.callDone()

	g.sendMu.Lock()
	err = g.stream.Send(&kubemqpb.QueuesUpstreamRequest{RequestID: id, Messages: pms})
	g.sendMu.Unlock()
	if err != nil {
		// The real error comes from Recv; fail with what we have.
		g.fail(u.c.observe(wrapErr(op, err)))
	}
	select {
	case r := <-ch:
		if r.err != nil {
			t.end(OpUpstreamSend, r.err)
			return nil, r.err
		}
		if r.resp.GetIsError() {
			err := inBand(op, r.resp.GetError())
			t.end(OpUpstreamSend, err)
			return nil, err
		}
		rs, err := u.c.sendResults(op, len(msgs), r.resp.GetResults())
		endBatch(t, OpUpstreamSend, rs, err)
		return rs, err
	case <-ctx.Done():
		g.mu.Lock()
		delete(g.pending, id)
		g.mu.Unlock()
		err := wrapErr(op, ctx.Err())
		t.end(OpUpstreamSend, err)
		return nil, err
	}
}

func (g *upGen) isDead() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.dead != nil
}

func (g *upGen) callDone() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.calls--
	if g.calls == 0 && g.idle != nil {
		close(g.idle)
		g.idle = nil
	}
}

// idleChan returns a channel closed once no Send call uses the stream.
func (g *upGen) idleChan() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	ch := make(chan struct{})
	if g.calls == 0 {
		close(ch)
	} else {
		g.idle = ch
	}
	return ch
}

// Close waits (up to the client's CloseTimeout) for calls in flight, then
// ends the stream.
func (u *Upstream) Close() error {
	u.mu.Lock()
	if u.closed {
		u.mu.Unlock()
		return nil
	}
	u.closed = true
	g := u.gen
	u.mu.Unlock()
	u.c.untrack(u)
	if g == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), u.c.opts.CloseTimeout)
	defer cancel()
	select {
	case <-g.idleChan():
	case <-g.done:
	case <-ctx.Done():
		// Calls still in flight (or a Send stuck on flow control): give up.
		g.fail(closedErr("Upstream"))
		<-g.done
		return nil
	}
	// Every call has its answer: end the stream. The real server never ends an upstream
	// stream after the client's half-close (docs/kubemq.md 5.9), so waiting for it would
	// only wait out CloseTimeout.
	g.fail(closedErr("Upstream"))
	<-g.done
	return nil
}
