// Package cluster coordinates the proxy replicas that share one KubeMQ (a sidecar in every pod):
// which replica owns each KubeMQ queue, so that at most one of them consumes it at a time, and
// the log of acknowledgements that lets the next owner of a queue drop what the last one had
// already settled.
//
// # Ownership
//
// A replica that wants to consume a queue claims it in the ownership log, an events-store
// channel of KubeMQ that every replica follows. Events of one channel have one order and one
// server timestamp for every reader, so every replica judges each claim the same way:
//
//   - a claim is accepted when, at its place in the log, nobody holds the queue, or the holder's
//     last claim or heartbeat is older than the lease (Options.Lease, by the events' server
//     timestamps); the accepted claim's sequence identifies the holding;
//   - every replica heartbeats every Options.Heartbeat, listing the holdings it keeps (queue and
//     claim sequence) and its peer address; a heartbeat renews a holding with the same claim
//     sequence, and a heartbeat naming a later claim than the one a reader knows replaces it
//     (the reader missed that claim, for example because it started reading after it);
//   - a release ends a holding at once (a replica that stops gracefully).
//
// The holder acts on a queue only while a heartbeat (or the claim) it sent less than
// Lease - StopSlack ago (by its own clock, from the moment it sent it) has been read back from the
// log: another claim can only be accepted at least Lease (by the server's clock) after that
// event was stamped, which is after it was sent. Past that point the holding is lost (Lost), and
// its user must have stopped consuming before StopSlack runs out. Only clock rates matter, not
// clock agreement between machines.
//
// A replica that starts reads the log from Window (at least Lease plus two heartbeats) before
// now, and judges claims only once everything within a lease before them is in its view; until
// it has read up to a marker it wrote itself it does not claim (Ready). A gap in the sequence (an
// events-store subscriber that fell behind loses events on the real server) makes it read again
// from the gap; if the gap cannot be filled (retention), it starts over with a fresh window.
//
// # Acknowledgements
//
// See acklog.go.
package cluster
