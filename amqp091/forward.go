package amqp091

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kubemq-io/kubemq-proxy/amqp091/peerpb"
	"github.com/kubemq-io/kubemq-proxy/amqp091/wire"
	"github.com/kubemq-io/kubemq-proxy/delivery"
)

// Several replicas on one KubeMQ: one of them holds a queue at a time (the
// lease engine's Owners). A client of another replica still consumes it:
// its consumer is forwarded over a link to the holder (peer.go), which
// treats it as one more consumer of the queue; deliveries come back over
// the link and get this channel's delivery tags, and the client's acks,
// nacks, rejects and recovers go back over it, as does the credit its
// prefetch leaves. basic.get uses a link of its own per channel and queue;
// message counts and purges are asked of the holder. When a link ends (the
// holder stopped, died, or handed the queue over) the consumer resolves
// the holder anew, or takes the queue itself, and goes on; what the client
// held from the ended link comes again, redelivered, and its later
// settlements of it are void. A channel that closes ends its links, and
// the holder puts what they had out back in the queue.

// Peers reaches the replica that holds a queue when several share one KubeMQ.
type Peers interface {
	// Owner returns the peer address of another replica that holds queue
	// (a KubeMQ channel); false when none does, or this one does.
	Owner(queue string) (addr string, ok bool)
	// Conn returns a connection to the replica at addr (its peer port).
	Conn(addr string) (grpc.ClientConnInterface, error)
	// Self returns this replica's own peer address ("" when it advertises
	// none): direct reply-to names carry it so replies find their channel.
	Self() string
	// Propagate returns once every other live replica has read this
	// replica's registry writes so far, or could not in a bounded time
	// (registry.Registry.Propagate): a declare, bind or delete answers
	// after it, so the client's next publish through any replica routes
	// by the change.
	Propagate(ctx context.Context)
}

// linkRetry is the pause between attempts to find a queue's holder.
const linkRetry = 250 * time.Millisecond

// remote returns a client of the replica that holds KubeMQ channel ch, when
// another one does and it can be reached.
func (s *Server) remote(ch string) (peerpb.AMQPPeerClient, bool) {
	if s.peers == nil {
		return nil, false
	}
	addr, ok := s.peers.Owner(ch)
	if !ok {
		return nil, false
	}
	conn, err := s.peers.Conn(addr)
	if err != nil {
		return nil, false
	}
	return peerpb.NewAMQPPeerClient(conn), true
}

func (q *queue) ref() *peerpb.QueueRef {
	return &peerpb.QueueRef{Vhost: q.vh.key, Name: q.name, Channel: q.channel}
}

// queueRemote asks the replica that holds q to count or purge it, when
// another one does; false: this replica answers itself (it holds q, nobody
// does, or the holder could not be asked). use: the count is for a
// queue.declare, a use of q the holder's x-expires timer counts.
func (s *Server) queueRemote(ctx context.Context, q *queue, op peerpb.QueueRequest_Op, use bool) (*peerpb.QueueResponse, bool) {
	return s.queueAsk(ctx, q, &peerpb.QueueRequest{Op: op, Use: use})
}

// queueAsk is queueRemote with the request req (its queue is set here).
func (s *Server) queueAsk(ctx context.Context, q *queue, req *peerpb.QueueRequest) (*peerpb.QueueResponse, bool) {
	if s.peers == nil || s.deliveries.Lookup(q.channel) != nil {
		return nil, false
	}
	pc, ok := s.remote(q.channel)
	if !ok {
		return nil, false
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req.Queue = q.ref()
	r, err := pc.Queue(ctx, req)
	if err != nil {
		s.log.Debug("asking the queue's holder failed; answering here", zap.String("queue", q.name), zap.Error(err))
		return nil, false
	}
	return r, true
}

// acquire returns a lease handle on KubeMQ channel ch when this replica
// holds it (claiming it if nobody does), or a client of the replica that
// does. While neither is possible (a dead holder's hold has not lapsed, or
// the holder cannot be reached) it retries for up to wait, then returns
// the lease engine's ErrNotOwner.
func (s *Server) acquire(ctx context.Context, ch string, wait time.Duration, stop <-chan struct{}) (*delivery.Handle, peerpb.AMQPPeerClient, error) {
	deadline := time.Now().Add(wait)
	for {
		h, err := s.deliveries.Acquire(ctx, ch)
		if err == nil {
			return h, nil, nil
		}
		if !errors.Is(err, delivery.ErrNotOwner) {
			return nil, nil, err
		}
		if pc, ok := s.remote(ch); ok {
			return nil, pc, nil
		}
		if time.Now().After(deadline) {
			return nil, nil, err
		}
		select {
		case <-time.After(linkRetry):
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-stop:
			return nil, nil, context.Canceled
		}
	}
}

// heldHandle returns the channel's lease handle on q, if it has one that is
// still usable; one on a holding this replica lost since (another replica
// claimed q) is dropped.
func (ch *channel) heldHandle(q *queue) *delivery.Handle {
	h := ch.handles[q]
	if h == nil || h.Usable() {
		return h
	}
	delete(ch.handles, q)
	h.Close()
	return nil
}

// resolve returns the channel's lease handle on q when this replica holds
// q (acquired once per channel), or a client of the replica that does.
func (ch *channel) resolve(q *queue) (*delivery.Handle, peerpb.AMQPPeerClient, error) {
	if h := ch.heldHandle(q); h != nil {
		return h, nil, nil
	}
	q.markUsed()
	h, pc, err := ch.c.srv.acquire(ch.c.ctx, q.channel, ownerWait, nil)
	if err != nil {
		switch {
		case errors.Is(err, delivery.ErrClosed), ch.c.ctx.Err() != nil:
			return nil, nil, errShutdown()
		case errors.Is(err, delivery.ErrNotOwner):
			return nil, nil, wire.ConnectionForced("queue %s is consumed through another kubemq-proxy replica, which this one cannot reach (cluster.listen, cluster.advertise, cluster.secret)", q.name)
		}
		return nil, nil, err
	}
	if h != nil {
		ch.handles[q] = h
	}
	return h, pc, nil
}

// fwdLink is this replica's side of a link to the replica that holds a
// queue: one forwarded consumer, or one channel's basic.get calls on q.
type fwdLink struct {
	s      *Server
	ch     *channel
	q      *queue
	cs     *consumer // nil for a get link
	stream peerpb.AMQPPeer_LinkClient
	end    context.CancelFunc // tears the stream down

	smu      sync.Mutex  // serialises Send
	pmu      sync.Mutex  // guards pend
	pend     [4][]uint64 // settlements not sent yet, by Settle_Op (ACK, REQUEUE, REJECT, RETURN)
	once     sync.Once
	finished chan struct{} // closed once the stream has ended (its reader saw the end)
	// readAhead: the holder takes Settle RETURN and Credit.buffered
	// (Opened.read_ahead), so the consumer may read ahead (see grant).
	readAhead bool
	// holderAcks: the holder settles this no-ack consumer's deliveries as
	// it sends them (Opened.no_ack); this side sends no Settle for them.
	holderAcks bool
	// grantDue: the client freed slots since the channel last flushed l;
	// flushLinks tops up the holder's credit after the settlements (the
	// channel's goroutine).
	grantDue bool

	// Guarded by ch.dmu.
	inflight  int           // credit granted and not used yet
	held      int           // the client's unacknowledged deliveries of this link
	cancelled bool          // the consumer was cancelled: close once held is 0
	cancelOk  chan struct{} // closed when the holder confirmed the cancel
	closed    bool
	buf       []fwdBuffered // read ahead: delivered by the holder, not yet to the client (oldest first)
	paused    bool          // the read-ahead went stale and was returned: none until the client runs short
	stale     *time.Timer   // checks the age of buf's head
	reported  int           // len(buf) as last told to the holder (Credit.buffered)
	report    *time.Timer   // tells the holder len(buf) when it changed
}

// fwdBuffered is one delivery in a forwarded consumer's read-ahead.
type fwdBuffered struct {
	d             *peerpb.Delivery
	exchange, key string
	props         wire.Properties
	at            time.Time
}

// Read-ahead of a forwarded consumer. Granting the holder only what the
// client's prefetch leaves makes each freed slot wait for the link's round
// trip; so a consumer with a prefetch (acknowledging, without a channel-wide
// prefetch) grants up to fwdReadAheadMax more (at most its prefetch again),
// and what comes beyond the client's window waits in the link's buffer,
// handed to the client as it acknowledges. The client never has more than
// its prefetch. The buffer is not the client's: a cancel, a channel or
// connection closing return it to the holder (Settle RETURN: back in place,
// not redelivered), the holder counts it as ready in message counts
// (Credit.buffered), and a buffer whose oldest delivery waited
// fwdReadAheadHold (the client is slower than the link: reading ahead gains
// nothing and would keep messages from the queue's other consumers) goes
// back too, the read-ahead paused until the client has used half its
// prefetch.
const (
	fwdReadAheadMax = 256
	// fwdReportWait delays telling the holder how much is buffered, so
	// that one report covers many changes.
	fwdReportWait = 20 * time.Millisecond
)

// fwdReadAheadHold: a variable for the tests alone.
var fwdReadAheadHold = 50 * time.Millisecond

// errLinkCancelled carries the reason the holder ended a consumer.
type errLinkCancelled struct{ reason string }

func (e errLinkCancelled) Error() string {
	return "consumer cancelled by the queue's holder: " + e.reason
}

// openLink opens a link to pc for q and waits for the holder's answer.
// Refusals come back as AMQP errors (403 exclusive use, 404 no queue);
// anything else means the holder should be resolved again.
func (ch *channel) openLink(pc peerpb.AMQPPeerClient, q *queue, cs *consumer) (*fwdLink, error) {
	s := ch.c.srv
	// Not bound to the connection: a channel that closes first sends its
	// last settlements, then ends the link (close).
	ctx, end := context.WithCancel(context.Background())
	open := &peerpb.Open{Queue: q.ref()}
	credit := 0
	if cs != nil {
		ch.dmu.Lock()
		credit = max(creditFor(cs, 0), 0)
		ch.dmu.Unlock()
		open.Consume, open.ConsumerTag, open.Exclusive, open.Priority, open.Credit = true, cs.tag, cs.exclusive, cs.priority, uint32(credit)
		open.SingleActive = q.singleActive
		open.Batch = true
		open.NoAck = cs.noAck
		if !cs.noAck {
			open.Prefetch = uint32(cs.prefetch)
		}
	}
	timer := time.AfterFunc(ownerWait, end) // a holder that does not answer
	stream, err := pc.Link(ctx)
	if err == nil {
		err = stream.Send(&peerpb.LinkRequest{Kind: &peerpb.LinkRequest_Open{Open: open}})
	}
	var resp *peerpb.LinkResponse
	if err == nil {
		resp, err = stream.Recv()
	}
	timer.Stop()
	if err == nil && resp.GetOpened() == nil {
		err = status.Error(codes.Internal, "kubemq-proxy: the queue's holder did not open the link")
	}
	if err != nil {
		end()
		switch status.Code(err) {
		case codes.PermissionDenied:
			return nil, wire.AccessRefused("%s", status.Convert(err).Message())
		case codes.NotFound:
			return nil, errNoQueue(q.name, ch.c.vhostName)
		}
		return nil, err
	}
	l := &fwdLink{s: s, ch: ch, q: q, cs: cs, stream: stream, end: end, finished: make(chan struct{}), inflight: credit,
		readAhead: resp.GetOpened().GetReadAhead(), holderAcks: cs != nil && cs.noAck && resp.GetOpened().GetNoAck()}
	ch.dmu.Lock()
	if ch.stopped {
		ch.dmu.Unlock()
		end()
		return nil, errShutdown()
	}
	ch.fwdInflight += credit
	ch.links[l] = struct{}{}
	ch.dmu.Unlock()
	return l, nil
}

// send sends r after the settlements waiting to go.
func (l *fwdLink) send(r *peerpb.LinkRequest) error {
	l.smu.Lock()
	defer l.smu.Unlock()
	if err := l.flushLocked(); err != nil {
		return err
	}
	return l.stream.Send(r)
}

// settle adds settlements to those waiting to go: they leave with the
// link's next request, or when whoever settled flushes (the channel after
// each settling command, the link's reader after each response, so that
// one response's no-ack deliveries are acked in one Settle). A link that
// ended drops them (the holder has put those deliveries back already).
func (l *fwdLink) settle(op peerpb.Settle_Op, keys ...uint64) {
	if len(keys) == 0 {
		return
	}
	l.pmu.Lock()
	l.pend[op] = append(l.pend[op], keys...)
	l.pmu.Unlock()
}

// flush sends the settlements waiting to go.
func (l *fwdLink) flush() {
	l.smu.Lock()
	defer l.smu.Unlock()
	_ = l.flushLocked()
}

// flushLocked is flush under smu.
func (l *fwdLink) flushLocked() error {
	l.pmu.Lock()
	pend := l.pend
	l.pend = [len(l.pend)][]uint64{}
	l.pmu.Unlock()
	for op, keys := range pend {
		if len(keys) == 0 {
			continue
		}
		if err := l.stream.Send(&peerpb.LinkRequest{Kind: &peerpb.LinkRequest_Settle{Settle: &peerpb.Settle{Op: peerpb.Settle_Op(op), Keys: keys}}}); err != nil {
			return err
		}
	}
	return nil
}

// grant hands the client what its window takes from the read-ahead, then
// tops up the holder's credit for l's consumer to what the client's
// prefetch (and the read-ahead) allows. The channel calls it for its acks
// once it has no command queued (flushLinks), the link's reader after each
// response. A consumer with a prefetch and no read-ahead gets each slot
// its client frees in the next grant: holding credit back
// until a quarter of the prefetch was free left the client idle for the
// link's round trip (BenchmarkFleet, a forwarded consumer with prefetch
// 100: 0.47-0.73x of one on the holder in quarters, 0.59-0.85x slot by
// slot, same runs); with a read-ahead the buffer covers the round trip, and
// credit goes in quarters of it. One without a prefetch tops up in quarters
// of fetchBatch, to save messages.
func (l *fwdLink) grant() {
	cs, ch := l.cs, l.ch
	if cs == nil {
		return
	}
	ch.dmu.Lock()
	if cs.stopped || ch.stopped || l.closed || cs.fwd != l {
		ch.dmu.Unlock()
		return
	}
	l.handLocked()
	if l.paused && len(l.buf) == 0 && cs.outstanding <= int(cs.prefetch)/2 {
		l.paused = false // the client runs short: read ahead again
	}
	want := creditFor(cs, l.inflight+len(l.buf))
	step := fetchBatch / 4
	if !cs.noAck && cs.prefetch > 0 {
		step = 1
	}
	if extra := l.extraLocked(); extra > 0 {
		want = min(2*fetchBatch-l.inflight-len(l.buf), want+extra)
		step = max(1, extra/4)
		if len(l.buf) > 0 && want < step {
			l.reportLocked()
			ch.dmu.Unlock()
			return
		}
	}
	if want <= 0 || (l.inflight > 0 && want < step) {
		l.reportLocked()
		ch.dmu.Unlock()
		return
	}
	l.inflight += want
	ch.fwdInflight += want
	buffered := len(l.buf)
	l.reported = buffered
	ch.dmu.Unlock()
	_ = l.send(&peerpb.LinkRequest{Kind: &peerpb.LinkRequest_Credit{Credit: &peerpb.Credit{Add: uint32(want), Buffered: uint32(buffered)}}})
}

// extraLocked is how far l's consumer may read ahead now. Under ch.dmu.
func (l *fwdLink) extraLocked() int {
	cs := l.cs
	if !l.readAhead || l.paused || l.cancelled || cs.noAck || cs.prefetch == 0 || l.ch.globalPrefetch > 0 {
		return 0
	}
	return min(2*int(cs.prefetch), fwdReadAheadMax)
}

// windowLocked reports whether l's client may take one more delivery.
// Under ch.dmu.
func (l *fwdLink) windowLocked() bool {
	cs, ch := l.cs, l.ch
	if cs.noAck {
		return true
	}
	if cs.prefetch > 0 && cs.outstanding >= int(cs.prefetch) {
		return false
	}
	g := ch.globalPrefetch
	return g == 0 || len(ch.unacked)-ch.voided < int(g)
}

// handLocked passes the read-ahead to the client while its window takes
// it. Under ch.dmu.
func (l *fwdLink) handLocked() {
	n := 0
	for n < len(l.buf) && l.windowLocked() {
		b := l.buf[n]
		l.buf[n] = fwdBuffered{}
		l.handOutLocked(b.d, b.exchange, b.key, &b.props) // b is a copy: the writer keeps &b.props
		n++
	}
	if n > 0 {
		l.buf = l.buf[n:]
		if len(l.buf) == 0 {
			l.buf = nil
		}
	}
}

// handOutLocked sends d to the client with the channel's next delivery
// tag. Under ch.dmu.
func (l *fwdLink) handOutLocked(d *peerpb.Delivery, exchange, key string, props *wire.Properties) {
	cs, ch := l.cs, l.ch
	ch.nextTag++
	tag := ch.nextTag
	if !cs.noAck {
		ch.unacked[tag] = &unacked{fwd: l, key: d.Key, cons: cs, queue: cs.q, tag: tag}
		ch.order = append(ch.order, tag)
		cs.outstanding++
		l.held++
	}
	ch.c.srv.m.delivered.Inc()
	ch.c.srv.m.firstForwarded(d.StoredAt)
	cs.q.delivered(len(d.Body))
	ch.c.w.send(outFrame{channel: ch.id, m: &wire.BasicDeliver{ConsumerTag: cs.tag, DeliveryTag: tag,
		Redelivered: d.Redelivered, Exchange: exchange, RoutingKey: key}, props: props, body: d.Body})
}

// takeBufLocked empties the read-ahead and returns its keys. Under ch.dmu.
func (l *fwdLink) takeBufLocked() []uint64 {
	if len(l.buf) == 0 {
		return nil
	}
	keys := make([]uint64, len(l.buf))
	for i := range l.buf {
		keys[i] = l.buf[i].d.Key
	}
	l.buf = nil
	return keys
}

// returnOp is how l gives back deliveries no client saw.
func (l *fwdLink) returnOp() peerpb.Settle_Op {
	if l.readAhead {
		return peerpb.Settle_RETURN
	}
	return peerpb.Settle_REQUEUE // a holder of an earlier version
}

// checkStale returns the read-ahead to the holder when its oldest delivery
// waited fwdReadAheadHold (a timer's goroutine).
func (l *fwdLink) checkStale() {
	ch := l.ch
	ch.dmu.Lock()
	l.stale = nil
	if l.closed || len(l.buf) == 0 {
		ch.dmu.Unlock()
		return
	}
	if wait := fwdReadAheadHold - time.Since(l.buf[0].at); wait > 0 {
		l.stale = time.AfterFunc(wait, l.checkStale)
		ch.dmu.Unlock()
		return
	}
	keys := l.takeBufLocked()
	l.paused = true
	l.reported = 0
	ch.dmu.Unlock()
	l.settle(peerpb.Settle_RETURN, keys...)
	_ = l.send(&peerpb.LinkRequest{Kind: &peerpb.LinkRequest_Credit{Credit: &peerpb.Credit{}}}) // buffered 0
	// The credit they used is granted again once the client runs short.
}

// reportLocked makes sure the holder learns len(buf) soon when it changed
// since the last report. Under ch.dmu.
func (l *fwdLink) reportLocked() {
	if !l.readAhead || l.closed || l.report != nil || len(l.buf) == l.reported {
		return
	}
	l.report = time.AfterFunc(fwdReportWait, func() {
		ch := l.ch
		ch.dmu.Lock()
		l.report = nil
		n := len(l.buf)
		if l.closed || n == l.reported {
			ch.dmu.Unlock()
			return
		}
		l.reported = n
		ch.dmu.Unlock()
		_ = l.send(&peerpb.LinkRequest{Kind: &peerpb.LinkRequest_Credit{Credit: &peerpb.Credit{Buffered: uint32(n)}}})
	})
}

// creditFor is how much more credit a forwarded consumer's link may grant
// when inflight is already granted and unused: the local consumer's rule
// (creditLocked), counting what is granted as held. Under ch.dmu.
func creditFor(cs *consumer, inflight int) int {
	ch := cs.ch
	n := fetchBatch - inflight
	if cs.noAck {
		return n
	}
	if cs.prefetch > 0 {
		n = min(n, int(cs.prefetch)-cs.outstanding-inflight)
	}
	if g := ch.globalPrefetch; g > 0 {
		n = min(n, int(g)-(len(ch.unacked)-ch.voided)-ch.fwdInflight)
	}
	return n
}

// cancel tells the holder the consumer was cancelled and waits (at most
// drainWait) until the holder confirms that no delivery will follow, so the
// consumer is gone cluster-wide when basic.cancel-ok goes out (an exclusive
// consumer no longer excludes). The link stays for the settlements of what
// the client holds.
func (l *fwdLink) cancel() {
	l.ch.dmu.Lock()
	if l.cancelled {
		l.ch.dmu.Unlock()
		return
	}
	l.cancelled = true
	l.cancelOk = make(chan struct{})
	ok := l.cancelOk
	idle := l.held == 0
	back := l.takeBufLocked() // no client saw them
	l.reported = 0            // the holder counts what comes back
	l.ch.dmu.Unlock()
	l.settle(l.returnOp(), back...)
	if l.send(&peerpb.LinkRequest{Kind: &peerpb.LinkRequest_Cancel{Cancel: &peerpb.Cancel{}}}) == nil {
		t := time.NewTimer(drainWait)
		select {
		case <-ok:
		case <-l.finished:
		case <-t.C:
		}
		t.Stop()
	}
	if idle {
		l.close()
	}
}

// close ends l: what the holder still has out goes back to the queue. The
// holder answers the end of the requests with the end of the stream; a
// holder that does not is cut off after drainWait.
func (l *fwdLink) close() {
	l.ch.dmu.Lock()
	if l.closed {
		l.ch.dmu.Unlock()
		return
	}
	l.closed = true
	l.ch.fwdInflight -= l.inflight
	l.inflight = 0
	delete(l.ch.links, l)
	back := l.takeBufLocked()
	l.reported = 0
	for _, t := range []*time.Timer{l.stale, l.report} {
		if t != nil {
			t.Stop()
		}
	}
	l.stale, l.report = nil, nil
	l.ch.dmu.Unlock()
	l.settle(l.returnOp(), back...) // no client saw them
	l.smu.Lock()
	_ = l.flushLocked()
	_ = l.stream.CloseSend()
	l.smu.Unlock()
	time.AfterFunc(drainWait, l.end)
	if l.cs == nil {
		// Nobody reads a get link between calls: read its end here.
		s := l.s
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer l.ended()
			for {
				if _, err := l.stream.Recv(); err != nil {
					return
				}
			}
		}()
	}
}

// void marks the client's deliveries of l, whose link broke, as void: the
// holder gives them back to the queue (or its lease records do), so they
// come again; they no longer count against the consumer's prefetch, and
// their settlements go nowhere (tags stay valid, as the client holds them).
func (l *fwdLink) void() {
	ch := l.ch
	ch.dmu.Lock()
	defer ch.dmu.Unlock()
	l.buf = nil // the holder puts them back
	if l.held == 0 {
		return
	}
	for _, u := range ch.unacked {
		if u.fwd == l && !u.void {
			ch.voidLocked(u)
		}
	}
}

// ended records that l's stream has ended, and releases it.
func (l *fwdLink) ended() {
	l.once.Do(func() { close(l.finished) })
	l.end()
}

// deliver passes a delivery of the holder to the client, as the
// dispatcher does for a local one, or keeps it in the read-ahead while the
// client's window is full (the link's goroutine).
func (l *fwdLink) deliver(d *peerpb.Delivery) {
	cs, ch := l.cs, l.ch
	exchange, key, props := decodeMessage(cs.q.name, d.Metadata, d.Tags)
	ch.dmu.Lock()
	if l.inflight > 0 {
		l.inflight--
		ch.fwdInflight--
	}
	if cs.stopped || ch.stopped || cs.fwd != l || l.closed {
		ch.dmu.Unlock()
		l.settle(l.returnOp(), d.Key)
		return
	}
	if l.readAhead && (len(l.buf) > 0 || !l.windowLocked()) {
		l.buf = append(l.buf, fwdBuffered{d: d, exchange: exchange, key: key, props: props, at: time.Now()})
		if l.stale == nil {
			l.stale = time.AfterFunc(fwdReadAheadHold, l.checkStale)
		}
		l.reportLocked() // the holder counts it as ready
		ch.dmu.Unlock()
		return
	}
	l.handOutLocked(d, exchange, key, &props)
	ch.dmu.Unlock()
	if cs.noAck && !l.holderAcks {
		l.settle(peerpb.Settle_ACK, d.Key) // a holder of an earlier version
	}
}

// run passes the holder's deliveries to the client until the link ends.
func (l *fwdLink) run() error {
	l.grant()
	for {
		resp, err := l.stream.Recv()
		if err != nil {
			return err
		}
		switch k := resp.Kind.(type) {
		case *peerpb.LinkResponse_Delivery:
			l.deliver(k.Delivery)
			l.grant()
			l.flush()
		case *peerpb.LinkResponse_Deliveries:
			for _, d := range k.Deliveries.Items {
				l.deliver(d)
			}
			l.grant()
			l.flush() // no-ack acks, and returns of what came too late
		case *peerpb.LinkResponse_Cancelled:
			l.ch.dmu.Lock()
			ok := l.cancelOk
			l.cancelOk = nil
			l.ch.dmu.Unlock()
			if ok != nil { // the client cancelled: the holder confirms
				close(ok)
				continue
			}
			return errLinkCancelled{reason: k.Cancelled.Reason}
		}
	}
}

// goForward runs a forwarded consumer on a tracked goroutine: its link (l,
// or a fresh one when l is nil), and whatever follows when the link ends.
func (s *Server) goForward(cs *consumer, l *fwdLink, done <-chan struct{}) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.forward(cs, l, done)
	}()
}

func (s *Server) forward(cs *consumer, l *fwdLink, done <-chan struct{}) {
	ch, q := cs.ch, cs.q
	for {
		if l != nil {
			err := l.run()
			l.close()
			l.ended()
			var ce errLinkCancelled
			if errors.As(err, &ce) {
				ch.post(func() { ch.cancelByServer(cs, ce.reason) })
				return
			}
			s.log.Debug("forwarded consumer's link ended", zap.String("queue", q.name), zap.String("tag", cs.tag), zap.Error(err))
			l.void()
			l = nil
		}
		select {
		case <-done:
			return
		default:
		}
		since := time.Now()
		h, pc, err := s.acquire(ch.c.ctx, q.channel, ownerWait, done)
		switch {
		case err != nil:
			if errors.Is(err, delivery.ErrNotOwner) {
				ch.c.fail(wire.ConnectionForced("queue %s is consumed through another kubemq-proxy replica, which this one cannot reach (cluster.listen, cluster.advertise, cluster.secret)", q.name))
			}
			return
		case h != nil:
			s.log.Info("forwarded consumer is served here now", zap.String("queue", q.name), zap.String("tag", cs.tag), zap.Duration("after", time.Since(since)))
			if !s.serveHere(cs, h, done) {
				return
			}
			continue // this replica lost the queue again: resolve the holder anew
		}
		nl, err := ch.openLink(pc, q, cs)
		var ae *wire.Error
		if errors.As(err, &ae) {
			if ae.Code == wire.ReplyAccessRefused || ae.Code == wire.ReplyNotFound {
				ch.post(func() { ch.cancelByServer(cs, ae.Text) })
			}
			return
		}
		if err != nil {
			select {
			case <-time.After(linkRetry):
			case <-done:
				return
			}
			continue
		}
		ch.dmu.Lock()
		if cs.stopped {
			ch.dmu.Unlock()
			nl.close()
			nl.ended()
			return
		}
		cs.fwd = nl
		ch.dmu.Unlock()
		l = nl
	}
}

// serveHere makes a forwarded consumer a consumer of this replica's
// dispatcher once this replica holds its queue, until it stops (false),
// or until this replica loses the queue (true: the consumer is detached,
// for the caller to resolve the holder anew).
func (s *Server) serveHere(cs *consumer, h *delivery.Handle, done <-chan struct{}) (lost bool) {
	defer h.Close()
	ch, q := cs.ch, cs.q
	ch.dmu.Lock()
	if cs.stopped {
		ch.dmu.Unlock()
		return
	}
	moved := make(chan struct{})
	cs.h, cs.fwd, cs.moved = h, nil, moved
	ch.dmu.Unlock()
	q.vh.mu.Lock()
	if _, ok := q.consumers[cs]; !ok || q.deleted {
		q.vh.mu.Unlock()
		return
	}
	if q.disp == nil {
		q.disp = newDispatcher(s, q)
	}
	cs.d = q.disp
	// Added under the lock, so that a dispatcher that loses the queue meanwhile either retires
	// first (q.disp is then another) or evicts cs (failConsumers, relocate closes moved).
	cs.d.add(cs)
	q.vh.mu.Unlock()
	select {
	case <-done:
		return false
	case <-moved:
	}
	ch.detach(cs)
	return true
}

// getForwarded is basic.get of a queue another replica holds, over the
// channel's get link to it.
func (ch *channel) getForwarded(q *queue, pc peerpb.AMQPPeerClient, m *wire.BasicGet) error {
	if err := ch.awaitPublishes(); err != nil {
		return err
	}
	for attempt := 0; ; attempt++ {
		l := ch.getLinks[q]
		var err error
		if l == nil {
			if l, err = ch.openLink(pc, q, nil); err == nil {
				ch.getLinks[q] = l
			}
		}
		var resp *peerpb.LinkResponse
		if err == nil {
			t := time.AfterFunc(getWait+ownerWait, l.end)
			if err = l.send(&peerpb.LinkRequest{Kind: &peerpb.LinkRequest_Get{Get: &peerpb.Get{}}}); err == nil {
				resp, err = l.stream.Recv()
			}
			t.Stop()
			if err != nil {
				delete(ch.getLinks, q)
				l.close()
			}
		}
		var ae *wire.Error
		if errors.As(err, &ae) {
			return ae
		}
		if err != nil {
			if attempt > 0 || ch.c.ctx.Err() != nil {
				return wire.ConnectionForced("basic.get of queue %s through another kubemq-proxy replica failed: %v", q.name, err)
			}
			// The holder changed: resolve it again (or take the queue).
			var h *delivery.Handle
			if h, pc, err = ch.resolve(q); err != nil {
				return err
			}
			if h != nil {
				return ch.getHere(q, h, m)
			}
			continue
		}
		d := resp.GetDelivery()
		if d == nil {
			ch.send(&wire.BasicGetEmpty{})
			return nil
		}
		exchange, key, props := decodeMessage(q.name, d.Metadata, d.Tags)
		ch.dmu.Lock()
		ch.nextTag++
		tag := ch.nextTag
		if !m.NoAck {
			ch.unacked[tag] = &unacked{fwd: l, key: d.Key, queue: q, tag: tag}
			ch.order = append(ch.order, tag)
			l.held++
		}
		ch.c.srv.m.delivered.Inc()
		ch.c.srv.m.firstForwarded(d.StoredAt)
		q.delivered(len(d.Body))
		ch.c.w.send(outFrame{channel: ch.id, m: &wire.BasicGetOk{DeliveryTag: tag, Redelivered: d.Redelivered, Exchange: exchange,
			RoutingKey: key, MessageCount: d.MessageCount}, props: &props, body: d.Body})
		ch.dmu.Unlock()
		if m.NoAck {
			l.settle(peerpb.Settle_ACK, d.Key)
			l.flush()
		}
		return nil
	}
}

// closeLinks ends the channel's links (channel shutdown, after its
// settlements went out) and waits until the holders have put back what the
// links had out (RabbitMQ has requeued a closed channel's deliveries when
// close-ok goes out), at most drainWait.
func (ch *channel) closeLinks() {
	ch.dmu.Lock()
	ls := make([]*fwdLink, 0, len(ch.links))
	for l := range ch.links {
		ls = append(ls, l)
	}
	ch.dmu.Unlock()
	for _, l := range ls {
		l.close()
	}
	clear(ch.getLinks)
	if len(ls) == 0 {
		return
	}
	t := time.NewTimer(drainWait)
	defer t.Stop()
	for _, l := range ls {
		select {
		case <-l.finished:
		case <-t.C:
			return
		}
	}
}
