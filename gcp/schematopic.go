package gcp

import (
	"errors"
	"fmt"
	"slices"

	"go.uber.org/zap"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/kubemq-io/kubemq-proxy/gcp/names"
	"github.com/kubemq-io/kubemq-proxy/gcp/schema"
)

// Attributes Google adds to every message published to a topic with a
// schema: which schema and revision the data conforms to, in which
// encoding (a subscriber decodes with them).
const (
	AttrSchemaName       = "googclient_schemaname"
	AttrSchemaEncoding   = "googclient_schemaencoding"
	AttrSchemaRevisionID = "googclient_schemarevisionid"
)

// Google's texts for schema settings (the emulator's, where Google's own
// server was not observed).
var (
	errSchemaDeleted    = status.Error(codes.NotFound, "Schema associated with topic deleted.")
	errSchemaNotFound   = status.Error(codes.NotFound, "Schema could not be found")
	errNoSchemaName     = status.Error(codes.InvalidArgument, "No schema name provided")
	errSchemaEncoding   = status.Error(codes.InvalidArgument, "Invalid schema encoding provided")
	errFirstRevNotFound = status.Error(codes.NotFound, "First revision could not be found")
	errLastRevNotFound  = status.Error(codes.NotFound, "Last revision could not be found")
	errRevisionOrder    = status.Error(codes.InvalidArgument, "First revision creation time is after last revision creation time")
)

// emptySchemaSettings: a SchemaSettings message with nothing set means
// none (the v1 Go client sends its zero value to remove a schema).
func emptySchemaSettings(ss *pubsubpb.SchemaSettings) bool {
	return ss.GetSchema() == "" && ss.GetEncoding() == pubsubpb.Encoding_ENCODING_UNSPECIFIED &&
		ss.GetFirstRevisionId() == "" && ss.GetLastRevisionId() == ""
}

// bindSchemaSettings checks a topic's schema settings against the catalog
// and returns the settings to store (nil for none) with the incarnation of
// the schema they bind to.
func (c *catalog) bindSchemaSettings(ss *pubsubpb.SchemaSettings) (*pubsubpb.SchemaSettings, string, error) {
	if emptySchemaSettings(ss) {
		return nil, "", nil
	}
	if ss.GetSchema() == "" {
		return nil, "", errNoSchemaName
	}
	sn, err := names.ParseSchema(ss.GetSchema())
	if err != nil {
		return nil, "", err
	}
	if enc := ss.GetEncoding(); enc != pubsubpb.Encoding_JSON && enc != pubsubpb.Encoding_BINARY {
		return nil, "", errSchemaEncoding
	}
	e, ok := c.schema(sn.ID)
	if !ok {
		return nil, "", errSchemaNotFound
	}
	var first, last schemaRevMeta
	if id := ss.GetFirstRevisionId(); id != "" {
		if first, ok = e.rev(id); !ok || first.Deleted {
			return nil, "", errFirstRevNotFound
		}
	}
	if id := ss.GetLastRevisionId(); id != "" {
		if last, ok = e.rev(id); !ok || last.Deleted {
			return nil, "", errLastRevNotFound
		}
	}
	if first.ID != "" && last.ID != "" && first.Created > last.Created {
		return nil, "", errRevisionOrder
	}
	return proto.Clone(ss).(*pubsubpb.SchemaSettings), e.uid, nil
}

// schemaSettingsPaths are the UpdateTopic mask paths of schema settings:
// the whole message, or one field of it (the v1 Go client sends those).
var schemaSettingsPaths = map[string]func(dst, src *pubsubpb.SchemaSettings){
	"schema_settings.schema":            func(d, s *pubsubpb.SchemaSettings) { d.Schema = s.GetSchema() },
	"schema_settings.encoding":          func(d, s *pubsubpb.SchemaSettings) { d.Encoding = s.GetEncoding() },
	"schema_settings.first_revision_id": func(d, s *pubsubpb.SchemaSettings) { d.FirstRevisionId = s.GetFirstRevisionId() },
	"schema_settings.last_revision_id":  func(d, s *pubsubpb.SchemaSettings) { d.LastRevisionId = s.GetLastRevisionId() },
}

// mergeSchemaSettings applies one UpdateTopic path to t's settings.
func mergeSchemaSettings(t *pubsubpb.Topic, in *pubsubpb.SchemaSettings, path string) {
	if path == "schema_settings" {
		t.SchemaSettings = in
		return
	}
	if t.SchemaSettings == nil {
		t.SchemaSettings = &pubsubpb.SchemaSettings{}
	}
	schemaSettingsPaths[path](t.SchemaSettings, in)
}

// schemaCandidate is one revision a topic's messages may conform to.
type schemaCandidate struct {
	id string
	v  *schema.Validator
}

// topicSchema is what enforcing a topic's schema on one Publish needs,
// resolved once per request.
type topicSchema struct {
	name       string // projects/{p}/schemas/{s}, in the publisher's project
	typ        pubsubpb.Schema_Type
	encoding   pubsubpb.Encoding
	candidates []schemaCandidate // the live revisions in the topic's range, newest first
}

// resolveTopicSchema finds the revisions t's messages are validated
// against: those created within [first, last] of its range (by creation
// time, so a deleted range end still bounds it), newest first, as Google
// tries them. A range end that names no revision at all (only possible
// through a race between replicas) leaves no candidate: every message is
// refused rather than checked against revisions outside the range.
func (s *Server) resolveTopicSchema(t *topicEntry, project string) (*topicSchema, error) {
	ss := t.proto.GetSchemaSettings()
	e, ok := s.cat.boundSchema(t)
	if !ok {
		return nil, errSchemaDeleted
	}
	ts := &topicSchema{name: names.SchemaName{Project: project, ID: e.id}.String(), typ: e.typ, encoding: ss.GetEncoding()}
	lo, hi := int64(-1<<63), int64(1<<63-1)
	for _, end := range []struct {
		id    string
		bound *int64
	}{{ss.GetFirstRevisionId(), &lo}, {ss.GetLastRevisionId(), &hi}} {
		if end.id == "" {
			continue
		}
		r, ok := e.rev(end.id)
		if !ok {
			return ts, nil
		}
		*end.bound = r.Created
	}
	for _, meta := range slices.Backward(e.revs) {
		if meta.Deleted || meta.Created < lo || meta.Created > hi {
			continue
		}
		r, ok := s.cat.revision(e, meta.ID)
		if !ok {
			continue // its record has not arrived yet
		}
		v, err := r.validator()
		if err != nil {
			// It compiled when it was committed; should a later library
			// refuse it, only this revision is out, not the topic.
			s.log.Error("schema revision does not compile; skipped", zap.String("schema", e.id),
				zap.String("revision", meta.ID), zap.Error(err))
			continue
		}
		ts.candidates = append(ts.candidates, schemaCandidate{id: meta.ID, v: v})
	}
	return ts, nil
}

// enforce validates every message of a batch before anything is stored
// and, when all conform, adds Google's schema attributes to each. The
// first message that conforms to no revision refuses the whole batch.
func (ts *topicSchema) enforce(msgs []*pubsubpb.PubsubMessage) error {
	revs := make([]string, len(msgs))
	for i, m := range msgs {
		var last schemaCandidate
		var lastErr error
		for _, c := range ts.candidates {
			if lastErr = c.v.Validate(m.GetData(), ts.encoding); lastErr == nil {
				revs[i] = c.id
				break
			}
			last = c
		}
		if revs[i] == "" {
			return ts.refusal(last, lastErr)
		}
	}
	enc := ts.encoding.String()
	for i, m := range msgs {
		if m.Attributes == nil {
			m.Attributes = make(map[string]string, 3)
		}
		m.Attributes[AttrSchemaName] = ts.name
		m.Attributes[AttrSchemaEncoding] = enc
		m.Attributes[AttrSchemaRevisionID] = revs[i]
	}
	return nil
}

// refusal is Google's answer to a message that fits no revision:
// INVALID_ARGUMENT with an ErrorInfo naming the encoding and schema type
// (reason), the last revision tried and why it failed (revisionInfo).
func (ts *topicSchema) refusal(last schemaCandidate, err error) error {
	reason := schemaReason(ts.typ, ts.encoding)
	info := fmt.Sprintf("Could not validate message with any schema revision for schema: %s, the topic's revision range holds no revision", ts.name)
	var me *schema.MessageError
	if errors.As(err, &me) {
		info = fmt.Sprintf("Could not validate message with any schema revision for schema: %s, last checked revision: revision_id=%s failed with status: %s",
			ts.name, last.id, me.Detail)
	}
	st, derr := status.New(codes.InvalidArgument, "Invalid data in message: Message failed schema validation.").WithDetails(&errdetails.ErrorInfo{
		Reason:   reason,
		Domain:   "pubsub.googleapis.com",
		Metadata: map[string]string{"message": "Message failed schema validation", "revisionInfo": info},
	})
	if derr != nil {
		return status.Error(codes.InvalidArgument, "Invalid data in message: Message failed schema validation. "+info)
	}
	return st.Err()
}

// schemaReason is the ErrorInfo reason Google gives for a message of
// this schema type in this encoding (INVALID_JSON_AVRO_MESSAGE, ...).
func schemaReason(typ pubsubpb.Schema_Type, enc pubsubpb.Encoding) string {
	e, t := "JSON", "AVRO"
	if enc == pubsubpb.Encoding_BINARY {
		e = "BINARY"
	}
	if typ == pubsubpb.Schema_PROTOCOL_BUFFER {
		t = "PROTO"
	}
	return "INVALID_" + e + "_" + t + "_MESSAGE"
}
