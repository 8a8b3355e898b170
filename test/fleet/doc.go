// Package fleet runs several proxy replicas (processes of the built binary) on one KubeMQ, with
// consumers on every replica of the same Pub/Sub subscription and AMQP queue, as a sidecar
// deployment does: every message must reach a consumer once, none may be lost, and a replica
// that is killed (-9) or stopped (SIGTERM) must hand its queues over. The backend is an embedded
// server of our own run in strict mode (its refusals of patterns hazardous on a real KubeMQ
// are counted from its log and must be 0), or the KubeMQ named by $KUBEMQ_ADDRESS.
//
//	go test ./test/fleet/ -v -count=1
//
// Knobs: FLEET_MESSAGES (per protocol, default 20000; -short 2000), FLEET_LOGS=dir keeps the
// process logs, FLEET_LOG_LEVEL sets their level, PROXY_BIN uses a prebuilt binary.
package fleet
