package gcp

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/vanguard"
	"connectrpc.com/vanguard/vanguardgrpc"
	"go.uber.org/zap"
	"google.golang.org/genproto/googleapis/api/annotations"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	spb "google.golang.org/genproto/googleapis/rpc/status"
)

// The Pub/Sub v1 REST API: every method with a google.api.http annotation
// in the Pub/Sub and IAM protos, transcoded by vanguard into calls of the
// gRPC server in this process (grpc.Server.ServeHTTP), so REST requests
// pass the same interceptors (recovery, logging, readiness gate), the same
// handlers and the same limits as gRPC. StreamingPull has no REST mapping.

// restPrefix is the only path prefix of the API; anything else is a 404.
const restPrefix = "/v1/"

// maxErrorBody bounds the error body kept for rewriting into Google's form.
const maxErrorBody = 64 << 10

// iamGetRules: Pub/Sub serves getIamPolicy as GET on its resources (its
// service configuration overrides the IAM proto's POST on "**"), as gcloud
// and the client libraries' REST transports call it. POST, the proto's own
// binding, stays on the same paths (the more specific GET path would
// otherwise hide it).
func iamGetRules() []*annotations.HttpRule {
	var rules []*annotations.HttpRule
	for _, res := range []string{"topics", "subscriptions", "snapshots", "schemas"} {
		path := "/v1/{resource=projects/*/" + res + "/*}:getIamPolicy"
		rules = append(rules,
			&annotations.HttpRule{Pattern: &annotations.HttpRule_Get{Get: path}},
			&annotations.HttpRule{Pattern: &annotations.HttpRule_Post{Post: path}, Body: "*"})
	}
	r := rules[0]
	r.Selector = "google.iam.v1.IAMPolicy.GetIamPolicy"
	r.AdditionalBindings = rules[1:]
	return []*annotations.HttpRule{r}
}

// restBodyLimit is the largest JSON request body: a publish request of the
// largest size, base64 (4/3) and JSON framing, with room to spare. The
// publish validation applies the request and message limits with Google's
// texts after transcoding.
func (s *Server) restBodyLimit() int64 {
	return 2*int64(s.pubLimits.MaxRequestBytes) + grpcHeadroom
}

// newREST builds the REST handler over the server's gRPC services.
func (s *Server) newREST() (http.Handler, error) {
	// Vanguard buffers one message of each direction; a Pull response may
	// hold many messages.
	buf := uint32(min(int64(4*s.pubLimits.MaxRequestBytes+grpcHeadroom), 1<<31))
	// Two transcoders: enums as names (the default) and as numbers
	// (alt=json;enum-encoding=int, as Google's REST clients ask).
	var tcs [2]*vanguard.Transcoder
	for i := range tcs {
		enumNumbers := i == 1
		tc, err := vanguardgrpc.NewTranscoder(s.grpc,
			vanguard.WithCodec(func(res vanguard.TypeResolver) vanguard.Codec {
				// Google's REST API omits default values (lowerCamelCase names,
				// base64 bytes, "10s" durations, RFC 3339 timestamps are protojson's
				// own). Unknown fields are dropped, as gRPC drops unknown fields.
				return restCodec{&vanguard.JSONCodec{
					MarshalOptions:   protojson.MarshalOptions{Resolver: res, UseEnumNumbers: enumNumbers},
					UnmarshalOptions: protojson.UnmarshalOptions{Resolver: res, DiscardUnknown: true},
				}}
			}),
			vanguard.WithRules(iamGetRules()...),
			vanguard.WithDefaultServiceOptions(vanguard.WithMaxMessageBufferBytes(buf)),
			vanguard.WithUnknownHandler(http.HandlerFunc(restNotFound)),
		)
		if err != nil {
			return nil, fmt.Errorf("gcp: REST transcoder: %w", err)
		}
		tcs[i] = tc
	}
	limit := s.restBodyLimit()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, restPrefix) {
			// Vanguard also speaks Connect and gRPC-Web on the methods' own
			// paths; this port offers REST and native gRPC only.
			restNotFound(w, r)
			return
		}
		if r.ContentLength > limit {
			writeGoogleError(w, http.StatusRequestEntityTooLarge, codes.InvalidArgument,
				fmt.Sprintf("Request payload size exceeds the limit: %d bytes.", limit), nil)
			return
		}
		enumNumbers, msg := stripSystemParams(r)
		if msg != "" {
			writeGoogleError(w, http.StatusBadRequest, codes.InvalidArgument, msg, nil)
			return
		}
		tc := tcs[0]
		if enumNumbers {
			tc = tcs[1]
		}
		if ct, _, _ := strings.Cut(r.Header.Get("Content-Type"), ";"); ct == "" || ct == "application/x-www-form-urlencoded" || ct == "text/plain" {
			// The API speaks JSON only; curl -d labels a JSON body as a form.
			r.Header.Set("Content-Type", "application/json")
		}
		r.Body = http.MaxBytesReader(w, r.Body, limit)
		call := &restCall{}
		ew := &errorRewriter{w: w, call: call, stopping: s.stopping}
		tc.ServeHTTP(ew, r.WithContext(context.WithValue(r.Context(), restCallKey{}, call)))
		ew.finish()
	}), nil
}

// restCodec is vanguard's JSON codec whose decoding errors are the
// client's: INVALID_ARGUMENT with Google's lead text, where vanguard would
// answer a bare error as UNKNOWN (HTTP 500, which clients retry).
type restCodec struct{ *vanguard.JSONCodec }

func invalidJSON(err error) error {
	return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("Invalid JSON payload received. %w", err))
}

func (c restCodec) Unmarshal(b []byte, msg proto.Message) error {
	if err := c.JSONCodec.Unmarshal(b, msg); err != nil {
		return invalidJSON(err)
	}
	return nil
}

func (c restCodec) UnmarshalField(b []byte, msg proto.Message, field protoreflect.FieldDescriptor) error {
	if err := c.JSONCodec.UnmarshalField(b, msg, field); err != nil {
		return invalidJSON(err)
	}
	return nil
}

// systemParams are Google's query parameters that apply to every method
// (https://cloud.google.com/apis/docs/system-parameters) and name no field
// of a request: gcloud sends alt=json with every call. Responses are
// always whole JSON: fields (partial responses) and prettyPrint are
// ignored.
var systemParams = []string{"$.xgafv", "access_token", "alt", "$alt", "callback", "fields", "$fields", "key",
	"oauth_token", "prettyPrint", "quotaUser", "$quotaUser", "upload_protocol", "uploadType", "userIp", "userProject"}

// stripSystemParams removes them from r's query. It reports whether enums
// are to be numbers (alt=json;enum-encoding=int, what the client libraries'
// REST transports send), or a message for a value the proxy cannot honour
// (alt other than json).
func stripSystemParams(r *http.Request) (enumNumbers bool, msg string) {
	if r.URL.RawQuery == "" {
		return false, ""
	}
	q := r.URL.Query()
	found := false
	for _, k := range systemParams {
		if v, ok := q[k]; ok {
			if k == "alt" || k == "$alt" {
				switch alt := v[0]; alt {
				case "json":
				case "json;enum-encoding=int":
					enumNumbers = true
				default:
					return false, fmt.Sprintf("Invalid value at '%s' (%s): only json and json;enum-encoding=int are served", k, alt)
				}
			}
			q.Del(k)
			found = true
		}
	}
	if found {
		r.URL.RawQuery = q.Encode()
	}
	return enumNumbers, ""
}

// restCall notes, for one REST request, whether the transcoder reached a
// handler; an error before that is the request's fault (an unknown query
// parameter, a path variable of the wrong type), which vanguard reports as
// UNKNOWN or INTERNAL.
type restCall struct{ reached atomic.Bool }

type restCallKey struct{}

// markREST is the last unary interceptor: it tells a REST request that its
// handler ran (a context lookup for gRPC calls).
func markREST(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if c, ok := ctx.Value(restCallKey{}).(*restCall); ok {
		c.reached.Store(true)
	}
	return h(ctx, req)
}

// newRESTServer is the HTTP/1.1 server of the REST API on the gRPC port.
func (s *Server) newRESTServer(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    1 << 20,
		ErrorLog:          zap.NewStdLog(s.log.Named("rest")),
	}
}

func restNotFound(w http.ResponseWriter, r *http.Request) {
	writeGoogleError(w, http.StatusNotFound, codes.NotFound, fmt.Sprintf("The requested URL %s was not found on this server.", r.URL.Path), nil)
}

// googleError is the body of Google's JSON error responses
// ({"error":{"code":404,"message":...,"status":"NOT_FOUND"}}); code is the
// HTTP status.
type googleError struct {
	Error googleErrorBody `json:"error"`
}

type googleErrorBody struct {
	Code    int               `json:"code"`
	Message string            `json:"message"`
	Status  string            `json:"status"`
	Details []json.RawMessage `json:"details,omitempty"`
}

// statusName is the google.rpc.Code name, as Google's JSON errors spell it.
func statusName(c codes.Code) string {
	switch c {
	case codes.OK:
		return "OK"
	case codes.Canceled:
		return "CANCELLED"
	case codes.Unknown:
		return "UNKNOWN"
	case codes.InvalidArgument:
		return "INVALID_ARGUMENT"
	case codes.DeadlineExceeded:
		return "DEADLINE_EXCEEDED"
	case codes.NotFound:
		return "NOT_FOUND"
	case codes.AlreadyExists:
		return "ALREADY_EXISTS"
	case codes.PermissionDenied:
		return "PERMISSION_DENIED"
	case codes.ResourceExhausted:
		return "RESOURCE_EXHAUSTED"
	case codes.FailedPrecondition:
		return "FAILED_PRECONDITION"
	case codes.Aborted:
		return "ABORTED"
	case codes.OutOfRange:
		return "OUT_OF_RANGE"
	case codes.Unimplemented:
		return "UNIMPLEMENTED"
	case codes.Internal:
		return "INTERNAL"
	case codes.Unavailable:
		return "UNAVAILABLE"
	case codes.DataLoss:
		return "DATA_LOSS"
	case codes.Unauthenticated:
		return "UNAUTHENTICATED"
	}
	return "UNKNOWN"
}

// codeForHTTP is the code of an error that carries only an HTTP status
// (the transcoder's own refusals before a method is chosen).
func codeForHTTP(status int) codes.Code {
	switch status {
	case http.StatusBadRequest, http.StatusRequestEntityTooLarge, http.StatusUnsupportedMediaType:
		return codes.InvalidArgument
	case http.StatusUnauthorized:
		return codes.Unauthenticated
	case http.StatusForbidden:
		return codes.PermissionDenied
	case http.StatusNotFound:
		return codes.NotFound
	case http.StatusMethodNotAllowed, http.StatusNotImplemented, http.StatusHTTPVersionNotSupported:
		return codes.Unimplemented
	case http.StatusConflict:
		return codes.Aborted
	case http.StatusTooManyRequests:
		return codes.ResourceExhausted
	case 499:
		return codes.Canceled
	case http.StatusServiceUnavailable:
		return codes.Unavailable
	case http.StatusGatewayTimeout:
		return codes.DeadlineExceeded
	}
	return codes.Unknown
}

func writeGoogleError(w http.ResponseWriter, status int, c codes.Code, msg string, details []json.RawMessage) {
	b, err := json.Marshal(googleError{Error: googleErrorBody{Code: status, Message: msg, Status: statusName(c), Details: details}})
	if err != nil { // cannot happen: strings and raw JSON only
		b = []byte(`{"error":{"code":500,"message":"internal error in kubemq-proxy","status":"INTERNAL"}}`)
		status = http.StatusInternalServerError
	}
	h := w.Header()
	scrubHeaders(h)
	h.Del("Content-Length")
	h.Del("Content-Encoding")
	h.Set("Content-Type", "application/json; charset=UTF-8")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// scrubHeaders drops what the gRPC leg leaves behind (grpc-status and
// grpc-message of an error, a Trailer announcement); a REST client gets
// only the JSON.
func scrubHeaders(h http.Header) {
	for k := range h {
		if strings.HasPrefix(k, "Grpc-") || k == "Trailer" || strings.HasPrefix(k, http.TrailerPrefix) {
			delete(h, k)
		}
	}
}

// errorRewriter passes successful responses through and turns the
// transcoder's error bodies (a google.rpc.Status in JSON, or a line of text)
// into Google's error form. Used by one request's goroutine.
type errorRewriter struct {
	w        http.ResponseWriter
	call     *restCall
	stopping <-chan struct{} // the server's: closed at Shutdown
	status   int             // >= 400: an error is being buffered
	wrote    bool
	buf      bytes.Buffer
}

func (e *errorRewriter) Header() http.Header { return e.w.Header() }

func (e *errorRewriter) WriteHeader(code int) {
	if e.wrote || e.status != 0 {
		return
	}
	if code >= 400 {
		e.status = code
		return
	}
	e.wrote = true
	scrubHeaders(e.w.Header())
	e.w.WriteHeader(code)
}

func (e *errorRewriter) Write(p []byte) (int, error) {
	if !e.wrote && e.status == 0 {
		e.WriteHeader(http.StatusOK)
	}
	if e.status != 0 {
		if room := maxErrorBody - e.buf.Len(); room > 0 {
			e.buf.Write(p[:min(len(p), room)])
		}
		return len(p), nil
	}
	return e.w.Write(p)
}

// Flush lets the transcoder flush successful responses.
func (e *errorRewriter) Flush() {
	if e.status != 0 {
		return
	}
	if f, ok := e.w.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap serves http.ResponseController.
func (e *errorRewriter) Unwrap() http.ResponseWriter { return e.w }

// finish writes the buffered error in Google's form.
func (e *errorRewriter) finish() {
	if e.status == 0 {
		return
	}
	var st spb.Status
	body := bytes.TrimSpace(e.buf.Bytes())
	code := codeForHTTP(e.status)
	msg := string(body)
	var details []json.RawMessage
	if len(body) > 0 && body[0] == '{' && (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(body, &st) == nil {
		if st.GetCode() != 0 {
			code = codes.Code(st.GetCode())
		}
		msg = st.GetMessage()
		for _, d := range st.GetDetails() {
			if b, err := protojson.Marshal(d); err == nil {
				details = append(details, b)
			}
		}
	}
	if msg == "" {
		msg = http.StatusText(e.status)
	}
	if (code == codes.Unknown || code == codes.Internal) && !e.call.reached.Load() {
		select {
		case <-e.stopping:
			// The gRPC server stopped under the request (a keep-alive
			// connection's request during Shutdown): clients retry this.
			e.status, code = http.StatusServiceUnavailable, codes.Unavailable
			msg = "kubemq-proxy is shutting down"
		default:
			// The transcoder refused the request before any handler saw it.
			e.status, code = http.StatusBadRequest, codes.InvalidArgument
		}
	}
	if strings.Contains(msg, "http: request body too large") {
		// The body passed the limit while being read (no Content-Length).
		e.status, code = http.StatusRequestEntityTooLarge, codes.InvalidArgument
		msg = "Request payload size exceeds the limit."
	}
	writeGoogleError(e.w, e.status, code, msg, details)
}
