package gcp

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/kubemq-io/kubemq-proxy/delivery"
)

// Push subscriptions.
//
// A subscription with a push endpoint is consumed by a pusher on the
// replica that holds its queue (the delivery engine's Owners decide which;
// the others retry their claim every pushOwnerRetry and push nothing). The
// pusher takes messages through the subscription's runtime (lease.go), as a
// stream would: its ack deadlines, retry policy, dead-letter policy,
// delivery attempts and ordering keys are the pull path's. Each message is
// one HTTP POST (pushreq.go); 102, 200, 201, 202 and 204 ack it, any other
// status, a connection error or no answer within the ack deadline nack it.
//
// Flow control follows Google's push description: a window of concurrent
// requests starts at pushWindowStart, grows by one with every success and
// halves with every failure (at least 1, at most
// Config.PushMaxPerSubscription). Without a retry policy a failure also
// pauses the subscription's pushes (push backoff): 100 ms doubling with
// each consecutive failure up to 600 s, reset by a success. With a retry
// policy the failed message waits out the policy's backoff instead. All
// subscriptions share Config.PushMaxConcurrency requests in flight.
//
// An ordered subscription pushes a key's messages one at a time, in order:
// the next one goes out when the previous one is acked. A failure nacks the
// message, which rewinds its key (keywindow.go): the later messages of the key
// that this pusher holds turn stale and are skipped, and come again after
// it.
const (
	pushWindowStart  = 3
	pushBackoffMin   = 100 * time.Millisecond
	pushBackoffMax   = 600 * time.Second
	pushGrace        = 2 * time.Second // lease deadline beyond the request timeout: the pusher settles, not the sweep
	pushOwnerRetry   = 2 * time.Second
	pushReconcile    = time.Second
	pushExtendEvery  = time.Second
	pushErrorBackoff = time.Second
)

// isPush reports whether e is delivered by push.
func isPush(e *subEntry) bool {
	return e != nil && !e.proto.GetDetached() && e.proto.GetPushConfig().GetPushEndpoint() != ""
}

// pushManager runs the pushers of this replica.
type pushManager struct {
	s      *Server
	client *http.Client
	sem    chan struct{} // one slot per request in flight, all subscriptions
	allow  hostAllowList
	signer *oidcSigner // nil: no tokens (no key configured)

	requests *prometheus.CounterVec   // subscription, code
	latency  *prometheus.HistogramVec // subscription
	windows  *prometheus.GaugeVec     // subscription

	// ctx ends at Shutdown: requests in flight are abandoned, their leases
	// go back with the runtimes.
	ctx     context.Context
	cancel  context.CancelFunc
	kick    chan struct{} // cap 1: the topology changed
	unwatch func()

	mu   sync.Mutex         // guards subs
	subs map[string]*pusher // subscription id -> its pusher
	wg   sync.WaitGroup     // the reconcile loop and every pusher
}

func newPushManager(s *Server) (*pushManager, error) {
	allow, err := parseHostAllowList(s.cfg.PushAllowedHosts)
	if err != nil {
		return nil, err
	}
	var signer *oidcSigner
	if s.cfg.PushOIDCKeyFile != "" {
		if signer, err = loadOIDCSigner(s.cfg.PushOIDCKeyFile); err != nil {
			return nil, err
		}
	}
	dialer := &net.Dialer{Timeout: s.cfg.PushConnectTimeout, KeepAlive: 30 * time.Second}
	tr := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           dialer.DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          s.cfg.PushMaxConcurrency,
		MaxIdleConnsPerHost:   s.cfg.PushMaxPerSubscription,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   s.cfg.PushConnectTimeout,
		ExpectContinueTimeout: time.Second,
	}
	ctx, cancel := context.WithCancel(context.Background())
	cv := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricPrefix + name, Help: help}, labels)
	}
	return &pushManager{
		s: s,
		client: &http.Client{
			Transport: tr,
			// A redirect is an answer (a nack), never followed: it could lead
			// outside the allow-list.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
		sem:    make(chan struct{}, s.cfg.PushMaxConcurrency),
		allow:  allow,
		signer: signer,
		requests: cv("push_requests_total", "Push requests by subscription and outcome: the HTTP status code, "+
			"\"timeout\" (no answer within the ack deadline), \"error\" (connection failed) or \"refused\" (endpoint not allowed).",
			"subscription", "code"),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: metricPrefix + "push_latency_seconds",
			Help:    "Time from sending a push request to its answer.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}}, []string{"subscription"}),
		windows: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: metricPrefix + "push_window",
			Help: "A push subscription's flow-control window: requests it may have in flight."}, []string{"subscription"}),
		ctx: ctx, cancel: cancel,
		kick: make(chan struct{}, 1),
		subs: map[string]*pusher{},
	}, nil
}

func (m *pushManager) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.requests, m.latency, m.windows}
}

// start follows the topology: a pusher for every push subscription.
func (m *pushManager) start() {
	m.unwatch = m.s.topo.watch(func(kind string, _ record) {
		if kind == kindSubscription {
			select {
			case m.kick <- struct{}{}:
			default:
			}
		}
	})
	m.wg.Add(1)
	go m.loop()
}

// stop ends every pusher and waits for them; requests in flight are
// abandoned (their leases go back when the runtimes close).
func (m *pushManager) stop() {
	if m.unwatch != nil {
		m.unwatch()
	}
	m.cancel()
	m.wg.Wait()
	m.client.CloseIdleConnections()
}

func (m *pushManager) loop() {
	defer m.wg.Done()
	tick := time.NewTicker(pushReconcile)
	defer tick.Stop()
	// The registry calls its watchers in no set order: a change may be
	// heard before the catalog applied it, so a kick reconciles again a
	// moment later.
	again := time.NewTimer(time.Hour)
	defer again.Stop()
	for {
		m.reconcile()
		select {
		case <-m.ctx.Done():
			m.mu.Lock()
			for _, p := range m.subs {
				p.cancel()
			}
			m.mu.Unlock()
			return
		case <-m.kick:
			again.Reset(50 * time.Millisecond)
		case <-again.C:
		case <-tick.C:
		}
	}
}

// reconcile starts a pusher for each push subscription that has none and
// stops those of subscriptions that are gone, detached, re-created or pull.
func (m *pushManager) reconcile() {
	want := map[string]*subEntry{}
	for _, id := range m.s.cat.subIDs() {
		if e, ok := m.s.cat.sub(id); ok && isPush(e) {
			want[id] = e
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for id, p := range m.subs {
		if w := want[id]; w == nil || w.uid != p.uid || p.ctx.Err() != nil {
			p.cancel()
			delete(m.subs, id)
		}
	}
	if m.ctx.Err() != nil {
		return
	}
	for id, e := range want {
		if m.subs[id] == nil {
			p := newPusher(m, e)
			m.subs[id] = p
			m.wg.Add(1)
			go p.run()
		}
	}
}

// pushItem is one message leased to a pusher.
type pushItem struct {
	rm     *pubsubpb.ReceivedMessage
	key    string    // ordering key on an ordered subscription, else ""
	leased time.Time // when its lease deadline was last set
}

// pusher pushes one subscription incarnation's messages.
type pusher struct {
	m       *pushManager
	id, uid string
	label   string
	log     *zap.Logger
	ctx     context.Context // ends when the subscription stops being push (or at Shutdown)
	cancel  context.CancelFunc

	mu         sync.Mutex // guards everything below
	window     int        // requests this subscription may have in flight
	held       int        // messages leased to the pusher and not yet settled
	fails      int        // consecutive failures (push backoff)
	pauseUntil time.Time  // push backoff: no fetch before
	keys       map[string][]*pushItem
	waiting    map[string]*pushItem // ack id -> leased, not yet pushing
	changed    chan struct{}        // cap 1: room or the pause changed

	wg sync.WaitGroup // the pushes of the current runtime
}

func newPusher(m *pushManager, e *subEntry) *pusher {
	ctx, cancel := context.WithCancel(m.ctx)
	p := &pusher{m: m, id: e.id, uid: e.uid, label: m.s.m.sub(e.id), ctx: ctx, cancel: cancel,
		log:    m.s.log.With(zap.String("subscription", e.id)),
		window: min(pushWindowStart, m.s.cfg.PushMaxPerSubscription),
		keys:   map[string][]*pushItem{}, waiting: map[string]*pushItem{}, changed: make(chan struct{}, 1)}
	m.windows.WithLabelValues(p.label).Set(float64(p.window))
	return p
}

func (p *pusher) signal() {
	select {
	case p.changed <- struct{}{}:
	default:
	}
}

func (p *pusher) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-p.ctx.Done():
		return false
	}
}

// run holds the subscription's runtime while this replica may consume it
// and pushes its messages, until the subscription stops being push.
func (p *pusher) run() {
	defer p.m.wg.Done()
	defer p.cancel()
	for p.ctx.Err() == nil {
		e, ok := p.m.s.cat.sub(p.id)
		if !ok || e.uid != p.uid || !isPush(e) {
			return
		}
		rt, release, err := p.m.s.runtime(p.ctx, e)
		if err != nil {
			if p.ctx.Err() != nil || errors.Is(err, errRuntimeClosed) {
				return
			}
			if !errors.Is(err, delivery.ErrNotOwner) {
				p.log.Warn("push: cannot consume the subscription; trying again", zap.Error(err))
			}
			// Another replica pushes it, or KubeMQ is away: claim again later.
			if !p.sleep(pushOwnerRetry) {
				return
			}
			continue
		}
		err = p.serve(rt)
		release()
		switch {
		case p.ctx.Err() != nil, errors.Is(err, errSubGone), errors.Is(err, errRuntimeClosed) && p.m.s.draining.Load():
			return
		case err != nil && !errors.Is(err, delivery.ErrHandedOver):
			p.log.Warn("push: delivery interrupted; resuming", zap.Error(err))
			if !p.sleep(pushErrorBackoff) {
				return
			}
		}
	}
}

// serve fetches within the window and hands each message to a push, until
// the pusher stops or the runtime fails; it returns once the pushes it
// started are over.
func (p *pusher) serve(rt *subRuntime) error {
	defer p.wg.Wait()
	f := newFlow(math.MaxInt64, 0) // the pusher is one "stream" for ordering keys
	lastExtend := time.Now()
	for {
		if p.ctx.Err() != nil {
			return nil
		}
		if time.Since(lastExtend) >= pushExtendEvery {
			p.extendWaiting(rt)
			lastExtend = time.Now()
		}
		p.mu.Lock()
		room := p.window - p.held
		if p.held > 0 && room < p.window/4 {
			// Fetch in batches: a fetch per settled message would make the
			// fetch loop the bottleneck.
			room = 0
		}
		pause := time.Until(p.pauseUntil)
		changed := p.changed
		p.mu.Unlock()
		if pause > 0 || room <= 0 {
			wait := pushExtendEvery
			if pause > 0 {
				wait = min(wait, pause)
			}
			t := time.NewTimer(wait)
			select {
			case <-changed:
			case <-t.C:
			case <-p.ctx.Done():
			}
			t.Stop()
			continue
		}
		e := rt.entry()
		if e == nil {
			return errSubGone
		}
		ad := time.Duration(e.proto.GetAckDeadlineSeconds()) * time.Second
		fctx, cancel := context.WithTimeout(p.ctx, pushExtendEvery)
		msgs, err := rt.fetch(fctx, room, f, ad+pushGrace)
		cancel()
		if err != nil {
			if p.ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, context.DeadlineExceeded) {
				continue
			}
			return err
		}
		p.dispatch(rt, e, msgs)
	}
}

// dispatch starts the pushes of freshly leased messages: at once, or for an
// ordering key behind the key's earlier messages.
func (p *pusher) dispatch(rt *subRuntime, e *subEntry, msgs []*pubsubpb.ReceivedMessage) {
	now := time.Now()
	ordered := e.proto.GetEnableMessageOrdering()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, rm := range msgs {
		it := &pushItem{rm: rm, leased: now}
		if ordered {
			it.key = rm.GetMessage().GetOrderingKey()
		}
		p.held++
		p.waiting[rm.AckId] = it
		if it.key == "" {
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				p.deliver(rt, it)
			}()
			continue
		}
		q, busy := p.keys[it.key]
		p.keys[it.key] = append(q, it)
		if !busy {
			p.wg.Add(1)
			go p.keyWorker(rt, it.key)
		}
	}
}

// keyWorker pushes one ordering key's messages one at a time, in order,
// until the key has none queued.
func (p *pusher) keyWorker(rt *subRuntime, key string) {
	defer p.wg.Done()
	for {
		p.mu.Lock()
		q := p.keys[key]
		if len(q) == 0 {
			delete(p.keys, key)
			p.mu.Unlock()
			return
		}
		it := q[0]
		q[0] = nil
		p.keys[key] = q[1:]
		// The key's later messages wait behind this one: their deadlines
		// move with it (the extension also runs every second).
		p.mu.Unlock()
		p.deliver(rt, it)
	}
}

// extendWaiting moves the lease deadlines of messages that wait for their
// turn (a slot, or their key's earlier messages), so that waiting is not
// a failed attempt.
func (p *pusher) extendWaiting(rt *subRuntime) {
	e := rt.entry()
	if e == nil {
		return
	}
	ad := time.Duration(e.proto.GetAckDeadlineSeconds()) * time.Second
	now := time.Now()
	var ids []string
	p.mu.Lock()
	for id, it := range p.waiting {
		if now.Sub(it.leased) >= ad/2 {
			it.leased = now
			ids = append(ids, id)
		}
	}
	p.mu.Unlock()
	if len(ids) > 0 {
		rt.extendTo(ids, now.Add(ad+pushGrace))
	}
}

// forget takes a settled (or abandoned) message off the pusher's count.
func (p *pusher) forget(it *pushItem) {
	p.mu.Lock()
	p.held--
	delete(p.waiting, it.rm.AckId)
	p.mu.Unlock()
	p.signal()
}

// deliver pushes one message and settles it.
func (p *pusher) deliver(rt *subRuntime, it *pushItem) {
	defer p.forget(it)
	// A message fetched while the push backoff began waits it out.
	for {
		p.mu.Lock()
		d := time.Until(p.pauseUntil)
		p.mu.Unlock()
		if d <= 0 {
			break
		}
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-p.ctx.Done():
			d = 0
		}
		t.Stop()
		if d == 0 {
			break
		}
	}
	select {
	case p.m.sem <- struct{}{}:
	case <-p.m.ctx.Done():
		return // shutdown: the lease goes back with the runtime
	}
	defer func() { <-p.m.sem }()
	id := it.rm.AckId
	e := rt.entry()
	if e == nil {
		return // deleted or re-created: its leases are dropped with the runtime
	}
	if !isPush(e) {
		rt.modack([]string{id}, 0) // switched to pull: back to the pullers now
		return
	}
	if !rt.current(id) {
		return // a key rewound behind an earlier failure: it comes again, in order
	}
	ad := time.Duration(e.proto.GetAckDeadlineSeconds()) * time.Second
	p.mu.Lock()
	delete(p.waiting, id)
	// Its deadline was set for a request starting at once: it waited.
	stale := time.Since(it.leased) > pushGrace/2
	p.mu.Unlock()
	if stale {
		rt.extendTo([]string{id}, time.Now().Add(ad+pushGrace))
	}
	code, err := p.m.send(p.m.ctx, e, it.rm, ad, p.label)
	if p.m.ctx.Err() != nil {
		return // shutdown while the request was out
	}
	if err == nil && pushAcked(code) {
		rt.ack([]string{id})
		p.settled(true, e)
		return
	}
	if err != nil {
		p.log.Debug("push failed", zap.String("message_id", it.rm.GetMessage().GetMessageId()), zap.Error(err))
	}
	p.settled(false, e) // the backoff first: the nacked message may be fetched again at once
	rt.modack([]string{id}, 0)
}

// pushAcked: the status codes Google takes as an acknowledgement.
func pushAcked(code int) bool {
	switch code {
	case 102, 200, 201, 202, 204:
		return true
	}
	return false
}

// settled adjusts the window (slow start: +1 on success, halved on
// failure) and the push backoff.
func (p *pusher) settled(ok bool, e *subEntry) {
	p.mu.Lock()
	if ok {
		// The next failure starts the backoff over; a pause that began
		// stays (requests answered now left before it).
		p.window = min(p.window+1, p.m.s.cfg.PushMaxPerSubscription)
		p.fails = 0
	} else {
		p.window = max(p.window/2, 1)
		if e.proto.GetRetryPolicy() == nil {
			p.fails++
			p.pauseUntil = time.Now().Add(pushBackoff(p.fails))
		}
	}
	w := p.window
	p.mu.Unlock()
	p.m.windows.WithLabelValues(p.label).Set(float64(w))
	p.signal()
}

// pushBackoff is the pause after n consecutive failures.
func pushBackoff(n int) time.Duration {
	d := pushBackoffMin
	for i := 1; i < n && d < pushBackoffMax; i++ {
		d *= 2
	}
	return min(d, pushBackoffMax)
}

// current reports whether ackID names a lease that is out under that
// generation.
func (r *subRuntime) current(ackID string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lookupLocked(ackID) != nil
}

// extendTo moves the deadlines of the leases ack ids name to t (push: a
// request's timeout may be as long as the ack deadline itself).
func (r *subRuntime) extendTo(ids []string, t time.Time) {
	held := make([]string, 0, len(ids))
	r.mu.Lock()
	for _, id := range ids {
		if l := r.lookupLocked(id); l != nil {
			r.setDeadlineLocked(l, t)
			held = append(held, l.d.LeaseID)
		}
	}
	r.mu.Unlock()
	if len(held) > 0 {
		r.h.Hold(t, held...)
	}
}

// hostAllowList is Config.PushAllowedHosts parsed: endpoint hosts pushes
// may go to. Empty allows every host.
type hostAllowList []string

// parseHostAllowList reads a comma-separated list of host names
// ("svc.example.com"), domain wildcards ("*.example.com", its subdomains)
// and host:port pairs.
func parseHostAllowList(s string) (hostAllowList, error) {
	var out hostAllowList
	for _, f := range strings.Split(s, ",") {
		f = strings.ToLower(strings.TrimSpace(f))
		if f == "" {
			continue
		}
		h := strings.TrimPrefix(f, "*.")
		if hh, port, err := net.SplitHostPort(h); err == nil {
			if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 || hh == "" {
				return nil, fmt.Errorf("gcp: push_allowed_hosts: %q: want host:port with a port number", f)
			}
			h = hh
		}
		if h == "" || strings.ContainsAny(h, "/@?#* ") {
			return nil, fmt.Errorf("gcp: push_allowed_hosts: %q is not a host, *.domain or host:port", f)
		}
		out = append(out, f)
	}
	return out, nil
}

// allows reports whether host (hostname) and port (may be "") of an
// endpoint are on the list.
func (a hostAllowList) allows(host, port string) bool {
	if len(a) == 0 {
		return true
	}
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	for _, f := range a {
		h, p := f, ""
		if hh, pp, err := net.SplitHostPort(f); err == nil {
			h, p = hh, pp
		}
		if p != "" && p != port {
			continue
		}
		if d, ok := strings.CutPrefix(h, "*."); ok {
			if strings.HasSuffix(host, "."+d) {
				return true
			}
			continue
		}
		if h == host {
			return true
		}
	}
	return false
}
