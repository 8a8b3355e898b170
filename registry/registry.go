// Package registry keeps the proxy's durable topology (topics,
// subscriptions, exchanges, queues, bindings...) as versioned records in an
// events-store channel of KubeMQ. Every replica replays the log at start and
// follows it live; for each (kind, key) the record with the highest
// (version, writer) wins, so replicas converge whatever order they see
// writes in. Because KubeMQ forgets events after its retention age (24 h by
// default), each replica periodically rewrites a compact snapshot of the
// live records, carrying their original versions so a snapshot never
// overrides a newer write. A conditional write (PutIf) names the version it
// replaces and is judged by every replica against the log read up to its
// own place in it, so all replicas take the same decision: of two writes
// on one base, the one the log holds first wins.
package registry

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/kubemq-io/kubemq-proxy/kubemqclient"
)

// Record is one topology entry. Value is opaque to the registry (the
// owning front-end encodes it).
type Record struct {
	Kind    string          `json:"k"`
	Key     string          `json:"n"`
	Value   json.RawMessage `json:"v,omitempty"`
	Deleted bool            `json:"d,omitempty"`
	Version uint64          `json:"ver"`
	Writer  string          `json:"w"`
	Time    int64           `json:"t"` // unix ns of the write, for tombstone expiry
	// If makes the write conditional (PutIf): it is applied only if, at
	// its place in the log, the record it replaces is this one.
	If *Base `json:"if,omitempty"`
}

// Base names the version of a record a conditional write expects to
// replace; the zero Base expects no record at all.
type Base struct {
	Version uint64 `json:"ver"`
	Writer  string `json:"w"`
}

// ErrConflict: a conditional write found another record than its base.
var ErrConflict = errors.New("registry: the record was changed by another write")

// newer reports whether r wins over o.
func (r *Record) newer(o *Record) bool {
	if r.Version != o.Version {
		return r.Version > o.Version
	}
	return r.Writer > o.Writer
}

// event is the body of one events-store message: a batch of records, a
// sync marker, or a snapshot chunk.
type event struct {
	Records  []Record `json:"r,omitempty"`
	Sync     string   `json:"sync,omitempty"`
	Snapshot string   `json:"snap,omitempty"` // id of the snapshot this chunk belongs to
}

// Change is delivered to OnChange callbacks after a record was applied.
type Change struct {
	Record Record
	Local  bool // written by this replica
}

// Options configures Open.
type Options struct {
	Client           *kubemqclient.Client
	Channel          string
	SnapshotInterval time.Duration // default 1h
	// TombstoneTTL is how long deletions are kept in snapshots; default 48h
	// (twice KubeMQ's default retention).
	TombstoneTTL time.Duration
	Logger       *zap.Logger
	// ReplicaID names this writer; default random.
	ReplicaID string
	// FollowDelay holds back each event read from the log by this long:
	// zero in production; tests stand for a replica that reads the log
	// late with it.
	FollowDelay time.Duration
}

// Registry is the in-memory view of the topology log.
type Registry struct {
	opts Options
	log  *zap.Logger

	// applyMu is held from merging a record through its watchers, so a
	// write whose record the follow stream delivered first does not return
	// before the watchers have seen it. Watchers must not write.
	applyMu sync.Mutex

	mu        sync.RWMutex // guards records, clock, lastSeq, lastSnap, watchers, replayed
	records   map[string]map[string]*Record
	clock     uint64
	lastSeq   uint64
	lastSnap  time.Time
	watchers  map[int]func(Change)
	nextWatch int
	replayed  bool
	syncNonce string
	// logView is the version of every record as of the log read so far,
	// in log order (local writes not yet read back left out): every
	// replica judges a conditional write against it at the same place of
	// the log, and so alike. pending: this replica's conditional writes
	// waiting for their verdict, by version.
	logView map[string]map[string]Base
	pending map[uint64]chan bool

	replayedCh chan struct{}
	// applied is the sequence of the last log event whose records were
	// applied; appliedCh is closed (and replaced) at each step (CatchUp).
	appliedMu sync.Mutex
	applied   uint64
	appliedCh chan struct{}
	// readMax is, per writer, the highest version of its records read
	// from the log (guarded by appliedMu; WaitRead). written is the
	// version of this replica's latest write.
	readMax map[string]uint64
	written atomic.Uint64
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

// Open starts following the log. It returns at once; Replayed (and
// WaitReplayed) report when the log has been read up to a marker written
// at open, i.e. when this replica has seen every earlier write.
func Open(ctx context.Context, opts Options) (*Registry, error) {
	if opts.Client == nil {
		return nil, errors.New("registry: no client")
	}
	if err := kubemqclient.ValidChannel(opts.Channel); err != nil {
		return nil, fmt.Errorf("registry channel: %w", err)
	}
	if opts.SnapshotInterval <= 0 {
		opts.SnapshotInterval = time.Hour
	}
	if opts.TombstoneTTL <= 0 {
		opts.TombstoneTTL = 48 * time.Hour
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	if opts.ReplicaID == "" {
		opts.ReplicaID = randomID()
	}
	r := &Registry{
		opts:       opts,
		log:        opts.Logger,
		records:    map[string]map[string]*Record{},
		watchers:   map[int]func(Change){},
		logView:    map[string]map[string]Base{},
		pending:    map[uint64]chan bool{},
		replayedCh: make(chan struct{}),
		appliedCh:  make(chan struct{}),
		readMax:    map[string]uint64{},
		syncNonce:  randomID(),
	}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	r.wg.Add(2)
	go r.follow()
	go r.snapshotLoop()
	return r, nil
}

// Close stops following. Records stay readable.
func (r *Registry) Close() {
	r.cancel()
	r.wg.Wait()
}

// Replayed reports whether every write made before Open has been applied.
func (r *Registry) Replayed() bool {
	select {
	case <-r.replayedCh:
		return true
	default:
		return false
	}
}

// WaitReplayed blocks until Replayed or ctx ends.
func (r *Registry) WaitReplayed(ctx context.Context) error {
	select {
	case <-r.replayedCh:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Get returns the live value of (kind, key).
func (r *Registry) Get(kind, key string) (json.RawMessage, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	rec, ok := r.records[kind][key]
	if !ok || rec.Deleted {
		return nil, false
	}
	return rec.Value, true
}

// List returns the live records of one kind, sorted by key.
func (r *Registry) List(kind string) []Record {
	r.mu.RLock()
	out := make([]Record, 0, len(r.records[kind]))
	for _, rec := range r.records[kind] {
		if !rec.Deleted {
			out = append(out, *rec)
		}
	}
	r.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out
}

// OnChange registers fn for every applied change (local or remote); fn runs
// on the registry's goroutine (or the writer's, for a local write) and must
// not block or write to the registry. The returned func
// unregisters it.
func (r *Registry) OnChange(fn func(Change)) (cancel func()) {
	r.mu.Lock()
	id := r.nextWatch
	r.nextWatch++
	r.watchers[id] = fn
	r.mu.Unlock()
	return func() {
		r.mu.Lock()
		delete(r.watchers, id)
		r.mu.Unlock()
	}
}

// Put writes (kind, key) = value and applies it locally once the backend
// accepted it.
func (r *Registry) Put(ctx context.Context, kind, key string, value any) error {
	raw, err := json.Marshal(value)
	if err != nil {
		return fmt.Errorf("registry: encode %s %q: %w", kind, key, err)
	}
	return r.write(ctx, Record{Kind: kind, Key: key, Value: raw})
}

// BaseOf names the current version of (kind, key) in this replica's
// view, for PutIf; the zero Base when there is none.
func (r *Registry) BaseOf(kind, key string) Base {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if rec, ok := r.records[kind][key]; ok {
		return Base{Version: rec.Version, Writer: rec.Writer}
	}
	return Base{}
}

// PutIf writes (kind, key) = value only if the record it replaces is
// base: the write goes to the log, and every replica, this one included,
// applies it only if at its place in the log the record is still base
// (compare-and-set). It returns once this replica has read it back:
// ErrConflict when another write came first.
func (r *Registry) PutIf(ctx context.Context, kind, key string, value any, base Base) error {
	raw, err := json.Marshal(value)
	if err != nil {
		return fmt.Errorf("registry: encode %s %q: %w", kind, key, err)
	}
	verdict := make(chan bool, 1)
	r.mu.Lock()
	r.clock++
	rec := Record{Kind: kind, Key: key, Value: raw, Version: r.clock, Writer: r.opts.ReplicaID, Time: time.Now().UnixNano(), If: &base}
	r.pending[rec.Version] = verdict
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		delete(r.pending, rec.Version)
		r.mu.Unlock()
	}()
	if err := r.publish(ctx, event{Records: []Record{rec}}); err != nil {
		return err
	}
	r.wrote(rec.Version)
	select {
	case ok := <-verdict:
		if !ok {
			return ErrConflict
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("registry: conditional write of %s %q not read back: %w", kind, key, ctx.Err())
	case <-r.ctx.Done():
		return errors.New("registry: closed")
	}
}

// readBack merges a record read from the log into logView; a conditional
// one only if its base is the current version there. It reports whether
// the record is to be applied and, for this replica's conditional write,
// where its writer waits for the verdict.
func (r *Registry) readBack(rec Record) (ok bool, verdict chan bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	byKey := r.logView[rec.Kind]
	if byKey == nil {
		byKey = map[string]Base{}
		r.logView[rec.Kind] = byKey
	}
	cur, exists := byKey[rec.Key]
	ok = true
	if rec.If != nil {
		ok = exists && cur == *rec.If || !exists && *rec.If == (Base{})
		if rec.Writer == r.opts.ReplicaID {
			verdict = r.pending[rec.Version]
		}
	}
	next := Base{Version: rec.Version, Writer: rec.Writer}
	if ok && (!exists || (&Record{Version: next.Version, Writer: next.Writer}).newer(&Record{Version: cur.Version, Writer: cur.Writer})) {
		byKey[rec.Key] = next
	}
	return ok, verdict
}

// Delete writes a tombstone for (kind, key).
func (r *Registry) Delete(ctx context.Context, kind, key string) error {
	return r.write(ctx, Record{Kind: kind, Key: key, Deleted: true})
}

func (r *Registry) write(ctx context.Context, rec Record) error {
	r.mu.Lock()
	r.clock++
	rec.Version = r.clock
	r.mu.Unlock()
	rec.Writer = r.opts.ReplicaID
	rec.Time = time.Now().UnixNano()
	if err := r.publish(ctx, event{Records: []Record{rec}}); err != nil {
		return err
	}
	r.wrote(rec.Version)
	r.apply(rec, true)
	return nil
}

// wrote notes that the log holds this replica's write of version v.
func (r *Registry) wrote(v uint64) {
	for {
		cur := r.written.Load()
		if v <= cur || r.written.CompareAndSwap(cur, v) {
			return
		}
	}
}

// Written returns this replica's writer id and the version of its latest
// write the log holds (0 before any): what WaitRead on another replica
// waits for.
func (r *Registry) Written() (writer string, version uint64) {
	return r.opts.ReplicaID, r.written.Load()
}

// WaitRead waits until this replica has read from the log a record writer
// wrote with version or a later one. A writer's versions only grow, so a
// later one means its earlier writes were published before it; one
// published concurrently may still follow it in the log, a window as
// narrow as two writes of one replica racing each other.
func (r *Registry) WaitRead(ctx context.Context, writer string, version uint64) error {
	if writer == r.opts.ReplicaID {
		return nil // its own writes are applied as they are made
	}
	return r.awaitApplied(ctx, func() bool { return r.readMax[writer] >= version })
}

// awaitApplied waits until done (called under appliedMu) holds after an
// applied step of the follow stream, or ctx ends, or the registry closes.
func (r *Registry) awaitApplied(ctx context.Context, done func() bool) error {
	for {
		r.appliedMu.Lock()
		ok, ch := done(), r.appliedCh
		r.appliedMu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		case <-r.ctx.Done():
			return errors.New("registry: closed")
		}
	}
}

func (r *Registry) publish(ctx context.Context, ev event) error {
	body, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	_, err = r.opts.Client.PublishEvent(ctx, kubemqclient.Event{Channel: r.opts.Channel, Body: body, Metadata: "kubemq-proxy registry"})
	if err != nil {
		return fmt.Errorf("registry: write: %w", err)
	}
	return nil
}

// apply merges one record; it reports whether it changed the view.
func (r *Registry) apply(rec Record, local bool) bool {
	r.applyMu.Lock()
	defer r.applyMu.Unlock()
	r.mu.Lock()
	if rec.Version > r.clock {
		r.clock = rec.Version
	}
	byKey := r.records[rec.Kind]
	if byKey == nil {
		byKey = map[string]*Record{}
		r.records[rec.Kind] = byKey
	}
	if cur, ok := byKey[rec.Key]; ok && !rec.newer(cur) {
		r.mu.Unlock()
		return false
	}
	cp := rec
	byKey[rec.Key] = &cp
	watchers := make([]func(Change), 0, len(r.watchers))
	for _, w := range r.watchers {
		watchers = append(watchers, w)
	}
	r.mu.Unlock()
	for _, w := range watchers {
		w(Change{Record: rec, Local: local})
	}
	return true
}

// follow subscribes to the log from the first retained event and applies
// everything, resubscribing after the last applied sequence when the
// stream breaks (with a fresh client id each time, so the server's durable
// cursor never skips events we did not process).
func (r *Registry) follow() {
	defer r.wg.Done()
	backoff := 100 * time.Millisecond
	for r.ctx.Err() == nil {
		err := r.followOnce()
		if r.ctx.Err() != nil {
			return
		}
		r.log.Warn("registry stream ended; resubscribing", zap.Error(err), zap.Duration("backoff", backoff))
		select {
		case <-time.After(backoff):
		case <-r.ctx.Done():
			return
		}
		if backoff < 5*time.Second {
			backoff *= 2
		}
	}
}

func (r *Registry) followOnce() error {
	if err := r.opts.Client.WaitReady(r.ctx); err != nil {
		return err
	}
	r.mu.RLock()
	last := r.lastSeq
	r.mu.RUnlock()
	start := kubemqclient.StartPosition{Mode: kubemqclient.StartFromFirst}
	if last > 0 {
		start = kubemqclient.StartPosition{Mode: kubemqclient.StartAtSequence, Sequence: last + 1}
	}
	sub, err := r.opts.Client.SubscribeEventsStore(r.ctx, kubemqclient.SubscribeOptions{Channel: r.opts.Channel, Start: start})
	if err != nil {
		return err
	}
	defer sub.Close()
	if !r.Replayed() {
		// The marker goes in after the subscription exists, so reading up
		// to it means every earlier write has been read.
		if err := r.publish(r.ctx, event{Sync: r.syncNonce}); err != nil {
			return err
		}
	}
	for {
		ev, err := sub.Recv(r.ctx)
		if err != nil {
			return err
		}
		r.mu.Lock()
		if ev.Sequence <= r.lastSeq {
			r.mu.Unlock()
			continue // already applied before a resubscribe
		}
		r.lastSeq = ev.Sequence
		r.mu.Unlock()
		if r.opts.FollowDelay > 0 {
			time.Sleep(r.opts.FollowDelay)
		}
		var body event
		if err := json.Unmarshal(ev.Body, &body); err != nil {
			r.log.Warn("registry: skipping undecodable event", zap.Uint64("sequence", ev.Sequence), zap.Error(err))
			r.appliedUpTo(ev.Sequence, nil)
			continue
		}
		for _, rec := range body.Records {
			ok, verdict := r.readBack(rec)
			if ok { // else a conditional write that lost
				local := rec.If != nil && rec.Writer == r.opts.ReplicaID
				rec.If = nil
				r.apply(rec, local)
			}
			if verdict != nil {
				verdict <- ok // after the watchers saw it
			}
		}
		if body.Snapshot != "" {
			r.mu.Lock()
			r.lastSnap = ev.Timestamp
			r.mu.Unlock()
		}
		r.appliedUpTo(ev.Sequence, body.Records)
		if body.Sync == r.syncNonce && !r.Replayed() {
			r.mu.RLock()
			n := 0
			for _, m := range r.records {
				n += len(m)
			}
			r.mu.RUnlock()
			r.log.Info("registry replayed", zap.Uint64("sequence", ev.Sequence), zap.Int("records", n))
			close(r.replayedCh)
		}
	}
}

// catchUpGrace is how long CatchUp reads on after the last event.
const catchUpGrace = 25 * time.Millisecond

// appliedUpTo records that the log's events up to seq have been applied,
// the last one's records among them.
func (r *Registry) appliedUpTo(seq uint64, recs []Record) {
	r.appliedMu.Lock()
	r.applied = seq
	for _, rec := range recs {
		if rec.Version > r.readMax[rec.Writer] {
			r.readMax[rec.Writer] = rec.Version
		}
	}
	close(r.appliedCh)
	r.appliedCh = make(chan struct{})
	r.appliedMu.Unlock()
}

// CatchUp waits until this replica has applied every write the log held
// when CatchUp was called, whoever made it: it reads the sequence of the
// log's last event (a subscription from the last event, closed after
// catchUpGrace) and waits for the follow stream to apply up to it. It
// writes nothing. A caller that did not find a record another replica may
// have just written looks again after it.
func (r *Registry) CatchUp(ctx context.Context) error {
	sub, err := r.opts.Client.SubscribeEventsStore(ctx, kubemqclient.SubscribeOptions{
		Channel: r.opts.Channel, Start: kubemqclient.StartPosition{Mode: kubemqclient.StartFromLast}, Buffer: 16})
	if err != nil {
		return err
	}
	ev, err := sub.Recv(ctx)
	if err != nil {
		sub.Close()
		return err
	}
	// The real KubeMQ was seen to start such a subscription at the event
	// before one stored a millisecond earlier (docs/kubemq.md 10.5): the
	// events that follow within the grace raise the target.
	target := ev.Sequence
	gctx, cancel := context.WithTimeout(ctx, catchUpGrace)
	for {
		ev, err := sub.Recv(gctx)
		if err != nil {
			break
		}
		target = max(target, ev.Sequence)
	}
	cancel()
	sub.Close()
	return r.awaitApplied(ctx, func() bool { return r.applied >= target })
}

// snapshotLoop rewrites the live records every SnapshotInterval, unless
// another replica wrote a snapshot within the last half interval.
func (r *Registry) snapshotLoop() {
	defer r.wg.Done()
	t := time.NewTicker(r.opts.SnapshotInterval / 4)
	defer t.Stop()
	for {
		select {
		case <-r.ctx.Done():
			return
		case <-t.C:
		}
		if !r.Replayed() {
			continue
		}
		r.mu.RLock()
		due := time.Since(r.lastSnap) >= r.opts.SnapshotInterval
		r.mu.RUnlock()
		if !due {
			continue
		}
		if err := r.Snapshot(r.ctx); err != nil {
			r.log.Warn("registry snapshot failed", zap.Error(err))
		}
	}
}

// snapshotChunk and snapshotChunkBytes bound one snapshot event: at most
// 500 records and, unless a single record is larger, about 4 MiB of them
// (KubeMQ refuses a message over 100 MiB, and records such as schema
// definitions can be hundreds of KiB each).
const (
	snapshotChunk      = 500
	snapshotChunkBytes = 4 << 20
)

// Snapshot rewrites every live record (and recent tombstones) with its
// original version, so the log always holds the whole topology within
// KubeMQ's retention window.
func (r *Registry) Snapshot(ctx context.Context) error {
	cutoff := time.Now().Add(-r.opts.TombstoneTTL).UnixNano()
	r.mu.Lock()
	var recs []Record
	for kind, m := range r.records {
		for key, rec := range m {
			if rec.Deleted && rec.Time < cutoff {
				delete(m, key) // old enough that no retained event can resurrect it
				continue
			}
			recs = append(recs, *rec)
		}
		if len(m) == 0 {
			delete(r.records, kind)
		}
	}
	r.lastSnap = time.Now()
	r.mu.Unlock()
	id := randomID()
	for len(recs) > 0 {
		n, size := 0, 0
		for n < len(recs) && n < snapshotChunk {
			size += len(recs[n].Kind) + len(recs[n].Key) + len(recs[n].Value) + len(recs[n].Writer) + 64
			if n > 0 && size > snapshotChunkBytes {
				break
			}
			n++
		}
		if err := r.publish(ctx, event{Records: recs[:n], Snapshot: id}); err != nil {
			return err
		}
		recs = recs[n:]
	}
	return nil
}

func randomID() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
