package embedded

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/kubemq-io/kubemq-proxy/kubemqpb"
)

// maxClosedTx bounds how many completed transactions a stream remembers (for the "closed
// response" errors). The real server keeps all of them until the stream ends (docs/kubemq.md 8.1).
const maxClosedTx = 4096

// dsTx is one downstream transaction: the messages one Get handed out. Owned by its stream's
// handler goroutine; q.txOwner (under q.mu) may point at it.
type dsTx struct {
	id     string
	stream *dsStream
	q      *queue
	msgs   []*qmsg
	shown  []int32        // receive count shown on delivery, per msgs index
	open   map[uint64]int // unsettled: sequence -> index in msgs
	closed bool
}

// dsStream is one QueuesDownstream stream. Its fields are owned by the handler goroutine.
type dsStream struct {
	s      *Server
	id     uint64
	ctx    context.Context
	done   chan struct{} // closed once the stream's transactions are closed
	txs    map[string]*dsTx
	closed []string // completed tx ids, oldest first
}

// QueuesDownstream serves Get and settlement requests one at a time, in order: a waiting Get
// delays the requests behind it, as on the real server (docs/kubemq.md 5.4.3, 8.3). Only errors
// are answered, besides Get and ActiveOffsets. When the stream ends (the client cancels it; a
// half-close alone does not end it), every open transaction's unsettled messages go back with
// the same sequence and receive count.
func (s *Server) QueuesDownstream(stream grpc.BidiStreamingServer[kubemqpb.QueuesDownstreamRequest, kubemqpb.QueuesDownstreamResponse]) error {
	ctx := stream.Context()
	ds := &dsStream{s: s, txs: map[string]*dsTx{}, ctx: ctx, done: make(chan struct{})}
	s.mu.Lock()
	s.nextStreamID++
	ds.id = s.nextStreamID
	s.mu.Unlock()
	defer func() {
		ds.closeAll()
		close(ds.done)
	}()
	in := receiver(ctx, stream.Recv)
	var next *recvd[kubemqpb.QueuesDownstreamRequest]
	for {
		var r recvd[kubemqpb.QueuesDownstreamRequest]
		if next != nil {
			r, next = *next, nil
		} else {
			select {
			case <-s.ctx.Done():
				return errShutdown()
			case <-stream.Context().Done():
				return stream.Context().Err()
			case r = <-in:
			}
		}
		if r.err != nil {
			if r.err == io.EOF {
				// As on the real server, a half-close ends nothing: the stream and its
				// transactions stay until the client cancels (docs/kubemq.md 5.9).
				return s.awaitStreamEnd(ctx)
			}
			return r.err
		}
		req := r.m
		var resp *kubemqpb.QueuesDownstreamResponse
		if req.RequestTypeData == kubemqpb.QueuesDownstreamRequestType_Get {
			var cancelled bool
			resp, cancelled = ds.get(ctx, req)
			if cancelled {
				if s.ctx.Err() != nil {
					return errShutdown()
				}
				return ctx.Err()
			}
			// A client that half-closed or cancelled while the Get waited is the hazard of
			// docs/kubemq.md 8.7; it is visible here as an end already queued behind the Get.
			select {
			case r2 := <-in:
				next = &r2
				if r2.err != nil {
					s.violation(&s.strict.endedDuringGet, "downstream stream ended while a Get was waiting",
						zap.String("queue", req.Channel))
				}
			default:
			}
		} else {
			resp = ds.settle(req)
		}
		if resp != nil {
			if err := stream.Send(resp); err != nil {
				return err
			}
		}
	}
}

func dsError(req *kubemqpb.QueuesDownstreamRequest, txID, msg string) *kubemqpb.QueuesDownstreamResponse {
	return &kubemqpb.QueuesDownstreamResponse{
		TransactionId: txID, RefRequestId: req.RequestID, RequestTypeData: req.RequestTypeData,
		IsError: true, Error: msg,
	}
}

// get runs one Get. cancelled reports that the stream or server ended during the wait; the
// messages it had collected are then given back.
func (ds *dsStream) get(ctx context.Context, req *kubemqpb.QueuesDownstreamRequest) (resp *kubemqpb.QueuesDownstreamResponse, cancelled bool) {
	s := ds.s
	if req.ClientID == "" {
		return dsError(req, "", errClientID), false
	}
	if e := checkChannel(req.Channel, kindQueue); e != "" {
		return dsError(req, "", e), false
	}
	max := int(req.MaxItems)
	if max <= 0 {
		max = defaultGetMaxItems
	}
	wait := time.Duration(req.WaitTimeout) * time.Millisecond
	if wait < minGetWaitMillis*time.Millisecond {
		wait = minGetWaitMillis * time.Millisecond
	}
	q, e := s.openQueue(req.Channel)
	if e != "" {
		return dsError(req, "", e), false
	}
	tx := &dsTx{id: newUUID(), stream: ds, q: q}
	now := s.now().UnixNano()

	q.mu.Lock()
	q.lastActive = now
	if o := q.txOwner; o != nil && o.stream != ds && o.stream.ctx.Err() != nil {
		// The owner's stream has ended and is closing its transactions: a client that reconnects
		// at once is not opening a second transaction, so wait for that to finish.
		q.mu.Unlock()
		select {
		case <-o.stream.done:
		case <-time.After(2 * time.Second):
		case <-ctx.Done():
		}
		q.mu.Lock()
	}
	if o := q.txOwner; o != nil {
		why := "queue " + q.name + " already has an open downstream transaction on another stream"
		if o.stream == ds {
			why = "this stream already holds unsettled transaction " + o.id + " on queue " + q.name +
				"; settle it before the next Get"
		}
		if s.violation(&s.strict.secondTx, "second open transaction", zap.String("queue", q.name)) {
			q.mu.Unlock()
			return dsError(req, "", strictPrefix+why+
				" (on the real server several open transactions on one queue redeliver acked messages and can lose some)"), false
		}
	} else {
		q.txOwner = tx
	}
	q.consumers++
	q.read = true
	got, _, dropped, moves := q.takeLocked(now, max, maxDeliveryBytes, nil, true)
	var w *waiter
	if len(got)+dropped < max && !budgetFull(got) {
		w = &waiter{max: max - dropped, maxBytes: maxDeliveryBytes, got: got, done: make(chan struct{})}
		for _, qm := range got {
			w.bytes += qm.cost()
		}
		q.waiters = append(q.waiters, w)
	}
	q.mu.Unlock()
	s.applyMoves(moves, now)

	if w != nil {
		timer := time.NewTimer(wait)
		select {
		case <-w.done:
		case <-timer.C:
		case <-ctx.Done():
			cancelled = true
		case <-s.ctx.Done():
			cancelled = true
		}
		timer.Stop()
		q.mu.Lock()
		if !w.full {
			q.removeWaiterLocked(w)
		}
		got = w.got
		q.mu.Unlock()
	}
	if cancelled {
		if s.ctx.Err() == nil {
			s.violation(&s.strict.endedDuringGet, "downstream stream ended while a Get was waiting",
				zap.String("queue", q.name))
		}
		q.mu.Lock()
		q.giveBackLocked(got)
		ds.releaseLocked(tx)
		q.mu.Unlock()
		return nil, true
	}

	resp = &kubemqpb.QueuesDownstreamResponse{
		TransactionId: tx.id, RefRequestId: req.RequestID, RequestTypeData: req.RequestTypeData,
		Messages: make([]*kubemqpb.QueueMessage, len(got)),
	}
	tx.msgs = got
	tx.shown = make([]int32, len(got))
	for i, qm := range got {
		tx.shown[i] = qm.storedRC() + 1
	}
	msgs, err := s.deliveries(got, tx.shown)
	if err != nil {
		// The messages cannot be read back from the log: they stay in the queue.
		s.log.Error("cannot read messages back from the log", zap.String("queue", q.name), zap.Error(err))
		q.mu.Lock()
		q.giveBackLocked(got)
		ds.releaseLocked(tx)
		q.mu.Unlock()
		return dsError(req, "", "Error 121: cannot read messages back from the store: "+err.Error()), false
	}
	resp.Messages = msgs
	if req.AutoAck || (len(got) == 0 && dropped == 0) {
		q.mu.Lock()
		q.settleLocked(got)
		ds.releaseLocked(tx)
		q.mu.Unlock()
		tx.closed = true
		ds.remember(tx)
		return resp, false
	}
	// A Get whose slots went to expired or dead-lettered messages alone answers empty and
	// still holds its transaction open, as the real server does (docs/kubemq.md 5.9): the client
	// must settle it (AckAll or CloseByClient) before the queue is read again; in strict mode the
	// next Get is refused until then.
	tx.open = make(map[uint64]int, len(got))
	for i, qm := range got {
		tx.open[qm.seq()] = i
	}
	ds.txs[tx.id] = tx
	s.mu.Lock()
	s.openTx[tx.id] = tx
	s.mu.Unlock()
	return resp, false
}

func budgetFull(got []*qmsg) bool {
	var n int64
	for _, qm := range got {
		n += qm.cost()
	}
	return n >= maxDeliveryBytes
}

// releaseLocked ends tx's claim on its queue (q.mu held).
func (ds *dsStream) releaseLocked(tx *dsTx) {
	q := tx.q
	if q.txOwner == tx {
		q.txOwner = nil
	}
	q.consumers--
	q.lastActive = ds.s.now().UnixNano()
}

// remember keeps a completed transaction for the closed-response errors, within a bound.
func (ds *dsStream) remember(tx *dsTx) {
	ds.txs[tx.id] = tx
	ds.closed = append(ds.closed, tx.id)
	if len(ds.closed) > maxClosedTx {
		delete(ds.txs, ds.closed[0])
		ds.closed = ds.closed[1:]
	}
}

// complete closes tx once nothing in it is unsettled.
func (ds *dsStream) completeIfDone(tx *dsTx) {
	if len(tx.open) > 0 || tx.closed {
		return
	}
	tx.closed = true
	tx.q.mu.Lock()
	ds.releaseLocked(tx)
	tx.q.mu.Unlock()
	ds.s.mu.Lock()
	delete(ds.s.openTx, tx.id)
	ds.s.mu.Unlock()
	delete(ds.txs, tx.id)
	ds.remember(tx)
}

// closeAll gives back every unsettled message of the stream's open transactions.
func (ds *dsStream) closeAll() {
	for _, tx := range ds.txs {
		if tx.closed {
			continue
		}
		ds.giveBack(tx, ds.unsettled(tx))
	}
}

func (ds *dsStream) unsettled(tx *dsTx) []int {
	idx := make([]int, 0, len(tx.open))
	for i, qm := range tx.msgs {
		if _, ok := tx.open[qm.seq()]; ok {
			idx = append(idx, i)
		}
	}
	return idx
}

func (ds *dsStream) giveBack(tx *dsTx, idx []int) {
	qms := tx.pick(idx)
	tx.q.mu.Lock()
	tx.q.giveBackLocked(qms)
	tx.q.mu.Unlock()
	ds.completeIfDone(tx)
}

// pick removes the given message indexes from the unsettled set and returns their copies.
func (tx *dsTx) pick(idx []int) []*qmsg {
	out := make([]*qmsg, len(idx))
	for i, k := range idx {
		out[i] = tx.msgs[k]
		delete(tx.open, tx.msgs[k].seq())
	}
	return out
}

// settle handles every request type except Get.
func (ds *dsStream) settle(req *kubemqpb.QueuesDownstreamRequest) *kubemqpb.QueuesDownstreamResponse {
	s := ds.s
	typ := req.RequestTypeData
	switch typ {
	case kubemqpb.QueuesDownstreamRequestType_AckAll, kubemqpb.QueuesDownstreamRequestType_AckRange,
		kubemqpb.QueuesDownstreamRequestType_NAckAll, kubemqpb.QueuesDownstreamRequestType_NAckRange,
		kubemqpb.QueuesDownstreamRequestType_ReQueueAll, kubemqpb.QueuesDownstreamRequestType_ReQueueRange,
		kubemqpb.QueuesDownstreamRequestType_ActiveOffsets, kubemqpb.QueuesDownstreamRequestType_CloseByClient:
	default:
		return dsError(req, req.RefTransactionId, errRequestUnknown)
	}
	id := req.RefTransactionId
	tx := ds.txs[id]
	if tx == nil {
		s.mu.RLock()
		other := s.openTx[id]
		s.mu.RUnlock()
		if other != nil && other.stream != ds {
			if s.violation(&s.strict.foreign, "settlement on a foreign stream", zap.String("tx", id)) {
				return dsError(req, id, strictPrefix+"transaction "+id+" belongs to another downstream stream; "+
					"settle a transaction on the stream whose Get opened it (the real server answers: "+errTxNotFound+")")
			}
		}
		return dsError(req, id, errTxNotFound)
	}
	if tx.closed {
		if typ == kubemqpb.QueuesDownstreamRequestType_ActiveOffsets {
			return dsError(req, id, errTxClosedOffsets)
		}
		if typ == kubemqpb.QueuesDownstreamRequestType_CloseByClient {
			return nil
		}
		return dsError(req, id, errTxClosedAck)
	}
	switch typ {
	case kubemqpb.QueuesDownstreamRequestType_ActiveOffsets:
		idx := ds.unsettled(tx)
		offs := make([]int64, len(idx))
		for i, k := range idx {
			offs[i] = int64(tx.msgs[k].seq())
		}
		return &kubemqpb.QueuesDownstreamResponse{
			TransactionId: id, RefRequestId: req.RequestID, RequestTypeData: typ, ActiveOffsets: offs,
		}
	case kubemqpb.QueuesDownstreamRequestType_CloseByClient:
		ds.giveBack(tx, ds.unsettled(tx))
		return nil
	case kubemqpb.QueuesDownstreamRequestType_ReQueueAll, kubemqpb.QueuesDownstreamRequestType_ReQueueRange:
		if e := checkChannel(req.ReQueueChannel, kindQueue); e != "" {
			return dsError(req, id, e)
		}
	}

	var idx []int
	var bad string
	switch typ {
	case kubemqpb.QueuesDownstreamRequestType_AckAll, kubemqpb.QueuesDownstreamRequestType_NAckAll,
		kubemqpb.QueuesDownstreamRequestType_ReQueueAll:
		idx = ds.unsettled(tx)
	default:
		if dup, ok := repeated(req.SequenceRange); ok {
			if s.violation(&s.strict.repeated, "repeated sequence in a range", zap.Int64("seq", dup)) {
				return dsError(req, id, strictPrefix+"sequence "+strconv.FormatInt(dup, 10)+
					" is listed twice; deduplicate before settling (the real server fails at the second copy and leaves the rest unsettled)")
			}
		}
		verb := map[kubemqpb.QueuesDownstreamRequestType]string{
			kubemqpb.QueuesDownstreamRequestType_AckRange:     "ack",
			kubemqpb.QueuesDownstreamRequestType_NAckRange:    "nack",
			kubemqpb.QueuesDownstreamRequestType_ReQueueRange: "requeue",
		}[typ]
		seen := map[uint64]bool{}
		for _, sq := range req.SequenceRange {
			k, ok := tx.open[uint64(sq)]
			if sq <= 0 || !ok || seen[uint64(sq)] {
				bad = fmt.Sprintf("invalid %s sequence id %d", verb, sq)
				break
			}
			seen[uint64(sq)] = true
			idx = append(idx, k)
		}
	}
	// The list is applied up to the first bad entry and not rolled back (docs/kubemq.md 8.5).
	qms := tx.pick(idx)
	shown := make([]int32, len(idx))
	for i, k := range idx {
		shown[i] = tx.shown[k]
	}
	switch typ {
	case kubemqpb.QueuesDownstreamRequestType_AckAll, kubemqpb.QueuesDownstreamRequestType_AckRange:
		tx.q.mu.Lock()
		tx.q.settleLocked(qms)
		tx.q.mu.Unlock()
	case kubemqpb.QueuesDownstreamRequestType_NAckAll, kubemqpb.QueuesDownstreamRequestType_NAckRange:
		s.nack(tx.q, qms, shown)
	default:
		s.moveTo(tx.q, qms, req.ReQueueChannel)
	}
	ds.completeIfDone(tx)
	if bad != "" {
		return dsError(req, id, bad)
	}
	return nil
}

// repeated returns the first value listed twice.
func repeated(seqs []int64) (int64, bool) {
	if len(seqs) < 2 {
		return 0, false
	}
	seen := make(map[int64]struct{}, len(seqs))
	for _, v := range seqs {
		if _, ok := seen[v]; ok {
			return v, true
		}
		seen[v] = struct{}{}
	}
	return 0, false
}
