package delivery

import (
	"context"
	cryptorand "crypto/rand"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"go.uber.org/zap"
)

const (
	// getWait is the wait of every Get: the server minimum (docs/kubemq.md 8.2). Gets are sized so
	// they return at once; the wait only matters for the MaxItems=1 poll of an empty queue.
	getWait = time.Second
	// opTimeout bounds one stream operation beyond its own wait. A stream that does not answer
	// in time is treated as broken.
	opTimeout = 30 * time.Second
	// maxUnsynced bounds how many batches may be settled without a Sync while a backlog
	// drains (settlement failures surface at the next Sync).
	maxUnsynced = 16
)

// errTransient marks a Get the server refused for now on a stream that goes on: the poll loop
// retries after a backoff, holding on to its leases and its waiting Fetch calls.
var errTransient = errors.New("delivery: transient refusal")

// pollState is what the poll loop knows between Gets.
type pollState struct {
	// known is a lower bound on the messages still waiting, from the last QueuesInfo minus
	// what the Gets since then took (each acked and fully settled). While it covers the next
	// Get, QueuesInfo and the Sync before it are skipped: a draining backlog costs a Get and a
	// record store per batch, not four round trips. Another consumer of the queue (a second
	// replica) can make it too high; a Get that then comes back short resets it.
	known    int64
	unsynced int // batches acked since the last Sync
	// probe sizes the next Get while the server cannot count the queue (Waiting -1): it
	// doubles while Gets come back full and falls back to 1 when one comes back short, so a
	// backlog still drains in large batches and an empty queue costs a 1 s wait per Get only.
	probe int
	// lastTx is the transaction of the last batch acked, for a barrier before a pause.
	lastTx string
}

// pollLoop owns the downstream stream (and so the only open transaction on the queue). It polls
// while some Fetch waits for more than the ready buffer holds.
func (c *Consumer) pollLoop() {
	defer close(c.pollDone)
	var ds Downstream
	var st pollState
	gets := 0
	bo := backoff{min: 50 * time.Millisecond, max: 2 * time.Second}
	closeStream := func() {
		if ds == nil {
			return
		}
		if err := ds.Close(); err != nil {
			c.log.Debug("close downstream", zap.Error(err))
		}
		ds = nil
		st = pollState{}
	}
	defer closeStream()
	synced := c.opts.Settlements == nil
	for {
		ok, perr := c.servePause(ds, &st)
		if !ok {
			return
		}
		if perr != nil {
			closeStream()
			c.pollFailed(perr, true)
			continue
		}
		demand, ahead, ok := c.awaitDemand()
		if !ok {
			return
		}
		if demand <= 0 {
			continue // woken for a pause
		}
		if !synced {
			// Settlements the queue's last owner wrote before this Consumer started must be
			// readable before its records are judged.
			ctx, cancel := context.WithTimeout(c.pollCtx, opTimeout)
			if err := c.opts.Settlements.Sync(ctx); err != nil && c.pollCtx.Err() == nil {
				c.log.Warn("settlements not read up to now; the last owner's settled leases may come back", zap.Error(err))
			}
			cancel()
			synced = true
			if tl, ok := c.opts.Settlements.(TakenLog); ok {
				now := time.Now()
				c.seedTaken(tl.TakenOf(c.queue, now.Add(-takenKeep)), now)
			}
		}
		if c.staleStream.Swap(false) {
			closeStream() // opened before an outage: replace it rather than fail on it
		}
		if ds == nil {
			var err error
			ds, err = c.b.OpenDownstream(c.pollCtx)
			if err != nil {
				ds = nil
				c.pollFailed(fmt.Errorf("delivery: open downstream for %s: %w", c.queue, err), false)
				if !c.pause(bo.next()) {
					return
				}
				continue
			}
			gets = 0
		}
		broken, err := c.pollOnce(ds, demand, ahead, &st)
		gets++
		if errors.Is(err, errTransient) {
			c.st.transient.Add(1)
			c.log.Debug("get refused for now; retrying", zap.Error(err))
			st = pollState{}
			if !c.pause(bo.next()) {
				return
			}
			continue
		}
		if err != nil {
			st = pollState{}
			if broken {
				closeStream()
			}
			if !broken && c.pollCtx.Err() != nil {
				return // closing; Close fails the waiters
			}
			c.pollFailed(err, broken)
			if !c.pause(bo.next()) {
				return
			}
			continue
		}
		bo.reset()
		if gets >= c.opts.StreamRecycle {
			closeStream()
		}
	}
}

// awaitDemand blocks until some Fetch wants more than the ready buffer holds. ahead is the
// largest read-ahead among the waiting Fetch calls. ok is false when the Consumer is closing.
func (c *Consumer) awaitDemand() (demand, ahead int, ok bool) {
	for {
		c.mu.Lock()
		demand, closing := c.demandLocked(), c.closing
		ahead = 0
		for _, w := range c.waiters {
			ahead = max(ahead, w.readAhead)
		}
		if demand <= 0 && c.idle != nil {
			close(c.idle)
			c.idle = nil
		}
		c.mu.Unlock()
		if closing || c.pollCtx.Err() != nil {
			return 0, 0, false
		}
		if demand > 0 {
			return demand, ahead, true
		}
		if c.pausePending() {
			return 0, 0, true
		}
		select {
		case <-c.pollWake:
		case <-c.pollCtx.Done():
			return 0, 0, false
		}
	}
}

// pause waits d, or until the Consumer closes (false).
func (c *Consumer) pause(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-c.pollCtx.Done():
		return false
	}
}

// pollFailed reports a failed poll to the waiting Fetch calls. A broken stream also drops the
// lease table: the records bring every message back, and the owner id changes so they are
// recovered rather than mistaken for settled ones.
func (c *Consumer) pollFailed(err error, broken bool) {
	c.mu.Lock()
	if !broken {
		c.failWaitersLocked(err)
		c.mu.Unlock()
		c.log.Warn("poll failed", zap.Error(err))
		return
	}
	lost := fmt.Errorf("%w: %w", ErrLeasesLost, err)
	n := c.resetLocked()
	// A broken stream may be a KubeMQ restarted with an empty store, numbering the queue's
	// copies from 1 again: the sequences taken before it no longer name the same copies.
	c.taken = nil
	c.mu.Unlock()
	c.log.Warn("downstream failed; lease table dropped, lease records will bring the messages back",
		zap.Int("leases", n), zap.Error(err))
	if c.opts.OnLeasesLost != nil {
		c.opts.OnLeasesLost(lost, n)
	}
	// Waiters hear of it after the callback, so a front-end reacting to either sees both.
	c.mu.Lock()
	c.failWaitersLocked(lost)
	c.mu.Unlock()
}

// pollOnce runs one Get and everything that must happen before its transaction is settled.
// It takes up to max(demand, ahead) messages. broken reports that the stream can no longer be
// used.
func (c *Consumer) pollOnce(ds Downstream, demand, ahead int, st *pollState) (broken bool, err error) {
	want := int64(min(max(demand, ahead), c.opts.MaxBatch))
	if st.known < want {
		chk := c.beginLook()
		n, err := c.b.Waiting(c.pollCtx, c.queue)
		if err != nil {
			return false, fmt.Errorf("delivery: queue info %s: %w", c.queue, err)
		}
		st.known = max(n, 0)
		if n >= 0 {
			st.probe = 0
		} else if st.probe == 0 {
			st.probe = 1
		}
		if n == 0 && !c.emptyAt(chk) {
			return false, nil // only TryFetch calls wanted something: no Get
		}
	}
	maxItems := 1
	switch {
	case st.known > 0:
		maxItems = int(min(st.known, want))
	case st.probe > 0:
		maxItems = int(min(int64(st.probe), want))
	}
	// Stream operations never take the Consumer's cancellation: cancelling a stream with a Get
	// outstanding can strand messages on the real server (docs/kubemq.md 8.7).
	opCtx := context.WithoutCancel(c.pollCtx)
	ctx, cancel := context.WithTimeout(opCtx, getWait+opTimeout)
	// Only where KubeMQ cannot count the queue is a Get short of its size taken to mean the
	// queue is empty: elsewhere a Get whose slots go to expired messages answers short at
	// once (embedded/COMPAT.md), and the next QueuesInfo tells.
	uncounted := st.probe > 0
	chk := c.beginLook()
	tx, msgs, err := ds.Get(ctx, c.queue, maxItems, getWait)
	cancel()
	c.st.gets.Add(1)
	if err != nil {
		err = fmt.Errorf("delivery: get from %s: %w", c.queue, err)
		if ds.Err() == nil && c.b.Retryable(err) {
			// The server refused this Get for now (the real server's "Error 302:
			// connection not available, please retry" under load): no transaction was
			// opened and the stream goes on, so nothing held is given up.
			return false, fmt.Errorf("%w: %w", errTransient, err)
		}
		return true, err
	}
	if len(msgs) < maxItems {
		st.known = 0 // the estimate was off, or the queue ran dry: ask again
	} else {
		st.known -= int64(len(msgs))
	}
	if st.probe > 0 {
		if len(msgs) < maxItems {
			st.probe = 1
		} else {
			st.probe = min(2*st.probe, c.opts.MaxBatch)
		}
	}
	if len(msgs) == 0 {
		if uncounted {
			c.emptyAt(chk)
		}
		return false, nil // an empty Get completes its transaction
	}
	b := c.prepare(msgs, time.Now())
	if err := c.storeRecords(b); err != nil {
		c.st.storeFailures.Add(1)
		ctx, cancel := context.WithTimeout(opCtx, opTimeout)
		defer cancel()
		if cerr := ds.CloseByClient(ctx, tx); cerr != nil {
			return true, fmt.Errorf("delivery: give back transaction on %s after %w: %w", c.queue, err, cerr)
		}
		if serr := ds.Sync(ctx, tx); serr != nil {
			return true, fmt.Errorf("delivery: sync %s: %w", c.queue, serr)
		}
		// The messages are back in the queue: any record stored for them is obsolete.
		c.mu.Lock()
		c.unsure = false
		c.mu.Unlock()
		return false, err
	}
	ctx, cancel = context.WithTimeout(opCtx, opTimeout)
	defer cancel()
	// From the ack until the batch is buffered (and KubeMQ's count no longer has it), Ready
	// waits rather than count it twice or not at all.
	c.moving.Add(1)
	defer func() {
		c.moved.Add(1)
		c.moving.Add(-1)
	}()
	if err := ds.AckAll(ctx, tx); err != nil {
		return true, fmt.Errorf("delivery: ack batch on %s: %w", c.queue, err)
	}
	c.noteTaken(msgs, time.Now())
	c.commit(b)
	st.lastTx = tx
	if uncounted && len(msgs) < maxItems {
		c.emptyAt(chk) // after the commit: what the Get brought went to the waiters first
	}
	st.unsynced++
	if st.known >= int64(c.opts.MaxBatch) && st.unsynced < maxUnsynced {
		return false, nil // the next Get is sized from known: no QueuesInfo to protect
	}
	// The barrier keeps the next QueuesInfo from counting the batch just acked, which would
	// size the next Get too big and make it wait the full second (docs/kubemq.md 9.4 rule 4).
	if err := ds.Sync(ctx, tx); err != nil {
		return true, fmt.Errorf("delivery: sync %s: %w", c.queue, err)
	}
	st.unsynced = 0
	st.lastTx = ""
	return false, nil
}

// beginLook numbers a look at the queue (a QueuesInfo or a Get) about to begin.
func (c *Consumer) beginLook() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.checks++
	return c.checks
}

// emptyAt answers the TryFetch calls that look chk found the queue empty for (it began after
// them). It reports whether some Fetch still wants more than the buffer holds.
func (c *Consumer) emptyAt(chk uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.ready) == 0 {
		c.foundEmptyLocked(chk)
	}
	return c.demandLocked() > 0
}

// batch is what one Get turns into: new leases, re-armed and recovered ones, and the records
// that must be stored before the transaction is acked.
type batch struct {
	owner     ownerID  // the owner its records name
	fresh     []*lease // from data messages: buffered once committed
	rearm     []rearm  // own live leases whose returned entry was current
	recovered []*lease // entries of dead owners: redelivered once committed
	records   [][]byte
	sentinels []string // foreign sentinels to store again (sentinel.go)
	entries   int
	returned  int
}

type rearm struct {
	l   *lease
	gen uint32 // the generation the new entry carries
}

// prepare classifies a Get response. Decisions that read the lease table are taken under mu;
// the records are encoded outside it (lease messages are immutable).
func (c *Consumer) prepare(msgs []Message, now time.Time) *batch {
	b := &batch{}
	var seen map[uint64]struct{}
	if len(msgs) > 1 {
		seen = make(map[uint64]struct{}, len(msgs))
	}
	var recs []*Message
	data := make([]*Message, 0, len(msgs))
	// A second delivery of a copy an earlier batch took and acknowledged (taken.go) is
	// dropped: the first was handled in full, data or record alike.
	var retaken map[int]bool
	c.mu.Lock()
	taken := c.takenSinceLocked(now.Add(-retakenWindow))
	for i := range msgs {
		if taken.has(msgs[i].Sequence) {
			if retaken == nil {
				retaken = map[int]bool{}
			}
			retaken[i] = true
		}
	}
	c.mu.Unlock()
	c.st.retaken.Add(uint64(len(retaken)))
	for i := range msgs {
		m := &msgs[i]
		if retaken[i] {
			continue
		}
		if seen != nil && m.Sequence != 0 {
			if _, dup := seen[m.Sequence]; dup {
				c.st.dupSeqs.Add(1)
				continue
			}
			seen[m.Sequence] = struct{}{}
		}
		if _, ok := m.Tags[TagRecord]; ok {
			recs = append(recs, m)
		} else {
			data = append(data, m)
		}
	}
	c.st.received.Add(uint64(len(data)))
	b.returned = len(recs)
	c.checkSendOrder(data)

	keys := randomKeys(len(data))
	b.fresh = make([]*lease, len(data))
	for i, m := range data {
		b.fresh[i] = newLease(keys[i], m)
	}

	w := recordWriter{maxBytes: c.opts.MaxRecordBytes}
	addEntry := func(owner ownerID, l *lease, gen uint32, exp int64) {
		w.add(&recordEntry{owner: owner, lease: l.key, gen: gen, attempt: l.attempt, expiresAt: exp, msg: &l.msg})
		b.entries++
	}
	delay := c.opts.RecordDelay

	var entries []entry
	var sentinels []string
	for _, r := range recs {
		if v, ok := r.Tags[TagSentinel]; ok {
			sentinels = append(sentinels, v) // an empty record: no entries
			continue
		}
		es, err := decodeRecord(r.Body)
		if err != nil {
			// Only a foreign writer using the reserved tag produces this; what can be read is kept.
			c.st.corrupt.Add(1)
			c.log.Error("dropping undecodable part of a lease record", zap.String("id", r.ID), zap.Error(err))
		}
		entries = append(entries, es...)
	}

	c.mu.Lock()
	c.readBackLocked(recs)
	if len(recs) > 0 {
		c.forgetRecordsLocked(now)
	}
	own, again := c.sentinelsLocked(sentinels, now)
	b.sentinels = again
	owner := c.owner
	b.owner = owner
	fresh := now.Add(c.freshHoldLocked()).UnixMilli()
	if len(b.fresh) > 0 || len(entries) > 0 {
		c.unsure = true // records for leases not in the table are about to be stored
	}
	type pending struct {
		l   *lease
		gen uint32
		exp int64
	}
	var rearms []pending
	var bounce [][]byte
	var recover []entry
	hook := c.unsettled.Load()
	settled := c.opts.Settlements
	var bounced []*entry // for the hook only
	// Two copies of one entry (a record stored twice after an ambiguous send failure) must
	// not turn into two live records or two redeliveries.
	type entryKey struct {
		owner ownerID
		lease leaseKey
		gen   uint32
	}
	var seenEntry map[entryKey]struct{}
	if len(entries) > 1 {
		seenEntry = make(map[entryKey]struct{}, len(entries))
	}
	for i := range entries {
		e := &entries[i]
		if seenEntry != nil {
			k := entryKey{e.owner, e.lease, e.gen}
			if _, dup := seenEntry[k]; dup {
				c.st.obsolete.Add(1)
				continue
			}
			seenEntry[k] = struct{}{}
		}
		switch {
		case e.owner == owner:
			l := c.table[e.lease]
			if l == nil || l.gen != e.gen {
				c.st.obsolete.Add(1)
				continue
			}
			rearms = append(rearms, pending{l, l.gen + 1, c.expiresAtLocked(l, now)})
		case settled != nil && settled.Settled(e.owner, e.lease):
			c.st.obsolete.Add(1) // its owner acked it or gave it back before it went
		case c.exclusive || c.pastOwnerLocked(e.owner) || now.UnixMilli() >= e.expiresAt+delay.Milliseconds():
			// A past owner's leftover (with Owners, no other process consumes the queue
			// while this one does, so any other owner is past).
			recover = append(recover, *e)
		default:
			bounce = append(bounce, e.raw)
			if hook != nil {
				bounced = append(bounced, e)
			}
		}
	}
	c.mu.Unlock()

	for _, l := range b.fresh {
		addEntry(owner, l, l.gen, fresh)
	}
	for _, p := range rearms {
		addEntry(owner, p.l, p.gen, p.exp)
		b.rearm = append(b.rearm, rearm{p.l, p.gen})
	}
	if len(recover) > 0 {
		rk := randomKeys(len(recover))
		for i := range recover {
			m := recover[i].message()
			l := newLease(rk[i], &m)
			l.attempt = recover[i].attempt
			l.state, l.fresh = stateRequeue, false
			b.recovered = append(b.recovered, l)
			addEntry(owner, l, l.gen, fresh)
		}
	}
	if hook != nil {
		for _, e := range bounced {
			m := e.message()
			(*hook)(&m, time.UnixMilli(e.expiresAt).Add(delay))
		}
		for _, l := range b.recovered {
			(*hook)(&l.msg, now) // the message the recovered lease carries, decoded once
		}
	}
	// Every record stored before an own sentinel has been reported by now (the hook above, or
	// an earlier Get): it may be announced.
	for _, ch := range own {
		close(ch)
	}
	for _, raw := range bounce {
		w.addRaw(raw)
		b.entries++
	}
	b.records = w.finish()
	c.st.recordsReturned.Add(uint64(len(recs)))
	c.st.rearmed.Add(uint64(len(rearms)))
	c.st.bounced.Add(uint64(len(bounce)))
	c.st.recovered.Add(uint64(len(recover)))
	return b
}

// randomKeys mints n lease keys with one crypto/rand read.
func randomKeys(n int) []leaseKey {
	if n == 0 {
		return nil
	}
	buf := make([]byte, n*len(leaseKey{}))
	_, _ = cryptorand.Read(buf) // never fails on supported platforms (Go 1.24+)
	keys := make([]leaseKey, n)
	for i := range keys {
		copy(keys[i][:], buf[i*len(leaseKey{}):])
	}
	return keys
}

// newLease makes a buffered lease from a received data message, taking the attempt and the
// original id and store time from the reserved tags and removing them.
func newLease(k leaseKey, m *Message) *lease {
	l := &lease{key: k, gen: 1, attempt: 1, hi: -1, fresh: true, seq: m.Sequence}
	l.msg = Message{ID: m.ID, Metadata: m.Metadata, Body: m.Body, Tags: m.Tags, Stored: m.Stored}
	reserved := false
	for k := range m.Tags {
		if len(k) >= len(reservedPrefix) && k[:len(reservedPrefix)] == reservedPrefix {
			reserved = true
			break
		}
	}
	if !reserved {
		return l
	}
	tags := make(map[string]string, len(m.Tags))
	for k, v := range m.Tags {
		switch {
		case k == TagAttempt:
			if a, err := strconv.ParseUint(v, 10, 32); err == nil && a > 0 {
				l.attempt = uint32(a)
			}
		case k == TagMessageID:
			l.msg.ID = v
		case k == TagStored:
			if t, err := strconv.ParseInt(v, 10, 64); err == nil && t > 0 {
				l.msg.Stored = t
			}
		case len(k) >= len(reservedPrefix) && k[:len(reservedPrefix)] == reservedPrefix:
		default:
			tags[k] = v
		}
	}
	if len(tags) == 0 {
		tags = nil
	}
	l.msg.Tags = tags
	return l
}

// expiresAtLocked is the time after which another owner may redeliver l: its deadline or its
// promise (Hold) when it has one, else HoldExpiry ahead (a lease without either is re-armed
// every record delay).
func (c *Consumer) expiresAtLocked(l *lease, now time.Time) int64 {
	switch {
	case (l.state == stateOut || l.state == stateDelayed) && !l.deadline.IsZero():
		return l.deadline.UnixMilli()
	case l.state == stateOut && !l.promise.IsZero():
		return l.promise.UnixMilli()
	}
	return now.Add(c.opts.HoldExpiry).UnixMilli()
}

// freshHoldLocked is how long the record of a message just received promises it: the longest
// deadline or hold among the waiting Fetch calls (one of them will get it), else HoldExpiry.
// So after a crash a Pub/Sub message comes back after its ack deadline, not HoldExpiry.
func (c *Consumer) freshHoldLocked() time.Duration {
	var d time.Duration
	for _, w := range c.waiters {
		d = max(d, w.deadline, w.hold)
	}
	if d <= 0 {
		return c.opts.HoldExpiry
	}
	return d
}

func (c *Consumer) pastOwnerLocked(o ownerID) bool {
	for _, p := range c.pastOwners {
		if p == o {
			return true
		}
	}
	return false
}

// storeRecords stores every record of b, retrying failures with fresh ids until StoreTimeout.
func (c *Consumer) storeRecords(b *batch) error {
	if len(b.records) == 0 && len(b.sentinels) == 0 {
		return nil
	}
	msgs := make([]Message, len(b.records), len(b.records)+len(b.sentinels))
	for i, body := range b.records {
		msgs[i] = Message{
			ID:           c.ids.next(),
			Body:         body,
			Tags:         map[string]string{TagRecord: recordVersion},
			DelaySeconds: int(c.opts.RecordDelay / time.Second),
		}
	}
	msgs = append(msgs, c.sentinelMessages(b.sentinels)...)
	ctx, cancel := context.WithTimeout(c.pollCtx, c.opts.StoreTimeout)
	defer cancel()
	if err := c.sendAll(ctx, msgs); err != nil {
		return fmt.Errorf("delivery: store lease record on %s: %w", c.queue, err)
	}
	c.st.recordsStored.Add(uint64(len(b.records)))
	c.st.entriesStored.Add(uint64(b.entries))
	c.st.sentinelsStored.Add(uint64(len(b.sentinels)))
	return nil
}

// sendAll stores msgs, resending the failed ones under fresh ids (a failure may hide a stored
// copy, and a repeated id in the delay machinery loses a message) until ctx ends or a
// failure is not retryable.
//
// A send of nothing but delayed records (lease records, sentinels) gets recordAttempt per
// attempt: the real KubeMQ now and then leaves a delayed send unanswered for half a minute or
// more while other sends to the same queue go through, and the Get whose transaction waits
// on the record must not wait with it. A record stored twice is harmless (a copy whose lease
// is gone or newer is dropped when it comes back); a message copy is never sent twice.
func (c *Consumer) sendAll(ctx context.Context, msgs []Message) error {
	bo := backoff{min: 20 * time.Millisecond, max: time.Second}
	attempt := time.Duration(0)
	if allDelayed(msgs) {
		attempt = recordAttempt
	}
	for {
		actx, cancel := ctx, context.CancelFunc(func() {})
		if attempt > 0 {
			actx, cancel = context.WithTimeout(ctx, attempt)
		}
		res, err := c.b.Send(actx, c.queue, msgs)
		timedOut := err != nil && ctx.Err() == nil && actx.Err() != nil
		cancel()
		if timedOut {
			// It may have been stored: the next attempt uses fresh ids.
			c.st.recordTimeouts.Add(1)
			c.log.Warn("lease record store unanswered; sending again", zap.Duration("after", attempt), zap.Int("records", len(msgs)))
			msgs = withFreshIDs(msgs, c.ids.next)
		} else if err == nil {
			c.noteStored(msgs, res)
			var failed []Message
			for i, e := range res {
				if e == nil {
					continue
				}
				if !c.b.Retryable(e) {
					return e
				}
				err = e
				m := msgs[i]
				m.ID = c.ids.next()
				failed = append(failed, m)
			}
			if len(failed) == 0 {
				return nil
			}
			msgs = failed
		} else if !c.b.Retryable(err) {
			return err
		}
		t := time.NewTimer(bo.next())
		select {
		case <-ctx.Done():
			t.Stop()
			return errors.Join(err, ctx.Err())
		case <-t.C:
		}
	}
}

// recordAttempt bounds one attempt to store delayed records (sendAll).
var recordAttempt = 3 * time.Second

func allDelayed(msgs []Message) bool {
	for i := range msgs {
		if msgs[i].DelaySeconds <= 0 {
			return false
		}
	}
	return len(msgs) > 0
}

func withFreshIDs(msgs []Message, next func() string) []Message {
	out := make([]Message, len(msgs))
	for i, m := range msgs {
		m.ID = next()
		out[i] = m
	}
	return out
}

// noteStored tracks the delayed records among msgs that the backend stored (ready.go).
func (c *Consumer) noteStored(msgs []Message, res []error) {
	var stored []bool
	for i := range msgs {
		if msgs[i].DelaySeconds <= 0 {
			continue
		}
		if stored == nil {
			stored = make([]bool, len(msgs))
		}
		stored[i] = i < len(res) && res[i] == nil
	}
	if stored != nil {
		c.trackRecords(msgs, stored, time.Now())
	}
}

// commit makes a stored batch live: new leases join the ready buffer and are handed to the
// waiters, re-armed leases take their new generation, recovered ones go to the settler.
func (c *Consumer) commit(b *batch) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if b.owner != c.owner {
		// The table was dropped while the batch was stored: its records name a past owner and
		// bring every message back as a recovery.
		return
	}
	c.unsure = false
	for _, r := range b.rearm {
		if c.table[r.l.key] == r.l && r.l.gen == r.gen-1 {
			r.l.gen = r.gen
		}
	}
	for _, l := range b.fresh {
		c.nextPos++
		l.pos = c.nextPos
		c.table[l.key] = l
	}
	c.ready = append(c.ready, b.fresh...)
	for _, l := range b.recovered {
		c.table[l.key] = l
		c.requeue = append(c.requeue, l)
	}
	if len(b.recovered) > 0 {
		wake(c.settleWake)
	}
	c.serveLocked(time.Now())
}

// backoff is exponential with full jitter.
type backoff struct {
	min, max, cur time.Duration
}

func (b *backoff) next() time.Duration {
	if b.cur == 0 {
		b.cur = b.min
	}
	d := b.cur/2 + rand.N(b.cur/2+1)
	b.cur = min(b.cur*2, b.max)
	return d
}

func (b *backoff) reset() { b.cur = 0 }

// checkSendOrder logs data messages that a Get brought after a later-stored one (a lower KubeMQ
// sequence than one seen before). KubeMQ hands a queue out in send order, and Pub/Sub ordering
// keys rely on it; the real server was seen to hand two messages out swapped (embedded/COMPAT.md),
// and the log says when it happens under the proxy. A copy given back to the queue after a failed
// record store comes again with its old sequence and is logged too.
func (c *Consumer) checkSendOrder(data []*Message) {
	var low, high uint64
	n := 0
	for _, m := range data {
		if m.Sequence == 0 {
			continue
		}
		if m.Sequence < c.highSeq {
			if n == 0 {
				low, high = m.Sequence, c.highSeq
			}
			n++
			continue
		}
		c.highSeq = m.Sequence
	}
	if n > 0 {
		c.log.Warn("KubeMQ handed out messages stored before one it handed out earlier", zap.String("queue", c.queue),
			zap.Int("messages", n), zap.Uint64("first_sequence", low), zap.Uint64("after_sequence", high))
	}
}
