package gcp_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hamba/avro/v2"
	"google.golang.org/api/iterator"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	pubsubv1 "cloud.google.com/go/pubsub"
	"cloud.google.com/go/pubsub/v2"
	vkit "cloud.google.com/go/pubsub/v2/apiv1"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
)

const (
	avroStateDef = `{"type":"record","name":"State","namespace":"utilities","fields":[{"name":"name","type":"string"},{"name":"post_abbr","type":"string"}]}`
	// avroStateV2 adds an optional field: a JSON message must carry it.
	avroStateV2   = `{"type":"record","name":"State","namespace":"utilities","fields":[{"name":"name","type":"string"},{"name":"post_abbr","type":"string"},{"name":"capital","type":["null","string"],"default":null}]}`
	protoStateDef = `syntax = "proto3";
package utilities;
message State {
  string name = 1;
  string post_abbr = 2;
}
`
	alaskaJSON    = `{"name":"Alaska","post_abbr":"AK"}`
	alaskaV2JSON  = `{"name":"Alaska","post_abbr":"AK","capital":{"string":"Juneau"}}`
	alaskaBinary  = "\x0cAlaska\x04AK"         // Avro binary of State
	alaskaProtoBn = "\x0a\x06Alaska\x12\x02AK" // proto binary of State
)

func (e *env) schemaName(id string) string { return "projects/" + e.project + "/schemas/" + id }

// schemaClient is the v2 generation's SchemaService client (the v2
// Client has no schema field; its apiv1 package has the client).
func (e *env) schemaClient() *vkit.SchemaClient {
	e.t.Helper()
	c, err := vkit.NewSchemaClient(context.Background(), e.clientOptions()...)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { c.Close() })
	return c
}

var revisionIDForm = regexp.MustCompile(`^[0-9a-f]{8}$`)

// checkRevision: Google's revision id form, and a creation time of this
// test's run.
func checkRevision(t *testing.T, s *pubsubpb.Schema, since time.Time) {
	t.Helper()
	if !revisionIDForm.MatchString(s.GetRevisionId()) {
		t.Fatalf("revision id %q is not 8 lowercase hex digits", s.GetRevisionId())
	}
	ct := s.GetRevisionCreateTime().AsTime()
	if ct.Before(since.Add(-time.Second)) || ct.After(time.Now().Add(time.Second)) {
		t.Fatalf("revision_create_time %v is not of this run (since %v)", ct, since)
	}
}

func revisionIDs(t *testing.T, it interface {
	Next() (*pubsubpb.Schema, error)
}) []string {
	t.Helper()
	var ids []string
	for {
		s, err := it.Next()
		if errors.Is(err, iterator.Done) {
			return ids
		}
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, s.GetRevisionId())
	}
}

// TestSchemaAdmin drives every SchemaService RPC through the v2 client's
// generated admin API.
func TestSchemaAdmin(t *testing.T) {
	e := startEnv(t)
	sc := e.schemaClient()
	ctx := ctxT(t, 60*time.Second)
	start := time.Now()
	parent := "projects/" + e.project
	id, pid := e.id("states"), e.id("pstates")

	created, err := sc.CreateSchema(ctx, &pubsubpb.CreateSchemaRequest{Parent: parent, SchemaId: id,
		Schema: &pubsubpb.Schema{Name: "ignored", Type: pubsubpb.Schema_AVRO, Definition: avroStateDef}})
	if err != nil {
		t.Fatal(err)
	}
	if created.Name != e.schemaName(id) || created.Type != pubsubpb.Schema_AVRO || created.Definition != avroStateDef {
		t.Fatalf("created %v", created)
	}
	checkRevision(t, created, start)
	rev1 := created.RevisionId
	if _, err := sc.CreateSchema(ctx, &pubsubpb.CreateSchemaRequest{Parent: parent, SchemaId: pid,
		Schema: &pubsubpb.Schema{Type: pubsubpb.Schema_PROTOCOL_BUFFER, Definition: protoStateDef}}); err != nil {
		t.Fatal(err)
	}

	// Refusals, with Google's codes and texts.
	for _, tc := range []struct {
		name string
		req  *pubsubpb.CreateSchemaRequest
		code codes.Code
		text string
	}{
		{"duplicate", &pubsubpb.CreateSchemaRequest{Parent: parent, SchemaId: id, Schema: &pubsubpb.Schema{Type: pubsubpb.Schema_AVRO, Definition: avroStateDef}}, codes.AlreadyExists, "Schema already exists"},
		{"bad avro", &pubsubpb.CreateSchemaRequest{Parent: parent, SchemaId: e.id("bad"), Schema: &pubsubpb.Schema{Type: pubsubpb.Schema_AVRO, Definition: `{"type":"record"}`}}, codes.InvalidArgument, "Could not parse schema definition"},
		{"bad proto", &pubsubpb.CreateSchemaRequest{Parent: parent, SchemaId: e.id("bad"), Schema: &pubsubpb.Schema{Type: pubsubpb.Schema_PROTOCOL_BUFFER, Definition: "message {"}}, codes.InvalidArgument, "Could not parse schema definition"},
		{"two messages", &pubsubpb.CreateSchemaRequest{Parent: parent, SchemaId: e.id("bad"), Schema: &pubsubpb.Schema{Type: pubsubpb.Schema_PROTOCOL_BUFFER, Definition: "syntax = \"proto3\";\nmessage A {}\nmessage B {}\n"}}, codes.InvalidArgument, "exactly one top-level message"},
		{"no type", &pubsubpb.CreateSchemaRequest{Parent: parent, SchemaId: e.id("bad"), Schema: &pubsubpb.Schema{Definition: avroStateDef}}, codes.InvalidArgument, "Invalid schema type"},
		{"no schema", &pubsubpb.CreateSchemaRequest{Parent: parent, SchemaId: e.id("bad")}, codes.InvalidArgument, "Invalid schema type"},
		{"too large", &pubsubpb.CreateSchemaRequest{Parent: parent, SchemaId: e.id("bad"), Schema: &pubsubpb.Schema{Type: pubsubpb.Schema_AVRO, Definition: strings.Repeat(" ", 300<<10+1)}}, codes.InvalidArgument, "larger than the limit"},
		{"bad id", &pubsubpb.CreateSchemaRequest{Parent: parent, SchemaId: "1x", Schema: &pubsubpb.Schema{Type: pubsubpb.Schema_AVRO, Definition: avroStateDef}}, codes.InvalidArgument, "Invalid resource name"},
		{"goog id", &pubsubpb.CreateSchemaRequest{Parent: parent, SchemaId: "goog-x", Schema: &pubsubpb.Schema{Type: pubsubpb.Schema_AVRO, Definition: avroStateDef}}, codes.InvalidArgument, "Invalid resource name"},
		{"bad parent", &pubsubpb.CreateSchemaRequest{Parent: "projects/", SchemaId: e.id("x"), Schema: &pubsubpb.Schema{Type: pubsubpb.Schema_AVRO, Definition: avroStateDef}}, codes.InvalidArgument, "Invalid resource name"},
	} {
		_, err := sc.CreateSchema(ctx, tc.req)
		if st := status.Convert(err); st.Code() != tc.code || !strings.Contains(st.Message(), tc.text) {
			t.Errorf("%s: got %v, want %v containing %q", tc.name, err, tc.code, tc.text)
		}
	}

	// Views: BASIC leaves the definition out; Get defaults to FULL.
	basic, err := sc.GetSchema(ctx, &pubsubpb.GetSchemaRequest{Name: e.schemaName(id), View: pubsubpb.SchemaView_BASIC})
	if err != nil || basic.Definition != "" || basic.RevisionId != rev1 || basic.Type != pubsubpb.Schema_AVRO {
		t.Fatalf("basic get: %v %v", basic, err)
	}
	full, err := sc.GetSchema(ctx, &pubsubpb.GetSchemaRequest{Name: e.schemaName(id)})
	if err != nil || full.Definition != avroStateDef || !proto.Equal(full.RevisionCreateTime, created.RevisionCreateTime) {
		t.Fatalf("full get: %v %v", full, err)
	}
	_, err = sc.GetSchema(ctx, &pubsubpb.GetSchemaRequest{Name: e.schemaName(e.id("missing"))})
	wantCode(t, err, codes.NotFound, "Schema not found")
	_, err = sc.GetSchema(ctx, &pubsubpb.GetSchemaRequest{Name: e.schemaName(id) + "@deadbeef"})
	wantCode(t, err, codes.NotFound, "Schema revision not found")

	// Revisions: commit, rollback; listed newest first.
	c2, err := sc.CommitSchema(ctx, &pubsubpb.CommitSchemaRequest{Name: e.schemaName(id), Schema: &pubsubpb.Schema{Type: pubsubpb.Schema_AVRO, Definition: avroStateV2}})
	if err != nil || c2.Definition != avroStateV2 || c2.RevisionId == rev1 {
		t.Fatalf("commit: %v %v", c2, err)
	}
	checkRevision(t, c2, start)
	if !c2.RevisionCreateTime.AsTime().After(created.RevisionCreateTime.AsTime()) {
		t.Fatalf("commit created at %v, not after %v", c2.RevisionCreateTime.AsTime(), created.RevisionCreateTime.AsTime())
	}
	_, err = sc.CommitSchema(ctx, &pubsubpb.CommitSchemaRequest{Name: e.schemaName(id), Schema: &pubsubpb.Schema{Type: pubsubpb.Schema_AVRO, Definition: "nope"}})
	wantCode(t, err, codes.InvalidArgument, "Could not parse schema definition")
	_, err = sc.CommitSchema(ctx, &pubsubpb.CommitSchemaRequest{Name: e.schemaName(id), Schema: &pubsubpb.Schema{Type: pubsubpb.Schema_PROTOCOL_BUFFER, Definition: protoStateDef}})
	wantCode(t, err, codes.InvalidArgument, "schema's type")
	_, err = sc.CommitSchema(ctx, &pubsubpb.CommitSchemaRequest{Name: e.schemaName(e.id("missing")), Schema: &pubsubpb.Schema{Type: pubsubpb.Schema_AVRO, Definition: avroStateDef}})
	wantCode(t, err, codes.NotFound, "Schema not found")
	rb, err := sc.RollbackSchema(ctx, &pubsubpb.RollbackSchemaRequest{Name: e.schemaName(id), RevisionId: rev1})
	if err != nil || rb.Definition != avroStateDef || rb.RevisionId == rev1 || rb.RevisionId == c2.RevisionId {
		t.Fatalf("rollback: %v %v", rb, err)
	}
	_, err = sc.RollbackSchema(ctx, &pubsubpb.RollbackSchemaRequest{Name: e.schemaName(id), RevisionId: "deadbeef"})
	wantCode(t, err, codes.NotFound, "Revision not found")
	_, err = sc.RollbackSchema(ctx, &pubsubpb.RollbackSchemaRequest{Name: e.schemaName(id)})
	wantCode(t, err, codes.InvalidArgument, "Missing revision ID")
	latest, err := sc.GetSchema(ctx, &pubsubpb.GetSchemaRequest{Name: e.schemaName(id)})
	if err != nil || latest.RevisionId != rb.RevisionId {
		t.Fatalf("latest after rollback: %v %v", latest, err)
	}
	at, err := sc.GetSchema(ctx, &pubsubpb.GetSchemaRequest{Name: e.schemaName(id) + "@" + c2.RevisionId})
	if err != nil || at.Definition != avroStateV2 {
		t.Fatalf("get @rev: %v %v", at, err)
	}
	want := []string{rb.RevisionId, c2.RevisionId, rev1}
	if got := revisionIDs(t, sc.ListSchemaRevisions(ctx, &pubsubpb.ListSchemaRevisionsRequest{Name: e.schemaName(id)})); !slices.Equal(got, want) {
		t.Fatalf("revisions %v, want %v (newest first)", got, want)
	}
	// Paging one at a time, BASIC by default.
	page, err := rawSchema(t, e).ListSchemaRevisions(ctx, &pubsubpb.ListSchemaRevisionsRequest{Name: e.schemaName(id), PageSize: 1})
	if err != nil || len(page.Schemas) != 1 || page.Schemas[0].Definition != "" || page.NextPageToken == "" {
		t.Fatalf("page 1: %v %v", page, err)
	}
	page, err = rawSchema(t, e).ListSchemaRevisions(ctx, &pubsubpb.ListSchemaRevisionsRequest{Name: e.schemaName(id), PageSize: 2, PageToken: page.NextPageToken, View: pubsubpb.SchemaView_FULL})
	if err != nil || len(page.Schemas) != 2 || page.Schemas[1].RevisionId != rev1 || page.Schemas[1].Definition != avroStateDef || page.NextPageToken != "" {
		t.Fatalf("page 2: %v %v", page, err)
	}
	_, err = rawSchema(t, e).ListSchemaRevisions(ctx, &pubsubpb.ListSchemaRevisionsRequest{Name: e.schemaName(id), PageToken: "bogus"})
	wantCode(t, err, codes.InvalidArgument, "page token")

	// ListSchemas: every schema's newest revision, BASIC by default.
	var listed []*pubsubpb.Schema
	for it := sc.ListSchemas(ctx, &pubsubpb.ListSchemasRequest{Parent: parent, PageSize: 1}); ; {
		s, err := it.Next()
		if errors.Is(err, iterator.Done) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		listed = append(listed, s)
	}
	if len(listed) != 2 || listed[0].Name != e.schemaName(pid) || listed[1].Name != e.schemaName(id) ||
		listed[1].RevisionId != rb.RevisionId || listed[1].Definition != "" {
		t.Fatalf("listed %v", listed)
	}
	fl, err := rawSchema(t, e).ListSchemas(ctx, &pubsubpb.ListSchemasRequest{Parent: parent, View: pubsubpb.SchemaView_FULL})
	if err != nil || len(fl.Schemas) != 2 || fl.Schemas[0].Definition != protoStateDef {
		t.Fatalf("full list: %v %v", fl, err)
	}

	// DeleteSchemaRevision returns the deleted revision; the last one
	// cannot go.
	del, err := sc.DeleteSchemaRevision(ctx, &pubsubpb.DeleteSchemaRevisionRequest{Name: e.schemaName(id) + "@" + c2.RevisionId})
	if err != nil || del.RevisionId != c2.RevisionId || del.Definition != avroStateV2 {
		t.Fatalf("delete revision: %v %v", del, err)
	}
	_, err = sc.GetSchema(ctx, &pubsubpb.GetSchemaRequest{Name: e.schemaName(id) + "@" + c2.RevisionId})
	wantCode(t, err, codes.NotFound, "Schema revision not found")
	_, err = sc.DeleteSchemaRevision(ctx, &pubsubpb.DeleteSchemaRevisionRequest{Name: e.schemaName(id) + "@" + c2.RevisionId})
	wantCode(t, err, codes.NotFound, "Schema revision not found")
	_, err = sc.RollbackSchema(ctx, &pubsubpb.RollbackSchemaRequest{Name: e.schemaName(id), RevisionId: c2.RevisionId})
	wantCode(t, err, codes.NotFound, "Revision not found")
	// The deprecated revision_id field still names a revision.
	if _, err := sc.DeleteSchemaRevision(ctx, &pubsubpb.DeleteSchemaRevisionRequest{Name: e.schemaName(id), RevisionId: rev1}); err != nil { //nolint:staticcheck
		t.Fatal(err)
	}
	_, err = sc.DeleteSchemaRevision(ctx, &pubsubpb.DeleteSchemaRevisionRequest{Name: e.schemaName(id) + "@" + rb.RevisionId})
	wantCode(t, err, codes.InvalidArgument, "Cannot delete last revision. Please use DeleteSchema.")
	if got := revisionIDs(t, sc.ListSchemaRevisions(ctx, &pubsubpb.ListSchemaRevisionsRequest{Name: e.schemaName(id)})); !slices.Equal(got, []string{rb.RevisionId}) {
		t.Fatalf("revisions after deletes: %v", got)
	}

	// At most 20 revisions at a time.
	for range 19 {
		if _, err := sc.CommitSchema(ctx, &pubsubpb.CommitSchemaRequest{Name: e.schemaName(id), Schema: &pubsubpb.Schema{Type: pubsubpb.Schema_AVRO, Definition: avroStateDef}}); err != nil {
			t.Fatal(err)
		}
	}
	_, err = sc.CommitSchema(ctx, &pubsubpb.CommitSchemaRequest{Name: e.schemaName(id), Schema: &pubsubpb.Schema{Type: pubsubpb.Schema_AVRO, Definition: avroStateDef}})
	wantCode(t, err, codes.ResourceExhausted, "Already at maximum number of schema revisions")
	_, err = sc.RollbackSchema(ctx, &pubsubpb.RollbackSchemaRequest{Name: e.schemaName(id), RevisionId: rb.RevisionId})
	wantCode(t, err, codes.ResourceExhausted, "Already at maximum number of schema revisions")

	// ValidateSchema.
	if _, err := sc.ValidateSchema(ctx, &pubsubpb.ValidateSchemaRequest{Parent: parent, Schema: &pubsubpb.Schema{Type: pubsubpb.Schema_PROTOCOL_BUFFER, Definition: protoStateDef}}); err != nil {
		t.Fatal(err)
	}
	_, err = sc.ValidateSchema(ctx, &pubsubpb.ValidateSchemaRequest{Parent: parent, Schema: &pubsubpb.Schema{Type: pubsubpb.Schema_AVRO, Definition: `{"type":"recor"}`}})
	wantCode(t, err, codes.InvalidArgument, "Could not parse schema definition")
	_, err = sc.ValidateSchema(ctx, &pubsubpb.ValidateSchemaRequest{Parent: parent})
	wantCode(t, err, codes.InvalidArgument, "Invalid schema type")

	// DeleteSchema.
	if err := sc.DeleteSchema(ctx, &pubsubpb.DeleteSchemaRequest{Name: e.schemaName(id)}); err != nil {
		t.Fatal(err)
	}
	wantCode(t, sc.DeleteSchema(ctx, &pubsubpb.DeleteSchemaRequest{Name: e.schemaName(id)}), codes.NotFound, "Schema not found")
	_, err = sc.GetSchema(ctx, &pubsubpb.GetSchemaRequest{Name: e.schemaName(id)})
	wantCode(t, err, codes.NotFound, "Schema not found")
	wantCode(t, sc.DeleteSchema(ctx, &pubsubpb.DeleteSchemaRequest{Name: e.schemaName(pid) + "@" + rev1}), codes.InvalidArgument, "Invalid resource name")
	// The id is free again: a new schema with its own revisions.
	again, err := sc.CreateSchema(ctx, &pubsubpb.CreateSchemaRequest{Parent: parent, SchemaId: id, Schema: &pubsubpb.Schema{Type: pubsubpb.Schema_AVRO, Definition: avroStateV2}})
	if err != nil {
		t.Fatal(err)
	}
	if got := revisionIDs(t, sc.ListSchemaRevisions(ctx, &pubsubpb.ListSchemaRevisionsRequest{Name: e.schemaName(id)})); !slices.Equal(got, []string{again.RevisionId}) {
		t.Fatalf("revisions of the new schema: %v", got)
	}
}

func rawSchema(t testing.TB, e *env) pubsubpb.SchemaServiceClient {
	return pubsubpb.NewSchemaServiceClient(connAt(t, e.addr))
}

// connAt is a plaintext connection to a proxy at addr, closed at cleanup.
func connAt(t testing.TB, addr string) *grpc.ClientConn {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// TestValidateMessage: against a stored schema (newest revision or a
// named one) or an inline one, Avro and Protocol Buffers, both encodings.
func TestValidateMessage(t *testing.T) {
	e := startEnv(t)
	sc := e.schemaClient()
	ctx := ctxT(t, 30*time.Second)
	parent := "projects/" + e.project
	id, pid := e.id("states"), e.id("pstates")
	s1, err := sc.CreateSchema(ctx, &pubsubpb.CreateSchemaRequest{Parent: parent, SchemaId: id, Schema: &pubsubpb.Schema{Type: pubsubpb.Schema_AVRO, Definition: avroStateDef}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sc.CommitSchema(ctx, &pubsubpb.CommitSchemaRequest{Name: e.schemaName(id), Schema: &pubsubpb.Schema{Type: pubsubpb.Schema_AVRO, Definition: avroStateV2}}); err != nil {
		t.Fatal(err)
	}
	if _, err := sc.CreateSchema(ctx, &pubsubpb.CreateSchemaRequest{Parent: parent, SchemaId: pid, Schema: &pubsubpb.Schema{Type: pubsubpb.Schema_PROTOCOL_BUFFER, Definition: protoStateDef}}); err != nil {
		t.Fatal(err)
	}
	byName := func(n string) *pubsubpb.ValidateMessageRequest_Name {
		return &pubsubpb.ValidateMessageRequest_Name{Name: n}
	}
	inline := &pubsubpb.ValidateMessageRequest_Schema{Schema: &pubsubpb.Schema{Type: pubsubpb.Schema_AVRO, Definition: avroStateDef}}
	for _, tc := range []struct {
		name string
		spec any
		msg  string
		enc  pubsubpb.Encoding
		code codes.Code
		text string
	}{
		{"newest revision", byName(e.schemaName(id)), alaskaV2JSON, pubsubpb.Encoding_JSON, codes.OK, ""},
		{"newest needs the new field", byName(e.schemaName(id)), alaskaJSON, pubsubpb.Encoding_JSON, codes.InvalidArgument, "Could not parse JSON Avro message: capital: missing field"},
		{"named revision", byName(e.schemaName(id) + "@" + s1.RevisionId), alaskaJSON, pubsubpb.Encoding_JSON, codes.OK, ""},
		{"named revision binary", byName(e.schemaName(id) + "@" + s1.RevisionId), alaskaBinary, pubsubpb.Encoding_BINARY, codes.OK, ""},
		{"binary trailing", byName(e.schemaName(id) + "@" + s1.RevisionId), alaskaBinary + "\x00", pubsubpb.Encoding_BINARY, codes.InvalidArgument, "Could not parse binary Avro message: too much data"},
		{"bad type", byName(e.schemaName(id) + "@" + s1.RevisionId), `{"name":"Alaska","post_abbr":1}`, pubsubpb.Encoding_JSON, codes.InvalidArgument, "post_abbr: expected string, got number"},
		{"missing revision", byName(e.schemaName(id) + "@deadbeef"), alaskaJSON, pubsubpb.Encoding_JSON, codes.NotFound, "Revision not found"},
		{"missing schema", byName(e.schemaName(e.id("missing"))), alaskaJSON, pubsubpb.Encoding_JSON, codes.NotFound, "Schema not found"},
		{"no encoding", byName(e.schemaName(id)), alaskaV2JSON, pubsubpb.Encoding_ENCODING_UNSPECIFIED, codes.InvalidArgument, "No encoding provided."},
		{"inline", inline, alaskaJSON, pubsubpb.Encoding_JSON, codes.OK, ""},
		{"inline bad definition", &pubsubpb.ValidateMessageRequest_Schema{Schema: &pubsubpb.Schema{Type: pubsubpb.Schema_AVRO, Definition: "x"}}, alaskaJSON, pubsubpb.Encoding_JSON, codes.InvalidArgument, "Could not parse schema definition"},
		{"no schema", nil, alaskaJSON, pubsubpb.Encoding_JSON, codes.InvalidArgument, "Invalid schema type"},
		{"proto json", byName(e.schemaName(pid)), `{"name":"Alaska","postAbbr":"AK"}`, pubsubpb.Encoding_JSON, codes.OK, ""},
		{"proto json unknown field", byName(e.schemaName(pid)), `{"capital":"Juneau"}`, pubsubpb.Encoding_JSON, codes.InvalidArgument, "Could not parse JSON Protocol Buffer message"},
		{"proto binary", byName(e.schemaName(pid)), alaskaProtoBn, pubsubpb.Encoding_BINARY, codes.OK, ""},
		{"proto binary truncated", byName(e.schemaName(pid)), alaskaProtoBn[:5], pubsubpb.Encoding_BINARY, codes.InvalidArgument, "Could not parse binary Protocol Buffer message"},
	} {
		req := &pubsubpb.ValidateMessageRequest{Parent: parent, Message: []byte(tc.msg), Encoding: tc.enc}
		switch s := tc.spec.(type) {
		case *pubsubpb.ValidateMessageRequest_Name:
			req.SchemaSpec = s
		case *pubsubpb.ValidateMessageRequest_Schema:
			req.SchemaSpec = s
		}
		_, err := sc.ValidateMessage(ctx, req)
		if st := status.Convert(err); st.Code() != tc.code || !strings.Contains(st.Message(), tc.text) {
			t.Errorf("%s: got %v, want %v containing %q", tc.name, err, tc.code, tc.text)
		}
	}
}

// pullN pulls until n messages came, acking them.
func pullN(t *testing.T, ctx context.Context, sc pubsubpb.SubscriberClient, sub string, n int) []*pubsubpb.PubsubMessage {
	t.Helper()
	var got []*pubsubpb.PubsubMessage
	for len(got) < n {
		rms := pull(t, ctx, sc, sub, int32(n-len(got)))
		var acks []string
		for _, rm := range rms {
			got = append(got, rm.Message)
			acks = append(acks, rm.AckId)
		}
		if len(acks) > 0 {
			if _, err := sc.Acknowledge(ctx, &pubsubpb.AcknowledgeRequest{Subscription: sub, AckIds: acks}); err != nil {
				t.Fatal(err)
			}
		}
	}
	return got
}

// schemaRefusal checks Google's answer to a batch with a message that
// fits no revision: the text, and the ErrorInfo with reason and revision.
func schemaRefusal(t *testing.T, err error, reason, lastRevision string) {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != codes.InvalidArgument || st.Message() != "Invalid data in message: Message failed schema validation." {
		t.Fatalf("got %v, want Google's schema refusal", err)
	}
	for _, d := range st.Details() {
		if ei, ok := d.(*errdetails.ErrorInfo); ok {
			info := ei.Metadata["revisionInfo"]
			if ei.Reason != reason || ei.Domain != "pubsub.googleapis.com" || ei.Metadata["message"] != "Message failed schema validation" ||
				!strings.HasPrefix(info, "Could not validate message with any schema revision for schema: ") ||
				!strings.Contains(info, "last checked revision: revision_id="+lastRevision+" failed with status: ") {
				t.Fatalf("error info %v, want reason %s and last revision %s", ei, reason, lastRevision)
			}
			return
		}
	}
	t.Fatalf("no ErrorInfo in %v", st.Details())
}

// TestSchemaPublish: a topic with a schema refuses a batch with one
// non-conforming message as a whole and stores nothing of it; delivered
// messages carry Google's schema attributes. Avro and Protocol Buffers,
// JSON and BINARY.
func TestSchemaPublish(t *testing.T) {
	e := startEnv(t)
	c := e.v2()
	sc := e.schemaClient()
	ctx := ctxT(t, 60*time.Second)
	parent := "projects/" + e.project
	subs := rawSubscriber(t, e)
	pub := rawPublisher(t, e)
	if enc := avroBinary(t, avroStateDef, map[string]any{"name": "Alaska", "post_abbr": "AK"}); string(enc) != alaskaBinary {
		t.Fatalf("hamba encodes %q, the test's literal is %q", enc, alaskaBinary)
	}
	for _, tc := range []struct {
		name   string
		typ    pubsubpb.Schema_Type
		def    string
		enc    pubsubpb.Encoding
		good   string
		bad    string
		reason string
	}{
		{"avro-json", pubsubpb.Schema_AVRO, avroStateDef, pubsubpb.Encoding_JSON, alaskaJSON, `{"name":"Alaska"}`, "INVALID_JSON_AVRO_MESSAGE"},
		{"avro-binary", pubsubpb.Schema_AVRO, avroStateDef, pubsubpb.Encoding_BINARY, alaskaBinary, alaskaBinary[:4], "INVALID_BINARY_AVRO_MESSAGE"},
		{"proto-json", pubsubpb.Schema_PROTOCOL_BUFFER, protoStateDef, pubsubpb.Encoding_JSON, `{"name":"Alaska","post_abbr":"AK"}`, `{"name":7}`, "INVALID_JSON_PROTO_MESSAGE"},
		{"proto-binary", pubsubpb.Schema_PROTOCOL_BUFFER, protoStateDef, pubsubpb.Encoding_BINARY, alaskaProtoBn, "\xff", "INVALID_BINARY_PROTO_MESSAGE"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sid, tid, subID := e.id("s-"+tc.name), e.id("t-"+tc.name), e.id("sub-"+tc.name)
			s, err := sc.CreateSchema(ctx, &pubsubpb.CreateSchemaRequest{Parent: parent, SchemaId: sid, Schema: &pubsubpb.Schema{Type: tc.typ, Definition: tc.def}})
			if err != nil {
				t.Fatal(err)
			}
			topic, err := c.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: e.topicName(tid),
				SchemaSettings: &pubsubpb.SchemaSettings{Schema: e.schemaName(sid), Encoding: tc.enc}})
			if err != nil {
				t.Fatal(err)
			}
			if ss := topic.SchemaSettings; ss.Schema != e.schemaName(sid) || ss.Encoding != tc.enc {
				t.Fatalf("topic settings %v", ss)
			}
			e.createSub(ctx, &pubsubpb.Subscription{Name: e.subName(subID), Topic: e.topicName(tid)})
			_, err = pub.Publish(ctx, &pubsubpb.PublishRequest{Topic: e.topicName(tid), Messages: []*pubsubpb.PubsubMessage{
				{Data: []byte(tc.good), Attributes: map[string]string{"i": "0"}}, {Data: []byte(tc.bad)}, {Data: []byte(tc.good)}}})
			schemaRefusal(t, err, tc.reason, s.RevisionId)
			// The Go client's publisher gets the same refusal.
			p := c.Publisher(tid)
			_, err = p.Publish(ctx, &pubsub.Message{Data: []byte(tc.bad)}).Get(ctx)
			p.Stop()
			schemaRefusal(t, err, tc.reason, s.RevisionId)
			resp, err := pub.Publish(ctx, &pubsubpb.PublishRequest{Topic: e.topicName(tid), Messages: []*pubsubpb.PubsubMessage{
				{Data: []byte(tc.good), Attributes: map[string]string{"i": "1"}}}})
			if err != nil {
				t.Fatal(err)
			}
			got := pullN(t, ctx, subs, e.subName(subID), 1)
			m := got[0]
			if m.MessageId != resp.MessageIds[0] || string(m.Data) != tc.good {
				t.Fatalf("received %v, want only the accepted message %s", m, resp.MessageIds[0])
			}
			wantAttrs := map[string]string{"i": "1", "googclient_schemaname": e.schemaName(sid),
				"googclient_schemaencoding": tc.enc.String(), "googclient_schemarevisionid": s.RevisionId}
			if !mapsEqual(m.Attributes, wantAttrs) {
				t.Fatalf("attributes %v, want %v", m.Attributes, wantAttrs)
			}
			// Nothing of the refused batch waits behind it.
			if rms := pullBriefly(t, subs, e.subName(subID)); len(rms) != 0 {
				t.Fatalf("refused messages were stored: %v", rms)
			}
		})
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// pullBriefly pulls once with a short deadline (an empty answer is normal).
func pullBriefly(t *testing.T, sc pubsubpb.SubscriberClient, sub string) []*pubsubpb.ReceivedMessage {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	resp, err := sc.Pull(ctx, &pubsubpb.PullRequest{Subscription: sub, MaxMessages: 10})
	if status.Code(err) == codes.DeadlineExceeded {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return resp.ReceivedMessages
}

// TestSchemaRevisionRange: a topic validates against the revisions of its
// range, newest first, names the one that matched, and keeps its bounds
// when a range end is deleted (by creation time, as Google does).
func TestSchemaRevisionRange(t *testing.T) {
	e := startEnv(t)
	c := e.v2()
	sc := e.schemaClient()
	ta := c.TopicAdminClient
	ctx := ctxT(t, 60*time.Second)
	parent := "projects/" + e.project
	sid := e.id("states")
	r1, err := sc.CreateSchema(ctx, &pubsubpb.CreateSchemaRequest{Parent: parent, SchemaId: sid, Schema: &pubsubpb.Schema{Type: pubsubpb.Schema_AVRO, Definition: avroStateDef}})
	if err != nil {
		t.Fatal(err)
	}
	r2, err := sc.CommitSchema(ctx, &pubsubpb.CommitSchemaRequest{Name: e.schemaName(sid), Schema: &pubsubpb.Schema{Type: pubsubpb.Schema_AVRO, Definition: avroStateV2}})
	if err != nil {
		t.Fatal(err)
	}
	r3, err := sc.CommitSchema(ctx, &pubsubpb.CommitSchemaRequest{Name: e.schemaName(sid), Schema: &pubsubpb.Schema{Type: pubsubpb.Schema_AVRO, Definition: avroStateDef}})
	if err != nil {
		t.Fatal(err)
	}
	ss := func(first, last string) *pubsubpb.SchemaSettings {
		return &pubsubpb.SchemaSettings{Schema: e.schemaName(sid), Encoding: pubsubpb.Encoding_JSON, FirstRevisionId: first, LastRevisionId: last}
	}
	for _, tc := range []struct {
		name string
		ss   *pubsubpb.SchemaSettings
		code codes.Code
		text string
	}{
		{"missing schema", &pubsubpb.SchemaSettings{Schema: e.schemaName(e.id("missing")), Encoding: pubsubpb.Encoding_JSON}, codes.NotFound, "Schema could not be found"},
		{"no encoding", &pubsubpb.SchemaSettings{Schema: e.schemaName(sid)}, codes.InvalidArgument, "Invalid schema encoding provided"},
		{"bad encoding", &pubsubpb.SchemaSettings{Schema: e.schemaName(sid), Encoding: 7}, codes.InvalidArgument, "Invalid schema encoding provided"},
		{"no schema name", &pubsubpb.SchemaSettings{Encoding: pubsubpb.Encoding_JSON}, codes.InvalidArgument, "No schema name provided"},
		{"bad schema name", &pubsubpb.SchemaSettings{Schema: "foo", Encoding: pubsubpb.Encoding_JSON}, codes.InvalidArgument, "Invalid resource name"},
		{"missing first", ss("deadbeef", ""), codes.NotFound, "First revision could not be found"},
		{"missing last", ss("", "deadbeef"), codes.NotFound, "Last revision could not be found"},
		{"first after last", ss(r2.RevisionId, r1.RevisionId), codes.InvalidArgument, "First revision creation time is after last revision creation time"},
	} {
		_, err := ta.CreateTopic(ctx, &pubsubpb.Topic{Name: e.topicName(e.id("bad")), SchemaSettings: tc.ss})
		if st := status.Convert(err); st.Code() != tc.code || !strings.Contains(st.Message(), tc.text) {
			t.Errorf("%s: got %v, want %v containing %q", tc.name, err, tc.code, tc.text)
		}
	}

	pub := rawPublisher(t, e)
	publish := func(tid, data string) (string, error) {
		resp, err := pub.Publish(ctx, &pubsubpb.PublishRequest{Topic: e.topicName(tid), Messages: []*pubsubpb.PubsubMessage{{Data: []byte(data)}}})
		if err != nil {
			return "", err
		}
		return resp.MessageIds[0], nil
	}
	subs := rawSubscriber(t, e)
	// Revisions are tried newest first and the first that fits is named.
	// Extra members of a record are ignored (as by Google's validator), so
	// v2 data fits v1's definition too: with the whole range both kinds of
	// data match r3; up to r2, v1 data matches only r1.
	all, upto2, only2 := e.id("all"), e.id("upto2"), e.id("only2")
	for _, tc := range []struct {
		tid  string
		ss   *pubsubpb.SchemaSettings
		want [2]string // matched revision of v1 data, of v2 data
	}{
		{all, ss("", ""), [2]string{r3.RevisionId, r3.RevisionId}},
		{upto2, ss("", r2.RevisionId), [2]string{r1.RevisionId, r2.RevisionId}},
	} {
		if _, err := ta.CreateTopic(ctx, &pubsubpb.Topic{Name: e.topicName(tc.tid), SchemaSettings: tc.ss}); err != nil {
			t.Fatal(err)
		}
		e.createSub(ctx, &pubsubpb.Subscription{Name: e.subName(tc.tid), Topic: e.topicName(tc.tid)})
		for _, d := range []string{alaskaJSON, alaskaV2JSON} {
			if _, err := publish(tc.tid, d); err != nil {
				t.Fatal(err)
			}
		}
		got := pullN(t, ctx, subs, e.subName(tc.tid), 2)
		slices.SortFunc(got, func(a, b *pubsubpb.PubsubMessage) int { return len(a.Data) - len(b.Data) })
		if g := [2]string{got[0].Attributes["googclient_schemarevisionid"], got[1].Attributes["googclient_schemarevisionid"]}; g != tc.want {
			t.Fatalf("%s: matched revisions %v, want %v", tc.tid, g, tc.want)
		}
	}
	// [r2, r2]: v1 data fits no revision of the range.
	top, err := ta.CreateTopic(ctx, &pubsubpb.Topic{Name: e.topicName(only2), SchemaSettings: ss(r2.RevisionId, r2.RevisionId)})
	if err != nil {
		t.Fatal(err)
	}
	if top.SchemaSettings.FirstRevisionId != r2.RevisionId || top.SchemaSettings.LastRevisionId != r2.RevisionId {
		t.Fatalf("range %v", top.SchemaSettings)
	}
	_, err = publish(only2, alaskaJSON)
	schemaRefusal(t, err, "INVALID_JSON_AVRO_MESSAGE", r2.RevisionId)
	if _, err := publish(only2, alaskaV2JSON); err != nil {
		t.Fatal(err)
	}
	// [r2, ]: a rollback to r1 adds a revision inside the range.
	from2 := e.id("from2")
	if _, err := ta.CreateTopic(ctx, &pubsubpb.Topic{Name: e.topicName(from2), SchemaSettings: ss(r2.RevisionId, "")}); err != nil {
		t.Fatal(err)
	}
	if _, err := publish(from2, alaskaJSON); err != nil { // r3 has v1's definition
		t.Fatal(err)
	}
	// Deleting r2, the range's end, bounds it still: r1's definition (now
	// only in r3 and the rollback) is in, r1 itself is not.
	if _, err := sc.DeleteSchemaRevision(ctx, &pubsubpb.DeleteSchemaRevisionRequest{Name: e.schemaName(sid) + "@" + r2.RevisionId}); err != nil {
		t.Fatal(err)
	}
	gt, err := ta.GetTopic(ctx, &pubsubpb.GetTopicRequest{Topic: e.topicName(only2)})
	if err != nil || gt.SchemaSettings.FirstRevisionId != "_deleted-schema-revision_" || gt.SchemaSettings.LastRevisionId != "_deleted-schema-revision_" ||
		gt.SchemaSettings.Schema != e.schemaName(sid) {
		t.Fatalf("topic after its range's revision was deleted: %v %v", gt, err)
	}
	_, err = publish(only2, alaskaV2JSON)
	st := status.Convert(err)
	if st.Code() != codes.InvalidArgument || !strings.Contains(fmt.Sprint(st.Details()), "holds no revision") {
		t.Fatalf("publish to an emptied range: %v %v", err, st.Details())
	}
	// UpdateTopic: the v1 client's per-field paths, then the whole message.
	up, err := ta.UpdateTopic(ctx, &pubsubpb.UpdateTopicRequest{Topic: &pubsubpb.Topic{Name: e.topicName(only2), SchemaSettings: &pubsubpb.SchemaSettings{FirstRevisionId: r1.RevisionId, LastRevisionId: r3.RevisionId}},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"schema_settings.first_revision_id", "schema_settings.last_revision_id"}}})
	if err != nil || up.SchemaSettings.FirstRevisionId != r1.RevisionId || up.SchemaSettings.Encoding != pubsubpb.Encoding_JSON {
		t.Fatalf("update range: %v %v", up, err)
	}
	if _, err := publish(only2, alaskaJSON); err != nil {
		t.Fatal(err)
	}
	_, err = ta.UpdateTopic(ctx, &pubsubpb.UpdateTopicRequest{Topic: &pubsubpb.Topic{Name: e.topicName(only2), SchemaSettings: &pubsubpb.SchemaSettings{FirstRevisionId: "deadbeef"}},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"schema_settings.first_revision_id"}}})
	wantCode(t, err, codes.NotFound, "First revision could not be found")
	up, err = ta.UpdateTopic(ctx, &pubsubpb.UpdateTopicRequest{Topic: &pubsubpb.Topic{Name: e.topicName(only2)},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"schema_settings"}}})
	if err != nil || up.SchemaSettings != nil {
		t.Fatalf("clear schema settings: %v %v", up, err)
	}
	if _, err := publish(only2, "not avro"); err != nil {
		t.Fatalf("publish without a schema: %v", err)
	}
	if _, err := ta.UpdateTopic(ctx, &pubsubpb.UpdateTopicRequest{Topic: &pubsubpb.Topic{Name: e.topicName(only2), SchemaSettings: ss("", "")},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"schema_settings"}}}); err != nil {
		t.Fatal(err)
	}
	_, err = publish(only2, "not avro")
	schemaRefusal(t, err, "INVALID_JSON_AVRO_MESSAGE", r1.RevisionId)

	// DeleteSchema: the topic stays, names "_deleted-schema_", refuses
	// publishes; a schema created under the same id is not its schema.
	if err := sc.DeleteSchema(ctx, &pubsubpb.DeleteSchemaRequest{Name: e.schemaName(sid)}); err != nil {
		t.Fatal(err)
	}
	for _, tid := range []string{all, only2} {
		gt, err := ta.GetTopic(ctx, &pubsubpb.GetTopicRequest{Topic: e.topicName(tid)})
		if err != nil || gt.SchemaSettings.Schema != "_deleted-schema_" || gt.SchemaSettings.Encoding != pubsubpb.Encoding_JSON {
			t.Fatalf("topic after its schema was deleted: %v %v", gt, err)
		}
		_, err = publish(tid, alaskaJSON)
		wantCode(t, err, codes.NotFound, "Schema associated with topic deleted.")
	}
	if _, err := sc.CreateSchema(ctx, &pubsubpb.CreateSchemaRequest{Parent: parent, SchemaId: sid, Schema: &pubsubpb.Schema{Type: pubsubpb.Schema_AVRO, Definition: avroStateDef}}); err != nil {
		t.Fatal(err)
	}
	_, err = publish(all, alaskaJSON)
	wantCode(t, err, codes.NotFound, "Schema associated with topic deleted.")
	// Topics without a schema may be updated as before; one that names the
	// new schema binds to it.
	if _, err := ta.UpdateTopic(ctx, &pubsubpb.UpdateTopicRequest{Topic: &pubsubpb.Topic{Name: e.topicName(all), Labels: map[string]string{"a": "b"}},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"labels"}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := ta.UpdateTopic(ctx, &pubsubpb.UpdateTopicRequest{Topic: &pubsubpb.Topic{Name: e.topicName(all), SchemaSettings: &pubsubpb.SchemaSettings{Schema: e.schemaName(sid)}},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"schema_settings.schema"}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := publish(all, alaskaJSON); err != nil {
		t.Fatal(err)
	}
}

// TestSchemaV1Client: the previous client generation's SchemaClient and
// TopicConfig.SchemaSettings (whose updates send per-field mask paths).
func TestSchemaV1Client(t *testing.T) {
	e := startEnv(t)
	ctx := ctxT(t, 60*time.Second)
	sc, err := pubsubv1.NewSchemaClient(ctx, e.project, e.clientOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	c := e.v1()
	id := e.id("v1states")
	cfg, err := sc.CreateSchema(ctx, id, pubsubv1.SchemaConfig{Type: pubsubv1.SchemaAvro, Definition: avroStateDef})
	if err != nil || cfg.Name != e.schemaName(id) || cfg.RevisionID == "" {
		t.Fatalf("create: %+v %v", cfg, err)
	}
	got, err := sc.Schema(ctx, id, pubsubv1.SchemaViewFull)
	if err != nil || got.Definition != avroStateDef {
		t.Fatalf("get: %+v %v", got, err)
	}
	var n int
	for it := sc.Schemas(ctx, pubsubv1.SchemaViewBasic); ; n++ {
		s, err := it.Next()
		if errors.Is(err, iterator.Done) {
			break
		}
		if err != nil || s.Definition != "" {
			t.Fatalf("list: %+v %v", s, err)
		}
	}
	if n != 1 {
		t.Fatalf("listed %d schemas", n)
	}
	c2, err := sc.CommitSchema(ctx, id, pubsubv1.SchemaConfig{Type: pubsubv1.SchemaAvro, Definition: avroStateV2})
	if err != nil {
		t.Fatal(err)
	}
	rb, err := sc.RollbackSchema(ctx, id, cfg.RevisionID)
	if err != nil || rb.Definition != avroStateDef {
		t.Fatalf("rollback: %+v %v", rb, err)
	}
	var revs []string
	for it := sc.ListSchemaRevisions(ctx, id, pubsubv1.SchemaViewFull); ; {
		s, err := it.Next()
		if errors.Is(err, iterator.Done) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		revs = append(revs, s.RevisionID)
	}
	if !slices.Equal(revs, []string{rb.RevisionID, c2.RevisionID, cfg.RevisionID}) {
		t.Fatalf("revisions %v", revs)
	}
	if _, err := sc.DeleteSchemaRevision(ctx, id, c2.RevisionID); err != nil {
		t.Fatal(err)
	}
	if _, err := sc.ValidateSchema(ctx, pubsubv1.SchemaConfig{Type: pubsubv1.SchemaProtocolBuffer, Definition: protoStateDef}); err != nil {
		t.Fatal(err)
	}
	if _, err := sc.ValidateMessageWithID(ctx, []byte(alaskaJSON), pubsubv1.EncodingJSON, id); err != nil {
		t.Fatal(err)
	}
	if _, err := sc.ValidateMessageWithConfig(ctx, []byte(alaskaBinary), pubsubv1.EncodingBinary, pubsubv1.SchemaConfig{Type: pubsubv1.SchemaAvro, Definition: avroStateDef}); err != nil {
		t.Fatal(err)
	}
	if _, err := sc.ValidateMessageWithID(ctx, []byte("{}"), pubsubv1.EncodingJSON, id); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("invalid message: %v", err)
	}

	// A topic created without a schema gets one through Update (per-field
	// paths), and loses it again through the zero SchemaSettings.
	tp, err := c.CreateTopic(ctx, e.id("v1topic"))
	if err != nil {
		t.Fatal(err)
	}
	tc, err := tp.Update(ctx, pubsubv1.TopicConfigToUpdate{SchemaSettings: &pubsubv1.SchemaSettings{Schema: e.schemaName(id), Encoding: pubsubv1.EncodingJSON}})
	if err != nil || tc.SchemaSettings == nil || tc.SchemaSettings.Schema != e.schemaName(id) || tc.SchemaSettings.Encoding != pubsubv1.EncodingJSON {
		t.Fatalf("update: %+v %v", tc.SchemaSettings, err)
	}
	if _, err := tp.Publish(ctx, &pubsubv1.Message{Data: []byte("nope")}).Get(ctx); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("publish of non-conforming data: %v", err)
	}
	if _, err := tp.Publish(ctx, &pubsubv1.Message{Data: []byte(alaskaJSON)}).Get(ctx); err != nil {
		t.Fatal(err)
	}
	tc, err = tp.Update(ctx, pubsubv1.TopicConfigToUpdate{SchemaSettings: &pubsubv1.SchemaSettings{}})
	if err != nil || tc.SchemaSettings != nil {
		t.Fatalf("remove schema: %+v %v", tc.SchemaSettings, err)
	}
	tp.Stop()
	with, err := c.CreateTopicWithConfig(ctx, e.id("v1with"), &pubsubv1.TopicConfig{SchemaSettings: &pubsubv1.SchemaSettings{Schema: e.schemaName(id), Encoding: pubsubv1.EncodingBinary}})
	if err != nil {
		t.Fatal(err)
	}
	defer with.Stop()
	if _, err := with.Publish(ctx, &pubsubv1.Message{Data: []byte(alaskaBinary)}).Get(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sc.DeleteSchema(ctx, id); err != nil {
		t.Fatal(err)
	}
	wc, err := with.Config(ctx)
	if err != nil || wc.SchemaSettings.Schema != "_deleted-schema_" {
		t.Fatalf("topic config after delete: %+v %v", wc.SchemaSettings, err)
	}
}

// TestSchemasSharedAndDurable: schemas are registry records: a second
// replica enforces a schema created through the first, and both survive a
// restart.
func TestSchemasSharedAndDurable(t *testing.T) {
	e := startEnv(t)
	ctx := ctxT(t, 60*time.Second)
	sc := e.schemaClient()
	sid, tid := e.id("states"), e.id("t")
	r1, err := sc.CreateSchema(ctx, &pubsubpb.CreateSchemaRequest{Parent: "projects/" + e.project, SchemaId: sid,
		Schema: &pubsubpb.Schema{Type: pubsubpb.Schema_PROTOCOL_BUFFER, Definition: protoStateDef}})
	if err != nil {
		t.Fatal(err)
	}
	// The second revision is a pre-compiled descriptor set.
	r2, err := sc.CommitSchema(ctx, &pubsubpb.CommitSchemaRequest{Name: e.schemaName(sid), Schema: &pubsubpb.Schema{Type: pubsubpb.Schema_PROTOCOL_BUFFER,
		Configuration: &pubsubpb.Schema_CompiledProtoSchema{CompiledProtoSchema: &pubsubpb.CompiledProtoSchema{RootMessage: "google.protobuf.Timestamp", CompiledBytes: timestampDescriptorSet(t)}}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rawPublisher(t, e).CreateTopic(ctx, &pubsubpb.Topic{Name: e.topicName(tid), SchemaSettings: &pubsubpb.SchemaSettings{Schema: e.schemaName(sid), Encoding: pubsubpb.Encoding_JSON}}); err != nil {
		t.Fatal(err)
	}
	check := func(addr string) {
		t.Helper()
		conn := connAt(t, addr)
		pub := pubsubpb.NewPublisherClient(conn)
		// A Timestamp (r2) and a State (r1) in one batch.
		if _, err := pub.Publish(ctx, &pubsubpb.PublishRequest{Topic: e.topicName(tid), Messages: []*pubsubpb.PubsubMessage{
			{Data: []byte(`"2024-05-06T07:08:09Z"`)}, {Data: []byte(`{"name":"x"}`)}}}); err != nil {
			t.Fatalf("%s: %v", addr, err)
		}
		_, err := pub.Publish(ctx, &pubsubpb.PublishRequest{Topic: e.topicName(tid), Messages: []*pubsubpb.PubsubMessage{{Data: []byte(`{"nope":1}`)}}})
		schemaRefusal(t, err, "INVALID_JSON_PROTO_MESSAGE", r1.RevisionId)
		got, err := pubsubpb.NewSchemaServiceClient(conn).GetSchema(ctx, &pubsubpb.GetSchemaRequest{Name: e.schemaName(sid)})
		if err != nil || got.RevisionId != r2.RevisionId || got.GetCompiledProtoSchema().GetRootMessage() != "google.protobuf.Timestamp" {
			t.Fatalf("%s: get: %v %v", addr, got, err)
		}
	}
	addr2, _, stop2 := e.startReplica()
	defer stop2()
	check(addr2)
	e.stop()
	stop2()
	addr3, _, stop3 := e.startReplica()
	defer stop3()
	check(addr3)
}

func timestampDescriptorSet(t testing.TB) []byte {
	fds := &descriptorpb.FileDescriptorSet{File: []*descriptorpb.FileDescriptorProto{
		protodesc.ToFileDescriptorProto((&timestamppb.Timestamp{}).ProtoReflect().Descriptor().ParentFile())}}
	b, err := proto.Marshal(fds)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// avroBinary encodes v with hamba, as a publisher would.
func avroBinary(t testing.TB, def string, v any) []byte {
	b, err := avro.Marshal(avro.MustParse(def), v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
