// Package gcp is the Google Cloud Pub/Sub v1 gRPC front-end (emulator mode:
// plaintext, no auth). It owns the Publisher, Subscriber, IAMPolicy (iam.go) and
// SchemaService handlers, the in-memory view of the topology (topics,
// subscriptions and schemas, kept as registry records), the publish path
// (schema validation, topic log plus one filtered queue copy per
// subscription) and the mapping of every error to a gRPC status. Schema
// definitions and message validation are the schema subpackage's.
//
// Resource ids are global: the project segment of a name is validated, then
// ignored, and names are rendered back in the caller's project.
//
// # Where things are
//
// Admin RPCs: topics.go (Publisher's topic RPCs), subscriptions.go
// (Subscriber's subscription RPCs), snapshot.go, seek.go, iam.go,
// schemaservice.go. The data path: publish.go (Publish), pull.go and
// streaming.go (Pull, StreamingPull), push.go. A subscription's runtime
// (lease.go) holds its leases; ackid.go mints ack ids, keywindow.go keeps
// ordering keys' windows, failures.go turns nacks and expiries into
// retries, backoff and dead-lettering, sweep.go expires deadlines.
//
// # REST
//
// The v1 REST/JSON API shares the gRPC port (Config.DisableREST turns it
// off). sniff.go reads the first bytes of each connection: the HTTP/2
// preface goes to grpc.Server's own transport, as before, anything else
// to an http.Server. rest.go serves that with connectrpc.com/vanguard,
// which maps each google.api.http binding of the Pub/Sub and IAM protos to
// a call of the same grpc.Server in process (grpc.Server.ServeHTTP), so
// REST requests pass the same interceptors, readiness gate and limits.
// Around the transcoder: Google's error bodies (errorRewriter), Google's
// system query parameters, GET getIamPolicy (Pub/Sub's binding), a bound
// on the JSON body, and the transcoder's refusals of bad input (before any
// handler ran: markREST) answered as INVALID_ARGUMENT.
//
// # Flow control
//
// A StreamingPull stream may hold the client's max_outstanding_messages
// (and _bytes) plus the settlements heard from that stream in the last
// 250 ms. Clients batch their acks (the Go client flushes them every
// 100 ms, by unary Acknowledge), so a server that counted every delivery
// it has not yet heard acked would cap a stream at one window per flush
// interval: 10,000 msg/s with the Go client's default of 1,000, however
// fast the client is. Google's server treats the numbers as a hint, and
// the client libraries enforce them themselves (the Go client holds
// surplus messages back from its callbacks and extends their leases). The
// allowance is an estimate of the acks in transit: it grows only as fast
// as the client really settles, is gone within 250 ms of the client
// stopping, and never exceeds 100,000. Expired leases do not count. The
// per-subscription in-flight ceiling (Config.MaxInflightPerSubscription,
// 20,000 by default) bounds all streams and Pulls of a subscription
// together; the tail beyond it waits in KubeMQ. A client asking for no
// limit gets Config.MaxOutstandingMessages (1,000).
//
// # Push subscriptions
//
// A subscription with a push endpoint is consumed by a pusher (push.go) on
// the replica that consumes its queue; the other replicas push nothing and
// claim it again every 2 s, so a dead replica's push subscriptions move with
// its queues. The pusher takes messages through the subscription's runtime
// like a stream, so leases, ack deadlines, the retry and dead-letter
// policies, delivery attempts and ordering keys are the pull path's. One
// HTTP POST per message (the request format is in pushreq.go); 102, 200,
// 201, 202 and 204 ack, anything else, a connection error or no answer
// within the ack deadline nack. Concurrency: a window per subscription (3 at
// first, +1 per success, halved per failure, at most
// Config.PushMaxPerSubscription) and Config.PushMaxConcurrency requests per
// process; an ordering key has one request in flight at a time. Without a
// retry policy a failure pauses the subscription's pushes for 100 ms,
// doubling with each consecutive failure up to 600 s. Switching a
// subscription to pull gives the messages the pusher holds and has not sent
// back to the pullers at once.
//
// # Queues and incarnations
//
// Subscription s is the queue "gcp.sub.{s}". A subscription created under
// an id whose queue KubeMQ already knows (an earlier incarnation, deleted)
// gets "gcp.sub.{s}.{uid}" instead, recorded with it, so lease records,
// delayed redeliveries and a lingering consumer of the old incarnation
// never reach the new one.
//
// # Outages
//
// While KubeMQ is unreachable every RPC answers UNAVAILABLE (the readiness
// gate), StreamingPull streams end with UNAVAILABLE and the leases are
// dropped: their lease records bring the messages back, the pollers
// rebuild, and clients reconnect by themselves. Lease records carry the
// Pub/Sub ack deadline, so after a crash a leased message is redelivered
// once its deadline (plus the record delay) has passed.
package gcp
