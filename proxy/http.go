package proxy

import (
	"bufio"
	"crypto/subtle"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"strings"
	"time"

	"github.com/kubemq-io/kubemq-proxy/console"
	"github.com/kubemq-io/kubemq-proxy/delivery"
)

// httpHandler serves the side port. /healthz is liveness (the process
// answers); /readyz is 200 only when the backend is reachable and the
// registry has replayed, with the reason in the body otherwise.
func (p *Proxy) httpHandler() http.Handler {
	mux := http.NewServeMux()
	healthHandlers(mux, p.metrics, p.Ready)
	mux.Handle("GET /state", p.admin(http.HandlerFunc(p.serveState)))
	if p.logLevel != nil {
		// zap's level handler: GET reports, PUT {"level":"debug"} changes it.
		mux.Handle("/loglevel", p.admin(jsonLevel(p.logLevel)))
	}
	profileHandlers(mux, p.admin)
	// The web console (/console/, and / redirects to it), behind the same admin guard.
	console.Register(mux, console.Options{Guard: p.admin, Backend: p.consoleBackend, Leases: p.leaseStats,
		Frontends: p.frontendList, Metrics: p.metrics, Client: p.client, Ready: p.Ready})
	return mux
}

func (p *Proxy) consoleBackend() console.Backend {
	b := console.Backend{Address: p.cfg.KubeMQ.Address, Embedded: p.cfg.UseEmbedded()}
	if p.embeddedLis != nil {
		b.Address = p.embeddedLis.Addr().String()
	}
	if p.client != nil {
		b.Up = p.client.Ready()
	}
	return b
}

func (p *Proxy) leaseStats() []delivery.Stats {
	if p.deliveries == nil {
		return nil
	}
	return p.deliveries.Stats()
}

func (p *Proxy) frontendList() []any {
	out := make([]any, 0, len(p.frontends))
	for _, f := range p.frontends {
		out = append(out, f.fe)
	}
	return out
}

// jsonLevel lets PUT /loglevel take {"level":"debug"} whatever its content type says: zap's
// handler reads a form-encoded body as a form, and curl -d labels every body that way.
func jsonLevel(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut && r.Header.Get("Content-Type") == "application/x-www-form-urlencoded" && r.Body != nil {
			br := bufio.NewReader(r.Body)
			if b, err := br.Peek(1); err == nil && b[0] == '{' {
				r.Header.Set("Content-Type", "application/json")
			}
			r.Body = struct {
				io.Reader
				io.Closer
			}{br, r.Body}
		}
		h.ServeHTTP(w, r)
	})
}

// admin guards the inspecting and mutating endpoints: a loopback peer, or any peer that sends
// the admin token (http.admin_token) as "Authorization: Bearer TOKEN", gets through; others get
// 403 (no token configured) or 401.
func (p *Proxy) admin(h http.Handler) http.Handler { return adminGuard(p.adminToken, h) }

// adminGuard serves h to loopback peers and to peers that send token as a
// bearer token ("" = loopback only).
func adminGuard(token string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if token != "" {
			got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			if ok && subtle.ConstantTimeCompare([]byte(got), []byte(token)) == 1 {
				h.ServeHTTP(w, r)
				return
			}
		}
		if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
			if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
				h.ServeHTTP(w, r)
				return
			}
		}
		if token != "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="kubemq-proxy"`)
			http.Error(w, "admin token required (Authorization: Bearer TOKEN)", http.StatusUnauthorized)
			return
		}
		http.Error(w, "only loopback peers may use this endpoint; set http.admin_token to open it to others", http.StatusForbidden)
	})
}

// profileHandlers adds Go's profiles (heap, goroutines, CPU) to mux behind
// guard, for diagnosing memory and CPU in place: a profile shows the
// process's internals, and a CPU profile costs CPU while it runs.
func profileHandlers(mux *http.ServeMux, guard func(http.Handler) http.Handler) {
	mux.Handle("GET /debug/pprof/", guard(http.HandlerFunc(pprof.Index)))
	mux.Handle("GET /debug/pprof/profile", guard(http.HandlerFunc(pprof.Profile)))
	mux.Handle("GET /debug/pprof/trace", guard(http.HandlerFunc(pprof.Trace)))
}

// Stater is implemented by front-ends that can describe their live state
// (connections, channels, streams, subscriptions) for GET /state.
type Stater interface {
	State() any
}

// serveState is a JSON view of the running proxy: backend, registry,
// delivery consumers (one per KubeMQ queue with leases) and whatever each
// front-end reports.
func (p *Proxy) serveState(w http.ResponseWriter, r *http.Request) {
	type backend struct {
		Address  string `json:"address"`
		Embedded bool   `json:"embedded"`
		Up       bool   `json:"up"`
	}
	out := struct {
		Time      time.Time      `json:"time"`
		Ready     string         `json:"ready"`
		Backend   backend        `json:"backend"`
		Queues    any            `json:"queues"`
		Frontends map[string]any `json:"frontends"`
	}{
		Time:      time.Now().UTC(),
		Ready:     "ok",
		Frontends: map[string]any{},
	}
	if err := p.Ready(); err != nil {
		out.Ready = err.Error()
	}
	out.Backend.Embedded = p.cfg.UseEmbedded()
	out.Backend.Address = p.cfg.KubeMQ.Address
	if p.embeddedLis != nil {
		out.Backend.Address = p.embeddedLis.Addr().String()
	}
	if p.client != nil {
		out.Backend.Up = p.client.Ready()
	}
	if p.deliveries != nil {
		out.Queues = p.deliveries.Stats()
	}
	for _, f := range p.frontends {
		if s, ok := f.fe.(Stater); ok {
			out.Frontends[f.name] = s.State()
		} else {
			out.Frontends[f.name] = struct{}{}
		}
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(out)
}
