// Package delivery owns the lease engine both front-ends use to consume KubeMQ queues without
// losing a message: one Consumer per queue per process (handed out by a Manager), its poll loop
// (one downstream stream, at most one open transaction), the in-memory lease table with its
// deadline timers, and the lease records that keep a durable copy of every leased message in
// KubeMQ until the client settles it (pattern S of docs/kubemq.md section 9, with one record per
// Get batch).
//
// # How a message travels
//
//  1. The poll loop runs while some Fetch is waiting. It asks QueuesInfo how many messages wait,
//     Gets min(waiting, demand, MaxBatch) of them (or 1 with the 1 s minimum wait when none
//     wait, so a lone message returns at once), and deduplicates sequences. While the last
//     count minus what was taken since still covers the next Get (a backlog draining), it skips
//     QueuesInfo and the Sync that protects it (at least every 16 batches it syncs anyway).
//  2. For the whole batch it stores ONE lease record (a delayed copy, DelaySeconds =
//     RecordDelay, unique MessageID) holding every message of the batch, retrying until stored;
//     only then AckAll, then Sync (a barrier, so the next QueuesInfo no longer counts the batch;
//     skipped as said above while a backlog drains).
//     If the record cannot be stored the transaction is closed by the client and the messages
//     go back to the queue undelivered.
//  3. The messages become leases and are handed to Fetch callers in FIFO order.
//  4. Ack forgets the lease; the record becomes obsolete. Nack, expiry and Release enqueue a
//     fresh copy (Attempt+1); Requeue instead puts the lease back into the ready buffer at its
//     original position (Attempt+1 at its next hand-out), its record keeping it durable. A record that comes back while its lease is still live is
//     re-armed into a new record; one whose lease is settled is dropped; one written by another
//     owner (another replica, or this process before a crash or outage) is bounced until its
//     lease could still be held, then redelivered as a fresh copy.
//
// # API
//
// A Manager hands out Handles on one Consumer per queue (reference counted); the last Handle's
// Close lets the Consumer linger, Retire closes it at once (a front-end that empties the queue
// must not find what the Consumer had buffered in the next one). Fetch returns
// Deliveries, each with an opaque LeaseID minted per delivery; Ack, Nack (with an optional
// retry delay), Extend (modifyAckDeadline), Release (a copy at the queue's tail), Requeue (back
// in place, at the head in arrival order: AMQP's requeue) and Unfetch (never shown to a client)
// settle them by id. Unknown or stale ids report false.
//
// The ready buffer holds recorded leases nobody holds, in the order the queue gave them:
// Fetch takes from its head first. Handle.SetReadAhead lets a Fetch that wants few messages
// make the poll loop take more at once; they wait in the buffer for any Fetch of the queue.
// TryFetch is a Fetch that answers empty instead of waiting once the poll loop finds the queue
// empty (AMQP's basic.get). Ready (on a Consumer, Handle, or the Manager by queue name) counts
// what a Fetch could get: KubeMQ's count less the Consumer's own lease records that are back
// in the queue, plus the buffer and the copies on their way (ready.go). Purge drops the buffer
// (AMQP's queue.purge). None of these changes the durability rules below. A front-end that runs its own
// deadlines (Pub/Sub) leaves the engine deadline at 0 and states them with Handle.SetHold and
// Hold instead: the engine never expires those, but its lease records carry them, so another
// owner waits for them. BeforeRedeliver lets a front-end dead-letter a message instead of
// redelivering it; Sentinel stores an empty record and reports its return, after which every
// record stored before it has come back (sentinel.go); OnLeasesLost and ErrLeasesLost report a backend failure, after which every
// earlier Delivery is void. Totals are exported to Prometheus by the Manager.
//
// # Outages
//
// A broken stream drops the Consumer's lease table (the records bring every message back).
// With a Backend that is a StateNotifier (NewKubeMQBackend is: it passes on the client's health
// pings) the Manager also drops the tables of every Consumer as soon as KubeMQ is reported
// unreachable, idle ones included, fails their waiting Fetch calls with ErrLeasesLost and makes
// their poll loops open fresh streams; pollers rebuild on the next Fetch. A Consumer with
// nothing leased keeps its owner id, so an outage alone causes no duplicates.
//
// # Lease records and owners
//
// Every entry names its owner: a random id per Consumer incarnation, renewed whenever the lease
// table is dropped, and passed on by the Manager to the queue's next Consumer only when the
// previous one closed with every lease settled. So "owner is me and the lease is unknown"
// always means "settled", and a record is never dropped for a lease that was forgotten.
// Entries of an earlier incarnation of the same Consumer are redelivered at once; entries of
// another owner are bounced until their expiry (the lease deadline or Hold promise, or the
// waiting fetchers' deadline or hold for a fresh record, or HoldExpiry after the last re-arm)
// plus RecordDelay, then redelivered. Records return only while the Consumer polls (some Fetch
// waits), so a promise made later reaches the records at the next re-arm.
//
// Consequences (at-least-once, never loss):
//   - without Settlements, after a proxy crash or restart, messages acked in the last
//     ~RecordDelay+HoldExpiry come back once (the new process cannot know the old acks);
//   - without Owners, with several replicas consuming one queue, a record may return to a
//     replica that does not own it; if that happens on every return until expiry+RecordDelay, the message is
//     redelivered while its owner still holds it (a duplicate). A replica polls only while it
//     has demand, so a replica whose clients hold messages without fetching more does not see
//     its records at all. Raise HoldExpiry to make this rarer.
//
// # Several processes on one KubeMQ
//
// With Options.Owners (the cluster package's ownership log) a Manager claims each queue before
// it consumes it, so at most one process holds an open transaction on a queue at any time. A
// queue another process consumes is refused with ErrNotOwner (front-ends forward such work to
// that process); a holding that is lost closes the Consumer (its leases go back as fresh copies,
// Fetch calls fail with ErrHandedOver); a Consumer that closes releases the holding, for
// another process to claim at once. Entries of another owner in returning records are then
// always a past owner's leftovers, redelivered at once instead of bounced.
//
// With Options.Settlements (the cluster package's acknowledgement log) a Consumer records the
// leases it settles, and a marker when it closes with nothing leased; the queue's next owner,
// in this process or another, drops the returning entries so recorded. So a stop redelivers
// nothing that was acked, and a crash only what was settled in the log's last flush interval.
//
// # Reserved tags
//
// Tags starting with "_kmqp_" belong to this package and never reach Delivery.Tags:
//
//   - TagRecord ("_kmqp_record"): marks a lease record; the value is the record format version
//     ("1"). The body is the binary encoding in record.go.
//   - TagAttempt ("_kmqp_attempt"): on a re-enqueued copy, the delivery attempt (decimal) the
//     copy will be delivered with. Absent means 1.
//   - TagMessageID ("_kmqp_msgid"): on a re-enqueued copy, the MessageID of the original, so
//     Delivery.MessageID is stable across redeliveries.
//   - TagStored ("_kmqp_stored"): on a re-enqueued copy, when KubeMQ stored the original (Unix
//     ns, decimal), so Delivery.StoredAt is stable too. Lease records carry it in their entries.
//   - TagSentinel ("_kmqp_sentinel"): on an empty lease record, a sentinel: its expiry (Unix ms)
//     and id, "<expiry>:<id>".
//
// Native KubeMQ consumers of a proxy queue see these messages and tags as they are.
package delivery
