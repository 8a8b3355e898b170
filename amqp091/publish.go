package amqp091

import (
	"context"
	"errors"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/kubemq-io/kubemq-proxy/amqp091/routing"
	"github.com/kubemq-io/kubemq-proxy/amqp091/wire"
	"github.com/kubemq-io/kubemq-proxy/kubemqclient"
)

// publish routes one message and stores a copy in every queue it reaches.
func (ch *channel) publish(m *wire.BasicPublish, cmd command) error {
	c := ch.c
	// The body's pending bytes are released when publish returns, unless
	// they were handed on to the stores below.
	held := cmd.pending
	defer func() { c.unpend(held) }()
	if m.Immediate {
		return wire.NotImplemented("immediate=true")
	}
	if cmd.tooLarge > 0 {
		return wire.PreconditionFailed("message size %d is larger than configured max size %d", cmd.tooLarge, c.srv.opts.MaxBodySize)
	}
	props, err := ch.rewriteReplyTo(cmd.props)
	if err != nil {
		return err
	}
	if props.Flags&wire.FlagUserID != 0 && props.UserID != c.user {
		return wire.PreconditionFailed("user_id property set to '%s' but authenticated user was '%s'", props.UserID, c.user)
	}
	var ttl time.Duration
	hasTTL := props.Flags&wire.FlagExpiration != 0
	if hasTTL {
		ms, reason := parseExpiration(props.Expiration)
		if reason != "" {
			return wire.PreconditionFailed("invalid expiration '%s': %s", props.Expiration, reason)
		}
		ttl = time.Duration(ms) * time.Millisecond
	}
	if x, ok := c.vh.routes.Exchange(m.Exchange); ok && x.Delayed && !x.Internal {
		if ms, delayed := parseDelay(props.Headers); delayed {
			n := held
			held = 0
			return ch.publishDelayed(m, props, cmd.body, ms, n)
		}
	}
	routes, err := c.vh.routes.Route(m.Exchange, m.RoutingKey, props.Headers, ch.scratch[:0])
	if errors.Is(err, routing.ErrNoExchange) && c.srv.catchUp(c.ctx) {
		routes, err = c.vh.routes.Route(m.Exchange, m.RoutingKey, props.Headers, ch.scratch[:0])
	}
	ch.scratch = routes[:0]
	switch {
	case errors.Is(err, routing.ErrNoExchange):
		return errNoExchange(m.Exchange, c.vhostName)
	case errors.Is(err, routing.ErrInternal):
		return wire.AccessRefused("cannot publish to internal %s", rsExchange(m.Exchange, c.vhostName))
	}
	c.srv.m.published.Inc()
	c.srv.nPublishes.Add(1)
	if m.Exchange == "" && strings.HasPrefix(m.RoutingKey, replyToPrefix) {
		// Delivered to the requester's channel, not stored: counted as
		// unroutable below, as RabbitMQ 3.10 does (replyto.go).
		c.srv.deliverReply(c.ctx, m.RoutingKey, props, cmd.body)
	}
	if len(routes) == 0 {
		c.srv.m.unroutable.Inc()
		if m.Mandatory {
			ch.c.w.send(outFrame{channel: ch.id, m: &wire.BasicReturn{ReplyCode: wire.ReplyNoRoute, ReplyText: "NO_ROUTE",
				Exchange: m.Exchange, RoutingKey: m.RoutingKey}, props: props, body: cmd.body})
		}
		if ch.confirm {
			ch.confirms.complete(ch.confirms.next(), true)
		}
		return nil
	}
	meta, tags, err := encodeMessage(m.Exchange, m.RoutingKey, props)
	if err != nil {
		return wire.PreconditionFailed("cannot store message: %v", err)
	}
	msgs := make([]pubCopy, 0, len(routes))
	now := time.Now()
	var limited []*queue // queues with a length limit this publish reaches (limits.go)
	rejected := false    // a reject-publish queue refused its copy
	var reap []*queue    // queues whose reaper looks at the head once the copy is stored
	for _, name := range routes {
		q := c.vh.lookupQueue(name)
		if q == nil {
			continue // deleted while routing
		}
		q.markUsed()
		if hasTTL && !q.reap.msgTTL.Load() {
			q.reap.msgTTL.Store(true)
		}
		if hasTTL || q.hasTTL {
			reap = append(reap, q)
		}
		if q.limitsLength() && ch.tx == nil {
			if q.overflow != "drop-head" {
				full, err := ch.wouldOverflow(q, len(cmd.body))
				if err != nil {
					return err
				}
				if full {
					rejected = true
					if q.overflow == "reject-publish-dlx" {
						c.srv.deadLetterRefused(q, m.Exchange, m.RoutingKey, props, cmd.body)
					}
					continue
				}
			} else {
				limited = append(limited, q)
			}
		}
		msgs = append(msgs, pubCopy{msg: q.storedCopy(meta, tags, cmd.body, ttl, hasTTL, now), stats: q.counters(), q: q, ledger: q.ledger(), log: ch.log})
		if ch.tx != nil {
			// The queue's length limit applies at the commit (txCommit).
			var lim *txLimit
			if q.limitsLength() {
				lim = &txLimit{q: q, exchange: m.Exchange, key: m.RoutingKey, props: props, body: cmd.body}
			}
			ch.tx.limits = append(ch.tx.limits, lim)
		}
	}
	if ch.tx != nil {
		// Pending only until buffered here: a transaction larger than the
		// bound would otherwise stop the reader before the tx.commit that
		// stores it (the commit waits for its stores itself).
		ch.tx.msgs = append(ch.tx.msgs, msgs...)
		return nil
	}
	if len(msgs) == 0 { // every routed queue was deleted meanwhile, or refused it
		if ch.confirm {
			ch.confirms.complete(ch.confirms.next(), !rejected)
		}
		return nil
	}
	var seq uint64
	if ch.confirm {
		seq = ch.confirms.next()
	}
	n, confirm, t := held, ch.confirm, &ch.confirms
	held = 0
	// A drop-head queue's trim counts as part of the publish for the
	// channel's later methods (a get sees the queue trimmed).
	ch.inflight.Add(1 + int64(len(limited)))
	srv := c.srv
	done := newPubDone(len(msgs), func(ok bool) {
		for _, q := range reap {
			srv.startReaper(q) // or wakes it: the head may be new
		}
		for _, q := range limited {
			srv.requestTrim(q, ch.publishDone)
		}
		c.unpend(n)
		if ok {
			srv.m.publishLatency.Observe(time.Since(now).Seconds())
		}
		if confirm {
			t.complete(seq, ok && !rejected)
		}
		ch.publishDone()
	})
	c.srv.m.routed.Add(float64(len(msgs)))
	for i := range msgs {
		if !c.srv.pub.submit(c.ctx, msgs[i], done) {
			// submit resolved msgs[i]; the rest will never be stored.
			for range msgs[i+1:] {
				done.resolve(false)
			}
			return errShutdown()
		}
	}
	return nil
}

// parseExpiration checks the expiration property as RabbitMQ does
// (rabbit_basic:parse_expiration): a decimal count of milliseconds.
func parseExpiration(s string) (int64, string) {
	n, err := strconv.ParseInt(s, 10, 64)
	switch {
	case err != nil:
		// Erlang's string:to_integer: leading digits then garbage is
		// leftover_string, no digits at all is no_integer.
		i := 0
		if i < len(s) && (s[i] == '-' || s[i] == '+') {
			i++
		}
		j := i
		for j < len(s) && s[j] >= '0' && s[j] <= '9' {
			j++
		}
		if j == i {
			return 0, "no_integer"
		}
		return 0, "{leftover_string,\"" + s[j:] + "\"}"
	case n < 0:
		return 0, "{value_negative," + s + "}"
	case n > 1<<32-1:
		return 0, "{value_too_large," + s + "}"
	}
	return n, ""
}

// pubCopy is one queue's copy of a published message, with what the
// publisher reports its storing to: the queue's counters and the
// publishing channel's logger.
type pubCopy struct {
	msg   kubemqclient.QueueMessage
	stats *queueStats
	q     *queue // counts the stored copy (nPublished)
	// ledger learns the stored copy's body size: its queue's byte limit
	// (limits.go); nil without one.
	ledger *byteLedger
	log    *zap.Logger
}

// pubDone counts the copies of one publish still being stored; fn runs
// once, when the last is, with whether all of them were.
type pubDone struct {
	n      atomic.Int32
	failed atomic.Bool
	fn     func(ok bool)
}

func newPubDone(n int, fn func(ok bool)) *pubDone {
	d := &pubDone{fn: fn}
	d.n.Store(int32(n))
	return d
}

func (d *pubDone) resolve(ok bool) {
	if d == nil {
		return
	}
	if !ok {
		d.failed.Store(true)
	}
	if d.n.Add(-1) == 0 {
		d.fn(!d.failed.Load())
	}
}

// confirmTracker turns store completions into basic.ack / basic.nack in
// sequence order, folding runs into one multiple=true frame. complete may
// be called from any goroutine; next and emit only from the channel's.
type confirmTracker struct {
	ch *channel

	mu     sync.Mutex // guards the fields below
	closed bool
	last   uint64          // last sequence number handed out
	acked  uint64          // every sequence number up to this one was confirmed
	done   map[uint64]bool // completed and not yet confirmed: ok or not
}

func (t *confirmTracker) next() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.last++
	return t.last
}

func (t *confirmTracker) complete(seq uint64, ok bool) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return
	}
	if t.done == nil {
		t.done = map[uint64]bool{}
	}
	t.done[seq] = ok
	ready := seq == t.acked+1
	t.mu.Unlock()
	if ready {
		t.ch.signal()
	}
}

// emit sends what the completions so far allow.
func (t *confirmTracker) emit() {
	for _, m := range t.take() {
		t.ch.send(m)
		if _, ok := m.(*wire.BasicAck); ok {
			t.ch.c.srv.m.confirms.WithLabelValues("ack").Inc()
		} else {
			t.ch.c.srv.m.confirms.WithLabelValues("nack").Inc()
		}
	}
}

// take returns the confirms the completions so far allow, in order.
func (t *confirmTracker) take() []wire.Method {
	var out []wire.Method
	t.mu.Lock()
	for !t.closed {
		first, ok := t.done[t.acked+1]
		if !ok {
			break
		}
		end := t.acked + 1
		delete(t.done, end)
		for {
			v, ok := t.done[end+1]
			if !ok || v != first {
				break
			}
			end++
			delete(t.done, end)
		}
		multiple := end > t.acked+1
		t.acked = end
		if first {
			out = append(out, &wire.BasicAck{DeliveryTag: end, Multiple: multiple})
		} else {
			out = append(out, &wire.BasicNack{DeliveryTag: end, Multiple: multiple})
		}
	}
	t.mu.Unlock()
	return out
}

func (t *confirmTracker) close() {
	t.mu.Lock()
	t.closed = true
	t.done = nil
	t.mu.Unlock()
}

func (ch *channel) confirmSelect(m *wire.ConfirmSelect) error {
	if ch.tx != nil {
		return wire.PreconditionFailed("cannot switch from tx to confirm mode")
	}
	ch.confirm = true
	ch.viewConfirm.Store(true)
	if !m.NoWait {
		ch.send(&wire.ConfirmSelectOk{})
	}
	return nil
}

// publisher stores published copies in KubeMQ in batches. Copies are
// spread over lanes by KubeMQ queue, so the copies of one queue keep their
// order (one batch in flight per lane) while different queues proceed in
// parallel.
type publisher struct {
	b        backend
	maxBatch int
	maxBytes int
	lanes    []chan pubItem
	stop     chan struct{}
	wg       sync.WaitGroup
	failures func() // counts a failed copy (metrics)
}

type pubItem struct {
	pubCopy
	done *pubDone
	// auth is the publishing connection's KubeMQ token (password
	// pass-through); a batch carries copies of one token only.
	auth pubAuth
}

type pubAuth struct {
	token string
	set   bool
}

const (
	publishLanes     = 8
	publishLaneQueue = 2048
	// publishBatchBytes keeps one batch well inside KubeMQ's 100 MiB gRPC
	// message limit; a single bigger message goes alone.
	publishBatchBytes = 8 << 20
)

func newPublisher(b backend, maxBatch int, failures func()) *publisher {
	p := &publisher{b: b, maxBatch: maxBatch, maxBytes: publishBatchBytes, stop: make(chan struct{}), failures: failures}
	for range publishLanes {
		in := make(chan pubItem, publishLaneQueue)
		p.lanes = append(p.lanes, in)
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.run(in)
		}()
	}
	return p
}

func (p *publisher) lane(channel string) chan pubItem {
	h := fnv.New32a()
	h.Write([]byte(channel))
	return p.lanes[h.Sum32()%uint32(len(p.lanes))]
}

// submit queues one copy; it waits while the lane is full (back-pressure
// on the publishing channel) and gives up when ctx ends.
func (p *publisher) submit(ctx context.Context, m pubCopy, done *pubDone) bool {
	select {
	case p.lane(m.msg.Channel) <- pubItem{m, done, authOf(ctx)}:
		return true
	case <-ctx.Done():
		done.resolve(false)
		return false
	}
}

func authOf(ctx context.Context) pubAuth {
	tok, ok := kubemqclient.TokenFrom(ctx)
	return pubAuth{tok, ok}
}

func itemSize(m *kubemqclient.QueueMessage) int {
	n := len(m.Body) + len(m.Metadata) + len(m.Channel) + 64
	for k, v := range m.Tags {
		n += len(k) + len(v) + 4
	}
	return n
}

func (p *publisher) run(in chan pubItem) {
	batch := make([]kubemqclient.QueueMessage, 0, p.maxBatch)
	items := make([]pubItem, 0, p.maxBatch)
	var next *pubItem // taken from in but carrying another token than the batch
	for {
		var it pubItem
		if next != nil {
			it, next = *next, nil
		} else {
			select {
			case it = <-in:
			case <-p.stop:
				// Store what is already queued, then leave.
				for {
					select {
					case it = <-in:
						batch, items = append(batch[:0], it.msg), append(items[:0], it)
						p.send(it.auth, batch, items)
					default:
						return
					}
				}
			}
		}
		batch, items = append(batch[:0], it.msg), append(items[:0], it)
		auth := it.auth
		size := itemSize(&it.msg)
	fill:
		for len(batch) < p.maxBatch && size < p.maxBytes {
			select {
			case it = <-in:
				if it.auth != auth {
					next = &it
					break fill
				}
				batch, items = append(batch, it.msg), append(items, it)
				size += itemSize(&it.msg)
			default:
				break fill
			}
		}
		p.send(auth, batch, items)
		clear(batch)
		clear(items)
	}
}

// send stores one batch; items[i] is batch[i]'s item.
func (p *publisher) send(auth pubAuth, batch []kubemqclient.QueueMessage, items []pubItem) {
	// FailFast: a KubeMQ that stops answering fails the batch (basic.nack to
	// confirming publishers) when the outage is detected, not after 30 s.
	ctx, cancel := context.WithTimeout(kubemqclient.FailFast(context.Background()), 30*time.Second)
	if auth.set {
		ctx = kubemqclient.WithToken(ctx, auth.token)
	}
	results, err := p.b.SendQueueMessages(ctx, batch)
	cancel()
	if err != nil {
		// Once per publishing channel, on its logger (connection and
		// channel ids): a batch may mix connections.
		counts := map[*zap.Logger]int{}
		for i := range items {
			counts[items[i].log]++
		}
		for l, n := range counts {
			l.Warn("storing published messages failed", zap.Int("messages", n), zap.Error(err))
		}
	}
	for i := range items {
		it := &items[i]
		ok := err == nil && i < len(results) && results[i].Err == nil
		if ok {
			it.stats.in(len(it.msg.Body))
			if it.q != nil {
				it.q.nPublished.Add(1)
			}
			if it.ledger != nil {
				it.ledger.add(len(it.msg.Body))
			}
		} else {
			p.failures()
			if err == nil && i < len(results) {
				it.log.Warn("storing a published message failed", zap.String("queue", it.msg.Channel), zap.Error(results[i].Err))
			}
		}
		it.done.resolve(ok)
	}
}

// close stores what is queued and stops the lanes.
func (p *publisher) close() {
	close(p.stop)
	p.wg.Wait()
}

// txState buffers a transactional channel's work until tx.commit: routed
// copies to store and settlements to apply. Commit is not atomic across
// queues: copies are stored in batches, and a failure leaves the ones
// already stored in place.
type txState struct {
	msgs    []pubCopy
	limits  []*txLimit // per copy of msgs: its queue's length limit, nil for none (a delayed copy has none)
	settles []*unacked // acked (requeue=false) or nacked inside the transaction
	requeue []bool
	reject  []bool // a reject or nack without requeue (dead-lettered)
}

func (ch *channel) txSelect() error {
	if ch.confirm {
		return wire.PreconditionFailed("cannot switch from confirm to tx mode")
	}
	if ch.tx == nil {
		ch.tx = &txState{}
	}
	ch.viewTx.Store(true)
	ch.send(&wire.TxSelectOk{})
	return nil
}

func (ch *channel) txCommit() error {
	if ch.tx == nil {
		return wire.PreconditionFailed("channel is not transactional")
	}
	tx := ch.tx
	ch.tx = &txState{}
	msgs, trims, refused, err := ch.applyTxLimits(tx)
	if err != nil {
		return err
	}
	tx.msgs = msgs
	if len(tx.msgs) > 0 {
		res := make(chan bool, 1)
		done := newPubDone(len(tx.msgs), func(ok bool) { res <- ok })
		for i := range tx.msgs {
			if !ch.c.srv.pub.submit(ch.c.ctx, tx.msgs[i], done) {
				return errShutdown()
			}
		}
		select {
		case ok := <-res:
			if !ok {
				return wire.InternalError("tx.commit: KubeMQ did not store every message")
			}
		case <-ch.c.ctx.Done():
			return errShutdown()
		}
	}
	if len(trims) > 0 {
		// drop-head queues are trimmed before commit-ok, as after a publish
		// the channel's later methods see the queue trimmed.
		var wg sync.WaitGroup
		wg.Add(len(trims))
		for _, q := range trims {
			ch.c.srv.requestTrim(q, wg.Done)
		}
		wg.Wait()
	}
	ch.settleRejects(tx.settles, tx.requeue, tx.reject)
	if refused {
		// RabbitMQ: a queue refused a copy, so the commit did not complete
		// (what fit is stored, the settlements are applied).
		return wire.PreconditionFailed("partial tx completion")
	}
	ch.send(&wire.TxCommitOk{})
	return nil
}

// txLimit is what a transactional copy into a length-limited queue needs
// at the commit: the queue, and the message for reject-publish-dlx.
type txLimit struct {
	q             *queue
	exchange, key string
	props         *wire.Properties
	body          []byte
}

// applyTxLimits applies the length limits of the queues a transaction's
// copies go to, in publish order, as RabbitMQ enqueues them at the commit:
// reject-publish drops a copy that would take its queue over the limit
// (there are no confirms in a transaction), reject-publish-dlx
// dead-letters it (and the commit then fails, refused); drop-head queues
// are returned to be trimmed once the copies are stored. It returns the
// copies to store.
func (ch *channel) applyTxLimits(tx *txState) (out []pubCopy, trims []*queue, refused bool, err error) {
	type level struct{ n, bytes int64 } // a queue's ready messages and body bytes so far
	length := map[*queue]level{}
	out = tx.msgs[:0]
	for i, cp := range tx.msgs {
		lim := tx.limits[i]
		if lim == nil {
			out = append(out, cp)
			continue
		}
		q := lim.q
		if q.overflow == "drop-head" {
			if !slices.Contains(trims, q) {
				trims = append(trims, q)
			}
			out = append(out, cp)
			continue
		}
		size := int64(len(lim.body))
		lv, ok := length[q]
		if !ok {
			l, known, err := ch.queueLength(q)
			if err != nil {
				return nil, nil, false, err
			}
			if !known {
				l = -1 << 62 // KubeMQ cannot count it: nothing is refused
			} else if q.limitsBytes() {
				if lv.bytes, err = ch.c.srv.readyBytes(ch.c.ctx, q, l, size); err != nil {
					return nil, nil, false, err
				}
			}
			lv.n = l
		}
		if (q.maxLen >= 0 && lv.n+1 > q.maxLen) || (q.limitsBytes() && lv.n >= 0 && lv.bytes+size > q.maxBytes) {
			refused = true
			if q.overflow == "reject-publish-dlx" {
				ch.c.srv.deadLetterRefused(q, lim.exchange, lim.key, lim.props, lim.body)
			}
			length[q] = lv
			continue
		}
		length[q] = level{lv.n + 1, lv.bytes + size}
		out = append(out, cp)
	}
	return out, trims, refused, nil
}

func (ch *channel) txRollback() error {
	if ch.tx == nil {
		return wire.PreconditionFailed("channel is not transactional")
	}
	// Settlements made inside the transaction are undone: the deliveries
	// are unacknowledged again.
	ch.restore(ch.tx.settles)
	ch.tx = &txState{}
	ch.send(&wire.TxRollbackOk{})
	return nil
}
