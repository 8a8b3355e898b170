package gcp

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http/httpguts"
	"google.golang.org/protobuf/types/known/timestamppb"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
)

func TestHostAllowList(t *testing.T) {
	a, err := parseHostAllowList(" svc.ns.svc , *.Example.com,127.0.0.1:8080,[::1]:9000")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		host, port string
		want       bool
	}{
		{"svc.ns.svc", "80", true}, {"SVC.ns.svc.", "443", true}, {"a.example.com", "443", true},
		{"a.b.example.com", "1", true}, {"example.com", "443", false}, {"evil.com", "80", false},
		{"127.0.0.1", "8080", true}, {"127.0.0.1", "8081", false}, {"::1", "9000", true}, {"svc.ns.svc.evil.com", "80", false},
	} {
		if got := a.allows(c.host, c.port); got != c.want {
			t.Errorf("allows(%s, %s) = %v", c.host, c.port, got)
		}
	}
	if empty, _ := parseHostAllowList(" , "); !empty.allows("anything", "1") {
		t.Error("an empty list refuses")
	}
	for _, bad := range []string{"http://x", "a/b", "*.", "host:", ":80", "a b", "*.*.x"} {
		if _, err := parseHostAllowList(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestPushBackoffAndTimes(t *testing.T) {
	for n, want := range map[int]time.Duration{1: 100 * time.Millisecond, 2: 200 * time.Millisecond, 4: 800 * time.Millisecond,
		13: 409.6 * 1e9, 14: 600 * time.Second, 1000: 600 * time.Second} {
		if got := pushBackoff(n); got != want {
			t.Errorf("pushBackoff(%d) = %v, want %v", n, got, want)
		}
	}
	base := time.Date(2026, 2, 26, 19, 13, 55, 0, time.UTC)
	for ns, want := range map[int]string{0: "2026-02-26T19:13:55Z", 749e6: "2026-02-26T19:13:55.749Z",
		749001e3: "2026-02-26T19:13:55.749001Z", 749000001: "2026-02-26T19:13:55.749000001Z"} {
		if got := jsonTime(base.Add(time.Duration(ns))); got != want {
			t.Errorf("jsonTime(+%dns) = %s, want %s", ns, got, want)
		}
	}
}

// FuzzPushRequest: any message (attributes, data, ordering key) makes a
// request net/http can send: a valid JSON wrapper, or a raw body whose
// headers are all valid.
func FuzzPushRequest(f *testing.F) {
	f.Add("k", "v", []byte("data"), "key", true, false)
	f.Add("bad header", "line\r\nbreak", []byte{0, 0xff}, "\n", true, true)
	f.Add("Content-Length", "9", []byte(nil), "", true, true)
	f.Add("", "", []byte("\x00"), "ключ", false, false)
	m := &pushManager{}
	f.Fuzz(func(t *testing.T, k, v string, data []byte, key string, noWrapper, meta bool) {
		pc := &pubsubpb.PushConfig{PushEndpoint: "http://127.0.0.1:1/push"}
		if noWrapper {
			pc.Wrapper = &pubsubpb.PushConfig_NoWrapper_{NoWrapper: &pubsubpb.PushConfig_NoWrapper{WriteMetadata: meta}}
		}
		e := &subEntry{id: "s", proto: &pubsubpb.Subscription{Name: "projects/p/subscriptions/s", PushConfig: pc}}
		rm := &pubsubpb.ReceivedMessage{AckId: "x.1", DeliveryAttempt: 2, Message: &pubsubpb.PubsubMessage{
			Data: data, Attributes: map[string]string{k: v}, OrderingKey: key, MessageId: "1", PublishTime: timestamppb.Now()}}
		req, err := m.pushRequest(context.Background(), e, rm)
		if err != nil {
			t.Fatal(err)
		}
		for name, vs := range req.Header {
			if !httpguts.ValidHeaderFieldName(name) {
				t.Fatalf("invalid header name %q", name)
			}
			for _, hv := range vs {
				if !httpguts.ValidHeaderFieldValue(hv) {
					t.Fatalf("invalid header value %q: %q", name, hv)
				}
			}
		}
		if req.Method != http.MethodPost || strings.EqualFold(req.Header.Get("Content-Length"), "9") {
			t.Fatalf("request %s %v", req.Method, req.Header)
		}
		if !noWrapper {
			var env pushEnvelope
			if err := json.NewDecoder(req.Body).Decode(&env); err != nil {
				t.Fatalf("wrapper: %v", err)
			}
			if env.Message.MessageID != "1" || env.DeliveryAttempt != 2 {
				t.Fatalf("wrapper %+v", env)
			}
		}
	})
}

// FuzzHostAllowList: any list parses to an error or a list whose checks
// never panic.
func FuzzHostAllowList(f *testing.F) {
	f.Add("a.b, *.c.d, 127.0.0.1:80", "x.c.d", "443")
	f.Add("[::1]:9, ,", "::1", "9")
	f.Add("*.:1", "", "")
	f.Fuzz(func(t *testing.T, list, host, port string) {
		a, err := parseHostAllowList(list)
		if err != nil {
			return
		}
		a.allows(host, port)
	})
}
