package amqp091

import (
	"slices"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/kubemq-io/kubemq-proxy/amqp091/wire"
	"github.com/kubemq-io/kubemq-proxy/delivery"
	"github.com/kubemq-io/kubemq-proxy/kubemqclient"
)

// Dead-lettering as RabbitMQ 3.10 does it (rabbit_dead_letter): a message
// rejected or nacked without requeue, expired, or dropped from the head of
// a full queue is republished to the queue's x-dead-letter-exchange with
// its x-dead-letter-routing-key (or its own routing key), an x-death entry
// for (queue, reason), the x-first-death-* headers on its first death, and
// its expiration property moved into x-death's original-expiration.
//
// Durability: the dead-lettered copies are stored in their target queues
// before the source lease is acked (done runs only then), so a crash in
// between duplicates the message and never loses it.

// Dead-letter reasons (x-death "reason").
const (
	reasonRejected = "rejected"
	reasonExpired  = "expired"
	reasonMaxLen   = "maxlen"
	// reasonDeliveryLimit: a quorum queue's message returned more often
	// than its x-delivery-limit.
	reasonDeliveryLimit = "delivery_limit"
)

// tagExpiresAt is a stored copy's expiry in Unix milliseconds (the proxy's
// clock when it enqueued the copy plus the shorter of the queue's and the
// message's TTL). KubeMQ expires in whole seconds only; the proxy expires
// exactly by this tag when it hands messages out (expiry.go).
const tagExpiresAt = "x-amqp-expires-at"

// storedCopy is the KubeMQ message q stores for a message enqueued now with
// metadata, tags and body; msgTTL is the message's expiration property
// (when hasMsgTTL). tags is shared and not modified.
func (q *queue) storedCopy(meta string, tags map[string]string, body []byte, msgTTL time.Duration, hasMsgTTL bool, now time.Time) kubemqclient.QueueMessage {
	m := kubemqclient.QueueMessage{Channel: q.storeChannel(tags), Metadata: meta, Body: body, Tags: tags}
	exp, has := msgTTL, hasMsgTTL
	if q.hasTTL && (!has || q.ttl < exp) {
		exp, has = q.ttl, true
	}
	if !has {
		return m
	}
	t := make(map[string]string, len(tags)+1)
	for k, v := range tags {
		t[k] = v
	}
	t[tagExpiresAt] = strconv.FormatInt(now.UnixMilli()+exp.Milliseconds(), 10)
	m.Tags = t
	if !q.hasDLX && exp > 0 {
		// KubeMQ's expiry (whole seconds, rounded up) as a backstop for a
		// queue nobody reads; not with a dead-letter exchange, where KubeMQ
		// would drop what must be dead-lettered.
		m.Policy.Expiration = exp
	}
	return m
}

// expiresAt reports when d expires (ok false: never): its tag, or for a
// message without one (a native KubeMQ client's) the queue's TTL from when
// KubeMQ stored it.
func (q *queue) expiresAt(d *delivery.Delivery) (time.Time, bool) {
	if v, ok := d.Tags[tagExpiresAt]; ok {
		if ms, err := strconv.ParseInt(v, 10, 64); err == nil {
			return time.UnixMilli(ms), true
		}
	}
	if q.hasTTL && !d.StoredAt.IsZero() {
		return d.StoredAt.Add(q.ttl), true
	}
	return time.Time{}, false
}

// expired reports whether d's time has passed at now. A TTL of 0 expires a
// message unless it is handed out in the millisecond it was enqueued.
func (q *queue) expired(d *delivery.Delivery, now time.Time) bool {
	t, ok := q.expiresAt(d)
	return ok && now.UnixMilli() > t.UnixMilli()
}

// deadLetter dead-letters d, which q held, for reason: it stores the
// dead-lettered copies and then calls done(true); done(false) when they
// could not be stored (the caller gives d back). A queue without a
// dead-letter exchange, an exchange that does not exist, no route or
// a cycle drop the message, as in RabbitMQ: done(true) at once.
func (s *Server) deadLetter(q *queue, d *delivery.Delivery, reason string, done func(ok bool)) {
	if !q.hasDLX {
		done(true)
		return
	}
	s.m.deadLettered.WithLabelValues(reason).Inc()
	exchange, key, props := decodeMessage(q.name, d.Metadata, d.Tags)
	s.deadLetterMessage(q, exchange, key, props, d.Body, reason, done)
}

// deadLetterMessage is deadLetter of a message given by its parts (a
// publish refused by reject-publish-dlx has no delivery).
func (s *Server) deadLetterMessage(q *queue, exchange, key string, props wire.Properties, body []byte, reason string, done func(ok bool)) {
	vh := q.vh
	headers, keys := deathHeaders(props, q, exchange, key, reason, time.Now())
	props.Headers = headers
	props.Flags |= wire.FlagHeaders
	props.Flags &^= wire.FlagExpiration
	props.Expiration = ""
	var targets []string
	for _, k := range keys {
		r, err := vh.routes.Route(q.dlx, k, headers, nil)
		if err != nil { // no such exchange: dropped, as in RabbitMQ
			continue
		}
		for _, name := range r {
			if !slices.Contains(targets, name) {
				targets = append(targets, name)
			}
		}
	}
	meta, tags, err := encodeMessage(q.dlx, keys[0], &props)
	if err != nil {
		s.log.Warn("dead-lettering: cannot store message", zap.String("queue", q.name), zap.Error(err))
		done(true)
		return
	}
	deaths, _ := headers["x-death"].([]any)
	now := time.Now()
	var copies []pubCopy
	var limited []*queue // drop-head targets: trimmed once the copies are stored
	var reap []*queue    // TTL targets: their reapers look at the head once the copies are stored
	for _, name := range targets {
		if reason != reasonRejected && deathCycle(name, deaths) {
			s.log.Warn("dead-letter cycle: message dropped", zap.String("queue", q.name), zap.String("target", name))
			continue
		}
		t := vh.lookupQueue(name)
		if t == nil {
			continue
		}
		t.markUsed()
		if t.limitsLength() && t.overflow != "drop-head" && s.refuseRouted(t, q.dlx, keys[0], &props, body) {
			continue
		}
		if t.dropsHead() {
			limited = append(limited, t)
		}
		if t.hasTTL {
			reap = append(reap, t)
		}
		copies = append(copies, pubCopy{msg: t.storedCopy(meta, tags, body, 0, false, now), stats: t.counters(), q: t, ledger: t.ledger(), log: s.log})
	}
	if len(copies) == 0 {
		done(true)
		return
	}
	pd := newPubDone(len(copies), func(ok bool) {
		for _, t := range reap {
			s.startReaper(t) // or wakes it: the head may be new
		}
		for _, t := range limited {
			s.requestTrim(t, func() {})
		}
		done(ok)
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

// deathHeaders returns the headers of the dead-lettered copy of a message
// with headers props.Headers, published to exchange with key, dying in q
// for reason, and the routing keys it is dead-lettered with
// (rabbit_dead_letter:make_msg and update_x_death_header of RabbitMQ 3.10).
func deathHeaders(props wire.Properties, q *queue, exchange, key, reason string, now time.Time) (wire.Table, []string) {
	h := make(wire.Table, len(props.Headers)+4)
	for k, v := range props.Headers {
		h[k] = v
	}
	// The keys it was published with: its routing key and its CC header.
	rks := []any{key}
	if cc, ok := h["CC"].([]any); ok {
		for _, v := range cc {
			if s, ok := v.(string); ok {
				rks = append(rks, s)
			}
		}
	}
	info := wire.Table{
		"reason":       reason,
		"queue":        q.name,
		"time":         now.Truncate(time.Second).UTC(),
		"exchange":     exchange,
		"routing-keys": rks,
	}
	if props.Flags&wire.FlagExpiration != 0 {
		info["original-expiration"] = props.Expiration
	}
	deaths, isArray := h["x-death"].([]any)
	if !isArray {
		h["x-first-death-reason"] = reason
		h["x-first-death-queue"] = q.name
		h["x-first-death-exchange"] = exchange
		info["count"] = int64(1)
		h["x-death"] = []any{info}
	} else {
		entry := info
		others := make([]any, 0, len(deaths))
		found := false
		for _, d := range deaths {
			t, ok := d.(wire.Table)
			if !found && ok && t["queue"] == q.name && t["reason"] == reason {
				// The same death again: its count grows, the rest stays.
				e := make(wire.Table, len(t))
				for k, v := range t {
					e[k] = v
				}
				n, _ := intArg(t["count"])
				e["count"] = n + 1
				entry, found = e, true
				continue
			}
			others = append(others, d)
		}
		if !found {
			entry["count"] = int64(1)
		}
		h["x-death"] = append([]any{entry}, others...)
	}
	keys := []string{key}
	if q.hasDLRK {
		keys = []string{q.dlrk}
		delete(h, "CC")
	} else {
		for _, k := range rks[1:] {
			keys = append(keys, k.(string))
		}
	}
	return h, keys
}

// deathCycle reports whether dead-lettering to queue closes a cycle of
// automatic deaths (rabbit_dead_letter:is_cycle): queue appears in deaths
// and no death from the newest back to that one was a rejection.
func deathCycle(queue string, deaths []any) bool {
	for _, d := range deaths {
		t, ok := d.(wire.Table)
		if !ok {
			return false // something a client put there: not automatic
		}
		if t["reason"] == reasonRejected {
			return false
		}
		if t["queue"] == queue {
			return true
		}
	}
	return false
}
