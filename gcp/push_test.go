package gcp_test

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/kubemq-io/kubemq-proxy/gcp"
)

// pushReq is one request an endpoint received.
type pushReq struct {
	at     time.Time
	method string
	header http.Header
	body   []byte
	wrap   map[string]any // the decoded JSON body, for wrapped requests
	id     string         // the message id (from the body or the metadata header)
	key    string         // ordering key
	data   string
	code   int // the answer
}

// endpoint is an httptest push endpoint on 127.0.0.1:0. answer decides the
// status code of each request (attempt: 1 for a message's first request);
// nil answers 204.
type endpoint struct {
	t   testing.TB
	srv *httptest.Server

	mu       sync.Mutex
	reqs     []pushReq
	attempts map[string]int
	inflight map[string]int // ordering key -> requests in flight
	answer   func(r pushReq, attempt int) int
	delay    func(r pushReq, attempt int) time.Duration
	changed  chan struct{}
	overlap  string // a key pushed twice at once
}

func newEndpoint(t testing.TB) *endpoint {
	ep := &endpoint{t: t, attempts: map[string]int{}, inflight: map[string]int{}, changed: make(chan struct{}, 1)}
	ep.srv = httptest.NewServer(http.HandlerFunc(ep.serve))
	t.Cleanup(ep.srv.Close)
	return ep
}

func (ep *endpoint) url() string { return ep.srv.URL + "/push" }

func (ep *endpoint) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	pr := pushReq{at: time.Now(), method: r.Method, header: r.Header.Clone(), body: body}
	if strings.HasPrefix(r.Header.Get("Content-Type"), "application/json") {
		if err := json.Unmarshal(body, &pr.wrap); err != nil {
			ep.t.Errorf("wrapped push body is not JSON: %v: %q", err, body)
		}
		msg, _ := pr.wrap["message"].(map[string]any)
		pr.id, _ = msg["messageId"].(string)
		pr.key, _ = msg["orderingKey"].(string)
		d, _ := msg["data"].(string)
		raw, _ := base64.StdEncoding.DecodeString(d)
		pr.data = string(raw)
	} else {
		pr.id = r.Header.Get("X-Goog-Pubsub-Message-Id")
		pr.key = r.Header.Get("X-Goog-Pubsub-Ordering-Key")
		pr.data = string(body)
		if pr.id == "" {
			pr.id = "data:" + pr.data // no metadata: the test's messages differ in data
		}
	}
	ep.mu.Lock()
	ep.attempts[pr.id]++
	n := ep.attempts[pr.id]
	if pr.key != "" {
		ep.inflight[pr.key]++
		if ep.inflight[pr.key] > 1 {
			ep.overlap = pr.key
		}
	}
	answer, delay := ep.answer, ep.delay
	ep.mu.Unlock()
	if delay != nil {
		if d := delay(pr, n); d > 0 {
			select {
			case <-time.After(d):
			case <-r.Context().Done():
			}
		}
	}
	code := http.StatusNoContent
	if answer != nil {
		code = answer(pr, n)
	}
	pr.code = code
	ep.mu.Lock()
	if pr.key != "" {
		ep.inflight[pr.key]--
	}
	ep.reqs = append(ep.reqs, pr)
	ep.mu.Unlock()
	select {
	case ep.changed <- struct{}{}:
	default:
	}
	w.WriteHeader(code)
}

// waitFor waits until cond (called under the endpoint's lock) holds.
func (ep *endpoint) waitFor(ctx context.Context, what string, cond func() bool) {
	ep.t.Helper()
	for {
		ep.mu.Lock()
		ok := cond()
		ep.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-ep.changed:
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
			ep.mu.Lock()
			n := len(ep.reqs)
			ep.mu.Unlock()
			ep.t.Fatalf("timed out waiting for %s (%d requests so far)", what, n)
		}
	}
}

// ackedLocked: the ids answered with an ack code.
func (ep *endpoint) ackedLocked() map[string]bool {
	out := map[string]bool{}
	for _, r := range ep.reqs {
		if r.code/100 == 2 {
			out[r.id] = true
		}
	}
	return out
}

func (e *env) createPushSub(ctx context.Context, c *pubsub.Client, sub *pubsubpb.Subscription) *pubsubpb.Subscription {
	e.t.Helper()
	got, err := c.SubscriptionAdminClient.CreateSubscription(ctx, sub)
	if err != nil {
		e.t.Fatal(err)
	}
	return got
}

// TestPushWrapped: the JSON wrapper field by field, as Google's format has
// it; 204 acks (nothing comes again).
func TestPushWrapped(t *testing.T) {
	e := startEnv(t)
	ctx := ctxT(t, 60*time.Second)
	ep := newEndpoint(t)
	c := e.v2()
	tid, sid := e.id("t"), e.id("s")
	e.createTopic(ctx, tid)
	got := e.createPushSub(ctx, c, &pubsubpb.Subscription{Name: e.subName(sid), Topic: e.topicName(tid),
		PushConfig: &pubsubpb.PushConfig{PushEndpoint: ep.url(), Attributes: map[string]string{"x-goog-version": "v1"}}})
	if got.PushConfig.GetPushEndpoint() != ep.url() || got.PushConfig.Attributes["x-goog-version"] != "v1" {
		t.Fatalf("created push config %v", got.PushConfig)
	}
	p := c.Publisher(tid)
	defer p.Stop()
	before := time.Now()
	r1 := p.Publish(ctx, &pubsub.Message{Data: []byte("hello \x00\xff"), Attributes: map[string]string{"a": "1", "B-Key": "x y"}})
	r2 := p.Publish(ctx, &pubsub.Message{Attributes: map[string]string{"only": "attr"}})
	r3 := p.Publish(ctx, &pubsub.Message{Data: []byte("no attributes")})
	ids := map[string]string{}
	for data, r := range map[string]*pubsub.PublishResult{"hello \x00\xff": r1, "": r2, "no attributes": r3} {
		id, err := r.Get(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ids[id] = data
	}
	ep.waitFor(ctx, "three pushes", func() bool { return len(ep.reqs) >= 3 })
	ep.mu.Lock()
	reqs := append([]pushReq(nil), ep.reqs...)
	ep.mu.Unlock()
	for _, r := range reqs {
		if r.method != http.MethodPost || r.header.Get("Content-Type") != "application/json" {
			t.Errorf("request %s %s", r.method, r.header.Get("Content-Type"))
		}
		if r.header.Get("Authorization") != "" {
			t.Errorf("Authorization sent without an oidc_token config")
		}
		data, ok := ids[r.id]
		if !ok || r.data != data {
			t.Errorf("pushed %q as id %s", r.data, r.id)
		}
		w := r.wrap
		if w["subscription"] != e.subName(sid) {
			t.Errorf("subscription %v", w["subscription"])
		}
		if _, ok := w["deliveryAttempt"]; ok {
			t.Errorf("deliveryAttempt without a dead-letter policy: %s", r.body)
		}
		m := w["message"].(map[string]any)
		if m["message_id"] != r.id {
			t.Errorf("message_id %v messageId %v", m["message_id"], r.id)
		}
		pt, _ := m["publishTime"].(string)
		if m["publish_time"] != pt {
			t.Errorf("publish_time %v publishTime %v", m["publish_time"], pt)
		}
		at, err := time.Parse(time.RFC3339Nano, pt)
		if err != nil || !strings.HasSuffix(pt, "Z") || at.Before(before.Add(-time.Second)) || at.After(time.Now()) {
			t.Errorf("publishTime %q (%v)", pt, err)
		}
		if _, ok := m["orderingKey"]; ok {
			t.Errorf("orderingKey without one: %s", r.body)
		}
		attrs, hasAttrs := m["attributes"].(map[string]any)
		switch data {
		case "hello \x00\xff":
			if len(attrs) != 2 || attrs["a"] != "1" || attrs["B-Key"] != "x y" {
				t.Errorf("attributes %v", attrs)
			}
		case "":
			if len(attrs) != 1 || attrs["only"] != "attr" || m["data"] != "" {
				t.Errorf("attributes %v data %v", attrs, m["data"])
			}
		default:
			if !hasAttrs || len(attrs) != 0 {
				t.Errorf("attributes without any: %s", r.body)
			}
		}
		for k := range m {
			switch k {
			case "attributes", "data", "messageId", "message_id", "publishTime", "publish_time":
			default:
				t.Errorf("unexpected message field %q", k)
			}
		}
	}
	// Acked: the subscription (switched to pull) has nothing left.
	sa := c.SubscriptionAdminClient
	if err := sa.ModifyPushConfig(ctx, &pubsubpb.ModifyPushConfigRequest{Subscription: e.subName(sid), PushConfig: &pubsubpb.PushConfig{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := rawSubscriber(t, e).Pull(ctx, &pubsubpb.PullRequest{Subscription: e.subName(sid), MaxMessages: 10, ReturnImmediately: true})
	if err != nil || len(resp.ReceivedMessages) != 0 {
		t.Fatalf("after acking pushes, pull got %v %v", resp, err)
	}
	ep.mu.Lock()
	defer ep.mu.Unlock()
	if len(ep.reqs) != 3 {
		t.Fatalf("%d requests for 3 messages acked with 204", len(ep.reqs))
	}
}

// TestPushNoWrapper: the raw body, with and without write_metadata.
func TestPushNoWrapper(t *testing.T) {
	e := startEnv(t)
	ctx := ctxT(t, 60*time.Second)
	meta, plain := newEndpoint(t), newEndpoint(t)
	c := e.v2()
	tid := e.id("t")
	e.createTopic(ctx, tid)
	e.createPushSub(ctx, c, &pubsubpb.Subscription{Name: e.subName(e.id("meta")), Topic: e.topicName(tid), EnableMessageOrdering: true,
		DeadLetterPolicy: &pubsubpb.DeadLetterPolicy{DeadLetterTopic: e.topicName(tid), MaxDeliveryAttempts: 5},
		PushConfig: &pubsubpb.PushConfig{PushEndpoint: meta.url(),
			Wrapper: &pubsubpb.PushConfig_NoWrapper_{NoWrapper: &pubsubpb.PushConfig_NoWrapper{WriteMetadata: true}}}})
	e.createPushSub(ctx, c, &pubsubpb.Subscription{Name: e.subName(e.id("plain")), Topic: e.topicName(tid),
		PushConfig: &pubsubpb.PushConfig{PushEndpoint: plain.url(),
			Wrapper: &pubsubpb.PushConfig_NoWrapper_{NoWrapper: &pubsubpb.PushConfig_NoWrapper{}}}})
	p := c.Publisher(tid)
	p.EnableMessageOrdering = true
	defer p.Stop()
	id, err := p.Publish(ctx, &pubsub.Message{Data: []byte("raw body"), OrderingKey: "k1",
		Attributes: map[string]string{"a": "1", "Content-Length": "99", "bad header": "x"}}).Get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The dead-letter topic is the same topic: only the first copy counts.
	meta.waitFor(ctx, "a push with metadata", func() bool { return len(meta.reqs) >= 1 })
	plain.waitFor(ctx, "a plain push", func() bool { return len(plain.reqs) >= 1 })
	meta.mu.Lock()
	r := meta.reqs[0]
	meta.mu.Unlock()
	h := r.header
	if string(r.body) != "raw body" || h.Get("Content-Type") != "application/octet-stream" || h.Get("A") != "1" ||
		h.Get("X-Goog-Pubsub-Subscription-Name") != e.subName(e.id("meta")) || h.Get("X-Goog-Pubsub-Message-Id") != id ||
		h.Get("X-Goog-Pubsub-Ordering-Key") != "k1" || h.Get("X-Goog-Pubsub-Delivery-Attempt") != "1" || h.Get("Bad header") != "" {
		t.Fatalf("write_metadata push: %q %v", r.body, h)
	}
	if _, err := time.Parse(time.RFC3339Nano, h.Get("X-Goog-Pubsub-Publish-Time")); err != nil {
		t.Fatalf("publish time header: %v", err)
	}
	plain.mu.Lock()
	r = plain.reqs[0]
	plain.mu.Unlock()
	if string(r.body) != "raw body" || r.header.Get("A") != "" || r.header.Get("X-Goog-Pubsub-Message-Id") != "" {
		t.Fatalf("plain no_wrapper push: %q %v", r.body, r.header)
	}
}

// TestPushFailuresBackoff: non-2xx answers and a slow endpoint are nacks;
// without a retry policy the pushes back off exponentially; in the end
// every message is acked once and none is lost.
func TestPushFailuresBackoff(t *testing.T) {
	e := startEnv(t)
	ctx := ctxT(t, 90*time.Second)
	ep := newEndpoint(t)
	failCodes := []int{500, 503, 429, 400, 302}
	ep.answer = func(r pushReq, n int) int {
		if r.data == "m0" && n <= len(failCodes) {
			return failCodes[n-1]
		}
		return 200
	}
	ep.delay = func(r pushReq, n int) time.Duration {
		if r.data == "slow" && n == 1 {
			return 12 * time.Second // beyond the 10 s ack deadline
		}
		return 0
	}
	c := e.v2()
	tid, sid := e.id("t"), e.id("s")
	e.createTopic(ctx, tid)
	e.createPushSub(ctx, c, &pubsubpb.Subscription{Name: e.subName(sid), Topic: e.topicName(tid), AckDeadlineSeconds: 10,
		PushConfig: &pubsubpb.PushConfig{PushEndpoint: ep.url()}})
	// One failing message alone: its attempts are spaced by the push
	// backoff, 100 ms doubling with each consecutive failure.
	m0 := publishN(t, ctx, c, tid, 1, "")[0]
	ep.waitFor(ctx, "m0 acked", func() bool { return ep.ackedLocked()[m0] })
	ep.mu.Lock()
	var at []time.Time
	for _, r := range ep.reqs {
		if r.id == m0 {
			at = append(at, r.at)
		}
	}
	ep.mu.Unlock()
	if len(at) != len(failCodes)+1 {
		t.Fatalf("m0 pushed %d times, want %d", len(at), len(failCodes)+1)
	}
	for i := 1; i < len(at); i++ {
		if want := 100 * time.Millisecond << (i - 1); at[i].Sub(at[i-1]) < want*9/10 {
			t.Fatalf("m0 attempt %d came %v after the previous failure, before the %v push backoff", i+1, at[i].Sub(at[i-1]), want)
		}
	}
	// A slow endpoint: no answer within the ack deadline is a nack; the
	// others are acked once.
	p := c.Publisher(tid)
	var rs []*pubsub.PublishResult
	for i := range 20 {
		rs = append(rs, p.Publish(ctx, &pubsub.Message{Data: []byte(fmt.Sprint("x", i))}))
	}
	rs = append(rs, p.Publish(ctx, &pubsub.Message{Data: []byte("slow")}))
	var ids []string
	for _, r := range rs {
		id, err := r.Get(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	p.Stop()
	ep.waitFor(ctx, "every message acked", func() bool { return len(ep.ackedLocked()) >= len(ids)+1 })
	time.Sleep(500 * time.Millisecond) // what was acked does not come again
	ep.mu.Lock()
	defer ep.mu.Unlock()
	var slow []pushReq
	for _, r := range ep.reqs {
		if r.data == "slow" {
			slow = append(slow, r)
		}
	}
	if len(slow) != 2 || slow[1].at.Sub(slow[0].at) < 9*time.Second {
		t.Fatalf("slow message pushed %d times, want 2 (a timeout after the 10 s ack deadline, then an ack)", len(slow))
	}
	for _, id := range ids[:20] {
		if ep.attempts[id] != 1 {
			t.Fatalf("message %s pushed %d times, acked the first time", id, ep.attempts[id])
		}
	}
	if ep.attempts[m0] != len(failCodes)+1 {
		t.Fatalf("m0 pushed again after its ack")
	}
}

// TestPushDeadLetter: delivery attempts in the wrapper, the retry policy's
// backoff between them, and the dead-letter copy after the last one.
func TestPushDeadLetter(t *testing.T) {
	e := startEnv(t)
	ctx := ctxT(t, 60*time.Second)
	ep := newEndpoint(t)
	ep.answer = func(pushReq, int) int { return 500 }
	c := e.v2()
	tid, sid, dlt, dls := e.id("t"), e.id("s"), e.id("dlt"), e.id("dls")
	e.createTopic(ctx, tid)
	e.createTopic(ctx, dlt)
	e.createSub(ctx, &pubsubpb.Subscription{Name: e.subName(dls), Topic: e.topicName(dlt)})
	e.createPushSub(ctx, c, &pubsubpb.Subscription{Name: e.subName(sid), Topic: e.topicName(tid),
		DeadLetterPolicy: &pubsubpb.DeadLetterPolicy{DeadLetterTopic: e.topicName(dlt), MaxDeliveryAttempts: 5},
		RetryPolicy:      &pubsubpb.RetryPolicy{MinimumBackoff: durationpb.New(200 * time.Millisecond), MaximumBackoff: durationpb.New(time.Second)},
		PushConfig:       &pubsubpb.PushConfig{PushEndpoint: ep.url()}})
	publishN(t, ctx, c, tid, 1, "")
	sc := rawSubscriber(t, e)
	var dead []*pubsubpb.ReceivedMessage
	for len(dead) == 0 {
		dead = pull(t, ctx, sc, e.subName(dls), 1)
	}
	if a := dead[0].Message.Attributes; a["CloudPubSubDeadLetterSourceDeliveryCount"] != "5" || a["CloudPubSubDeadLetterSourceSubscription"] != e.subName(sid) {
		t.Fatalf("dead-lettered copy %v", a)
	}
	ep.mu.Lock()
	defer ep.mu.Unlock()
	var attempts []string
	for i, r := range ep.reqs {
		attempts = append(attempts, fmt.Sprint(r.wrap["deliveryAttempt"]))
		if i > 0 {
			// The retry policy: 200 ms, 400 ms, 800 ms, 1 s after each failure.
			want := min(200*time.Millisecond<<(i-1), time.Second)
			if gap := r.at.Sub(ep.reqs[i-1].at); gap < want*9/10 {
				t.Errorf("attempt %d came %v after the previous one, before the %v backoff", i+1, gap, want)
			}
		}
	}
	if strings.Join(attempts, " ") != "1 2 3 4 5" {
		t.Fatalf("deliveryAttempt of the pushes: %v", attempts)
	}
}

// TestPushOrdering: a key's messages are pushed one at a time, in order; a
// failure brings the key back to the failed message.
func TestPushOrdering(t *testing.T) {
	e := startEnv(t)
	ctx := ctxT(t, 90*time.Second)
	ep := newEndpoint(t)
	ep.answer = func(r pushReq, n int) int {
		i, _ := strconv.Atoi(strings.TrimPrefix(r.data, "m"))
		if i%7 == 3 && n == 1 {
			return 500
		}
		return 204
	}
	ep.delay = func(pushReq, int) time.Duration { return time.Millisecond }
	c := e.v2()
	tid, sid := e.id("t"), e.id("s")
	e.createTopic(ctx, tid)
	e.createPushSub(ctx, c, &pubsubpb.Subscription{Name: e.subName(sid), Topic: e.topicName(tid), EnableMessageOrdering: true,
		RetryPolicy: &pubsubpb.RetryPolicy{MinimumBackoff: durationpb.New(0), MaximumBackoff: durationpb.New(0)},
		PushConfig:  &pubsubpb.PushConfig{PushEndpoint: ep.url()}})
	const perKey = 30
	keys := []string{"a", "b", "c"}
	for _, k := range keys {
		publishN(t, ctx, c, tid, perKey, k)
	}
	ep.waitFor(ctx, "every key's last message acked", func() bool {
		done := map[string]bool{}
		for _, r := range ep.reqs {
			if r.data == fmt.Sprint("m", perKey-1) {
				done[r.key] = true
			}
		}
		return len(done) == len(keys)
	})
	ep.mu.Lock()
	defer ep.mu.Unlock()
	if ep.overlap != "" {
		t.Fatalf("key %s had two pushes in flight at once", ep.overlap)
	}
	seqs := map[string][]int{}
	failed := map[string]bool{}
	for _, r := range ep.reqs {
		i, _ := strconv.Atoi(strings.TrimPrefix(r.data, "m"))
		seqs[r.key] = append(seqs[r.key], i)
		if i%7 == 3 {
			failed[r.key+strconv.Itoa(i)] = true
		}
	}
	for _, k := range keys {
		checkKeyOrder(t, k, seqs[k], perKey, func(i int) bool { return failed[k+strconv.Itoa(i)] })
	}
}

// TestPushSwitchUnderLoad: a subscription goes pull -> push -> pull ->
// push while messages are published; every message is received, by a
// pull client or the endpoint.
func TestPushSwitchUnderLoad(t *testing.T) {
	e := startEnv(t)
	ctx := ctxT(t, 120*time.Second)
	ep := newEndpoint(t)
	c := e.v2()
	tid, sid := e.id("t"), e.id("s")
	e.createTopic(ctx, tid)
	e.createSub(ctx, &pubsubpb.Subscription{Name: e.subName(sid), Topic: e.topicName(tid)})
	var mu sync.Mutex
	pulled := map[string]bool{}
	rctx, rcancel := context.WithCancel(ctx)
	recvDone := make(chan error, 1)
	go func() {
		recvDone <- c.Subscriber(sid).Receive(rctx, func(_ context.Context, m *pubsub.Message) {
			mu.Lock()
			pulled[m.ID] = true
			mu.Unlock()
			m.Ack()
		})
	}()
	const n = 2000
	var ids []string
	pubDone := make(chan struct{})
	go func() {
		defer close(pubDone)
		p := c.Publisher(tid)
		defer p.Stop()
		for round := range n / 100 {
			rs := make([]*pubsub.PublishResult, 100)
			for i := range rs {
				rs[i] = p.Publish(ctx, &pubsub.Message{Data: []byte(fmt.Sprint("m", round*100+i))})
			}
			for _, r := range rs {
				id, err := r.Get(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				ids = append(ids, id)
				mu.Unlock()
			}
		}
	}()
	sa := c.SubscriptionAdminClient
	for step, pc := range []*pubsubpb.PushConfig{{PushEndpoint: ep.url()}, {}, {PushEndpoint: ep.url()}} {
		time.Sleep(300 * time.Millisecond)
		var err error
		if step == 1 {
			_, err = sa.UpdateSubscription(ctx, &pubsubpb.UpdateSubscriptionRequest{
				Subscription: &pubsubpb.Subscription{Name: e.subName(sid), PushConfig: pc},
				UpdateMask:   &fieldmaskpb.FieldMask{Paths: []string{"push_config"}}})
		} else {
			err = sa.ModifyPushConfig(ctx, &pubsubpb.ModifyPushConfigRequest{Subscription: e.subName(sid), PushConfig: pc})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	<-pubDone
	// The subscription ends in push mode. The puller may have taken every message so far (on a
	// fast backend the publishes can all land in the pull phases): stop it, and publish a few
	// more, which only the pusher can deliver.
	rcancel()
	<-recvDone
	const extra = 50
	p := c.Publisher(tid)
	for i := range extra {
		id, err := p.Publish(ctx, &pubsub.Message{Data: []byte(fmt.Sprint("extra", i))}).Get(ctx)
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		ids = append(ids, id)
		mu.Unlock()
	}
	p.Stop()
	for {
		mu.Lock()
		ep.mu.Lock()
		missing := 0
		pushed := ep.attempts
		for _, id := range ids {
			if !pulled[id] && pushed[id] == 0 {
				missing++
			}
		}
		np := len(ep.reqs)
		ep.mu.Unlock()
		mu.Unlock()
		if missing == 0 && len(ids) == n+extra {
			if np == 0 {
				t.Fatal("nothing was pushed")
			}
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%d of %d messages neither pulled nor pushed", missing, n+extra)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// TestPushRestartWhileFailing: the proxy restarts while the endpoint
// fails every push; once it answers again every message arrives.
func TestPushRestartWhileFailing(t *testing.T) {
	e := startEnv(t)
	ctx := ctxT(t, 120*time.Second)
	ep := newEndpoint(t)
	var healthy sync.Mutex
	up := false
	ep.answer = func(pushReq, int) int {
		healthy.Lock()
		defer healthy.Unlock()
		if up {
			return 204
		}
		return 503
	}
	c := e.v2()
	tid, sid := e.id("t"), e.id("s")
	e.createTopic(ctx, tid)
	e.createPushSub(ctx, c, &pubsubpb.Subscription{Name: e.subName(sid), Topic: e.topicName(tid),
		PushConfig: &pubsubpb.PushConfig{PushEndpoint: ep.url()}})
	ids := publishN(t, ctx, c, tid, 50, "")
	ep.waitFor(ctx, "failing pushes", func() bool { return len(ep.reqs) >= 5 })
	e.stop()
	e.addr, e.srv, e.stop = e.startReplica()
	healthy.Lock()
	up = true
	healthy.Unlock()
	ep.waitFor(ctx, "every message acked after the restart", func() bool {
		ok := ep.ackedLocked()
		for _, id := range ids {
			if !ok[id] {
				return false
			}
		}
		return true
	})
}

// TestPushOIDC: an oidc_token config gets an RS256 token signed by the
// configured key; without a key no Authorization header is sent.
func TestPushOIDC(t *testing.T) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	keyFile := filepath.Join(t.TempDir(), "push.pem")
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600); err != nil {
		t.Fatal(err)
	}
	e := startEnv(t, withGCP(func(o *gcp.Options) { o.Config.PushOIDCKeyFile = keyFile }))
	ctx := ctxT(t, 60*time.Second)
	ep := newEndpoint(t)
	c := e.v2()
	tid, sid := e.id("t"), e.id("s")
	e.createTopic(ctx, tid)
	e.createPushSub(ctx, c, &pubsubpb.Subscription{Name: e.subName(sid), Topic: e.topicName(tid),
		PushConfig: &pubsubpb.PushConfig{PushEndpoint: ep.url(), AuthenticationMethod: &pubsubpb.PushConfig_OidcToken_{
			OidcToken: &pubsubpb.PushConfig_OidcToken{ServiceAccountEmail: "pusher@p.iam.gserviceaccount.com", Audience: "my-aud"}}}})
	publishN(t, ctx, c, tid, 1, "")
	ep.waitFor(ctx, "a push", func() bool { return len(ep.reqs) >= 1 })
	ep.mu.Lock()
	auth := ep.reqs[0].header.Get("Authorization")
	ep.mu.Unlock()
	tok, ok := strings.CutPrefix(auth, "Bearer ")
	parts := strings.Split(tok, ".")
	if !ok || len(parts) != 3 {
		t.Fatalf("Authorization %q", auth)
	}
	sig, _ := base64.RawURLEncoding.DecodeString(parts[2])
	sum := sha256.Sum256([]byte(parts[0] + "." + parts[1]))
	if err := rsa.VerifyPKCS1v15(&key.PublicKey, crypto.SHA256, sum[:], sig); err != nil {
		t.Fatalf("token signature: %v", err)
	}
	raw, _ := base64.RawURLEncoding.DecodeString(parts[1])
	var claims map[string]any
	if err := json.Unmarshal(raw, &claims); err != nil {
		t.Fatal(err)
	}
	if claims["aud"] != "my-aud" || claims["email"] != "pusher@p.iam.gserviceaccount.com" || claims["iss"] != "https://accounts.google.com" ||
		claims["email_verified"] != true || claims["exp"].(float64) <= float64(time.Now().Unix()) {
		t.Fatalf("claims %v", claims)
	}
}

// TestPushAllowList: endpoints outside gcp.push_allowed_hosts are refused.
func TestPushAllowList(t *testing.T) {
	ep := newEndpoint(t)
	e := startEnv(t, withGCP(func(o *gcp.Options) {
		o.Config.PushAllowedHosts = strings.TrimPrefix(ep.srv.URL, "http://") + ", *.example.com"
	}))
	ctx := ctxT(t, 30*time.Second)
	c := e.v2()
	tid := e.id("t")
	e.createTopic(ctx, tid)
	e.createPushSub(ctx, c, &pubsubpb.Subscription{Name: e.subName(e.id("ok")), Topic: e.topicName(tid),
		PushConfig: &pubsubpb.PushConfig{PushEndpoint: ep.url()}})
	e.createPushSub(ctx, c, &pubsubpb.Subscription{Name: e.subName(e.id("wild")), Topic: e.topicName(tid),
		PushConfig: &pubsubpb.PushConfig{PushEndpoint: "https://svc.example.com/x"}})
	for _, bad := range []string{"http://127.0.0.2:1/x", "https://example.com/x", "https://evil.com/x"} {
		_, err := c.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{Name: e.subName(e.id("bad")), Topic: e.topicName(tid),
			PushConfig: &pubsubpb.PushConfig{PushEndpoint: bad}})
		wantCode(t, err, codes.InvalidArgument, "push_allowed_hosts")
		err = c.SubscriptionAdminClient.ModifyPushConfig(ctx, &pubsubpb.ModifyPushConfigRequest{Subscription: e.subName(e.id("ok")),
			PushConfig: &pubsubpb.PushConfig{PushEndpoint: bad}})
		wantCode(t, err, codes.InvalidArgument, "push_allowed_hosts")
	}
}
