// Package kubemqclient is the only way kubemq-proxy reaches KubeMQ. It owns
// the gRPC connection and its readiness signal, the conversion between
// KubeMQ's wire types (kubemqpb, never seen outside this package) and the
// proxy's own types, channel-name safety (Channel, ValidChannel), error
// mapping (*Error and its sentinels), and the long-lived streams: events-store
// publish and subscribe, queue upstream, queue downstream transactions and
// single-message visibility streams.
//
// # Names
//
// Every channel name comes from Channel(prefix, parts...), and every call
// refuses a name that fails ValidChannel before sending anything: on the
// real server a bad name can lose events silently or break events-store
// publishing server-wide (docs/kubemq.md 5.1).
//
// # Errors
//
// Both of KubeMQ's error shapes, gRPC status and in-band (Sent=false,
// IsError), become *Error with the "Error NNN" number in Code. Match with
// errors.Is against ErrUnavailable, ErrInvalidArgument, ErrTxClosed and the
// other sentinels; IsRetryable says whether the same call may succeed later.
//
// # Readiness
//
// Dial never blocks. A health loop pings the server (with backoff while it
// is down); any call that meets an unavailable server makes it ping at once.
// A timed-out ping declares an outage only once the server has sent nothing
// for Options.OutageSilence, so a frozen server (connection open, nothing
// answers) is found within PingInterval + 2 x PingTimeout and a slow one with
// traffic is not. Ready, WaitReady, StateChanges and OnStateChange expose the
// result; publishing calls with a FailFast context fail with ErrUnavailable
// when readiness is lost instead of waiting for their deadline.
//
// # Queue delivery
//
// The pattern measured safe on the real server (docs/kubemq.md 9.4) is: one
// Downstream per queue; Get sized from QueuesInfo's waiting count (MaxItems 1
// when idle, at most 500); store what must survive a crash (delayed lease
// records, each with its own MessageID from NewID) with SendQueueMessages;
// AckAll; Sync; repeat. Settlements are fire-and-forget on the wire (the
// server answers only failures), so their failures come back from the next
// Sync and on Errors(). A Downstream's transactions live and die with it;
// close it with Close, which waits for a pending Get and closes open
// transactions first, because cancelling a stream with requests in flight
// can strand messages on the real server (8.7).
//
// # Events store
//
// PublishEvents pipelines over a few shared SendEventsStream streams.
// Sent=true is not a store acknowledgement on the real server (3.2).
// SubscribeEventsStore with a fresh ClientID honours its start position; a
// reused ClientID resumes that durable cursor instead. AutoResume
// re-subscribes after outages at the last received sequence + 1.
//
// # Auth token
//
// Options.AuthToken is sent as "authorization" metadata on every call.
// WithToken(ctx, token) overrides it for the calls and streams made with
// that context (the AMQP front-end passes a connection's password through
// this way); PublishEvents' shared streams always carry Options.AuthToken.
package kubemqclient
