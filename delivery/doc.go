// Package delivery owns the lease engine both front-ends use to consume KubeMQ queues without
// losing a message: one Consumer per queue per process (handed out by a Manager), its poll loop
// (one downstream stream, at most one open transaction), the in-memory lease table with its
// deadline timers, and the lease records that keep a durable copy of every leased message in
// KubeMQ until the client settles it (pattern S of kubemq-api.md section 9, with one record per
// Get batch).
//
// # How a message travels
//
//  1. The poll loop runs while some Fetch is waiting. It asks QueuesInfo how many messages wait,
//     Gets min(waiting, demand, MaxBatch) of them (or 1 with the 1 s minimum wait when none
//     wait, so a lone message returns at once), and deduplicates sequences.
//  2. For the whole batch it stores ONE lease record (a delayed copy, DelaySeconds =
//     RecordDelay, unique MessageID) holding every message of the batch, retrying until stored;
//     only then AckAll, then Sync (a barrier, so the next QueuesInfo no longer counts the batch).
//     If the record cannot be stored the transaction is closed by the client and the messages
//     go back to the queue undelivered.
//  3. The messages become leases and are handed to Fetch callers in FIFO order.
//  4. Ack forgets the lease; the record becomes obsolete. Nack, expiry and Release enqueue a
//     fresh copy (Attempt+1). A record that comes back while its lease is still live is
//     re-armed into a new record; one whose lease is settled is dropped; one written by another
//     owner (another replica, or this process before a crash or outage) is bounced until its
//     lease could still be held, then redelivered as a fresh copy.
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
//
// Native KubeMQ consumers of a proxy queue see these messages and tags as they are.
package delivery
