package amqp091

import "github.com/kubemq-io/kubemq-proxy/amqp091/wire"

// Single active consumer (x-single-active-consumer), as RabbitMQ 3.10's
// classic queues do it: every basic.consume is accepted, but only one
// consumer of the queue receives. The first one registered becomes active;
// when it goes (basic.cancel, its channel or connection closes, its
// replica's link ends), the waiting consumer of the highest x-priority
// takes over, the earliest registered among equals, and the messages the
// old one left unacknowledged go to it in their places. The queue's
// dispatcher keeps the active consumer (consume.go); consumers behind
// other replicas are consumers of the holder's dispatcher (peer.go), so
// one consumer is active across the whole fleet.

// nextActive picks the consumer that takes over from a removed active
// one: the highest priority, the earliest registered among equals.
func nextActive(cs []*consumer) *consumer {
	var best *consumer
	for _, c := range cs {
		if best == nil || c.priority > best.priority {
			best = c
		}
	}
	return best
}

// errSingleActiveExclusive is RabbitMQ's answer to an exclusive consume on
// a single-active-consumer queue.
func errSingleActiveExclusive(queue, vhost string) *wire.Error {
	return wire.AccessRefused("%s in exclusive use", rsQueue(queue, vhost))
}
