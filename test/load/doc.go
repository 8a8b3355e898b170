// Package load is kubemq-proxy's connection-scale suite. It builds the
// binary (with -race when the tests run with it), runs the proxy as its own
// process on the embedded in-memory backend (or on $KUBEMQ_ADDRESS), and
// holds idle clients on it: TestLoadAMQP 1,000 amqp091-go connections with
// 10 channels each and a 3 s heartbeat for 10 s (none may be closed, sample
// channels must still publish and get); TestLoadPubSub 200 raw StreamingPull
// streams, one per subscription, each of which must receive and ack every
// message published while all are open. After the clients close, the
// proxy's go_goroutines must come back to within 20 of the baseline within
// 10 s. Each test prints one "LOAD ..." line with the proxy's RSS, Go heap
// in use and goroutines (from its /metrics) per connection, channel, stream
// and subscription runtime; under -race the memory figures are several
// times the production binary's. Subscription runtimes stay up until idle
// for gcp.runtime_idle (15 s here), so they are started before the
// baseline; at the end the suite waits for all of them to retire and for
// the goroutines to come back to what they were before the subscriptions
// were first pulled from. Run:
//
//	go test ./test/load/ -v -count=1
//
// Knobs: LOAD_AMQP_CONNS, LOAD_AMQP_CHANNELS, LOAD_AMQP_HOLD,
// LOAD_AMQP_HEARTBEAT, LOAD_PUBSUB_STREAMS, LOAD_PUBSUB_MESSAGES;
// PROXY_BIN (or LOAD_PROXY_BIN) uses a prebuilt binary; LOAD_LOGS=dir
// keeps the proxy logs, LOAD_LOG_LEVEL sets their level. -short runs 100
// connections and 50 streams.
package load
