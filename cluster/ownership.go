package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/kubemq-io/kubemq-proxy/kubemqclient"
)

// Errors of Claim.
var (
	// ErrNotReady: the ownership log has not been read up to now yet (Ready), or the log is
	// unreachable.
	ErrNotReady = errors.New("cluster: ownership log not read up to now")
	// ErrClosed: the Cluster is closed.
	ErrClosed = errors.New("cluster: closed")
	// ErrUnsettled: a claim of the queue that this replica read but could not judge (it came
	// before the replica's view of the log was complete) may still hold it. Retry after a
	// heartbeat.
	ErrUnsettled = errors.New("cluster: ownership of the queue not known yet")
)

// OwnedError is Claim's error when another replica holds the queue.
type OwnedError struct {
	Queue string
	Owner Member
}

func (e *OwnedError) Error() string {
	return fmt.Sprintf("cluster: queue %s is owned by replica %s (%s)", e.Queue, e.Owner.ID, e.Owner.Addr)
}

// Member is a replica as the ownership log knows it.
type Member struct {
	ID   string
	Addr string // peer address it advertises; empty when it takes no forwarded work
}

// Options configure Open.
type Options struct {
	Client  *kubemqclient.Client
	Channel string // the ownership log (events store)
	// ReplicaID names this replica in the log; default random. Two live replicas must never
	// share one.
	ReplicaID string
	// Advertise is the peer address other replicas dial to forward work to this one.
	Advertise string
	// Lease is how long a holding lasts without a heartbeat (default 8 s): the takeover time
	// after a replica dies.
	Lease time.Duration
	// Heartbeat is the heartbeat interval (default 1 s).
	Heartbeat time.Duration
	// StopSlack is how long before its lease ends a holder is told to stop (default 3 s):
	// the time its consumer needs to give everything back.
	StopSlack time.Duration
	Logger    *zap.Logger
}

func (o *Options) setDefaults() error {
	if o.Client == nil {
		return errors.New("cluster: no client")
	}
	if err := kubemqclient.ValidChannel(o.Channel); err != nil {
		return fmt.Errorf("cluster: ownership channel: %w", err)
	}
	if o.ReplicaID == "" {
		o.ReplicaID = randomID()
	}
	if o.Lease == 0 {
		o.Lease = 8 * time.Second
	}
	if o.Heartbeat == 0 {
		o.Heartbeat = time.Second
	}
	if o.StopSlack == 0 {
		o.StopSlack = 3 * time.Second
	}
	if o.Heartbeat <= 0 || o.StopSlack <= 0 || o.Lease < 2*o.Heartbeat+o.StopSlack {
		return fmt.Errorf("cluster: lease %v must be at least two heartbeats (%v) plus the stop slack (%v)", o.Lease, o.Heartbeat, o.StopSlack)
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	return nil
}

// Window is how far back a starting replica reads the ownership log: every live holding has a
// heartbeat in it, and claims are judged only with a whole lease of log before them.
func (o *Options) window() time.Duration { return o.Lease + 2*o.Heartbeat + 5*time.Second }

// logEvent is the body of one ownership-log event.
type logEvent struct {
	Kind    string `json:"k"` // "claim", "hb", "release", "sync"
	Replica string `json:"r,omitempty"`
	Addr    string `json:"a,omitempty"`
	Queue   string `json:"q,omitempty"` // claim, release
	Claim   uint64 `json:"c,omitempty"` // release: the holding's claim sequence
	Holds   []hold `json:"h,omitempty"` // hb
	N       uint64 `json:"n,omitempty"` // claim, hb: the sender's counter (matches its send time)
	Nonce   string `json:"s,omitempty"` // sync
	Lease   int64  `json:"l,omitempty"` // claim, hb: the sender's lease in ms (informative)
	Stop    bool   `json:"x,omitempty"` // hb: the replica is leaving (no further heartbeats)
	// Inc names the sender's process (random per Open): a replica id heard under a new one
	// restarted.
	Inc string `json:"i,omitempty"`
	// Uses (hb, the first event of a heartbeat, with UsesSet) are the queues the sender's
	// clients consume (ReportUses); UsesAll says there were more than one event names.
	Uses    []string `json:"u,omitempty"`
	UsesSet bool     `json:"us,omitempty"`
	UsesAll bool     `json:"ua,omitempty"`
	Version int      `json:"v,omitempty"` // format version (1)
}

type hold struct {
	Queue string `json:"q"`
	Claim uint64 `json:"c"`
}

// holding is one queue's holder in the view.
type holding struct {
	replica string
	claim   uint64    // sequence of the accepted claim
	last    time.Time // server time of the latest claim or heartbeat that renewed it
}

// member is a replica's latest heartbeat.
type member struct {
	addr string
	last time.Time
	gone bool
	inc  string
	// first is the log time of its first event this view read from its current process.
	first time.Time
	// uses are the queues its clients consumed as of its latest heartbeat that named them
	// (usesKnown); usesAll: more than a heartbeat names.
	uses      []string
	usesKnown bool
	usesAll   bool
}

// Ownership is this replica's holding of one queue. Its user consumes the queue only until Lost
// is closed, and calls Release once it has stopped (or lets it lapse after Lost).
type Ownership struct {
	c     *Cluster
	queue string
	claim uint64
	lost  chan struct{}

	// guarded by Cluster.mu
	confirmed time.Time // local send time of the latest own event read back that renewed it
	ended     bool
}

// Queue is the owned queue.
func (o *Ownership) Queue() string { return o.queue }

// HeldElsewhereSince reports whether another process (another replica, or an earlier process of
// this one) held the queue after t, a local time since this view opened, as far as the log told:
// it reports a holding read after t whatever its age, so it may say so needlessly, and never
// misses a holding that lasted past t.
func (o *Ownership) HeldElsewhereSince(t time.Time) bool {
	o.c.mu.Lock()
	defer o.c.mu.Unlock()
	return o.c.elsewhere[o.queue].After(t)
}

// Lost is closed when the holding must no longer be used: its renewal could not be confirmed in
// time, or it was released.
func (o *Ownership) Lost() <-chan struct{} { return o.lost }

// Release gives the queue up, for another replica to claim at once. Call it only once nothing
// consumes the queue any more. Idempotent.
func (o *Ownership) Release(ctx context.Context) error {
	c := o.c
	c.mu.Lock()
	if o.ended {
		c.mu.Unlock()
		return nil
	}
	wasLost := false
	select {
	case <-o.lost:
		wasLost = true
	default:
	}
	c.endLocked(o)
	c.mu.Unlock()
	if wasLost {
		return nil // it lapsed; a release would only race a newer claim (and lose: other claim seq)
	}
	return c.publish(ctx, logEvent{Kind: "release", Queue: o.queue, Claim: o.claim})
}

// Cluster is one replica's view of the ownership log and its own holdings.
type Cluster struct {
	opts Options
	log  *zap.Logger

	// mu guards everything below.
	mu      sync.Mutex
	holders map[string]*holding
	// maybe blocks claims of a queue: a claim was read whose outcome this view cannot know (it
	// came too early in the view's window, or was blocked itself), and if it was accepted its
	// holder may not have heartbeated yet.
	maybe map[string]unknownClaim
	// elsewhere is, per queue, the local time this view last read that another process (another
	// replica, or an earlier process of this one) held it (HeldElsewhereSince).
	elsewhere map[string]time.Time
	members   map[string]*member
	// orphans are the queues a replica's earlier process consumed when it was heard under a
	// new one (it restarted without a clean stop), with the log time of that.
	orphans      map[string]orphan
	inc          string
	usesFn       func() []string
	kick         chan struct{} // cap 1: heartbeat now (UsesChanged)
	owned        map[string]*Ownership
	sent         map[uint64]time.Time // own claim/heartbeat counter -> local send time
	pending      map[uint64]chan claimResult
	claiming     map[string]chan struct{} // queues with an own claim in flight (closed when judged)
	counter      uint64
	lastSeq      uint64
	gapAt        uint64    // the first missing sequence of a gap being read again
	logTime      time.Time // server time of the newest event read
	warmFrom     time.Time // claims stamped before this are not judged
	syncNonce    string
	ready        bool
	readyCh      chan struct{}
	warming      []readEvent // events read before the view's own marker (see readLocked)
	closed       bool
	mute         bool // tests: heartbeats are not written (a KubeMQ that stopped taking them)
	lastSlowWarn time.Time

	pubMu sync.Mutex // one write at a time (publish)

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

type claimResult struct {
	accepted bool
	seq      uint64
	holder   *holding
}

// Open starts following the ownership log and heartbeating. It returns at once; Ready reports
// when claims can be made.
func Open(opts Options) (*Cluster, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	c := &Cluster{
		opts:      opts,
		log:       opts.Logger.Named("cluster").With(zap.String("replica", opts.ReplicaID)),
		holders:   map[string]*holding{},
		maybe:     map[string]unknownClaim{},
		elsewhere: map[string]time.Time{},
		members:   map[string]*member{},
		orphans:   map[string]orphan{},
		inc:       randomID(),
		kick:      make(chan struct{}, 1),
		owned:     map[string]*Ownership{},
		sent:      map[uint64]time.Time{},
		pending:   map[uint64]chan claimResult{},
		claiming:  map[string]chan struct{}{},
		readyCh:   make(chan struct{}),
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.wg.Add(3)
	go c.follow()
	go c.heartbeat()
	go c.watchLeases()
	return c, nil
}

// ID is this replica's id in the log.
func (c *Cluster) ID() string { return c.opts.ReplicaID }

// Lease is the holding lease.
func (c *Cluster) Lease() time.Duration { return c.opts.Lease }

// Ready is closed once the log has been read up to a marker written after this replica
// subscribed: claims can be judged. (After events were lost for good the view starts over, and
// a new channel is returned until it is read up to now again.)
func (c *Cluster) Ready() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.readyCh
}

// WaitReady waits for Ready or ctx.
func (c *Cluster) WaitReady(ctx context.Context) error {
	select {
	case <-c.Ready():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-c.ctx.Done():
		return ErrClosed
	}
}

// Owner returns the replica that holds queue as far as this replica's view goes, if the holding
// is live (renewed within the lease, by log time).
func (c *Cluster) Owner(queue string) (Member, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	h := c.liveHolderLocked(queue)
	if h == nil {
		return Member{}, false
	}
	m := Member{ID: h.replica}
	if mb := c.members[h.replica]; mb != nil {
		m.Addr = mb.addr
	}
	if h.replica == c.opts.ReplicaID {
		m.Addr = c.opts.Advertise
	}
	return m, true
}

// Owned returns this replica's live holding of queue, or nil.
func (c *Cluster) Owned(queue string) *Ownership {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.owned[queue]
}

func (c *Cluster) liveHolderLocked(queue string) *holding {
	h := c.holders[queue]
	if h == nil || c.logTime.Sub(h.last) > c.opts.Lease {
		return nil
	}
	return h
}

// Claim makes this replica the owner of queue, or reports the owner (*OwnedError). It returns
// this replica's existing holding if it has one. It waits (within ctx) until the log has been
// read up to now.
func (c *Cluster) Claim(ctx context.Context, queue string) (*Ownership, error) {
	if err := kubemqclient.ValidChannel(queue); err != nil {
		return nil, err
	}
	if err := c.WaitReady(ctx); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNotReady, err)
	}
	c.mu.Lock()
	// One claim of a queue in flight at a time: two crossing claims of one replica could leave
	// it holding a queue it has just released.
	for c.claiming[queue] != nil {
		busy := c.claiming[queue]
		c.mu.Unlock()
		select {
		case <-busy:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		c.mu.Lock()
	}
	if c.closed {
		c.mu.Unlock()
		return nil, ErrClosed
	}
	if o := c.owned[queue]; o != nil {
		c.mu.Unlock()
		return o, nil
	}
	if h := c.liveHolderLocked(queue); h != nil && h.replica != c.opts.ReplicaID {
		err := c.ownedErrLocked(queue, h)
		c.mu.Unlock()
		return nil, err
	}
	if c.maybe[queue].blocks(c.logTime) {
		c.mu.Unlock()
		return nil, ErrUnsettled
	}
	c.counter++
	n := c.counter
	res := make(chan claimResult, 1)
	c.pending[n] = res
	c.sent[n] = time.Now()
	busy := make(chan struct{})
	c.claiming[queue] = busy
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.pending, n)
		delete(c.claiming, queue)
		close(busy)
		c.mu.Unlock()
	}()
	if err := c.publish(ctx, logEvent{Kind: "claim", Queue: queue, N: n}); err != nil {
		return nil, err
	}
	select {
	case r := <-res:
		c.mu.Lock()
		defer c.mu.Unlock()
		if !r.accepted {
			if r.holder == nil {
				return nil, ErrUnsettled
			}
			return nil, c.ownedErrLocked(queue, r.holder)
		}
		if o := c.owned[queue]; o != nil {
			return o, nil // (a heartbeat may have made it ours meanwhile: same claim)
		}
		return nil, ErrNotReady // lost again before we looked: the log is too slow
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-c.ctx.Done():
		return nil, ErrClosed
	}
}

func (c *Cluster) ownedErrLocked(queue string, h *holding) error {
	m := Member{ID: h.replica}
	if mb := c.members[h.replica]; mb != nil {
		m.Addr = mb.addr
	}
	return &OwnedError{Queue: queue, Owner: m}
}

// Members returns the replicas heard from within the lease, this one included.
func (c *Cluster) Members() []Member {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []Member
	for id, m := range c.members {
		if !m.gone && c.logTime.Sub(m.last) <= c.opts.Lease {
			out = append(out, Member{ID: id, Addr: m.addr})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Close stops heartbeating and following: every holding is lost (their users must stop), and a
// final heartbeat tells the other replicas that this one left. Holdings not released lapse
// after the lease; release them first for an immediate handover.
func (c *Cluster) Close(ctx context.Context) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	held := len(c.owned)
	for _, o := range c.owned {
		c.endLocked(o)
	}
	c.mu.Unlock()
	var err error
	if held == 0 {
		err = c.publish(ctx, logEvent{Kind: "hb", Stop: true})
	}
	c.cancel()
	c.wg.Wait()
	return err
}

// endLocked ends o locally.
func (c *Cluster) endLocked(o *Ownership) {
	if o.ended {
		return
	}
	o.ended = true
	if c.owned[o.queue] == o {
		delete(c.owned, o.queue)
	}
	select {
	case <-o.lost:
	default:
		close(o.lost)
	}
}

// publish writes one event. Writes go one at a time, so this replica's events reach the log in
// the order they were made (a heartbeat must never overtake the release that ended one of its
// holdings).
func (c *Cluster) publish(ctx context.Context, ev logEvent) error {
	c.pubMu.Lock()
	defer c.pubMu.Unlock()
	ev.Replica = c.opts.ReplicaID
	ev.Addr = c.opts.Advertise
	ev.Version = 1
	ev.Lease = c.opts.Lease.Milliseconds()
	ev.Inc = c.inc
	body, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	_, err = c.opts.Client.PublishEvent(ctx, kubemqclient.Event{Channel: c.opts.Channel, Body: body, Metadata: "kubemq-proxy cluster"})
	if err != nil {
		return fmt.Errorf("cluster: write %s: %w", ev.Kind, err)
	}
	return nil
}

// heartbeat publishes this replica's holdings every Heartbeat.
func (c *Cluster) heartbeat() {
	defer c.wg.Done()
	t := time.NewTicker(c.opts.Heartbeat)
	defer t.Stop()
	for first := true; ; first = false {
		if !first {
			// UsesChanged may ask for the next one early, at most ten times a Heartbeat.
			select {
			case <-c.ctx.Done():
				return
			case <-time.After(c.opts.Heartbeat / 10):
			}
		}
		select {
		case <-c.ctx.Done():
			return
		case <-t.C:
		case <-c.kick:
		}
		c.mu.Lock()
		c.pruneMembersLocked()
		c.counter++
		n := c.counter
		holds := make([]hold, 0, len(c.owned))
		for _, o := range c.owned {
			holds = append(holds, hold{Queue: o.queue, Claim: o.claim})
		}
		mute := c.mute
		usesFn := c.usesFn
		c.sent[n] = time.Now()
		// Send times older than a lease can no longer confirm anything.
		for k, at := range c.sent {
			if time.Since(at) > c.opts.Lease {
				delete(c.sent, k)
			}
		}
		c.mu.Unlock()
		if mute {
			continue
		}
		sort.Slice(holds, func(i, j int) bool { return holds[i].Queue < holds[j].Queue })
		var uses []string
		usesAll := false
		if usesFn != nil {
			if uses = usesFn(); len(uses) > maxHoldsPerEvent {
				uses, usesAll = nil, true
			}
			sort.Strings(uses)
		}
		ctx, cancel := context.WithTimeout(c.ctx, c.opts.Heartbeat)
		for first := true; first || len(holds) > 0; first = false {
			k := min(len(holds), maxHoldsPerEvent)
			ev := logEvent{Kind: "hb", Holds: holds[:k], N: n}
			if first && usesFn != nil {
				ev.Uses, ev.UsesSet, ev.UsesAll = uses, true, usesAll
			}
			if err := c.publish(ctx, ev); err != nil {
				if c.ctx.Err() == nil {
					c.log.Warn("heartbeat not written", zap.Error(err))
				}
				break
			}
			holds = holds[k:]
		}
		cancel()
	}
}

// maxHoldsPerEvent bounds one heartbeat event (about 100 bytes per holding), and the uses it
// names.
const maxHoldsPerEvent = 2000

// ReportUses sets the function each heartbeat calls for the queues this replica's clients
// consume, for Orphaned. Set it before the first heartbeat, or the replicas that judge orphans
// wait for the next one.
func (c *Cluster) ReportUses(f func() []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.usesFn = f
}

// UsesChanged asks for a heartbeat now, rather than at the next tick: the queues this replica's
// clients consume changed, and a crash before the next tick would leave a new one unreported.
func (c *Cluster) UsesChanged() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// Orphaned returns the queues whose consumers ended with a replica that died while other replicas
// lived on: the replica's last heartbeat named them (ReportUses), and the latest heartbeat of no
// replica that may be alive names them. A replica counts as dead once it has been silent for
// twice the lease, or at once when it is heard under a new process without having stopped
// cleanly; its queues are returned for two leases after that. Nothing is returned while any replica that may be alive has not
// reported its uses (an earlier version, or just started) or had more than a heartbeat names,
// or before the log has been read up to now.
func (c *Cluster) Orphaned() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.ready {
		return nil
	}
	live := map[string]bool{}
	cand := map[string]bool{}
	for id, m := range c.members {
		silent := c.logTime.Sub(m.last)
		switch {
		case m.gone:
		case silent <= 2*c.opts.Lease:
			if !m.usesKnown || m.usesAll {
				return nil
			}
			for _, q := range m.uses {
				live[q] = true
			}
		case silent <= 4*c.opts.Lease && c.survivedLocked(id, m.last, m.last):
			for _, q := range m.uses {
				cand[q] = true
			}
		}
	}
	for q, o := range c.orphans {
		if c.logTime.Sub(o.at) > 2*c.opts.Lease {
			delete(c.orphans, q)
			continue
		}
		if c.survivedLocked(o.replica, o.last, o.at) {
			cand[q] = true
		}
	}
	var out []string
	for q := range cand {
		if !live[q] {
			out = append(out, q)
		}
	}
	sort.Strings(out)
	return out
}

// orphan is a queue an earlier process of replica consumed, found when the replica was heard
// under a new one (at); last is the earlier process's last event.
type orphan struct {
	at      time.Time
	replica string
	last    time.Time
}

// survivedLocked reports whether a replica other than id was heard from before id's process
// ended (its last event), again after the end was known (after), and heartbeats still (within
// three heartbeats): the fleet outlived that process. A lone replica that crashes and starts
// again is a whole broker restarting, which keeps its queues, and so is a whole fleet.
func (c *Cluster) survivedLocked(id string, last, after time.Time) bool {
	for oid, o := range c.members {
		if oid != id && !o.gone && !o.first.After(last) && o.last.After(after) && c.logTime.Sub(o.last) <= 3*c.opts.Heartbeat {
			return true
		}
	}
	return false
}

// pruneMembersLocked forgets replicas silent for memberMemory: their holdings lapsed long ago,
// and a replica id that changes with each start would otherwise add one for good each time.
func (c *Cluster) pruneMembersLocked() {
	for id, m := range c.members {
		if id != c.opts.ReplicaID && c.logTime.Sub(m.last) > memberMemory*c.opts.Lease {
			delete(c.members, id)
		}
	}
}

// memberMemory is how many leases a silent replica is remembered.
const memberMemory = 16

// watchLeases ends holdings whose renewal was not confirmed in time.
func (c *Cluster) watchLeases() {
	defer c.wg.Done()
	t := time.NewTicker(c.opts.Heartbeat / 4)
	defer t.Stop()
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-t.C:
		}
		limit := c.opts.Lease - c.opts.StopSlack
		c.mu.Lock()
		for _, o := range c.owned {
			if time.Since(o.confirmed) > limit {
				c.log.Warn("ownership not renewed in time; giving the queue up",
					zap.String("queue", o.queue), zap.Duration("since_confirmed", time.Since(o.confirmed)))
				c.endLocked(o)
			}
		}
		c.mu.Unlock()
	}
}

// follow reads the log for good: from Window before now at first, then on from the last event
// read, again from a fresh window when events were lost for good.
func (c *Cluster) follow() {
	defer c.wg.Done()
	backoff := 100 * time.Millisecond
	for c.ctx.Err() == nil {
		err := c.followOnce()
		if c.ctx.Err() != nil {
			return
		}
		c.log.Warn("ownership log stream ended; reading again", zap.Error(err))
		select {
		case <-time.After(backoff):
		case <-c.ctx.Done():
			return
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// errGap: events are missing between the last one read and the next.
var errGap = errors.New("cluster: gap in the ownership log")

func (c *Cluster) followOnce() error {
	if err := c.opts.Client.WaitReady(c.ctx); err != nil {
		return err
	}
	c.mu.Lock()
	last, warm := c.lastSeq, c.ready
	if !warm {
		c.syncNonce = randomID()
	}
	nonce := c.syncNonce
	c.mu.Unlock()
	start := kubemqclient.StartPosition{Mode: kubemqclient.StartAtTimeDelta, Delta: c.opts.window()}
	if last > 0 {
		start = kubemqclient.StartPosition{Mode: kubemqclient.StartAtSequence, Sequence: last + 1}
	}
	sub, err := c.opts.Client.SubscribeEventsStore(c.ctx, kubemqclient.SubscribeOptions{Channel: c.opts.Channel, Start: start})
	if err != nil {
		return err
	}
	defer sub.Close()
	if !warm {
		if err := c.publish(c.ctx, logEvent{Kind: "sync", Nonce: nonce}); err != nil {
			return err
		}
	}
	for {
		ev, err := sub.Recv(c.ctx)
		if err != nil {
			return err
		}
		c.mu.Lock()
		switch {
		case ev.Sequence <= c.lastSeq:
			c.mu.Unlock()
			continue
		case c.lastSeq > 0 && ev.Sequence != c.lastSeq+1:
			missing := c.lastSeq + 1
			if c.gapAt == missing {
				// Read again from the gap, and still skipped: those events are gone.
				c.log.Warn("ownership log events lost for good; reading a fresh window",
					zap.Uint64("missing_from", missing), zap.Uint64("next", ev.Sequence))
				c.resetLocked()
			} else {
				c.gapAt = missing
			}
			c.mu.Unlock()
			return fmt.Errorf("%w: %d to %d", errGap, missing, ev.Sequence-1)
		}
		c.gapAt = 0
		c.lastSeq = ev.Sequence
		if ev.Timestamp.After(c.logTime) {
			c.logTime = ev.Timestamp
		}
		var body logEvent
		if err := json.Unmarshal(ev.Body, &body); err != nil {
			c.mu.Unlock()
			c.log.Warn("skipping undecodable ownership event", zap.Uint64("sequence", ev.Sequence), zap.Error(err))
			continue
		}
		c.readLocked(readEvent{ev.Sequence, ev.Timestamp, body})
		c.mu.Unlock()
	}
}

// unknownClaim is the latest claim of a queue whose outcome a view cannot know.
type unknownClaim struct {
	until time.Time // when it would have lapsed without a heartbeat
	seq   uint64
}

// blocks reports whether a claim at ts may still be held by the unknown one: up to and
// including until, as a holding is live up to and including a lease after its renewal.
func (u unknownClaim) blocks(ts time.Time) bool { return u.seq != 0 && !ts.After(u.until) }

// readEvent is one decoded event of the log.
type readEvent struct {
	seq uint64
	ts  time.Time
	ev  logEvent
}

// readLocked takes the next event in log order. Until the view has read its own marker it only
// keeps them: the marker's server time tells where its window began, and so which of the claims
// before it can be judged (those a whole lease after the window's start).
func (c *Cluster) readLocked(e readEvent) {
	if c.ready {
		c.applyLocked(e.seq, e.ts, &e.ev)
		return
	}
	if e.ev.Kind != "sync" || e.ev.Replica != c.opts.ReplicaID || e.ev.Nonce != c.syncNonce {
		c.warming = append(c.warming, e)
		return
	}
	c.warmFrom = e.ts.Add(-c.opts.window()).Add(c.opts.Lease + c.opts.Heartbeat)
	for i := range c.warming {
		w := &c.warming[i]
		c.applyLocked(w.seq, w.ts, &w.ev)
	}
	c.warming = nil
	c.applyLocked(e.seq, e.ts, &e.ev) // its sender is a member too
	c.ready = true
	close(c.readyCh)
	c.log.Info("ownership log read up to now", zap.Uint64("sequence", e.seq), zap.Int("holdings", len(c.holders)))
}

// resetLocked forgets the view: the next read starts from a fresh window, and claims wait for
// it. Own holdings are lost (their renewals can no longer be confirmed).
func (c *Cluster) resetLocked() {
	c.holders = map[string]*holding{}
	c.maybe = map[string]unknownClaim{}
	c.warming = nil
	c.lastSeq, c.gapAt = 0, 0
	c.warmFrom = time.Time{}
	for _, o := range c.owned {
		c.endLocked(o)
	}
	if c.ready {
		c.ready = false
		c.readyCh = make(chan struct{})
	}
}

// applyLocked applies one event in log order.
func (c *Cluster) applyLocked(seq uint64, ts time.Time, ev *logEvent) {
	self := ev.Replica == c.opts.ReplicaID
	// other: a holding this event shows is another process's, this replica's earlier ones
	// included.
	other := !self || (ev.Inc != "" && ev.Inc != c.inc)
	if ev.Replica != "" {
		m := c.members[ev.Replica]
		if m == nil {
			m = &member{first: ts}
			c.members[ev.Replica] = m
		}
		if ev.Inc != "" && m.inc != "" && ev.Inc != m.inc {
			// The replica restarted. Unless it stopped cleanly, its earlier process's
			// clients went with it.
			if !m.gone {
				for _, q := range m.uses {
					c.orphans[q] = orphan{at: ts, replica: ev.Replica, last: m.last}
				}
			}
			m.uses, m.usesKnown, m.usesAll = nil, false, false
			m.first = ts
		}
		if ev.Inc != "" {
			m.inc = ev.Inc
		}
		m.addr, m.last, m.gone = ev.Addr, ts, ev.Stop
		if ev.UsesSet {
			m.uses, m.usesKnown, m.usesAll = ev.Uses, true, ev.UsesAll
		}
	}
	switch ev.Kind {
	case "claim":
		var r claimResult
		if ts.Before(c.warmFrom) || c.maybe[ev.Queue].blocks(ts) {
			// Its outcome is unknown here: the view does not reach a lease back from it, or
			// an earlier claim with an unknown outcome may hold the queue. If it was
			// accepted, its holder shows in the heartbeats that follow; until it would have
			// lapsed, nobody may claim the queue in this view.
			c.maybe[ev.Queue] = unknownClaim{until: ts.Add(c.opts.Lease), seq: seq}
			break
		}
		h := c.holders[ev.Queue]
		switch {
		case h != nil && h.replica == ev.Replica && ts.Sub(h.last) <= c.opts.Lease:
			// A replica claiming what it holds (it gave its holding up locally, or two of
			// its claims crossed): the holding goes on, renewed.
			h.last = ts
			r = claimResult{accepted: true, seq: h.claim}
			if self {
				c.ownLocked(ev.Queue, h.claim, ev.N)
			}
		case h == nil || ts.Sub(h.last) > c.opts.Lease:
			c.holders[ev.Queue] = &holding{replica: ev.Replica, claim: seq, last: ts}
			if other {
				c.elsewhere[ev.Queue] = time.Now()
			}
			r = claimResult{accepted: true, seq: seq}
			if self {
				c.ownLocked(ev.Queue, seq, ev.N)
			} else {
				c.supersededLocked(ev.Queue, seq)
			}
		default:
			r = claimResult{holder: h}
		}
		if self {
			if ch := c.pending[ev.N]; ch != nil {
				ch <- r
			}
		}
	case "hb":
		for _, hd := range ev.Holds {
			h := c.holders[hd.Queue]
			// A later claim this view could not judge may have replaced the holding named
			// here; the queue is held by one of them either way, and the view blocks claims of
			// it while the heartbeats go on.
			if m, ok := c.maybe[hd.Queue]; ok && hd.Claim >= m.seq {
				delete(c.maybe, hd.Queue) // accepted at or after the claims it did not know
			}
			switch {
			case h == nil || hd.Claim > h.claim:
				c.holders[hd.Queue] = &holding{replica: ev.Replica, claim: hd.Claim, last: ts}
				if !self {
					c.supersededLocked(hd.Queue, hd.Claim)
				}
			case hd.Claim == h.claim && h.replica == ev.Replica:
				h.last = ts
			default:
				continue // a holding that a later claim replaced
			}
			if other {
				c.elsewhere[hd.Queue] = time.Now()
			}
			if self {
				c.renewLocked(hd.Queue, hd.Claim, ev.N)
			}
		}
	case "release":
		if h := c.holders[ev.Queue]; h != nil && h.claim == ev.Claim && h.replica == ev.Replica {
			delete(c.holders, ev.Queue)
		}
	}
}

// supersededLocked ends an own holding of queue that a later claim replaced. The lease rules
// make that happen only after the holding was lost here already; this is the second line.
func (c *Cluster) supersededLocked(queue string, claim uint64) {
	if o := c.owned[queue]; o != nil && o.claim < claim {
		c.log.Warn("own holding replaced by a later claim", zap.String("queue", queue))
		c.endLocked(o)
	}
}

// ownLocked records an accepted own claim that a Claim call still waits for.
func (c *Cluster) ownLocked(queue string, claim, n uint64) {
	if o := c.owned[queue]; o != nil || c.pending[n] == nil {
		return
	}
	at, ok := c.sent[n]
	if !ok {
		return // sent too long ago to be of use: let it lapse
	}
	c.owned[queue] = &Ownership{c: c, queue: queue, claim: claim, lost: make(chan struct{}), confirmed: at}
	c.log.Debug("queue claimed", zap.String("queue", queue), zap.Uint64("claim", claim))
}

// renewLocked confirms an own holding with the heartbeat sent as n.
func (c *Cluster) renewLocked(queue string, claim, n uint64) {
	o := c.owned[queue]
	if o == nil || o.claim != claim {
		return
	}
	if at, ok := c.sent[n]; ok && at.After(o.confirmed) {
		o.confirmed = at
		if d := time.Since(at); d > c.opts.Heartbeat && time.Since(c.lastSlowWarn) > 10*time.Second {
			c.lastSlowWarn = time.Now()
			c.log.Warn("a heartbeat took long to come back from the ownership log; holdings are given up when it takes longer than lease - 3s",
				zap.Duration("took", d), zap.Duration("lease", c.opts.Lease))
		}
	}
}

func randomID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
