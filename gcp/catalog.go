package gcp

import (
	"context"
	"encoding/json"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/kubemq-io/kubemq-proxy/kubemqclient"
	"github.com/kubemq-io/kubemq-proxy/registry"
)

// Registry kinds of the records this package owns. The key is the
// resource id (ids are global across projects).
const (
	kindTopic        = "gcp.topic"
	kindSubscription = "gcp.subscription"
)

// Channel prefixes: topic t is the events-store log "gcp.{t}",
// subscription s the queue "gcp.sub.{s}". A subscription created again
// under an id whose queue KubeMQ already knows gets a queue of its own,
// "gcp.sub.{s}.{uid}" (subIncarnationChannel): lease records, delayed
// redeliveries and a lingering consumer of the old incarnation can then
// never put its messages into the new one. The record keeps the name.
const (
	topicPrefix = "gcp"
	subPrefix   = "gcp.sub"
)

func topicChannel(id string) string { return kubemqclient.Channel(topicPrefix, id) }
func subChannel(id string) string   { return kubemqclient.Channel(subPrefix, id) }
func subIncarnationChannel(id, uid string) string {
	return kubemqclient.Channel(subPrefix, id, uid)
}

// record is one registry entry as the catalog sees it.
type record struct {
	Key     string
	Value   json.RawMessage
	Deleted bool
}

// topology is the durable, replicated record store (the registry). Put and
// Delete return once the write is durable and applied locally, so a read
// right after sees it.
type topology interface {
	Put(ctx context.Context, kind, key string, value any) error
	Delete(ctx context.Context, kind, key string) error
	// putIf is Put only if the record is still the one base names
	// (compare-and-set across replicas); registry.ErrConflict otherwise.
	putIf(ctx context.Context, kind, key string, value any, base registry.Base) error
	// baseOf names the record's current version, for putIf.
	baseOf(kind, key string) registry.Base
	list(kind string) []record
	// watch calls fn for every applied change; fn must not block.
	watch(fn func(kind string, r record)) (cancel func())
	// catchUp returns once every write the topology held when it was
	// called (any replica's) has been applied here (registry.CatchUp).
	catchUp(ctx context.Context) error
}

// topicRecord is the stored form of a topic. UID names this incarnation:
// subscriptions bind to it, so a topic deleted and created again under the
// same id never re-attaches the old subscriptions (Google's rule).
type topicRecord struct {
	UID   string          `json:"uid"`
	Topic json.RawMessage `json:"topic"` // protojson of pubsubpb.Topic
	// SchemaUID is the incarnation of the schema its schema_settings name
	// (schemacatalog.go): one deleted and created again under the same id
	// is not the topic's schema any more, as on Google.
	SchemaUID string `json:"schema_uid,omitempty"`
}

// subRecord is the stored form of a subscription.
type subRecord struct {
	UID      string          `json:"uid"`
	TopicID  string          `json:"topic_id"`
	TopicUID string          `json:"topic_uid"`
	Sub      json.RawMessage `json:"subscription"` // protojson of pubsubpb.Subscription
	// Queue is the KubeMQ queue of this incarnation; empty in records
	// written before it existed, which use subChannel(id).
	Queue string `json:"queue,omitempty"`
}

// topicEntry and subEntry are immutable once built: an update replaces the
// entry, so readers may keep one after the catalog lock is released.
type topicEntry struct {
	id        string
	uid       string
	proto     *pubsubpb.Topic
	schemaUID string
}

type subEntry struct {
	id       string
	uid      string
	topicID  string
	topicUID string
	proto    *pubsubpb.Subscription
	match    matcher // nil: every message
	queue    string

	badFilter error // the stored filter no longer compiles
}

// catalog is the in-memory view of the topology records, rebuilt from the
// registry and kept current by its change feed.
type catalog struct {
	log *zap.Logger
	// onSubGone is called (under the catalog lock; it must not block) when
	// a subscription is deleted, detached or replaced by a new incarnation.
	onSubGone func(id, uid string) // uid: the incarnation that is gone

	mu        sync.RWMutex // guards the maps below
	topics    map[string]*topicEntry
	subs      map[string]*subEntry
	byTopic   map[string]map[string]*subEntry // topic id -> subscriptions naming it, any incarnation
	schemas   map[string]*schemaEntry         // schema id -> schema (schemacatalog.go)
	revisions map[string]*revEntry            // "{schema}@{revision}" -> definition
	iam       map[string]*iamEntry            // "topics/t", "subscriptions/s", "schemas/x" -> policy (iam.go)
	snaps     map[string]*snapEntry           // snapshot id -> snapshot (snapshot.go)
}

func newCatalog(log *zap.Logger) *catalog {
	return &catalog{
		log:     log,
		topics:  map[string]*topicEntry{},
		subs:    map[string]*subEntry{},
		byTopic: map[string]map[string]*subEntry{},

		schemas:   map[string]*schemaEntry{},
		revisions: map[string]*revEntry{},
		iam:       map[string]*iamEntry{},
		snaps:     map[string]*snapEntry{},
	}
}

// follow loads every record and applies later changes. The initial load
// runs under the catalog lock, so a change that arrives meanwhile waits
// and is applied after the (possibly older) listed value.
func (c *catalog) follow(t topology) (cancel func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	cancel = t.watch(func(kind string, r record) {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.applyLocked(kind, r)
	})
	for _, kind := range []string{kindTopic, kindSubscription, kindSchema, kindSchemaRevision, kindIAM, kindSnapshot} {
		for _, r := range t.list(kind) {
			c.applyLocked(kind, r)
		}
	}
	return cancel
}

func (c *catalog) applyLocked(kind string, r record) {
	switch kind {
	case kindIAM:
		c.applyIAMLocked(r)
	case kindSnapshot:
		c.applySnapshotLocked(r)
	case kindSchema:
		c.applySchemaLocked(r)
	case kindSchemaRevision:
		c.applySchemaRevisionLocked(r)
	case kindTopic:
		if r.Deleted {
			delete(c.topics, r.Key)
			return
		}
		e, err := decodeTopic(r.Key, r.Value)
		if err != nil {
			c.log.Error("undecodable topic record; ignored", zap.String("topic", r.Key), zap.Error(err))
			return
		}
		c.topics[r.Key] = e
	case kindSubscription:
		old, had := c.subs[r.Key]
		defer func() {
			if !had || c.onSubGone == nil {
				return
			}
			if cur, ok := c.subs[r.Key]; !ok || cur.uid != old.uid || (cur.proto.GetDetached() && !old.proto.GetDetached()) {
				c.onSubGone(r.Key, old.uid)
			}
		}()
		if had {
			delete(c.byTopic[old.topicID], r.Key)
			if len(c.byTopic[old.topicID]) == 0 {
				delete(c.byTopic, old.topicID)
			}
			delete(c.subs, r.Key)
		}
		if r.Deleted {
			return
		}
		e, err := decodeSub(r.Key, r.Value)
		if err != nil {
			c.log.Error("undecodable subscription record; ignored", zap.String("subscription", r.Key), zap.Error(err))
			return
		}
		if e.badFilter != nil {
			c.log.Error("stored filter does not compile; the subscription receives every message",
				zap.String("subscription", r.Key), zap.Error(e.badFilter))
		}
		c.subs[r.Key] = e
		m := c.byTopic[e.topicID]
		if m == nil {
			m = map[string]*subEntry{}
			c.byTopic[e.topicID] = m
		}
		m[r.Key] = e
	}
}

func decodeTopic(key string, raw json.RawMessage) (*topicEntry, error) {
	var rec topicRecord
	if err := json.Unmarshal(raw, &rec); err != nil {
		return nil, err
	}
	t := &pubsubpb.Topic{}
	if err := protojson.Unmarshal(rec.Topic, t); err != nil {
		return nil, err
	}
	return &topicEntry{id: key, uid: rec.UID, proto: t, schemaUID: rec.SchemaUID}, nil
}

func decodeSub(key string, raw json.RawMessage) (*subEntry, error) {
	var rec subRecord
	if err := json.Unmarshal(raw, &rec); err != nil {
		return nil, err
	}
	s := &pubsubpb.Subscription{}
	if err := protojson.Unmarshal(rec.Sub, s); err != nil {
		return nil, err
	}
	e := &subEntry{id: key, uid: rec.UID, topicID: rec.TopicID, topicUID: rec.TopicUID, proto: s, queue: rec.Queue}
	if e.queue == "" {
		e.queue = subChannel(key)
	}
	if s.Filter != "" {
		m, err := compileFilter(s.Filter)
		if err != nil {
			// Validated at create; a record that no longer parses (a
			// stricter parser after an upgrade) must not drop messages
			// silently, so it matches everything and says so.
			e.badFilter = err
		}
		e.match = m
	}
	return e, nil
}

func encodeTopic(uid string, t *pubsubpb.Topic, schemaUID string) (topicRecord, error) {
	raw, err := protojson.Marshal(t)
	return topicRecord{UID: uid, Topic: raw, SchemaUID: schemaUID}, err
}

func encodeSub(e *subEntry) (subRecord, error) {
	raw, err := protojson.Marshal(e.proto)
	return subRecord{UID: e.uid, TopicID: e.topicID, TopicUID: e.topicUID, Sub: raw, Queue: e.queue}, err
}

// catchUpWait bounds a wait for the registry log (caughtUp).
const catchUpWait = 5 * time.Second

// caughtUp reports, after a lookup of a topic, subscription or snapshot
// an RPC names found nothing, whether looking again may find it: with
// replicas, a create through another replica a moment ago reaches this
// one through the registry log, so this replica first applies every write
// the log holds now (one KubeMQ subscription round trip, paid by misses
// only). One replica sees its own writes at once: false.
func (s *Server) caughtUp(ctx context.Context) bool {
	if s.peers == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, catchUpWait)
	defer cancel()
	if err := s.topo.catchUp(ctx); err != nil {
		s.log.Debug("catching up with the registry failed", zap.Error(err))
		return false
	}
	return true
}

// findTopic is cat.topic for an RPC that names topic id (caughtUp).
func (s *Server) findTopic(ctx context.Context, id string) (*topicEntry, bool) {
	e, ok := s.cat.topic(id)
	if !ok && s.caughtUp(ctx) {
		e, ok = s.cat.topic(id)
	}
	return e, ok
}

// findSub is cat.sub for an RPC that names subscription id (caughtUp).
func (s *Server) findSub(ctx context.Context, id string) (*subEntry, bool) {
	e, ok := s.cat.sub(id)
	if !ok && s.caughtUp(ctx) {
		e, ok = s.cat.sub(id)
	}
	return e, ok
}

// findSnapshot is cat.snapshot for an RPC that names snapshot id (caughtUp).
func (s *Server) findSnapshot(ctx context.Context, id string) (*snapEntry, bool) {
	e, ok := s.cat.snapshot(id, time.Now())
	if !ok && s.caughtUp(ctx) {
		e, ok = s.cat.snapshot(id, time.Now())
	}
	return e, ok
}

func (c *catalog) topic(id string) (*topicEntry, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	e, ok := c.topics[id]
	return e, ok
}

func (c *catalog) sub(id string) (*subEntry, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	e, ok := c.subs[id]
	return e, ok
}

// attached reports whether sub is bound to the live incarnation of its
// topic; otherwise its topic reads as "_deleted-topic_".
func (c *catalog) attachedLocked(e *subEntry) bool {
	t, ok := c.topics[e.topicID]
	return ok && t.uid == e.topicUID
}

func (c *catalog) attached(e *subEntry) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.attachedLocked(e)
}

// fanout returns the subscriptions a message published to topic goes to:
// attached to this incarnation and not detached.
func (c *catalog) fanout(t *topicEntry) []*subEntry {
	c.mu.RLock()
	defer c.mu.RUnlock()
	var out []*subEntry
	for _, e := range c.byTopic[t.id] {
		if e.topicUID == t.uid && !e.proto.Detached {
			out = append(out, e)
		}
	}
	return out
}

// topicSubs lists the ids of the subscriptions attached to t (detached
// ones excluded, as Google does), sorted.
func (c *catalog) topicSubs(t *topicEntry) []string {
	subs := c.fanout(t)
	ids := make([]string, len(subs))
	for i, e := range subs {
		ids[i] = e.id
	}
	slices.Sort(ids)
	return ids
}

func (c *catalog) topicIDs() []string {
	c.mu.RLock()
	ids := make([]string, 0, len(c.topics))
	for id := range c.topics {
		ids = append(ids, id)
	}
	c.mu.RUnlock()
	slices.Sort(ids)
	return ids
}

func (c *catalog) subIDs() []string {
	c.mu.RLock()
	ids := make([]string, 0, len(c.subs))
	for id := range c.subs {
		ids = append(ids, id)
	}
	c.mu.RUnlock()
	slices.Sort(ids)
	return ids
}

// clone keeps handlers from mutating catalog entries.
func cloneTopic(t *pubsubpb.Topic) *pubsubpb.Topic { return proto.Clone(t).(*pubsubpb.Topic) }
func cloneSub(s *pubsubpb.Subscription) *pubsubpb.Subscription {
	return proto.Clone(s).(*pubsubpb.Subscription)
}
