// Package faults is kubemq-proxy's fault-injection suite. It builds the
// binary, runs the embedded KubeMQ-compatible backend as its own process
// ("kubemq-proxy embedded") and the proxy as another, with the proxy
// reaching the backend through a TCP relay the suite controls. Under steady
// load on both protocols (Pub/Sub publish + StreamingPull with the
// cloud.google.com/go/pubsub/v2 client; AMQP confirmed publish + manual-ack
// consume with github.com/rabbitmq/amqp091-go) it injects, each in its own
// run:
//
//  1. ProxyKill: SIGKILL of the proxy, restarted on the same ports;
//  2. BackendKill: SIGKILL of the backend, restarted on the same data dir;
//  3. BackendUnreachable: the relay refuses and cuts every connection for 10 s;
//  4. BackendFrozen: SIGSTOP of the backend process for 10 s (the TCP
//     connections stay open and nothing answers), then SIGCONT. Probes publish
//     one message every 50 ms on each protocol on their own topic and queue (a
//     Pub/Sub Publish RPC without client retries, an AMQP publish with
//     confirms) and the run checks and reports: /readyz 503 within twice
//     kubemq.outage_detection; every Pub/Sub publish sent while frozen answered
//     UNAVAILABLE before the SIGCONT; every AMQP publish in flight when the
//     outage was detected answered with basic.nack before the 320 close; the
//     latencies; /readyz 200 and a publish stored again after the SIGCONT;
//  5. FrozenShutdown: SIGSTOP of the backend, then, once /readyz is 503,
//     SIGTERM of the proxy: it must exit within shutdown.timeout (plus slack),
//     logging the step it gave up on; then SIGCONT and a new proxy on the same
//     ports. The run reports the time from SIGTERM to exit;
//  6. ConsumerStall: a Pub/Sub callback that sleeps 30 s, past the 10 s ack
//     deadline, on a subscriber with lease extension off and a 10 s stream
//     ack deadline (the messages must come back to the healthy subscriber
//     while it sleeps), and an AMQP consumer that holds its prefetch
//     unacknowledged for 15 s, then closes its channel (the messages must
//     not go elsewhere meanwhile, then come back flagged redelivered).
//
// A ledger per protocol checks that every message whose publish was
// acknowledged (Publish returned an id; basic.ack arrived) is delivered to a
// consumer that acks it at least once, and prints sent, acknowledged,
// delivered, lost and duplicated per protocol and per fault. Any loss fails
// the test. Clients keep their default retry settings; the AMQP load
// generator reconnects after a 320 close or a dropped socket, as
// applications do. The suite also asserts what clients see during the
// fault: gRPC UNAVAILABLE (never INTERNAL or UNKNOWN) and AMQP 320
// CONNECTION_FORCED while the proxy is alive, a dropped socket when it is
// killed.
//
// TestOrderedKeysSurviveProxyKill kills the proxy while windows of four
// ordering keys are out to a client and the backend lives on, and checks
// that every message arrives after the restart with each key restarting at
// its first message and never skipping ahead.
//
// Run it with:
//
//	go test ./test/faults/ -run Faults -v
//
// The default run (the six faults, two at a time, each about 30-90 s)
// takes about four minutes and is part of `go test -race ./...`;
// -short skips it. The proxy binary is built with -race when the tests
// are, and a race report, panic or fatal error in any process fails the
// run. Knobs (environment):
//
//   - FAULTS_DURATION=10m adds the soak: that long of load on one proxy
//     process with the faults that keep it alive injected in turn every
//     90 s, sampling go_goroutines, process_resident_memory_bytes and
//     process_open_fds from /metrics before, during and for a minute after
//     the load, and failing when they keep growing once the load has
//     stopped (raise -timeout, e.g. -timeout 30m; without -race the RSS
//     figures are the production binary's);
//   - FAULTS_RATE: messages per second per protocol (default 200);
//   - FAULTS_SERIAL=1: one run at a time;
//   - FAULTS_LOGS=dir: keep each run's process logs (and data) there;
//     FAULTS_LOG_LEVEL=debug raises the processes' log level;
//   - PROXY_BIN=path: run that binary instead of building one;
//   - KUBEMQ_ADDRESS=host:port: the backend is that external server; the
//     faults that kill the backend are skipped (the suite cannot restart
//     it), the others run against it through the relay; so are the faults
//     that freeze it, unless KUBEMQ_SERVER is set;
//   - KUBEMQ_SERVER=path of a kubemq-server script (`start DIR` prints
//     host:port and writes the server's pid to DIR/pid; `stop DIR`): the
//     faults that freeze the backend start a real KubeMQ of their own with
//     it and SIGSTOP that process instead of the embedded one.
package faults
