// Package peerpb holds the Go bindings of the AMQP front-end's peer service
// (peer.proto): how one replica forwards its AMQP clients' consumers,
// basic.get, message counts and purges to the replica that holds a queue.
// Only amqp091 imports it.
package peerpb

//go:generate sh gen.sh
