// Package embedded is an in-process server for the KubeMQ gRPC API (service kubemq.kubemq), the
// default backend of kubemq-proxy and of every test.
//
// It owns the KubeMQ wire behaviour that the proxy relies on (see shared/kubemq-api.md sections
// 2-5): queues with sequences, receive counts, dead-letter moves, delay and expiry; QueuesDownstream
// transactions; StreamQueueMessage visibility; the events store with start modes and durable
// cursors; plain events with wildcards. Where the real community server v2.4.0 is hazardous
// (sections 8 and 9) a Strict mode refuses the hazardous pattern with an error that starts with
// "strict mode:" instead of reproducing it.
//
// With Options.DataDir set, state is kept in an append-only segment log (see storage.go and
// STORAGE.md): every acknowledged send survives a process kill.
//
// Differences from the real server are listed in STORAGE.md and in the comments of the handlers.
package embedded
