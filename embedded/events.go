package embedded

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/kubemq-io/kubemq-proxy/kubemqpb"
)

// cursorSaveEvery bounds how many events a durable cursor may run ahead of its last log record;
// after a crash a resumed durable replays at most that many (at-least-once, where the real
// server's cursor is at-most-once).
const cursorSaveEvery = 1000

// storedEvent is one events-store event: what replay needs to find it (timestamp, size, where
// its record is in the log) and, in memory or while a live subscription still has to read it,
// the event itself. e is never mutated after it is stored. With a data directory e is dropped
// once every running dispatcher of the channel has read past it (or the channel's share of whole
// events, hotEventBytes, is exceeded), and the event is read back from its segment when a
// subscription replays it (loadEvents).
type storedEvent struct {
	e    *kubemqpb.EventReceive // nil when only in the log
	ts   int64                  // Timestamp
	lsn  uint64                 // log position that holds the record
	off  int64                  // record offset in its segment
	size int64                  // eventSize
	seg  uint32                 // log segment holding the record (persistence)
	n    uint32                 // record length
}

// hotEventBytes bounds the bytes of whole events a channel keeps for its running dispatchers
// with a data directory; beyond it the oldest are dropped from memory and a dispatcher that lags
// further behind reads them back from the log.
const hotEventBytes = 4 << 20

// eventChannel is one events-store channel. mu guards everything below it.
type eventChannel struct {
	name    string
	mu      sync.Mutex
	first   uint64 // sequence of events[0]; last+1 when empty
	last    uint64
	events  []storedEvent
	bytes   int64         // sum of the events' sizes
	notify  chan struct{} // closed at the next append when waiting is set
	waiting bool
	// lastActive is the last publish or subscriber departure (Unix ns), for MaxPurgeInactive;
	// purged is set when the channel was deleted for inactivity.
	lastActive int64
	purged     bool
	// With a data directory: events from sequence hot on are held whole (hotBytes of them),
	// older ones only in the log; readers are the running dispatchers, each with the last
	// sequence it has read.
	hot      uint64
	hotBytes int64
	readers  map[*eventReader]struct{}
	// dropped counts events forgotten at the head of events since its array was allocated.
	dropped int
}

// eventReader is one running dispatcher's position in its channel (guarded by the channel's mu).
type eventReader struct{ pos uint64 }

func (s *Server) getChannel(name string, create bool) *eventChannel {
	s.mu.RLock()
	c := s.channels[name]
	s.mu.RUnlock()
	if c != nil || !create {
		return c
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if c = s.channels[name]; c == nil {
		c = s.newChannelLocked(name)
	}
	return c
}

// newChannelLocked creates and registers a channel. s.mu must be held for writing.
func (s *Server) newChannelLocked(name string) *eventChannel {
	c := &eventChannel{name: name, first: 1, hot: 1, notify: make(chan struct{}), lastActive: s.now().UnixNano()}
	s.channels[name] = c
	return c
}

// appendLocked stores e with the next sequence and a timestamp, and wakes readers.
func (c *eventChannel) appendLocked(s *Server, e *kubemqpb.EventReceive, now int64) uint64 {
	c.last++
	e.Sequence = c.last
	e.Timestamp = now
	lsn, seg, off, n := s.logEvent(e)
	size := eventSize(e)
	before := cap(c.events)
	c.events = append(c.events, storedEvent{e: e, ts: now, lsn: lsn, off: off, size: size, seg: seg, n: uint32(n)})
	if cap(c.events) != before {
		c.dropped = 0
	}
	c.bytes += size
	s.mem.Add(size)
	if s.store != nil {
		// Held whole only for the dispatchers running now; the send path hands it to them
		// without a read.
		c.hotBytes += size
		if len(c.readers) == 0 {
			c.spillTo(s, c.last)
		} else {
			for c.hotBytes > hotEventBytes && c.hot < c.last {
				c.spillTo(s, c.hot)
			}
		}
	}
	c.lastActive = now
	c.trimLocked(s, s.releaseSeg)
	if c.waiting {
		close(c.notify)
		c.notify = make(chan struct{})
		c.waiting = false
	}
	return lsn
}

// spillTo drops from memory the whole events up to sequence upto (with a data directory; they
// stay in the log).
func (c *eventChannel) spillTo(s *Server, upto uint64) {
	if s.store == nil {
		return
	}
	c.hot = max(c.hot, c.first)
	for c.hot <= upto && c.hot-c.first < uint64(len(c.events)) {
		ev := &c.events[c.hot-c.first]
		if ev.e != nil {
			ev.e = nil
			s.mem.Add(-ev.size)
			c.hotBytes -= ev.size
		}
		c.hot++
	}
}

// spillRead drops from memory what every running dispatcher has read (all, with none).
func (c *eventChannel) spillRead(s *Server) {
	upto := c.last
	for r := range c.readers {
		upto = min(upto, r.pos)
	}
	c.spillTo(s, upto)
}

// addReader registers a running dispatcher whose next read starts after sequence pos.
func (c *eventChannel) addReader(pos uint64) *eventReader {
	r := &eventReader{pos: pos}
	c.mu.Lock()
	if c.readers == nil {
		c.readers = map[*eventReader]struct{}{}
	}
	c.readers[r] = struct{}{}
	c.mu.Unlock()
	return r
}

// removeReader unregisters a dispatcher that stopped.
func (c *eventChannel) removeReader(s *Server, r *eventReader) {
	c.mu.Lock()
	delete(c.readers, r)
	c.spillRead(s)
	c.mu.Unlock()
}

// dropOldest forgets the first n events: their bytes, the memory of those held whole and their
// log records (release).
func (c *eventChannel) dropOldest(s *Server, n int, release func(seg uint32)) {
	for i := range n {
		ev := &c.events[i]
		c.bytes -= ev.size
		if ev.e != nil {
			s.mem.Add(-ev.size)
			if s.store != nil {
				c.hotBytes -= ev.size
			}
		}
		release(ev.seg)
	}
	c.dropHead(n)
}

// readFrom returns up to max events from sequence seq on (from the first retained one if seq is
// older) with the sequence of the first, or none and a channel closed at the next append. r, when
// set, is the reading dispatcher: what it has read is dropped from memory once every other
// dispatcher has read it too.
func (c *eventChannel) readFrom(s *Server, r *eventReader, seq uint64, max int) ([]storedEvent, uint64, <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if seq < c.first {
		seq = c.first
	}
	if seq > c.last {
		c.waiting = true
		if r != nil {
			r.pos = c.last
			c.spillRead(s)
		}
		return nil, seq, c.notify
	}
	i := int(seq - c.first)
	j := min(len(c.events), i+max)
	out := make([]storedEvent, j-i)
	copy(out, c.events[i:j])
	if r != nil {
		r.pos = seq + uint64(j-i) - 1
		c.spillRead(s)
	}
	return out, seq, nil
}

// loadEvents returns the events of evs (numbered from first on), reading back from the log
// those not held whole. Records that lie close together in one segment are read with one read.
func (s *Server) loadEvents(evs []storedEvent, first uint64) ([]*kubemqpb.EventReceive, error) {
	out := make([]*kubemqpb.EventReceive, len(evs))
	for i := 0; i < len(evs); {
		ev := &evs[i]
		if ev.e != nil {
			out[i] = ev.e
			i++
			continue
		}
		if s.store == nil {
			return nil, errServerClosed
		}
		j, end, lsn := i+1, ev.off+int64(ev.n), ev.lsn
		for j < len(evs) {
			x := &evs[j]
			if x.e != nil || x.seg != ev.seg || x.off < end || x.off+int64(x.n)-ev.off > readSpan {
				break
			}
			end, lsn = x.off+int64(x.n), max(lsn, x.lsn)
			j++
		}
		buf, err := s.store.readAt(ev.seg, ev.off, int(end-ev.off), lsn)
		if err != nil {
			return nil, err
		}
		for k := i; k < j; k++ {
			x := &evs[k]
			rel := x.off - ev.off
			typ, p, n, err := unframe(buf[rel : rel+int64(x.n)])
			if err == nil && (n != int(x.n) || typ != recEvent) {
				err = errCorrupt
			}
			var e *kubemqpb.EventReceive
			if err == nil {
				e, _, err = parseEventRecord(p, true)
			}
			if err != nil || e.Sequence != first+uint64(k) || e.Timestamp != x.ts {
				return nil, fmt.Errorf("embedded: event record of segment %d at %d is damaged", x.seg, x.off)
			}
			out[k] = e
		}
		i = j
	}
	return out, nil
}

// startCursor turns a start mode into the last sequence considered already delivered.
func (c *eventChannel) startCursor(mode kubemqpb.Subscribe_EventsStoreType, v int64, now time.Time) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch mode {
	case kubemqpb.Subscribe_StartFromFirst:
		return c.first - 1
	case kubemqpb.Subscribe_StartFromLast:
		if c.last >= c.first {
			return c.last - 1
		}
		return c.last
	case kubemqpb.Subscribe_StartAtSequence:
		n := uint64(v)
		switch {
		case n > c.last:
			return c.last
		case n < c.first:
			return c.first - 1
		default:
			return n - 1
		}
	case kubemqpb.Subscribe_StartAtTime, kubemqpb.Subscribe_StartAtTimeDelta:
		from := v
		if mode == kubemqpb.Subscribe_StartAtTimeDelta {
			from = now.Add(-time.Duration(v) * time.Second).UnixNano()
		}
		// Events are appended in time order, so the first one at or after from is found by
		// binary search.
		lo, hi := 0, len(c.events)
		for lo < hi {
			m := (lo + hi) / 2
			if c.events[m].ts < from {
				lo = m + 1
			} else {
				hi = m
			}
		}
		return c.first + uint64(lo) - 1
	default: // StartNewOnly
		return c.last
	}
}

// durable is an events-store durable cursor: per (ClientID, channel) with no group, per
// (channel, group) with one (docs/kubemq.md 5.3). mu guards the fields below it.
type durable struct {
	key     string
	channel string
	ch      *eventChannel

	mu      sync.Mutex
	cursor  uint64 // last sequence handed to a member
	saved   uint64 // cursor value last written to the log
	members []*storeMember
	rr      int
	running bool
}

// storeMember is one subscription stream of a durable.
type storeMember struct {
	out  chan *kubemqpb.EventReceive
	gone chan struct{}
	fail chan error // an error that ends the subscription (events that cannot be read back)
	sent uint64     // last sequence sent to the client; owned by the stream handler until gone closes
	left bool       // guarded by the durable's mu
}

func durableKey(clientID, channel, group string) string {
	if group == "" {
		return "c\x00" + clientID + "\x00" + channel
	}
	return "g\x00" + channel + "\x00" + group
}

// dispatch hands the durable's events to its members round-robin until it has none. It is the
// only writer of d.cursor while running. r is its position in the channel, registered before it
// started (so that the events sent from then on are kept whole for it).
func (s *Server) dispatch(d *durable, r *eventReader) {
	defer d.ch.removeReader(s, r)
	for {
		d.mu.Lock()
		if len(d.members) == 0 || s.ctx.Err() != nil {
			d.running = false
			d.mu.Unlock()
			s.saveCursor(d)
			return
		}
		cur := d.cursor
		d.mu.Unlock()
		evs, first, notify := d.ch.readFrom(s, r, cur+1, 256)
		if len(evs) == 0 {
			s.saveCursor(d)
			select {
			case <-notify:
			case <-s.ctx.Done():
				return
			case <-time.After(time.Second): // re-check membership now and then
			}
			continue
		}
		es, err := s.loadEvents(evs, first)
		if err != nil {
			d.ch.mu.Lock()
			gone := first < d.ch.first
			d.ch.mu.Unlock()
			if gone {
				continue // dropped (retention, limits) while being read: read on from the first kept
			}
			s.failMembers(d, err)
			continue
		}
		for _, e := range es {
			if !s.handOut(d, e) {
				break
			}
		}
	}
}

// failMembers ends the durable's subscriptions with an error when its next events cannot be read
// back from the log; the cursor stays before them. It waits a little, so that the dispatcher
// does not spin until the members are gone.
func (s *Server) failMembers(d *durable, err error) {
	s.log.Error("cannot read stored events back from the log", zap.String("channel", d.channel), zap.Error(err))
	d.mu.Lock()
	for _, m := range d.members {
		select {
		case m.fail <- internalErr("Error 121: cannot read messages back from the store: " + err.Error()):
		default:
		}
	}
	d.mu.Unlock()
	select {
	case <-s.ctx.Done():
	case <-time.After(100 * time.Millisecond):
	}
}

// handOut gives one event to the next member; false when there is none left or the server stops.
func (s *Server) handOut(d *durable, e *kubemqpb.EventReceive) bool {
	for {
		d.mu.Lock()
		if len(d.members) == 0 {
			d.mu.Unlock()
			return false
		}
		d.rr++
		m := d.members[d.rr%len(d.members)]
		d.mu.Unlock()
		select {
		case m.out <- e:
			d.mu.Lock()
			if m.left {
				// Left while we picked it: the event is handed out again to another member.
				d.mu.Unlock()
				continue
			}
			d.cursor = e.Sequence
			save := d.cursor-d.saved >= cursorSaveEvery
			d.mu.Unlock()
			if save {
				s.saveCursor(d)
			}
			return true
		case <-m.gone:
		case <-s.ctx.Done():
			return false
		}
	}
}

func (s *Server) saveCursor(d *durable) {
	d.mu.Lock()
	cur := d.cursor
	dirty := cur != d.saved
	d.saved = cur
	d.mu.Unlock()
	if dirty {
		s.logCursor(d.key, d.channel, cur)
	}
}

// plainSub is one plain-events subscription.
type plainSub struct {
	pattern string
	group   string
	out     chan *kubemqpb.EventReceive
	gone    chan struct{}
}

// plainBus routes plain events to live subscribers. mu guards subs and rr.
type plainBus struct {
	mu   sync.RWMutex
	subs map[*plainSub]struct{}
	rr   map[string]uint64
}

func newPlainBus() *plainBus {
	return &plainBus{subs: map[*plainSub]struct{}{}, rr: map[string]uint64{}}
}

// publish hands e to every matching subscriber without a group and to one member of each
// matching group.
func (s *Server) publishPlain(e *kubemqpb.EventReceive) {
	b := s.plain
	var targets []*plainSub
	groups := map[string][]*plainSub{}
	b.mu.RLock()
	for sub := range b.subs {
		if !subjectMatch(sub.pattern, e.Channel) {
			continue
		}
		if sub.group == "" {
			targets = append(targets, sub)
		} else {
			k := sub.pattern + "\x00" + sub.group
			groups[k] = append(groups[k], sub)
		}
	}
	b.mu.RUnlock()
	if len(groups) > 0 {
		b.mu.Lock()
		for k, members := range groups {
			b.rr[k]++
			// Map order is random, so pick by a stable order: the lowest channel address wins ties.
			sortSubs(members)
			targets = append(targets, members[b.rr[k]%uint64(len(members))])
		}
		b.mu.Unlock()
	}
	for _, sub := range targets {
		select {
		case sub.out <- e:
			continue
		default:
		}
		// Plain events are fire-and-forget: a subscriber that stays full for 2 s loses the event,
		// like on the real server.
		t := time.NewTimer(2 * time.Second)
		select {
		case sub.out <- e:
		case <-sub.gone:
		case <-t.C:
			s.log.Warn("plain event dropped due to slow consumer", zap.String("channel", e.Channel))
		case <-s.ctx.Done():
		}
		t.Stop()
	}
}

func sortSubs(subs []*plainSub) {
	for i := 1; i < len(subs); i++ {
		for j := i; j > 0 && subs[j].pattern+subs[j].group < subs[j-1].pattern+subs[j-1].group; j-- {
			subs[j], subs[j-1] = subs[j-1], subs[j]
		}
	}
}

func internalErr(msg string) error { return status.Error(codes.Internal, msg) }

// checkEvent validates a publish like the real server, plus the name and size checks its store
// would fail on later. It returns "" or the error text.
func (s *Server) checkEvent(e *kubemqpb.Event) string {
	if e.ClientID == "" {
		return errClientID
	}
	kind := kindEvents
	if e.Store {
		kind = kindEventsStore
	}
	if msg := checkChannel(e.Channel, kind); msg != "" {
		return msg
	}
	if e.Metadata == "" && len(e.Body) == 0 {
		return errMessageEmpty
	}
	n := len(e.Body) + len(e.Metadata) + len(e.EventID)
	for k, v := range e.Tags {
		n += len(k) + len(v)
	}
	if n > s.opts.MaxMessageBytes {
		return errEventTooLarge(n, s.opts.MaxMessageBytes)
	}
	return ""
}

// publish stores or routes one event. It returns the result and, for the store, the log
// position to wait for before acknowledging.
func (s *Server) publish(e *kubemqpb.Event) (*kubemqpb.Result, uint64, string) {
	if msg := s.checkEvent(e); msg != "" {
		return &kubemqpb.Result{EventID: e.EventID, Error: msg}, 0, msg
	}
	id := e.EventID
	if id == "" {
		id = nuids.next()
	}
	ev := &kubemqpb.EventReceive{EventID: id, Channel: e.Channel, Metadata: e.Metadata, Body: e.Body, Tags: e.Tags}
	var lsn uint64
	if e.Store {
		// A refusal by a store limit is a Result with Sent=false (the real server's store
		// errors arrive in the Result too), not a gRPC error.
		if msg := s.memFull(eventSize(ev), s.eventReserve()); msg != "" {
			return &kubemqpb.Result{EventID: id, Error: msg}, 0, ""
		}
		c, msg := s.lockChannel(e.Channel)
		if msg != "" {
			return &kubemqpb.Result{EventID: id, Error: msg}, 0, ""
		}
		lsn = c.appendLocked(s, ev, s.now().UnixNano())
		c.mu.Unlock()
	} else {
		s.publishPlain(ev)
	}
	return &kubemqpb.Result{EventID: id, Sent: true}, lsn, ""
}

// SendEvent publishes one event. Unlike the real server, an events-store Result is returned only
// once the event is durable, so Sent=true is never a lost event.
func (s *Server) SendEvent(_ context.Context, e *kubemqpb.Event) (*kubemqpb.Result, error) {
	res, lsn, msg := s.publish(e)
	if msg != "" {
		return nil, internalErr(msg)
	}
	if err := s.waitLog(lsn); err != nil {
		res.Sent, res.Error = false, err.Error()
	}
	return res, nil
}

// SendEventsStream publishes a stream of events: one Result per events-store event (sent once it
// is durable, in order), and for plain events a Result only on error.
func (s *Server) SendEventsStream(stream grpc.BidiStreamingServer[kubemqpb.Event, kubemqpb.Result]) error {
	// Events are taken in runs of whatever has arrived (up to maxRun), and
	// each run's results wait for the log once: a pipelining client gets
	// one log wait and one hand-off per run instead of per event.
	const maxRun = 256
	type run struct {
		res []*kubemqpb.Result
		lsn uint64 // the run's last log position
	}
	out := make(chan run, 64)
	sendErr := make(chan error, 1)
	go func() {
		var failed error
		for r := range out {
			if failed != nil {
				continue
			}
			if err := s.waitLog(r.lsn); err != nil {
				for _, res := range r.res {
					if res.Sent {
						res.Sent, res.Error = false, err.Error()
					}
				}
			}
			for _, res := range r.res {
				if err := stream.Send(res); err != nil {
					failed = err
					break
				}
			}
		}
		sendErr <- failed
	}()
	in := receiver(stream.Context(), stream.Recv)
	recvErr := func() error {
		for {
			var r recvd[kubemqpb.Event]
			select {
			case <-s.ctx.Done():
				return errShutdown()
			case <-stream.Context().Done():
				return stream.Context().Err()
			case r = <-in:
			}
			var cur run
			for {
				if r.err != nil {
					if len(cur.res) > 0 {
						out <- cur
					}
					return r.err
				}
				res, lsn, msg := s.publish(r.m)
				if msg != "" || r.m.Store {
					cur.res = append(cur.res, res)
					cur.lsn = max(cur.lsn, lsn)
				}
				if len(cur.res) >= maxRun {
					break
				}
				var more bool
				select {
				case r, more = <-in:
				default:
				}
				if !more {
					break
				}
			}
			if len(cur.res) > 0 {
				out <- cur
			}
		}
	}()
	close(out)
	serr := <-sendErr
	if recvErr == io.EOF {
		return serr
	}
	return recvErr
}

// checkSubscribe validates a subscription like the real server (same order), plus names its
// store would fail on.
func checkSubscribe(sub *kubemqpb.Subscribe, store bool) string {
	if sub.ClientID == "" {
		return errClientID
	}
	if sub.Channel == "" {
		return errChannelEmpty
	}
	if !store && sub.EventsStoreTypeData != kubemqpb.Subscribe_EventsStoreTypeUndefined {
		if msg := checkChannel(sub.Channel, kindEventsSub); msg == errEndDot || msg == errWhitespace {
			return msg
		}
		return errStoreParams
	}
	kind := kindEventsSub
	if store {
		kind = kindEventsStore
	}
	if msg := checkChannel(sub.Channel, kind); msg != "" {
		return msg
	}
	if store {
		switch sub.EventsStoreTypeData {
		case kubemqpb.Subscribe_EventsStoreTypeUndefined:
			return errSubType
		case kubemqpb.Subscribe_StartAtSequence:
			if sub.EventsStoreTypeValue <= 0 {
				return errStartSeq
			}
		case kubemqpb.Subscribe_StartAtTime:
			if sub.EventsStoreTypeValue <= 0 {
				return errStartTime
			}
		case kubemqpb.Subscribe_StartAtTimeDelta:
			if sub.EventsStoreTypeValue <= 0 {
				return errStartDelta
			}
		case kubemqpb.Subscribe_StartNewOnly, kubemqpb.Subscribe_StartFromFirst, kubemqpb.Subscribe_StartFromLast:
		default:
			return errSubType
		}
		if why := unsafeName(sub.Group, maxEventsChannelLen, false); sub.Group != "" && why != "" {
			return "Error 102: invalid group value, " + why
		}
	}
	return ""
}

// SubscribeToEvents streams plain events (type Events) or events-store events (type EventsStore).
func (s *Server) SubscribeToEvents(sub *kubemqpb.Subscribe, stream grpc.ServerStreamingServer[kubemqpb.EventReceive]) error {
	var store bool
	switch sub.SubscribeTypeData {
	case kubemqpb.Subscribe_Events:
	case kubemqpb.Subscribe_EventsStore:
		store = true
	default:
		return internalErr(errSubscribeType)
	}
	if msg := checkSubscribe(sub, store); msg != "" {
		return internalErr(msg)
	}
	if store {
		return s.subscribeStore(sub, stream)
	}
	ps := &plainSub{pattern: sub.Channel, group: sub.Group, out: make(chan *kubemqpb.EventReceive, s.opts.SubscriptionBuffer), gone: make(chan struct{})}
	s.plain.mu.Lock()
	s.plain.subs[ps] = struct{}{}
	s.plain.mu.Unlock()
	subscribed(stream)
	defer func() {
		s.plain.mu.Lock()
		delete(s.plain.subs, ps)
		s.plain.mu.Unlock()
		close(ps.gone)
	}()
	ctx := stream.Context()
	for {
		select {
		case e := <-ps.out:
			if err := stream.Send(e); err != nil {
				return err
			}
		case <-ctx.Done():
			return nil
		case <-s.ctx.Done():
			return errShutdown()
		}
	}
}

func (s *Server) subscribeStore(sub *kubemqpb.Subscribe, stream grpc.ServerStreamingServer[kubemqpb.EventReceive]) error {
	s.mu.Lock()
	if s.storeIDs[sub.ClientID] {
		s.mu.Unlock()
		return internalErr(errClientIDInUse)
	}
	s.storeIDs[sub.ClientID] = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.storeIDs, sub.ClientID)
		s.mu.Unlock()
	}()

	var ch *eventChannel
	for ch == nil {
		c, msg := s.lockChannel(sub.Channel)
		if msg != "" {
			return internalErr(msg)
		}
		c.mu.Unlock()
		s.mu.Lock() // held until the durable is registered: a purge needs it
		if s.channels[sub.Channel] == c {
			ch = c
			break
		}
		s.mu.Unlock()
	}
	ch.mu.Lock()
	ch.lastActive = s.now().UnixNano()
	ch.mu.Unlock()
	key := durableKey(sub.ClientID, sub.Channel, sub.Group)
	d := s.durables[key]
	created := d == nil
	if created && s.opts.MaxSubscribers > 0 {
		n := 0
		for _, x := range s.durables {
			if x.ch == ch {
				n++
			}
		}
		if n >= s.opts.MaxSubscribers {
			s.mu.Unlock()
			return internalErr(errTooManySubs)
		}
	}
	if created {
		d = &durable{key: key, channel: sub.Channel, ch: ch}
		d.cursor = ch.startCursor(sub.EventsStoreTypeData, sub.EventsStoreTypeValue, s.now())
		s.durables[key] = d
	}
	s.mu.Unlock()
	if created {
		d.mu.Lock()
		d.saved = d.cursor
		d.mu.Unlock()
		s.logCursor(key, sub.Channel, d.saved)
	}

	m := &storeMember{out: make(chan *kubemqpb.EventReceive, s.opts.SubscriptionBuffer), gone: make(chan struct{}), fail: make(chan error, 1)}
	d.mu.Lock()
	m.sent = d.cursor
	d.members = append(d.members, m)
	start := !d.running
	d.running = true
	cur := d.cursor
	d.mu.Unlock()
	if start {
		r := d.ch.addReader(cur)
		s.goTracked(func() { s.dispatch(d, r) })
	}
	subscribed(stream)
	err := s.serveMember(stream, m)
	d.mu.Lock()
	m.left = true
	for i, x := range d.members {
		if x == m {
			d.members = append(d.members[:i], d.members[i+1:]...)
			break
		}
	}
	// A lone member's buffered, unsent events are not lost: the cursor goes back to what was
	// actually sent (the real server loses them, docs/kubemq.md 5.3).
	if len(d.members) == 0 && m.sent < d.cursor && sub.Group == "" {
		d.cursor = m.sent
	}
	d.mu.Unlock()
	close(m.gone)
	s.saveCursor(d)
	return err
}

func (s *Server) serveMember(stream grpc.ServerStreamingServer[kubemqpb.EventReceive], m *storeMember) error {
	ctx := stream.Context()
	for {
		select {
		case e := <-m.out:
			if err := stream.Send(e); err != nil {
				return err
			}
			m.sent = e.Sequence
		case err := <-m.fail:
			return err
		case <-ctx.Done():
			return nil
		case <-s.ctx.Done():
			return errShutdown()
		}
	}
}

// subscribed sends the response headers as soon as a subscription is registered, so a client can
// tell a live subscription (headers arrive) from a refused one (the stream ends with an error)
// before any event flows. The real server sends them with the first event.
func subscribed(stream grpc.ServerStream) {
	_ = stream.SendHeader(metadata.Pairs("kubemq-subscribed", "1"))
}
