package kubemqclient

import (
	"context"
	"errors"
	"math"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"

	pb "github.com/kubemq-io/kubemq-proxy/kubemqpb"
)

// Downstream is one QueuesDownstream stream: Get opens a transaction, and
// the settlement methods settle it. A transaction belongs to the stream
// that opened it (docs/kubemq.md 8.1), so settle on the same Downstream and
// keep it open while its transactions are.
//
// The server answers Get and ActiveOffsets, but answers settlements only when
// they fail, and handles one stream's requests one at a time, in order. So
// settlements are fire-and-forget writes; their failures arrive later and
// are reported on Errors() and by the next Sync. A Get waiting on the server
// delays every request behind it on the same stream (8.3).
type Downstream struct {
	c      *Client
	stream grpc.BidiStreamingClient[pb.QueuesDownstreamRequest, pb.QueuesDownstreamResponse]
	cancel context.CancelFunc
	done   chan struct{} // closed when the reader exits; dead is set then
	errs   chan error

	// sendMu serialises stream.Send together with the fifo append, so the
	// fifo is in send order.
	sendMu sync.Mutex

	mu       sync.Mutex // guards everything below
	fifo     []*dsReq   // sent, not yet known to be processed, in send order
	open     map[string]*dsTx
	failures []error // settlement failures since the last Sync
	dead     error
	closing  bool
	lastTx   string
	maxWait  time.Duration // longest Get wait used; bounds Close's wait
	gets     int64         // Gets sent on this stream
	closeErr error
	closed   chan struct{} // closed when Close has finished
}

// dsReq is one request in flight; reply is nil for fire-and-forget ones.
type dsReq struct {
	id        string
	typ       pb.QueuesDownstreamRequestType
	txID      string
	autoAck   bool
	reply     chan dsReply // cap 1
	popped    bool         // the reader has matched it (guarded by Downstream.mu)
	abandoned bool         // the caller stopped waiting (guarded by Downstream.mu)
	collect   bool         // take the failures recorded before it (Sync)
}

type dsReply struct {
	resp     *pb.QueuesDownstreamResponse
	failures []error
	err      error
}

// dsTx tracks what this stream still holds in an open transaction.
type dsTx struct {
	unsettled map[uint64]struct{}
}

// GetRequest asks for up to MaxItems messages from Channel.
type GetRequest struct {
	Channel  string
	MaxItems int           // at least 1
	Wait     time.Duration // how long the server waits for MaxItems; at least 1 s (raised)
	AutoAck  bool          // settle at once: a destructive read with no transaction to settle
}

// Transaction is the result of one Get. Messages have distinct sequences.
type Transaction struct {
	ID       string
	Channel  string
	Messages []QueueMessage
}

// OpenDownstream opens a downstream stream. ctx bounds only the opening: the
// stream lives until Close or Client.Close, because cancelling it with a Get
// outstanding can strand messages on the server (docs/kubemq.md 8.7).
func (c *Client) OpenDownstream(ctx context.Context) (*Downstream, error) {
	const op = "OpenDownstream"
	if c.isClosed() {
		return nil, closedErr(op)
	}
	if err := ctx.Err(); err != nil {
		return nil, wrapErr(op, err)
	}
	sctx, cancel := context.WithCancel(c.ctx)
	t := c.startOp()
	stream, err := c.rpc.QueuesDownstream(sctx)
	if err != nil {
		cancel()
		err = c.observe(wrapErr(op, err))
		t.end(OpDownstreamOpen, err)
		return nil, err
	}
	t.end(OpDownstreamOpen, nil)
	d := &Downstream{
		c: c, stream: stream, cancel: cancel,
		done:   make(chan struct{}),
		errs:   make(chan error, 64),
		open:   map[string]*dsTx{},
		closed: make(chan struct{}),
	}
	if !c.track(d) {
		cancel()
		return nil, closedErr(op)
	}
	c.goTracked(d.read)
	return d, nil
}

// Errors delivers settlement failures (each an *Error whose Op names the
// settlement) as they arrive. Failures are dropped here if nobody reads;
// Sync reports them too.
func (d *Downstream) Errors() <-chan error { return d.errs }

// Done is closed when the stream has ended; Err then says why.
func (d *Downstream) Done() <-chan struct{} { return d.done }

// Err is why the stream ended (nil while it is up).
func (d *Downstream) Err() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.dead
}

// Gets counts the Gets sent on this stream. The real server keeps every
// transaction of a stream, completed or not, until the stream ends
// (docs/kubemq.md 8.1), so a long-lived poller should replace its stream now
// and then, when it holds nothing.
func (d *Downstream) Gets() int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.gets
}

// OpenTransactions returns the ids of transactions with messages this stream
// still holds unsettled.
func (d *Downstream) OpenTransactions() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	ids := make([]string, 0, len(d.open))
	for id := range d.open {
		ids = append(ids, id)
	}
	return ids
}

// send writes req and records it in the fifo. internal requests are allowed
// while closing.
func (d *Downstream) send(op string, req *pb.QueuesDownstreamRequest, r *dsReq, internal bool) error {
	req.RequestID = d.c.ids.next()
	req.ClientID = d.c.clientID
	r.id, r.typ, r.txID = req.RequestID, req.RequestTypeData, req.RefTransactionId
	d.sendMu.Lock()
	defer d.sendMu.Unlock()
	d.mu.Lock()
	if d.dead != nil {
		err := d.dead
		d.mu.Unlock()
		return err
	}
	if d.closing && !internal {
		d.mu.Unlock()
		return closedErr(op)
	}
	d.fifo = append(d.fifo, r)
	d.settleLocked(req)
	d.mu.Unlock()
	if err := d.stream.Send(req); err != nil {
		// The reader sees the real cause; fail now with what we have.
		d.fail(d.c.observe(wrapErr(op, err)))
		d.mu.Lock()
		defer d.mu.Unlock()
		return d.dead
	}
	return nil
}

// settleLocked updates the open-transaction table for a settlement.
func (d *Downstream) settleLocked(req *pb.QueuesDownstreamRequest) {
	tx := d.open[req.RefTransactionId]
	if tx == nil {
		return
	}
	switch req.RequestTypeData {
	case pb.QueuesDownstreamRequestType_AckAll, pb.QueuesDownstreamRequestType_NAckAll,
		pb.QueuesDownstreamRequestType_ReQueueAll, pb.QueuesDownstreamRequestType_CloseByClient:
		delete(d.open, req.RefTransactionId)
	case pb.QueuesDownstreamRequestType_AckRange, pb.QueuesDownstreamRequestType_NAckRange,
		pb.QueuesDownstreamRequestType_ReQueueRange:
		for _, s := range req.SequenceRange {
			delete(tx.unsettled, uint64(s))
		}
		if len(tx.unsettled) == 0 {
			delete(d.open, req.RefTransactionId)
		}
	}
}

// call sends a request that the server answers and waits for the answer.
func (d *Downstream) call(ctx context.Context, op string, req *pb.QueuesDownstreamRequest, r *dsReq, internal bool) (dsReply, error) {
	r.reply = make(chan dsReply, 1)
	if err := d.send(op, req, r, internal); err != nil {
		return dsReply{}, err
	}
	select {
	case rep := <-r.reply:
		return rep, rep.err
	case <-ctx.Done():
		d.mu.Lock()
		if !r.popped {
			r.abandoned = true
			d.mu.Unlock()
			return dsReply{}, wrapErr(op, ctx.Err())
		}
		d.mu.Unlock()
		// The answer is being delivered: take it so a Get's transaction is
		// not left open.
		rep := <-r.reply
		if rep.err == nil && r.typ == pb.QueuesDownstreamRequestType_Get {
			d.abandonTx(rep.resp)
		}
		return dsReply{}, wrapErr(op, ctx.Err())
	}
}

// abandonTx closes the transaction of a Get whose caller has gone away, so
// its messages go back to the queue.
func (d *Downstream) abandonTx(resp *pb.QueuesDownstreamResponse) {
	if resp.GetIsError() || len(resp.GetMessages()) == 0 {
		return
	}
	d.mu.Lock()
	_, open := d.open[resp.GetTransactionId()]
	d.mu.Unlock()
	if open {
		_ = d.send("CloseByClient", &pb.QueuesDownstreamRequest{
			RequestTypeData: pb.QueuesDownstreamRequestType_CloseByClient, RefTransactionId: resp.GetTransactionId(),
		}, &dsReq{}, true)
	}
}

// Get asks for up to MaxItems messages and returns them as a transaction
// (possibly empty; an empty one holds nothing and needs no settlement). It
// returns when MaxItems are in hand or after Wait. If ctx ends first, the
// transaction is closed when its answer arrives. Repeated sequences in the
// server's answer are removed.
func (d *Downstream) Get(ctx context.Context, g GetRequest) (*Transaction, error) {
	const op = "Get"
	if err := ValidChannel(g.Channel); err != nil {
		return nil, err
	}
	if g.MaxItems < 1 || g.MaxItems > math.MaxInt32 {
		return nil, invalidArg(op, "MaxItems must be at least 1", nil)
	}
	if g.Wait < 0 || g.Wait/time.Millisecond > math.MaxInt32 {
		return nil, invalidArg(op, "Wait out of range", nil)
	}
	wait := max(g.Wait, time.Second)
	d.mu.Lock()
	d.maxWait = max(d.maxWait, wait)
	d.gets++
	d.mu.Unlock()
	t := d.c.startOp()
	rep, err := d.call(ctx, op, &pb.QueuesDownstreamRequest{
		RequestTypeData: pb.QueuesDownstreamRequestType_Get,
		Channel:         g.Channel,
		MaxItems:        int32(g.MaxItems),
		WaitTimeout:     int32(wait / time.Millisecond),
		AutoAck:         g.AutoAck,
	}, &dsReq{autoAck: g.AutoAck}, false)
	if err == nil && rep.resp.GetIsError() {
		err = inBand(op, rep.resp.GetError())
	}
	t.end(OpDownstreamGet, err)
	if err != nil {
		return nil, err
	}
	tx := &Transaction{ID: rep.resp.GetTransactionId(), Channel: g.Channel}
	if len(rep.resp.GetMessages()) == 0 && tx.ID != "" {
		// A Get whose slots went to expired messages answers empty at once and keeps its
		// transaction open on the real server, where it swallows the next messages of the
		// queue until it is settled (docs/kubemq.md 5.9). Close every empty one: after a Get
		// that merely waited, the transaction is already closed and the server ignores this.
		if err := d.send("Get", &pb.QueuesDownstreamRequest{
			RequestTypeData: pb.QueuesDownstreamRequestType_CloseByClient, RefTransactionId: tx.ID,
		}, &dsReq{}, false); err != nil {
			return nil, err
		}
	}
	tx.Messages = make([]QueueMessage, 0, len(rep.resp.GetMessages()))
	for _, m := range rep.resp.GetMessages() {
		tx.Messages = append(tx.Messages, queueMessageFromPB(m))
	}
	tx.Messages = DedupeSequences(tx.Messages)
	return tx, nil
}

// Sequences returns the Attributes.Sequence of each message, for AckRange
// and its kin.
func Sequences(msgs []QueueMessage) []uint64 {
	out := make([]uint64, len(msgs))
	for i := range msgs {
		out[i] = msgs[i].Attributes.Sequence
	}
	return out
}

// DedupeSequences removes messages whose Attributes.Sequence repeats an
// earlier one (the real server can repeat a sequence within one Get,
// docs/kubemq.md 8.8), keeping the first. It reuses msgs' backing array.
func DedupeSequences(msgs []QueueMessage) []QueueMessage {
	if len(msgs) < 2 {
		return msgs
	}
	seen := make(map[uint64]struct{}, len(msgs))
	out := msgs[:0]
	for _, m := range msgs {
		if _, dup := seen[m.Attributes.Sequence]; dup {
			continue
		}
		seen[m.Attributes.Sequence] = struct{}{}
		out = append(out, m)
	}
	return out
}

// settle sends a settlement. The server answers only failures, and those
// later (Errors, Sync), so Observe sees the time to hand the request to the
// stream and a local send failure, under obsOp.
func (d *Downstream) settle(op, obsOp string, typ pb.QueuesDownstreamRequestType, txID string, seqs []uint64, requeue string, ranged bool) error {
	if txID == "" {
		return invalidArg(op, "empty transaction id", nil)
	}
	req := &pb.QueuesDownstreamRequest{RequestTypeData: typ, RefTransactionId: txID}
	if requeue != "" || typ == pb.QueuesDownstreamRequestType_ReQueueAll || typ == pb.QueuesDownstreamRequestType_ReQueueRange {
		if err := ValidChannel(requeue); err != nil {
			return err
		}
		req.ReQueueChannel = requeue
	}
	if ranged {
		// A repeated sequence makes the real server stop at the repeat
		// (8.8), so send each once.
		seen := make(map[uint64]struct{}, len(seqs))
		for _, s := range seqs {
			if s == 0 || s > math.MaxInt64 {
				return invalidArg(op, "invalid sequence", ErrInvalidSequence)
			}
			if _, dup := seen[s]; dup {
				continue
			}
			seen[s] = struct{}{}
			req.SequenceRange = append(req.SequenceRange, int64(s))
		}
		if len(req.SequenceRange) == 0 {
			return nil
		}
	}
	t := d.c.startOp()
	err := d.send(op, req, &dsReq{}, false)
	t.end(obsOp, err)
	return err
}

// AckAll acknowledges every unsettled message of the transaction.
func (d *Downstream) AckAll(txID string) error {
	return d.settle("AckAll", OpDownstreamAck, pb.QueuesDownstreamRequestType_AckAll, txID, nil, "", false)
}

// AckRange acknowledges the given sequences (repeats are sent once).
func (d *Downstream) AckRange(txID string, seqs []uint64) error {
	return d.settle("AckRange", OpDownstreamAck, pb.QueuesDownstreamRequestType_AckRange, txID, seqs, "", true)
}

// NAckAll returns every unsettled message to the tail of its queue as a new
// copy with ReceiveCount+1 (dead-lettered at MaxReceiveCount).
func (d *Downstream) NAckAll(txID string) error {
	return d.settle("NAckAll", OpDownstreamNack, pb.QueuesDownstreamRequestType_NAckAll, txID, nil, "", false)
}

// NAckRange is NAckAll for the given sequences.
func (d *Downstream) NAckRange(txID string, seqs []uint64) error {
	return d.settle("NAckRange", OpDownstreamNack, pb.QueuesDownstreamRequestType_NAckRange, txID, seqs, "", true)
}

// ReQueueAll moves every unsettled message to channel.
func (d *Downstream) ReQueueAll(txID, channel string) error {
	return d.settle("ReQueueAll", OpDownstreamRequeue, pb.QueuesDownstreamRequestType_ReQueueAll, txID, nil, channel, false)
}

// ReQueueRange moves the given sequences to channel.
func (d *Downstream) ReQueueRange(txID, channel string, seqs []uint64) error {
	return d.settle("ReQueueRange", OpDownstreamRequeue, pb.QueuesDownstreamRequestType_ReQueueRange, txID, seqs, channel, true)
}

// CloseByClient closes the transaction: unsettled messages go back to the
// queue with the same sequence and ReceiveCount.
func (d *Downstream) CloseByClient(txID string) error {
	return d.settle("CloseByClient", OpDownstreamCloseTx, pb.QueuesDownstreamRequestType_CloseByClient, txID, nil, "", false)
}

// ActiveOffsets returns the transaction's unsettled sequences (answered
// after every earlier request on the stream).
func (d *Downstream) ActiveOffsets(ctx context.Context, txID string) ([]uint64, error) {
	const op = "ActiveOffsets"
	if txID == "" {
		return nil, invalidArg(op, "empty transaction id", nil)
	}
	t := d.c.startOp()
	rep, err := d.call(ctx, op, &pb.QueuesDownstreamRequest{
		RequestTypeData: pb.QueuesDownstreamRequestType_ActiveOffsets, RefTransactionId: txID,
	}, &dsReq{}, false)
	if err == nil && rep.resp.GetIsError() {
		err = inBand(op, rep.resp.GetError())
	}
	t.end(OpDownstreamOffsets, err)
	if err != nil {
		return nil, err
	}
	out := make([]uint64, len(rep.resp.GetActiveOffsets()))
	for i, s := range rep.resp.GetActiveOffsets() {
		out[i] = uint64(s)
	}
	return out, nil
}

// Sync is the barrier after a settlement: it sends ActiveOffsets(txID) and
// waits for the answer, which comes after every earlier request on the
// stream was processed. It returns the settlement failures reported before
// that answer (since the previous Sync), joined; the answer itself only
// marks the barrier, so "closed response" (the normal answer after AckAll)
// and "not found" count as success.
func (d *Downstream) Sync(ctx context.Context, txID string) error {
	const op = "Sync"
	if txID == "" {
		return invalidArg(op, "empty transaction id", nil)
	}
	t := d.c.startOp()
	rep, err := d.call(ctx, op, &pb.QueuesDownstreamRequest{
		RequestTypeData: pb.QueuesDownstreamRequestType_ActiveOffsets, RefTransactionId: txID,
	}, &dsReq{collect: true}, false)
	if err == nil {
		err = joinErrors(rep.failures)
	}
	t.end(OpDownstreamSync, err)
	return err
}

func (d *Downstream) read() {
	defer close(d.done)
	for {
		resp, err := d.stream.Recv()
		if err != nil {
			d.mu.Lock()
			closing := d.closing
			d.mu.Unlock()
			if closing {
				// Close cancelled the stream (or the server ended it meanwhile).
				err = closedErr("Downstream")
			} else {
				err = d.c.observe(wrapErr("Downstream", err))
			}
			d.fail(err)
			return
		}
		d.c.hear()
		d.handle(resp)
	}
}

func (d *Downstream) handle(resp *pb.QueuesDownstreamResponse) {
	d.mu.Lock()
	idx := -1
	for i, r := range d.fifo {
		if r.id == resp.GetRefRequestId() {
			idx = i
			break
		}
	}
	if idx < 0 && resp.GetRefRequestId() == "" {
		// Fall back to the first request of the same kind and transaction.
		for i, r := range d.fifo {
			if r.typ == resp.GetRequestTypeData() && r.txID == resp.GetTransactionId() {
				idx = i
				break
			}
		}
	}
	if idx < 0 {
		d.mu.Unlock()
		d.c.log.Warn("downstream response for no request", zap.String("ref", resp.GetRefRequestId()),
			zap.Stringer("type", resp.GetRequestTypeData()), zap.String("error", resp.GetError()))
		if resp.GetIsError() {
			d.recordFailure(inBand(resp.GetRequestTypeData().String(), resp.GetError()))
		}
		return
	}
	r := d.fifo[idx]
	// Requests before r were processed first; unanswered fire-and-forget
	// ones succeeded. Answered kinds stay until their own answer.
	kept := d.fifo[:0]
	for _, e := range d.fifo[:idx] {
		if e.reply != nil {
			kept = append(kept, e)
		}
	}
	kept = append(kept, d.fifo[idx+1:]...)
	clear(d.fifo[len(kept):])
	d.fifo = kept
	r.popped = true
	if r.typ == pb.QueuesDownstreamRequestType_Get && !resp.GetIsError() {
		d.lastTx = resp.GetTransactionId()
		if len(resp.GetMessages()) > 0 && !r.autoAck {
			tx := &dsTx{unsettled: make(map[uint64]struct{}, len(resp.GetMessages()))}
			for _, m := range resp.GetMessages() {
				tx.unsettled[m.GetAttributes().GetSequence()] = struct{}{}
			}
			d.open[resp.GetTransactionId()] = tx
		}
	}
	var failures []error
	if r.collect {
		failures, d.failures = d.failures, nil
	}
	abandoned, closing := r.abandoned, d.closing
	d.mu.Unlock()

	switch {
	case r.reply == nil:
		if resp.GetIsError() {
			e := inBand(r.typ.String(), resp.GetError())
			e.TxID = r.txID
			d.recordFailure(e)
		}
	case abandoned:
		if r.typ == pb.QueuesDownstreamRequestType_Get && !closing {
			// Close sends CloseByClient for open transactions itself.
			d.c.goTracked(func() { d.abandonTx(resp) })
		}
	default:
		r.reply <- dsReply{resp: resp, failures: failures}
	}
}

func (d *Downstream) recordFailure(err error) {
	d.c.log.Debug("downstream settlement failed", zap.Error(err))
	d.mu.Lock()
	if len(d.failures) >= 1024 {
		d.failures = d.failures[1:]
	}
	d.failures = append(d.failures, err)
	d.mu.Unlock()
	select {
	case d.errs <- err:
	default:
	}
}

// fail ends the stream: every waiting call gets err.
func (d *Downstream) fail(err error) {
	d.mu.Lock()
	if d.dead == nil {
		d.dead = err
	}
	fifo := d.fifo
	d.fifo = nil
	d.open = map[string]*dsTx{} // the server returns them to the queue
	d.mu.Unlock()
	for _, r := range fifo {
		if r.reply != nil {
			r.reply <- dsReply{err: err}
		}
	}
	d.cancel()
}

// Close ends the stream cleanly (docs/kubemq.md 8.7): it refuses new calls,
// waits for outstanding requests (a waiting Get included) to be answered,
// closes open transactions with CloseByClient, waits until those are
// processed, then cancels the stream. The wait is bounded by the client's
// CloseTimeout plus the longest Get wait used; past it the stream is
// cancelled anyway.
func (d *Downstream) Close() error {
	d.mu.Lock()
	if d.closing {
		d.mu.Unlock()
		<-d.closed
		return d.closeErr
	}
	d.closing = true
	timeout := d.c.opts.CloseTimeout + d.maxWait
	d.mu.Unlock()
	defer close(d.closed)
	defer d.c.untrack(d)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()

	d.closeErr = d.closeCleanly(ctx)
	if d.closeErr != nil {
		d.c.log.Warn("downstream closed uncleanly", zap.Error(d.closeErr))
	}
	d.cancel()
	<-d.done
	return d.closeErr
}

func (d *Downstream) closeCleanly(ctx context.Context) error {
	if err := d.barrier(ctx); err != nil {
		return err
	}
	d.mu.Lock()
	open := make([]string, 0, len(d.open))
	for id := range d.open {
		open = append(open, id)
	}
	d.mu.Unlock()
	slices.Sort(open)
	for _, id := range open {
		if err := d.send("Close", &pb.QueuesDownstreamRequest{
			RequestTypeData: pb.QueuesDownstreamRequestType_CloseByClient, RefTransactionId: id,
		}, &dsReq{}, true); err != nil {
			return err
		}
	}
	// Every request is answered and nothing is held: cancelling the stream now strands
	// nothing. A half-close would not do: the real server keeps a downstream stream open
	// after the client's half-close and never ends it (docs/kubemq.md 5.9), so Close
	// ends it itself (the caller cancels).
	return d.barrier(ctx)
}

// barrier waits until every request sent so far has been processed, by
// sending an answered request when any is outstanding.
func (d *Downstream) barrier(ctx context.Context) error {
	d.mu.Lock()
	if d.dead != nil {
		err := d.dead
		d.mu.Unlock()
		return err
	}
	pending, txID := len(d.fifo), d.lastTx
	d.mu.Unlock()
	if pending == 0 {
		return nil
	}
	if txID == "" {
		txID = "close-barrier"
	}
	_, err := d.call(ctx, "Close", &pb.QueuesDownstreamRequest{
		RequestTypeData: pb.QueuesDownstreamRequestType_ActiveOffsets, RefTransactionId: txID,
	}, &dsReq{}, true)
	return err
}

func joinErrors(errs []error) error {
	switch len(errs) {
	case 0:
		return nil
	case 1:
		return errs[0]
	}
	return errors.Join(errs...)
}
