package gcp_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/api/iterator"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	vkit "cloud.google.com/go/pubsub/v2/apiv1"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
)

// startPubSubEmulator runs Google's Pub/Sub emulator (gcloud beta
// emulators pubsub) on a free loopback port and returns its address; the
// test is skipped when gcloud or the emulator component is not installed.
// The emulator (a JVM) is stopped, with the process group it started, at
// cleanup.
func startPubSubEmulator(t *testing.T) string {
	t.Helper()
	gcloud, err := exec.LookPath("gcloud")
	if err != nil {
		t.Skip("gcloud is not installed: no differential run against Google's Pub/Sub emulator")
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	cmd := exec.Command(gcloud, "beta", "emulators", "pubsub", "start", "--quiet", "--host-port="+addr, "--data-dir="+t.TempDir())
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Skipf("cannot start the emulator: %v", err)
	}
	exited := make(chan struct{})
	var werr error
	go func() { werr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
	})
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	deadline := time.Now().Add(3 * time.Minute) // a JVM on a loaded machine
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := pubsubpb.NewPublisherClient(conn).ListTopics(ctx, &pubsubpb.ListTopicsRequest{Project: "projects/probe"})
		cancel()
		if err == nil {
			return addr
		}
		select {
		case <-exited:
			t.Skipf("the Pub/Sub emulator exited (%v) before serving; is the component installed?\n%s", werr, out.String())
		case <-time.After(250 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("the Pub/Sub emulator did not serve within 3 minutes: %v\n%s", err, out.String())
		}
	}
}

// How a step's outcomes are compared.
type diffMode int

const (
	diffExact  diffMode = iota // code, message and result equal
	diffPrefix                 // same code; the proxy's message starts with the emulator's (it adds the reason)
	diffCode                   // same code only: a documented difference in text (see the step)
)

type diffStep struct {
	name string
	mode diffMode
	code codes.Code
	msg  string
	got  string
}

// schemaScript is one run of the differential script against one server.
type schemaScript struct {
	t       *testing.T
	ctx     context.Context
	project string
	suffix  string
	sc      *vkit.SchemaClient
	tc      *vkit.TopicAdminClient
	subc    *vkit.SubscriptionAdminClient
	revs    []string // revision ids in order of appearance: printed as r1, r2, ...
	steps   []diffStep
}

func newSchemaScript(t *testing.T, addr, project, suffix string) *schemaScript {
	opts := []option.ClientOption{option.WithEndpoint(addr), option.WithoutAuthentication(),
		option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials()))}
	ctx := ctxT(t, 3*time.Minute)
	sc, err := vkit.NewSchemaClient(ctx, opts...)
	if err != nil {
		t.Fatal(err)
	}
	tc, err := vkit.NewTopicAdminClient(ctx, opts...)
	if err != nil {
		t.Fatal(err)
	}
	subc, err := vkit.NewSubscriptionAdminClient(ctx, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sc.Close(); tc.Close(); subc.Close() })
	return &schemaScript{t: t, ctx: ctx, project: project, suffix: suffix, sc: sc, tc: tc, subc: subc}
}

// rev names a revision id by its order of appearance.
func (s *schemaScript) rev(id string) string {
	if id == "" || strings.HasPrefix(id, "_") {
		return id
	}
	i := slices.Index(s.revs, id)
	if i < 0 {
		s.revs = append(s.revs, id)
		i = len(s.revs) - 1
	}
	return fmt.Sprintf("r%d", i+1)
}

// realRev is the id printed as rN.
func (s *schemaScript) realRev(n int) string {
	if n > len(s.revs) {
		return "deadbeef"
	}
	return s.revs[n-1]
}

func (s *schemaScript) schemaStr(sc *pubsubpb.Schema) string {
	if sc == nil {
		return ""
	}
	return fmt.Sprintf("%s %v rev=%s def=%q", sc.Name, sc.Type, s.rev(sc.RevisionId), sc.Definition)
}

func (s *schemaScript) topicStr(tp *pubsubpb.Topic) string {
	if tp == nil {
		return ""
	}
	ss := tp.SchemaSettings
	if ss == nil {
		return tp.Name + " no schema"
	}
	return fmt.Sprintf("%s schema=%s enc=%v first=%s last=%s", tp.Name, ss.Schema, ss.Encoding, s.rev(ss.FirstRevisionId), s.rev(ss.LastRevisionId))
}

func (s *schemaScript) step(name string, mode diffMode, got string, err error) {
	st := status.Convert(err)
	s.steps = append(s.steps, diffStep{name: name, mode: mode, code: st.Code(), msg: st.Message(), got: got})
}

func (s *schemaScript) name(kind, id string) string {
	return "projects/" + s.project + "/" + kind + "/" + id + "-" + s.suffix
}

func (s *schemaScript) run() {
	ctx, sc, tc := s.ctx, s.sc, s.tc
	parent := "projects/" + s.project
	sid, sid2 := "sch-"+s.suffix, "one-"+s.suffix
	sname := s.name("schemas", "sch")
	avro := func(def string) *pubsubpb.Schema {
		return &pubsubpb.Schema{Type: pubsubpb.Schema_AVRO, Definition: def}
	}
	create := func(name string, mode diffMode, id string, schema *pubsubpb.Schema) {
		r, err := sc.CreateSchema(ctx, &pubsubpb.CreateSchemaRequest{Parent: parent, SchemaId: id, Schema: schema})
		s.step(name, mode, s.schemaStr(r), err)
	}
	get := func(name string, mode diffMode, n string, view pubsubpb.SchemaView) {
		r, err := sc.GetSchema(ctx, &pubsubpb.GetSchemaRequest{Name: n, View: view})
		s.step(name, mode, s.schemaStr(r), err)
	}
	commit := func(name string, mode diffMode, n, def string) {
		r, err := sc.CommitSchema(ctx, &pubsubpb.CommitSchemaRequest{Name: n, Schema: avro(def)})
		s.step(name, mode, s.schemaStr(r), err)
	}
	create("create", diffExact, sid, avro(avroStateDef))
	create("create duplicate", diffExact, sid, avro(avroStateDef))
	create("create bad definition", diffPrefix, "bad-"+s.suffix, avro(`{"type":"record"}`))
	create("create unspecified type", diffExact, "bad-"+s.suffix, &pubsubpb.Schema{Definition: avroStateDef})
	create("create no schema", diffExact, "bad-"+s.suffix, nil)
	get("get basic", diffExact, sname, pubsubpb.SchemaView_BASIC)
	get("get full", diffExact, sname, pubsubpb.SchemaView_FULL)
	get("get missing", diffExact, sname+"x", pubsubpb.SchemaView_FULL)
	get("get missing revision", diffExact, sname+"@deadbeef", pubsubpb.SchemaView_FULL)
	commit("commit", diffExact, sname, avroStateV2)
	commit("commit missing", diffExact, sname+"x", avroStateV2)
	commit("commit bad definition", diffPrefix, sname, "nope")
	rollback := func(name string, mode diffMode, n, rev string) {
		r, err := sc.RollbackSchema(ctx, &pubsubpb.RollbackSchemaRequest{Name: n, RevisionId: rev})
		s.step(name, mode, s.schemaStr(r), err)
	}
	rollback("rollback", diffExact, sname, s.realRev(1))
	rollback("rollback missing revision", diffExact, sname, "deadbeef")
	rollback("rollback no revision", diffExact, sname, "")
	rollback("rollback missing schema", diffExact, sname+"x", s.realRev(1))
	get("get at revision", diffExact, sname+"@"+s.realRev(2), pubsubpb.SchemaView_FULL)
	// The emulator lists revisions oldest first; the proxy newest first
	// (Google's AIP-162 for revision lists): compared as sets.
	for _, view := range []pubsubpb.SchemaView{pubsubpb.SchemaView_BASIC, pubsubpb.SchemaView_FULL} {
		var all []string
		it := sc.ListSchemaRevisions(ctx, &pubsubpb.ListSchemaRevisionsRequest{Name: sname, View: view})
		var err error
		for {
			var r *pubsubpb.Schema
			if r, err = it.Next(); err != nil {
				break
			}
			all = append(all, s.schemaStr(r))
		}
		if err == iterator.Done {
			err = nil
		}
		slices.Sort(all)
		s.step("list revisions "+view.String(), diffExact, strings.Join(all, "\n"), err)
	}

	_, err := sc.ValidateSchema(ctx, &pubsubpb.ValidateSchemaRequest{Parent: parent, Schema: avro(avroStateDef)})
	s.step("validate schema", diffExact, "", err)
	_, err = sc.ValidateSchema(ctx, &pubsubpb.ValidateSchemaRequest{Parent: parent, Schema: avro(`{"type":"recor"}`)})
	s.step("validate bad schema", diffPrefix, "", err)
	_, err = sc.ValidateSchema(ctx, &pubsubpb.ValidateSchemaRequest{Parent: parent})
	s.step("validate no schema", diffExact, "", err)

	vm := func(name string, mode diffMode, spec any, msg string, enc pubsubpb.Encoding) {
		req := &pubsubpb.ValidateMessageRequest{Parent: parent, Message: []byte(msg), Encoding: enc}
		switch sp := spec.(type) {
		case string:
			req.SchemaSpec = &pubsubpb.ValidateMessageRequest_Name{Name: sp}
		case *pubsubpb.Schema:
			req.SchemaSpec = &pubsubpb.ValidateMessageRequest_Schema{Schema: sp}
		}
		_, err := sc.ValidateMessage(ctx, req)
		s.step(name, mode, "", err)
	}
	// The newest revision (r3, the rollback) has the first definition.
	vm("message json", diffExact, sname, alaskaJSON, pubsubpb.Encoding_JSON)
	vm("message json wrong type", diffPrefix, sname, `{"name":"Alaska","post_abbr":1}`, pubsubpb.Encoding_JSON)
	vm("message json missing field", diffPrefix, sname+"@"+s.realRev(2), alaskaJSON, pubsubpb.Encoding_JSON)
	vm("message json union", diffExact, sname+"@"+s.realRev(2), alaskaV2JSON, pubsubpb.Encoding_JSON)
	vm("message json bare union", diffPrefix, sname+"@"+s.realRev(2), `{"name":"Alaska","post_abbr":"AK","capital":"Juneau"}`, pubsubpb.Encoding_JSON)
	vm("message binary", diffExact, sname, alaskaBinary, pubsubpb.Encoding_BINARY)
	vm("message binary short", diffPrefix, sname, alaskaBinary[:5], pubsubpb.Encoding_BINARY)
	vm("message missing schema", diffExact, sname+"x", alaskaJSON, pubsubpb.Encoding_JSON)
	vm("message missing revision", diffExact, sname+"@deadbeef", alaskaJSON, pubsubpb.Encoding_JSON)
	vm("message no encoding", diffExact, sname, alaskaJSON, pubsubpb.Encoding_ENCODING_UNSPECIFIED)
	vm("message inline", diffExact, avro(avroStateDef), alaskaJSON, pubsubpb.Encoding_JSON)
	vm("message inline bad definition", diffPrefix, avro("x"), alaskaJSON, pubsubpb.Encoding_JSON)
	vm("message no schema", diffExact, nil, alaskaJSON, pubsubpb.Encoding_JSON)

	topic := func(name string, mode diffMode, id string, ss *pubsubpb.SchemaSettings) {
		r, err := tc.CreateTopic(ctx, &pubsubpb.Topic{Name: s.name("topics", id), SchemaSettings: ss})
		s.step(name, mode, s.topicStr(r), err)
	}
	ss := func(enc pubsubpb.Encoding, first, last string) *pubsubpb.SchemaSettings {
		return &pubsubpb.SchemaSettings{Schema: sname, Encoding: enc, FirstRevisionId: first, LastRevisionId: last}
	}
	topic("topic missing schema", diffExact, "bad", &pubsubpb.SchemaSettings{Schema: sname + "x", Encoding: pubsubpb.Encoding_JSON})
	topic("topic no encoding", diffExact, "bad", ss(0, "", ""))
	topic("topic no schema name", diffExact, "bad", &pubsubpb.SchemaSettings{Encoding: pubsubpb.Encoding_JSON})
	topic("topic missing first", diffExact, "bad", ss(pubsubpb.Encoding_JSON, "deadbeef", ""))
	topic("topic missing last", diffExact, "bad", ss(pubsubpb.Encoding_JSON, "", "deadbeef"))
	topic("topic first after last", diffExact, "bad", ss(pubsubpb.Encoding_JSON, s.realRev(2), s.realRev(1)))
	topic("topic", diffExact, "all", ss(pubsubpb.Encoding_JSON, "", ""))
	topic("topic range", diffExact, "range", ss(pubsubpb.Encoding_JSON, s.realRev(1), s.realRev(2)))
	for _, id := range []string{"all", "range"} {
		_, err := s.subc.CreateSubscription(ctx, &pubsubpb.Subscription{Name: s.name("subscriptions", id), Topic: s.name("topics", id)})
		s.step("subscription "+id, diffExact, "", err)
	}
	publish := func(name string, mode diffMode, id string, data ...string) {
		req := &pubsubpb.PublishRequest{Topic: s.name("topics", id)}
		for _, d := range data {
			req.Messages = append(req.Messages, &pubsubpb.PubsubMessage{Data: []byte(d)})
		}
		r, err := tc.Publish(ctx, req)
		s.step(name, mode, fmt.Sprint(len(r.GetMessageIds())), err)
	}
	publish("publish", diffExact, "all", alaskaJSON, alaskaV2JSON)
	publish("publish range", diffExact, "range", alaskaJSON, alaskaV2JSON)
	// Google's service answers "Invalid data in message: Message failed
	// schema validation." with an ErrorInfo, the emulator "Could not parse
	// message": the proxy gives Google's.
	publish("publish non-conforming", diffCode, "all", alaskaJSON, `{"name":1}`)
	for _, id := range []string{"all", "range"} {
		var got []string
		for len(got) < 2 {
			resp, err := s.subc.Pull(ctx, &pubsubpb.PullRequest{Subscription: s.name("subscriptions", id), MaxMessages: 10})
			if err != nil {
				s.t.Fatal(err)
			}
			for _, rm := range resp.ReceivedMessages {
				a := rm.Message.Attributes
				got = append(got, fmt.Sprintf("%s name=%s enc=%s rev=%s", rm.Message.Data, a["googclient_schemaname"], a["googclient_schemaencoding"], s.rev(a["googclient_schemarevisionid"])))
			}
		}
		slices.Sort(got)
		s.step("received "+id, diffExact, strings.Join(got, "\n"), nil)
	}

	// Revision limits and deletion.
	for i := 0; i < 17; i++ { // 20 revisions
		if _, err := sc.CommitSchema(ctx, &pubsubpb.CommitSchemaRequest{Name: sname, Schema: avro(avroStateDef)}); err != nil {
			s.t.Fatalf("commit %d: %v", i, err)
		}
	}
	commit("commit past 20 revisions", diffExact, sname, avroStateDef)
	delRev := func(name string, mode diffMode, n string) {
		r, err := sc.DeleteSchemaRevision(ctx, &pubsubpb.DeleteSchemaRevisionRequest{Name: n})
		s.step(name, mode, s.schemaStr(r), err)
	}
	delRev("delete revision", diffExact, sname+"@"+s.realRev(2))
	delRev("delete deleted revision", diffExact, sname+"@"+s.realRev(2))
	delRev("delete revision without id", diffExact, sname)
	gt := func(name string, id string) {
		r, err := tc.GetTopic(ctx, &pubsubpb.GetTopicRequest{Topic: s.name("topics", id)})
		s.step(name, diffExact, s.topicStr(r), err)
	}
	gt("topic after its last revision was deleted", "range")
	create("create single-revision schema", diffExact, sid2, avro(avroStateDef))
	one, err := sc.GetSchema(ctx, &pubsubpb.GetSchemaRequest{Name: s.name("schemas", "one")})
	if err != nil {
		s.t.Fatal(err)
	}
	delRev("delete only revision", diffExact, s.name("schemas", "one")+"@"+one.RevisionId)

	upd := func(name string, mode diffMode, id string, in *pubsubpb.SchemaSettings, paths ...string) {
		r, err := tc.UpdateTopic(ctx, &pubsubpb.UpdateTopicRequest{Topic: &pubsubpb.Topic{Name: s.name("topics", id), SchemaSettings: in},
			UpdateMask: &fieldmaskpb.FieldMask{Paths: paths}})
		s.step(name, mode, s.topicStr(r), err)
	}
	upd("update encoding", diffExact, "all", &pubsubpb.SchemaSettings{Encoding: pubsubpb.Encoding_BINARY}, "schema_settings.encoding")
	upd("update missing first", diffExact, "all", &pubsubpb.SchemaSettings{FirstRevisionId: "deadbeef"}, "schema_settings.first_revision_id")
	upd("update clear", diffExact, "range", nil, "schema_settings")
	publish("publish without schema", diffExact, "range", "anything")

	err = sc.DeleteSchema(ctx, &pubsubpb.DeleteSchemaRequest{Name: sname})
	s.step("delete schema", diffExact, "", err)
	err = sc.DeleteSchema(ctx, &pubsubpb.DeleteSchemaRequest{Name: sname})
	s.step("delete deleted schema", diffExact, "", err)
	// The emulator's text for a malformed name differs from Google's own
	// ("Invalid resource name given ..."), which the proxy gives.
	err = sc.DeleteSchema(ctx, &pubsubpb.DeleteSchemaRequest{Name: s.name("schemas", "one") + "@" + one.RevisionId})
	s.step("delete schema at revision", diffCode, "", err)
	gt("topic after its schema was deleted", "all")
	publish("publish after schema deleted", diffExact, "all", alaskaBinary)
	create("create schema again", diffExact, sid, avro(avroStateDef))
	gt("topic after the schema was created again", "all")
	publish("publish after schema created again", diffExact, "all", alaskaBinary)
}

// TestSchemaDifferential runs one script of SchemaService calls and
// publishes to topics with schemas against Google's Pub/Sub emulator and
// the proxy, and compares the answers step by step. Protocol Buffer
// schemas are left out: the emulator answers them Unimplemented.
func TestSchemaDifferential(t *testing.T) {
	emu := startPubSubEmulator(t)
	e := startEnv(t)
	proxy := newSchemaScript(t, e.addr, e.project, e.suffix)
	proxy.run()
	google := newSchemaScript(t, emu, e.project, e.suffix)
	google.run()
	if len(proxy.steps) != len(google.steps) {
		t.Fatalf("%d steps on the proxy, %d on the emulator", len(proxy.steps), len(google.steps))
	}
	for i, p := range proxy.steps {
		g := google.steps[i]
		ok := p.code == g.code
		switch p.mode {
		case diffExact:
			ok = ok && p.msg == g.msg && p.got == g.got
		case diffPrefix:
			ok = ok && strings.HasPrefix(p.msg, g.msg)
		}
		if !ok {
			t.Errorf("%s:\n  emulator: %v %q %s\n  proxy:    %v %q %s", p.name, g.code, g.msg, g.got, p.code, p.msg, p.got)
		} else {
			t.Logf("%s: %v, emulator %q, proxy %q", p.name, p.code, g.msg, p.msg)
		}
	}
}
