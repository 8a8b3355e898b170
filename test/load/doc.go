// Package load is kubemq-proxy's connection-scale suite: it runs the proxy
// binary as its own process and holds many idle AMQP connections and
// Pub/Sub StreamingPull streams on it, checking that none is dropped, that
// they still work, and that the proxy's goroutines come back down when they
// close, and reporting the proxy's RSS and goroutines per connection,
// channel and stream.
package load
