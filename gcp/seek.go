package gcp

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/kubemq-io/kubemq-proxy/gcp/names"
	"github.com/kubemq-io/kubemq-proxy/kubemqclient"
)

// Seek to a time: the subscription's backlog and leases are given up (the
// messages count as acknowledged, outstanding ack ids become stale), and
// every message the topic log holds with a publish time at or after the
// target is enqueued again, through the subscription's filter, in log
// order. A target not in the past only empties the subscription; one older
// than KubeMQ's retention replays what is retained. Seek to a snapshot
// goes the same way with the snapshot's messages (snapshot.go).

// errSeeked ends the runtime a seek replaced: its streams and Pulls end
// with UNAVAILABLE and the clients pull again from the new backlog.
var errSeeked = errors.New("subscription seeked")

// Seek implements Subscriber.Seek.
func (p *subscriber) Seek(ctx context.Context, req *pubsubpb.SeekRequest) (*pubsubpb.SeekResponse, error) {
	sn, err := names.ParseSubscription(req.GetSubscription())
	if err != nil {
		return nil, err
	}
	ts := req.GetTime()
	if req.GetSnapshot() == "" {
		if ts == nil {
			return nil, invalidArgf("A seek target is required: a time or a snapshot.")
		}
		if err := ts.CheckValid(); err != nil {
			return nil, invalidArgf("Invalid seek time: %v.", err)
		}
	}
	s := p.s
	e, ok := s.findSub(ctx, sn.ID)
	if !ok {
		return nil, notFound(sn.ID)
	}
	if e.proto.GetDetached() {
		return nil, status.Errorf(codes.FailedPrecondition, "Subscription %s is detached.", sn.ID)
	}
	var snap *snapEntry
	if req.GetSnapshot() != "" {
		if snap, err = s.snapshotTarget(e, req.GetSnapshot()); err != nil {
			return nil, err
		}
	}
	// The replica that consumes the subscription gives up its leases and backlog.
	if sc, ok, err := s.remote(ctx, e.queue); err != nil || ok {
		if err != nil {
			return nil, err
		}
		return sc.Seek(ctx, req)
	}
	if snap != nil {
		n, err := s.seekSnapshot(ctx, e, snap)
		if err != nil {
			return nil, toStatus(err)
		}
		s.log.Info("subscription seeked", zap.String("subscription", sn.ID), zap.String("snapshot", snap.id), zap.Int("replayed", n))
		return &pubsubpb.SeekResponse{}, nil
	}
	n, err := s.seek(ctx, e, ts.AsTime())
	if err != nil {
		return nil, toStatus(err)
	}
	s.log.Info("subscription seeked", zap.String("subscription", sn.ID), zap.Time("time", ts.AsTime()), zap.Int("replayed", n))
	return &pubsubpb.SeekResponse{}, nil
}

// seek empties e (leases and backlog) and replays its topic's log from
// target; it reports how many messages it enqueued. Pulls and streams of e
// wait meanwhile; seeks of one subscription run one at a time.
func (s *Server) seek(ctx context.Context, e *subEntry, target time.Time) (int, error) {
	if !target.Before(time.Now()) {
		return s.seekReplay(ctx, e, time.Time{}, nil)
	}
	return s.seekReplay(ctx, e, target, func(_ *kubemqclient.EventReceive, _ string) bool { return true })
}

// seekReplay empties e (leases and backlog) and, unless keep is nil,
// replays the events of its topic's log published at or after from that
// keep accepts.
func (s *Server) seekReplay(ctx context.Context, e *subEntry, target time.Time, keep func(ev *kubemqclient.EventReceive, id string) bool) (int, error) {
	end, err := s.beginSeek(ctx, e.id)
	if err != nil {
		return 0, err
	}
	defer end()
	s.rtMu.Lock()
	r := s.takeRuntimeLocked(e.id, e.uid)
	s.rtMu.Unlock()
	if r != nil {
		r.end(errSeeked) // its leases are settled as consumed
	}
	// What the engine fetched but never handed out goes back to the queue
	// before the purge, rather than out to the next runtime.
	if !s.deliveries.Retire(e.queue) {
		s.log.Warn("seek: the subscription's queue is still in use here; messages it buffered may be delivered after the seek",
			zap.String("subscription", e.id))
	}
	if err := s.resetAcked(ctx, e); err != nil { // exactly-once (eod.go)
		return 0, err
	}
	if err := s.be.purge(ctx, e.queue); err != nil {
		return 0, err
	}
	// A publish that began before the purge ended may have had its copy
	// purged while its log event was still on its way: the replay must
	// reach that event, so it starts once they are all written. (Another
	// replica's publishes are not seen here.)
	if err := s.pubs.wait(ctx); err != nil {
		return 0, err
	}
	if keep == nil || !s.cat.attached(e) {
		// Nothing published yet is at or after target; or the topic is
		// gone (its log may belong to a newer topic of the same name).
		return 0, nil
	}
	n, err := s.replay(ctx, e, target, keep)
	if cur, ok := s.cat.sub(e.id); err == nil && (!ok || cur.uid != e.uid) {
		// Deleted (or re-created) meanwhile: nobody will read what was
		// replayed into this incarnation's queue.
		return 0, s.be.purge(ctx, e.queue)
	}
	return n, err
}

// beginSeek marks id as being seeked (after any seek or capture of it
// already running): its pulls wait until end clears the mark.
func (s *Server) beginSeek(ctx context.Context, id string) (end func(), err error) {
	return s.beginExclusive(ctx, id, true)
}

// beginExclusive waits for any seek or snapshot capture of id to end and
// marks id as being seeked (pulls true: new pulls wait) or captured
// (pulls go on); end clears the mark.
func (s *Server) beginExclusive(ctx context.Context, id string, pulls bool) (end func(), err error) {
	for {
		s.rtMu.Lock()
		busy := s.seeking[id]
		if busy == nil {
			busy = s.capturing[id]
		}
		if busy == nil {
			ch := make(chan struct{})
			marks := s.capturing
			if pulls {
				marks = s.seeking
			}
			marks[id] = ch
			s.rtMu.Unlock()
			return func() {
				s.rtMu.Lock()
				delete(marks, id)
				s.rtMu.Unlock()
				close(ch)
			}, nil
		}
		s.rtMu.Unlock()
		select {
		case <-busy:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// replay enqueues into e's queue the messages of its topic's log published
// at or after from that pass its filter, up to the log's last event when
// the replay starts. Events without the reserved tags (written natively to
// the log) are skipped, as publishing them would not have fanned them out.
func (s *Server) replay(ctx context.Context, e *subEntry, from time.Time, keep func(ev *kubemqclient.EventReceive, id string) bool) (int, error) {
	n := 0
	err := s.be.readLog(ctx, topicChannel(e.topicID), from, func(evs []kubemqclient.EventReceive) error {
		msgs := make([]kubemqclient.QueueMessage, 0, len(evs))
		for i := range evs {
			ev := &evs[i]
			id := ev.Tags[TagMessageID]
			pt, err := time.Parse(time.RFC3339Nano, ev.Tags[TagPublishTime])
			if id == "" || err != nil || pt.Before(from) || !keep(ev, id) {
				continue
			}
			if e.match != nil && !e.match(attributesOf(ev.Tags)) {
				continue
			}
			msgs = append(msgs, subscriptionCopy(e.queue, id, ev.Body, ev.Tags))
		}
		if err := s.be.enqueue(ctx, msgs); err != nil {
			return fmt.Errorf("seek: enqueue replayed messages: %w", err)
		}
		n += len(msgs)
		return nil
	})
	return n, err
}

// inflight tracks the publishes in progress on this server.
type inflight struct {
	mu     sync.Mutex
	next   uint64
	active map[uint64]chan struct{}
}

// begin registers a publish; done ends it.
func (f *inflight) begin() (done func()) {
	f.mu.Lock()
	if f.active == nil {
		f.active = map[uint64]chan struct{}{}
	}
	f.next++
	id, ch := f.next, make(chan struct{})
	f.active[id] = ch
	f.mu.Unlock()
	return func() {
		f.mu.Lock()
		delete(f.active, id)
		f.mu.Unlock()
		close(ch)
	}
}

// wait returns when every publish in progress when it was called has
// ended, or ctx does.
func (f *inflight) wait(ctx context.Context) error {
	f.mu.Lock()
	chs := make([]chan struct{}, 0, len(f.active))
	for _, ch := range f.active {
		chs = append(chs, ch)
	}
	f.mu.Unlock()
	for _, ch := range chs {
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// attributesOf is a stored message's Pub/Sub attributes: its tags without
// the reserved ones.
func attributesOf(tags map[string]string) map[string]string {
	attrs := make(map[string]string, len(tags))
	for k, v := range tags {
		if !isReservedTag(k) {
			attrs[k] = v
		}
	}
	return attrs
}
