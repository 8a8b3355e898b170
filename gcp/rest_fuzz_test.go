package gcp

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.uber.org/zap"
	"google.golang.org/grpc"

	"cloud.google.com/go/iam/apiv1/iampb"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/kubemq-io/kubemq-proxy/gcp/limits"
	"github.com/kubemq-io/kubemq-proxy/kubemqclient/wirecodec"
)

// echoPublisher answers Publish with one id per message; every other
// method is UNIMPLEMENTED (after the transcoder has decoded the request).
type echoPublisher struct {
	pubsubpb.UnimplementedPublisherServer
}

func (echoPublisher) Publish(_ context.Context, req *pubsubpb.PublishRequest) (*pubsubpb.PublishResponse, error) {
	resp := &pubsubpb.PublishResponse{}
	for range req.GetMessages() {
		resp.MessageIds = append(resp.MessageIds, "1")
	}
	return resp, nil
}

// restFuzzServer is the REST entry over a gRPC server of stub services
// (the same codec and interceptor as the front-end's), limits small.
func restFuzzServer(tb testing.TB) http.Handler {
	h, _ := restStubServer(tb)
	return h
}

func restStubServer(tb testing.TB) (http.Handler, *Server) {
	g := grpc.NewServer(grpc.ForceServerCodecV2(wirecodec.Codec()), grpc.ChainUnaryInterceptor(markREST))
	pubsubpb.RegisterPublisherServer(g, echoPublisher{})
	pubsubpb.RegisterSubscriberServer(g, pubsubpb.UnimplementedSubscriberServer{})
	pubsubpb.RegisterSchemaServiceServer(g, pubsubpb.UnimplementedSchemaServiceServer{})
	iampb.RegisterIAMPolicyServer(g, iampb.UnimplementedIAMPolicyServer{})
	s := &Server{grpc: g, log: zap.NewNop(), pubLimits: limits.Publish{MaxRequestBytes: 4 << 10, MaxMessageBytes: 4 << 10},
		stopping: make(chan struct{})}
	h, err := s.newREST()
	if err != nil {
		tb.Fatal(err)
	}
	return h, s
}

// TestRESTAfterGRPCStop: a request that reaches the REST handler after the
// gRPC server stopped (a keep-alive connection during Shutdown) is
// UNAVAILABLE, which clients retry, not the client's fault.
func TestRESTAfterGRPCStop(t *testing.T) {
	h, s := restStubServer(t)
	publish := func() *httptest.ResponseRecorder {
		req := httptest.NewRequest("POST", "http://x/v1/projects/p/topics/t:publish", strings.NewReader(`{"messages":[{"data":"aGk="}]}`))
		req.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w
	}
	if w := publish(); w.Code != 200 || !strings.Contains(w.Body.String(), `"messageIds":["1"]`) {
		t.Fatalf("before stop: %d %s", w.Code, w.Body)
	}
	close(s.stopping)
	s.grpc.Stop()
	w := publish()
	if w.Code != 503 || !strings.Contains(w.Body.String(), `"status":"UNAVAILABLE"`) {
		t.Fatalf("after stop: %d %s", w.Code, w.Body)
	}
}

var restFuzzMethods = []string{"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"}

// FuzzRESTRequest: any method, path, query and body through the REST entry
// gets an answer: 200 with a JSON object, or Google's error form whose code
// is the HTTP status; never a panic, never an UNKNOWN or INTERNAL error (the
// stub services return none: such an answer would be the transcoder's
// refusal of bad input reported as the server's fault).
func FuzzRESTRequest(f *testing.F) {
	f.Add(uint8(1), "/v1/projects/p/topics/t:publish", "", `{"messages":[{"data":"aGk=","attributes":{"k":"v"}}]}`)
	f.Add(uint8(1), "/v1/projects/p/topics/t:publish", "alt=json", `{"messages":[{"data":"%%%"}]}`)
	f.Add(uint8(1), "/v1/projects/p/topics/t:publish", "", `{"messages": [`)
	f.Add(uint8(1), "/v1/projects/p/topics/t:publish", "", `{"messages":[{"data":"`+strings.Repeat("A", 9000)+`"}]}`)
	f.Add(uint8(2), "/v1/projects/p/topics/t", "", `{"labels":{"a":"b"},"messageRetentionDuration":"10s"}`)
	f.Add(uint8(3), "/v1/projects/p/subscriptions/s", "updateMask=ackDeadlineSeconds", `{"subscription":{"ackDeadlineSeconds":"x"}}`)
	f.Add(uint8(0), "/v1/projects/p/topics", "pageSize=-1&pageToken=%ff", "")
	f.Add(uint8(0), "/v1/projects/p/topics/t:getIamPolicy", "options.requestedPolicyVersion=x", "")
	f.Add(uint8(1), "/v1/projects/p/subscriptions/s:seek", "", `{"time":"2020-13-45T99:00:00Z"}`)
	f.Add(uint8(1), "/v1/projects/p/schemas", "schemaId=a", `{"type":"NOPE"}`)
	f.Add(uint8(4), "/v1/projects/p/schemas/s@r:deleteRevision", "", "")
	f.Add(uint8(0), "/v1/projects/%2F/topics/..%2F", "", "")
	f.Add(uint8(1), "/google.pubsub.v1.Publisher/Publish", "", `{}`)
	f.Add(uint8(1), "/v1/projects/p/subscriptions/s:pull", "", "\x00\xff{")
	h := restFuzzServer(f)
	f.Fuzz(func(t *testing.T, m uint8, path, query, body string) {
		if !strings.HasPrefix(path, "/") {
			path = "/" + path
		}
		method := restFuzzMethods[int(m)%len(restFuzzMethods)]
		req := httptest.NewRequest("GET", "http://x/", strings.NewReader(body))
		req.Method = method
		req.URL.Path, req.URL.RawPath, req.URL.RawQuery = path, "", query
		req.RequestURI = ""
		req.ContentLength = int64(len(body))
		req.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		res := w.Result()
		if method == "HEAD" {
			return
		}
		var out map[string]any
		if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil {
			t.Fatalf("%s %s?%s: %d with a body that is not a JSON object: %q", method, path, query, res.StatusCode, w.Body.String())
		}
		if res.StatusCode == 200 {
			return
		}
		e, _ := out["error"].(map[string]any)
		if e == nil || e["code"] != float64(res.StatusCode) || e["status"] == "" || e["status"] == "OK" {
			t.Fatalf("%s %s?%s: %d %q is not Google's error form", method, path, query, res.StatusCode, w.Body.String())
		}
		if st := e["status"]; st == "UNKNOWN" || st == "INTERNAL" || res.StatusCode == 500 {
			t.Fatalf("%s %s?%s: %d %q: the client's input reported as the server's fault", method, path, query, res.StatusCode, w.Body.String())
		}
		for k := range res.Header {
			if strings.HasPrefix(k, "Grpc-") {
				t.Fatalf("gRPC header %s in a REST answer", k)
			}
		}
	})
}
