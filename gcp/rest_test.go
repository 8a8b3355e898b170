package gcp_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kubemq-io/kubemq-proxy/gcp"
)

// The Pub/Sub REST API on the gRPC port, driven with plain HTTP requests
// as curl sends them (HTTP/1.1, JSON bodies).

// restClient sends JSON requests to one server.
type restClient struct {
	t    *testing.T
	base string // http://host:port
	hc   *http.Client
}

func newRESTClient(t *testing.T, addr string) *restClient {
	return &restClient{t: t, base: "http://" + addr, hc: &http.Client{Timeout: 60 * time.Second}}
}

// restReply is one response: the HTTP status and the body decoded as JSON.
type restReply struct {
	status int
	body   map[string]any
	raw    string
	header http.Header
}

// do sends method path with body (nil: none; a string: sent as it is;
// anything else: encoded as JSON).
func (c *restClient) do(method, path string, body any) restReply {
	c.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		enc, err := json.Marshal(b)
		if err != nil {
			c.t.Fatal(err)
		}
		rd = bytes.NewReader(enc)
	}
	req, err := http.NewRequest(method, c.base+path, rd)
	if err != nil {
		c.t.Fatal(err)
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatalf("%s %s: reading the body: %v", method, path, err)
	}
	r := restReply{status: resp.StatusCode, raw: string(raw), header: resp.Header}
	if len(bytes.TrimSpace(raw)) > 0 {
		if err := json.Unmarshal(raw, &r.body); err != nil {
			c.t.Fatalf("%s %s: %d with a body that is not a JSON object: %v\n%s", method, path, resp.StatusCode, err, raw)
		}
	}
	return r
}

// str walks the decoded body along keys (map keys, or list indexes as "0").
func (r restReply) str(keys ...string) string {
	v := r.get(keys...)
	switch x := v.(type) {
	case nil:
		return ""
	case string:
		return x
	default:
		return fmt.Sprint(x)
	}
}

func (r restReply) get(keys ...string) any {
	var v any = r.body
	for _, k := range keys {
		switch x := v.(type) {
		case map[string]any:
			v = x[k]
		case []any:
			var i int
			fmt.Sscan(k, &i)
			if i >= len(x) {
				return nil
			}
			v = x[i]
		default:
			return nil
		}
	}
	return v
}

func (r restReply) list(keys ...string) []any {
	l, _ := r.get(keys...).([]any)
	return l
}

// googleError checks Google's error form: {"error":{"code":<HTTP status>,
// "message":...,"status":<code name>}}.
func (r restReply) wantError(t *testing.T, step string, httpStatus int, status, contains string) {
	t.Helper()
	if r.status != httpStatus {
		t.Fatalf("%s: HTTP %d, want %d: %s", step, r.status, httpStatus, r.raw)
	}
	if got := r.str("error", "code"); got != fmt.Sprint(httpStatus) {
		t.Fatalf("%s: error.code %q, want %d: %s", step, got, httpStatus, r.raw)
	}
	if got := r.str("error", "status"); got != status {
		t.Fatalf("%s: error.status %q, want %s: %s", step, got, status, r.raw)
	}
	if !strings.Contains(r.str("error", "message"), contains) {
		t.Fatalf("%s: error.message does not contain %q: %s", step, contains, r.raw)
	}
	if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Fatalf("%s: Content-Type %q", step, ct)
	}
}

func (r restReply) wantOK(t *testing.T, step string) restReply {
	t.Helper()
	if r.status != http.StatusOK {
		t.Fatalf("%s: HTTP %d, want 200: %s", step, r.status, r.raw)
	}
	return r
}

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

func unb64(t *testing.T, s string) string {
	t.Helper()
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		t.Fatalf("data %q is not base64: %v", s, err)
	}
	return string(b)
}

// restOutcome is what one step of the script saw.
type restOutcome struct {
	status int
	code   string // error.status, "" on success
}

// restScript runs every REST method once, in an order where each step has
// what it needs, against one server. On the proxy (emulator false) it checks
// each answer; on the emulator it only records them. Steps the emulator does
// not implement are left out of its run (emuSkip).
type restScript struct {
	t        *testing.T
	c        *restClient
	project  string
	suffix   string
	emulator bool
	out      map[string]restOutcome
	order    []string
}

// emuSkip: methods Google's emulator answers with UNIMPLEMENTED (IAM,
// detach) or implements with a difference of its own (labels are not an
// updatable topic field there); the proxy's answers are checked on their own.
var emuSkip = map[string]bool{
	"topic patch labels":     true,
	"sub patch":              true,
	"snapshot patch":         true,
	"setIamPolicy":           true,
	"getIamPolicy GET":       true,
	"getIamPolicy POST":      true,
	"testIamPermissions":     true,
	"sub getIamPolicy GET":   true,
	"detach":                 true,
	"pull detached":          true,
	"schema validateMessage": true,
}

// step sends a request and records the answer; on the proxy it checks the
// status (and the error's status name when want is not 200).
func (s *restScript) step(name string, want int, wantCode, method, path string, body any) restReply {
	s.t.Helper()
	if s.emulator && emuSkip[name] {
		return restReply{}
	}
	r := s.c.do(method, path, body)
	o := restOutcome{status: r.status, code: r.str("error", "status")}
	s.out[name] = o
	s.order = append(s.order, name)
	if !s.emulator {
		if want == http.StatusOK {
			r.wantOK(s.t, name)
		} else {
			r.wantError(s.t, name, want, wantCode, "")
		}
	}
	return r
}

func (s *restScript) check(cond bool, format string, args ...any) {
	s.t.Helper()
	if !s.emulator && !cond {
		s.t.Fatalf(format, args...)
	}
}

const restAvro = `{"type":"record","name":"R","fields":[{"name":"a","type":"string"}]}`

func (s *restScript) run() {
	t := s.t
	p := "/v1/projects/" + s.project
	top, sub, snap, sch := "top-"+s.suffix, "sub-"+s.suffix, "snap-"+s.suffix, "sch-"+s.suffix
	topic := "projects/" + s.project + "/topics/" + top
	subName := "projects/" + s.project + "/subscriptions/" + sub

	// Topics.
	r := s.step("topic create", 200, "", "PUT", p+"/topics/"+top, map[string]any{})
	s.check(r.str("name") == topic, "topic create: %s", r.raw)
	s.step("topic create again", 409, "ALREADY_EXISTS", "PUT", p+"/topics/"+top, map[string]any{})
	r = s.step("topic get", 200, "", "GET", p+"/topics/"+top, nil)
	s.check(r.str("name") == topic, "topic get: %s", r.raw)
	r = s.step("topic get missing", 404, "NOT_FOUND", "GET", p+"/topics/nope-"+s.suffix, nil)
	s.check(strings.HasPrefix(r.str("error", "message"), "Resource not found"), "topic get missing: %s", r.raw)
	r = s.step("topic patch labels", 200, "", "PATCH", p+"/topics/"+top,
		map[string]any{"topic": map[string]any{"name": topic, "labels": map[string]string{"team": "a"}}, "updateMask": "labels"})
	s.check(r.str("labels", "team") == "a", "topic patch: %s", r.raw)
	r = s.step("topic list", 200, "", "GET", p+"/topics", nil)
	found := false
	for _, x := range r.list("topics") {
		if m, _ := x.(map[string]any); m["name"] == topic {
			found = true
		}
	}
	s.check(found, "topic list without %s: %s", topic, r.raw)
	s.step("topic list bad page token", 400, "INVALID_ARGUMENT", "GET", p+"/topics?pageToken=garbage", nil)

	// Subscriptions.
	r = s.step("sub create", 200, "", "PUT", p+"/subscriptions/"+sub, map[string]any{"topic": topic, "ackDeadlineSeconds": 20})
	s.check(r.str("topic") == topic && r.str("ackDeadlineSeconds") == "20", "sub create: %s", r.raw)
	s.check(r.str("messageRetentionDuration") == "604800s", "sub create: retention not a JSON duration: %s", r.raw)
	s.step("sub create no topic", 404, "NOT_FOUND", "PUT", p+"/subscriptions/x-"+s.suffix, map[string]any{"topic": topic + "-none"})
	r = s.step("sub get", 200, "", "GET", p+"/subscriptions/"+sub, nil)
	s.check(r.str("name") == subName, "sub get: %s", r.raw)
	r = s.step("sub patch", 200, "", "PATCH", p+"/subscriptions/"+sub,
		map[string]any{"subscription": map[string]any{"name": subName, "ackDeadlineSeconds": 30}, "updateMask": "ackDeadlineSeconds"})
	s.check(r.str("ackDeadlineSeconds") == "30", "sub patch: %s", r.raw)
	r = s.step("sub list", 200, "", "GET", p+"/subscriptions", nil)
	s.check(len(r.list("subscriptions")) == 1 && r.str("subscriptions", "0", "name") == subName, "sub list: %s", r.raw)
	r = s.step("topic subscriptions", 200, "", "GET", p+"/topics/"+top+"/subscriptions", nil)
	s.check(r.str("subscriptions", "0") == subName, "topic subscriptions: %s", r.raw)

	// Publish, pull, deadlines, acks.
	r = s.step("publish", 200, "", "POST", p+"/topics/"+top+":publish", map[string]any{"messages": []any{
		map[string]any{"data": b64("hello"), "attributes": map[string]string{"k": "v"}},
		map[string]any{"data": b64("world")},
	}})
	s.check(len(r.list("messageIds")) == 2, "publish: %s", r.raw)
	s.step("publish empty", 400, "INVALID_ARGUMENT", "POST", p+"/topics/"+top+":publish", map[string]any{"messages": []any{}})
	s.step("publish missing topic", 404, "NOT_FOUND", "POST", p+"/topics/nope-"+s.suffix+":publish",
		map[string]any{"messages": []any{map[string]any{"data": b64("x")}}})
	s.step("publish bad json", 400, "INVALID_ARGUMENT", "POST", p+"/topics/"+top+":publish", `{"messages": [`)
	s.step("publish bad base64", 400, "INVALID_ARGUMENT", "POST", p+"/topics/"+top+":publish", `{"messages":[{"data":"%%%"}]}`)
	msgs := s.pullN("pull", p+"/subscriptions/"+sub, 2)
	var ackIDs []string
	data := map[string]bool{}
	for _, m := range msgs {
		ackIDs = append(ackIDs, m.str("ackId"))
		data[unb64(t, m.str("message", "data"))] = true
		if _, err := time.Parse(time.RFC3339Nano, m.str("message", "publishTime")); err != nil {
			s.check(false, "pull: publishTime %q is not RFC 3339", m.str("message", "publishTime"))
		}
		s.check(m.str("message", "messageId") != "", "pull: no messageId: %v", m.body)
	}
	s.check(data["hello"] && data["world"], "pull: got %v", data)
	s.step("modifyAckDeadline", 200, "", "POST", p+"/subscriptions/"+sub+":modifyAckDeadline",
		map[string]any{"ackIds": ackIDs[:1], "ackDeadlineSeconds": 0})
	again := s.pullN("pull again", p+"/subscriptions/"+sub, 1)
	s.step("acknowledge", 200, "", "POST", p+"/subscriptions/"+sub+":acknowledge",
		map[string]any{"ackIds": []string{ackIDs[1], again[0].str("ackId")}})
	// The proxy's Acknowledge (gRPC and REST) takes an id it does not
	// know as settled: a no-op (restKnownDiff).
	s.step("acknowledge bad id", 200, "", "POST", p+"/subscriptions/"+sub+":acknowledge",
		map[string]any{"ackIds": []string{"bogus"}})
	r = s.step("pull empty", 200, "", "POST", p+"/subscriptions/"+sub+":pull", map[string]any{"maxMessages": 5, "returnImmediately": true})
	s.check(len(r.list("receivedMessages")) == 0 && r.raw != "", "pull empty: %s", r.raw)
	s.step("pull missing sub", 404, "NOT_FOUND", "POST", p+"/subscriptions/nope-"+s.suffix+":pull", map[string]any{"maxMessages": 1})
	s.step("modifyPushConfig", 200, "", "POST", p+"/subscriptions/"+sub+":modifyPushConfig", map[string]any{"pushConfig": map[string]any{}})

	// Snapshots and seek.
	r = s.step("snapshot create", 200, "", "PUT", p+"/snapshots/"+snap, map[string]any{"subscription": subName})
	s.check(r.str("topic") == topic, "snapshot create: %s", r.raw)
	if _, err := time.Parse(time.RFC3339Nano, r.str("expireTime")); err != nil {
		s.check(false, "snapshot create: expireTime: %s", r.raw)
	}
	s.step("snapshot get", 200, "", "GET", p+"/snapshots/"+snap, nil)
	r = s.step("snapshot patch", 200, "", "PATCH", p+"/snapshots/"+snap,
		map[string]any{"snapshot": map[string]any{"name": "projects/" + s.project + "/snapshots/" + snap, "labels": map[string]string{"x": "y"}}, "updateMask": "labels"})
	s.check(r.str("labels", "x") == "y", "snapshot patch: %s", r.raw)
	r = s.step("snapshot list", 200, "", "GET", p+"/snapshots", nil)
	s.check(len(r.list("snapshots")) == 1, "snapshot list: %s", r.raw)
	r = s.step("topic snapshots", 200, "", "GET", p+"/topics/"+top+"/snapshots", nil)
	s.check(len(r.list("snapshots")) == 1, "topic snapshots: %s", r.raw)
	s.step("seek snapshot", 200, "", "POST", p+"/subscriptions/"+sub+":seek", map[string]any{"snapshot": "projects/" + s.project + "/snapshots/" + snap})
	s.step("seek time", 200, "", "POST", p+"/subscriptions/"+sub+":seek", map[string]any{"time": "2020-01-01T00:00:00Z"})
	s.step("seek bad time", 400, "INVALID_ARGUMENT", "POST", p+"/subscriptions/"+sub+":seek", `{"time":"yesterday"}`)
	s.step("snapshot delete", 200, "", "DELETE", p+"/snapshots/"+snap, nil)
	s.step("snapshot get deleted", 404, "NOT_FOUND", "GET", p+"/snapshots/"+snap, nil)

	// IAM.
	policy := map[string]any{"bindings": []any{map[string]any{"role": "roles/pubsub.subscriber", "members": []string{"user:a@example.com"}}}}
	r = s.step("setIamPolicy", 200, "", "POST", p+"/topics/"+top+":setIamPolicy", map[string]any{"policy": policy})
	s.check(r.str("etag") != "" && r.str("bindings", "0", "role") == "roles/pubsub.subscriber", "setIamPolicy: %s", r.raw)
	r = s.step("getIamPolicy GET", 200, "", "GET", p+"/topics/"+top+":getIamPolicy?options.requestedPolicyVersion=3", nil)
	s.check(r.str("bindings", "0", "members", "0") == "user:a@example.com", "getIamPolicy: %s", r.raw)
	r = s.step("getIamPolicy POST", 200, "", "POST", p+"/topics/"+top+":getIamPolicy", map[string]any{})
	s.check(r.str("bindings", "0", "role") == "roles/pubsub.subscriber", "getIamPolicy POST: %s", r.raw)
	s.step("sub getIamPolicy GET", 200, "", "GET", p+"/subscriptions/"+sub+":getIamPolicy", nil)
	r = s.step("testIamPermissions", 200, "", "POST", p+"/topics/"+top+":testIamPermissions",
		map[string]any{"permissions": []string{"pubsub.topics.publish"}})
	s.check(r.str("permissions", "0") == "pubsub.topics.publish", "testIamPermissions: %s", r.raw)

	// Schemas.
	r = s.step("schema create", 200, "", "POST", p+"/schemas?schemaId="+sch, map[string]any{"type": "AVRO", "definition": restAvro})
	s.check(r.str("revisionId") != "" && r.str("type") == "AVRO", "schema create: %s", r.raw)
	rev1 := r.str("revisionId")
	s.step("schema create bad", 400, "INVALID_ARGUMENT", "POST", p+"/schemas?schemaId=bad-"+s.suffix, map[string]any{"type": "AVRO", "definition": "{"})
	s.step("schema get", 200, "", "GET", p+"/schemas/"+sch+"?view=FULL", nil)
	r = s.step("schema list", 200, "", "GET", p+"/schemas", nil)
	s.check(len(r.list("schemas")) == 1, "schema list: %s", r.raw)
	r = s.step("schema commit", 200, "", "POST", p+"/schemas/"+sch+":commit",
		map[string]any{"schema": map[string]any{"type": "AVRO", "definition": strings.Replace(restAvro, `"a"`, `"b"`, 1)}})
	rev2 := r.str("revisionId")
	s.check(rev2 != "" && rev2 != rev1, "schema commit: %s", r.raw)
	r = s.step("schema listRevisions", 200, "", "GET", p+"/schemas/"+sch+":listRevisions", nil)
	s.check(len(r.list("schemas")) == 2, "schema listRevisions: %s", r.raw)
	s.step("schema rollback", 200, "", "POST", p+"/schemas/"+sch+":rollback", map[string]any{"revisionId": rev1})
	s.step("schema deleteRevision", 200, "", "DELETE", p+"/schemas/"+sch+"@"+rev2+":deleteRevision", nil)
	s.step("schema validate", 200, "", "POST", p+"/schemas:validate", map[string]any{"schema": map[string]any{"type": "AVRO", "definition": restAvro}})
	s.step("schema validateMessage", 200, "", "POST", p+"/schemas:validateMessage",
		map[string]any{"name": "projects/" + s.project + "/schemas/" + sch, "message": b64(`{"a":"x"}`), "encoding": "JSON"})
	s.step("schema delete", 200, "", "DELETE", p+"/schemas/"+sch, nil)

	// Detach, deletes.
	s.step("detach", 200, "", "POST", p+"/subscriptions/"+sub+":detach", nil)
	s.step("pull detached", 400, "FAILED_PRECONDITION", "POST", p+"/subscriptions/"+sub+":pull", map[string]any{"maxMessages": 1})
	s.step("sub delete", 200, "", "DELETE", p+"/subscriptions/"+sub, nil)
	s.step("sub delete again", 404, "NOT_FOUND", "DELETE", p+"/subscriptions/"+sub, nil)
	s.step("topic delete", 200, "", "DELETE", p+"/topics/"+top, nil)
	s.step("topic get deleted", 404, "NOT_FOUND", "GET", p+"/topics/"+top, nil)
}

// pullN pulls until n messages came (the proxy may answer a pull with fewer
// than are there, as Google does).
func (s *restScript) pullN(name, subPath string, n int) []restReply {
	s.t.Helper()
	var got []restReply
	deadline := time.Now().Add(30 * time.Second)
	for len(got) < n && time.Now().Before(deadline) {
		r := s.step(name, 200, "", "POST", subPath+":pull", map[string]any{"maxMessages": n - len(got)})
		for i := range r.list("receivedMessages") {
			m := r.get("receivedMessages", fmt.Sprint(i)).(map[string]any)
			got = append(got, restReply{body: m})
		}
	}
	if len(got) < n {
		s.t.Fatalf("%s: %d messages after 30 s, want %d", name, len(got), n)
	}
	return got
}

func TestRESTEveryMethod(t *testing.T) {
	e := startEnv(t)
	s := &restScript{t: t, c: newRESTClient(t, e.addr), project: e.project, suffix: e.suffix, out: map[string]restOutcome{}}
	s.run()
}

// TestRESTDifferentialEmulator runs the same script against Google's
// emulator and compares every step both run: HTTP status and error status.
func TestRESTDifferentialEmulator(t *testing.T) {
	emu := startPubSubEmulator(t)
	e := startEnv(t)
	proxy := &restScript{t: t, c: newRESTClient(t, e.addr), project: e.project, suffix: e.suffix, out: map[string]restOutcome{}}
	proxy.run()
	ref := &restScript{t: t, c: newRESTClient(t, emu), project: e.project, suffix: e.suffix, emulator: true, out: map[string]restOutcome{}}
	ref.run()
	compared := 0
	for _, name := range ref.order {
		want, got := ref.out[name], proxy.out[name]
		if restKnownDiff[name] != "" {
			t.Logf("%s: emulator %d %s, proxy %d %s (%s)", name, want.status, want.code, got.status, got.code, restKnownDiff[name])
			continue
		}
		compared++
		if want != got {
			t.Errorf("%s: emulator answered %d %s, the proxy %d %s", name, want.status, want.code, got.status, got.code)
		}
	}
	t.Logf("%d steps compared with the emulator", compared)
}

// restKnownDiff: steps where the emulator's answer differs by design.
var restKnownDiff = map[string]string{
	"topic list bad page token": "the emulator ignores a page token it cannot read; the proxy (over gRPC too) refuses it",
	"acknowledge bad id":        "an unknown ack id is a no-op on the proxy (as over gRPC); the emulator refuses it",
}

// TestRESTLimitsAndErrors: the REST entry's own refusals and the
// front-end's limits, each in Google's error form.
func TestRESTLimitsAndErrors(t *testing.T) {
	e := startEnv(t, withGCP(func(o *gcp.Options) { o.Config.MaxMessageBytes = 1000 }))
	c := newRESTClient(t, e.addr)
	p := "/v1/projects/" + e.project
	top := e.id("lim")
	c.do("PUT", p+"/topics/"+top, map[string]any{}).wantOK(t, "create")

	big := map[string]any{"messages": []any{map[string]any{"data": b64(strings.Repeat("x", 2000))}}}
	r := c.do("POST", p+"/topics/"+top+":publish", big)
	r.wantError(t, "message over gcp.max_message_bytes", 400, "INVALID_ARGUMENT", "The value for message_size is too large")

	// A body over the REST body limit (twice the request limit plus 1 MiB:
	// here the default request limit, 10 MiB) is refused before it is read.
	huge := `{"messages":[{"data":"` + strings.Repeat("A", 22<<20) + `"}]}`
	r = c.do("POST", p+"/topics/"+top+":publish", huge)
	r.wantError(t, "huge body", 413, "INVALID_ARGUMENT", "Request payload size exceeds the limit")
	// The same without a Content-Length (chunked): cut while read.
	req, err := http.NewRequest("POST", c.base+p+"/topics/"+top+":publish", io.MultiReader(strings.NewReader(huge)))
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = -1
	resp, err := c.hc.Do(req)
	if err == nil {
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 413 && resp.StatusCode != 400 {
			t.Fatalf("chunked huge body: HTTP %d: %s", resp.StatusCode, raw)
		}
		if !strings.Contains(string(raw), `"status":"INVALID_ARGUMENT"`) {
			t.Fatalf("chunked huge body: %s", raw)
		}
	} // else: the server closed the connection while the client still wrote, also a refusal

	c.do("GET", "/v2/projects/x/topics", nil).wantError(t, "unknown API version", 404, "NOT_FOUND", "not found")
	c.do("GET", p+"/nothing/here", nil).wantError(t, "unknown path", 404, "NOT_FOUND", "Not Found")
	c.do("DELETE", p+"/topics/"+top+":publish", nil).wantError(t, "wrong method", 405, "UNIMPLEMENTED", "")
	c.do("GET", "/google.pubsub.v1.Publisher/GetTopic", nil).wantError(t, "Connect path", 404, "NOT_FOUND", "")
	c.do("GET", p+"/topics/"+top+"?alt=proto", nil).wantError(t, "alt=proto", 400, "INVALID_ARGUMENT", "alt")
	c.do("GET", p+"/topics/"+top+"?alt=json&prettyPrint=false&fields=name&quotaUser=x", nil).wantOK(t, "system parameters")
	c.do("GET", p+"/topics/"+top+"?unknownParam=1", nil).wantError(t, "unknown query parameter", 400, "INVALID_ARGUMENT", "unknownParam")
	c.do("POST", p+"/subscriptions/s-"+e.suffix+":pull", `{"maxMessages":"many"}`).wantError(t, "wrong JSON type", 400, "INVALID_ARGUMENT", "Invalid JSON payload")
	c.do("POST", p+"/subscriptions/s-"+e.suffix+":pull", `{"maxMessages":1}{}`).wantError(t, "trailing JSON", 400, "INVALID_ARGUMENT", "")
	c.do("POST", p+"/subscriptions/s-"+e.suffix+":pull", `[]`).wantError(t, "JSON array", 400, "INVALID_ARGUMENT", "")
	c.do("PUT", p+"/topics/"+top, `{"name":"projects/other/topics/other"}`).wantError(t, "body name differs from the path", 409, "ALREADY_EXISTS", "")

	// curl -d labels its JSON body as a form: read as JSON all the same.
	form, err := http.NewRequest("POST", c.base+p+"/topics/"+top+":publish", strings.NewReader(`{"messages":[{"data":"aGk="}]}`))
	if err != nil {
		t.Fatal(err)
	}
	form.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	fr, err := c.hc.Do(form)
	if err != nil {
		t.Fatal(err)
	}
	fr.Body.Close()
	if fr.StatusCode != 200 {
		t.Fatalf("JSON body labelled as a form: HTTP %d", fr.StatusCode)
	}

	// Not ready: UNAVAILABLE as over gRPC, HTTP 503.
	down := errKubeMQDown
	e.ready.Store(&down)
	c.do("GET", p+"/topics/"+top, nil).wantError(t, "not ready", 503, "UNAVAILABLE", "not ready")
	e.ready.Store(nil)
	c.do("GET", p+"/topics/"+top, nil).wantOK(t, "ready again")
}
