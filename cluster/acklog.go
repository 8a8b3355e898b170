package cluster

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/kubemq-io/kubemq-proxy/kubemqclient"
)

// The acknowledgement log lets the next owner of a queue tell which of the last owner's lease
// records are obsolete. Without it, every lease settled in the last record delay before a crash
// (or a graceful stop) comes back once when its record returns to the next owner. The owner
// writes the keys of settled leases (acked, or given back as a fresh copy) in batches a few
// times a second, and a marker when it closes with nothing left leased; every replica follows
// the log and keeps Window of it in memory. So a crash redelivers at most the last FlushEvery of
// settled leases, and a graceful stop none. The owner also writes the sequence ranges of the
// copies it took from the queue, which the next owner drops if KubeMQ hands them out again
// (NoteTaken).

// Key is an owner id or a lease key (16 random bytes, as the delivery engine mints them).
type Key = [16]byte

// AckLogOptions configure OpenAckLog.
type AckLogOptions struct {
	Client  *kubemqclient.Client
	Channel string // events store
	// Window is how long settlements are kept (default 60 s): at least twice the record delay
	// plus the ownership lease, the longest a dead owner's record takes to reach the next owner.
	Window time.Duration
	// FlushEvery is how often settlements are written (default 250 ms).
	FlushEvery time.Duration
	Logger     *zap.Logger
}

// ackEvent is one event of the log.
type ackEvent struct {
	Owner  string   `json:"o,omitempty"` // base64 of the owner id
	Queue  string   `json:"q,omitempty"` // informative
	Keys   []string `json:"k,omitempty"` // base64 lease keys settled
	Closed bool     `json:"c,omitempty"` // the owner closed with nothing leased
	// Taken is sequence ranges (first, last) of Queue's copies the owner took from KubeMQ and
	// acknowledged: the next owner's first Gets may receive some of them again (NoteTaken).
	Taken [][2]uint64 `json:"t,omitempty"`
	Sync  string      `json:"s,omitempty"`
}

// AckLog writes and follows the acknowledgement log. Safe for concurrent use.
type AckLog struct {
	opts AckLogOptions
	log  *zap.Logger

	// mu guards everything below.
	mu      sync.Mutex
	pending map[Key]*pendingAcks   // by owner: not yet written
	owners  map[Key]*ownerAcks     // read from the log, within the window
	taken   map[string][]takenRead // by queue: ranges read from the log, within the window
	syncs   map[string]chan struct{}
	lastSeq uint64
	ready   chan struct{} // closed once the window before start has been read
	started string        // the marker that ends the first read

	// flushMu makes writes of settlements one at a time, so that a Sync or Retire that
	// follows a write in progress (the flush loop's) is written after it.
	flushMu sync.Mutex

	wake   chan struct{} // cap 1: a batch is full
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

type pendingAcks struct {
	queue string
	keys  []Key
	taken [][2]uint64
}

// takenRead is one range of taken sequences read from the log.
type takenRead struct {
	lo, hi uint64
	at     time.Time // local time it was read
}

// maxTaken bounds the ranges kept per queue, and written in one event; takenWindow is how long
// ranges read are kept (the next owner looks 30 s back: delivery.takenKeep).
const (
	maxTaken    = 1024
	takenWindow = 30 * time.Second
)

// ownerAcks is what one owner settled within the window: the keys as read, in batches (16
// bytes a key), and an index of them built at the first lookup. Lookups are rare (records of
// another owner come back only after a handover), so most owners never get an index.
type ownerAcks struct {
	batches []ackBatch
	index   map[Key]struct{} // nil until a lookup needs it
	closed  bool
	last    time.Time // local time of the latest event of this owner read
}

type ackBatch struct {
	at   time.Time
	keys []Key
}

func (o *ownerAcks) has(k Key) bool {
	if o.index == nil {
		n := 0
		for _, b := range o.batches {
			n += len(b.keys)
		}
		o.index = make(map[Key]struct{}, n)
		for _, b := range o.batches {
			for _, k := range b.keys {
				o.index[k] = struct{}{}
			}
		}
	}
	_, ok := o.index[k]
	return ok
}

// maxBatch bounds the keys of one written event (about 24 bytes each).
const maxBatch = 4096

// OpenAckLog starts following the log from Window before now and writing settlements.
func OpenAckLog(opts AckLogOptions) (*AckLog, error) {
	if opts.Client == nil {
		return nil, errors.New("cluster: ack log: no client")
	}
	if err := kubemqclient.ValidChannel(opts.Channel); err != nil {
		return nil, fmt.Errorf("cluster: ack log channel: %w", err)
	}
	if opts.Window <= 0 {
		opts.Window = time.Minute
	}
	if opts.FlushEvery <= 0 {
		opts.FlushEvery = 250 * time.Millisecond
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	a := &AckLog{
		opts:    opts,
		log:     opts.Logger.Named("acklog"),
		pending: map[Key]*pendingAcks{},
		owners:  map[Key]*ownerAcks{},
		taken:   map[string][]takenRead{},
		syncs:   map[string]chan struct{}{},
		ready:   make(chan struct{}),
		started: randomID(),
		wake:    make(chan struct{}, 1),
	}
	a.ctx, a.cancel = context.WithCancel(context.Background())
	a.wg.Add(2)
	go a.follow()
	go a.flushLoop()
	return a, nil
}

// Settle records that owner's leases keys are settled. It returns at once; the keys are
// written within FlushEvery.
func (a *AckLog) Settle(queue string, owner Key, keys ...Key) {
	if len(keys) == 0 {
		return
	}
	a.mu.Lock()
	p := a.pending[owner]
	if p == nil {
		p = &pendingAcks{queue: queue}
		a.pending[owner] = p
	}
	p.keys = append(p.keys, keys...)
	full := len(p.keys) >= maxBatch
	a.mu.Unlock()
	if full {
		select {
		case a.wake <- struct{}{}:
		default:
		}
	}
}

// NoteTaken records that owner took queue's copies lo..hi (sequences) from KubeMQ and
// acknowledged them. It returns at once; the range is written within FlushEvery. On the real
// KubeMQ an acknowledgement can lose a race with its transaction's close, and the queue's next
// Get, which after a handover is the next owner's, receives the message again under its
// sequence (docs/kubemq.md 10.4): the next owner drops those (TakenOf).
func (a *AckLog) NoteTaken(queue string, owner Key, lo, hi uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	p := a.pending[owner]
	if p == nil {
		p = &pendingAcks{queue: queue}
		a.pending[owner] = p
	}
	if n := len(p.taken); n > 0 && lo >= p.taken[n-1][0] && lo <= p.taken[n-1][1]+1 {
		p.taken[n-1][1] = max(p.taken[n-1][1], hi)
		return
	}
	p.taken = append(p.taken, [2]uint64{lo, hi})
}

// TakenOf reports the ranges of queue's sequences that owners noted taken (NoteTaken), read
// from the log at or after since.
func (a *AckLog) TakenOf(queue string, since time.Time) [][2]uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out [][2]uint64
	for _, r := range a.taken[queue] {
		if !r.at.Before(since) {
			out = append(out, [2]uint64{r.lo, r.hi})
		}
	}
	return out
}

// Retire writes what is pending for owner, then the marker that owner closed with every lease
// settled: every record of it that returns is obsolete.
func (a *AckLog) Retire(ctx context.Context, queue string, owner Key) error {
	a.flushMu.Lock()
	defer a.flushMu.Unlock()
	if err := a.flushOwnerLocked(ctx, owner); err != nil {
		return err
	}
	return a.publish(ctx, ackEvent{Owner: b64(owner), Queue: queue, Closed: true})
}

// Settled reports whether owner's lease key is known settled (or owner retired).
func (a *AckLog) Settled(owner, key Key) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	o := a.owners[owner]
	if o == nil {
		return false
	}
	return o.closed || o.has(key)
}

// Sync returns once every settlement written (by any replica) before it is readable, and this
// replica's own pending settlements are written.
func (a *AckLog) Sync(ctx context.Context) error {
	select {
	case <-a.ready:
	case <-ctx.Done():
		return ctx.Err()
	}
	if err := a.flushAll(ctx); err != nil {
		return err
	}
	id := randomID()
	ch := make(chan struct{})
	a.mu.Lock()
	a.syncs[id] = ch
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		delete(a.syncs, id)
		a.mu.Unlock()
	}()
	if err := a.publish(ctx, ackEvent{Sync: id}); err != nil {
		return err
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-a.ctx.Done():
		return ErrClosed
	}
}

// Close writes what is pending (within ctx) and stops following.
func (a *AckLog) Close(ctx context.Context) error {
	err := a.flushAll(ctx)
	a.cancel()
	a.wg.Wait()
	return err
}

func (a *AckLog) publish(ctx context.Context, ev ackEvent) error {
	body, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	if _, err := a.opts.Client.PublishEvent(ctx, kubemqclient.Event{Channel: a.opts.Channel, Body: body, Metadata: "kubemq-proxy acks"}); err != nil {
		return fmt.Errorf("cluster: ack log write: %w", err)
	}
	return nil
}

func (a *AckLog) take(owner Key) *pendingAcks {
	a.mu.Lock()
	defer a.mu.Unlock()
	p := a.pending[owner]
	delete(a.pending, owner)
	return p
}

// flushOwnerLocked writes owner's pending settlements (flushMu held).
func (a *AckLog) flushOwnerLocked(ctx context.Context, owner Key) error {
	p := a.take(owner)
	if p == nil {
		return nil
	}
	for len(p.keys) > 0 || len(p.taken) > 0 {
		n := min(len(p.keys), maxBatch)
		ev := ackEvent{Owner: b64(owner), Queue: p.queue}
		if n > 0 {
			ev.Keys = make([]string, n)
		}
		for i, k := range p.keys[:n] {
			ev.Keys[i] = b64(k)
		}
		m := min(len(p.taken), maxTaken)
		ev.Taken = p.taken[:m]
		if err := a.publish(ctx, ev); err != nil {
			return err
		}
		p.keys, p.taken = p.keys[n:], p.taken[m:]
	}
	return nil
}

func (a *AckLog) flushAll(ctx context.Context) error {
	a.flushMu.Lock()
	defer a.flushMu.Unlock()
	a.mu.Lock()
	owners := make([]Key, 0, len(a.pending))
	for o := range a.pending {
		owners = append(owners, o)
	}
	a.mu.Unlock()
	var errs []error
	for _, o := range owners {
		if err := a.flushOwnerLocked(ctx, o); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (a *AckLog) flushLoop() {
	defer a.wg.Done()
	t := time.NewTicker(a.opts.FlushEvery)
	defer t.Stop()
	for {
		select {
		case <-a.ctx.Done():
			return
		case <-t.C:
		case <-a.wake:
		}
		ctx, cancel := context.WithTimeout(a.ctx, 10*time.Second)
		if err := a.flushAll(ctx); err != nil && a.ctx.Err() == nil {
			// Lost settlements cost duplicates after a crash, nothing more.
			a.log.Warn("settlements not written", zap.Error(err))
		}
		cancel()
		a.prune()
	}
}

// prune forgets settlements read longer than the window ago, and owners not heard from since.
func (a *AckLog) prune() {
	a.mu.Lock()
	defer a.mu.Unlock()
	cut := time.Now().Add(-a.opts.Window)
	for k, o := range a.owners {
		if o.last.Before(cut) {
			delete(a.owners, k)
			continue
		}
		i := 0
		for i < len(o.batches) && o.batches[i].at.Before(cut) {
			if o.index != nil {
				for _, k := range o.batches[i].keys {
					delete(o.index, k)
				}
			}
			i++
		}
		if i > 0 {
			o.batches = append(o.batches[:0:0], o.batches[i:]...)
		}
	}
	cut = time.Now().Add(-min(a.opts.Window, takenWindow))
	for q, rs := range a.taken {
		i := 0
		for i < len(rs) && rs[i].at.Before(cut) {
			i++
		}
		switch {
		case i == len(rs):
			delete(a.taken, q)
		case i > 0:
			a.taken[q] = append(rs[:0:0], rs[i:]...)
		}
	}
}

func (a *AckLog) follow() {
	defer a.wg.Done()
	backoff := 100 * time.Millisecond
	for a.ctx.Err() == nil {
		err := a.followOnce()
		if a.ctx.Err() != nil {
			return
		}
		a.log.Warn("ack log stream ended; reading again", zap.Error(err))
		select {
		case <-time.After(backoff):
		case <-a.ctx.Done():
			return
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

func (a *AckLog) followOnce() error {
	if err := a.opts.Client.WaitReady(a.ctx); err != nil {
		return err
	}
	a.mu.Lock()
	last := a.lastSeq
	a.mu.Unlock()
	start := kubemqclient.StartPosition{Mode: kubemqclient.StartAtTimeDelta, Delta: a.opts.Window}
	if last > 0 {
		start = kubemqclient.StartPosition{Mode: kubemqclient.StartAtSequence, Sequence: last + 1}
	}
	sub, err := a.opts.Client.SubscribeEventsStore(a.ctx, kubemqclient.SubscribeOptions{Channel: a.opts.Channel, Start: start})
	if err != nil {
		return err
	}
	defer sub.Close()
	select {
	case <-a.ready:
	default:
		if err := a.publish(a.ctx, ackEvent{Sync: a.started}); err != nil {
			return err
		}
	}
	for {
		ev, err := sub.Recv(a.ctx)
		if err != nil {
			return err
		}
		var body ackEvent
		if err := json.Unmarshal(ev.Body, &body); err != nil {
			a.log.Warn("skipping undecodable ack log event", zap.Uint64("sequence", ev.Sequence), zap.Error(err))
			continue
		}
		a.apply(ev.Sequence, &body)
	}
}

func (a *AckLog) apply(seq uint64, ev *ackEvent) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if seq <= a.lastSeq {
		return
	}
	// A gap (events the server dropped for this reader) only costs duplicates: go on.
	a.lastSeq = seq
	if ev.Sync != "" {
		if ev.Sync == a.started {
			select {
			case <-a.ready:
			default:
				close(a.ready)
			}
		}
		if ch := a.syncs[ev.Sync]; ch != nil {
			close(ch)
			delete(a.syncs, ev.Sync)
		}
		return
	}
	owner, ok := unb64(ev.Owner)
	if !ok {
		return
	}
	o := a.owners[owner]
	if o == nil {
		o = &ownerAcks{}
		a.owners[owner] = o
	}
	now := time.Now()
	o.last = now
	if len(ev.Taken) > 0 && ev.Queue != "" {
		rs := a.taken[ev.Queue]
		for _, r := range ev.Taken {
			if r[0] != 0 && r[0] <= r[1] {
				rs = append(rs, takenRead{lo: r[0], hi: r[1], at: now})
			}
		}
		if over := len(rs) - maxTaken; over > 0 {
			rs = append(rs[:0:0], rs[over:]...)
		}
		a.taken[ev.Queue] = rs
	}
	if ev.Closed {
		o.closed = true
		o.batches, o.index = nil, nil // everything of it is settled
		return
	}
	if o.closed {
		return
	}
	b := ackBatch{at: now, keys: make([]Key, 0, len(ev.Keys))}
	for _, s := range ev.Keys {
		if k, ok := unb64(s); ok {
			b.keys = append(b.keys, k)
			if o.index != nil {
				o.index[k] = struct{}{}
			}
		}
	}
	o.batches = append(o.batches, b)
}

func b64(k Key) string { return base64.RawStdEncoding.EncodeToString(k[:]) }

func unb64(s string) (Key, bool) {
	var k Key
	if base64.RawStdEncoding.DecodedLen(len(s)) != len(k) {
		return k, false
	}
	n, err := base64.RawStdEncoding.Decode(k[:], []byte(s))
	return k, err == nil && n == len(k)
}
