// Package amqp091 is the AMQP 0-9-1 front-end of kubemq-proxy: unchanged
// RabbitMQ clients connect to it, declare exchanges, queues and bindings,
// publish and consume, and every message is stored in KubeMQ.
//
// It owns the connections (handshake, heartbeats, close handshakes), the
// channels, the per-vhost topology (exchanges and bindings live in
// amqp091/routing; durable ones are registry records shared by replicas),
// the publish path (routing, one KubeMQ queue message per routed queue,
// batched, with publisher confirms once KubeMQ stored every copy, and
// bounded per connection by the body bytes not yet stored: above the bound
// the reader stops reading, with connection.blocked) and the
// consume path (basic.consume and basic.get on the delivery package's
// leases, so an unacknowledged message stays durable in KubeMQ until the
// client settles it). The byte-level codec is amqp091/wire.
//
// Every AMQP queue q of virtual host v is the KubeMQ queue channel
// kubemqclient.Channel("amqp", v, q), with v "/" spelled "default"; a name
// deleted after use and declared again takes a new incarnation with a
// channel of its own (queueChannel in topology.go). A priority queue
// (x-max-priority) keeps each used level p > 0 in a channel of its own with
// one more token "p<p>" (priority.go); an x-delayed-message exchange holds
// its delayed messages in the queue channel of the exchange's name with one
// more token "delayed" (delayed.go). The
// message mapping is documented in message.go; behaviour follows RabbitMQ
// 3.10 (reply codes and texts included), with the differences listed in
// README.md.
//
// Concurrency: per connection, one reader goroutine owns the channel table
// and content assembly, one writer goroutine owns the socket's write side,
// each channel runs its methods on its own goroutine (a slow KubeMQ call
// on one channel never blocks another), and each queue with consumers has
// a dispatcher goroutine that fetches for all of them and delivers as
// RabbitMQ's queue process does (consume.go). Mutable state names its
// owner where declared.
package amqp091
