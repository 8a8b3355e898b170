// Package routing is the AMQP 0-9-1 routing core of one virtual host:
// exchanges (default, direct, fanout, topic, headers), bindings to queues and
// to other exchanges, and Route, which turns a published message's exchange,
// routing key and headers into the deduplicated set of queues it reaches.
//
// It is pure in-memory logic with no I/O: the amqp091 front-end decides what
// is durable (registry records) and feeds every change into a Table. Topic
// bindings live in a trie per exchange (never one regular expression per
// binding), headers bindings are matched with RabbitMQ 3.10's x-match rules,
// and exchange-to-exchange bindings are followed with cycle protection,
// consulting alternate exchanges where an exchange routes nowhere, as
// RabbitMQ's rabbit_exchange:route does.
package routing

import "fmt"

// Kind is an exchange type.
type Kind uint8

// Exchange types RabbitMQ ships without plugins.
const (
	Direct Kind = iota + 1
	Fanout
	Topic
	Headers
)

// ParseKind maps an exchange.declare type ("direct", ...) to a Kind.
func ParseKind(s string) (Kind, bool) {
	switch s {
	case "direct":
		return Direct, true
	case "fanout":
		return Fanout, true
	case "topic":
		return Topic, true
	case "headers":
		return Headers, true
	}
	return 0, false
}

// String returns the type as exchange.declare spells it.
func (k Kind) String() string {
	switch k {
	case Direct:
		return "direct"
	case Fanout:
		return "fanout"
	case Topic:
		return "topic"
	case Headers:
		return "headers"
	}
	return fmt.Sprintf("kind-%d", uint8(k))
}

// Dest is the destination of a binding: a queue or (exchange-to-exchange
// bindings) an exchange.
type Dest struct {
	Exchange bool   // true: Name is an exchange
	Name     string // queue or exchange name
}

// QueueDest returns the Dest of queue name.
func QueueDest(name string) Dest { return Dest{Name: name} }

// ExchangeDest returns the Dest of exchange name.
func ExchangeDest(name string) Dest { return Dest{Exchange: true, Name: name} }

// String is "queue 'q'" or "exchange 'x'", the way RabbitMQ names resources.
func (d Dest) String() string {
	if d.Exchange {
		return "exchange '" + d.Name + "'"
	}
	return "queue '" + d.Name + "'"
}
