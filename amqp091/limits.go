package amqp091

import (
	"context"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/kubemq-io/kubemq-proxy/amqp091/peerpb"
	"github.com/kubemq-io/kubemq-proxy/amqp091/wire"
	"github.com/kubemq-io/kubemq-proxy/delivery"
)

// Length limits (x-max-length, x-max-length-bytes, x-overflow), as
// RabbitMQ counts them: ready messages only (deliveries out are not
// counted), and for x-max-length-bytes their body bytes
// (message_bytes_ready). The length is the queue's ready count as
// declare-ok reports it (readyCount: KubeMQ's count of the queue, from any
// replica, plus what the holder's lease engine has read ahead).
// reject-publish takes it after the publishing channel's earlier publishes
// are stored, so one channel's publishes are counted exactly; publishes of
// other channels or replicas still in flight at that moment are not.
// drop-head trims after the store, on the queue's reaper (the replica that
// holds the queue), and the publishing channel's later methods wait for
// that trim.
//
// Body bytes: KubeMQ counts bytes with its own overheads (metadata, lease
// records), so the bytes come from the messages themselves. Each process
// keeps a byte ledger per byte-limited queue: the body sizes of its messages
// in queue order, as far as it knows them: every copy it stores (publishes,
// dead-lettered and delayed copies, the management API) is added when KubeMQ
// has stored it, and a scan replaces the ledger with the sizes of the ready
// messages themselves. The ready bytes are the bytes of the newest n
// entries, n being the ready count: consumers take the oldest first. A scan
// is the reaper's pass that takes every ready message into hand (as the
// exact x-max-length trim does, at most exactTrimMax of them) and sums their
// bodies; it runs when the ledger cannot answer exactly: it holds fewer than
// n entries (messages another replica stored, a requeue, a restart), the
// queue is over its limit (drop-head: the pass trims it), a reject-publish
// check would refuse (it is checked against the scan), the last scan is
// older than reapIdle (a message requeued in place sits at the head, not
// among the newest), and always for a priority queue (its ready messages are
// not the newest). So one publishing channel is counted exactly on the
// replica that holds the queue. A replica that does not hold the queue asks
// the holder for the ready bytes (QueueRequest BYTES: the holder's ledger or
// scan); only when the holder cannot be asked does it count the entries it
// lacks at its ledger's average size. Approximate: a queue longer than
// exactTrimMax is not scanned (drop-head drops from the head by the ledger's
// count of bytes, then by the sizes it meets).

// limitsLength reports whether q has a length or byte limit the proxy
// enforces.
func (q *queue) limitsLength() bool { return q.maxLen >= 0 || q.maxBytes >= 0 }

// limitsBytes reports whether q has a byte limit (x-max-length-bytes).
func (q *queue) limitsBytes() bool { return q.maxBytes >= 0 }

// overLength reports whether n ready messages exceed q's x-max-length.
func (q *queue) overLength(n int64) bool { return q.maxLen >= 0 && n > q.maxLen }

// ledger returns q's byte ledger, nil when q has no byte limit.
func (q *queue) ledger() *byteLedger {
	if !q.limitsBytes() {
		return nil
	}
	return &q.bytes
}

// queueLength returns q's ready count after the channel's publishes are
// stored; known is false when KubeMQ cannot count q.
func (ch *channel) queueLength(q *queue) (int64, bool, error) {
	if err := ch.awaitPublishes(); err != nil {
		return 0, false, err
	}
	n, known, err := ch.c.srv.readyCount(ch.c.ctx, q)
	return int64(n), known, err
}

// wouldOverflow reports whether one more message of size body bytes would
// take q over its limits (rabbit_amqqueue_process:will_overflow):
// reject-publish refuses it.
func (ch *channel) wouldOverflow(q *queue, size int) (bool, error) {
	n, known, err := ch.queueLength(q)
	if err != nil || !known {
		return false, err
	}
	return ch.c.srv.overflows(ch.c.ctx, q, n, size)
}

// overflows reports whether a message of size body bytes, added to q's n
// ready messages, would exceed x-max-length or x-max-length-bytes.
func (s *Server) overflows(ctx context.Context, q *queue, n int64, size int) (bool, error) {
	if q.maxLen >= 0 && n+1 > q.maxLen {
		return true, nil
	}
	if !q.limitsBytes() {
		return false, nil
	}
	b, err := s.readyBytes(ctx, q, n, int64(size))
	return b+int64(size) > q.maxBytes, err
}

// readyBytes returns the body bytes of q's n ready messages for a
// reject-publish check of a message of size bytes. When another replica
// holds q, it is asked (QueueRequest BYTES: its ledger or its scan,
// localReadyBytes); otherwise, or when it cannot answer, this replica's
// own figure.
func (s *Server) readyBytes(ctx context.Context, q *queue, n, size int64) (int64, error) {
	if n == 0 {
		return 0, nil
	}
	if r, ok := s.queueAsk(ctx, q, &peerpb.QueueRequest{Op: peerpb.QueueRequest_BYTES, Size: uint64(max(size, 0))}); ok && r.Known {
		return int64(min(r.Bytes, 1<<63-1)), nil
	}
	return s.localReadyBytes(ctx, q, n, size)
}

// localReadyBytes is readyBytes by this replica: the ledger's figure when
// it is exact and accepts the message, otherwise a scan's by q's reaper
// (when this replica holds q and q is short enough).
func (s *Server) localReadyBytes(ctx context.Context, q *queue, n, size int64) (int64, error) {
	b, covered := q.bytes.ready(n)
	if n == 0 || (covered && !q.isPriority() && q.bytes.fresh() && b+size <= q.maxBytes) {
		return b, nil
	}
	if n > exactTrimMax && !q.isPriority() {
		return b, nil
	}
	scans := q.bytes.scanCount()
	done := make(chan struct{})
	s.requestTrim(q, func() { close(done) })
	select {
	case <-done:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	if q.bytes.scanCount() == scans {
		return b, nil // another replica holds q: no scan here
	}
	return q.bytes.total(), nil
}

// byteLedger is what this process knows of a byte-limited queue's body
// sizes, oldest first (see above).
type byteLedger struct {
	mu sync.Mutex
	// cum[i] is the bytes of the entries before entry i, plus an offset
	// (older entries are dropped by reslicing): entry i's size is
	// cum[i+1]-cum[i]. Empty or one value: no entries.
	cum     []int64
	added   uint64    // entries added since q was made
	scanned time.Time // the last scan
	scans   uint64    // scans so far
}

// maxLedger bounds a ledger's entries: beyond it the oldest half is
// forgotten (a queue that only receives, never counted, keeps no more).
const maxLedger = 1 << 20

// add records a stored copy of size body bytes.
func (l *byteLedger) add(size int) {
	l.mu.Lock()
	if len(l.cum) == 0 {
		l.cum = append(l.cum, 0)
	}
	if len(l.cum) > maxLedger {
		l.cum = l.cum[len(l.cum)/2:]
	}
	l.cum = append(l.cum, l.cum[len(l.cum)-1]+int64(size))
	l.added++
	l.mu.Unlock()
}

func (l *byteLedger) entries() int64 { return int64(max(len(l.cum)-1, 0)) }

// ready returns the bytes of the newest n entries, and whether the ledger
// holds that many (otherwise the missing ones are counted at the average
// size of those it holds). Entries older than the newest n are forgotten:
// they were handed out.
func (l *byteLedger) ready(n int64) (bytes int64, covered bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	k := l.entries()
	if k >= n {
		l.cum = l.cum[k-n:]
		if n == 0 {
			return 0, true
		}
		return l.cum[n] - l.cum[0], true
	}
	if k == 0 {
		return 0, false
	}
	sum := l.cum[k] - l.cum[0]
	return sum + (n-k)*(sum/k), false
}

// total returns the bytes of every entry.
func (l *byteLedger) total() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.cum) < 2 {
		return 0
	}
	return l.cum[len(l.cum)-1] - l.cum[0]
}

// fresh reports whether the last scan is recent (reapIdle).
func (l *byteLedger) fresh() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return time.Since(l.scanned) < reapIdle
}

func (l *byteLedger) scanCount() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.scans
}

// mark returns how many entries were added so far, for rebuild.
func (l *byteLedger) mark() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.added
}

// rebuild replaces the entries by sizes (a scan's ready messages, oldest
// first), followed by the entries added since mark (stored during the
// scan; one the scan already took in hand is counted twice until the next
// scan).
func (l *byteLedger) rebuild(sizes []int, mark uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	later := int(min(l.added-mark, uint64(l.entries())))
	cum := make([]int64, 1, len(sizes)+later+1)
	for _, sz := range sizes {
		cum = append(cum, cum[len(cum)-1]+int64(sz))
	}
	for i := len(l.cum) - 1 - later; i < len(l.cum)-1; i++ {
		cum = append(cum, cum[len(cum)-1]+l.cum[i+1]-l.cum[i])
	}
	l.cum = cum
	l.scanned = time.Now()
	l.scans++
}

// keepOf returns how many of a queue's ready messages, of body sizes
// sizes (in the order they would be delivered), drop-head keeps: the
// longest tail within x-max-length and x-max-length-bytes (RabbitMQ drops
// from the head while the queue is over either; a single message larger
// than x-max-length-bytes is dropped too).
func (q *queue) keepOf(sizes []int) int {
	keep, bytes := 0, int64(0)
	for i := len(sizes) - 1; i >= 0; i-- {
		if q.maxLen >= 0 && int64(keep)+1 > q.maxLen {
			break
		}
		if q.maxBytes >= 0 && bytes+int64(sizes[i]) > q.maxBytes {
			break
		}
		keep++
		bytes += int64(sizes[i])
	}
	return keep
}

// bodySizes returns the body sizes of ds.
func bodySizes(ds []*delivery.Delivery) []int {
	out := make([]int, len(ds))
	for i, d := range ds {
		out[i] = len(d.Body)
	}
	return out
}

// deadLetterRefused dead-letters a publish that reject-publish-dlx refused
// (reason maxlen). Nothing was stored in q, so nothing waits for it.
func (s *Server) deadLetterRefused(q *queue, exchange, key string, props *wire.Properties, body []byte) {
	if !q.hasDLX {
		s.m.dropped.WithLabelValues(reasonMaxLen).Inc()
		return
	}
	s.m.deadLettered.WithLabelValues(reasonMaxLen).Inc()
	s.deadLetterMessage(q, exchange, key, *props, body, reasonMaxLen, func(ok bool) {
		if !ok {
			s.log.Warn("dead-lettering a refused publish failed", zap.String("queue", q.name))
		}
	})
}

// requestTrim asks q's reaper to remove the oldest ready messages beyond
// its limits (drop-head), or to scan a reject-publish queue's bytes, and
// to call done afterwards. Requests that arrive while a trim runs are
// served by the next one, so a burst of publishes costs one count and one
// fetch per pass.
func (s *Server) requestTrim(q *queue, done func()) {
	q.reap.mu.Lock()
	q.reap.trims = append(q.reap.trims, done)
	q.reap.mu.Unlock()
	s.startReaper(q)
}

// exactTrimMax is the largest count of ready messages trimmed (or
// scanned) exactly: a pass takes every ready message into hand (at most
// count+1 fetches' worth) and keeps the newest within the limits, so a
// count that is too high (KubeMQ's count may still include a batch the
// lease engine has just acked) never trims below the limit. Longer queues
// are trimmed by the count (and the ledger's bytes) alone.
const exactTrimMax = 10000

// trim is one pass over q through h. drop-head: the oldest ready messages
// beyond the limits are dropped, or dead-lettered (reason maxlen).
// reject-publish (a byte-limited queue's check asked for it): the ready
// messages are scanned into q's byte ledger, nothing is removed.
func (s *Server) trim(q *queue, h *delivery.Handle) {
	n, known, err := s.queueReady(s.ctx, q)
	if err != nil || !known {
		return
	}
	scanOnly := q.overflow != "drop-head"
	if scanOnly && !q.limitsBytes() {
		return
	}
	if !scanOnly && !q.overLength(int64(n)) && !q.mayExceedBytes(int64(n)) {
		return
	}
	if q.isPriority() {
		s.trimLevels(q, h, int64(n))
		return
	}
	if int64(n) > exactTrimMax {
		if !scanOnly {
			s.trimHead(q, h, int64(n))
		}
		return
	}
	mark := q.bytes.mark()
	// The whole queue is in hand meanwhile: hand-outs wait (inOrder).
	q.reap.peeks.Add(1)
	q.reap.peeking.Store(true)
	defer q.reap.peeking.Store(false)
	var got []*delivery.Delivery
	for int64(len(got)) <= int64(n) {
		ctx, cancel := context.WithTimeout(s.ctx, getWait)
		ds, err := h.TryFetch(ctx, maxFetch)
		cancel()
		if err != nil || len(ds) == 0 {
			break
		}
		got = append(got, ds...)
		if int64(len(got)) == int64(n) {
			break // the count is met: no look for more
		}
	}
	sizes := bodySizes(got)
	keep := len(got)
	if !scanOnly {
		keep = q.keepOf(sizes)
	}
	h.Unfetch(got[len(got)-keep:]...)
	for _, d := range got[:len(got)-keep] {
		s.remove(q, h, d, reasonMaxLen)
	}
	if q.limitsBytes() {
		q.bytes.rebuild(sizes[len(sizes)-keep:], mark)
	}
}

// mayExceedBytes reports whether q's n ready messages may be over its
// x-max-length-bytes: the ledger says so, or cannot say exactly.
func (q *queue) mayExceedBytes(n int64) bool {
	if !q.limitsBytes() || n == 0 {
		return false
	}
	b, covered := q.bytes.ready(n)
	return !covered || q.isPriority() || !q.bytes.fresh() || b > q.maxBytes
}

// trimHead is drop-head of a queue longer than exactTrimMax: head messages
// are dropped while the queue is over x-max-length or, by the ledger's
// bytes less the sizes dropped, over x-max-length-bytes.
func (s *Server) trimHead(q *queue, h *delivery.Handle, n int64) {
	var bytes int64
	if q.limitsBytes() {
		bytes, _ = q.bytes.ready(n)
	}
	over := func() bool { return q.overLength(n) || (q.limitsBytes() && bytes > q.maxBytes) }
	if q.limitsBytes() {
		// A head given back (Unfetch) goes before what a hand-out may
		// meanwhile take: hand-outs wait (inOrder).
		q.reap.peeks.Add(1)
		q.reap.peeking.Store(true)
		defer q.reap.peeking.Store(false)
	}
	for n > 0 && over() {
		want := int64(maxFetch)
		if !q.limitsBytes() {
			want = min(n-q.maxLen, maxFetch)
		}
		ctx, cancel := context.WithTimeout(s.ctx, getWait)
		ds, err := h.TryFetch(ctx, int(want))
		cancel()
		if err != nil || len(ds) == 0 {
			return
		}
		for i, d := range ds {
			if !over() {
				h.Unfetch(ds[i:]...)
				break
			}
			s.remove(q, h, d, reasonMaxLen)
			n--
			bytes -= int64(len(d.Body))
		}
	}
	if q.limitsBytes() {
		q.bytes.ready(n) // forget the dropped entries
	}
}
