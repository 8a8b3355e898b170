package amqp091

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/kubemq-io/kubemq-proxy/amqp091/routing"
	"github.com/kubemq-io/kubemq-proxy/amqp091/wire"
)

// The accessors the proxy's web console uses (its listings beyond State, and its admin
// actions). They take and return plain values, so the console needs no import of this package.

// TopologyView is one virtual host's exchanges and bindings.
type TopologyView struct {
	Vhost     string         `json:"vhost"`
	Exchanges []ExchangeView `json:"exchanges"`
	Bindings  []BindingView  `json:"bindings"`
}

// ExchangeView is one exchange.
type ExchangeView struct {
	Name       string `json:"name"` // "" is the default exchange
	Type       string `json:"type"`
	Durable    bool   `json:"durable"`
	AutoDelete bool   `json:"auto_delete"`
	Internal   bool   `json:"internal"`
	Alternate  string `json:"alternate_exchange,omitempty"`
}

// BindingView is one binding: from an exchange to a queue or an exchange.
type BindingView struct {
	Source          string `json:"source"`
	Destination     string `json:"destination"`
	DestinationType string `json:"destination_type"` // "queue" or "exchange"
	RoutingKey      string `json:"routing_key"`
	Arguments       int    `json:"arguments"` // how many binding arguments (headers exchanges)
}

// Topology lists every virtual host's exchanges and bindings, sorted; the console renders it
// (as JSON, like State).
func (s *Server) Topology() any {
	s.top.mu.Lock()
	vhosts := make([]*vhost, 0, len(s.top.vhosts))
	for _, v := range s.top.vhosts {
		vhosts = append(vhosts, v)
	}
	s.top.mu.Unlock()
	out := make([]TopologyView, 0, len(vhosts))
	for _, v := range vhosts {
		tv := TopologyView{Vhost: v.displayName(), Exchanges: []ExchangeView{}, Bindings: []BindingView{}}
		for _, x := range v.routes.Exchanges() {
			tv.Exchanges = append(tv.Exchanges, ExchangeView{Name: x.Name, Type: x.TypeName(), Durable: x.Durable,
				AutoDelete: x.AutoDelete, Internal: x.Internal, Alternate: x.Alternate()})
			for _, b := range v.routes.BindingsFrom(x.Name) {
				dt := "queue"
				if b.Dest.Exchange {
					dt = "exchange"
				}
				tv.Bindings = append(tv.Bindings, BindingView{Source: b.Source, Destination: b.Dest.Name, DestinationType: dt,
					RoutingKey: b.Key, Arguments: len(b.Args)})
			}
		}
		slices.SortFunc(tv.Exchanges, func(a, b ExchangeView) int { return cmp.Compare(a.Name, b.Name) })
		slices.SortFunc(tv.Bindings, func(a, b BindingView) int {
			return cmp.Or(cmp.Compare(a.Source, b.Source), cmp.Compare(a.DestinationType, b.DestinationType),
				cmp.Compare(a.Destination, b.Destination), cmp.Compare(a.RoutingKey, b.RoutingKey))
		})
		out = append(out, tv)
	}
	slices.SortFunc(out, func(a, b TopologyView) int { return cmp.Compare(a.Vhost, b.Vhost) })
	return out
}

// NotFoundError: the virtual host, queue or exchange named to an admin action does not exist.
type NotFoundError struct{ What string }

func (e *NotFoundError) Error() string { return "not found: " + e.What }

// NotFound marks the error for callers that test for it without importing this package.
func (e *NotFoundError) NotFound() bool { return true }

// consoleQueue looks up an existing queue without creating its virtual host.
func (s *Server) consoleQueue(vhostName, name string) (*queue, error) {
	s.top.mu.Lock()
	v := s.top.vhosts[vhostKey(vhostName)]
	s.top.mu.Unlock()
	if v == nil {
		return nil, &NotFoundError{fmt.Sprintf("vhost '%s'", vhostName)}
	}
	q := v.lookupQueue(name)
	if q == nil || q.isDeleted() {
		return nil, &NotFoundError{fmt.Sprintf("queue '%s' in vhost '%s'", name, vhostName)}
	}
	return q, nil
}

// PurgeQueue removes a queue's ready messages, as queue.purge does (deliveries out to
// consumers stay), and returns how many went.
func (s *Server) PurgeQueue(ctx context.Context, vhostName, name string) (int, error) {
	q, err := s.consoleQueue(vhostName, name)
	if err != nil {
		return 0, err
	}
	n, err := s.purge(ctx, q)
	return int(n), err
}

// DeleteQueue deletes a queue (exclusive ones too: their owner's channel sees it gone, as
// after a delete through RabbitMQ's management UI) and returns how many ready messages it held.
func (s *Server) DeleteQueue(ctx context.Context, vhostName, name, why string) (int, error) {
	q, err := s.consoleQueue(vhostName, name)
	if err != nil {
		return 0, err
	}
	n, err := s.deleteQueue(ctx, q, why)
	return int(n), err
}

// PublishMessage publishes body to exchange with routingKey in a virtual host (one
// amqp.vhosts allows) as a client without properties would, and returns when every copy is stored: how many queues took it
// and how many refused it (a full queue with x-overflow reject-publish; the message is not
// dead-lettered here).
func (s *Server) PublishMessage(ctx context.Context, vhostName, exchange, routingKey string, body []byte) (stored, refused int, err error) {
	if !s.vhostAllowed(vhostName) {
		return 0, 0, &NotFoundError{fmt.Sprintf("vhost '%s'", vhostName)}
	}
	// As a connection opening it would: a virtual host nobody used yet has its default
	// exchanges.
	v := s.top.vhost(vhostKey(vhostName))
	if s.opts.MaxBodySize > 0 && int64(len(body)) > int64(s.opts.MaxBodySize) {
		return 0, 0, fmt.Errorf("message size %d is larger than configured max size %d", len(body), s.opts.MaxBodySize)
	}
	routes, err := v.routes.Route(exchange, routingKey, nil, nil)
	if err != nil {
		if errors.Is(err, routing.ErrNoExchange) {
			return 0, 0, &NotFoundError{fmt.Sprintf("exchange '%s' in vhost '%s'", exchange, vhostName)}
		}
		return 0, 0, fmt.Errorf("exchange '%s' in vhost '%s': %w", exchange, vhostName, err)
	}
	s.m.published.Inc()
	if len(routes) == 0 {
		s.m.unroutable.Inc()
		return 0, 0, nil
	}
	props := &wire.Properties{}
	meta, tags, err := encodeMessage(exchange, routingKey, props)
	if err != nil {
		return 0, 0, err
	}
	now := time.Now()
	var msgs []pubCopy
	var limited, reap []*queue
	for _, name := range routes {
		q := v.lookupQueue(name)
		if q == nil {
			continue
		}
		q.markUsed()
		if q.limitsLength() {
			if q.overflow != "drop-head" {
				n, known, err := s.readyCount(ctx, q)
				if err != nil {
					return 0, 0, err
				}
				full := false
				if known {
					if full, err = s.overflows(ctx, q, int64(n), len(body)); err != nil {
						return 0, 0, err
					}
				}
				if full {
					refused++
					continue
				}
			} else {
				limited = append(limited, q)
			}
		}
		if q.hasTTL {
			reap = append(reap, q)
		}
		msgs = append(msgs, pubCopy{msg: q.storedCopy(meta, tags, body, 0, false, now), stats: q.counters(), ledger: q.ledger(), log: s.log})
	}
	if len(msgs) == 0 {
		return 0, refused, nil
	}
	result := make(chan bool, 1)
	done := newPubDone(len(msgs), func(ok bool) { result <- ok })
	s.m.routed.Add(float64(len(msgs)))
	for i := range msgs {
		if !s.pub.submit(ctx, msgs[i], done) {
			for range msgs[i+1:] {
				done.resolve(false)
			}
			break
		}
	}
	if !<-result {
		return 0, refused, errors.New("KubeMQ did not store every copy of the message")
	}
	for _, q := range reap {
		s.startReaper(q)
	}
	for _, q := range limited {
		s.requestTrim(q, func() {})
	}
	return len(msgs), refused, nil
}
