package amqp091

import (
	"container/heap"
	"context"
	"errors"
	"math"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/kubemq-io/kubemq-proxy/amqp091/wire"
	"github.com/kubemq-io/kubemq-proxy/delivery"
	"github.com/kubemq-io/kubemq-proxy/kubemqclient"
)

// The x-delayed-message exchange type, with the semantics of RabbitMQ's
// rabbitmq_delayed_message_exchange plugin. The exchange routes as its
// x-delayed-type. A message published to it with a header x-delay of
// 0 < delay <= 4294967295 ms (an integer of any width, a string holding
// one, a float truncated) is not routed at publish: it is stored, with its
// due time, in the exchange's delay queue, the KubeMQ queue
// amqp.{vhost}.{exchange}.delayed (a third token "delayed" is neither an
// incarnation, digits only, nor a priority level, "p" and digits, so it
// is no queue's channel). The replica that holds the delay queue (the lease
// engine's ownership, as for any queue) takes every message of it as a
// lease and routes each when it is due, to the millisecond, through the
// exchange's bindings as they are then, with the header x-delay set to
// minus the delay; the lease is acked once every routed copy is stored.
// A held message stays durable through the engine's lease records, so
// after a crash or restart it comes back to the next holder and is routed
// then (late, never lost; possibly twice if the crash fell between the
// store of its copies and the ack). Any other x-delay, or none, routes the
// message at once. As with the plugin a delayed publish routes to nothing
// at publish time: mandatory returns it 312 NO_ROUTE, a confirm acks it
// once it is stored in the delay queue.

const (
	// tagDelayDue is a delayed message's due time in Unix milliseconds.
	tagDelayDue = "x-amqp-delay-due"
	// tagDelayMs is its delay in milliseconds (the x-delay it had).
	tagDelayMs = "x-amqp-delay-ms"
	// maxDelay is the plugin's largest delay.
	maxDelay = 1<<32 - 1
	// delayFetch is how many delayed messages the holder takes at once.
	delayFetch = 256
	// delayRetry is how often a replica that does not hold an exchange's
	// delay queue tries to take it (the holder may go away).
	delayRetry = 5 * time.Second
)

// delayChannel is the KubeMQ queue of exchange x's delayed messages.
func delayChannel(vhostKey, x string) string {
	return kubemqclient.Channel("amqp", vhostKey, x, "delayed")
}

// parseDelay reads a message's x-delay header as the plugin does: an
// integer, a string holding one, or a float (truncated). ok is false when
// the message is not delayed.
func parseDelay(h wire.Table) (int64, bool) {
	v, has := h["x-delay"]
	if !has {
		return 0, false
	}
	var n int64
	switch x := v.(type) {
	case string:
		i, err := strconv.ParseInt(x, 10, 64)
		if err != nil {
			return 0, false
		}
		n = i
	case float32:
		n = truncDelay(float64(x))
	case float64:
		n = truncDelay(x)
	default:
		i, ok := intArg(v)
		if !ok {
			return 0, false
		}
		n = i
	}
	return n, n > 0 && n <= maxDelay
}

func truncDelay(f float64) int64 {
	if math.IsNaN(f) || f <= 0 || f > maxDelay {
		return 0
	}
	return int64(f)
}

// delayedCopy is the copy of a message published to delayed exchange x
// with a delay of ms milliseconds that x's delay queue stores; x's holder
// is started.
func (s *Server) delayedCopy(vh *vhost, x, key string, props *wire.Properties, body []byte, ms int64, log *zap.Logger) (pubCopy, error) {
	meta, tags, err := encodeMessage(x, key, props)
	if err != nil {
		return pubCopy{}, wire.PreconditionFailed("cannot store message: %v", err)
	}
	t := make(map[string]string, len(tags)+2)
	for k, v := range tags {
		t[k] = v
	}
	t[tagDelayDue] = strconv.FormatInt(time.Now().UnixMilli()+ms, 10)
	t[tagDelayMs] = strconv.FormatInt(ms, 10)
	s.startDelayHolder(vh, x)
	return pubCopy{msg: kubemqclient.QueueMessage{Channel: delayChannel(vh.key, x), Metadata: meta, Body: body, Tags: t}, log: log}, nil
}

// publishDelayed is publish of a message to delayed exchange x with a
// delay of ms: stored in x's delay queue, routed to nothing now.
func (ch *channel) publishDelayed(m *wire.BasicPublish, props *wire.Properties, body []byte, ms int64, held int64) error {
	c := ch.c
	cp, err := c.srv.delayedCopy(c.vh, m.Exchange, m.RoutingKey, props, body, ms, ch.log)
	if err != nil {
		c.unpend(held)
		return err
	}
	c.srv.m.published.Inc()
	if m.Mandatory { // the plugin routes it nowhere at publish time
		c.w.send(outFrame{channel: ch.id, m: &wire.BasicReturn{ReplyCode: wire.ReplyNoRoute, ReplyText: "NO_ROUTE",
			Exchange: m.Exchange, RoutingKey: m.RoutingKey}, props: props, body: body})
	}
	if ch.tx != nil {
		c.unpend(held)
		ch.tx.msgs = append(ch.tx.msgs, cp)
		ch.tx.limits = append(ch.tx.limits, nil)
		return nil
	}
	var seq uint64
	if ch.confirm {
		seq = ch.confirms.next()
	}
	confirm, t := ch.confirm, &ch.confirms
	ch.inflight.Add(1)
	done := newPubDone(1, func(ok bool) {
		c.unpend(held)
		if confirm {
			t.complete(seq, ok)
		}
		ch.publishDone()
	})
	if !c.srv.pub.submit(c.ctx, cp, done) {
		return errShutdown()
	}
	return nil
}

// delayHolders tracks the running holders, by delay channel.
type delayHolders struct {
	mu      sync.Mutex
	running map[string]context.CancelFunc
}

// startDelayHolder starts the holder of delayed exchange x of vh unless it
// runs. It does not block.
func (s *Server) startDelayHolder(vh *vhost, x string) {
	if s == nil {
		return
	}
	ch := delayChannel(vh.key, x)
	s.delays.mu.Lock()
	defer s.delays.mu.Unlock()
	if s.delays.running == nil {
		s.delays.running = map[string]context.CancelFunc{}
	}
	if s.delays.running[ch] != nil || s.ctx.Err() != nil {
		return
	}
	ctx, cancel := context.WithCancel(s.ctx)
	s.delays.running[ch] = cancel
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.holdDelayed(ctx, vh, x, ch)
	}()
}

// stopDelayHolder ends the holder of delayed exchange x of vh (deleted)
// and drops its delayed messages, as the plugin does.
func (s *Server) stopDelayHolder(vh *vhost, x string) {
	ch := delayChannel(vh.key, x)
	s.delays.mu.Lock()
	cancel := s.delays.running[ch]
	delete(s.delays.running, ch)
	s.delays.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	if s.ctx.Err() != nil {
		return
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		ctx, done := context.WithTimeout(s.ctx, time.Minute)
		defer done()
		if _, err := s.localPurge(ctx, ch); err != nil && s.ctx.Err() == nil {
			s.log.Warn("dropping a deleted exchange's delayed messages failed", zap.String("exchange", x), zap.Error(err))
		}
	}()
}

// due is one held delayed message.
type due struct {
	at time.Time
	d  *delivery.Delivery
}

type dueHeap []due

func (h dueHeap) Len() int           { return len(h) }
func (h dueHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h dueHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *dueHeap) Push(x any)        { *h = append(*h, x.(due)) }
func (h *dueHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// holdDelayed is the holder of one delayed exchange's delay queue: while
// this replica holds the queue, it takes every message of it and routes
// each when it is due.
func (s *Server) holdDelayed(ctx context.Context, vh *vhost, x, ch string) {
	var h *delivery.Handle
	for h == nil {
		var err error
		h, err = s.deliveries.Acquire(ctx, ch)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, delivery.ErrClosed) {
				return
			}
			if !errors.Is(err, delivery.ErrNotOwner) {
				s.log.Warn("delayed exchange: cannot consume its delay queue", zap.String("exchange", x), zap.Error(err))
			}
			select { // another replica holds it, or KubeMQ failed: try again later
			case <-time.After(delayRetry):
			case <-ctx.Done():
				return
			}
		}
	}
	defer h.Close()
	got := make(chan []*delivery.Delivery)
	fetchErr := make(chan error, 1)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			ds, err := h.Fetch(ctx, delayFetch)
			if err != nil {
				fetchErr <- err
				return
			}
			select {
			case got <- ds:
			case <-ctx.Done():
				h.Unfetch(ds...)
				return
			}
		}
	}()
	var pending dueHeap
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		now := time.Now()
		for len(pending) > 0 && !pending[0].at.After(now) {
			s.routeDelayed(vh, x, h, heap.Pop(&pending).(due).d)
		}
		wait := time.Hour
		if len(pending) > 0 {
			wait = time.Until(pending[0].at)
		}
		timer.Reset(max(wait, 0))
		select {
		case ds := <-got:
			for _, d := range ds {
				ms, _ := strconv.ParseInt(d.Tags[tagDelayDue], 10, 64)
				heap.Push(&pending, due{at: time.UnixMilli(ms), d: d})
			}
		case <-timer.C:
		case err := <-fetchErr:
			if ctx.Err() == nil && !errors.Is(err, delivery.ErrClosed) {
				s.log.Warn("delayed exchange: fetch failed", zap.String("exchange", x), zap.Error(err))
				s.delays.mu.Lock()
				if cancel := s.delays.running[ch]; cancel != nil {
					cancel()
					delete(s.delays.running, ch)
				}
				s.delays.mu.Unlock()
				// The leases are void: the records bring them back to a new holder.
				time.AfterFunc(delayRetry, func() { s.startDelayHolder(vh, x) })
			}
			return
		case <-ctx.Done():
			return
		}
	}
}

// routeDelayed routes a due delayed message through exchange x as it is
// bound now and acks its lease once every copy is stored (or it routes
// nowhere). A message whose copies cannot be stored goes back and is
// routed again.
func (s *Server) routeDelayed(vh *vhost, x string, h *delivery.Handle, d *delivery.Delivery) {
	_, key, props := decodeMessage("", d.Metadata, d.Tags)
	ms, _ := strconv.ParseInt(d.Tags[tagDelayMs], 10, 64)
	headers := make(wire.Table, len(props.Headers)+1)
	for k, v := range props.Headers {
		headers[k] = v
	}
	if ms <= math.MaxInt32 {
		headers["x-delay"] = int32(-ms)
	} else {
		headers["x-delay"] = -ms
	}
	props.Headers = headers
	props.Flags |= wire.FlagHeaders
	routes, err := vh.routes.Route(x, key, headers, nil)
	if err != nil || len(routes) == 0 { // the exchange is gone, or no binding matches now
		s.m.unroutable.Inc()
		h.Ack(d.LeaseID)
		return
	}
	meta, tags, err := encodeMessage(x, key, &props)
	if err != nil {
		s.log.Warn("delayed exchange: cannot store message", zap.String("exchange", x), zap.Error(err))
		h.Ack(d.LeaseID)
		return
	}
	var ttl time.Duration
	hasTTL := props.Flags&wire.FlagExpiration != 0
	if hasTTL {
		n, reason := parseExpiration(props.Expiration)
		hasTTL = reason == ""
		ttl = time.Duration(n) * time.Millisecond
	}
	now := time.Now()
	var copies []pubCopy
	var reap, limited []*queue
	for _, name := range routes {
		q := vh.lookupQueue(name)
		if q == nil {
			continue
		}
		q.markUsed()
		if hasTTL && !q.reap.msgTTL.Load() {
			q.reap.msgTTL.Store(true)
		}
		if hasTTL || q.hasTTL {
			reap = append(reap, q)
		}
		if q.limitsLength() && q.overflow == "drop-head" {
			limited = append(limited, q)
		}
		if q.limitsLength() && q.overflow != "drop-head" && s.refuseRouted(q, x, key, &props, d.Body) {
			continue
		}
		copies = append(copies, pubCopy{msg: q.storedCopy(meta, tags, d.Body, ttl, hasTTL, now), stats: q.counters(), ledger: q.ledger(), log: s.log})
	}
	if len(copies) == 0 {
		h.Ack(d.LeaseID)
		return
	}
	s.m.routed.Add(float64(len(copies)))
	pd := newPubDone(len(copies), func(ok bool) {
		for _, q := range reap {
			s.startReaper(q)
		}
		for _, q := range limited {
			s.requestTrim(q, func() {})
		}
		if ok {
			h.Ack(d.LeaseID)
			return
		}
		s.log.Warn("delayed exchange: storing a due message failed; it is routed again", zap.String("exchange", x))
		h.Requeue(d.LeaseID)
	})
	for i := range copies {
		if !s.pub.submit(s.ctx, copies[i], pd) {
			for range copies[i+1:] {
				pd.resolve(false)
			}
			return
		}
	}
}

// refuseRouted applies a full reject-publish queue's limit to a copy the
// server routes itself, with no publisher to nack: a due delayed message
// (the delayed-message plugin's release; its publisher was confirmed at
// the publish) or a dead-lettered one (RabbitMQ's queue process refuses
// any delivery that would overflow). The copy is dropped, or
// dead-lettered from q (reason maxlen) under reject-publish-dlx. x and key
// are the exchange and routing key it came through. It reports whether q
// refused the copy.
func (s *Server) refuseRouted(q *queue, x, key string, props *wire.Properties, body []byte) bool {
	n, known, err := s.readyCount(s.ctx, q)
	if err != nil || !known {
		return false
	}
	full, err := s.overflows(s.ctx, q, int64(n), len(body))
	if err != nil || !full {
		return false
	}
	if q.overflow == "reject-publish-dlx" {
		s.deadLetterRefused(q, x, key, props, body)
	} else {
		s.m.dropped.WithLabelValues(reasonMaxLen).Inc()
	}
	return true
}
