package gcp

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/kubemq-io/kubemq-proxy/gcp/names"
	"github.com/kubemq-io/kubemq-proxy/gcp/schema"
)

// schemaService serves google.pubsub.v1.SchemaService: schemas and their
// revisions are registry records (schemacatalog.go), validated with the
// schema package. Texts are those of Google's emulator where Google's own
// server's were not observed.
type schemaService struct {
	pubsubpb.UnimplementedSchemaServiceServer
	s *Server
}

var (
	errInvalidSchemaType  = status.Error(codes.InvalidArgument, "Invalid schema type")
	errSchemaExists       = status.Error(codes.AlreadyExists, "Schema already exists")
	errNoSchema           = status.Error(codes.NotFound, "Schema not found")
	errNoSchemaRevision   = status.Error(codes.NotFound, "Schema revision not found")
	errNoRevision         = status.Error(codes.NotFound, "Revision not found")
	errMissingRevisionID  = status.Error(codes.InvalidArgument, "Missing revision ID")
	errLastRevision       = status.Error(codes.InvalidArgument, "Cannot delete last revision. Please use DeleteSchema.")
	errTooManyRevisions   = status.Error(codes.ResourceExhausted, "Already at maximum number of schema revisions")
	errNoEncoding         = status.Error(codes.InvalidArgument, "No encoding provided.")
	errSchemaTypeMismatch = status.Error(codes.InvalidArgument, "The type of a schema revision must be the schema's type.")
)

// compileStatus compiles a definition from a request, with the status a
// bad one gets.
func compileStatus(s *pubsubpb.Schema) (*schema.Validator, error) {
	v, err := schema.Compile(s)
	var de *schema.DefinitionError
	switch {
	case err == nil:
		return v, nil
	case errors.Is(err, schema.ErrType):
		return nil, errInvalidSchemaType
	case errors.Is(err, schema.ErrTooLarge):
		return nil, invalidArgf("Could not parse schema definition: the definition is larger than the limit of %d bytes.", schema.MaxDefinitionBytes)
	case errors.As(err, &de):
		return nil, invalidArgf("Could not parse schema definition: %s", de.Detail)
	}
	return nil, toStatus(err)
}

// messageStatus is ValidateMessage's answer to data that does not conform.
func messageStatus(err error) error {
	var me *schema.MessageError
	if !errors.As(err, &me) {
		return invalidArgf("%v", err)
	}
	enc, typ := "JSON", "Avro"
	if me.Encoding == pubsubpb.Encoding_BINARY {
		enc = "binary"
	}
	if me.Type == pubsubpb.Schema_PROTOCOL_BUFFER {
		typ = "Protocol Buffer"
	}
	return invalidArgf("Could not parse %s %s message: %s", enc, typ, me.Detail)
}

// definitionOnly is what a revision record keeps of a request's schema.
func definitionOnly(s *pubsubpb.Schema) *pubsubpb.Schema {
	d := &pubsubpb.Schema{Type: s.GetType(), Definition: s.GetDefinition()}
	if cps := s.GetCompiledProtoSchema(); cps != nil {
		d.Configuration = &pubsubpb.Schema_CompiledProtoSchema{CompiledProtoSchema: proto.Clone(cps).(*pubsubpb.CompiledProtoSchema)}
	}
	return d
}

// newRevisionID mints Google's form of revision id (8 lowercase hex
// digits), unique within the schema, tombstones included.
func newRevisionID(e *schemaEntry) string {
	for {
		var b [4]byte
		rand.Read(b[:])
		id := hex.EncodeToString(b[:])
		if e == nil {
			return id
		}
		if _, taken := e.rev(id); !taken {
			return id
		}
	}
}

// nextCreated is a new revision's creation time: now, or just after the
// newest revision if the clock says otherwise (ranges are ordered by it).
func nextCreated(e *schemaEntry) int64 {
	now := time.Now().UnixNano()
	if e != nil && len(e.revs) > 0 {
		if last := e.revs[len(e.revs)-1].Created; now <= last {
			now = last + 1
		}
	}
	return now
}

// putRevision writes a new revision: its definition record, then the
// schema record that lists it (see schemacatalog.go). It returns the new
// schema entry and revision.
func (ss *schemaService) putRevision(ctx context.Context, id string, cur *schemaEntry, def *pubsubpb.Schema, v *schema.Validator) (*schemaEntry, schemaRevMeta, error) {
	s := ss.s
	e := &schemaEntry{id: id, uid: newUID(), typ: def.GetType()}
	if cur != nil {
		e = &schemaEntry{id: id, uid: cur.uid, typ: cur.typ, revs: slices.Clone(cur.revs)}
	}
	meta := schemaRevMeta{ID: newRevisionID(cur), Created: nextCreated(cur)}
	raw, err := protojson.Marshal(definitionOnly(def))
	if err != nil {
		return nil, meta, toStatus(err)
	}
	if err := s.topo.Put(ctx, kindSchemaRevision, revisionKey(id, meta.ID), schemaRevRecord{SchemaUID: e.uid, Schema: raw}); err != nil {
		return nil, meta, toStatus(err)
	}
	if r, ok := s.cat.revision(e, meta.ID); ok {
		r.seed(v)
	}
	e.revs = append(e.revs, meta)
	if err := ss.putSchema(ctx, e); err != nil {
		return nil, meta, err
	}
	return e, meta, nil
}

func (ss *schemaService) putSchema(ctx context.Context, e *schemaEntry) error {
	rec := schemaRecord{UID: e.uid, Type: e.typ.String(), Revisions: e.revs}
	if err := ss.s.topo.Put(ctx, kindSchema, e.id, rec); err != nil {
		return toStatus(err)
	}
	return nil
}

// revisionDef is the definition of a live revision (the record of a
// revision just listed may lag on another replica: UNAVAILABLE, retried).
func (ss *schemaService) revisionDef(e *schemaEntry, rev string) (*revEntry, error) {
	r, ok := ss.s.cat.revision(e, rev)
	if !ok {
		return nil, status.Errorf(codes.Unavailable, "The definition of revision %s of schema %s has not reached this server yet; retry.", rev, e.id)
	}
	return r, nil
}

func (ss *schemaService) render(project string, e *schemaEntry, meta schemaRevMeta, view pubsubpb.SchemaView, defaultBasic bool) (*pubsubpb.Schema, error) {
	basic := view == pubsubpb.SchemaView_BASIC || (defaultBasic && view == pubsubpb.SchemaView_SCHEMA_VIEW_UNSPECIFIED)
	var def *pubsubpb.Schema
	if !basic {
		r, err := ss.revisionDef(e, meta.ID)
		if err != nil {
			return nil, err
		}
		def = r.def
	}
	return renderRevision(project, e, meta, def, basic), nil
}

func (ss *schemaService) CreateSchema(ctx context.Context, req *pubsubpb.CreateSchemaRequest) (*pubsubpb.Schema, error) {
	proj, err := names.ParseProject(req.GetParent())
	if err != nil {
		return nil, err
	}
	sn, err := names.NewSchema(proj, req.GetSchemaId())
	if err != nil {
		return nil, err
	}
	v, err := compileStatus(req.GetSchema())
	if err != nil {
		return nil, err
	}
	s := ss.s
	s.adminMu.Lock()
	defer s.adminMu.Unlock()
	if _, ok := s.cat.schema(sn.ID); ok {
		return nil, errSchemaExists
	}
	e, meta, err := ss.putRevision(ctx, sn.ID, nil, req.GetSchema(), v)
	if err != nil {
		return nil, err
	}
	return renderRevision(proj.ID, e, meta, definitionOnly(req.GetSchema()), false), nil
}

func (ss *schemaService) GetSchema(ctx context.Context, req *pubsubpb.GetSchemaRequest) (*pubsubpb.Schema, error) {
	sn, err := names.ParseSchemaRevision(req.GetName())
	if err != nil {
		return nil, err
	}
	e, meta, err := ss.revisionOf(sn, errNoSchemaRevision)
	if err != nil {
		return nil, err
	}
	return ss.render(sn.Project, e, meta, req.GetView(), false)
}

// revisionOf finds the schema and its revision named in sn, or its newest
// one when sn names none; missing is the answer for an unknown revision
// (GetSchema and ValidateMessage word it differently).
func (ss *schemaService) revisionOf(sn names.SchemaName, missing error) (*schemaEntry, schemaRevMeta, error) {
	e, ok := ss.s.cat.schema(sn.ID)
	if !ok {
		return nil, schemaRevMeta{}, errNoSchema
	}
	var meta schemaRevMeta
	if sn.Revision != "" {
		if meta, ok = e.rev(sn.Revision); !ok || meta.Deleted {
			return nil, meta, missing
		}
	} else if meta, ok = e.latest(); !ok {
		return nil, meta, errNoSchema
	}
	return e, meta, nil
}

func (ss *schemaService) ListSchemas(ctx context.Context, req *pubsubpb.ListSchemasRequest) (*pubsubpb.ListSchemasResponse, error) {
	proj, err := names.ParseProject(req.GetParent())
	if err != nil {
		return nil, err
	}
	ids, next, err := page(ss.s.cat.schemaIDs(), req.GetPageSize(), req.GetPageToken())
	if err != nil {
		return nil, err
	}
	resp := &pubsubpb.ListSchemasResponse{NextPageToken: next}
	for _, id := range ids {
		e, ok := ss.s.cat.schema(id)
		if !ok {
			continue // deleted meanwhile
		}
		meta, ok := e.latest()
		if !ok {
			continue
		}
		r, err := ss.render(proj.ID, e, meta, req.GetView(), true)
		if err != nil {
			return nil, err
		}
		resp.Schemas = append(resp.Schemas, r)
	}
	return resp, nil
}

// ListSchemaRevisions lists the live revisions newest first (Google's
// resource revision convention, AIP-162); a page token names the last
// revision of the previous page, which stays in the list as a tombstone
// if it is deleted meanwhile.
func (ss *schemaService) ListSchemaRevisions(ctx context.Context, req *pubsubpb.ListSchemaRevisionsRequest) (*pubsubpb.ListSchemaRevisionsResponse, error) {
	sn, err := names.ParseSchema(req.GetName())
	if err != nil {
		return nil, err
	}
	e, ok := ss.s.cat.schema(sn.ID)
	if !ok {
		return nil, errNoSchema
	}
	revs := slices.Clone(e.revs)
	slices.Reverse(revs)
	start := 0
	if tok := req.GetPageToken(); tok != "" {
		after, err := decodePageToken(tok)
		if err != nil {
			return nil, err
		}
		i := slices.IndexFunc(revs, func(r schemaRevMeta) bool { return r.ID == after })
		if i < 0 {
			return nil, invalidArgf("Invalid page token: %q.", tok)
		}
		start = i + 1
	}
	n := int(req.GetPageSize())
	if n <= 0 {
		n = defaultPageSize
	}
	n = min(n, maxPageSize)
	resp := &pubsubpb.ListSchemaRevisionsResponse{}
	for i := start; i < len(revs); i++ {
		if revs[i].Deleted {
			continue
		}
		if len(resp.Schemas) == n {
			resp.NextPageToken = encodePageToken(revs[i-1].ID)
			break
		}
		r, err := ss.render(sn.Project, e, revs[i], req.GetView(), true)
		if err != nil {
			return nil, err
		}
		resp.Schemas = append(resp.Schemas, r)
	}
	return resp, nil
}

func (ss *schemaService) CommitSchema(ctx context.Context, req *pubsubpb.CommitSchemaRequest) (*pubsubpb.Schema, error) {
	sn, err := names.ParseSchema(req.GetName())
	if err != nil {
		return nil, err
	}
	v, err := compileStatus(req.GetSchema())
	if err != nil {
		return nil, err
	}
	s := ss.s
	s.adminMu.Lock()
	defer s.adminMu.Unlock()
	cur, ok := s.cat.schema(sn.ID)
	if !ok {
		return nil, errNoSchema
	}
	if req.GetSchema().GetType() != cur.typ {
		return nil, errSchemaTypeMismatch
	}
	if cur.live() >= maxSchemaRevisions {
		return nil, errTooManyRevisions
	}
	e, meta, err := ss.putRevision(ctx, sn.ID, cur, req.GetSchema(), v)
	if err != nil {
		return nil, err
	}
	return renderRevision(sn.Project, e, meta, definitionOnly(req.GetSchema()), false), nil
}

// RollbackSchema commits a new revision with the definition of an older
// one.
func (ss *schemaService) RollbackSchema(ctx context.Context, req *pubsubpb.RollbackSchemaRequest) (*pubsubpb.Schema, error) {
	sn, err := names.ParseSchema(req.GetName())
	if err != nil {
		return nil, err
	}
	if req.GetRevisionId() == "" {
		return nil, errMissingRevisionID
	}
	s := ss.s
	s.adminMu.Lock()
	defer s.adminMu.Unlock()
	cur, ok := s.cat.schema(sn.ID)
	if !ok {
		return nil, errNoSchema
	}
	if meta, ok := cur.rev(req.GetRevisionId()); !ok || meta.Deleted {
		return nil, errNoRevision
	}
	if cur.live() >= maxSchemaRevisions {
		return nil, errTooManyRevisions
	}
	src, err := ss.revisionDef(cur, req.GetRevisionId())
	if err != nil {
		return nil, err
	}
	v, err := src.validator()
	if err != nil {
		return nil, compileErr(err)
	}
	e, meta, err := ss.putRevision(ctx, sn.ID, cur, src.def, v)
	if err != nil {
		return nil, err
	}
	return renderRevision(sn.Project, e, meta, src.def, false), nil
}

// compileErr is compileStatus's mapping for an error already in hand.
func compileErr(err error) error {
	var de *schema.DefinitionError
	if errors.As(err, &de) {
		return invalidArgf("Could not parse schema definition: %s", de.Detail)
	}
	return status.Error(codes.FailedPrecondition, fmt.Sprintf("The stored revision no longer compiles: %v", err))
}

// DeleteSchemaRevision deletes one revision (not the last one) and
// returns it. The revision is named "{schema}@{revision}"; the deprecated
// revision_id field is honoured when the name has none.
func (ss *schemaService) DeleteSchemaRevision(ctx context.Context, req *pubsubpb.DeleteSchemaRevisionRequest) (*pubsubpb.Schema, error) {
	sn, err := names.ParseSchemaRevision(req.GetName())
	if err != nil {
		return nil, err
	}
	rev := sn.Revision
	if rev == "" {
		rev = req.GetRevisionId() //nolint:staticcheck // deprecated, still sent by older clients
	}
	s := ss.s
	s.adminMu.Lock()
	defer s.adminMu.Unlock()
	cur, ok := s.cat.schema(sn.ID)
	if !ok {
		return nil, errNoSchema
	}
	i := slices.IndexFunc(cur.revs, func(r schemaRevMeta) bool { return r.ID == rev && !r.Deleted })
	if rev == "" || i < 0 {
		return nil, errNoSchemaRevision
	}
	if cur.live() == 1 {
		return nil, errLastRevision
	}
	def, err := ss.revisionDef(cur, rev)
	if err != nil {
		return nil, err
	}
	e := &schemaEntry{id: cur.id, uid: cur.uid, typ: cur.typ, revs: slices.Clone(cur.revs)}
	e.revs[i].Deleted = true
	if err := ss.putSchema(ctx, e); err != nil {
		return nil, err
	}
	if err := s.topo.Delete(ctx, kindSchemaRevision, revisionKey(sn.ID, rev)); err != nil {
		return nil, toStatus(err)
	}
	return renderRevision(sn.Project, cur, cur.revs[i], def.def, false), nil
}

// DeleteSchema deletes the schema and every revision. Topics that use it
// stay, report "_deleted-schema_" and refuse publishes (Google's rule); a
// schema created later under the same id is not theirs.
func (ss *schemaService) DeleteSchema(ctx context.Context, req *pubsubpb.DeleteSchemaRequest) (*emptypb.Empty, error) {
	sn, err := names.ParseSchema(req.GetName())
	if err != nil {
		return nil, err
	}
	s := ss.s
	s.adminMu.Lock()
	defer s.adminMu.Unlock()
	if _, ok := s.cat.schema(sn.ID); !ok {
		return nil, errNoSchema
	}
	if err := s.topo.Delete(ctx, kindSchema, sn.ID); err != nil {
		return nil, toStatus(err)
	}
	for _, key := range s.cat.revisionKeys(sn.ID) {
		if err := s.topo.Delete(ctx, kindSchemaRevision, key); err != nil {
			return nil, toStatus(err)
		}
	}
	return &emptypb.Empty{}, nil
}

func (ss *schemaService) ValidateSchema(ctx context.Context, req *pubsubpb.ValidateSchemaRequest) (*pubsubpb.ValidateSchemaResponse, error) {
	if _, err := names.ParseProject(req.GetParent()); err != nil {
		return nil, err
	}
	if _, err := compileStatus(req.GetSchema()); err != nil {
		return nil, err
	}
	return &pubsubpb.ValidateSchemaResponse{}, nil
}

// ValidateMessage checks data against a stored schema (its newest
// revision, or the one named with "@{revision}") or an inline one.
func (ss *schemaService) ValidateMessage(ctx context.Context, req *pubsubpb.ValidateMessageRequest) (*pubsubpb.ValidateMessageResponse, error) {
	if _, err := names.ParseProject(req.GetParent()); err != nil {
		return nil, err
	}
	var v *schema.Validator
	switch spec := req.GetSchemaSpec().(type) {
	case *pubsubpb.ValidateMessageRequest_Name:
		sn, err := names.ParseSchemaRevision(spec.Name)
		if err != nil {
			return nil, err
		}
		e, meta, err := ss.revisionOf(sn, errNoRevision)
		if err != nil {
			return nil, err
		}
		r, err := ss.revisionDef(e, meta.ID)
		if err != nil {
			return nil, err
		}
		if v, err = r.validator(); err != nil {
			return nil, compileErr(err)
		}
	case *pubsubpb.ValidateMessageRequest_Schema:
		var err error
		if v, err = compileStatus(spec.Schema); err != nil {
			return nil, err
		}
	default:
		return nil, errInvalidSchemaType
	}
	if enc := req.GetEncoding(); enc != pubsubpb.Encoding_JSON && enc != pubsubpb.Encoding_BINARY {
		return nil, errNoEncoding
	}
	if err := v.Validate(req.GetMessage(), req.GetEncoding()); err != nil {
		return nil, messageStatus(err)
	}
	return &pubsubpb.ValidateMessageResponse{}, nil
}
