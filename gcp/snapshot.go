package gcp

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/kubemq-io/kubemq-proxy/delivery"
	"github.com/kubemq-io/kubemq-proxy/gcp/names"
	"github.com/kubemq-io/kubemq-proxy/kubemqclient"
)

// Snapshots.
//
// A snapshot is a registry record (kindSnapshot, keyed by id) holding:
// the topic incarnation it belongs to; the last sequence of the topic log
// when it was taken (everything after it belongs to the snapshot); the
// publish time of the oldest message it holds; and the name of an
// events-store channel that lists the ids of the messages the subscription
// had not acknowledged then (waiting or leased), a few thousand ids per
// event. Message bodies stay in the topic log only; the proxy reads the id
// list into memory during a Seek, never the messages.
//
// Taking a snapshot reads the subscription's queue, so it runs on the
// replica that consumes the subscription, like Seek, and it leaves the
// subscribers alone: their streams and Pulls go on, and every message out
// to a client stays leased to it. The delivery engine's reads stand still
// meanwhile (delivery.Consumer.Pause), since only one transaction may be
// open on a queue (docs/kubemq.md 8.8): the ids of what the engine holds
// (buffered, out, nacked and waiting out a delay) are listed first, then
// the queue is moved to a holding queue and back, in order, and the ids
// are listed on the way. Messages published while the queue is moved back
// may come out ahead of the backlog. Messages waiting out a retry backoff
// in KubeMQ's delay channel, and those whose only copy is the lease record
// of a crashed replica, are not seen and are not part of the snapshot.
// Delivery attempts counted by KubeMQ start again after the move.
//
// Seek to a snapshot empties the subscription as Seek to a time does,
// then reads the topic log from the oldest captured message on and
// enqueues, through the seeking subscription's filter and in log order,
// every listed message and every message after the recorded position.

// kindSnapshot is the registry kind of snapshots; the key is the id.
const kindSnapshot = "gcp.snapshot"

// Channel prefixes of a snapshot's id list (events store) and of a
// subscription's holding queue while a snapshot is taken.
const (
	snapIDsPrefix  = "gcp.snapids"
	snapHoldPrefix = "gcp.snaphold"
)

// Google's rules: a snapshot lives 7 days from the publish time of the
// oldest message it holds; one that would live less than an hour is
// refused.
const (
	snapshotLifetime = 7 * 24 * time.Hour
	snapshotMinLife  = time.Hour
	snapIDsPerEvent  = 4000
)

// snapRecord is the stored form of a snapshot.
type snapRecord struct {
	UID      string            `json:"uid"`
	TopicID  string            `json:"topic_id"`
	TopicUID string            `json:"topic_uid"`
	SubID    string            `json:"subscription_id"`
	Labels   map[string]string `json:"labels,omitempty"`
	Created  time.Time         `json:"created"`
	Expire   time.Time         `json:"expire"`
	// MaxExpire is the latest expire time UpdateSnapshot may set.
	MaxExpire time.Time `json:"max_expire"`
	// Oldest is the publish time of the oldest captured message (Created
	// when none was captured): a Seek reads the topic log from there.
	Oldest time.Time `json:"oldest"`
	// LogSeq is the last event of the topic log when the snapshot was
	// taken (0: the log was empty); later events all belong to it.
	LogSeq uint64 `json:"log_seq"`
	// IDs is the events-store channel listing the captured message ids
	// (Events of them, Count in all).
	IDs    string `json:"ids"`
	Events uint64 `json:"events"`
	Count  int    `json:"count"`
}

type snapEntry struct {
	id  string
	rec snapRecord
}

func (c *catalog) applySnapshotLocked(r record) {
	if r.Deleted {
		delete(c.snaps, r.Key)
		return
	}
	var rec snapRecord
	if err := json.Unmarshal(r.Value, &rec); err != nil {
		c.log.Error("undecodable snapshot record; ignored", zap.String("snapshot", r.Key), zap.Error(err))
		return
	}
	c.snaps[r.Key] = &snapEntry{id: r.Key, rec: rec}
}

// snapshot returns a live (unexpired) snapshot.
func (c *catalog) snapshot(id string, now time.Time) (*snapEntry, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	e, ok := c.snaps[id]
	if !ok || !now.Before(e.rec.Expire) {
		return nil, false
	}
	return e, true
}

// snapshotIDs lists the live snapshots, sorted; of topic only when topic
// is not "".
func (c *catalog) snapshotIDs(now time.Time, topic string) []string {
	c.mu.RLock()
	var ids []string
	for id, e := range c.snaps {
		if now.Before(e.rec.Expire) && (topic == "" || e.rec.TopicID == topic) {
			if t, ok := c.topics[e.rec.TopicID]; topic == "" || ok && t.uid == e.rec.TopicUID {
				ids = append(ids, id)
			}
		}
	}
	c.mu.RUnlock()
	slices.Sort(ids)
	return ids
}

// renderSnapshot is the snapshot as the caller sees it.
func (s *Server) renderSnapshot(e *snapEntry, project string) *pubsubpb.Snapshot {
	out := &pubsubpb.Snapshot{
		Name:       names.SnapshotName{Project: project, ID: e.id}.String(),
		Topic:      names.DeletedTopic,
		ExpireTime: timestamppb.New(e.rec.Expire),
		Labels:     e.rec.Labels,
	}
	if t, ok := s.cat.topic(e.rec.TopicID); ok && t.uid == e.rec.TopicUID {
		out.Topic = names.TopicName{Project: project, ID: e.rec.TopicID}.String()
	}
	return out
}

// newSnapshotID names a snapshot the caller left unnamed.
func newSnapshotID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "snapshot-" + hex.EncodeToString(b[:])
}

func (p *subscriber) CreateSnapshot(ctx context.Context, req *pubsubpb.CreateSnapshotRequest) (*pubsubpb.Snapshot, error) {
	subn, err := names.ParseSubscription(req.GetSubscription())
	if err != nil {
		return nil, err
	}
	var sn names.SnapshotName
	if req.GetName() == "" {
		sn = names.SnapshotName{Project: subn.Project, ID: newSnapshotID()}
	} else if sn, err = names.ParseSnapshot(req.GetName()); err != nil {
		return nil, err
	}
	s := p.s
	if _, ok := s.cat.snapshot(sn.ID, time.Now()); ok {
		return nil, alreadyExists(sn.ID)
	}
	e, ok := s.findSub(ctx, subn.ID)
	if !ok {
		return nil, notFound(subn.ID)
	}
	if e.proto.GetDetached() || !s.cat.attached(e) {
		return nil, status.Errorf(codes.FailedPrecondition, "Subscription %s is detached or its topic is deleted.", subn.ID)
	}
	// The replica that consumes the subscription reads its queue.
	if sc, ok, err := s.remote(ctx, e.queue); err != nil || ok {
		if err != nil {
			return nil, err
		}
		return sc.CreateSnapshot(ctx, req)
	}
	uid := newUID()
	rec, err := s.capture(ctx, e, uid)
	if err != nil {
		return nil, toStatus(err)
	}
	rec.SubID, rec.Labels = e.id, req.GetLabels()
	if time.Until(rec.Expire) < snapshotMinLife {
		return nil, status.Errorf(codes.FailedPrecondition,
			"The subscription's backlog is too old: a snapshot of it would expire at %s, in less than an hour.", rec.Expire.Format(time.RFC3339))
	}
	s.adminMu.Lock()
	defer s.adminMu.Unlock()
	if _, ok := s.cat.snapshot(sn.ID, time.Now()); ok {
		return nil, alreadyExists(sn.ID)
	}
	if err := s.topo.Put(ctx, kindSnapshot, sn.ID, rec); err != nil {
		return nil, toStatus(err)
	}
	got, ok := s.cat.snapshot(sn.ID, time.Now())
	if !ok {
		return nil, toStatus(errNotApplied)
	}
	s.log.Info("snapshot created", zap.String("snapshot", sn.ID), zap.String("subscription", e.id), zap.Int("messages", rec.Count))
	return s.renderSnapshot(got, sn.Project), nil
}

// capture takes the snapshot of e (see the top of this file).
func (s *Server) capture(ctx context.Context, e *subEntry, uid string) (snapRecord, error) {
	rec := snapRecord{UID: uid, TopicID: e.topicID, TopicUID: e.topicUID, Created: time.Now(),
		IDs: kubemqclient.Channel(snapIDsPrefix, e.id, uid)}
	// Seeks of the subscription wait; its pulls go on.
	end, err := s.beginExclusive(ctx, e.id, false)
	if err != nil {
		return rec, err
	}
	defer end()
	h, err := s.deliveries.Acquire(ctx, e.queue)
	if err != nil {
		if errors.Is(err, delivery.ErrNotOwner) || errors.Is(err, delivery.ErrClosed) {
			return rec, status.Errorf(codes.Unavailable, "Subscription %s is being handed over between replicas; retry.", e.id)
		}
		return rec, err
	}
	defer h.Close()
	resume, err := h.Consumer().Pause(ctx)
	if err != nil {
		return rec, err
	}
	defer resume()
	last, ok, err := s.be.lastLogEvent(ctx, topicChannel(e.topicID))
	if err != nil {
		return rec, err
	}
	if ok {
		rec.LogSeq = last.Sequence
	}
	// Copies of publishes begun before the position was taken are in the
	// queue before it is read.
	if err := s.pubs.wait(ctx); err != nil {
		return rec, err
	}
	oldest := rec.Created
	var chunk []string
	flush := func() error {
		if len(chunk) == 0 {
			return nil
		}
		err := s.be.appendLog(ctx, []kubemqclient.Event{{Channel: rec.IDs, Metadata: "snapshot-ids", Body: []byte(strings.Join(chunk, "\n"))}})
		rec.Events++
		chunk = chunk[:0]
		return err
	}
	add := func(id string, tags map[string]string) error {
		if pt, err := time.Parse(time.RFC3339Nano, tags[TagPublishTime]); err == nil && pt.Before(oldest) {
			oldest = pt
		}
		chunk = append(chunk, id)
		rec.Count++
		if len(chunk) == snapIDsPerEvent {
			return flush()
		}
		return nil
	}
	// What the engine holds, first: a lease settled from now on is still
	// in the snapshot, and a redelivery copy the engine stores in the queue
	// meanwhile is listed here, so it is skipped below.
	type held struct {
		id   string
		tags map[string]string
	}
	var leased []held
	h.Consumer().LeasedMessages(func(m *delivery.Message) {
		if id := m.Tags[TagMessageID]; id != "" {
			leased = append(leased, held{id, m.Tags})
		}
	})
	listed := make(map[string]struct{}, len(leased))
	for _, l := range leased {
		if _, dup := listed[l.id]; dup {
			continue
		}
		listed[l.id] = struct{}{}
		if err := add(l.id, l.tags); err != nil {
			return rec, err
		}
	}
	hold := kubemqclient.Channel(snapHoldPrefix, e.id, e.uid)
	// A capture that failed half-way (or a crash) may have left messages
	// in the holding queue: they go back first.
	if _, err := s.be.move(ctx, hold, e.queue, nil, nil); err != nil {
		return rec, err
	}
	// A copy the engine has taken already, handed to this reader again because the server had
	// not yet applied the engine's acknowledgement (docs/kubemq.md 8.8), is dropped: moved back,
	// the engine would deliver it a second time.
	taken := h.Consumer().Taken(takenWindow)
	_, err = s.be.move(ctx, e.queue, hold, func(m *kubemqclient.QueueMessage) (bool, error) {
		if taken(m.Attributes.Sequence) {
			s.log.Debug("snapshot: dropped a copy the engine had taken", zap.String("subscription", e.id),
				zap.Uint64("sequence", m.Attributes.Sequence))
			return false, nil
		}
		id := m.Tags[TagMessageID]
		if id == "" || isLeaseRecord(m.Tags) {
			return true, nil // native messages and lease records are moved, not captured
		}
		if _, ok := listed[id]; ok {
			return true, nil
		}
		return true, add(id, m.Tags)
	}, h.Consumer().NoteTaken) // the engine drops copies of them KubeMQ hands out again
	if err == nil {
		err = flush()
	}
	// Back, whatever happened, so the subscription keeps its backlog.
	if _, berr := s.be.move(context.WithoutCancel(ctx), hold, e.queue, nil, nil); berr != nil && err == nil {
		err = berr
	}
	if err != nil {
		return rec, err
	}
	rec.Oldest = oldest
	rec.MaxExpire = oldest.Add(snapshotLifetime)
	rec.Expire = rec.MaxExpire
	return rec, nil
}

// takenWindow is how far back a capture looks for batches the engine took (delivery.Consumer.Taken):
// the real KubeMQ was seen to hand out a copy whose acknowledgement was pending up to 15 s
// after the first delivery (docs/kubemq.md 8.8).
const takenWindow = 30 * time.Second

// isLeaseRecord reports whether tags are those of a lease engine record
// or sentinel (a redelivered copy has engine tags too, and is captured).
func isLeaseRecord(tags map[string]string) bool {
	_, rec := tags[delivery.TagRecord]
	_, sen := tags[delivery.TagSentinel]
	return rec || sen
}

func (p *subscriber) GetSnapshot(ctx context.Context, req *pubsubpb.GetSnapshotRequest) (*pubsubpb.Snapshot, error) {
	sn, err := names.ParseSnapshot(req.GetSnapshot())
	if err != nil {
		return nil, err
	}
	e, ok := p.s.findSnapshot(ctx, sn.ID)
	if !ok {
		return nil, notFound(sn.ID)
	}
	return p.s.renderSnapshot(e, sn.Project), nil
}

func (p *subscriber) ListSnapshots(ctx context.Context, req *pubsubpb.ListSnapshotsRequest) (*pubsubpb.ListSnapshotsResponse, error) {
	proj, err := names.ParseProject(req.GetProject())
	if err != nil {
		return nil, err
	}
	now := time.Now()
	ids, next, err := page(p.s.cat.snapshotIDs(now, ""), req.GetPageSize(), req.GetPageToken())
	if err != nil {
		return nil, err
	}
	resp := &pubsubpb.ListSnapshotsResponse{NextPageToken: next}
	for _, id := range ids {
		if e, ok := p.s.cat.snapshot(id, now); ok {
			resp.Snapshots = append(resp.Snapshots, p.s.renderSnapshot(e, proj.ID))
		}
	}
	return resp, nil
}

// ListTopicSnapshots is served by the Publisher service.
func (p *publisher) ListTopicSnapshots(ctx context.Context, req *pubsubpb.ListTopicSnapshotsRequest) (*pubsubpb.ListTopicSnapshotsResponse, error) {
	tn, err := names.ParseTopic(req.GetTopic())
	if err != nil {
		return nil, err
	}
	if _, ok := p.s.findTopic(ctx, tn.ID); !ok {
		return nil, notFound(tn.ID)
	}
	ids, next, err := page(p.s.cat.snapshotIDs(time.Now(), tn.ID), req.GetPageSize(), req.GetPageToken())
	if err != nil {
		return nil, err
	}
	resp := &pubsubpb.ListTopicSnapshotsResponse{NextPageToken: next}
	for _, id := range ids {
		resp.Snapshots = append(resp.Snapshots, names.SnapshotName{Project: tn.Project, ID: id}.String())
	}
	return resp, nil
}

func (p *subscriber) UpdateSnapshot(ctx context.Context, req *pubsubpb.UpdateSnapshotRequest) (*pubsubpb.Snapshot, error) {
	if req.GetSnapshot() == nil {
		return nil, invalidArgf("The snapshot field is required.")
	}
	sn, err := names.ParseSnapshot(req.GetSnapshot().GetName())
	if err != nil {
		return nil, err
	}
	paths := req.GetUpdateMask().GetPaths()
	if len(paths) == 0 {
		return nil, invalidArgf("The update_mask in the UpdateSnapshotRequest must be set.")
	}
	in := req.GetSnapshot()
	for _, path := range paths {
		switch path {
		case "labels":
		case "expire_time":
			if in.GetExpireTime() == nil {
				return nil, invalidArgf("expire_time is named in the update_mask but not set.")
			}
			if err := in.GetExpireTime().CheckValid(); err != nil {
				return nil, invalidArgf("Invalid expire_time: %v.", err)
			}
		default:
			return nil, invalidArgf("Invalid update_mask provided in the UpdateSnapshotRequest: the '%s' field is not updatable.", path)
		}
	}
	s := p.s
	s.adminMu.Lock()
	defer s.adminMu.Unlock()
	now := time.Now()
	e, ok := s.findSnapshot(ctx, sn.ID)
	if !ok {
		return nil, notFound(sn.ID)
	}
	rec := e.rec
	for _, path := range paths {
		switch path {
		case "labels":
			rec.Labels = in.GetLabels()
		case "expire_time":
			t := in.GetExpireTime().AsTime()
			if !t.After(now) || t.After(rec.MaxExpire) {
				return nil, invalidArgf("Invalid expire_time %s: it must be in the future and no later than %s (7 days after the publish time of the oldest message the snapshot holds).",
					t.Format(time.RFC3339Nano), rec.MaxExpire.Format(time.RFC3339Nano))
			}
			rec.Expire = t
		}
	}
	if err := s.topo.Put(ctx, kindSnapshot, sn.ID, rec); err != nil {
		return nil, toStatus(err)
	}
	got, ok := s.cat.snapshot(sn.ID, time.Now())
	if !ok {
		return nil, toStatus(errNotApplied)
	}
	return s.renderSnapshot(got, sn.Project), nil
}

// DeleteSnapshot removes the record; the id list ages out with KubeMQ's
// events-store retention.
func (p *subscriber) DeleteSnapshot(ctx context.Context, req *pubsubpb.DeleteSnapshotRequest) (*emptypb.Empty, error) {
	sn, err := names.ParseSnapshot(req.GetSnapshot())
	if err != nil {
		return nil, err
	}
	s := p.s
	s.adminMu.Lock()
	defer s.adminMu.Unlock()
	if _, ok := s.findSnapshot(ctx, sn.ID); !ok {
		return nil, notFound(sn.ID)
	}
	if err := s.topo.Delete(ctx, kindSnapshot, sn.ID); err != nil {
		return nil, toStatus(err)
	}
	return &emptypb.Empty{}, nil
}

// errSnapshotTopic: Seek to a snapshot of another topic.
var errSnapshotTopic = errors.New("snapshot of another topic")

// snapshotTarget resolves a Seek's snapshot for subscription e.
func (s *Server) snapshotTarget(e *subEntry, name string) (*snapEntry, error) {
	sn, err := names.ParseSnapshot(name)
	if err != nil {
		return nil, err
	}
	se, ok := s.cat.snapshot(sn.ID, time.Now())
	if !ok {
		return nil, notFound(sn.ID)
	}
	if se.rec.TopicID != e.topicID || se.rec.TopicUID != e.topicUID {
		return nil, invalidArgf("The snapshot %s is of another topic than the subscription %s: a subscription can only seek to a snapshot of its own topic.", sn.ID, e.id)
	}
	return se, nil
}

// readSnapshotIDs reads a snapshot's id list.
func (s *Server) readSnapshotIDs(ctx context.Context, rec snapRecord) (map[string]struct{}, error) {
	ids := make(map[string]struct{}, rec.Count)
	if rec.Events == 0 {
		return ids, nil
	}
	n, read := uint64(0), 0
	err := s.be.readAll(ctx, rec.IDs, rec.Events, func(evs []kubemqclient.EventReceive) error {
		for _, ev := range evs {
			n++
			for _, id := range strings.Split(string(ev.Body), "\n") {
				ids[id] = struct{}{}
				read++
			}
		}
		return nil
	})
	// Count is of the ids listed: a message the queue held twice (a copy
	// stored twice) is listed twice.
	if err == nil && (n < rec.Events || read < rec.Count) {
		err = status.Errorf(codes.FailedPrecondition, "The snapshot's message list is no longer retained by KubeMQ (%d of %d ids read).", read, rec.Count)
	}
	return ids, err
}

// seekSnapshot makes exactly the snapshot's messages deliverable again on
// e, through e's filter, in log order.
func (s *Server) seekSnapshot(ctx context.Context, e *subEntry, se *snapEntry) (int, error) {
	rec := se.rec
	ids, err := s.readSnapshotIDs(ctx, rec)
	if err != nil {
		return 0, err
	}
	// The log is read from a little before the oldest message: another
	// replica's clock may be behind; keep decides by position and id.
	return s.seekReplay(ctx, e, rec.Oldest.Add(-time.Minute), func(ev *kubemqclient.EventReceive, id string) bool {
		if rec.LogSeq == 0 || ev.Sequence > rec.LogSeq {
			return true
		}
		_, ok := ids[id]
		return ok
	})
}
