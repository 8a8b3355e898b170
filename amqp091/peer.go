package amqp091

import (
	"context"
	"errors"
	"io"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kubemq-io/kubemq-proxy/amqp091/peerpb"
	"github.com/kubemq-io/kubemq-proxy/delivery"
)

// The replica that holds a queue serves other replicas' AMQP consumers of
// it over the peer port (peerpb.AMQPPeer). A consumer link becomes one more
// consumer of the queue's dispatcher, so round-robin, consumer priorities
// and exclusive consumers hold across replicas; it gets deliveries within
// the credit the other replica grants (its client's prefetch less what the
// client holds). A get link answers basic.get calls. Whatever a link has
// out when it ends (the other replica closed the channel, died, or this one
// stops) goes back to its place in the queue, redelivered, as when a
// RabbitMQ channel closes.

// maxLinkCredit bounds the credit another replica may grant one link.
const maxLinkCredit = 1 << 16

// drainWait bounds how long Shutdown waits for other replicas to settle
// what their links have out before it ends the links.
const drainWait = 5 * time.Second

// RegisterPeer registers the AMQP peer service on the peer port.
func (s *Server) RegisterPeer(r grpc.ServiceRegistrar) {
	peerpb.RegisterAMQPPeerServer(r, &peerService{s: s})
}

type peerService struct {
	peerpb.UnimplementedAMQPPeerServer
	s *Server
}

// peerLink is this replica's side of another replica's link.
type peerLink struct {
	s      *Server
	q      *queue
	h      *delivery.Handle
	cs     *consumer // nil for a get link
	ctx    context.Context
	cancel context.CancelCauseFunc
	wake   chan struct{} // cap 1: sendq has something
	// failed: this replica ended the link (fail): its consumer's end does
	// not count for auto-delete, the other replica opens a link anew.
	failed atomic.Bool

	mu      sync.Mutex // guards the fields below (and cs's delivery state)
	credit  int
	nextKey uint64
	out     map[uint64]*delivery.Delivery // delivered and not settled, by key
	// settling is how many deliveries settle has taken from out and not
	// yet applied to the lease engine: still out for drainLinks, so that a
	// stop does not give back a delivery whose ack is being applied.
	settling int
	sendq    []*peerpb.LinkResponse
	ended    bool // finish ran: nothing may be added to out
	batch    bool // the other replica takes Deliveries (Open.batch)
	// noAck: the consumer is no-ack (Open.no_ack): each delivery is
	// settled as it goes out, never kept in out.
	noAck bool
	// buffered is how many of out the other replica holds in its
	// read-ahead, no client having them (Credit.buffered): ready in counts.
	buffered int
	// prefetch is the consumer's per-consumer prefetch (Open.prefetch); 0
	// when it has none or the other replica did not say.
	prefetch int
}

// Bounds of one Deliveries response: it stays far below gRPC's message
// limit, and a consumer's first messages are not held back behind many.
const (
	peerBatchMax   = 256
	peerBatchBytes = 1 << 20
)

// errPeerMoved: the queue is not held here (any more); the other replica resolves the holder anew.
var errPeerMoved = status.Error(codes.Unavailable, "kubemq-proxy: this replica does not hold the queue; resolve the holder again")

func isEOF(err error) bool { return errors.Is(err, io.EOF) }

func checkRef(ref *peerpb.QueueRef) error {
	if ref == nil || ref.Vhost == "" || ref.Channel == "" || len(ref.Vhost) > 255 || len(ref.Name) > 255 || len(ref.Channel) > 1024 {
		return status.Error(codes.InvalidArgument, "kubemq-proxy: a queue reference needs a vhost, a name and a KubeMQ channel within bounds")
	}
	return nil
}

// peerQueue returns the queue a link or call names: the one of this
// replica's topology when it is the same incarnation, else a stand-in that
// only serves the link (a transient queue declared on the other replica
// alone). release forgets a stand-in.
func (s *Server) peerQueue(ref *peerpb.QueueRef) (q *queue, release func()) {
	v := s.top.vhost(ref.Vhost)
	if q := v.lookupQueue(ref.Name); q != nil && q.channel == ref.Channel {
		return q, func() {}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.standIns[ref.Channel]
	if st == nil {
		st = &standIn{q: newQueue(v, ref.Name, false, false, false, nil, nil, 0)}
		st.q.channel = ref.Channel
		s.standIns[ref.Channel] = st
	}
	st.refs++
	return st.q, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if st.refs--; st.refs == 0 && s.standIns[ref.Channel] == st {
			delete(s.standIns, ref.Channel)
		}
	}
}

// peerConsumers counts the consumers of the queue ref names here, other
// replicas' included.
func (s *Server) peerConsumers(ref *peerpb.QueueRef) int {
	q := s.top.vhost(ref.Vhost).lookupQueue(ref.Name)
	if q == nil || q.channel != ref.Channel {
		s.mu.Lock()
		st := s.standIns[ref.Channel]
		s.mu.Unlock()
		if st == nil {
			return 0
		}
		q = st.q
	}
	q.vh.mu.Lock()
	defer q.vh.mu.Unlock()
	return len(q.consumers)
}

// standIn is a queue another replica's links use that this replica's
// topology does not hold. Guarded by Server.mu.
type standIn struct {
	q    *queue
	refs int
}

func (p *peerService) Link(stream peerpb.AMQPPeer_LinkServer) error {
	s := p.s
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	open := first.GetOpen()
	if open == nil {
		return status.Error(codes.InvalidArgument, "kubemq-proxy: a link starts with Open")
	}
	s.m.linkRequests.WithLabelValues("open").Inc()
	if err := checkRef(open.Queue); err != nil {
		return err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return errPeerMoved
	}
	s.wg.Add(1)
	s.mu.Unlock()
	defer s.wg.Done()

	q, release := s.peerQueue(open.Queue)
	defer release()
	ctx, cancel := context.WithCancelCause(stream.Context())
	defer cancel(nil)
	stop := context.AfterFunc(s.ctx, func() { cancel(errPeerMoved) }) // the link ends with the server
	defer stop()
	h, err := s.deliveries.Acquire(ctx, q.channel)
	switch {
	case errors.Is(err, delivery.ErrNotOwner), errors.Is(err, delivery.ErrClosed):
		return errPeerMoved
	case err != nil:
		return status.Errorf(codes.Unavailable, "kubemq-proxy: %v", err)
	}
	l := &peerLink{s: s, q: q, h: h, ctx: ctx, cancel: cancel, wake: make(chan struct{}, 1), out: map[uint64]*delivery.Delivery{}, batch: open.Batch,
		noAck: open.Consume && open.NoAck}
	defer l.finish()
	s.mu.Lock()
	s.links[l] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.links, l)
		s.mu.Unlock()
	}()
	// Opened goes first: a registered consumer may be sent deliveries at
	// once, and the other replica takes a link whose first response is not
	// Opened for a failed one (what it had out would come again,
	// redelivered). Nothing is sent if registering fails.
	l.enqueue(&peerpb.LinkResponse{Kind: &peerpb.LinkResponse_Opened{Opened: &peerpb.Opened{ReadAhead: true, NoAck: l.noAck}}})
	if open.Consume {
		if err := l.register(open); err != nil {
			return err
		}
		if linkRegistered != nil {
			linkRegistered()
		}
	}
	sent := make(chan error, 1)
	go func() { sent <- l.sendLoop(stream) }()
	// Recv only returns once the stream ends, which is after this handler
	// returns when the link is ended here: the receive loop is left to end
	// with the stream (tracked, so Shutdown waits for it).
	recvd := make(chan error, 1)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		recvd <- l.recvLoop(stream)
	}()
	select {
	case err = <-recvd:
	case <-ctx.Done():
		err = context.Cause(ctx)
		if errors.Is(err, context.Canceled) {
			err = nil
		}
	}
	cancel(err)
	serr := <-sent
	if err == nil && serr != nil && !errors.Is(serr, context.Canceled) {
		err = serr
	}
	if c := context.Cause(ctx); err == nil && c != nil && !errors.Is(c, context.Canceled) {
		err = c // ended by this replica (shutdown, the queue handed over)
	}
	return err
}

// linkRegistered, when set, runs once a link's consumer is registered:
// a variable for the tests alone.
var linkRegistered func()

// register adds l as a consumer of its queue's dispatcher, with the same
// checks as a local basic.consume.
func (l *peerLink) register(open *peerpb.Open) error {
	q := l.q
	cs := &consumer{peer: l, tag: open.ConsumerTag, q: q, h: l.h, exclusive: open.Exclusive, priority: open.Priority}
	vh := q.vh
	vh.mu.Lock()
	defer vh.mu.Unlock()
	if q.deleted {
		return status.Errorf(codes.NotFound, "no %s", rsQueue(q.name, q.vh.displayName()))
	}
	if open.SingleActive {
		q.singleActive = true // a stand-in knows it only from here
	}
	if open.Exclusive && q.singleActive {
		return status.Errorf(codes.PermissionDenied, "%s", errSingleActiveExclusive(q.name, q.vh.displayName()).Text)
	}
	if q.exclusiveConsumer || (open.Exclusive && len(q.consumers) > 0) {
		return status.Errorf(codes.PermissionDenied, "%s in exclusive use", rsQueue(q.name, q.vh.displayName()))
	}
	q.consumers[cs] = struct{}{}
	q.hadConsumer = true
	q.touch() // a use (x-expires)
	if open.Exclusive {
		q.exclusiveConsumer = true
	}
	if q.disp == nil {
		q.disp = newDispatcher(l.s, q)
	}
	cs.d = q.disp
	l.cs = cs
	l.mu.Lock()
	l.credit = min(int(open.Credit), maxLinkCredit)
	l.prefetch = int(open.Prefetch)
	l.mu.Unlock()
	cs.d.add(cs)
	return nil
}

// stopConsumer ends l's consumer: no delivery reaches it once this returns.
// gone tells that the other replica's consumer is gone (cancelled, its
// channel closed, its replica gone), rather than moved by this replica:
// an auto-delete queue that lost its last consumer is then deleted, as
// for a local consumer (this replica holds the queue: it judges).
func (l *peerLink) stopConsumer(gone bool) {
	cs := l.cs
	if cs == nil {
		return
	}
	l.mu.Lock()
	was := cs.stopped
	cs.stopped = true
	l.mu.Unlock()
	if was {
		return
	}
	q := cs.q
	judge := gone && l.s.judges(q)
	q.vh.mu.Lock()
	delete(q.consumers, cs)
	if cs.exclusive {
		q.exclusiveConsumer = false
	}
	cs.d.remove(cs)
	if q.disp == cs.d && cs.d.empty() {
		q.disp = nil
		cs.d.stop()
	}
	drop := judge && q.autoDelete && q.hadConsumer && len(q.consumers) == 0 && !q.deleted
	q.vh.mu.Unlock()
	q.touch() // x-expires counts from the last consumer's end
	if drop {
		l.s.dropQueueAsync(q, "auto-delete queue lost its last consumer", l.s.log)
	}
}

// deliver hands d to the other replica if its credit allows (the
// dispatcher's goroutine; never blocks).
func (l *peerLink) deliver(cs *consumer, d *delivery.Delivery) bool {
	l.mu.Lock()
	if cs.stopped || l.credit <= 0 || l.roomLocked() <= 0 || l.ctx.Err() != nil {
		l.mu.Unlock()
		return false
	}
	l.credit--
	l.nextKey++
	if !l.noAck {
		l.out[l.nextKey] = d
	}
	l.sendq = append(l.sendq, &peerpb.LinkResponse{Kind: &peerpb.LinkResponse_Delivery{Delivery: toPeer(l.nextKey, d, 0)}})
	l.mu.Unlock()
	l.s.m.delivered.Inc()
	l.q.delivered(len(d.Body))
	l.signal()
	if l.noAck {
		// Settled as it goes out, as RabbitMQ settles a no-ack delivery.
		l.q.via(l.h, d).Ack(d.LeaseID) // uncounted in acks, as a local no-ack delivery
	}
	return true
}

// roomLocked is how many more deliveries l may have out beyond what its
// credit allows. The other replica reads ahead beyond its client's
// prefetch (a buffer there covers the link's round trip), so a link with
// credit would take more of every batch than a consumer served here, whose
// depth is its prefetch: measured, the holder's own consumer got 0.73-0.91
// of an even share against two forwarded ones. While this replica serves a
// consumer of the queue that acknowledges within a prefetch, a link keeps
// to the larger of its client's prefetch and the deepest such consumer's,
// as RabbitMQ keeps every consumer to its prefetch; with none, the
// read-ahead is unbounded here. Under l.mu.
func (l *peerLink) roomLocked() int {
	if l.prefetch == 0 || l.cs == nil { // a get link has no consumer
		return math.MaxInt
	}
	depth := int(l.cs.d.localDepth.Load())
	if depth == 0 {
		return math.MaxInt
	}
	return max(l.prefetch, depth) - len(l.out)
}

func toPeer(key uint64, d *delivery.Delivery, count uint32) *peerpb.Delivery {
	var stored int64
	if d.Attempt <= 1 && !d.StoredAt.IsZero() {
		stored = d.StoredAt.UnixNano()
	}
	return &peerpb.Delivery{Key: key, Body: d.Body, Metadata: d.Metadata, Tags: d.Tags, Redelivered: d.Redelivered, MessageCount: count, StoredAt: stored}
}

func (l *peerLink) enqueue(r *peerpb.LinkResponse) {
	l.mu.Lock()
	l.sendq = append(l.sendq, r)
	l.mu.Unlock()
	l.signal()
}

func (l *peerLink) signal() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// fail ends the link after a lease engine failure (the queue handed over,
// KubeMQ lost): the other replica resolves the holder again.
func (l *peerLink) fail(err error) {
	l.s.log.Info("ending a forwarded consumer", zap.String("queue", l.q.name), zap.Error(err))
	l.failed.Store(true)
	l.cancel(status.Errorf(codes.Unavailable, "kubemq-proxy: %v", err))
}

// cancelled tells the other replica its consumer ended here (the queue was
// deleted); any goroutine, not under the vhost's lock.
func (l *peerLink) cancelled(why string) {
	l.enqueue(&peerpb.LinkResponse{Kind: &peerpb.LinkResponse_Cancelled{Cancelled: &peerpb.Cancelled{Reason: why}}})
	l.stopConsumer(false)
}

func (l *peerLink) sendLoop(stream peerpb.AMQPPeer_LinkServer) error {
	for {
		l.mu.Lock()
		batch := l.sendq
		l.sendq = nil
		l.mu.Unlock()
		if l.batch {
			batch = foldDeliveries(batch)
		}
		for _, r := range batch {
			if err := stream.Send(r); err != nil {
				l.cancel(err)
				return err
			}
		}
		select {
		case <-l.wake:
		case <-l.ctx.Done():
			return l.ctx.Err()
		}
	}
}

// foldDeliveries turns each run of Delivery responses in rs into
// Deliveries responses of at most peerBatchMax deliveries and about
// peerBatchBytes, keeping the order of everything in rs; a lone delivery
// stays as it is.
func foldDeliveries(rs []*peerpb.LinkResponse) []*peerpb.LinkResponse {
	out := rs[:0] // written behind the reading position
	var run []*peerpb.Delivery
	size := 0
	end := func() {
		switch len(run) {
		case 0:
		case 1:
			out = append(out, &peerpb.LinkResponse{Kind: &peerpb.LinkResponse_Delivery{Delivery: run[0]}})
		default:
			out = append(out, &peerpb.LinkResponse{Kind: &peerpb.LinkResponse_Deliveries{Deliveries: &peerpb.Deliveries{Items: run}}})
		}
		run, size = nil, 0
	}
	for _, r := range rs {
		d := r.GetDelivery()
		if d == nil {
			end()
			out = append(out, r)
			continue
		}
		if len(run) == peerBatchMax || (len(run) > 0 && size+len(d.Body) > peerBatchBytes) {
			end()
		}
		run = append(run, d)
		size += len(d.Body) + len(d.Metadata)
	}
	end()
	return out
}

// recvLoop applies the other replica's requests until it closes its side
// (nil) or the link fails.
func (l *peerLink) recvLoop(stream peerpb.AMQPPeer_LinkServer) error {
	for {
		req, err := stream.Recv()
		if err != nil {
			if l.ctx.Err() == nil && status.Code(err) != codes.Canceled && !isEOF(err) {
				return err
			}
			return nil
		}
		switch k := req.Kind.(type) {
		case *peerpb.LinkRequest_Credit:
			l.s.m.linkCredit.Inc()
			if l.cs == nil {
				continue
			}
			l.mu.Lock()
			l.credit = min(l.credit+int(k.Credit.Add), maxLinkCredit)
			l.buffered = min(int(k.Credit.Buffered), len(l.out))
			l.mu.Unlock()
			if k.Credit.Add > 0 {
				l.cs.d.wake()
			}
		case *peerpb.LinkRequest_Settle:
			l.s.m.linkSettle.Inc()
			l.settle(k.Settle)
		case *peerpb.LinkRequest_Cancel:
			l.s.m.linkRequests.WithLabelValues("cancel").Inc()
			// Answered once no delivery can follow: basic.cancel-ok.
			l.stopConsumer(true)
			l.enqueue(&peerpb.LinkResponse{Kind: &peerpb.LinkResponse_Cancelled{Cancelled: &peerpb.Cancelled{}}})
		case *peerpb.LinkRequest_Get:
			l.s.m.linkRequests.WithLabelValues("get").Inc()
			if err := l.get(); err != nil {
				return err
			}
		default:
			return status.Error(codes.InvalidArgument, "kubemq-proxy: unexpected link request")
		}
	}
}

func (l *peerLink) settle(st *peerpb.Settle) {
	ids := make([]string, 0, len(st.Keys))
	ds := make([]*delivery.Delivery, 0, len(st.Keys))
	l.mu.Lock()
	for _, k := range st.Keys {
		if d := l.out[k]; d != nil {
			delete(l.out, k)
			ids = append(ids, d.LeaseID)
			ds = append(ds, d)
		}
	}
	l.settling += len(ds)
	l.mu.Unlock()
	if len(ids) == 0 {
		return
	}
	defer func(n int) {
		l.mu.Lock()
		l.settling -= n
		l.mu.Unlock()
	}(len(ds))
	switch {
	case st.Op == peerpb.Settle_RETURN && !l.q.isDeleted():
		// The other replica's read-ahead: no client saw them.
		l.mu.Lock()
		l.buffered = max(l.buffered-len(ds), 0)
		l.mu.Unlock()
		for h, back := range l.q.viaHandles(l.h, ds) {
			h.Unfetch(back...)
		}
	case st.Op == peerpb.Settle_REQUEUE && !l.q.isDeleted():
		back := ds[:0]
		for _, d := range ds {
			if l.q.overDeliveryLimit(d) {
				l.s.remove(l.q, l.h, d, reasonDeliveryLimit)
				continue
			}
			back = append(back, d)
		}
		for h, ids := range l.q.leaseIDs(l.h, back) {
			h.Requeue(ids...)
		}
		l.s.m.requeued.Add(float64(len(back)))
	case st.Op == peerpb.Settle_REJECT && l.q.hasDLX:
		for _, d := range ds {
			l.s.rejectToDLX(l.q, l.h, d)
		}
		l.s.m.acked.Add(float64(len(ds)))
	default:
		for h, ids := range l.q.leaseIDs(l.h, ds) {
			h.Ack(ids...)
		}
		l.s.m.acked.Add(float64(len(ids)))
	}
	if l.cs != nil {
		l.cs.d.wake()
	}
}

// get answers one forwarded basic.get as a local one would.
func (l *peerLink) get() error {
	l.q.touch() // a use (x-expires)
	ctx, cancel := context.WithTimeout(l.ctx, getWait)
	ds, h, err := l.s.tryFetchTop(ctx, l.q, l.h)
	cancel()
	if err != nil && !(l.ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded)) {
		return status.Errorf(codes.Unavailable, "kubemq-proxy: basic.get: %v", err)
	}
	if len(ds) == 0 {
		l.enqueue(&peerpb.LinkResponse{Kind: &peerpb.LinkResponse_GetEmpty{GetEmpty: &peerpb.GetEmpty{}}})
		return nil
	}
	d := ds[0]
	if len(ds) > 1 {
		h.Unfetch(ds[1:]...)
	}
	left, err := l.s.handleReady(l.ctx, l.q, h)
	if err != nil {
		h.Unfetch(d)
		return status.Errorf(codes.Unavailable, "kubemq-proxy: basic.get: %v", err)
	}
	l.mu.Lock()
	if l.ended { // the link ended meanwhile: the message goes back
		l.mu.Unlock()
		h.Unfetch(d)
		return nil
	}
	l.nextKey++
	l.out[l.nextKey] = d
	l.sendq = append(l.sendq, &peerpb.LinkResponse{Kind: &peerpb.LinkResponse_Delivery{
		Delivery: toPeer(l.nextKey, d, uint32(min(max(left, 0), 1<<32-1)))}})
	l.mu.Unlock()
	l.s.m.delivered.Inc()
	l.q.delivered(len(d.Body))
	l.signal()
	return nil
}

// finish ends the consumer and puts what is still out back in place. A
// link the other replica ended (its channel closed, it stopped or died)
// takes its consumer with it; one this replica ended (fail, Shutdown)
// only moves it (judges).
func (l *peerLink) finish() {
	l.stopConsumer(!l.failed.Load())
	l.mu.Lock()
	l.ended = true
	ds := make([]*delivery.Delivery, 0, len(l.out))
	for k, d := range l.out {
		ds = append(ds, d)
		delete(l.out, k)
	}
	l.mu.Unlock()
	deleted := len(ds) > 0 && l.q.isDeleted()
	for h, ids := range l.q.leaseIDs(l.h, ds) {
		if deleted {
			h.Ack(ids...)
		} else {
			h.Requeue(ids...)
		}
	}
	if !deleted {
		l.s.m.requeued.Add(float64(len(ds)))
	}
	l.h.Close()
}

// drainLinks stops every link's consumer (nothing new goes out) and waits
// until the other replicas have settled what the links have out, at most
// drainWait or ctx; Shutdown then ends the links, and what is still out
// goes back to the queue.
func (s *Server) drainLinks(ctx context.Context) {
	s.mu.Lock()
	ls := make([]*peerLink, 0, len(s.links))
	for l := range s.links {
		ls = append(ls, l)
	}
	s.mu.Unlock()
	if len(ls) == 0 {
		return
	}
	for _, l := range ls {
		l.stopConsumer(false)
	}
	deadline := time.Now().Add(drainWait)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		n := 0
		for _, l := range ls {
			if l.ctx.Err() == nil {
				n += l.outstanding()
			}
		}
		if n == 0 {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// linksBuffered is how many deliveries of KubeMQ channel ch other
// replicas hold in their links' read-ahead: ready, as this replica's own
// read-ahead is, in message counts.
func (s *Server) linksBuffered(ch string) uint32 {
	s.mu.Lock()
	ls := make([]*peerLink, 0, len(s.links))
	for l := range s.links {
		if l.q.channel == ch {
			ls = append(ls, l)
		}
	}
	s.mu.Unlock()
	n := 0
	for _, l := range ls {
		l.mu.Lock()
		n += min(l.buffered, len(l.out))
		l.mu.Unlock()
	}
	return uint32(n)
}

// outstanding is how many deliveries l has out, counting those whose
// settlement is being applied.
func (l *peerLink) outstanding() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.out) + l.settling
}

func (p *peerService) Queue(ctx context.Context, req *peerpb.QueueRequest) (*peerpb.QueueResponse, error) {
	if err := checkRef(req.Queue); err != nil {
		return nil, err
	}
	s := p.s
	q, release := s.peerQueue(req.Queue)
	defer release()
	switch req.Op {
	case peerpb.QueueRequest_COUNT:
		if req.Use {
			q.touch() // a redeclare through the other replica (x-expires)
		}
		n, known, err := s.readyWithLinks(ctx, q)
		if err != nil {
			return nil, status.Errorf(codes.Unavailable, "kubemq-proxy: count: %v", err)
		}
		return &peerpb.QueueResponse{Count: n, Known: known, Consumers: uint32(s.peerConsumers(req.Queue))}, nil
	case peerpb.QueueRequest_TRIM:
		if !q.dropsHead() {
			return &peerpb.QueueResponse{}, nil // nothing to trim (or a queue this replica does not know)
		}
		done := make(chan struct{})
		s.requestTrim(q, func() { close(done) })
		select {
		case <-done:
			return &peerpb.QueueResponse{}, nil
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	case peerpb.QueueRequest_BYTES:
		if !q.limitsBytes() {
			return &peerpb.QueueResponse{}, nil // a queue this replica does not know (yet): known false
		}
		n, known, err := s.readyWithLinks(ctx, q)
		if err != nil {
			return nil, status.Errorf(codes.Unavailable, "kubemq-proxy: count: %v", err)
		}
		if !known {
			return &peerpb.QueueResponse{}, nil
		}
		b, err := s.localReadyBytes(ctx, q, int64(n), int64(min(req.Size, 1<<62)))
		if err != nil {
			return nil, status.FromContextError(err).Err()
		}
		return &peerpb.QueueResponse{Count: n, Known: true, Bytes: uint64(max(b, 0))}, nil
	case peerpb.QueueRequest_PURGE:
		n, err := s.queuePurge(ctx, q)
		if err != nil {
			return nil, status.Errorf(codes.Unavailable, "kubemq-proxy: purge: %v", err)
		}
		return &peerpb.QueueResponse{Count: n, Known: true}, nil
	}
	return nil, status.Errorf(codes.InvalidArgument, "kubemq-proxy: unknown queue operation %d", req.Op)
}
