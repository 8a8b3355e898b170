// Package embedded is an in-process server for the KubeMQ gRPC API (service kubemq.kubemq), the
// default backend of kubemq-proxy and of every test (see internal/kubemqtest).
//
// It owns the KubeMQ wire behaviour that the proxy relies on (docs/kubemq.md, sections 2-5):
// queues with per-queue sequences, receive counts, dead-letter moves, delay and expiry;
// QueuesDownstream transactions; StreamQueueMessage visibility; ReceiveQueueMessages,
// AckAllQueueMessages and QueuesInfo; the events store with start modes and durable cursors;
// plain events with wildcards; commands and queries. Error texts are the real server's.
//
// Where the real community server v2.4.0 is hazardous (sections 8 and 9), Options.Strict refuses
// the hazardous pattern with an error that starts with "strict mode:"; StrictStats counts them in
// either mode. COMPAT.md lists every known difference from the real server.
//
// With Options.DataDir set, state is made durable in an append-only segment log with group commit
// (storage.go, record.go, recovery.go; STORAGE.md has the engine comparison and sync policy):
// every acknowledged send survives a process kill. Queue messages, events-store events and
// delayed messages are then held as an index only and read back from their segment when
// delivered, replayed or due (events sent while a subscription is live reach it from memory).
//
// The real server's store and queue limits (retention, purge of inactive channels, channel and
// subscriber caps, messages and bytes per channel, the queue limits, the body limit) are Options
// with the same meaning (limits.go); Options.MaxMemory bounds the bytes of messages held, beyond
// which a client's send is refused ("memory limit reached").
//
// Serve runs the gRPC server (100 MiB messages both ways, as the real server) on a listener;
// GRPCServer exposes it for callers that serve it themselves; Stop ends open streams with
// Unavailable, flushes and closes the store.
package embedded
