package amqp091

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"strings"
	"time"

	"github.com/kubemq-io/kubemq-proxy/amqp091/routing"
	"github.com/kubemq-io/kubemq-proxy/amqp091/wire"
)

// Exchange, queue and binding management, following rabbit_channel's
// checks and texts in RabbitMQ 3.10.

// genName returns a server-generated name as RabbitMQ makes them:
// prefix-<22 url-safe base64 characters>.
func genName(prefix string) string {
	var b [16]byte
	rand.Read(b[:])
	return prefix + "-" + base64.RawURLEncoding.EncodeToString(b[:])
}

func reserved(name string) bool { return strings.HasPrefix(name, "amq.") }

// backendCtx bounds one topology write to KubeMQ.
func (ch *channel) backendCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(ch.c.ctx, 30*time.Second)
}

func (ch *channel) exchangeDeclare(m *wire.ExchangeDeclare) error {
	vh, vn := ch.c.vh, ch.c.vhostName
	if m.Passive {
		if m.Exchange == "" {
			return errDefaultExchange()
		}
		if _, ok := vh.routes.Exchange(m.Exchange); !ok && !(ch.c.srv.catchUp(ch.c.ctx) && vh.hasExchange(m.Exchange)) {
			return errNoExchange(m.Exchange, vn)
		}
		if !m.NoWait {
			ch.send(&wire.ExchangeDeclareOk{})
		}
		return nil
	}
	kind, ok := routing.ParseKind(m.Type)
	delayed := false
	if !ok && m.Type == routing.DelayedType {
		// The delayed-message plugin's exchange routes as its
		// x-delayed-type (delayed.go).
		t, _ := m.Arguments["x-delayed-type"].(string)
		if kind, ok = routing.ParseKind(t); !ok {
			return wire.PreconditionFailed("Invalid argument, 'x-delayed-type' must be an existing exchange type")
		}
		delayed = true
	}
	if !ok {
		// A connection error in RabbitMQ (other plugin types end here).
		return wire.CommandInvalid("unknown exchange type '%s'", m.Type)
	}
	if m.Exchange == "" {
		return errDefaultExchange()
	}
	vh.declMu.Lock()
	defer vh.declMu.Unlock()
	x, exists := vh.routes.Exchange(m.Exchange)
	if !exists {
		if reserved(m.Exchange) {
			return wire.AccessRefused("exchange name '%s' contains reserved prefix 'amq.*'", m.Exchange)
		}
		if v, ok := m.Arguments["alternate-exchange"]; ok {
			if _, isStr := v.(string); !isStr {
				return wire.PreconditionFailed("invalid type '%s' for arg 'alternate-exchange' in %s", wire.ErlangType(v), rsExchange(m.Exchange, vn))
			}
		}
		x = routing.Exchange{Name: m.Exchange, Kind: kind, Durable: m.Durable, AutoDelete: m.AutoDelete,
			Internal: m.Internal, Args: m.Arguments, Delayed: delayed}
		ctx, cancel := ch.backendCtx()
		err := vh.putExchangeRecord(ctx, x)
		cancel()
		if err != nil {
			return err
		}
		vh.routes.PutExchange(x)
	}
	rs := rsExchange(m.Exchange, vn)
	if x.Kind != kind || x.Delayed != delayed {
		return inequivalent("type", rs, m.Type, x.TypeName())
	}
	for _, f := range []struct {
		name      string
		got, have bool
	}{{"durable", m.Durable, x.Durable}, {"auto_delete", m.AutoDelete, x.AutoDelete}, {"internal", m.Internal, x.Internal}} {
		if f.got != f.have {
			return inequivalent(f.name, rs, fmt.Sprint(f.got), fmt.Sprint(f.have))
		}
	}
	if err := assertArgsEquivalent(x.Args, m.Arguments, rs, exchangeArgKeys); err != nil {
		return err
	}
	if !m.NoWait {
		ch.send(&wire.ExchangeDeclareOk{})
	}
	return nil
}

func (ch *channel) exchangeDelete(m *wire.ExchangeDelete) error {
	vh, vn := ch.c.vh, ch.c.vhostName
	if m.Exchange == "" {
		return errDefaultExchange()
	}
	if reserved(m.Exchange) {
		return wire.AccessRefused("deletion of system %s not allowed", rsExchange(m.Exchange, vn))
	}
	vh.declMu.Lock()
	defer vh.declMu.Unlock()
	x, ok := vh.routes.Exchange(m.Exchange)
	if ok {
		if m.IfUnused && vh.routes.HasBindingsFrom(m.Exchange) {
			return wire.PreconditionFailed("%s in use", rsExchange(m.Exchange, vn))
		}
		ctx, cancel := ch.backendCtx()
		defer cancel()
		if err := vh.deleteExchangeRecord(ctx, x); err != nil {
			return err
		}
		r := vh.routes.DeleteExchange(x.Name)
		if x.Delayed {
			ch.c.srv.stopDelayHolder(vh, x.Name)
		}
		if len(r.Exchanges) > 0 {
			r.Exchanges = r.Exchanges[1:] // x's tombstone is written
		}
		if err := vh.persistRemoval(ctx, r, nil); err != nil {
			return err
		}
	}
	if !m.NoWait {
		ch.send(&wire.ExchangeDeleteOk{})
	}
	return nil
}

func (ch *channel) exchangeBind(m *wire.ExchangeBind) error {
	if err := ch.bind(routing.Binding{Source: m.Source, Dest: routing.ExchangeDest(m.Destination), Key: m.RoutingKey, Args: m.Arguments}, true); err != nil {
		return err
	}
	if !m.NoWait {
		ch.send(&wire.ExchangeBindOk{})
	}
	return nil
}

func (ch *channel) exchangeUnbind(m *wire.ExchangeUnbind) error {
	if err := ch.bind(routing.Binding{Source: m.Source, Dest: routing.ExchangeDest(m.Destination), Key: m.RoutingKey, Args: m.Arguments}, false); err != nil {
		return err
	}
	if !m.NoWait {
		ch.send(&wire.ExchangeUnbindOk{})
	}
	return nil
}

func (ch *channel) queueBind(m *wire.QueueBind) error {
	name, key := m.Queue, m.RoutingKey
	if name == "" {
		name = ch.lastQueue
		if key == "" {
			key = name // RabbitMQ's routing-key shortcut
		}
	}
	if err := ch.bindQueue(m.Queue, routing.Binding{Source: m.Exchange, Dest: routing.QueueDest(name), Key: key, Args: m.Arguments}, true); err != nil {
		return err
	}
	if !m.NoWait {
		ch.send(&wire.QueueBindOk{})
	}
	return nil
}

func (ch *channel) queueUnbind(m *wire.QueueUnbind) error {
	name, key := m.Queue, m.RoutingKey
	if name == "" {
		name = ch.lastQueue
		if key == "" {
			key = name
		}
	}
	if err := ch.bindQueue(m.Queue, routing.Binding{Source: m.Exchange, Dest: routing.QueueDest(name), Key: key, Args: m.Arguments}, false); err != nil {
		return err
	}
	ch.send(&wire.QueueUnbindOk{})
	return nil
}

// bindQueue checks the queue (shortcut and exclusive access) and binds.
func (ch *channel) bindQueue(asNamed string, b routing.Binding, add bool) error {
	if b.Source == "" {
		return errDefaultExchange()
	}
	if asNamed == "" && ch.lastQueue == "" {
		return wire.NotFound("no previously declared queue")
	}
	return ch.bind(b, add)
}

// bind adds or removes a binding after RabbitMQ's checks: never the
// default exchange, both ends must exist to bind (source first), an
// exclusive queue only from its owner, and headers arguments must be
// valid. Removing a binding that does not exist, or whose ends do not, is
// not an error.
func (ch *channel) bind(b routing.Binding, add bool) error {
	vh, vn := ch.c.vh, ch.c.vhostName
	if b.Source == "" || (b.Dest.Exchange && b.Dest.Name == "") {
		return errDefaultExchange()
	}
	if add && !vh.hasEnds(b) {
		ch.c.srv.catchUp(ch.c.ctx) // before declMu
	}
	vh.declMu.Lock()
	defer vh.declMu.Unlock()
	// Unbinding is idempotent: RabbitMQ 3.10 answers unbind-ok even when an
	// end is missing.
	src, ok := vh.routes.Exchange(b.Source)
	if !ok {
		if !add {
			return nil
		}
		return errNoExchange(b.Source, vn)
	}
	durable := src.Durable
	if b.Dest.Exchange {
		d, ok := vh.routes.Exchange(b.Dest.Name)
		if !ok {
			if !add {
				return nil
			}
			return errNoExchange(b.Dest.Name, vn)
		}
		durable = durable && d.Durable
	} else {
		q := vh.lookupQueue(b.Dest.Name)
		if q == nil {
			if !add {
				return nil
			}
			return errNoQueue(b.Dest.Name, vn)
		}
		if !q.accessibleBy(ch.c) {
			return errLocked(q.name, vn)
		}
		durable = durable && q.persistent()
	}
	ctx, cancel := ch.backendCtx()
	defer cancel()
	if add {
		if msg := routing.ValidateBinding(src.Kind, b.Args); msg != "" {
			return wire.PreconditionFailed("%s", msg)
		}
		if vh.routes.HasBinding(b) {
			return nil
		}
		if err := vh.putBindingRecord(ctx, b, durable); err != nil {
			return err
		}
		vh.routes.Bind(b)
		return nil
	}
	if !vh.routes.HasBinding(b) {
		return nil
	}
	if err := vh.deleteBindingRecord(ctx, b, durable); err != nil {
		return err
	}
	r, ok := vh.routes.Unbind(b)
	if ok {
		r.Bindings = r.Bindings[1:] // b itself, whose tombstone is written
	}
	return vh.persistRemoval(ctx, r, nil)
}

func (ch *channel) queueDeclare(m *wire.QueueDeclare) error {
	vh, vn := ch.c.vh, ch.c.vhostName
	if strings.HasPrefix(m.Queue, replyToQueue) {
		if err := ch.declareReplyTo(m); err != nil {
			return err
		}
		ch.lastQueue = m.Queue
		return nil
	}
	if m.Passive {
		name := m.Queue
		if name == "" {
			name = ch.lastQueue
		}
		q := vh.lookupQueue(name)
		if q == nil && ch.c.srv.catchUp(ch.c.ctx) {
			q = vh.lookupQueue(name)
		}
		if q == nil {
			return errNoQueue(name, vn)
		}
		if !q.accessibleBy(ch.c) {
			return errLocked(name, vn)
		}
		q.touch() // a use too (x-expires): RabbitMQ's stat restarts the timer
		return ch.declareOk(q, m.NoWait)
	}
	name := m.Queue
	if name == "" {
		name = genName("amq.gen")
	} else if reserved(name) {
		return wire.AccessRefused("queue name '%s' contains reserved prefix 'amq.*'", name)
	}
	var owner *conn
	if m.Exclusive {
		owner = ch.c
	}
	vh.declMu.Lock()
	q := vh.lookupQueue(name)
	if q == nil {
		if err := validateQueueArgs(m, name, vn); err != nil {
			vh.declMu.Unlock()
			return err
		}
		// An exclusive queue keeps the durable flag it was declared with
		// (RabbitMQ 3.10 compares it on redeclare) but dies with its
		// connection, so it is never a registry record (persistent).
		vh.mu.Lock()
		incarnation := vh.incarnations[name]
		vh.mu.Unlock()
		q = newQueue(vh, name, m.Durable, m.Exclusive, m.AutoDelete, m.Arguments, owner, incarnation)
		if !q.persistent() {
			q.replica = vh.top.replicaID()
		}
		ctx, cancel := ch.backendCtx()
		err := vh.putQueueRecord(ctx, q)
		cancel()
		if err != nil {
			vh.declMu.Unlock()
			return err
		}
		vh.mu.Lock()
		vh.queues[name] = q
		vh.mu.Unlock()
		vh.routes.PutQueue(name)
		if owner != nil {
			owner.own(q)
		}
		vh.declMu.Unlock()
		ch.c.srv.startReaper(q)
		ch.lastQueue = name
		if m.Queue == "" {
			// A fresh server-named queue: nothing can be in it yet.
			if !m.NoWait {
				ch.send(&wire.QueueDeclareOk{Queue: name})
			}
			return nil
		}
		// Its KubeMQ channel may already hold messages (sent by native
		// KubeMQ clients, or kept while the queue was not declared here):
		// the count says what a consumer will get.
		return ch.declareOk(q, m.NoWait)
	}
	vh.declMu.Unlock()
	rs := rsQueue(name, vn)
	if q.owner != owner || (q.exclusive && q.owner == nil) {
		return errLocked(name, vn) // exclusive here or in another replica
	}
	if q.durable != m.Durable {
		return inequivalent("durable", rs, fmt.Sprint(m.Durable), fmt.Sprint(q.durable))
	}
	if q.autoDelete != m.AutoDelete {
		return inequivalent("auto_delete", rs, fmt.Sprint(m.AutoDelete), fmt.Sprint(q.autoDelete))
	}
	if err := assertArgsEquivalent(q.args, m.Arguments, rs, queueArgKeys); err != nil {
		return err
	}
	q.touch() // a redeclare is a use (x-expires)
	ch.lastQueue = name
	return ch.declareOk(q, m.NoWait)
}

// declareOk answers a declare of an existing queue with its counts: ready
// messages from KubeMQ, consumers of this proxy. The declare is a use of q
// (x-expires), which another replica that holds q learns with the count.
func (ch *channel) declareOk(q *queue, noWait bool) error {
	ch.lastQueue = q.name
	if noWait {
		if q.expires > 0 {
			ch.c.srv.useRemote(q)
		}
		return nil
	}
	if err := ch.awaitPublishes(); err != nil {
		return err
	}
	n, _, consumers, err := ch.c.srv.counts(ch.c.ctx, q, true) // 0 when KubeMQ cannot count the queue
	if err != nil {
		return err
	}
	ch.send(&wire.QueueDeclareOk{Queue: q.name, MessageCount: n, ConsumerCount: uint32(consumers)})
	return nil
}

func (ch *channel) queuePurge(m *wire.QueuePurge) error {
	q, err := ch.queueFor(m.Queue)
	if err != nil {
		return err
	}
	if err := ch.awaitPublishes(); err != nil {
		return err
	}
	n, err := ch.c.srv.purge(ch.c.ctx, q)
	if err != nil {
		return err
	}
	if !m.NoWait {
		ch.send(&wire.QueuePurgeOk{MessageCount: n})
	}
	return nil
}

func (ch *channel) queueDelete(m *wire.QueueDelete) error {
	vh, vn := ch.c.vh, ch.c.vhostName
	name := m.Queue
	if name == "" {
		if ch.lastQueue == "" {
			return wire.NotFound("no previously declared queue")
		}
		name = ch.lastQueue
	}
	q := vh.lookupQueue(name)
	if q == nil && ch.c.srv.catchUp(ch.c.ctx) {
		q = vh.lookupQueue(name)
	}
	if q == nil {
		// Deleting a missing queue is fine in RabbitMQ.
		if !m.NoWait {
			ch.send(&wire.QueueDeleteOk{})
		}
		return nil
	}
	if !q.accessibleBy(ch.c) {
		return errLocked(name, vn)
	}
	if m.IfUnused {
		vh.mu.Lock()
		n := len(q.consumers)
		vh.mu.Unlock()
		if n == 0 && ch.c.srv.peers != nil {
			// Consumers of other replicas are known to the queue's holder.
			var err error
			if _, _, n, err = ch.c.srv.counts(ch.c.ctx, q, false); err != nil {
				return err
			}
		}
		if n > 0 {
			return wire.PreconditionFailed("%s in use", rsQueue(name, vn))
		}
	}
	if err := ch.awaitPublishes(); err != nil {
		return err
	}
	if m.IfEmpty {
		n, known, err := ch.c.srv.readyCount(ch.c.ctx, q)
		if err != nil {
			return err
		}
		// A queue KubeMQ cannot count is not known to be empty.
		if n > 0 || !known {
			return wire.PreconditionFailed("%s not empty", rsQueue(name, vn))
		}
	}
	n, err := ch.c.srv.deleteQueue(ch.c.ctx, q, "queue deleted")
	if err != nil {
		return err
	}
	if !m.NoWait {
		ch.send(&wire.QueueDeleteOk{MessageCount: n})
	}
	return nil
}

// inequivalent is RabbitMQ's 406 for a redeclare that differs.
func inequivalent(field, rs, received, current string) *wire.Error {
	return wire.PreconditionFailed("inequivalent arg '%s' for %s: received '%s' but current is '%s'", field, rs, received, current)
}

// Arguments RabbitMQ compares on redeclare.
var (
	exchangeArgKeys = []string{"alternate-exchange"}
	queueArgKeys    = []string{"x-expires", "x-message-ttl", "x-dead-letter-exchange", "x-dead-letter-routing-key",
		"x-max-length", "x-max-length-bytes", "x-max-in-memory-length", "x-max-in-memory-bytes", "x-max-priority",
		"x-overflow", "x-queue-mode", "x-queue-type", "x-single-active-consumer", "x-delivery-limit",
		"x-dead-letter-strategy", "x-queue-version"}
)

// assertArgsEquivalent is rabbit_misc:assert_args_equivalence: for each key
// RabbitMQ compares, integers of any width are compatible, values must be
// equal, and the texts describe what differs.
func assertArgsEquivalent(have, got wire.Table, rs string, keys []string) error {
	for _, k := range keys {
		hv, hok := have[k]
		gv, gok := got[k]
		switch {
		case !hok && !gok:
			continue
		case hok && gok:
			if argEqual(hv, gv) {
				continue
			}
			return wire.PreconditionFailed("inequivalent arg '%s' for %s: received '%s' but current is '%s'", k, rs, erlangValue(gv), erlangValue(hv))
		case k == "x-queue-type" && (isString(hv, "classic") || isString(gv, "classic")):
			continue // a classic queue declared with or without the argument
		}
		return wire.PreconditionFailed("inequivalent arg '%s' for %s: received %s but current is %s", k, rs, typedValue(gv, gok), typedValue(hv, hok))
	}
	return nil
}

func isString(v any, s string) bool {
	x, ok := v.(string)
	return ok && x == s
}

func argEqual(a, b any) bool {
	if x, ok := intArg(a); ok {
		y, ok := intArg(b)
		return ok && x == y
	}
	return fmt.Sprintf("%T:%v", a, a) == fmt.Sprintf("%T:%v", b, b)
}

func typedValue(v any, ok bool) string {
	if !ok {
		return "none"
	}
	return fmt.Sprintf("the value '%s' of type '%s'", erlangValue(v), wire.ErlangType(v))
}

func erlangValue(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case []byte:
		return string(x)
	case nil:
		return "undefined"
	}
	return fmt.Sprint(v)
}

// intArg reads an integer argument of any integer field type.
func intArg(v any) (int64, bool) {
	switch n := v.(type) {
	case int8:
		return int64(n), true
	case uint8:
		return int64(n), true
	case int16:
		return int64(n), true
	case uint16:
		return int64(n), true
	case int32:
		return int64(n), true
	case uint32:
		return int64(n), true
	case int64:
		return n, true
	case int:
		return int64(n), true
	}
	return 0, false
}

// validateQueueArgs applies RabbitMQ's argument checks to a new queue. The
// arguments are stored and compared on redeclare; the proxy does not act
// on them (see the package documentation).
func validateQueueArgs(m *wire.QueueDeclare, name, vn string) error {
	rs := rsQueue(name, vn)
	bad := func(k, reason string) error {
		return wire.PreconditionFailed("invalid arg '%s' for %s: %s", k, rs, reason)
	}
	args := m.Arguments
	intCheck := func(k string, zeroOK bool, maxV int64) error {
		v, ok := args[k]
		if !ok {
			return nil
		}
		n, isInt := intArg(v)
		switch {
		case !isInt:
			return bad(k, fmt.Sprintf("{unacceptable_type,%s}", wire.ErlangType(v)))
		case n < 0:
			return bad(k, fmt.Sprintf("{value_negative,%d}", n))
		case n == 0 && !zeroOK:
			return bad(k, "{value_zero,0}")
		case maxV > 0 && n > maxV:
			return bad(k, fmt.Sprintf("{max_value_exceeded,%d}", n))
		}
		return nil
	}
	for _, c := range []struct {
		k      string
		zeroOK bool
		max    int64
	}{
		{"x-expires", false, 1<<32 - 1}, {"x-message-ttl", true, 1<<32 - 1}, {"x-max-length", true, 0},
		{"x-max-length-bytes", true, 0}, {"x-max-priority", true, 255}, {"x-delivery-limit", true, 0},
	} {
		if err := intCheck(c.k, c.zeroOK, c.max); err != nil {
			return err
		}
	}
	strCheck := func(k string) (string, bool, error) {
		v, ok := args[k]
		if !ok {
			return "", false, nil
		}
		s, isStr := v.(string)
		if !isStr {
			return "", true, bad(k, fmt.Sprintf("{unacceptable_type,%s}", wire.ErlangType(v)))
		}
		return s, true, nil
	}
	if _, _, err := strCheck("x-dead-letter-exchange"); err != nil {
		return err
	}
	if _, ok, err := strCheck("x-dead-letter-routing-key"); err != nil {
		return err
	} else if ok {
		if _, dlx := args["x-dead-letter-exchange"]; !dlx {
			return bad("x-dead-letter-routing-key", "routing_key_but_no_dlx_defined")
		}
	}
	if s, ok, err := strCheck("x-overflow"); err != nil {
		return err
	} else if ok && s != "drop-head" && s != "reject-publish" && s != "reject-publish-dlx" {
		return bad("x-overflow", "invalid_overflow")
	}
	if v, ok := args["x-single-active-consumer"]; ok {
		if _, isBool := v.(bool); !isBool {
			return bad("x-single-active-consumer", fmt.Sprintf("{unacceptable_type,%s}", wire.ErlangType(v)))
		}
	}
	if qt, ok, err := strCheck("x-queue-type"); err != nil {
		return err
	} else if ok {
		switch qt {
		case "classic":
		case "quorum":
			// Accepted as a classic queue with a quorum queue's constraints.
			switch {
			case !m.Durable:
				return wire.PreconditionFailed("invalid property 'non-durable' for %s", rs)
			case m.Exclusive:
				return wire.PreconditionFailed("invalid property 'exclusive-owner' for %s", rs)
			case m.AutoDelete:
				return wire.PreconditionFailed("invalid property 'auto-delete' for %s", rs)
			}
		case "stream":
			if !m.Durable {
				return wire.PreconditionFailed("invalid property 'non-durable' for %s", rs)
			}
			// Streams need an append-only log with offsets: not provided.
			return bad("x-queue-type", "\"unsupported queue type 'stream'\"")
		default:
			return bad("x-queue-type", fmt.Sprintf("\"unsupported queue type '%s'\"", qt))
		}
	}
	return nil
}
