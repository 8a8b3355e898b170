package amqp091

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// mgmt is a management API under test: the proxy's (served from the env's Server) or the test
// RabbitMQ's management plugin.
type mgmt struct {
	t    testing.TB
	base string // http://host:port
}

// proxyMgmt serves e's management API on 127.0.0.1:0.
func proxyMgmt(t testing.TB, e *env) *mgmt {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: e.srv.ManagementHandler(), ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(lis)
	t.Cleanup(func() { srv.Close() })
	return &mgmt{t: t, base: "http://" + lis.Addr().String()}
}

// rabbitMgmtAPI is the test RabbitMQ's management API, once it answers.
func rabbitMgmtAPI(t testing.TB) *mgmt {
	t.Helper()
	m := &mgmt{t: t, base: "http://" + rabbitMgmt}
	deadline := time.Now().Add(60 * time.Second)
	for {
		code, _ := m.do("GET", "/api/whoami", "guest", "guest")
		if code == http.StatusOK {
			return m
		}
		if time.Now().After(deadline) {
			t.Fatalf("RabbitMQ's management API at %s does not answer (last status %d)", rabbitMgmt, code)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

func (m *mgmt) do(method, path, user, password string) (int, []byte) {
	m.t.Helper()
	req, err := http.NewRequest(method, m.base+path, nil)
	if err != nil {
		m.t.Fatal(err)
	}
	if user != "" {
		req.SetBasicAuth(user, password)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// get answers GET path as guest, decoded.
func (m *mgmt) get(path string) (int, any) {
	m.t.Helper()
	code, b := m.do("GET", path, "guest", "guest")
	var v any
	if len(b) > 0 {
		if err := json.Unmarshal(b, &v); err != nil {
			m.t.Fatalf("GET %s: %d %q: %v", path, code, b, err)
		}
	}
	return code, v
}

func vpath(vhost string) string { return url.PathEscape(vhost) }

// mgmtScenario is the same traffic on either broker: a durable queue with a length limit
// bound to a topic exchange, three messages, one taken with basic.get and left unacked, a
// second queue with one consumer. The connection stays open (it holds the unacked message).
func mgmtScenario(t *testing.T, e *env) {
	c := e.dial()
	ch := e.channel(c)
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare("dq", true, false, false, false, amqp.Table{"x-max-length": int32(10)}); err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclare("dx", "topic", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind("dq", "a.#", "dx", false, nil); err != nil {
		t.Fatal(err)
	}
	publishConfirmed(t, ch, "dx", "a.b", "one", "two", "three")
	if _, ok, err := ch.Get("dq", false); err != nil || !ok {
		t.Fatalf("get: %v %v", ok, err)
	}
	if _, err := ch.QueueDeclare("cq", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := e.channel(c).Consume("cq", "", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
}

// pick returns the fields of v (a JSON object) named in keys, with nested "a.b" paths.
func pick(v any, keys ...string) map[string]any {
	out := map[string]any{}
	for _, k := range keys {
		cur := v
		for _, part := range strings.Split(k, ".") {
			obj, _ := cur.(map[string]any)
			cur = obj[part]
		}
		out[k] = cur
	}
	return out
}

func keysOf(v any) []string {
	obj, _ := v.(map[string]any)
	var out []string
	for k := range obj {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// proxyOnly are the fields the proxy adds to RabbitMQ's.
var proxyOnly = []string{"kubemq_channel", "oldest_unacked_age_seconds"}

// checkFieldsSubset fails when the proxy answers a field RabbitMQ does not have (a misspelt
// name) in the same object.
func checkFieldsSubset(t *testing.T, what string, proxy, rabbit any) {
	t.Helper()
	rk := keysOf(rabbit)
	for _, k := range keysOf(proxy) {
		if !slices.Contains(rk, k) && !slices.Contains(proxyOnly, k) {
			t.Errorf("%s: the proxy answers field %q, RabbitMQ has only %v", what, k, rk)
		}
	}
}

// The management API answers as RabbitMQ 3.10's does for the same traffic: the same field
// names, and the same names, types, flags, arguments and message counts.
func TestManagementAPIDifferential(t *testing.T) {
	if _, err := rabbitURL(); err != nil {
		t.Skipf("differential run against RabbitMQ skipped: %v", err)
	}
	pe := newEnv(t)
	re := rabbitEnv(t)
	pm, rm := proxyMgmt(t, pe), rabbitMgmtAPI(t)
	mgmtScenario(t, pe)
	mgmtScenario(t, re)

	queueKeys := []string{"name", "durable", "auto_delete", "exclusive", "arguments", "consumers", "messages",
		"messages_ready", "messages_unacknowledged", "state", "type", "message_stats.publish", "message_stats.deliver_get",
		"message_stats.ack"}
	var pq, rq any
	// RabbitMQ's figures arrive with its statistics interval: wait until both agree on the counts.
	until(t, func() string {
		var pc, rc int
		pc, pq = pm.get("/api/queues/" + vpath(pe.vhost) + "/dq")
		rc, rq = rm.get("/api/queues/" + vpath(re.vhost) + "/dq")
		if pc != 200 || rc != 200 {
			return fmt.Sprintf("GET queue: proxy %d, RabbitMQ %d", pc, rc)
		}
		p, r := pick(pq, queueKeys...), pick(rq, queueKeys...)
		if fmt.Sprint(p) != fmt.Sprint(r) {
			return fmt.Sprintf("queue dq:\nproxy    %v\nRabbitMQ %v", p, r)
		}
		return ""
	})
	checkFieldsSubset(t, "queue", pq, rq)
	checkFieldsSubset(t, "queue message_stats", pq.(map[string]any)["message_stats"], rq.(map[string]any)["message_stats"])
	if got := pick(pq, "messages_ready", "messages_unacknowledged", "message_stats.publish"); fmt.Sprint(got) != "map[message_stats.publish:3 messages_ready:2 messages_unacknowledged:1]" {
		t.Errorf("dq figures %v", got)
	}

	// Lists: queues of the vhost, all queues, exchanges, bindings, the vhost.
	names := func(v any, key string) []string {
		var out []string
		for _, x := range v.([]any) {
			out = append(out, fmt.Sprint(pick(x, key)[key]))
		}
		sort.Strings(out)
		return out
	}
	for _, path := range []string{"/api/queues/%s", "/api/exchanges/%s"} {
		pc, pv := pm.get(fmt.Sprintf(path, vpath(pe.vhost)))
		rc, rv := rm.get(fmt.Sprintf(path, vpath(re.vhost)))
		if pc != 200 || rc != 200 || !slices.Equal(names(pv, "name"), names(rv, "name")) {
			t.Errorf("%s: proxy %d %v, RabbitMQ %d %v", path, pc, names(pv, "name"), rc, names(rv, "name"))
			continue
		}
		checkFieldsSubset(t, path, pv.([]any)[0], rv.([]any)[0])
	}
	_, px := pm.get("/api/exchanges/" + vpath(pe.vhost) + "/dx")
	_, rx := rm.get("/api/exchanges/" + vpath(re.vhost) + "/dx")
	xk := []string{"name", "type", "durable", "auto_delete", "internal", "arguments"}
	if fmt.Sprint(pick(px, xk...)) != fmt.Sprint(pick(rx, xk...)) {
		t.Errorf("exchange dx: proxy %v, RabbitMQ %v", pick(px, xk...), pick(rx, xk...))
	}
	for _, ex := range []string{"amq.default", "amq.topic"} {
		_, px := pm.get("/api/exchanges/" + vpath(pe.vhost) + "/" + ex)
		_, rx := rm.get("/api/exchanges/" + vpath(re.vhost) + "/" + ex)
		if fmt.Sprint(pick(px, xk...)) != fmt.Sprint(pick(rx, xk...)) {
			t.Errorf("exchange %s: proxy %v, RabbitMQ %v", ex, pick(px, xk...), pick(rx, xk...))
		}
	}
	bk := []string{"source", "destination", "destination_type", "routing_key", "arguments", "properties_key"}
	bindings := func(v any) []string {
		var out []string
		for _, b := range v.([]any) {
			out = append(out, fmt.Sprint(pick(b, bk...)))
		}
		sort.Strings(out)
		return out
	}
	_, pb := pm.get("/api/bindings/" + vpath(pe.vhost))
	_, rb := rm.get("/api/bindings/" + vpath(re.vhost))
	if !slices.Equal(bindings(pb), bindings(rb)) {
		t.Errorf("bindings:\nproxy    %v\nRabbitMQ %v", bindings(pb), bindings(rb))
	}
	_, pv := pm.get("/api/vhosts/" + vpath(pe.vhost))
	_, rv := rm.get("/api/vhosts/" + vpath(re.vhost))
	checkFieldsSubset(t, "vhost", pv, rv)
	vk := []string{"name", "messages", "messages_ready", "messages_unacknowledged", "message_stats.publish"}
	if p, r := pick(pv, vk...), pick(rv, vk...); fmt.Sprint(p["messages"]) != fmt.Sprint(r["messages"]) || p["name"] != pe.vhost || r["name"] != re.vhost {
		t.Errorf("vhost: proxy %v, RabbitMQ %v", p, r)
	}
	for _, path := range []string{"/api/whoami", "/api/aliveness-test/%2F", "/api/aliveness-test/" + vpath(pe.vhost)} {
		rpath := strings.Replace(path, vpath(pe.vhost), vpath(re.vhost), 1)
		pc, pv := pm.get(path)
		rc, rv := rm.get(rpath)
		if pc != rc || fmt.Sprint(pv) != fmt.Sprint(rv) {
			t.Errorf("%s: proxy %d %v, RabbitMQ %d %v", path, pc, pv, rc, rv)
		}
	}
	_, po := pm.get("/api/overview")
	_, ro := rm.get("/api/overview")
	checkFieldsSubset(t, "overview", po, ro)
	checkFieldsSubset(t, "overview queue_totals", po.(map[string]any)["queue_totals"], ro.(map[string]any)["queue_totals"])
	checkFieldsSubset(t, "overview object_totals", po.(map[string]any)["object_totals"], ro.(map[string]any)["object_totals"])

	// Connections and channels of the scenario's vhost (RabbitMQ lists them once its
	// statistics have them).
	ofVhost := func(v any, vhost string) []any {
		var out []any
		for _, x := range v.([]any) {
			if pick(x, "vhost")["vhost"] == vhost {
				out = append(out, x)
			}
		}
		return out
	}
	for _, what := range []string{"connections", "channels"} {
		var pl, rl []any
		until(t, func() string {
			_, pv := pm.get("/api/" + what)
			_, rv := rm.get("/api/" + what)
			pl, rl = ofVhost(pv, pe.vhost), ofVhost(rv, re.vhost)
			if len(rl) == 0 || len(pl) != len(rl) {
				return fmt.Sprintf("%s: proxy %d, RabbitMQ %d", what, len(pl), len(rl))
			}
			return ""
		})
		checkFieldsSubset(t, what, pl[0], rl[0])
		keys := []string{"user", "channels", "protocol", "state", "type"}
		if what == "channels" {
			keys = []string{"user", "number", "consumer_count", "confirm", "transactional", "prefetch_count"}
		}
		var ps, rs []string
		for i := range pl {
			ps, rs = append(ps, fmt.Sprint(pick(pl[i], keys...))), append(rs, fmt.Sprint(pick(rl[i], keys...)))
		}
		sort.Strings(ps)
		sort.Strings(rs)
		if !slices.Equal(ps, rs) {
			t.Errorf("%s:\nproxy    %v\nRabbitMQ %v", what, ps, rs)
		}
	}

	// Errors: a missing queue or vhost, bad credentials, no credentials.
	for _, path := range []string{"/api/queues/%s/missing", "/api/exchanges/%s/missing", "/api/queues/no-such-vhost-" + randHex(3), "/api/nonsense"} {
		pc, pb := pm.do("GET", strings.Replace(path, "%s", vpath(pe.vhost), 1), "guest", "guest")
		rc, rb := rm.do("GET", strings.Replace(path, "%s", vpath(re.vhost), 1), "guest", "guest")
		if pc != rc || string(pb) != string(rb) {
			t.Errorf("GET %s: proxy %d %s, RabbitMQ %d %s", path, pc, pb, rc, rb)
		}
	}
	// With no amqp.users any loopback login passes (RabbitMQ's guest rule): check with a user list.
	pe2 := newEnv(t, func(o *Options) { o.Users = map[string]string{"guest": "guest"} })
	pc, pbody := proxyMgmt(t, pe2).do("GET", "/api/overview", "guest", "wrong")
	rc, rbody := rm.do("GET", "/api/overview", "guest", "wrong")
	if pc != rc || string(pbody) != string(rbody) {
		t.Errorf("bad credentials: proxy %d %s, RabbitMQ %d %s", pc, pbody, rc, rbody)
	}
	if pc, _ := pm.do("GET", "/api/overview", "", ""); pc != http.StatusUnauthorized {
		t.Errorf("no credentials: %d", pc)
	}

	// DELETE ?if-empty on a queue with messages: 400 with RabbitMQ's reason.
	pc, pbody = pm.do("DELETE", "/api/queues/"+vpath(pe.vhost)+"/dq?if-empty=true", "guest", "guest")
	rc, rbody = rm.do("DELETE", "/api/queues/"+vpath(re.vhost)+"/dq?if-empty=true", "guest", "guest")
	want := strings.ReplaceAll(string(rbody), re.vhost, pe.vhost)
	if pc != rc || string(pbody) != want {
		t.Errorf("DELETE if-empty: proxy %d %s, RabbitMQ %d %s", pc, pbody, rc, rbody)
	}
	pc, pbody = pm.do("DELETE", "/api/queues/"+vpath(pe.vhost)+"/cq?if-unused=true", "guest", "guest")
	rc, rbody = rm.do("DELETE", "/api/queues/"+vpath(re.vhost)+"/cq?if-unused=true", "guest", "guest")
	want = strings.ReplaceAll(string(rbody), re.vhost, pe.vhost)
	if pc != rc || string(pbody) != want {
		t.Errorf("DELETE if-unused: proxy %d %s, RabbitMQ %d %s", pc, pbody, rc, rbody)
	}
	// Purge: the ready messages go, the unacked one stays.
	for _, b := range []struct {
		m     *mgmt
		vhost string
	}{{pm, pe.vhost}, {rm, re.vhost}} {
		if code, body := b.m.do("DELETE", "/api/queues/"+vpath(b.vhost)+"/dq/contents", "guest", "guest"); code != http.StatusNoContent {
			t.Errorf("%s purge: %d %s", b.m.base, code, body)
		}
		until(t, func() string {
			_, q := b.m.get("/api/queues/" + vpath(b.vhost) + "/dq")
			if got := fmt.Sprint(pick(q, "messages_ready", "messages_unacknowledged")); got != "map[messages_ready:0 messages_unacknowledged:1]" {
				return b.m.base + " after purge: " + got
			}
			return ""
		})
		if code, body := b.m.do("DELETE", "/api/queues/"+vpath(b.vhost)+"/dq", "guest", "guest"); code != http.StatusNoContent {
			t.Errorf("%s delete: %d %s", b.m.base, code, body)
		}
		if code, _ := b.m.get("/api/queues/" + vpath(b.vhost) + "/dq"); code != http.StatusNotFound {
			t.Errorf("%s: deleted queue answers %d", b.m.base, code)
		}
		if code, _ := b.m.do("DELETE", "/api/queues/"+vpath(b.vhost)+"/dq", "guest", "guest"); code != http.StatusNotFound {
			t.Errorf("%s: deleting a missing queue answers %d", b.m.base, code)
		}
	}
}

// Debian's rabbitmqadmin (the management API's own CLI) lists, purges and deletes queues
// through the proxy.
func TestManagementRabbitmqadmin(t *testing.T) {
	const admin = "/usr/bin/rabbitmqadmin"
	if _, err := os.Stat(admin); err != nil {
		t.Skipf("%s not installed", admin)
	}
	e := newEnv(t)
	m := proxyMgmt(t, e)
	host, port, _ := net.SplitHostPort(strings.TrimPrefix(m.base, "http://"))
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("/usr/bin/python3", append([]string{admin, "-H", host, "-P", port, "-u", "guest", "-p", "guest", "-V", e.vhost}, args...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("rabbitmqadmin %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	c := e.dial()
	ch := e.channel(c)
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"ra1", "ra2"} {
		if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	publishConfirmed(t, ch, "", "ra1", "a", "b", "c", "d")
	publishConfirmed(t, ch, "", "ra2", "e")
	until(t, func() string {
		out := run("-f", "tsv", "list", "queues", "name", "messages")
		if !strings.Contains(out, "ra1\t4\n") || !strings.Contains(out, "ra2\t1\n") {
			return "list queues:\n" + out
		}
		return ""
	})
	run("purge", "queue", "name=ra1")
	until(t, func() string {
		out := run("-f", "tsv", "list", "queues", "name", "messages")
		if !strings.Contains(out, "ra1\t0\n") || !strings.Contains(out, "ra2\t1\n") {
			return "after purge:\n" + out
		}
		return ""
	})
	run("delete", "queue", "name=ra2")
	out := run("-f", "tsv", "list", "queues", "name")
	if strings.Contains(out, "ra2") || !strings.Contains(out, "ra1") {
		t.Errorf("after delete:\n%s", out)
	}
	if _, err := ch.QueueDeclarePassive("ra2", true, false, false, false, nil); amqpCode(err) != 404 {
		t.Errorf("ra2 still declared after rabbitmqadmin deleted it: %v", err)
	}
	if out := run("-f", "tsv", "list", "exchanges", "name", "type"); !strings.Contains(out, "amq.topic\ttopic") {
		t.Errorf("list exchanges:\n%s", out)
	}
	run("show", "overview") // parses the overview (fails on a missing field it prints)
}

// FuzzManagementRequest sends arbitrary methods, paths and queries to the management API of a
// proxy with a queue: it answers with one of its documented statuses and JSON (or nothing),
// never panics. DELETEs of the seed queue are turned into GETs so it stays for later inputs.
func FuzzManagementRequest(f *testing.F) {
	e := newEnv(f)
	c, err := amqp.Dial(e.url())
	if err != nil {
		f.Fatal(err)
	}
	defer c.Close()
	ch, err := c.Channel()
	if err != nil {
		f.Fatal(err)
	}
	if _, err := ch.QueueDeclare("fz", false, false, false, false, nil); err != nil {
		f.Fatal(err)
	}
	v := url.PathEscape(e.vhost)
	for _, s := range []struct{ method, path string }{
		{"GET", "/api/overview"}, {"GET", "/api/queues/%2F"}, {"GET", "/api/queues/%2F/fz"}, {"DELETE", "/api/queues/%2F/fz?if-empty=true"},
		{"DELETE", "/api/queues/%2F/fz/contents"}, {"GET", "/api/exchanges/%2F/amq.default"}, {"GET", "/api/bindings/%2f"},
		{"GET", "/api/queues/%"}, {"GET", "/api//queues"}, {"POST", "/api/queues"}, {"GET", "/api/aliveness-test/%2F/x"},
		{"PUT", "/api/queues/%2F/fz"}, {"GET", "/api/vhosts/%2F%2F"}, {"GET", "/../api/whoami"}, {"HEAD", "/api/channels"},
	} {
		f.Add(s.method, strings.ReplaceAll(s.path, "%2F/fz", v+"/fz"))
	}
	h := e.srv.ManagementHandler()
	f.Fuzz(func(t *testing.T, method, path string) {
		if strings.Contains(path, "/fz") && method == "DELETE" {
			method = "GET"
		}
		req, err := http.NewRequest(method, "http://proxy"+path, nil)
		if err != nil {
			return // not a request a client could send
		}
		req.RemoteAddr = "127.0.0.1:1"
		req.SetBasicAuth("guest", "guest")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		switch rec.Code {
		case 200, 204, 400, 404, 405, 503:
		default:
			t.Fatalf("%s %q: status %d", method, path, rec.Code)
		}
		if method != "HEAD" && rec.Body.Len() > 0 && !json.Valid(rec.Body.Bytes()) {
			t.Fatalf("%s %q: %d %q is not JSON", method, path, rec.Code, rec.Body.String())
		}
	})
}
