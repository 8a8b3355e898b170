package gcp_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
)

// pushScriptResult is what one server pushed in runPushScript.
type pushScriptResult struct {
	wrapped, meta, plain *endpoint
	ids                  []string // published ids: "hello", "empty", "retry"
}

// runPushScript creates three push subscriptions (wrapped, no_wrapper with
// write_metadata, no_wrapper) on the server at addr, publishes three
// messages, the last answered 500 once, and waits until every endpoint has
// acked all three.
func runPushScript(t *testing.T, addr, project, suffix string) pushScriptResult {
	t.Helper()
	ctx := ctxT(t, 90*time.Second)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	pc, sc := pubsubpb.NewPublisherClient(conn), pubsubpb.NewSubscriberClient(conn)
	r := pushScriptResult{wrapped: newEndpoint(t), meta: newEndpoint(t), plain: newEndpoint(t)}
	retry := func(req pushReq, n int) int {
		if req.data == "retry" && n == 1 {
			return 500
		}
		return 204
	}
	for _, ep := range []*endpoint{r.wrapped, r.meta, r.plain} {
		ep.answer = retry
	}
	topic := "projects/" + project + "/topics/push-" + suffix
	if _, err := pc.CreateTopic(ctx, &pubsubpb.Topic{Name: topic}); err != nil {
		t.Fatal(err)
	}
	subs := map[string]*pubsubpb.PushConfig{
		"wrapped": {PushEndpoint: r.wrapped.url(), Attributes: map[string]string{"x-goog-version": "v1"}},
		"meta": {PushEndpoint: r.meta.url(),
			Wrapper: &pubsubpb.PushConfig_NoWrapper_{NoWrapper: &pubsubpb.PushConfig_NoWrapper{WriteMetadata: true}}},
		"plain": {PushEndpoint: r.plain.url(),
			Wrapper: &pubsubpb.PushConfig_NoWrapper_{NoWrapper: &pubsubpb.PushConfig_NoWrapper{}}},
	}
	for name, cfg := range subs {
		if _, err := sc.CreateSubscription(ctx, &pubsubpb.Subscription{Name: "projects/" + project + "/subscriptions/" + name + "-" + suffix,
			Topic: topic, PushConfig: cfg}); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := pc.Publish(ctx, &pubsubpb.PublishRequest{Topic: topic, Messages: []*pubsubpb.PubsubMessage{
		{Data: []byte("hello"), Attributes: map[string]string{"a": "1", "B-Key": "x y"}},
		{Attributes: map[string]string{"only": "attr"}},
		{Data: []byte("retry")},
	}})
	if err != nil {
		t.Fatal(err)
	}
	r.ids = resp.MessageIds
	for _, ep := range []*endpoint{r.wrapped, r.meta, r.plain} {
		defer func() {
			if t.Failed() {
				ep.mu.Lock()
				for _, q := range ep.reqs {
					t.Logf("%s: %q %d %v", ep.url(), q.data, q.code, q.at)
				}
				ep.mu.Unlock()
			}
		}()
		ep.waitFor(ctx, "three messages acked", func() bool { return len(ep.ackedLocked()) >= 3 })
	}
	return r
}

// TestPushDifferential compares the requests the proxy pushes with those of
// Google's emulator (skipped without gcloud): the wrapper's fields, the
// raw body and the metadata headers, and a 500 answered by a redelivery.
// Documented differences: the emulator's no_wrapper Content-Type is
// application/x-www-form-urlencoded (the proxy sends
// application/octet-stream), and its wrapper leaves out orderingKey and
// deliveryAttempt (the proxy sends them as Google's documentation has it).
func TestPushDifferential(t *testing.T) {
	emu := startPubSubEmulator(t)
	e := startEnv(t)
	want := runPushScript(t, emu, e.project, e.suffix)
	got := runPushScript(t, e.addr, e.project, e.suffix)

	// Requests keyed by message data, normalised: ids and times replaced.
	wrappedShape := func(r pushScriptResult) map[string]string {
		out := map[string]string{}
		r.wrapped.mu.Lock()
		defer r.wrapped.mu.Unlock()
		for _, q := range r.wrapped.reqs {
			m, _ := q.wrap["message"].(map[string]any)
			var keys []string
			for k := range q.wrap {
				keys = append(keys, k)
			}
			for k := range m {
				keys = append(keys, "message."+k)
			}
			slices.Sort(keys)
			same := m["messageId"] == m["message_id"] && m["publishTime"] == m["publish_time"]
			_, terr := time.Parse(time.RFC3339Nano, m["publishTime"].(string))
			sub, _ := q.wrap["subscription"].(string)
			out[q.data] = strings.Join(keys, ",") + " data=" + m["data"].(string) + " attrs=" + jsonString(m["attributes"]) +
				" ids-match=" + boolStr(same) + " time-ok=" + boolStr(terr == nil) + " sub=" + sub +
				" ct=" + q.header.Get("Content-Type")
		}
		return out
	}
	g, w := wrappedShape(got), wrappedShape(want)
	for data, ws := range w {
		if g[data] != ws {
			t.Errorf("wrapped push of %q:\n proxy:    %s\n emulator: %s", data, g[data], ws)
		}
	}
	metaShape := func(r pushScriptResult) map[string]string {
		out := map[string]string{}
		r.meta.mu.Lock()
		defer r.meta.mu.Unlock()
		for _, q := range r.meta.reqs {
			var hs []string
			for k, v := range q.header {
				switch k {
				case "User-Agent", "Accept", "Accept-Encoding", "Connection", "Content-Length", "Content-Type":
					continue
				case "X-Goog-Pubsub-Message-Id", "X-Goog-Pubsub-Publish-Time":
					_, terr := time.Parse(time.RFC3339Nano, v[0])
					if k == "X-Goog-Pubsub-Message-Id" {
						terr = nil
					}
					hs = append(hs, k+"="+boolStr(v[0] != "" && terr == nil))
				default:
					hs = append(hs, k+"="+strings.Join(v, "|"))
				}
			}
			slices.Sort(hs)
			out[q.data] = strings.Join(hs, " ") + " body=" + string(q.body)
		}
		return out
	}
	g, w = metaShape(got), metaShape(want)
	for data, ws := range w {
		if g[data] != ws {
			t.Errorf("no_wrapper+write_metadata push of %q:\n proxy:    %s\n emulator: %s", data, g[data], ws)
		}
	}
	plainShape := func(r pushScriptResult) []string {
		r.plain.mu.Lock()
		defer r.plain.mu.Unlock()
		var out []string
		for _, q := range r.plain.reqs {
			out = append(out, string(q.body)+"/"+q.header.Get("X-Goog-Pubsub-Message-Id"))
		}
		slices.Sort(out)
		return out
	}
	if g, w := plainShape(got), plainShape(want); !slices.Equal(g, w) {
		t.Errorf("no_wrapper pushes:\n proxy:    %q\n emulator: %q", g, w)
	}
	// Both redeliver the message answered 500.
	for name, r := range map[string]pushScriptResult{"proxy": got, "emulator": want} {
		r.wrapped.mu.Lock()
		n := r.wrapped.attempts[r.ids[2]]
		r.wrapped.mu.Unlock()
		if n != 2 {
			t.Errorf("%s pushed the message answered 500 %d times, want 2", name, n)
		}
	}
}

func boolStr(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func jsonString(v any) string {
	m, ok := v.(map[string]any)
	if !ok {
		return "-"
	}
	var kv []string
	for k, x := range m {
		s, _ := x.(string)
		kv = append(kv, k+":"+s)
	}
	slices.Sort(kv)
	return strings.Join(kv, ",")
}
