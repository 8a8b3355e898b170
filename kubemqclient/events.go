package kubemqclient

import (
	"context"
	"sync"
	"sync/atomic"

	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/kubemq-io/kubemq-proxy/kubemqpb"
)

// PublishEvent publishes one event to the events store.
func (c *Client) PublishEvent(ctx context.Context, e Event) (PublishResult, error) {
	rs, err := c.PublishEvents(ctx, []Event{e})
	if err != nil {
		return PublishResult{}, err
	}
	return rs[0], rs[0].Err
}

// PublishEvents publishes events to the events store over the client's
// shared SendEventsStream streams (Options.PublishStreams; a batch stays on
// one stream, in order), pipelined with every other caller. The whole batch
// is validated before anything is sent. The error is for the call as a whole
// (validation, ctx, closed client); per-event failures, including Sent=false
// and a stream broken before the event was answered (retryable), are in the
// results, one per event in order (see FirstError). If ctx ends first the
// call returns at once, but the events may still be written: do not modify
// their Body or Tags afterwards. The same holds for a FailFast ctx when the
// client loses readiness meanwhile: the call then fails with ErrUnavailable,
// as it does at once when called during an outage.
func (c *Client) PublishEvents(ctx context.Context, events []Event) ([]PublishResult, error) {
	const op = "PublishEvents"
	if c.isClosed() {
		return nil, closedErr(op)
	}
	if len(events) == 0 {
		return nil, nil
	}
	b := &pubBatch{
		events:  make([]*kubemqpb.Event, len(events)),
		results: make([]PublishResult, len(events)),
		done:    make(chan struct{}),
	}
	for i := range events {
		e := &events[i]
		if err := validMessageContent(op, e.Channel, e.Metadata, e.Body); err != nil {
			return nil, err
		}
		id := e.EventID
		if id == "" {
			id = c.ids.next()
		}
		b.events[i] = &kubemqpb.Event{EventID: id, ClientID: c.clientID, Channel: e.Channel,
			Metadata: e.Metadata, Body: e.Body, Store: true, Tags: e.Tags}
		b.results[i].EventID = id
	}
	b.remaining.Store(int64(len(events)))
	ctx, release, err := c.boundToReadiness(op, ctx)
	if err != nil {
		return nil, err // an outage: nothing was sent
	}
	defer release()
	t := c.startOp()
	if err := c.pub.enqueue(b); err != nil {
		return nil, err // closed: nothing was sent
	}
	select {
	case <-b.done:
		endBatch(t, OpPublishEvents, b.results, nil)
		return b.results, nil
	case <-ctx.Done():
		err := c.settleOutage(op, ctx, wrapErr(op, ctx.Err()), len(events), events[0].Channel)
		t.end(OpPublishEvents, err)
		return nil, err
	}
}

// eventPublisher spreads batches over a few lanes, each one shared
// SendEventsStream, so the server handles them in parallel. A batch stays on
// one lane, so its events are sent in order.
type eventPublisher struct {
	lanes []*pubLane
	next  atomic.Uint64
}

func newEventPublisher(c *Client) *eventPublisher {
	p := &eventPublisher{lanes: make([]*pubLane, c.opts.PublishStreams)}
	for i := range p.lanes {
		p.lanes[i] = &pubLane{c: c, wake: make(chan struct{}, 1), outstanding: map[*pubBatch]struct{}{}}
	}
	return p
}

func (p *eventPublisher) enqueue(b *pubBatch) error {
	return p.lanes[p.next.Add(1)%uint64(len(p.lanes))].enqueue(b)
}

func (p *eventPublisher) drain(ctx context.Context) {
	for _, l := range p.lanes {
		l.drain(ctx)
	}
}

func (p *eventPublisher) close() {
	for _, l := range p.lanes {
		l.close()
	}
}

// pubLane owns one SendEventsStream. Callers append batches to queue; one
// writer goroutine (the owner of gen) registers them and writes them to the
// stream; each stream has a reader goroutine matching Results to batches by
// EventID.
type pubLane struct {
	c     *Client
	start sync.Once
	wake  chan struct{} // cap 1

	mu          sync.Mutex // guards queue, outstanding and closed
	queue       []*pubBatch
	outstanding map[*pubBatch]struct{} // enqueued and not yet complete
	closed      bool

	gen *pubGen // owned by the writer goroutine
}

type pubBatch struct {
	events    []*kubemqpb.Event
	results   []PublishResult // written by the stream goroutines, read after done
	remaining atomic.Int64
	done      chan struct{}
	p         *pubLane
}

// settle records the outcome of event i; the last one completes the batch.
func (b *pubBatch) settle(i int, err error) {
	b.results[i].Err = err
	if b.remaining.Add(-1) == 0 {
		b.complete()
	}
}

// failAll completes a batch none of whose events is registered on a stream.
func (b *pubBatch) failAll(err error) {
	for i := range b.results {
		b.results[i].Err = err
	}
	b.remaining.Store(0)
	b.complete()
}

func (b *pubBatch) complete() {
	b.p.mu.Lock()
	delete(b.p.outstanding, b)
	b.p.mu.Unlock()
	close(b.done)
}

// pubRef locates one event in flight; more holds later events that reuse
// the same (caller-chosen) EventID, answered in order.
type pubRef struct {
	b    *pubBatch
	i    int
	more []pubRef
}

// pubGen is one SendEventsStream; mu guards pending and dead.
type pubGen struct {
	stream grpc.BidiStreamingClient[kubemqpb.Event, kubemqpb.Result]
	cancel context.CancelFunc
	done   chan struct{} // closed when the reader exits

	mu      sync.Mutex
	pending map[string]pubRef
	dead    error
}

func (p *pubLane) enqueue(b *pubBatch) error {
	p.start.Do(func() { p.c.goTracked(p.writeLoop) })
	b.p = p
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return closedErr("PublishEvents")
	}
	p.outstanding[b] = struct{}{}
	p.queue = append(p.queue, b)
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
	return nil
}

// drain refuses new batches and waits until every outstanding one is
// answered, or ctx ends; Client.Close calls it before ending the stream.
func (p *pubLane) drain(ctx context.Context) {
	p.mu.Lock()
	p.closed = true
	waits := make([]chan struct{}, 0, len(p.outstanding))
	for b := range p.outstanding {
		waits = append(waits, b.done)
	}
	p.mu.Unlock()
	for _, ch := range waits {
		select {
		case <-ch:
		case <-ctx.Done():
			return
		}
	}
}

// close fails queued batches; the writer calls it when the client ends.
func (p *pubLane) close() {
	p.mu.Lock()
	p.closed = true
	q := p.queue
	p.queue = nil
	p.mu.Unlock()
	for _, b := range q {
		b.failAll(closedErr("PublishEvents"))
	}
}

func (p *pubLane) writeLoop() {
	defer func() {
		if p.gen != nil {
			p.gen.fail(closedErr("PublishEvents"))
		}
		p.close()
	}()
	for {
		select {
		case <-p.wake:
		case <-p.c.ctx.Done():
			return
		}
		p.mu.Lock()
		q := p.queue
		p.queue = nil
		p.mu.Unlock()
		if len(q) > 0 {
			p.write(q)
		}
	}
}

func (p *pubLane) write(q []*pubBatch) {
	g, err := p.current()
	if err == nil && !g.register(q) {
		// The stream died since the last write; nothing of q was sent, so
		// one fresh stream may take it.
		if g, err = p.current(); err == nil && !g.register(q) {
			err = g.deadErr()
		}
	}
	if err != nil {
		for _, b := range q {
			b.failAll(err)
		}
		return
	}
	for _, b := range q {
		for _, ev := range b.events {
			if err := g.stream.Send(ev); err != nil {
				// Recv reports the real cause; fail everything in flight now.
				g.fail(p.c.observe(wrapErr("PublishEvents", err)))
				return
			}
		}
	}
}

// current returns a live stream, opening one if needed.
func (p *pubLane) current() (*pubGen, error) {
	if p.gen != nil && p.gen.deadErr() == nil {
		return p.gen, nil
	}
	sctx, cancel := context.WithCancel(p.c.ctx)
	stream, err := p.c.rpc.SendEventsStream(sctx)
	if err != nil {
		cancel()
		return nil, p.c.observe(wrapErr("PublishEvents", err))
	}
	g := &pubGen{stream: stream, cancel: cancel, done: make(chan struct{}), pending: map[string]pubRef{}}
	p.gen = g
	p.c.goTracked(func() { p.read(g) })
	return g, nil
}

// register adds every event of q to the pending table before any is sent,
// so that no Result can outrun its registration.
func (g *pubGen) register(q []*pubBatch) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.dead != nil {
		return false
	}
	for _, b := range q {
		for i, ev := range b.events {
			ref, dup := g.pending[ev.EventID]
			if !dup {
				g.pending[ev.EventID] = pubRef{b: b, i: i}
				continue
			}
			ref.more = append(ref.more, pubRef{b: b, i: i})
			g.pending[ev.EventID] = ref
		}
	}
	return true
}

func (g *pubGen) deadErr() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.dead
}

func (g *pubGen) fail(err error) {
	g.mu.Lock()
	if g.dead == nil {
		g.dead = err
	}
	pending := g.pending
	g.pending = map[string]pubRef{}
	g.mu.Unlock()
	for _, ref := range pending {
		ref.b.settle(ref.i, err)
		for _, r := range ref.more {
			r.b.settle(r.i, err)
		}
	}
	g.cancel()
}

func (p *pubLane) read(g *pubGen) {
	defer close(g.done)
	for {
		r, err := g.stream.Recv()
		if err != nil {
			g.fail(p.c.observe(wrapErr("PublishEvents", err)))
			return
		}
		p.c.hear()
		id := r.GetEventID()
		g.mu.Lock()
		ref, ok := g.pending[id]
		if ok {
			if len(ref.more) == 0 {
				delete(g.pending, id)
			} else {
				next := ref.more[0]
				next.more = ref.more[1:]
				g.pending[id] = next
			}
		}
		g.mu.Unlock()
		if !ok {
			p.c.log.Warn("events-store result for no event in flight", zap.String("event_id", id))
			continue
		}
		var rerr error
		if !r.GetSent() {
			msg := r.GetError()
			if msg == "" {
				msg = "event not sent"
			}
			rerr = inBand("PublishEvents", msg)
		}
		ref.b.settle(ref.i, rerr)
	}
}
