package amqp091

import (
	"context"

	"go.uber.org/zap"

	"github.com/kubemq-io/kubemq-proxy/amqp091/wire"
	"github.com/kubemq-io/kubemq-proxy/delivery"
)

// Length limits (x-max-length with x-overflow), as RabbitMQ counts them:
// ready messages only (deliveries out are not counted). The length is the
// queue's ready count as declare-ok reports it (readyCount: KubeMQ's count
// of the queue, from any replica, plus what the holder's lease engine has
// read ahead). reject-publish takes it after the publishing channel's
// earlier publishes are stored, so one channel's publishes are counted
// exactly; publishes of other channels or replicas still in flight at that
// moment are not. drop-head trims after the store, on the queue's reaper
// (the replica that holds the queue), and the publishing channel's later
// methods wait for that trim.
// x-max-length-bytes is validated and stored but not enforced: KubeMQ
// counts bytes with its own overheads (lease records, metadata), not the
// body bytes RabbitMQ counts.

// limitsLength reports whether q has a length limit the proxy enforces.
func (q *queue) limitsLength() bool { return q.maxLen >= 0 }

// queueLength returns q's ready count after the channel's publishes are
// stored; known is false when KubeMQ cannot count q.
func (ch *channel) queueLength(q *queue) (int64, bool, error) {
	if err := ch.awaitPublishes(); err != nil {
		return 0, false, err
	}
	n, known, err := ch.c.srv.readyCount(ch.c.ctx, q)
	return int64(n), known, err
}

// wouldOverflow reports whether one more message would take q over its
// limit (rabbit_amqqueue_process:will_overflow): reject-publish refuses it.
func (ch *channel) wouldOverflow(q *queue, size int) (bool, error) {
	n, known, err := ch.queueLength(q)
	if err != nil || !known {
		return false, err
	}
	return n+1 > q.maxLen, nil
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
// x-max-length (drop-head) and to call done afterwards. Requests that
// arrive while a trim runs are served by the next one, so a burst of
// publishes costs one count and one fetch per pass.
func (s *Server) requestTrim(q *queue, done func()) {
	q.reap.mu.Lock()
	q.reap.trims = append(q.reap.trims, done)
	q.reap.mu.Unlock()
	s.startReaper(q)
}

// exactTrimMax is the largest x-max-length trimmed exactly: a pass takes
// every ready message into hand (at most count+1 fetches' worth) and keeps
// the newest x-max-length, so a count that is too high (KubeMQ's count
// may still include a batch the lease engine has just acked) never trims
// below the limit. Longer limits trim by the count alone.
const exactTrimMax = 10000

// trim is one drop-head pass over q through h: the oldest ready messages
// beyond x-max-length are dropped, or dead-lettered (reason maxlen).
func (s *Server) trim(q *queue, h *delivery.Handle) {
	n, known, err := s.queueReady(s.ctx, q)
	if err != nil || !known || int64(n) <= q.maxLen {
		return
	}
	if q.isPriority() {
		s.trimLevels(q, h, int64(n))
		return
	}
	if q.maxLen > exactTrimMax {
		for excess := int64(n) - q.maxLen; excess > 0; {
			ctx, cancel := context.WithTimeout(s.ctx, getWait)
			ds, err := h.TryFetch(ctx, int(min(excess, maxFetch)))
			cancel()
			if err != nil || len(ds) == 0 {
				return
			}
			for _, d := range ds {
				s.remove(q, h, d, reasonMaxLen)
			}
			excess -= int64(len(ds))
		}
		return
	}
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
	keep := int(min(int64(len(got)), q.maxLen))
	h.Unfetch(got[len(got)-keep:]...)
	for _, d := range got[:len(got)-keep] {
		s.remove(q, h, d, reasonMaxLen)
	}
}
