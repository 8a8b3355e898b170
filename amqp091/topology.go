package amqp091

import (
	"context"
	"encoding/json"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/kubemq-io/kubemq-proxy/amqp091/routing"
	"github.com/kubemq-io/kubemq-proxy/amqp091/wire"
	"github.com/kubemq-io/kubemq-proxy/kubemqclient"
	"github.com/kubemq-io/kubemq-proxy/registry"
)

// Registry record kinds. Durable exchanges, durable queues and the bindings
// between durable ends are records, shared by every replica and surviving
// restarts; with replicas, non-durable topology has records of its own
// kinds (transient.go); without, it lives in this process only.
const (
	kindExchange = "amqp.exchange"
	kindQueue    = "amqp.queue"
	kindBinding  = "amqp.binding"
	// kindIncarnation records, per queue name that was deleted after use,
	// the incarnation its next declaration takes (see queueChannel).
	kindIncarnation = "amqp.queue-incarnation"
)

type exchangeRecord struct {
	Vhost      string `json:"vhost"`
	Name       string `json:"name"`
	Type       string `json:"type"`
	AutoDelete bool   `json:"auto_delete,omitempty"`
	Internal   bool   `json:"internal,omitempty"`
	Args       []byte `json:"args,omitempty"`    // AMQP field table, wire encoding
	Replica    string `json:"replica,omitempty"` // non-durable exchanges (kindTExchange): the replica that keeps it
}

type queueRecord struct {
	Vhost       string `json:"vhost"`
	Name        string `json:"name"`
	AutoDelete  bool   `json:"auto_delete,omitempty"`
	Args        []byte `json:"args,omitempty"`
	Incarnation uint64 `json:"incarnation,omitempty"`
	// Non-durable queues (kindTQueue) only: the replica that declared it,
	// and its flags.
	Replica   string `json:"replica,omitempty"`
	Durable   bool   `json:"durable,omitempty"`
	Exclusive bool   `json:"exclusive,omitempty"`
}

type incarnationRecord struct {
	Vhost       string `json:"vhost"`
	Name        string `json:"name"`
	Incarnation uint64 `json:"incarnation"`
}

type bindingRecord struct {
	Vhost        string `json:"vhost"`
	Source       string `json:"source"`
	DestExchange bool   `json:"dest_exchange,omitempty"`
	Dest         string `json:"dest"`
	Key          string `json:"key"`
	Args         []byte `json:"args,omitempty"`
}

func recordKey(parts ...string) string {
	b, _ := json.Marshal(parts)
	return string(b)
}

func encodeArgs(t wire.Table) []byte {
	if len(t) == 0 {
		return nil
	}
	b, err := wire.AppendTable(nil, t)
	if err != nil {
		return nil
	}
	return b
}

func decodeArgs(b []byte) wire.Table {
	if len(b) == 0 {
		return nil
	}
	t, err := wire.DecodeTable(b)
	if err != nil {
		return nil
	}
	return t
}

// vhostKey maps a client's virtual host name to the one used in KubeMQ
// channel names and registry records: "/" is "default".
func vhostKey(name string) string {
	if name == "/" || name == "" {
		return "default"
	}
	return name
}

// displayName is v's name as clients give it: vhostKey's "default" is "/".
func (v *vhost) displayName() string {
	if v.key == "default" {
		return "/"
	}
	return v.key
}

// topology holds every virtual host this process knows.
type topology struct {
	srv *Server
	reg *registry.Registry // nil: durable entities are kept in memory only
	log *zap.Logger

	mu     sync.Mutex // guards vhosts
	vhosts map[string]*vhost

	sweeper sweeper // non-durable topology of gone replicas (transient.go)
}

func newTopology(srv *Server, reg *registry.Registry, log *zap.Logger) *topology {
	return &topology{srv: srv, reg: reg, log: log, vhosts: map[string]*vhost{}}
}

// vhost returns the virtual host with key, creating it.
func (t *topology) vhost(key string) *vhost {
	t.mu.Lock()
	defer t.mu.Unlock()
	v := t.vhosts[key]
	if v == nil {
		v = &vhost{top: t, key: key, routes: routing.NewTable(), queues: map[string]*queue{}, incarnations: map[string]uint64{}}
		t.vhosts[key] = v
	}
	return v
}

// load applies every record the registry holds; watch applies later
// changes written by other replicas.
func (t *topology) load() {
	if t.reg == nil {
		return
	}
	for _, kind := range []string{kindIncarnation, kindExchange, kindTExchange, kindQueue, kindTQueue, kindBinding, kindTBinding} {
		for _, rec := range t.reg.List(kind) {
			t.apply(rec)
		}
	}
}

func (t *topology) watch() (cancel func()) {
	if t.reg == nil {
		return func() {}
	}
	return t.reg.OnChange(func(ch registry.Change) {
		if ch.Local {
			return // applied by the writer already
		}
		t.apply(ch.Record)
	})
}

// apply merges one registry record (a write or a tombstone) into memory. It
// runs on the registry's goroutine and must not block: consumer
// cancellations it causes are handed to the consumers' channels.
func (t *topology) apply(rec registry.Record) {
	var parts []string
	if err := json.Unmarshal([]byte(rec.Key), &parts); err != nil || len(parts) != 2 {
		return
	}
	v := t.vhost(parts[0])
	switch rec.Kind {
	case kindTExchange, kindTQueue, kindTBinding:
		t.applyTransient(v, parts, rec)
	case kindExchange:
		t.applyExchange(v, parts[1], rec, true)
	case kindQueue:
		if rec.Deleted {
			if q := v.lookupQueue(parts[1]); q != nil && q.persistent() {
				v.removeQueue(q, "deleted by another replica")
			}
			return
		}
		var r queueRecord
		if json.Unmarshal(rec.Value, &r) != nil {
			return
		}
		if q := v.lookupQueue(r.Name); q != nil && q.persistent() && q.incarnation != r.Incarnation {
			// Deleted and declared again by another replica.
			v.removeQueue(q, "deleted by another replica")
		}
		v.mu.Lock()
		var added *queue
		if _, ok := v.queues[r.Name]; !ok {
			added = newQueue(v, r.Name, true, false, r.AutoDelete, decodeArgs(r.Args), nil, r.Incarnation)
			v.queues[r.Name] = added
		}
		v.noteIncarnationLocked(r.Name, r.Incarnation)
		v.mu.Unlock()
		v.routes.PutQueue(r.Name)
		if added != nil && v.top.srv != nil {
			v.top.srv.startReaper(added)
		}
	case kindIncarnation:
		var r incarnationRecord
		if rec.Deleted || json.Unmarshal(rec.Value, &r) != nil {
			return
		}
		v.mu.Lock()
		v.noteIncarnationLocked(r.Name, r.Incarnation)
		v.mu.Unlock()
	case kindBinding:
		var r bindingRecord
		if rec.Deleted {
			// The tombstone has no value: find the binding by its id.
			for _, b := range v.routes.BindingsFrom(bindingSourceFromID(parts[1])) {
				if b.ID() == parts[1] {
					v.routes.Unbind(b)
				}
			}
			return
		}
		if json.Unmarshal(rec.Value, &r) != nil {
			return
		}
		v.routes.Bind(routing.Binding{Source: r.Source, Dest: routing.Dest{Exchange: r.DestExchange, Name: r.Dest},
			Key: r.Key, Args: decodeArgs(r.Args)})
	}
}

// applyExchange merges an exchange record (durable, or a non-durable one's of another
// replica) or its tombstone. A non-durable record never replaces a durable exchange.
func (t *topology) applyExchange(v *vhost, name string, rec registry.Record, durable bool) {
	if rec.Deleted {
		if x, ok := v.routes.Exchange(name); !ok || x.Durable != durable {
			return
		}
		r := v.routes.DeleteExchange(name)
		for _, x := range r.Exchanges {
			if x.Delayed && t.srv != nil {
				t.srv.stopDelayHolder(v, x.Name)
			}
		}
		return
	}
	var r exchangeRecord
	if json.Unmarshal(rec.Value, &r) != nil {
		return
	}
	args := decodeArgs(r.Args)
	kind, delayed, ok := parseExchangeType(r.Type, args)
	if !ok {
		return
	}
	if x, ok := v.routes.Exchange(r.Name); ok && x.Durable && !durable {
		return
	}
	v.routes.PutExchange(routing.Exchange{Name: r.Name, Kind: kind, Durable: durable,
		AutoDelete: r.AutoDelete, Internal: r.Internal, Args: args, Delayed: delayed})
	if delayed && t.srv != nil {
		t.srv.startDelayHolder(v, r.Name)
	}
}

// bindingSourceFromID extracts the source exchange from a routing.Binding
// ID (its first NUL-terminated field).
func bindingSourceFromID(id string) string {
	for i := 0; i < len(id); i++ {
		if id[i] == 0 {
			return id[:i]
		}
	}
	return id
}

// vhost is one virtual host: its routing table and its queues.
type vhost struct {
	top    *topology
	key    string
	routes *routing.Table

	// declMu serialises the topology changes of this vhost, registry writes
	// included, so check-then-act sequences (declare, bind, delete) are
	// atomic. Publishing only reads routes and never takes it.
	declMu sync.Mutex

	mu     sync.Mutex // guards queues, incarnations and every queue's consumer set
	queues map[string]*queue
	// incarnations holds, by queue name, the incarnation the name's next
	// declaration takes when it is not 0 (see queueChannel).
	incarnations map[string]uint64
}

// noteIncarnationLocked records that name's queue is (or will be) at least
// incarnation n.
func (v *vhost) noteIncarnationLocked(name string, n uint64) {
	if n > v.incarnations[name] {
		v.incarnations[name] = n
	}
}

// queueChannel is the KubeMQ queue of incarnation n of queue name in v:
// amqp.{vhost}.{queue} for the first, amqp.{vhost}.{queue}.{n} for later
// ones. A queue deleted after use leaves its KubeMQ queue to what may
// still arrive there (lease records of its deliveries, copies of a
// publish in flight, another replica's leases), so its name's next
// declaration takes the next incarnation, whose KubeMQ queue none of that
// reaches; a native KubeMQ client sees the readable name until then. The
// channel has one more part than any first incarnation's, so no queue name
// maps onto it.
func queueChannel(vhostKey, name string, n uint64) string {
	if n == 0 {
		return kubemqclient.Channel("amqp", vhostKey, name)
	}
	return kubemqclient.Channel("amqp", vhostKey, name, strconv.FormatUint(n, 10))
}

// queue is one AMQP queue, stored in the KubeMQ queue channel.
type queue struct {
	vh         *vhost
	name       string
	channel    string // KubeMQ channel
	durable    bool
	exclusive  bool
	autoDelete bool
	args       wire.Table
	owner      *conn         // exclusive owner, nil for shared queues
	ttl        time.Duration // x-message-ttl, 0 = none
	hasTTL     bool          // x-message-ttl present (0 is a TTL: expire unless delivered at once)
	// Dead-lettering (deadletter.go): x-dead-letter-exchange, and
	// x-dead-letter-routing-key when hasDLRK.
	dlx      string
	hasDLX   bool
	dlrk     string
	hasDLRK  bool
	maxLen   int64         // x-max-length; -1 = none
	maxBytes int64         // x-max-length-bytes; -1 = none
	bytes    byteLedger    // body sizes of the ready messages, with maxBytes (limits.go)
	overflow string        // x-overflow: drop-head (default), reject-publish, reject-publish-dlx
	expires  time.Duration // x-expires; 0 = none
	// deliveryLimit is a quorum queue's x-delivery-limit (-1 = none): a
	// message returned more often is dead-lettered (delivery_limit).
	deliveryLimit int64
	// maxPriority is x-max-priority (0: none, FIFO); prio holds the levels
	// of a priority queue (priority.go).
	maxPriority int
	prio        *prioLevels
	reap        reaper // expiry at the head and x-expires (expiry.go)
	// incarnation numbers the queues that had this name (queueChannel).
	incarnation uint64
	// remote: a non-durable queue another replica declared (transient.go),
	// known here from its registry record; replica names that replica.
	remote  bool
	replica string

	// used is set once a message was routed to q or a consumer or get
	// used it here: deleting it then moves its name to a new incarnation.
	used atomic.Bool

	stats atomic.Pointer[queueStats] // resolved by counters
	// Per-queue message counts for the management API's message_stats (stats.go), whatever
	// the metrics' label bound: copies stored, deliveries (basic.deliver, basic.get-ok), acks.
	nPublished, nDelivered, nAcked atomic.Uint64

	// Guarded by vh.mu.
	consumers         map[*consumer]struct{}
	disp              *dispatcher // delivers to consumers; nil without any
	exclusiveConsumer bool
	singleActive      bool // x-single-active-consumer (singleactive.go)
	hadConsumer       bool // auto-delete applies only after a first consumer
	deleted           bool
}

func newQueue(v *vhost, name string, durable, exclusive, autoDelete bool, args wire.Table, owner *conn, incarnation uint64) *queue {
	q := &queue{vh: v, name: name, channel: queueChannel(v.key, name, incarnation), durable: durable,
		exclusive: exclusive, autoDelete: autoDelete, args: args, owner: owner, incarnation: incarnation,
		consumers: map[*consumer]struct{}{}}
	if ms, ok := intArg(args["x-message-ttl"]); ok && ms >= 0 {
		q.ttl, q.hasTTL = time.Duration(ms)*time.Millisecond, true
	}
	if x, ok := args["x-dead-letter-exchange"].(string); ok {
		q.dlx, q.hasDLX = x, true
	}
	if k, ok := args["x-dead-letter-routing-key"].(string); ok && q.hasDLX {
		q.dlrk, q.hasDLRK = k, true
	}
	q.maxLen, q.maxBytes = -1, -1
	if n, ok := intArg(args["x-max-length"]); ok && n >= 0 {
		q.maxLen = n
	}
	if n, ok := intArg(args["x-max-length-bytes"]); ok && n >= 0 {
		q.maxBytes = n
	}
	q.overflow = "drop-head"
	if o, ok := args["x-overflow"].(string); ok {
		q.overflow = o
	}
	if ms, ok := intArg(args["x-expires"]); ok && ms > 0 {
		q.expires = time.Duration(ms) * time.Millisecond
	}
	q.deliveryLimit = -1
	if n, ok := intArg(args["x-delivery-limit"]); ok && n >= 0 && isString(args["x-queue-type"], "quorum") {
		q.deliveryLimit = n
	}
	q.reap.lastUse.Store(time.Now().UnixNano())
	q.singleActive = args["x-single-active-consumer"] == true
	if n, ok := intArg(args["x-max-priority"]); ok && n > 0 && n <= 255 {
		q.maxPriority, q.prio = int(n), newPrioLevels()
	}
	return q
}

// counters returns q's per-queue metrics, resolved on first use.
// delivered counts a delivery of bytes body bytes from q.
func (q *queue) delivered(bytes int) {
	q.counters().out(bytes)
	q.nDelivered.Add(1)
	q.vh.top.srv.nDelivered.Add(1)
}

func (q *queue) counters() *queueStats {
	if st := q.stats.Load(); st != nil {
		return st
	}
	st := q.vh.top.srv.m.queue(q.vh.displayName(), q.name)
	q.stats.Store(st)
	return st
}

func (v *vhost) lookupQueue(name string) *queue {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.queues[name]
}

// hasExchange reports whether v knows exchange name.
func (v *vhost) hasExchange(name string) bool {
	_, ok := v.routes.Exchange(name)
	return ok
}

// hasEnds reports whether v knows both ends of b.
func (v *vhost) hasEnds(b routing.Binding) bool {
	if !v.hasExchange(b.Source) {
		return false
	}
	if b.Dest.Exchange {
		return v.hasExchange(b.Dest.Name)
	}
	return v.lookupQueue(b.Dest.Name) != nil
}

// markUsed notes that q's KubeMQ queue may hold something of it now.
func (q *queue) markUsed() {
	if !q.used.Load() {
		q.used.Store(true)
	}
}

// isDeleted reports whether q was deleted (any goroutine).
func (q *queue) isDeleted() bool {
	q.vh.mu.Lock()
	defer q.vh.mu.Unlock()
	return q.deleted
}

// persistent reports whether q is a registry record: durable and not
// exclusive (an exclusive queue dies with its connection).
func (q *queue) persistent() bool { return q.durable && !q.exclusive }

// accessibleBy reports whether connection c may use q (RabbitMQ's lax
// exclusive check: an exclusive queue is its owner's alone).
func (q *queue) accessibleBy(c *conn) bool {
	if q.exclusive && q.owner == nil {
		return false // another replica's connection owns it
	}
	return q.owner == nil || q.owner == c
}

// removeQueue forgets q and its bindings and cancels its consumers (with a
// basic.cancel to clients that asked for it). It returns what the routing
// table removed with it. It does not touch the registry or KubeMQ.
func (v *vhost) removeQueue(q *queue, why string) routing.Removal {
	v.mu.Lock()
	if v.queues[q.name] != q || q.deleted {
		v.mu.Unlock()
		return routing.Removal{}
	}
	q.deleted = true
	delete(v.queues, q.name)
	cs := make([]*consumer, 0, len(q.consumers))
	for cs1 := range q.consumers {
		cs = append(cs, cs1)
	}
	v.mu.Unlock()
	r := v.routes.DeleteQueue(q.name)
	for _, cs1 := range cs {
		if cs1.peer != nil { // another replica's consumer: it tells its client
			cs1.peer.cancelled(why)
			continue
		}
		cs1.ch.post(func() { cs1.ch.cancelByServer(cs1, why) })
	}
	return r
}

// persistRemoval writes the tombstones of the durable records a removal
// took with it, so replicas and restarts agree. gone is the queue the
// removal started from, if any (no longer in the vhost).
func (v *vhost) persistRemoval(ctx context.Context, r routing.Removal, gone *queue) error {
	for _, x := range r.Exchanges {
		if x.Delayed && v.top.srv != nil {
			v.top.srv.stopDelayHolder(v, x.Name)
		}
	}
	reg := v.top.reg
	if reg == nil {
		return nil
	}
	shared := v.top.sharesTransient()
	removed := map[string]bool{} // removed exchange -> durable
	for _, x := range r.Exchanges {
		removed[x.Name] = x.Durable
		kind := kindExchange
		if !x.Durable {
			if !shared {
				continue
			}
			kind = kindTExchange
		}
		if err := reg.Delete(ctx, kind, recordKey(v.key, x.Name)); err != nil {
			return err
		}
	}
	exchangeDurable := func(name string) bool {
		if d, ok := removed[name]; ok {
			return d
		}
		x, ok := v.routes.Exchange(name)
		return ok && x.Durable
	}
	for _, b := range r.Bindings {
		durable := exchangeDurable(b.Source)
		switch {
		case b.Dest.Exchange:
			durable = durable && exchangeDurable(b.Dest.Name)
		case gone != nil && b.Dest.Name == gone.name:
			durable = durable && gone.persistent()
		default:
			q := v.lookupQueue(b.Dest.Name)
			durable = durable && q != nil && q.persistent()
		}
		kind := kindBinding
		if !durable {
			if !shared {
				continue
			}
			kind = kindTBinding
		}
		if err := reg.Delete(ctx, kind, recordKey(v.key, b.ID())); err != nil {
			return err
		}
	}
	return nil
}

// bindingDurable reports whether b is a registry record: RabbitMQ keeps a
// binding across restarts when both its ends are durable.
func (v *vhost) bindingDurable(b routing.Binding) bool {
	src, ok := v.routes.Exchange(b.Source)
	if !ok || !src.Durable {
		return false
	}
	if b.Dest.Exchange {
		d, ok := v.routes.Exchange(b.Dest.Name)
		return ok && d.Durable
	}
	q := v.lookupQueue(b.Dest.Name)
	return q != nil && q.persistent()
}

// parseExchangeType reads an exchange record's type: a standard one, or
// x-delayed-message routing as its x-delayed-type (delayed.go).
func parseExchangeType(typ string, args wire.Table) (kind routing.Kind, delayed, ok bool) {
	if kind, ok = routing.ParseKind(typ); ok || typ != routing.DelayedType {
		return kind, false, ok
	}
	t, _ := args["x-delayed-type"].(string)
	kind, ok = routing.ParseKind(t)
	return kind, true, ok
}

// putExchangeRecord writes x's record: a durable exchange's, or with
// replicas a non-durable one's (transient.go).
func (v *vhost) putExchangeRecord(ctx context.Context, x routing.Exchange) error {
	kind := kindExchange
	rec := exchangeRecord{Vhost: v.key, Name: x.Name, Type: x.TypeName(), AutoDelete: x.AutoDelete, Internal: x.Internal, Args: encodeArgs(x.Args)}
	switch {
	case v.top.reg == nil:
		return nil
	case !x.Durable:
		if !v.top.sharesTransient() {
			return nil
		}
		kind, rec.Replica = kindTExchange, v.top.replicaID()
		v.top.markExchangeOwned(recordKey(v.key, x.Name)) // before the record: sweep reads both
	}
	return v.top.written(ctx, v.top.reg.Put(ctx, kind, recordKey(v.key, x.Name), rec))
}

// deleteExchangeRecord writes the tombstone of x's record, if it has one.
func (v *vhost) deleteExchangeRecord(ctx context.Context, x routing.Exchange) error {
	switch {
	case v.top.reg == nil:
		return nil
	case x.Durable:
		return v.top.written(ctx, v.top.reg.Delete(ctx, kindExchange, recordKey(v.key, x.Name)))
	case v.top.sharesTransient():
		return v.top.written(ctx, v.top.reg.Delete(ctx, kindTExchange, recordKey(v.key, x.Name)))
	}
	return nil
}

// queueRecordKind is the kind of q's registry record, "" when it has none.
func (v *vhost) queueRecordKind(q *queue) string {
	switch {
	case v.top.reg == nil:
		return ""
	case q.persistent():
		return kindQueue
	case v.top.sharesTransient():
		return kindTQueue
	}
	return ""
}

func (v *vhost) putQueueRecord(ctx context.Context, q *queue) error {
	kind := v.queueRecordKind(q)
	if kind == "" {
		return nil
	}
	rec := queueRecord{Vhost: v.key, Name: q.name, AutoDelete: q.autoDelete, Args: encodeArgs(q.args), Incarnation: q.incarnation}
	if kind == kindTQueue {
		rec.Replica, rec.Durable, rec.Exclusive = q.replica, q.durable, q.exclusive
	}
	return v.top.written(ctx, v.top.reg.Put(ctx, kind, recordKey(v.key, q.name), rec))
}

// putIncarnationRecord records that name's next declaration takes
// incarnation n (every replica, and this one after a restart).
func (v *vhost) putIncarnationRecord(ctx context.Context, name string, n uint64) error {
	if v.top.reg == nil {
		return nil
	}
	return v.top.reg.Put(ctx, kindIncarnation, recordKey(v.key, name), incarnationRecord{Vhost: v.key, Name: name, Incarnation: n})
}

func (v *vhost) deleteQueueRecord(ctx context.Context, q *queue) error {
	kind := v.queueRecordKind(q)
	if kind == "" {
		return nil
	}
	return v.top.written(ctx, v.top.reg.Delete(ctx, kind, recordKey(v.key, q.name)))
}

// bindingRecordKind is the kind of a binding's registry record: durable
// when both its ends are, else with replicas a non-durable one's; "" when
// it has none.
func (v *vhost) bindingRecordKind(durable bool) string {
	switch {
	case v.top.reg == nil:
		return ""
	case durable:
		return kindBinding
	case v.top.sharesTransient():
		return kindTBinding
	}
	return ""
}

func (v *vhost) putBindingRecord(ctx context.Context, b routing.Binding, durable bool) error {
	kind := v.bindingRecordKind(durable)
	if kind == "" {
		return nil
	}
	return v.top.written(ctx, v.top.reg.Put(ctx, kind, recordKey(v.key, b.ID()), bindingRecord{
		Vhost: v.key, Source: b.Source, DestExchange: b.Dest.Exchange, Dest: b.Dest.Name, Key: b.Key, Args: encodeArgs(b.Args)}))
}

func (v *vhost) deleteBindingRecord(ctx context.Context, b routing.Binding, durable bool) error {
	kind := v.bindingRecordKind(durable)
	if kind == "" {
		return nil
	}
	return v.top.written(ctx, v.top.reg.Delete(ctx, kind, recordKey(v.key, b.ID())))
}

// written follows a client's topology change the registry took (err nil):
// with replicas, it returns once the others have read it, so the client's
// next publish through any of them routes by it, as in a RabbitMQ cluster
// (a replica that reads the registry log late would otherwise drop the
// message as unroutable, or miss the new binding).
func (t *topology) written(ctx context.Context, err error) error {
	if err == nil && t.srv != nil && t.srv.peers != nil {
		t.srv.peers.Propagate(ctx)
	}
	return err
}
