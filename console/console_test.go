package console_test

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/kubemq-io/kubemq-proxy/internal/testenv"
	"github.com/kubemq-io/kubemq-proxy/proxy"
)

// Every page answers a loopback peer with its headings and a row for the declared topic,
// subscription, exchange and queue; the hostile queue name is escaped wherever it shows;
// /console/api/rates counts the publishes; / redirects to the console.
func TestConsolePages(t *testing.T) {
	f := newFixture(t, nil)
	f.publish(t, 3)

	code, _, h := do(t, "GET", f.base+"/", nil)
	if code != http.StatusFound || h.Get("Location") != "/console/" {
		t.Errorf("GET / = %d to %q, want 302 to /console/", code, h.Get("Location"))
	}
	escaped := strings.NewReplacer("<", "&lt;", ">", "&gt;", `"`, "&#34;", "'", "&#39;", "&", "&amp;").Replace(f.queue)
	for _, c := range []struct {
		path string
		want []string
	}{
		{"/console/", []string{"<h1>Overview</h1>", "<h2>KubeMQ backend</h2>", "<h2>Message rates</h2>", "<h2>Summary</h2>",
			`id="rate-pubsub_published"`, `id="rate-pubsub_delivered"`, `id="rate-pubsub_acked"`, `id="rate-amqp_published"`, `id="rate-amqp_delivered"`, `id="rate-amqp_acked"`}},
		{"/console/pubsub", []string{"<h1>Pub/Sub</h1>", "<h2>Topics</h2>", "<h2>Subscriptions</h2>", `data-topic="` + f.topic + `"`, `data-subscription="` + f.sub + `"`}},
		{"/console/amqp", []string{"<h1>AMQP 0-9-1</h1>", "<h2>Virtual hosts</h2>", "<h2>Queues</h2>", "<h2>Exchanges</h2>", "<h2>Bindings</h2>", "<h2>Connections and channels</h2>",
			`data-exchange="` + f.exchange + `"`, escaped, "console-test"}},
		{"/console/leases", []string{"<h1>Lease engine</h1>", `id="leases"`}},
		{"/console/login", []string{"Admin token", `name="token"`}},
		{"/console/static/console.js", []string{"X-Console-Request"}},
		{"/console/static/console.css", []string{"table"}},
	} {
		code, body, h := do(t, "GET", f.base+c.path, nil)
		if code != 200 {
			t.Errorf("GET %s = %d: %s", c.path, code, body)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(body, w) {
				t.Errorf("GET %s: no %q in the page", c.path, w)
			}
		}
		if strings.Contains(body, hostile) || strings.Contains(body, "<script>alert") || strings.Contains(body, "<img src=x") {
			t.Errorf("GET %s: the hostile queue name appears unescaped", c.path)
		}
		if strings.HasPrefix(c.path, "/console/") && !strings.Contains(c.path, "static") && h.Get("Content-Security-Policy") == "" {
			t.Errorf("GET %s: no Content-Security-Policy", c.path)
		}
	}
	// The queue's and the subscription's rows show the backlog figures GET /state reports for
	// them ("—" for a figure it does not report).
	_, stateBody, _ := do(t, "GET", f.base+"/state", nil)
	var state struct {
		Frontends struct {
			AMQP struct {
				Vhosts []struct {
					Queues []map[string]any `json:"queues"`
				} `json:"vhosts"`
			} `json:"amqp"`
			GCP struct {
				Subscriptions []map[string]any `json:"subscriptions"`
			} `json:"gcp"`
		} `json:"frontends"`
	}
	if err := json.Unmarshal([]byte(stateBody), &state); err != nil {
		t.Fatal(err)
	}
	var queueState, subState map[string]any
	for _, v := range state.Frontends.AMQP.Vhosts {
		for _, q := range v.Queues {
			if q["name"] == f.queue {
				queueState = q
			}
		}
	}
	for _, s := range state.Frontends.GCP.Subscriptions {
		if s["id"] == f.sub {
			subState = s
		}
	}
	if queueState == nil || subState == nil {
		t.Fatalf("GET /state has no queue %q or subscription %q: %s", f.queue, f.sub, stateBody)
	}
	_, body, _ := do(t, "GET", f.base+"/console/amqp", nil)
	checkFigures(t, "queue", rowCells(t, body, `data-queue="`+escaped+`"`), queueState,
		"messages_ready", "messages_unacknowledged", "oldest_unacked_age_seconds")
	_, body, _ = do(t, "GET", f.base+"/console/pubsub", nil)
	checkFigures(t, "subscription", rowCells(t, body, `data-subscription="`+f.sub+`"`), subState,
		"messages_ready", "messages_unacked", "oldest_unacked_message_age_seconds", "consumers")

	code, body, _ = do(t, "GET", f.base+"/console/api/rates", nil)
	var rates struct {
		TimeMillis int64              `json:"time_ms"`
		Counters   map[string]float64 `json:"counters"`
	}
	if err := json.Unmarshal([]byte(body), &rates); code != 200 || err != nil {
		t.Fatalf("GET /console/api/rates = %d %q: %v", code, body, err)
	}
	if rates.Counters["pubsub_published"] < 3 || rates.Counters["amqp_published"] < 3 || rates.TimeMillis == 0 || len(rates.Counters) != 6 {
		t.Errorf("rates = %+v, want six counters and at least 3 published per protocol", rates)
	}
}

// Every action works from a loopback peer with the console's header, and its effect is seen
// by the protocols' own clients.
func TestConsoleActions(t *testing.T) {
	f := newFixture(t, nil)
	f.publish(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	subName := "projects/console-test/subscriptions/" + f.sub

	// AMQP: peek sees the two messages without consuming them; a test message goes through
	// the exchange; purge empties the queue; delete removes it.
	code, r := act(t, f.base, "amqp-peek", url.Values{"vhost": {"/"}, "queue": {f.queue}})
	if code != 200 || len(r.Messages) != 2 || r.Messages[0].Body != "amqp-0" {
		t.Fatalf("amqp-peek = %d %+v, want amqp-0 and amqp-1", code, r)
	}
	code, r = act(t, f.base, "amqp-publish", url.Values{"vhost": {"/"}, "exchange": {f.exchange}, "routing_key": {f.bkey}, "body": {"from the console"}})
	if code != 200 || !strings.Contains(r.Message, "stored in 1 queues") {
		t.Fatalf("amqp-publish = %d %+v", code, r)
	}
	code, r = act(t, f.base, "amqp-peek", url.Values{"vhost": {"/"}, "queue": {f.queue}, "count": {"5"}})
	if code != 200 || len(r.Messages) != 3 || r.Messages[2].Body != "from the console" {
		t.Fatalf("amqp-peek after publish = %d %+v", code, r)
	}
	if code, r = act(t, f.base, "amqp-purge", url.Values{"vhost": {"/"}, "queue": {f.queue}}); code != 200 || !strings.Contains(r.Message, "purged 3 messages") {
		t.Fatalf("amqp-purge = %d %+v", code, r)
	}
	if _, ok, err := f.ch.Get(f.queue, true); ok || err != nil {
		t.Errorf("basic.get after purge: ok %v, err %v; want empty", ok, err)
	}
	if code, r = act(t, f.base, "amqp-delete", url.Values{"vhost": {"/"}, "queue": {f.queue}}); code != 200 {
		t.Fatalf("amqp-delete = %d %+v", code, r)
	}
	if _, err := f.ch.QueueDeclarePassive(f.queue, false, false, false, false, nil); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("passive declare after delete: %v, want 404", err)
	}
	if code, r = act(t, f.base, "amqp-purge", url.Values{"vhost": {"/"}, "queue": {f.queue}}); code != 404 {
		t.Errorf("amqp-purge of a deleted queue = %d %+v, want 404", code, r)
	}
	if code, r = act(t, f.base, "amqp-publish", url.Values{"vhost": {"/"}, "exchange": {"nope"}, "routing_key": {"k"}}); code != 404 {
		t.Errorf("amqp-publish to a missing exchange = %d %+v, want 404", code, r)
	}

	// Pub/Sub: a test message with attributes; peek; purge (seek to now); delete.
	code, r = act(t, f.base, "pubsub-publish", url.Values{"topic": {f.topic}, "data": {"console data"}, "attributes": {"a=1\nb=two"}})
	if code != 200 || !strings.Contains(r.Message, "published message") {
		t.Fatalf("pubsub-publish = %d %+v", code, r)
	}
	code, r = act(t, f.base, "pubsub-peek", url.Values{"subscription": {f.sub}})
	if code != 200 || len(r.Messages) != 3 || r.Messages[2].Body != "console data" || r.Messages[2].Tags["b"] != "two" {
		t.Fatalf("pubsub-peek = %d %+v", code, r)
	}
	if code, r = act(t, f.base, "pubsub-publish", url.Values{"topic": {f.topic}, "attributes": {"no equals sign"}}); code != 400 {
		t.Errorf("pubsub-publish with a bad attribute line = %d %+v, want 400", code, r)
	}
	if code, r = act(t, f.base, "pubsub-purge", url.Values{"subscription": {f.sub}}); code != 200 {
		t.Fatalf("pubsub-purge = %d %+v", code, r)
	}
	pctx, pcancel := context.WithTimeout(ctx, 3*time.Second)
	resp, err := f.ps.SubscriptionAdminClient.Pull(pctx, &pubsubpb.PullRequest{Subscription: subName, MaxMessages: 10})
	pcancel()
	if err == nil && len(resp.GetReceivedMessages()) > 0 {
		t.Errorf("pull after purge got %d messages", len(resp.GetReceivedMessages()))
	}
	if code, r = act(t, f.base, "pubsub-delete", url.Values{"subscription": {f.sub}}); code != 200 {
		t.Fatalf("pubsub-delete = %d %+v", code, r)
	}
	if _, err := f.ps.SubscriptionAdminClient.GetSubscription(ctx, &pubsubpb.GetSubscriptionRequest{Subscription: subName}); err == nil || !strings.Contains(err.Error(), "NotFound") {
		t.Errorf("GetSubscription after delete: %v, want NotFound", err)
	}
	if code, r = act(t, f.base, "pubsub-delete", url.Values{"subscription": {f.sub}}); code != 404 {
		t.Errorf("second pubsub-delete = %d %+v, want 404", code, r)
	}

	// Bad requests.
	if code, r = act(t, f.base, "no-such-action", url.Values{}); code != 404 {
		t.Errorf("unknown action = %d %+v", code, r)
	}
	if code, r = act(t, f.base, "amqp-purge", url.Values{"vhost": {"/"}}); code != 400 {
		t.Errorf("amqp-purge without queue = %d %+v", code, r)
	}
	if code, r = act(t, f.base, "amqp-peek", url.Values{"vhost": {"/"}, "queue": {"x"}, "count": {"1000"}}); code != 400 {
		t.Errorf("amqp-peek of 1000 = %d %+v", code, r)
	}
	if code, r = act(t, f.base, "pubsub-publish", url.Values{"topic": {f.topic}, "data": {strings.Repeat("x", 2<<20)}}); code != 400 {
		t.Errorf("pubsub-publish of a 2 MiB form = %d %+v, want 400", code, r)
	}
}

// Actions another site's page could send are refused before they run: no console header (an
// HTML form), a foreign Origin, a cross-site fetch, or GET.
func TestConsoleActionCSRF(t *testing.T) {
	f := newFixture(t, nil)
	f.publish(t, 1)
	form := url.Values{"vhost": {"/"}, "queue": {f.queue}}
	code, body, _ := do(t, "POST", f.base+"/console/action/amqp-purge", form)
	if code != http.StatusForbidden || !strings.Contains(body, "X-Console-Request") {
		t.Errorf("purge without the header = %d %q, want 403", code, body)
	}
	if code, r := act(t, f.base, "amqp-purge", form, "Origin", "http://evil.example"); code != http.StatusForbidden {
		t.Errorf("purge with a foreign Origin = %d %+v, want 403", code, r)
	}
	if code, r := act(t, f.base, "amqp-purge", form, "Sec-Fetch-Site", "cross-site"); code != http.StatusForbidden {
		t.Errorf("purge from a cross-site fetch = %d %+v, want 403", code, r)
	}
	if code, _, _ := do(t, "GET", f.base+"/console/action/amqp-purge?vhost=/&queue="+url.QueryEscape(f.queue), nil, "X-Console-Request", "1"); code != http.StatusMethodNotAllowed {
		t.Errorf("GET of an action = %d, want 405", code)
	}
	// A DNS-rebinding page reaches the loopback listener under its own host name: refused.
	if code, _, _ := do(t, "GET", f.base+"/console/amqp", nil, "Host", "rebind.evil.example"); code != http.StatusForbidden {
		t.Errorf("page under a foreign Host = %d, want 403", code)
	}
	// Nothing was purged.
	code, r := act(t, f.base, "amqp-peek", url.Values{"vhost": {"/"}, "queue": {f.queue}}, "Origin", f.base)
	if code != 200 || len(r.Messages) != 1 {
		t.Errorf("peek after the refused purges = %d %+v, want the message still there", code, r)
	}
}

// A non-loopback peer needs the admin token for pages and actions (as a Bearer header, or a
// cookie set by /console/login); without a configured token it is refused.
func TestConsoleAuth(t *testing.T) {
	ip := testenv.NonLoopbackIP(t)
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	withToken := startProxy(t, func(c *proxy.Config) {
		c.HTTP.Listen = net.JoinHostPort(ip, "0")
		c.HTTP.AdminTokenFile = tokenFile
	})
	noToken := startProxy(t, func(c *proxy.Config) { c.HTTP.Listen = net.JoinHostPort(ip, "0") })
	base := "http://" + withToken.Addr("http")
	pages := []string{"/console/", "/console/pubsub", "/console/amqp", "/console/leases", "/console/api/rates"}
	for _, path := range pages {
		if code, body, _ := do(t, "GET", base+path, nil); code != http.StatusUnauthorized {
			t.Errorf("GET %s without token = %d, want 401", path, code)
		} else if path != "/console/api/rates" && !strings.Contains(body, `name="token"`) {
			t.Errorf("GET %s without token: no login form in %q", path, body)
		}
		if code, _, _ := do(t, "GET", base+path, nil, "Authorization", "Bearer wrong"); code != http.StatusUnauthorized {
			t.Errorf("GET %s with a wrong token = %d, want 401", path, code)
		}
		if code, _, _ := do(t, "GET", base+path, nil, "Authorization", "Bearer s3cret"); code != 200 {
			t.Errorf("GET %s with the token = %d, want 200", path, code)
		}
		if code, _, _ := do(t, "GET", base+path, nil, "Cookie", "kubemq_proxy_console_token=s3cret"); code != 200 {
			t.Errorf("GET %s with the token cookie = %d, want 200", path, code)
		}
		if code, _, _ := do(t, "GET", base+path, nil, "Cookie", "kubemq_proxy_console_token=wrong"); code != http.StatusUnauthorized {
			t.Errorf("GET %s with a wrong cookie = %d, want 401", path, code)
		}
		if code, _, _ := do(t, "GET", "http://"+noToken.Addr("http")+path, nil); code != http.StatusForbidden {
			t.Errorf("GET %s from %s with no token configured = %d, want 403", path, ip, code)
		}
	}
	// The login form sets the cookie the pages accept.
	code, _, h := do(t, "POST", base+"/console/login", url.Values{"token": {"s3cret"}})
	ck := (&http.Response{Header: h}).Cookies()
	if code != http.StatusSeeOther || len(ck) != 1 || ck[0].Value != "s3cret" || !ck[0].HttpOnly || ck[0].SameSite != http.SameSiteStrictMode {
		t.Errorf("POST /console/login = %d, cookies %+v", code, ck)
	}
	if code, _, _ := do(t, "POST", base+"/console/login", url.Values{"token": {"s3cret"}}, "Origin", "http://evil.example"); code != http.StatusForbidden {
		t.Errorf("cross-origin login = %d, want 403", code)
	}
	// Actions: the token and the console header are both needed.
	form := url.Values{"vhost": {"/"}, "exchange": {"amq.direct"}, "routing_key": {"nowhere"}}
	if code, _, _ := do(t, "POST", base+"/console/action/amqp-publish", form, "X-Console-Request", "1"); code != http.StatusUnauthorized {
		t.Errorf("action without token = %d, want 401", code)
	}
	if code, _, _ := do(t, "POST", base+"/console/action/amqp-publish", form, "Authorization", "Bearer s3cret"); code != http.StatusForbidden {
		t.Errorf("action with the token but no console header = %d, want 403", code)
	}
	if code, r := act(t, base, "amqp-publish", form, "Authorization", "Bearer s3cret"); code != 200 || !strings.Contains(r.Message, "stored in 0 queues") {
		t.Errorf("action with the token = %d %+v", code, r)
	}
	if code, r := act(t, base, "amqp-publish", form, "Cookie", "kubemq_proxy_console_token=s3cret"); code != 200 {
		t.Errorf("action with the token cookie = %d %+v", code, r)
	}
	// With a token, any Host is fine (the DNS-rebinding check is for tokenless requests).
	if code, _, _ := do(t, "GET", base+"/console/", nil, "Authorization", "Bearer s3cret", "Host", "proxy.example"); code != 200 {
		t.Errorf("page under a host name with the token = %d, want 200", code)
	}
}

// rowCells returns the numeric cells of the table row whose tag holds attr.
func rowCells(t *testing.T, page, attr string) []string {
	t.Helper()
	i := strings.Index(page, attr)
	if i < 0 {
		t.Fatalf("no row with %s", attr)
	}
	row := page[i:]
	row = row[:strings.Index(row, "</tr>")]
	var cells []string
	for {
		j := strings.Index(row, `<td class="num">`)
		if j < 0 {
			return cells
		}
		row = row[j+len(`<td class="num">`):]
		cells = append(cells, row[:strings.Index(row, "</td>")])
	}
}

// checkFigures compares the first cells of a row with the /state fields named, in order.
func checkFigures(t *testing.T, what string, cells []string, state map[string]any, fields ...string) {
	t.Helper()
	if len(cells) < len(fields) {
		t.Fatalf("%s row has %d numeric cells: %q", what, len(cells), cells)
	}
	for i, k := range fields {
		want := "—"
		if v, ok := state[k].(float64); ok {
			want = strconv.FormatFloat(v, 'f', -1, 64)
			if strings.Contains(k, "seconds") {
				want = strconv.FormatFloat(v, 'f', 1, 64)
			}
		}
		if cells[i] != want {
			t.Errorf("%s row: %s shows %q, /state has %q", what, k, cells[i], want)
		}
	}
	t.Logf("%s figures %q (from %v)", what, cells[:len(fields)], fields)
}

// A test message published from the console meets the queues' length limits as a client's
// would: a full reject-publish queue refuses it, a drop-head queue drops its oldest.
func TestConsolePublishLimits(t *testing.T) {
	f := newFixture(t, nil)
	reject, drop := unique("console-reject"), unique("console-drop")
	for _, q := range []struct {
		name, overflow string
	}{{reject, "reject-publish"}, {drop, "drop-head"}} {
		if _, err := f.ch.QueueDeclare(q.name, false, false, false, false, amqp.Table{"x-max-length": int32(1), "x-overflow": q.overflow}); err != nil {
			t.Fatal(err)
		}
		if err := f.ch.QueueBind(q.name, "limits", f.exchange, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	form := url.Values{"vhost": {"/"}, "exchange": {f.exchange}, "routing_key": {"limits"}, "body": {"first"}}
	if code, r := act(t, f.base, "amqp-publish", form); code != 200 || !strings.Contains(r.Message, "stored in 2 queues") {
		t.Fatalf("first publish = %d %+v", code, r)
	}
	form.Set("body", "second")
	if code, r := act(t, f.base, "amqp-publish", form); code != 200 || !strings.Contains(r.Message, "stored in 1 queues, refused by 1 full queues") {
		t.Fatalf("second publish = %d %+v", code, r)
	}
	// The drop-head trim goes through the lease engine, so a client reads what is left.
	want := map[string]string{reject: "first", drop: "second"}
	for q, body := range want {
		deadline := time.Now().Add(30 * time.Second)
		var got []string
		for len(got) == 0 {
			m, ok, err := f.ch.Get(q, true)
			if err != nil {
				t.Fatal(err)
			}
			if ok {
				got = append(got, string(m.Body))
			} else if time.Now().After(deadline) {
				t.Fatalf("queue %s: nothing to get", q)
			} else {
				time.Sleep(100 * time.Millisecond)
			}
		}
		if m, ok, err := f.ch.Get(q, true); ok || err != nil {
			got = append(got, string(m.Body))
		}
		if len(got) != 1 || got[0] != body {
			t.Errorf("queue %s holds %q, want only %q", q, got, body)
		}
	}
}
