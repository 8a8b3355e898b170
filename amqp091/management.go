package amqp091

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kubemq-io/kubemq-proxy/amqp091/routing"
	"github.com/kubemq-io/kubemq-proxy/amqp091/wire"
)

// The subset of RabbitMQ's management HTTP API that tools use (rabbitmqadmin, queue-length
// lookups of Celery and Flower, Grafana's JSON sources), with RabbitMQ 3.10's paths, JSON
// field names and error bodies. Figures come from QueueStats: message counts are KubeMQ's
// backlog plus this replica's leases, counters and rates are this replica's since it started.
// Every user of amqp.users is an administrator here (no tags or permissions to keep).

// ManagementHandler serves the management API (amqp.management_listen).
func (s *Server) ManagementHandler() http.Handler { return s.mgmtAuth(s.route) }

// apiPath is a request's path, its segments unescaped one by one: "%2F" names the vhost "/"
// within one segment, as the API's clients send it.
type apiPath struct {
	user string
	seg  []string // after "api"
	// vhost and name, when the route has them (hasVhost, hasName).
	vhost, name       string
	hasVhost, hasName bool
}

// route dispatches on the path's segments and the method.
func (s *Server) route(w http.ResponseWriter, r *http.Request, user string) {
	raw := strings.Split(strings.TrimPrefix(r.URL.EscapedPath(), "/"), "/")
	if len(raw) < 2 || raw[0] != "api" {
		notFound(w)
		return
	}
	p := apiPath{user: user}
	for _, x := range raw[1:] {
		u, err := url.PathUnescape(x)
		if err != nil {
			notFound(w)
			return
		}
		p.seg = append(p.seg, u)
	}
	if len(p.seg) >= 2 {
		p.vhost, p.hasVhost = p.seg[1], true
	}
	if len(p.seg) >= 3 {
		p.name, p.hasName = p.seg[2], true
	}
	type h func(http.ResponseWriter, *http.Request, apiPath)
	var get, del h
	switch n := len(p.seg); {
	case n == 1 && p.seg[0] == "overview":
		get = s.apiOverview
	case n == 1 && p.seg[0] == "whoami":
		get = func(w http.ResponseWriter, r *http.Request, p apiPath) {
			writeJSON(w, http.StatusOK, map[string]any{"name": p.user, "tags": []string{"administrator"}})
		}
	case n <= 2 && p.seg[0] == "vhosts":
		get = s.apiVhosts
	case n <= 3 && p.seg[0] == "queues":
		get = s.apiQueues
		if n == 3 {
			del = s.apiDeleteQueue
		}
	case n == 4 && p.seg[0] == "queues" && p.seg[3] == "contents":
		del = s.apiPurgeQueue
	case n <= 3 && p.seg[0] == "exchanges":
		get = s.apiExchanges
	case n <= 2 && p.seg[0] == "bindings":
		get = s.apiBindings
	case n == 1 && p.seg[0] == "connections":
		get = s.apiConnections
	case n == 1 && p.seg[0] == "channels":
		get = s.apiChannels
	case n == 2 && p.seg[0] == "aliveness-test":
		get = s.apiAliveness
	default:
		notFound(w)
		return
	}
	switch {
	case (r.Method == http.MethodGet || r.Method == http.MethodHead) && get != nil:
		get(w, r, p)
	case r.Method == http.MethodDelete && del != nil:
		del(w, r, p)
	default:
		w.WriteHeader(http.StatusMethodNotAllowed) // as RabbitMQ: no body
	}
}

// mgmtAuth checks HTTP basic credentials as AMQP logins are checked: against amqp.users, or,
// with none configured, any credentials from loopback peers (from anywhere with
// open_logins_from_anywhere). No credentials: 401 with an empty body, as RabbitMQ answers.
func (s *Server) mgmtAuth(h func(w http.ResponseWriter, r *http.Request, user string)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		user, password, ok := r.BasicAuth()
		if !ok {
			w.Header().Set("WWW-Authenticate", `Basic realm="RabbitMQ Management"`)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		allowed := s.users.check(user, password)
		if allowed && len(s.users) == 0 && !s.opts.OpenLoginsFromAnywhere && !loopbackPeer(remoteAddr(r)) {
			allowed = false
		}
		if !allowed {
			w.Header().Set("WWW-Authenticate", `Basic realm="RabbitMQ Management"`)
			writeJSON(w, http.StatusUnauthorized, apiError{"not_authorized", "Login failed"})
			return
		}
		h(w, r, user)
	})
}

func remoteAddr(r *http.Request) net.Addr {
	a, err := net.ResolveTCPAddr("tcp", r.RemoteAddr)
	if err != nil {
		return nil
	}
	return a
}

type apiError struct {
	Error  string `json:"error"`
	Reason string `json:"reason"`
}

func notFound(w http.ResponseWriter) {
	writeJSON(w, http.StatusNotFound, apiError{"Object Not Found", "Not Found"})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		code, b = http.StatusInternalServerError, []byte(`{"error":"internal_server_error","reason":"encoding the answer failed"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(code)
	w.Write(b)
}

// rate is a RabbitMQ "*_details" object.
type rate struct {
	Rate float64 `json:"rate"`
}

// rateSampler turns counters and gauges into per-second rates: a figure's rate is its change
// since the sample taken at least a second before, kept until the next such sample (so a
// first look reports 0). Samples of figures nobody asked for in ten minutes are dropped.
type rateSampler struct {
	mu      sync.Mutex // guards samples
	samples map[string]*rateSample
	swept   time.Time
}

type rateSample struct {
	at, used time.Time
	v, rate  float64
}

func (rs *rateSampler) rate(key string, v float64, now time.Time) rate {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.samples == nil {
		rs.samples = map[string]*rateSample{}
	}
	if now.Sub(rs.swept) > time.Minute {
		for k, sm := range rs.samples {
			if now.Sub(sm.used) > 10*time.Minute {
				delete(rs.samples, k)
			}
		}
		rs.swept = now
	}
	sm := rs.samples[key]
	if sm == nil {
		rs.samples[key] = &rateSample{at: now, used: now, v: v}
		return rate{}
	}
	sm.used = now
	if dt := now.Sub(sm.at).Seconds(); dt >= 1 {
		sm.rate = math.Round((v-sm.v)/dt*10) / 10
		sm.at, sm.v = now, v
	}
	return rate{sm.rate}
}

// node is the node name the API reports: the proxy's host name.
func mgmtNode() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		h = "localhost"
	}
	return "kubemq-proxy@" + h
}

// vhostByName returns the virtual host named name (as clients name it) when it exists: the
// default one, a configured one (amqp.vhosts), or one some client has used.
func (s *Server) vhostByName(name string) (*vhost, bool) {
	key := vhostKey(name)
	s.top.mu.Lock()
	v := s.top.vhosts[key]
	s.top.mu.Unlock()
	if v != nil {
		return v, true
	}
	if key == "default" || s.vhosts[key] {
		return s.top.vhost(key), true
	}
	return nil, false
}

// vhostNames lists the existing virtual hosts by display name, sorted.
func (s *Server) vhostNames() []string {
	names := map[string]bool{"/": true}
	for k := range s.vhosts {
		names[(&vhost{key: k}).displayName()] = true
	}
	for _, v := range s.top.snapshot() {
		names[v.displayName()] = true
	}
	out := make([]string, 0, len(names))
	for n := range names {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// apiVhost reads the {vhost} path value: v nil when the route has none; ok false (404 sent)
// when it names no virtual host.
func (s *Server) apiVhost(w http.ResponseWriter, p apiPath) (name string, v *vhost, ok bool) {
	if !p.hasVhost {
		return "", nil, true
	}
	v, ok = s.vhostByName(p.vhost)
	if !ok {
		notFound(w)
		return "", nil, false
	}
	return v.displayName(), v, true
}

// messageStats is a queue's or the server's message_stats.
type messageStats struct {
	Publish           uint64 `json:"publish"`
	PublishDetails    rate   `json:"publish_details"`
	DeliverGet        uint64 `json:"deliver_get"`
	DeliverGetDetails rate   `json:"deliver_get_details"`
	Ack               uint64 `json:"ack"`
	AckDetails        rate   `json:"ack_details"`
}

func (s *Server) messageStats(key string, publish, deliver, ack uint64, now time.Time) messageStats {
	return messageStats{
		Publish: publish, PublishDetails: s.rates.rate(key+"\x00publish", float64(publish), now),
		DeliverGet: deliver, DeliverGetDetails: s.rates.rate(key+"\x00deliver_get", float64(deliver), now),
		Ack: ack, AckDetails: s.rates.rate(key+"\x00ack", float64(ack), now),
	}
}

// apiQueue is one queue in RabbitMQ's JSON.
type apiQueue struct {
	Name                          string         `json:"name"`
	Vhost                         string         `json:"vhost"`
	Durable                       bool           `json:"durable"`
	AutoDelete                    bool           `json:"auto_delete"`
	Exclusive                     bool           `json:"exclusive"`
	Arguments                     map[string]any `json:"arguments"`
	Type                          string         `json:"type"`
	State                         string         `json:"state"`
	Node                          string         `json:"node"`
	Consumers                     int            `json:"consumers"`
	Messages                      int64          `json:"messages"`
	MessagesDetails               rate           `json:"messages_details"`
	MessagesReady                 int64          `json:"messages_ready"`
	MessagesReadyDetails          rate           `json:"messages_ready_details"`
	MessagesUnacknowledged        int64          `json:"messages_unacknowledged"`
	MessagesUnacknowledgedDetails rate           `json:"messages_unacknowledged_details"`
	MessageStats                  *messageStats  `json:"message_stats,omitempty"` // absent until the queue has traffic, as in RabbitMQ
	// KubeMQ's side, beyond RabbitMQ's fields.
	KubeMQChannel        string  `json:"kubemq_channel"`
	OldestUnackedSeconds float64 `json:"oldest_unacked_age_seconds"`
}

func (s *Server) apiQueueOf(st QueueStats, node string, now time.Time) apiQueue {
	key := st.Vhost + "\x00" + st.Name + "\x00" + st.Channel
	ready := max(st.Ready, 0) // unknown (KubeMQ did not answer) shows as 0, as RabbitMQ shows a queue it cannot count
	unacked := int64(st.Unacked)
	q := apiQueue{
		Name: st.Name, Vhost: st.Vhost, Durable: st.Durable, AutoDelete: st.AutoDelete, Exclusive: st.Exclusive,
		Arguments: jsonTable(st.Arguments), Type: "classic", State: "running", Node: node, Consumers: st.Consumers,
		Messages: ready + unacked, MessagesDetails: s.rates.rate(key+"\x00messages", float64(ready+unacked), now),
		MessagesReady: ready, MessagesReadyDetails: s.rates.rate(key+"\x00ready", float64(ready), now),
		MessagesUnacknowledged: unacked, MessagesUnacknowledgedDetails: s.rates.rate(key+"\x00unacked", float64(unacked), now),
		KubeMQChannel: st.Channel, OldestUnackedSeconds: st.OldestUnacked.Seconds(),
	}
	if st.Published+st.Delivered+st.Acked > 0 {
		ms := s.messageStats(key, st.Published, st.Delivered, st.Acked, now)
		q.MessageStats = &ms
	}
	return q
}

// queueStatsIn returns QueueStats of the queues of vhost (display name; "" = all). A KubeMQ
// failure leaves the ready counts at -1 (shown as 0); the API still answers, as RabbitMQ's
// does with a node's figures missing.
func (s *Server) queueStatsIn(ctx context.Context, vhost string) []QueueStats {
	all, _ := s.QueueStats(ctx)
	if vhost == "" {
		return all
	}
	out := all[:0:0]
	for _, st := range all {
		if st.Vhost == vhost {
			out = append(out, st)
		}
	}
	return out
}

func (s *Server) apiQueues(w http.ResponseWriter, r *http.Request, p apiPath) {
	vname, _, ok := s.apiVhost(w, p)
	if !ok {
		return
	}
	now, node := time.Now(), mgmtNode()
	stats := s.queueStatsIn(r.Context(), vname)
	if p.hasName {
		name := p.name
		for _, st := range stats {
			if st.Name == name {
				writeJSON(w, http.StatusOK, s.apiQueueOf(st, node, now))
				return
			}
		}
		notFound(w)
		return
	}
	out := make([]apiQueue, 0, len(stats))
	for _, st := range stats {
		out = append(out, s.apiQueueOf(st, node, now))
	}
	writeJSON(w, http.StatusOK, out)
}

// apiQueueFor resolves {vhost}/{name} to a queue, or answers 404.
func (s *Server) apiQueueFor(w http.ResponseWriter, p apiPath) *queue {
	_, v, ok := s.apiVhost(w, p)
	if !ok {
		return nil
	}
	q := v.lookupQueue(p.name)
	if q == nil || q.isDeleted() {
		notFound(w)
		return nil
	}
	return q
}

// apiDeleteQueue is DELETE /api/queues/{vhost}/{name}[?if-empty=true][&if-unused=true]: 204,
// or 400 when a condition fails, as RabbitMQ answers.
func (s *Server) apiDeleteQueue(w http.ResponseWriter, r *http.Request, p apiPath) {
	q := s.apiQueueFor(w, p)
	if q == nil {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
	defer cancel()
	rs := fmt.Sprintf("queue '%s' in vhost '%s'", q.name, q.vh.displayName())
	if r.URL.Query().Get("if-unused") == "true" {
		q.vh.mu.Lock()
		n := len(q.consumers)
		q.vh.mu.Unlock()
		if n == 0 && s.peers != nil {
			var err error
			if _, _, n, err = s.counts(ctx, q, false); err != nil {
				s.apiBackendError(w, err)
				return
			}
		}
		if n > 0 {
			writeJSON(w, http.StatusBadRequest, apiError{"bad_request", rs + " in use"})
			return
		}
	}
	if r.URL.Query().Get("if-empty") == "true" {
		n, known, err := s.readyCount(ctx, q)
		if err != nil {
			s.apiBackendError(w, err)
			return
		}
		if n > 0 || !known {
			writeJSON(w, http.StatusBadRequest, apiError{"bad_request", rs + " not empty"})
			return
		}
	}
	if _, err := s.deleteQueue(ctx, q, "queue deleted through the management API"); err != nil {
		s.apiBackendError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// apiPurgeQueue is DELETE /api/queues/{vhost}/{name}/contents: the ready messages go (as
// queue.purge), 204.
func (s *Server) apiPurgeQueue(w http.ResponseWriter, r *http.Request, p apiPath) {
	q := s.apiQueueFor(w, p)
	if q == nil {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 60*time.Second)
	defer cancel()
	if _, err := s.purge(ctx, q); err != nil {
		s.apiBackendError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// apiBackendError answers a KubeMQ (or peer) failure: 503, as the AMQP side would close with
// 320 or fail the call.
func (s *Server) apiBackendError(w http.ResponseWriter, err error) {
	writeJSON(w, http.StatusServiceUnavailable, apiError{"service_unavailable", err.Error()})
}

// apiExchange is one exchange in RabbitMQ's JSON.
type apiExchange struct {
	Name       string         `json:"name"`
	Vhost      string         `json:"vhost"`
	Type       string         `json:"type"`
	Durable    bool           `json:"durable"`
	AutoDelete bool           `json:"auto_delete"`
	Internal   bool           `json:"internal"`
	Arguments  map[string]any `json:"arguments"`
}

// apiVhostsOf is v alone, or every virtual host when v is nil (a path without a vhost).
func (s *Server) apiVhostsOf(v *vhost) []*vhost {
	if v != nil {
		return []*vhost{v}
	}
	var out []*vhost
	for _, n := range s.vhostNames() {
		if vv, ok := s.vhostByName(n); ok {
			out = append(out, vv)
		}
	}
	return out
}

func (s *Server) apiExchanges(w http.ResponseWriter, r *http.Request, p apiPath) {
	vname, v, ok := s.apiVhost(w, p)
	if !ok {
		return
	}
	vhosts := s.apiVhostsOf(v)
	var out []apiExchange
	for _, vv := range vhosts {
		for _, x := range vv.routes.Exchanges() {
			out = append(out, apiExchange{Name: x.Name, Vhost: vv.displayName(), Type: x.TypeName(), Durable: x.Durable,
				AutoDelete: x.AutoDelete, Internal: x.Internal, Arguments: jsonTable(x.Args)})
		}
	}
	if p.hasName {
		name := p.name
		if name == "amq.default" { // how the API names the default exchange in a path
			name = ""
		}
		for _, x := range out {
			if x.Name == name && x.Vhost == vname {
				writeJSON(w, http.StatusOK, x)
				return
			}
		}
		notFound(w)
		return
	}
	if out == nil {
		out = []apiExchange{}
	}
	writeJSON(w, http.StatusOK, out)
}

// apiBinding is one binding in RabbitMQ's JSON; the default exchange's implicit binding to
// every queue is listed, as RabbitMQ lists it.
type apiBinding struct {
	Source          string         `json:"source"`
	Vhost           string         `json:"vhost"`
	Destination     string         `json:"destination"`
	DestinationType string         `json:"destination_type"`
	RoutingKey      string         `json:"routing_key"`
	Arguments       map[string]any `json:"arguments"`
	PropertiesKey   string         `json:"properties_key"`
}

// propertiesKey names a binding in API paths: the escaped routing key, followed by "~" and
// a digest of the arguments when there are any.
func propertiesKey(b routing.Binding) string {
	k := url.PathEscape(b.Key)
	if len(b.Args) == 0 {
		return k
	}
	enc, _ := wire.AppendTable(nil, b.Args)
	sum := sha256.Sum256(enc)
	return k + "~" + base64.RawURLEncoding.EncodeToString(sum[:12])
}

func (s *Server) apiBindings(w http.ResponseWriter, r *http.Request, p apiPath) {
	_, v, ok := s.apiVhost(w, p)
	if !ok {
		return
	}
	vhosts := s.apiVhostsOf(v)
	out := []apiBinding{}
	for _, vv := range vhosts {
		vn := vv.displayName()
		var queues []string
		vv.mu.Lock()
		for name, q := range vv.queues {
			if !q.deleted {
				queues = append(queues, name)
			}
		}
		vv.mu.Unlock()
		slices.Sort(queues)
		for _, q := range queues {
			out = append(out, apiBinding{Vhost: vn, Destination: q, DestinationType: "queue", RoutingKey: q,
				Arguments: map[string]any{}, PropertiesKey: url.PathEscape(q)})
		}
		var bs []routing.Binding
		for _, x := range vv.routes.Exchanges() {
			bs = append(bs, vv.routes.BindingsFrom(x.Name)...)
		}
		slices.SortStableFunc(bs, func(a, b routing.Binding) int {
			return cmp.Or(cmp.Compare(a.Source, b.Source), cmp.Compare(a.Dest.Name, b.Dest.Name), cmp.Compare(a.Key, b.Key))
		})
		for _, b := range bs {
			dt := "queue"
			if b.Dest.Exchange {
				dt = "exchange"
			}
			out = append(out, apiBinding{Source: b.Source, Vhost: vn, Destination: b.Dest.Name, DestinationType: dt,
				RoutingKey: b.Key, Arguments: jsonTable(b.Args), PropertiesKey: propertiesKey(b)})
		}
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) openConns() []*conn {
	s.mu.Lock()
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		if c.opened.Load() {
			conns = append(conns, c)
		}
	}
	s.mu.Unlock()
	slices.SortFunc(conns, func(a, b *conn) int { return cmp.Compare(a.id, b.id) })
	return conns
}

// connName is RabbitMQ's connection name: "peer -> local".
func connName(c *conn) string { return c.nc.RemoteAddr().String() + " -> " + c.nc.LocalAddr().String() }

func hostPort(a net.Addr) (string, int) {
	host, port, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String(), 0
	}
	p, _ := strconv.Atoi(port)
	return host, p
}

func (s *Server) apiConnections(w http.ResponseWriter, r *http.Request, p apiPath) {
	node := mgmtNode()
	out := []map[string]any{}
	for _, c := range s.openConns() {
		peerHost, peerPort := hostPort(c.nc.RemoteAddr())
		host, port := hostPort(c.nc.LocalAddr())
		props := map[string]any{}
		if c.clientName != "" {
			props["connection_name"] = c.clientName
		}
		out = append(out, map[string]any{
			"name": connName(c), "node": node, "type": "network", "protocol": "AMQP 0-9-1", "state": "running",
			"user": c.user, "vhost": c.vh.displayName(), "host": host, "port": port, "peer_host": peerHost, "peer_port": peerPort,
			"channels": int(c.nChannels.Load()), "channel_max": int(c.channelMax), "frame_max": int(c.frameMax),
			"timeout": int(c.heartbeat / time.Second), "connected_at": c.since.UnixMilli(), "ssl": isTLS(c),
			"client_properties": props,
		})
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) apiChannels(w http.ResponseWriter, r *http.Request, p apiPath) {
	node := mgmtNode()
	out := []map[string]any{}
	for _, c := range s.openConns() {
		c.viewMu.Lock()
		chs := make([]*channel, 0, len(c.view))
		for ch := range c.view {
			chs = append(chs, ch)
		}
		c.viewMu.Unlock()
		slices.SortFunc(chs, func(a, b *channel) int { return cmp.Compare(a.id, b.id) })
		peerHost, peerPort := hostPort(c.nc.RemoteAddr())
		for _, ch := range chs {
			ch.dmu.Lock()
			unacked, global := len(ch.unacked)-ch.voided, ch.globalPrefetch
			ch.dmu.Unlock()
			out = append(out, map[string]any{
				"name": fmt.Sprintf("%s (%d)", connName(c), ch.id), "number": int(ch.id), "node": node, "state": "running",
				"user": c.user, "vhost": c.vh.displayName(),
				"connection_details":      map[string]any{"name": connName(c), "peer_host": peerHost, "peer_port": peerPort},
				"consumer_count":          int(ch.viewConsumers.Load()),
				"messages_unacknowledged": unacked, "prefetch_count": int(ch.viewPrefetch.Load()), "global_prefetch_count": int(global),
				"confirm": ch.viewConfirm.Load(), "transactional": ch.viewTx.Load(),
			})
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// apiVhosts is GET /api/vhosts[/{vhost}], with each one's message totals.
func (s *Server) apiVhosts(w http.ResponseWriter, r *http.Request, p apiPath) {
	vname, _, ok := s.apiVhost(w, p)
	if !ok {
		return
	}
	now, node := time.Now(), mgmtNode()
	stats, _ := s.QueueStats(r.Context())
	one := func(name string) map[string]any {
		var ready, unacked int64
		var pub, del, ack uint64
		for _, st := range stats {
			if st.Vhost == name {
				ready += max(st.Ready, 0)
				unacked += int64(st.Unacked)
				pub, del, ack = pub+st.Published, del+st.Delivered, ack+st.Acked
			}
		}
		key := "vhost\x00" + name
		return map[string]any{
			"name": name, "description": "", "tags": []string{}, "tracing": false, "default_queue_type": "classic",
			"metadata":      map[string]any{"description": "", "tags": []string{}},
			"cluster_state": map[string]string{node: "running"},
			"messages":      ready + unacked, "messages_details": s.rates.rate(key+"\x00messages", float64(ready+unacked), now),
			"messages_ready": ready, "messages_ready_details": s.rates.rate(key+"\x00ready", float64(ready), now),
			"messages_unacknowledged": unacked, "messages_unacknowledged_details": s.rates.rate(key+"\x00unacked", float64(unacked), now),
			"message_stats": s.messageStats(key, pub, del, ack, now),
		}
	}
	if vname != "" {
		writeJSON(w, http.StatusOK, one(vname))
		return
	}
	out := []map[string]any{}
	for _, n := range s.vhostNames() {
		out = append(out, one(n))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) apiOverview(w http.ResponseWriter, r *http.Request, p apiPath) {
	now, node := time.Now(), mgmtNode()
	stats, _ := s.QueueStats(r.Context())
	var ready, unacked int64
	consumers := 0
	for _, st := range stats {
		ready += max(st.Ready, 0)
		unacked += int64(st.Unacked)
		consumers += st.Consumers
	}
	exchanges := 0
	for _, n := range s.vhostNames() {
		if v, ok := s.vhostByName(n); ok {
			exchanges += len(v.routes.Exchanges())
		}
	}
	conns := s.openConns()
	channels := 0
	for _, c := range conns {
		channels += int(c.nChannels.Load())
	}
	s.mu.Lock()
	var listeners []map[string]any
	for l := range s.listeners {
		host, port := hostPort(l.Addr())
		listeners = append(listeners, map[string]any{"node": node, "protocol": "amqp", "ip_address": host, "port": port})
	}
	s.mu.Unlock()
	slices.SortFunc(listeners, func(a, b map[string]any) int { return cmp.Compare(a["port"].(int), b["port"].(int)) })
	var types []map[string]any
	for _, k := range []string{"direct", "fanout", "headers", "topic"} {
		types = append(types, map[string]any{"name": k, "description": "AMQP " + k + " exchange, as per the AMQP specification", "enabled": true})
	}
	clusterName := s.opts.ClusterName
	if clusterName == "" {
		clusterName = node
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"management_version": s.opts.Version, "rates_mode": "basic", "product_name": s.opts.Product,
		"product_version": s.opts.Version, "rabbitmq_version": s.opts.Version, "cluster_name": clusterName, "node": node,
		"exchange_types": types, "listeners": listeners, "disable_stats": false, "enable_queue_totals": false,
		"message_stats": s.messageStats("overview", s.nPublishes.Load(), s.nDelivered.Load(), s.nAcked.Load(), now),
		"queue_totals": map[string]any{
			"messages": ready + unacked, "messages_details": s.rates.rate("overview\x00messages", float64(ready+unacked), now),
			"messages_ready": ready, "messages_ready_details": s.rates.rate("overview\x00ready", float64(ready), now),
			"messages_unacknowledged": unacked, "messages_unacknowledged_details": s.rates.rate("overview\x00unacked", float64(unacked), now),
		},
		"object_totals": map[string]int{"connections": len(conns), "channels": channels, "consumers": consumers,
			"exchanges": exchanges, "queues": len(stats)},
	})
}

// apiAliveness is GET /api/aliveness-test/{vhost}: {"status":"ok"} when this replica is ready
// (KubeMQ answers its health pings, the registry is replayed) and KubeMQ answers a QueuesInfo
// call now; otherwise 503 with the reason. RabbitMQ publishes and gets a message on a queue
// of the vhost instead; here the store behind every queue is what is checked.
func (s *Server) apiAliveness(w http.ResponseWriter, r *http.Request, p apiPath) {
	if _, _, ok := s.apiVhost(w, p); !ok {
		return
	}
	if s.opts.Ready != nil {
		if err := s.opts.Ready(); err != nil {
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "failed", "reason": err.Error()})
			return
		}
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	if _, err := s.b.QueuesInfo(ctx, "amqp.aliveness-test"); err != nil {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "failed", "reason": err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// jsonTable renders an AMQP field table as the API does: nested tables and arrays as JSON,
// byte arrays as strings, timestamps as Unix seconds, decimals as numbers.
func jsonTable(t wire.Table) map[string]any {
	out := make(map[string]any, len(t))
	for k, v := range t {
		out[k] = jsonValue(v)
	}
	return out
}

func jsonValue(v any) any {
	switch x := v.(type) {
	case wire.Table:
		return jsonTable(x)
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = jsonValue(e)
		}
		return out
	case []byte:
		return string(x)
	case time.Time:
		return x.Unix()
	case wire.Decimal:
		return float64(x.Value) / math.Pow10(int(x.Scale))
	}
	return v
}

// isTLS reports whether c came in on a TLS listener.
func isTLS(c *conn) bool {
	_, ok := c.nc.(interface {
		Handshake() error
	})
	return ok
}
