package console

import (
	"context"
	"embed"
	"html/template"
	"io/fs"
	"net"
	"net/http"
	"strings"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kubemq-io/kubemq-proxy/delivery"
	"github.com/kubemq-io/kubemq-proxy/kubemqclient"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Options are what the console reads and acts through; the proxy fills them.
type Options struct {
	// Guard is the side port's admin guard: it lets a loopback peer, or one with the admin
	// token as "Authorization: Bearer TOKEN", through.
	Guard func(http.Handler) http.Handler
	// Backend describes the KubeMQ backend now.
	Backend func() Backend
	// Leases are the lease engine's figures, one per KubeMQ queue it consumes.
	Leases func() []delivery.Stats
	// Frontends are the running front-ends; the console uses those implementing PubSub or AMQP.
	Frontends func() []any
	// Metrics is the proxy's Prometheus registry: the message rates come from its counters.
	Metrics prometheus.Gatherer
	// Client peeks queues; nil disables peeking.
	Client *kubemqclient.Client
	// Ready reports nil when the backend is reachable and the registry replayed.
	Ready func() error
}

// Backend is the KubeMQ backend as the overview shows it.
type Backend struct {
	Address  string
	Embedded bool
	Up       bool
}

// Stater is a front-end's GET /state view.
type Stater interface{ State() any }

// PubSub is the Pub/Sub front-end as the console uses it.
type PubSub interface {
	Stater
	TopicIDs() []string
	Publisher() pubsubpb.PublisherServer
	Subscriber() pubsubpb.SubscriberServer
}

// AMQP is the AMQP 0-9-1 front-end as the console uses it.
type AMQP interface {
	Stater
	Topology() any
	PurgeQueue(ctx context.Context, vhost, name string) (int, error)
	DeleteQueue(ctx context.Context, vhost, name, why string) (int, error)
	PublishMessage(ctx context.Context, vhost, exchange, routingKey string, body []byte) (stored, refused int, err error)
}

// Console serves the pages and actions.
type Console struct {
	o     Options
	pages map[string]*template.Template
}

// cookieName holds the admin token a browser presented on /console/login.
const cookieName = "kubemq_proxy_console_token"

// actionHeader must be on every action request (see the package doc).
const actionHeader = "X-Console-Request"

// Register adds the console's routes to mux: /console/... and a redirect from / to it.
func Register(mux *http.ServeMux, o Options) {
	c := &Console{o: o, pages: map[string]*template.Template{}}
	for _, name := range []string{"overview", "pubsub", "amqp", "leases", "login"} {
		c.pages[name] = template.Must(template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/"+name+".html"))
	}
	static, _ := fs.Sub(staticFS, "static")
	mux.Handle("GET /console/static/", http.StripPrefix("/console/static/", cacheControl(http.FileServerFS(static))))
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/console/", http.StatusFound)
	})
	mux.HandleFunc("GET /console", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/console/", http.StatusMovedPermanently)
	})
	mux.HandleFunc("GET /console/login", c.loginPage)
	mux.HandleFunc("POST /console/login", c.login)
	mux.HandleFunc("POST /console/logout", c.logout)
	mux.Handle("GET /console/{$}", c.guard(c.page("overview", c.overview)))
	mux.Handle("GET /console/pubsub", c.guard(c.page("pubsub", c.pubsub)))
	mux.Handle("GET /console/amqp", c.guard(c.page("amqp", c.amqp)))
	mux.Handle("GET /console/leases", c.guard(c.page("leases", c.leases)))
	mux.Handle("GET /console/api/rates", c.guard(http.HandlerFunc(c.serveRates)))
	mux.Handle("POST /console/action/{name}", c.guard(c.csrf(http.HandlerFunc(c.action))))
}

func cacheControl(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-cache")
		h.ServeHTTP(w, r)
	})
}

// guard puts a request through the admin guard, with the token from the console's cookie when
// the request has no Authorization header, after the DNS-rebinding check. A page refused for
// want of a token answers with the login form.
func (c *Console) guard(h http.Handler) http.Handler {
	inner := c.o.Guard(h)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		secHeaders(w)
		hasToken := r.Header.Get("Authorization") != ""
		if !hasToken {
			if ck, err := r.Cookie(cookieName); err == nil && ck.Value != "" {
				r = r.Clone(r.Context())
				r.Header.Set("Authorization", "Bearer "+ck.Value)
				hasToken = true
			}
		}
		if !hasToken && !addressHost(r.Host) {
			http.Error(w, "console: without the admin token the Host header must be an IP address or localhost", http.StatusForbidden)
			return
		}
		if r.Method == http.MethodGet && !strings.HasPrefix(r.URL.Path, "/console/api/") {
			w = &loginOnDenied{ResponseWriter: w, c: c, r: r}
		}
		inner.ServeHTTP(w, r)
	})
}

// addressHost reports whether a Host header names an IP address or localhost.
func addressHost(hostport string) bool {
	h := hostport
	if host, _, err := net.SplitHostPort(hostport); err == nil {
		h = host
	}
	h = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
	return strings.EqualFold(h, "localhost") || net.ParseIP(h) != nil
}

// secHeaders keep the pages out of frames and other origins' scripts.
func secHeaders(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "same-origin")
}

// loginOnDenied replaces the guard's 401/403 text with the login page.
type loginOnDenied struct {
	http.ResponseWriter
	c       *Console
	r       *http.Request
	swallow bool
}

func (l *loginOnDenied) WriteHeader(code int) {
	if code == http.StatusUnauthorized || code == http.StatusForbidden {
		l.swallow = true
		l.ResponseWriter.Header().Set("Content-Type", "text/html; charset=utf-8")
		l.ResponseWriter.Header().Del("X-Content-Type-Options")
		l.ResponseWriter.WriteHeader(code)
		msg := "This page needs the admin token (http.admin_token)."
		if code == http.StatusForbidden {
			msg = "Only loopback peers may open the console while no admin token is configured (http.admin_token)."
		}
		l.c.render(l.ResponseWriter, "login", view{Title: "Log in", Data: loginView{Message: msg, Configured: code == http.StatusUnauthorized}})
		return
	}
	l.ResponseWriter.WriteHeader(code)
}

func (l *loginOnDenied) Write(b []byte) (int, error) {
	if l.swallow {
		return len(b), nil
	}
	return l.ResponseWriter.Write(b)
}

// csrf refuses action requests another site's page could have sent.
func (c *Console) csrf(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(actionHeader) != "1" {
			jsonError(w, http.StatusForbidden, "actions need the header "+actionHeader+": 1 (sent by the console's own pages)")
			return
		}
		if !sameOrigin(r) {
			jsonError(w, http.StatusForbidden, "cross-origin request refused")
			return
		}
		h.ServeHTTP(w, r)
	})
}

// sameOrigin: the browser's Origin (when sent) names the host the request was sent to, and
// Sec-Fetch-Site (when sent) is same-origin.
func sameOrigin(r *http.Request) bool {
	if s := r.Header.Get("Sec-Fetch-Site"); s != "" && s != "same-origin" && s != "none" {
		return false
	}
	o := r.Header.Get("Origin")
	if o == "" {
		return true
	}
	rest, ok := strings.CutPrefix(o, "http://")
	if !ok {
		rest, ok = strings.CutPrefix(o, "https://")
	}
	return ok && strings.EqualFold(rest, r.Host)
}

// loginView is the login page's data.
type loginView struct {
	Message    string
	Configured bool
}

func (c *Console) loginPage(w http.ResponseWriter, r *http.Request) {
	secHeaders(w)
	c.render(w, "login", view{Title: "Log in", Data: loginView{Message: "Enter the admin token (http.admin_token).", Configured: true}})
}

// login keeps the token in a cookie; a wrong token shows as the login page again on the
// next page (the guard checks it, not this handler).
func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	secHeaders(w)
	if !sameOrigin(r) {
		http.Error(w, "cross-origin request refused", http.StatusForbidden)
		return
	}
	tok := strings.TrimSpace(r.PostFormValue("token"))
	if tok == "" || len(tok) > 4096 {
		http.Error(w, "no token given", http.StatusBadRequest)
		return
	}
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: tok, Path: "/console/", HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	http.Redirect(w, r, "/console/", http.StatusSeeOther)
}

func (c *Console) logout(w http.ResponseWriter, r *http.Request) {
	secHeaders(w)
	if !sameOrigin(r) {
		http.Error(w, "cross-origin request refused", http.StatusForbidden)
		return
	}
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: "", Path: "/console/", MaxAge: -1, HttpOnly: true,
		SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, "/console/login", http.StatusSeeOther)
}

// frontends sorts the running front-ends into the two kinds the console knows.
func (c *Console) frontends() (ps PubSub, aq AMQP) {
	if c.o.Frontends == nil {
		return nil, nil
	}
	for _, f := range c.o.Frontends() {
		if p, ok := f.(PubSub); ok && ps == nil {
			ps = p
		}
		if a, ok := f.(AMQP); ok && aq == nil {
			aq = a
		}
	}
	return ps, aq
}

// requestTimeout bounds the backend calls of one page or action.
const requestTimeout = 30 * time.Second
