package routing

import (
	"errors"
	"sort"
	"strings"
	"sync"

	"github.com/kubemq-io/kubemq-proxy/amqp091/wire"
)

// Exchange describes one exchange. Args are kept for equivalence checks on
// redeclare; routing reads only "alternate-exchange".
type Exchange struct {
	Name       string
	Kind       Kind
	Durable    bool
	AutoDelete bool
	Internal   bool
	Args       wire.Table
	// Delayed: an x-delayed-message exchange (the front-end holds messages
	// with an x-delay header until they are due); Kind is its
	// x-delayed-type, by which it routes.
	Delayed bool
}

// DelayedType is the exchange type of delayed-message exchanges
// (RabbitMQ's rabbitmq_delayed_message_exchange plugin).
const DelayedType = "x-delayed-message"

// TypeName is the type as exchange.declare spelled it.
func (x Exchange) TypeName() string {
	if x.Delayed {
		return DelayedType
	}
	return x.Kind.String()
}

// Alternate returns the alternate exchange named in the arguments, or "".
func (x Exchange) Alternate() string {
	s, _ := x.Args["alternate-exchange"].(string)
	return s
}

// Binding routes messages from the Source exchange to Dest. Two bindings
// are the same binding when source, destination, key and arguments are
// equal, as in RabbitMQ.
type Binding struct {
	Source string
	Dest   Dest
	Key    string
	Args   wire.Table
}

// ID is a string that identifies the binding: equal for the same binding,
// different otherwise (arguments compared by their canonical wire form).
func (b Binding) ID() string {
	args, err := wire.AppendTable(nil, b.Args)
	if err != nil {
		// Only unencodable Go values fail; they came from no wire. Fall back
		// to a form that is still deterministic for the same input.
		args = []byte(err.Error())
	}
	var sb strings.Builder
	sb.Grow(len(b.Source) + len(b.Dest.Name) + len(b.Key) + len(args) + 6)
	sb.WriteString(b.Source)
	sb.WriteByte(0)
	if b.Dest.Exchange {
		sb.WriteByte('e')
	} else {
		sb.WriteByte('q')
	}
	sb.WriteByte(0)
	sb.WriteString(b.Dest.Name)
	sb.WriteByte(0)
	sb.WriteString(b.Key)
	sb.WriteByte(0)
	sb.Write(args)
	return sb.String()
}

// Removal reports what a deletion took with it: the bindings removed and
// the auto-delete exchanges deleted because they lost their last binding.
type Removal struct {
	Bindings  []Binding
	Exchanges []Exchange
}

// Errors of Route.
var (
	ErrNoExchange = errors.New("routing: no such exchange")
	ErrInternal   = errors.New("routing: exchange is internal")
)

// DefaultExchange is the nameless direct exchange every queue is bound to
// by its own name.
const DefaultExchange = ""

// Predeclared lists the exchanges RabbitMQ 3.10 creates in every virtual
// host, default exchange first.
func Predeclared() []Exchange {
	return []Exchange{
		{Name: DefaultExchange, Kind: Direct, Durable: true},
		{Name: "amq.direct", Kind: Direct, Durable: true},
		{Name: "amq.fanout", Kind: Fanout, Durable: true},
		{Name: "amq.headers", Kind: Headers, Durable: true},
		{Name: "amq.match", Kind: Headers, Durable: true},
		{Name: "amq.rabbitmq.trace", Kind: Topic, Durable: true, Internal: true},
		{Name: "amq.topic", Kind: Topic, Durable: true},
	}
}

// Table is the routing state of one virtual host. It is safe for concurrent
// use: Route takes the read lock, changes the write lock.
//
// Bindings are kept whatever the state of their ends, so changes may arrive
// in any order (a registry snapshot replays records unordered): Route skips
// destinations that do not exist, and an exchange picks up the bindings
// already recorded for it when it appears. The API-level checks (binding a
// missing queue is 404) belong to the caller.
type Table struct {
	mu        sync.RWMutex // guards everything below
	exchanges map[string]*exchange
	queues    map[string]struct{}
	bySource  map[string]map[string]*Binding // source name -> binding id -> binding
	byDest    map[Dest]map[string]*Binding   // destination -> binding id -> binding
}

// exchange is an Exchange with its compiled bindings.
type exchange struct {
	Exchange
	isDefault bool
	alternate string
	direct    map[string]destSet
	fanout    destSet
	topic     *topicNode
	headers   []headersBinding
}

type headersBinding struct {
	id string
	d  Dest
	p  *headersPattern
}

// NewTable returns a table holding the predeclared exchanges.
func NewTable() *Table {
	t := &Table{
		exchanges: map[string]*exchange{},
		queues:    map[string]struct{}{},
		bySource:  map[string]map[string]*Binding{},
		byDest:    map[Dest]map[string]*Binding{},
	}
	for _, x := range Predeclared() {
		t.putExchangeLocked(x)
	}
	return t
}

// Exchange returns the exchange called name.
func (t *Table) Exchange(name string) (Exchange, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	x, ok := t.exchanges[name]
	if !ok {
		return Exchange{}, false
	}
	return x.Exchange, true
}

// Exchanges returns every exchange, sorted by name.
func (t *Table) Exchanges() []Exchange {
	t.mu.RLock()
	out := make([]Exchange, 0, len(t.exchanges))
	for _, x := range t.exchanges {
		out = append(out, x.Exchange)
	}
	t.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// PutExchange adds x, or replaces the description of the exchange of that
// name (keeping its bindings).
func (t *Table) PutExchange(x Exchange) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.putExchangeLocked(x)
}

func (t *Table) putExchangeLocked(x Exchange) {
	old := t.exchanges[x.Name]
	e := &exchange{Exchange: x, isDefault: x.Name == DefaultExchange, alternate: x.Alternate()}
	if old != nil && old.Kind == x.Kind {
		e.direct, e.fanout, e.topic, e.headers = old.direct, old.fanout, old.topic, old.headers
		t.exchanges[x.Name] = e
		return
	}
	t.exchanges[x.Name] = e
	for id, b := range t.bySource[x.Name] {
		e.addBinding(id, b)
	}
}

// DeleteExchange removes the exchange and every binding from or to it. The
// removal may auto-delete other exchanges. Deleting a missing exchange
// removes nothing.
func (t *Table) DeleteExchange(name string) Removal {
	t.mu.Lock()
	defer t.mu.Unlock()
	var r Removal
	t.deleteExchangeLocked(name, &r)
	return r
}

func (t *Table) deleteExchangeLocked(name string, r *Removal) {
	x, ok := t.exchanges[name]
	if !ok {
		return
	}
	delete(t.exchanges, name)
	r.Exchanges = append(r.Exchanges, x.Exchange)
	var affected []string
	for _, b := range sortedBindings(t.bySource[name]) {
		t.removeBindingLocked(b, r)
	}
	for _, b := range sortedBindings(t.byDest[ExchangeDest(name)]) {
		t.removeBindingLocked(b, r)
		affected = append(affected, b.Source)
	}
	t.autoDeleteLocked(affected, r)
}

// PutQueue records that queue name exists (the default exchange routes to
// it by name; bindings to it take effect).
func (t *Table) PutQueue(name string) {
	t.mu.Lock()
	t.queues[name] = struct{}{}
	t.mu.Unlock()
}

// HasQueue reports whether queue name exists.
func (t *Table) HasQueue(name string) bool {
	t.mu.RLock()
	_, ok := t.queues[name]
	t.mu.RUnlock()
	return ok
}

// DeleteQueue removes the queue and its bindings, auto-deleting exchanges
// that lose their last binding.
func (t *Table) DeleteQueue(name string) Removal {
	t.mu.Lock()
	defer t.mu.Unlock()
	var r Removal
	delete(t.queues, name)
	var affected []string
	for _, b := range sortedBindings(t.byDest[QueueDest(name)]) {
		t.removeBindingLocked(b, &r)
		affected = append(affected, b.Source)
	}
	t.autoDeleteLocked(affected, &r)
	return r
}

// Bind adds b; it reports false when the same binding already existed.
func (t *Table) Bind(b Binding) bool {
	id := b.ID()
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.bySource[b.Source][id]; ok {
		return false
	}
	bp := &b
	bs := t.bySource[b.Source]
	if bs == nil {
		bs = map[string]*Binding{}
		t.bySource[b.Source] = bs
	}
	bs[id] = bp
	bd := t.byDest[b.Dest]
	if bd == nil {
		bd = map[string]*Binding{}
		t.byDest[b.Dest] = bd
	}
	bd[id] = bp
	if x := t.exchanges[b.Source]; x != nil {
		x.addBinding(id, bp)
	}
	return true
}

// Unbind removes b. It reports false (and removes nothing) when there was
// no such binding. Removing the last binding of an auto-delete source
// deletes that exchange, which the Removal lists.
func (t *Table) Unbind(b Binding) (Removal, bool) {
	id := b.ID()
	t.mu.Lock()
	defer t.mu.Unlock()
	var r Removal
	cur, ok := t.bySource[b.Source][id]
	if !ok {
		return r, false
	}
	t.removeBindingLocked(cur, &r)
	t.autoDeleteLocked([]string{b.Source}, &r)
	return r, true
}

// HasBinding reports whether b exists.
func (t *Table) HasBinding(b Binding) bool {
	id := b.ID()
	t.mu.RLock()
	_, ok := t.bySource[b.Source][id]
	t.mu.RUnlock()
	return ok
}

// HasBindingsFrom reports whether exchange name is the source of a binding
// (RabbitMQ's "in use" for exchange.delete if-unused).
func (t *Table) HasBindingsFrom(name string) bool {
	t.mu.RLock()
	n := len(t.bySource[name])
	t.mu.RUnlock()
	return n > 0
}

// BindingsFrom returns the bindings whose source is exchange name.
func (t *Table) BindingsFrom(name string) []Binding {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return copyBindings(t.bySource[name])
}

// BindingsTo returns the bindings whose destination is d.
func (t *Table) BindingsTo(d Dest) []Binding {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return copyBindings(t.byDest[d])
}

func copyBindings(m map[string]*Binding) []Binding {
	bs := sortedBindings(m)
	out := make([]Binding, len(bs))
	for i, b := range bs {
		out[i] = *b
	}
	return out
}

// sortedBindings returns the bindings of m ordered by id, so removals are
// reported deterministically.
func sortedBindings(m map[string]*Binding) []*Binding {
	ids := make([]string, 0, len(m))
	for id := range m {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	out := make([]*Binding, len(ids))
	for i, id := range ids {
		out[i] = m[id]
	}
	return out
}

func (t *Table) removeBindingLocked(b *Binding, r *Removal) {
	id := b.ID()
	if bs := t.bySource[b.Source]; bs != nil {
		delete(bs, id)
		if len(bs) == 0 {
			delete(t.bySource, b.Source)
		}
	}
	if bd := t.byDest[b.Dest]; bd != nil {
		delete(bd, id)
		if len(bd) == 0 {
			delete(t.byDest, b.Dest)
		}
	}
	if x := t.exchanges[b.Source]; x != nil {
		x.removeBinding(id, b)
	}
	r.Bindings = append(r.Bindings, *b)
}

// autoDeleteLocked deletes each auto-delete exchange among sources that has
// no binding left, cascading as RabbitMQ does.
func (t *Table) autoDeleteLocked(sources []string, r *Removal) {
	for _, s := range sources {
		x, ok := t.exchanges[s]
		if !ok || !x.AutoDelete || len(t.bySource[s]) > 0 {
			continue
		}
		t.deleteExchangeLocked(s, r)
	}
}

func (x *exchange) addBinding(id string, b *Binding) {
	switch x.Kind {
	case Direct:
		if x.direct == nil {
			x.direct = map[string]destSet{}
		}
		s := x.direct[b.Key]
		s.add(b.Dest)
		x.direct[b.Key] = s
	case Fanout:
		x.fanout.add(b.Dest)
	case Topic:
		if x.topic == nil {
			x.topic = &topicNode{}
		}
		x.topic.add(b.Key, b.Dest)
	case Headers:
		x.headers = append(x.headers, headersBinding{id: id, d: b.Dest, p: parseHeadersPattern(b.Args)})
	}
}

func (x *exchange) removeBinding(id string, b *Binding) {
	switch x.Kind {
	case Direct:
		s := x.direct[b.Key]
		s.remove(b.Dest)
		if len(s) == 0 {
			delete(x.direct, b.Key)
		} else {
			x.direct[b.Key] = s
		}
	case Fanout:
		x.fanout.remove(b.Dest)
	case Topic:
		if x.topic != nil {
			x.topic.remove(b.Key, b.Dest)
		}
	case Headers:
		for i := range x.headers {
			if x.headers[i].id == id {
				x.headers = append(x.headers[:i], x.headers[i+1:]...)
				break
			}
		}
	}
}

// match appends the destinations x's own bindings give the message.
func (x *exchange) match(t *Table, s *scratch, key string, headers wire.Table, out []Dest) []Dest {
	if x.isDefault {
		if _, ok := t.queues[key]; ok {
			out = append(out, QueueDest(key))
		}
		return out
	}
	switch x.Kind {
	case Direct:
		return x.direct[key].appendTo(out)
	case Fanout:
		return x.fanout.appendTo(out)
	case Topic:
		if x.topic == nil {
			return out
		}
		s.words = splitWords(key, s.words[:0])
		return x.topic.match(&s.topic, s.words, out)
	case Headers:
		for i := range x.headers {
			if x.headers[i].p.match(headers) {
				out = append(out, x.headers[i].d)
			}
		}
	}
	return out
}

// Route appends to out the queues a message published to exchange with the
// routing key and headers reaches, each once, and returns the extended
// slice. Exchange-to-exchange bindings are followed, each exchange visited
// at most once (so cycles end); an exchange whose own bindings match
// nothing hands the message to its alternate exchange, if it has one.
// Missing destinations are skipped. The errors are ErrNoExchange and
// ErrInternal (publishing to an internal exchange directly).
func (t *Table) Route(exchangeName, key string, headers wire.Table, out []string) ([]string, error) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	x := t.exchanges[exchangeName]
	if x == nil {
		return out, ErrNoExchange
	}
	if x.Internal {
		return out, ErrInternal
	}
	s := scratchPool.Get().(*scratch)
	out = t.routeLocked(s, x, key, headers, out)
	scratchPool.Put(s)
	return out, nil
}

func (t *Table) routeLocked(s *scratch, x *exchange, key string, headers wire.Table, out []string) []string {
	work := append(s.work[:0], x)
	seen := append(s.seen[:0], x.Name)
	u := uniq{start: len(out)}
	for i := 0; i < len(work); i++ {
		x := work[i]
		dests := x.match(t, s, key, headers, s.dests[:0])
		s.dests = dests[:0]
		if len(dests) == 0 && x.alternate != "" {
			dests = append(dests, ExchangeDest(x.alternate))
		}
		for _, d := range dests {
			if d.Exchange {
				if containsString(seen, d.Name) {
					continue
				}
				seen = append(seen, d.Name)
				if nx := t.exchanges[d.Name]; nx != nil {
					work = append(work, nx)
				}
				continue
			}
			if _, ok := t.queues[d.Name]; !ok {
				continue
			}
			out = u.add(out, d.Name)
		}
	}
	s.work, s.seen = clearSlice(work), clearSlice(seen)
	return out
}

// scratch holds Route's reusable buffers, so routing allocates nothing in
// the common case.
type scratch struct {
	dests []Dest
	words []string
	work  []*exchange
	seen  []string
	topic topicMatcher
}

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

// clearSlice drops references held by a buffer before it is pooled.
func clearSlice[T any](s []T) []T {
	s = s[:cap(s)]
	clear(s)
	return s[:0]
}

func containsString(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// uniq deduplicates names appended to a slice after index start: a linear
// scan while the set is small, a map once it grows.
type uniq struct {
	start int
	set   map[string]struct{}
}

const uniqScanMax = 16

func (u *uniq) add(out []string, name string) []string {
	if u.set != nil {
		if _, ok := u.set[name]; ok {
			return out
		}
		u.set[name] = struct{}{}
		return append(out, name)
	}
	for _, n := range out[u.start:] {
		if n == name {
			return out
		}
	}
	out = append(out, name)
	if len(out)-u.start > uniqScanMax {
		u.set = make(map[string]struct{}, 2*uniqScanMax)
		for _, n := range out[u.start:] {
			u.set[n] = struct{}{}
		}
	}
	return out
}
