package embedded

import (
	"fmt"
	"sort"
	"strings"
	"sync"

	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/kubemq-io/kubemq-proxy/kubemqclient/fastpb"
	"github.com/kubemq-io/kubemq-proxy/kubemqpb"
)

// Limits of the real server's default configuration (docs/kubemq.md 3.4, 5.4).
const (
	defaultMaxReceiveCount = 1024
	maxExpirationSeconds   = 43200
	maxDelaySeconds        = 43200
	maxVisibilitySeconds   = 43200
	defaultVisibility      = 60
	maxWaitSeconds         = 3600
	maxReceiveMessages     = 1024
	defaultGetMaxItems     = 200000
	minGetWaitMillis       = 1000
)

// qmsg is one stored copy of a queue message: the fields every queue operation needs, and either
// the message itself (in memory) or where its record is in the log (with a data directory, the
// message is read back from its segment when it is delivered or moved, so that memory holds only
// this index). m is never mutated after it is stored: deliveries get a fresh envelope (see
// delivery) that shares Body and Tags.
type qmsg struct {
	m     *kubemqpb.QueueMessage // nil when only in the log; Attributes: Timestamp, Sequence, ...
	seqN  uint64
	ts    int64 // Attributes.Timestamp
	expAt int64 // Attributes.ExpirationAt
	lsn   uint64
	off   int64  // record offset in its segment
	size  int64  // messageSize
	seg   uint32 // log segment holding the record (persistence)
	n     uint32 // record length
	rc    int32  // stored ReceiveCount
	maxRC int32  // Policy.MaxReceiveCount
}

// newQmsg indexes m.
func newQmsg(m *kubemqpb.QueueMessage) *qmsg {
	a := m.Attributes
	return &qmsg{m: m, seqN: a.Sequence, ts: a.Timestamp, expAt: a.ExpirationAt, size: messageSize(m),
		rc: a.ReceiveCount, maxRC: m.Policy.MaxReceiveCount}
}

// spill drops the message from memory once its record (at off, n bytes, in seg; readable once
// the log holds lsn) can be read back.
func (qm *qmsg) spill(seg uint32, off int64, n int, lsn uint64) {
	qm.seg, qm.off, qm.n, qm.lsn, qm.m = seg, off, uint32(n), lsn, nil
}

// load returns the stored message, reading it back from the log if it is not in memory.
func (s *Server) load(qm *qmsg) (*kubemqpb.QueueMessage, error) {
	if qm.m != nil {
		return qm.m, nil
	}
	if s.store == nil {
		return nil, errServerClosed
	}
	p, err := s.store.readRecord(qm.seg, qm.off, int(qm.n), qm.lsn, recQueueMsg)
	if err != nil {
		return nil, err
	}
	return decodeStored(p, qm)
}

// loadHeld loads messages a consumer holds, for a move that must happen: on a read error each is
// loaded alone, and one that still cannot be read is replaced as mustLoad does.
func (s *Server) loadHeld(qms []*qmsg) []*kubemqpb.QueueMessage {
	ms, err := s.loadAll(qms)
	if err == nil {
		return ms
	}
	ms = make([]*kubemqpb.QueueMessage, len(qms))
	for i, qm := range qms {
		ms[i] = s.mustLoad(qm)
	}
	return ms
}

// decodeStored decodes a queue record read back from the log.
func decodeStored(p []byte, qm *qmsg) (*kubemqpb.QueueMessage, error) {
	m := &kubemqpb.QueueMessage{}
	if !fastpb.Unmarshal(p, m) {
		if err := proto.Unmarshal(p, m); err != nil {
			m = nil
		}
	}
	if m == nil || m.Attributes == nil || m.Policy == nil || m.Attributes.Sequence != qm.seqN {
		return nil, fmt.Errorf("embedded: queue record of segment %d at %d is damaged", qm.seg, qm.off)
	}
	return m, nil
}

// readSpan is how far apart two records of one queue may be in a segment and still be read back
// with one read (the bytes between them are read and skipped).
const readSpan = 256 << 10

// loadAll is load for many messages: records that lie close together in one segment (a queue's
// messages usually do) are read back with one read.
func (s *Server) loadAll(qms []*qmsg) ([]*kubemqpb.QueueMessage, error) {
	out := make([]*kubemqpb.QueueMessage, len(qms))
	for i := 0; i < len(qms); {
		qm := qms[i]
		if qm.m != nil || s.store == nil {
			m, err := s.load(qm)
			if err != nil {
				return nil, err
			}
			out[i] = m
			i++
			continue
		}
		// The run qms[i:j]: spilled, same segment, ascending and close.
		j, end, lsn := i+1, qm.off+int64(qm.n), qm.lsn
		for j < len(qms) {
			x := qms[j]
			if x.m != nil || x.seg != qm.seg || x.off < end || x.off+int64(x.n)-qm.off > readSpan {
				break
			}
			end, lsn = x.off+int64(x.n), max(lsn, x.lsn)
			j++
		}
		if j == i+1 {
			m, err := s.load(qm)
			if err != nil {
				return nil, err
			}
			out[i] = m
			i++
			continue
		}
		buf, err := s.store.readAt(qm.seg, qm.off, int(end-qm.off), lsn)
		if err != nil {
			return nil, err
		}
		for k := i; k < j; k++ {
			x := qms[k]
			rel := x.off - qm.off
			typ, p, n, err := unframe(buf[rel : rel+int64(x.n)])
			if err != nil || n != int(x.n) || typ != recQueueMsg {
				return nil, fmt.Errorf("embedded: record of segment %d at %d is damaged", x.seg, x.off)
			}
			if out[k], err = decodeStored(p, x); err != nil {
				return nil, err
			}
		}
		i = j
	}
	return out, nil
}

// mustLoad is load for paths that cannot report an error (moves decided under a queue's lock):
// a record that cannot be read back is logged and an empty message with the index's attributes
// takes its place, so the move still happens and nothing panics.
func (s *Server) mustLoad(qm *qmsg) *kubemqpb.QueueMessage {
	m, err := s.load(qm)
	if err == nil {
		return m
	}
	s.log.Error("cannot read a stored message back from the log", zap.Uint64("sequence", qm.seqN), zap.Error(err))
	return &kubemqpb.QueueMessage{
		Attributes: &kubemqpb.QueueMessageAttributes{Sequence: qm.seqN, Timestamp: qm.ts, ReceiveCount: qm.rc, ExpirationAt: qm.expAt},
		Policy:     &kubemqpb.QueueMessagePolicy{MaxReceiveCount: qm.maxRC},
	}
}

// deliveryOverhead approximates a delivered message's envelope, so that a response built up to
// a byte budget stays inside one gRPC message.
const deliveryOverhead = 256

// maxDeliveryBytes is the byte budget of one response carrying messages.
const maxDeliveryBytes = maxGRPCMessage - 4<<20

func (qm *qmsg) cost() int64 { return qm.size + deliveryOverhead }

func (qm *qmsg) seq() uint64       { return qm.seqN }
func (qm *qmsg) storedRC() int32   { return qm.rc }
func (qm *qmsg) maxReceive() int32 { return qm.maxRC }
func (qm *qmsg) expiredAt(now int64) bool {
	return qm.expAt != 0 && now >= qm.expAt
}

// deliveries builds the messages as their consumer sees them (shown[i] is qms[i]'s receive
// count), reading back from the log those not in memory.
func (s *Server) deliveries(qms []*qmsg, shown []int32) ([]*kubemqpb.QueueMessage, error) {
	out, err := s.loadAll(qms)
	if err != nil {
		return nil, err
	}
	for i, m := range out {
		out[i] = delivery(m, shown[i])
	}
	return out, nil
}

// delivery is the message as a consumer sees it on its rc-th delivery.
func delivery(m *kubemqpb.QueueMessage, rc int32) *kubemqpb.QueueMessage {
	a := m.Attributes
	p := m.Policy
	return &kubemqpb.QueueMessage{
		MessageID: m.MessageID,
		ClientID:  m.ClientID,
		Channel:   m.Channel,
		Metadata:  m.Metadata,
		Body:      m.Body,
		Tags:      m.Tags,
		Attributes: &kubemqpb.QueueMessageAttributes{
			Timestamp:         a.Timestamp,
			Sequence:          a.Sequence,
			ReceiveCount:      rc,
			ReRouted:          a.ReRouted,
			ReRoutedFromQueue: a.ReRoutedFromQueue,
			ExpirationAt:      a.ExpirationAt,
		},
		Policy: &kubemqpb.QueueMessagePolicy{
			ExpirationSeconds: p.ExpirationSeconds,
			DelaySeconds:      p.DelaySeconds,
			MaxReceiveCount:   p.MaxReceiveCount,
			MaxReceiveQueue:   p.MaxReceiveQueue,
		},
	}
}

func messageSize(m *kubemqpb.QueueMessage) int64 {
	n := int64(len(m.Body) + len(m.Metadata) + len(m.MessageID) + len(m.ClientID) + len(m.Channel))
	for k, v := range m.Tags {
		n += int64(len(k) + len(v))
	}
	return n
}

// waiter is a consumer (a Get, a receive) waiting for messages. It is owned by the queue's mutex
// while listed in queue.waiters.
type waiter struct {
	max      int
	maxBytes int64
	got      []*qmsg
	bytes    int64
	done     chan struct{} // closed when full
	full     bool
}

func (w *waiter) add(qm *qmsg) {
	w.got = append(w.got, qm)
	w.bytes += qm.cost()
	if len(w.got) >= w.max || w.bytes >= w.maxBytes {
		w.full = true
		close(w.done)
	}
}

// queue is one KubeMQ queue. mu guards every field below it.
type queue struct {
	s    *Server
	name string

	mu        sync.Mutex
	lastSeq   uint64
	ready     []*qmsg // visible messages ordered by sequence; ready[head:] is live
	head      int
	held      int64 // messages taken by a consumer and not settled
	count     int64 // stored messages (ready + held)
	bytes     int64
	sent      int64
	delivered int64
	waiters   []*waiter
	consumers int64 // downstream Gets waiting or holding, streams holding
	read      bool  // some consumer has read the queue (QueuesInfo Subscribers stays at least 1)
	// lastActive is the last send or consumer activity (Unix ns), for MaxPurgeInactive.
	lastActive int64
	// purged is set when the queue was deleted for inactivity: a caller that got it before
	// must look the name up again.
	purged bool

	// txOwner is the downstream transaction that currently holds or waits on this queue; strict
	// mode allows one at a time (docs/kubemq.md 8.8).
	txOwner *dsTx
}

// getQueue returns the named queue, creating it when create is set (queues appear on first send).
func (s *Server) getQueue(name string, create bool) *queue {
	s.mu.RLock()
	q := s.queues[name]
	s.mu.RUnlock()
	if q != nil || !create {
		return q
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if q = s.queues[name]; q == nil {
		q = s.newQueueLocked(name)
	}
	return q
}

// newQueueLocked creates and registers a queue. s.mu must be held for writing.
func (s *Server) newQueueLocked(name string) *queue {
	q := &queue{s: s, name: name, lastActive: s.now().UnixNano()}
	s.queues[name] = q
	ln := listedName(name)
	s.listed[ln] = append(s.listed[ln], q)
	return q
}

// listedName is the name QueuesInfo lists a queue under, and matches its filter against: as on
// the real server, leading and trailing '_', 'Q', 'U', 'E', 'S' and '.' are cut off (the real
// server takes the name out of its internal subject "_QUEUES_.<name>" by trimming those
// characters; docs/kubemq.md 5.9). So "ORDERS" is listed as "ORDER", and "orderS" and "order"
// share one name.
func listedName(name string) string { return strings.Trim(name, "_QUES.") }

// appendLocked stores m as a new copy at the tail with the next sequence and hands it to a waiter
// if there is one. It returns the log position to wait for before acknowledging.
func (q *queue) appendLocked(m *kubemqpb.QueueMessage, now int64) uint64 {
	q.lastSeq++
	m.Attributes.Sequence = q.lastSeq
	m.Attributes.Timestamp = now
	qm := newQmsg(m)
	lsn, seg, off, n := q.s.logQueueMsg(m)
	qm.seg = seg
	if q.s.store != nil {
		qm.spill(seg, off, n, lsn)
	}
	q.count++
	q.bytes += qm.size
	if qm.m != nil {
		q.s.mem.Add(qm.size) // in memory, not only in the log
	}
	q.sent++
	q.lastActive = now
	q.offerLocked(qm)
	q.trimLocked()
	return lsn
}

// offerLocked makes qm visible: to the least-served waiter, or into ready in sequence order.
func (q *queue) offerLocked(qm *qmsg) {
	if len(q.waiters) > 0 {
		best := 0
		for i, w := range q.waiters {
			if len(w.got) < len(q.waiters[best].got) {
				best = i
			}
		}
		w := q.waiters[best]
		q.held++
		q.delivered++
		w.add(qm)
		if w.full {
			q.waiters = append(q.waiters[:best], q.waiters[best+1:]...)
		}
		return
	}
	n := len(q.ready)
	if n == q.head || q.ready[n-1].seq() < qm.seq() {
		q.ready = append(q.ready, qm)
		return
	}
	// A message given back keeps its sequence, so it goes back in order.
	live := q.ready[q.head:]
	i := sort.Search(len(live), func(i int) bool { return live[i].seq() > qm.seq() })
	q.ready = append(q.ready, nil)
	copy(q.ready[q.head+i+1:], q.ready[q.head+i:])
	q.ready[q.head+i] = qm
}

func (q *queue) popLocked() *qmsg {
	if q.head >= len(q.ready) {
		return nil
	}
	qm := q.ready[q.head]
	q.ready[q.head] = nil
	q.head++
	if q.head == len(q.ready) {
		q.ready = q.ready[:0]
		q.head = 0
	} else if q.head > 1024 && q.head*2 > len(q.ready) {
		n := copy(q.ready, q.ready[q.head:])
		clear(q.ready[n:])
		q.ready = q.ready[:n]
		q.head = 0
	}
	return qm
}

func (q *queue) waitingLocked() int64 { return int64(len(q.ready) - q.head) }

// pendingMove is a cross-queue write decided under one queue's lock and done after it is
// released, so no two queue locks are ever held together.
type pendingMove struct {
	to string
	m  *kubemqpb.QueueMessage
}

// takeLocked removes up to max visible messages (and maxBytes) for a consumer. Expired messages
// and messages over their receive limit met on the way are removed (the latter dead-lettered
// through moves) and counted, like the real server does during a read. With dropsTakeSlots they
// also count toward max, as in a downstream Get on the real server, whose transaction receives
// them before it leaves them out (docs/kubemq.md 5.9).
// dropped counts every message removed, expired or over its limit.
func (q *queue) takeLocked(now int64, max int, maxBytes int64, got []*qmsg, dropsTakeSlots bool) (out []*qmsg, expired, dropped int, moves []pendingMove) {
	var bytes int64
	for _, qm := range got {
		bytes += qm.cost()
	}
	var gone []uint64
	for len(got) < max && bytes < maxBytes {
		if dropsTakeSlots && len(got)+len(gone) >= max {
			break
		}
		qm := q.popLocked()
		if qm == nil {
			break
		}
		if qm.expiredAt(now) {
			expired++
			gone = append(gone, qm.seq())
			q.forgetLocked(qm)
			continue
		}
		if qm.storedRC() >= qm.maxReceive() {
			if mv, ok := q.deadLetter(qm, nil); ok {
				moves = append(moves, mv)
			}
			gone = append(gone, qm.seq())
			q.forgetLocked(qm)
			continue
		}
		got = append(got, qm)
		bytes += qm.cost()
		q.held++
		q.delivered++
	}
	if len(gone) > 0 {
		q.s.logQueueDel(q.name, gone)
	}
	return got, expired, len(gone), moves
}

// forgetLocked drops a stored copy from the counters (it is no longer in ready or held).
func (q *queue) forgetLocked(qm *qmsg) {
	q.count--
	q.bytes -= qm.size
	if qm.m != nil {
		q.s.mem.Add(-qm.size)
	}
	q.s.releaseSeg(qm.seg)
}

// settleLocked removes held copies for good (ack, or the source side of a move).
func (q *queue) settleLocked(qms []*qmsg) {
	if len(qms) == 0 {
		return
	}
	seqs := make([]uint64, len(qms))
	for i, qm := range qms {
		seqs[i] = qm.seq()
		q.held--
		q.forgetLocked(qm)
	}
	q.s.logQueueDel(q.name, seqs)
}

// giveBackLocked returns held copies unchanged (same sequence, same stored receive count): what
// the real server does when a transaction or stream closes. Waiters get them first; the rest is
// merged into ready in one pass, so giving back a large batch to a long queue stays linear.
func (q *queue) giveBackLocked(qms []*qmsg) {
	if len(qms) == 0 {
		return
	}
	q.held -= int64(len(qms))
	sort.Slice(qms, func(i, j int) bool { return qms[i].seq() < qms[j].seq() })
	for len(qms) > 0 && len(q.waiters) > 0 {
		q.offerLocked(qms[0])
		qms = qms[1:]
	}
	if len(qms) == 0 {
		return
	}
	live := q.ready[q.head:]
	if len(live) == 0 || live[len(live)-1].seq() < qms[0].seq() {
		q.ready = append(q.ready, qms...)
		return
	}
	merged := make([]*qmsg, 0, len(live)+len(qms))
	i, j := 0, 0
	for i < len(live) && j < len(qms) {
		if live[i].seq() < qms[j].seq() {
			merged = append(merged, live[i])
			i++
		} else {
			merged = append(merged, qms[j])
			j++
		}
	}
	merged = append(merged, live[i:]...)
	merged = append(merged, qms[j:]...)
	q.ready, q.head = merged, 0
}

func (q *queue) removeWaiterLocked(w *waiter) {
	for i, x := range q.waiters {
		if x == w {
			q.waiters = append(q.waiters[:i], q.waiters[i+1:]...)
			return
		}
	}
}

// deadLetter builds the copy that goes to qm's dead-letter queue, if it has one (docs/kubemq.md
// 5.4.5: ReRouted, source queue, receive count 0, empty policy).
func (q *queue) deadLetter(qm *qmsg, m *kubemqpb.QueueMessage) (pendingMove, bool) {
	from := q.name
	if m == nil {
		m = q.s.mustLoad(qm)
	}
	dlq := m.Policy.MaxReceiveQueue
	if dlq == "" {
		return pendingMove{}, false
	}
	return pendingMove{to: dlq, m: &kubemqpb.QueueMessage{
		MessageID: m.MessageID,
		ClientID:  m.ClientID,
		Channel:   dlq,
		Metadata:  m.Metadata,
		Body:      m.Body,
		Tags:      m.Tags,
		Attributes: &kubemqpb.QueueMessageAttributes{
			ReRouted:          true,
			ReRoutedFromQueue: from,
		},
		Policy: &kubemqpb.QueueMessagePolicy{MaxReceiveCount: int32(q.s.opts.MaxReceiveCount)},
	}}, true
}

// requeueCopy is qm moved to another queue by ReQueue or Resend: new copy, receive count reset.
// Neither sets ReRouted or ReRoutedFromQueue: the real server leaves them unset on a ReQueue too
// (docs/kubemq.md 5.9); only a dead-letter move sets them.
func requeueCopy(to string, m *kubemqpb.QueueMessage) *kubemqpb.QueueMessage {
	a := &kubemqpb.QueueMessageAttributes{ExpirationAt: m.Attributes.ExpirationAt}
	p := m.Policy
	return &kubemqpb.QueueMessage{
		MessageID: m.MessageID, ClientID: m.ClientID, Channel: to, Metadata: m.Metadata,
		Body: m.Body, Tags: m.Tags, Attributes: a, Policy: &kubemqpb.QueueMessagePolicy{
			ExpirationSeconds: p.ExpirationSeconds, DelaySeconds: p.DelaySeconds,
			MaxReceiveCount: p.MaxReceiveCount, MaxReceiveQueue: p.MaxReceiveQueue,
		},
	}
}

// nackCopy is the re-appended copy after a nack that stays within the receive limit: the stored
// receive count becomes the delivered one.
func nackCopy(m *kubemqpb.QueueMessage, shownRC int32) *kubemqpb.QueueMessage {
	a := m.Attributes
	p := m.Policy
	return &kubemqpb.QueueMessage{
		MessageID: m.MessageID, ClientID: m.ClientID, Channel: m.Channel, Metadata: m.Metadata,
		Body: m.Body, Tags: m.Tags,
		Attributes: &kubemqpb.QueueMessageAttributes{
			ReceiveCount: shownRC, ReRouted: a.ReRouted, ReRoutedFromQueue: a.ReRoutedFromQueue,
			ExpirationAt: a.ExpirationAt,
		},
		Policy: &kubemqpb.QueueMessagePolicy{
			ExpirationSeconds: p.ExpirationSeconds, DelaySeconds: p.DelaySeconds,
			MaxReceiveCount: p.MaxReceiveCount, MaxReceiveQueue: p.MaxReceiveQueue,
		},
	}
}

// nackLocked applies the dead-letter rule to held copies delivered with the given receive
// counts: re-append at the tail (same queue, under the held lock) or return a move to the DLQ.
// The originals are settled after their replacement is logged, so a crash can duplicate but not
// lose.
// ms are the messages of qms (loaded).
func (q *queue) nackLocked(qms []*qmsg, ms []*kubemqpb.QueueMessage, shown []int32, now int64) (lsn uint64, moves []pendingMove) {
	for i, qm := range qms {
		if shown[i]+1 > qm.maxReceive() {
			if mv, ok := q.deadLetter(qm, ms[i]); ok {
				moves = append(moves, mv)
			}
			continue
		}
		lsn = q.appendLocked(nackCopy(ms[i], shown[i]), now)
	}
	if len(moves) == 0 {
		q.settleLocked(qms)
	}
	return lsn, moves
}

// applyMoves appends moved copies to their queues. It returns the last log position.
func (s *Server) applyMoves(moves []pendingMove, now int64) uint64 {
	var lsn uint64
	for _, mv := range moves {
		q, _ := s.lockQueue(mv.to, false)
		lsn = q.appendLocked(mv.m, now)
		q.mu.Unlock()
	}
	return lsn
}

// nack is nackLocked plus its dead-letter moves, with the originals settled only after the moved
// copies are logged.
func (s *Server) nack(q *queue, qms []*qmsg, shown []int32) {
	ms := s.loadHeld(qms) // held: their records stay; read outside the queue's lock
	now := s.now().UnixNano()
	q.mu.Lock()
	_, moves := q.nackLocked(qms, ms, shown, now)
	q.mu.Unlock()
	if len(moves) > 0 {
		s.applyMoves(moves, now)
		q.mu.Lock()
		q.settleLocked(qms)
		q.mu.Unlock()
	}
}

// moveTo moves held copies of q to another queue (ReQueue, Resend): copy first, then settle.
func (s *Server) moveTo(q *queue, qms []*qmsg, to string) {
	now := s.now().UnixNano()
	moves := make([]pendingMove, len(qms))
	for i, m := range s.loadHeld(qms) {
		moves[i] = pendingMove{to: to, m: requeueCopy(to, m)}
	}
	s.applyMoves(moves, now)
	q.mu.Lock()
	q.settleLocked(qms)
	q.mu.Unlock()
}
