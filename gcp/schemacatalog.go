package gcp

import (
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/kubemq-io/kubemq-proxy/gcp/names"
	"github.com/kubemq-io/kubemq-proxy/gcp/schema"
)

// Schemas are two kinds of registry records. A schema record (key: the
// schema id) names its incarnation (uid, as topics and subscriptions do),
// its type and its revisions in creation order: id, creation time, and
// whether the revision was deleted. A deleted revision keeps its place
// (a tombstone) because a topic's revision range is defined by creation
// times: when the range's first or last revision is deleted, the range
// still ends where it did (Google's rule). A revision record (key
// "{schema}@{revision}") holds one revision's definition, so a record
// stays small (a definition is up to 300 KiB; a schema has up to 20
// revisions) and never changes once written.
//
// Writes go revision record first, schema record second; a revision is
// visible once both are applied, so a crash in between leaves an orphan
// revision record that nothing lists (DeleteSchema removes it with the
// others).
const (
	kindSchema         = "gcp.schema"
	kindSchemaRevision = "gcp.schema.revision"
)

// Google's limits: revisions of one schema at a time.
const maxSchemaRevisions = 20

// Markers Google writes into a topic's schema settings once the schema, or
// a revision its range names, has been deleted.
const (
	deletedSchema         = "_deleted-schema_"
	deletedSchemaRevision = "_deleted-schema-revision_"
)

type schemaRecord struct {
	UID       string          `json:"uid"`
	Type      string          `json:"type"` // pubsubpb.Schema_Type name
	Revisions []schemaRevMeta `json:"revisions"`
}

type schemaRevMeta struct {
	ID      string `json:"id"`
	Created int64  `json:"created"` // unix ns; strictly increasing within a schema
	Deleted bool   `json:"deleted,omitempty"`
}

type schemaRevRecord struct {
	SchemaUID string          `json:"schema_uid"`
	Schema    json.RawMessage `json:"schema"` // protojson of pubsubpb.Schema: type and definition or compiled_proto_schema
}

func revisionKey(schemaID, rev string) string { return schemaID + "@" + rev }

// schemaEntry is one schema as the catalog holds it; immutable, replaced
// on every change.
type schemaEntry struct {
	id   string
	uid  string
	typ  pubsubpb.Schema_Type
	revs []schemaRevMeta // creation order, tombstones included
}

// latest is the newest live revision.
func (e *schemaEntry) latest() (schemaRevMeta, bool) {
	for i := len(e.revs) - 1; i >= 0; i-- {
		if !e.revs[i].Deleted {
			return e.revs[i], true
		}
	}
	return schemaRevMeta{}, false
}

// rev finds a revision, deleted or not.
func (e *schemaEntry) rev(id string) (schemaRevMeta, bool) {
	for _, r := range e.revs {
		if r.ID == id {
			return r, true
		}
	}
	return schemaRevMeta{}, false
}

func (e *schemaEntry) live() int {
	n := 0
	for _, r := range e.revs {
		if !r.Deleted {
			n++
		}
	}
	return n
}

// revEntry is one revision's definition and its compiled validator,
// compiled at most once per process (the per-revision cache that keeps
// publish cheap): the entry lives as long as its record, which never
// changes.
type revEntry struct {
	schemaUID string
	def       *pubsubpb.Schema // type, definition or compiled_proto_schema

	once sync.Once
	v    *schema.Validator
	err  error
}

// validator compiles the definition on first use.
func (r *revEntry) validator() (*schema.Validator, error) {
	r.once.Do(func() { r.v, r.err = schema.Compile(r.def) })
	if r.v == nil && r.err == nil {
		return nil, schema.ErrType // seeded with nothing: cannot happen, never a nil Validator
	}
	return r.v, r.err
}

// seed hands over a validator compiled before the record was written.
func (r *revEntry) seed(v *schema.Validator) {
	r.once.Do(func() { r.v = v })
}

func (c *catalog) applySchemaLocked(r record) {
	if r.Deleted {
		delete(c.schemas, r.Key)
		return
	}
	var rec schemaRecord
	if err := json.Unmarshal(r.Value, &rec); err != nil {
		c.log.Error("undecodable schema record; ignored", zap.String("schema", r.Key), zap.Error(err))
		return
	}
	typ := pubsubpb.Schema_Type(pubsubpb.Schema_Type_value[rec.Type])
	c.schemas[r.Key] = &schemaEntry{id: r.Key, uid: rec.UID, typ: typ, revs: rec.Revisions}
}

func (c *catalog) applySchemaRevisionLocked(r record) {
	if r.Deleted {
		delete(c.revisions, r.Key)
		return
	}
	if _, ok := c.revisions[r.Key]; ok {
		return // immutable: keep the compiled validator
	}
	var rec schemaRevRecord
	def := &pubsubpb.Schema{}
	err := json.Unmarshal(r.Value, &rec)
	if err == nil {
		err = protojson.Unmarshal(rec.Schema, def)
	}
	if err != nil {
		c.log.Error("undecodable schema revision record; ignored", zap.String("revision", r.Key), zap.Error(err))
		return
	}
	c.revisions[r.Key] = &revEntry{schemaUID: rec.SchemaUID, def: def}
}

func (c *catalog) schema(id string) (*schemaEntry, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	e, ok := c.schemas[id]
	return e, ok
}

// revision is the definition of a live revision of schema e.
func (c *catalog) revision(e *schemaEntry, rev string) (*revEntry, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	r, ok := c.revisions[revisionKey(e.id, rev)]
	if !ok || r.schemaUID != e.uid {
		return nil, false
	}
	return r, true
}

// revisionKeys lists the revision records of schema id, any incarnation
// (orphans included), for DeleteSchema.
func (c *catalog) revisionKeys(id string) []string {
	c.mu.RLock()
	defer c.mu.RUnlock()
	var keys []string
	for k := range c.revisions {
		if strings.HasPrefix(k, id+"@") {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return keys
}

func (c *catalog) schemaIDs() []string {
	c.mu.RLock()
	ids := make([]string, 0, len(c.schemas))
	for id := range c.schemas {
		ids = append(ids, id)
	}
	c.mu.RUnlock()
	slices.Sort(ids)
	return ids
}

// boundSchema is the schema a topic's settings are bound to: the live
// incarnation it was attached to, or false once that has been deleted.
func (c *catalog) boundSchema(t *topicEntry) (*schemaEntry, bool) {
	ss := t.proto.GetSchemaSettings()
	if ss == nil || t.schemaUID == "" {
		return nil, false
	}
	sn, err := names.ParseSchema(ss.GetSchema())
	if err != nil {
		return nil, false
	}
	e, ok := c.schema(sn.ID)
	if !ok || e.uid != t.schemaUID {
		return nil, false
	}
	return e, true
}

// renderSchemaSettings is a topic's schema settings as Google shows them:
// the schema named in the caller's project, "_deleted-schema_" once it is
// gone, and "_deleted-schema-revision_" for a range end whose revision was
// deleted.
func (c *catalog) renderSchemaSettings(t *topicEntry, out *pubsubpb.Topic, project string) {
	ss := out.GetSchemaSettings()
	if ss == nil {
		return
	}
	e, ok := c.boundSchema(t)
	if !ok {
		ss.Schema = deletedSchema
		return
	}
	ss.Schema = names.SchemaName{Project: project, ID: e.id}.String()
	for _, id := range []*string{&ss.FirstRevisionId, &ss.LastRevisionId} {
		if *id == "" {
			continue
		}
		if r, ok := e.rev(*id); !ok || r.Deleted {
			*id = deletedSchemaRevision
		}
	}
}

// renderRevision is one revision as the SchemaService returns it; basic
// leaves the definition out (SchemaView BASIC).
func renderRevision(project string, e *schemaEntry, meta schemaRevMeta, def *pubsubpb.Schema, basic bool) *pubsubpb.Schema {
	s := &pubsubpb.Schema{
		Name:               names.SchemaName{Project: project, ID: e.id}.String(),
		Type:               e.typ,
		RevisionId:         meta.ID,
		RevisionCreateTime: timestamppb.New(time.Unix(0, meta.Created)),
	}
	if !basic && def != nil {
		s.Definition = def.GetDefinition()
		if cps := def.GetCompiledProtoSchema(); cps != nil {
			s.Configuration = &pubsubpb.Schema_CompiledProtoSchema{CompiledProtoSchema: proto.Clone(cps).(*pubsubpb.CompiledProtoSchema)}
		}
	}
	return s
}
