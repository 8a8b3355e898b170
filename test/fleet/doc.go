// Package fleet runs several proxy replicas (processes of the built binary) on one KubeMQ, with
// consumers on every replica of the same Pub/Sub subscription and AMQP queue, as a sidecar
// deployment does: every message must reach a consumer once, none may be lost, and a replica
// that is killed (-9) or stopped (SIGTERM) must hand its queues over. The backend is an embedded
// server of our own run in strict mode (its refusals of patterns hazardous on a real KubeMQ
// are counted from its log and must be 0, except a stream that ended while its Get waited,
// logged within 5 s after a replica was killed: the crash itself), or the KubeMQ named by
// $KUBEMQ_ADDRESS.
//
//	go test ./test/fleet/ -v -count=1
//
// Beside those runs: per-key order of an ordered subscription across replicas (also with a
// replica stopped), Seek and CreateSnapshot through a replica that does not hold the subscription, AMQP exclusive
// consumers and queue.delete across processes, and BenchmarkFleet (1, 2 and 3 replicas on one
// backend, and the cost of forwarding one consumer):
//
//	go test ./test/fleet/ -run '^$' -bench BenchmarkFleet -benchtime=1x -v
//
// Knobs: FLEET_MESSAGES (per protocol, default 20000; -short 2000), FLEET_REPLICAS (the no-fault
// TestAMQPFleet and TestPubSubFleet, 1 to 8, and the kill and SIGTERM runs of both protocols,
// 2 to 8; default 3), FLEET_LOGS=dir keeps the
// process logs, FLEET_LOG_LEVEL sets their level, PROXY_BIN uses a prebuilt binary,
// FLEET_BENCH_MESSAGES sets BenchmarkFleet's messages per measurement (default 10000).
package fleet
