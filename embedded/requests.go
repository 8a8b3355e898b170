package embedded

import (
	"context"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/kubemq-io/kubemq-proxy/kubemqpb"
)

// Commands and queries: a request goes to the live subscribers of its kind whose channel pattern
// matches (one member per group), and SendRequest waits for the first SendResponse that names
// its reply channel. Not used by the proxy; the response cache (CacheKey) is not implemented.

const (
	errRequestEmpty   = "Error 115: invalid request, cannot be empty"
	errCacheTTL       = "Error 116: invalid cache ttl value, cannot be 0 or negative"
	errRequestID      = "Error 117: invalid request id, cannot be empty"
	errSetTimeout     = "Error 109: invalid set timeout value, cannot be 0 or negative"
	errRequestType    = "Error 206: invalid request type"
	errRequestTimeout = "Error 301: timeout for request message"
)

// reqSub is one SubscribeToRequests stream.
type reqSub struct {
	kind    kubemqpb.Subscribe_SubscribeType
	pattern string
	group   string
	out     chan *kubemqpb.Request
	gone    chan struct{}
}

// requestBus routes requests and replies. mu guards every field.
type requestBus struct {
	mu      sync.Mutex
	subs    map[*reqSub]struct{}
	rr      map[string]uint64
	pending map[string]chan *kubemqpb.Response // reply channel -> waiting SendRequest
}

func newRequestBus() *requestBus {
	return &requestBus{subs: map[*reqSub]struct{}{}, rr: map[string]uint64{}, pending: map[string]chan *kubemqpb.Response{}}
}

func checkRequestChannel(ch string, wildcards bool) string {
	kind := kindEvents
	if wildcards {
		kind = kindEventsSub
	}
	return checkChannel(ch, kind)
}

// SubscribeToRequests streams commands (type Commands) or queries (type Queries).
func (s *Server) SubscribeToRequests(sub *kubemqpb.Subscribe, stream grpc.ServerStreamingServer[kubemqpb.Request]) error {
	if sub.SubscribeTypeData != kubemqpb.Subscribe_Commands && sub.SubscribeTypeData != kubemqpb.Subscribe_Queries {
		return internalErr(errSubscribeType)
	}
	if sub.ClientID == "" {
		return internalErr(errClientID)
	}
	if msg := checkRequestChannel(sub.Channel, true); msg != "" {
		return internalErr(msg)
	}
	rs := &reqSub{kind: sub.SubscribeTypeData, pattern: sub.Channel, group: sub.Group,
		out: make(chan *kubemqpb.Request, s.opts.SubscriptionBuffer), gone: make(chan struct{})}
	b := s.requests
	b.mu.Lock()
	b.subs[rs] = struct{}{}
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		delete(b.subs, rs)
		b.mu.Unlock()
		close(rs.gone)
	}()
	subscribed(stream)
	ctx := stream.Context()
	for {
		select {
		case r := <-rs.out:
			if err := stream.Send(r); err != nil {
				return err
			}
		case <-ctx.Done():
			return nil
		case <-s.ctx.Done():
			return errShutdown()
		}
	}
}

func (s *Server) checkRequest(r *kubemqpb.Request) string {
	if r.RequestTypeData != kubemqpb.Request_Command && r.RequestTypeData != kubemqpb.Request_Query {
		return errRequestType
	}
	if r.ClientID == "" {
		return errClientID
	}
	if msg := checkRequestChannel(r.Channel, false); msg != "" {
		return msg
	}
	if r.Timeout <= 0 {
		return errSetTimeout
	}
	if r.Metadata == "" && len(r.Body) == 0 {
		return errRequestEmpty
	}
	if r.CacheKey != "" && r.CacheTTL <= 0 {
		return errCacheTTL
	}
	if n := len(r.Body) + len(r.Metadata); n > s.opts.MaxMessageBytes {
		return errEventTooLarge(n, s.opts.MaxMessageBytes)
	}
	return ""
}

// SendRequest delivers a command or query and waits up to its Timeout (ms) for the reply.
func (s *Server) SendRequest(ctx context.Context, r *kubemqpb.Request) (*kubemqpb.Response, error) {
	if msg := s.checkRequest(r); msg != "" {
		return nil, internalErr(msg)
	}
	kind := kubemqpb.Subscribe_Commands
	if r.RequestTypeData == kubemqpb.Request_Query {
		kind = kubemqpb.Subscribe_Queries
	}
	id := r.RequestID
	if id == "" {
		id = nuids.next()
	}
	reply := "_INBOX." + nuids.next()
	out := &kubemqpb.Request{
		RequestID: id, RequestTypeData: r.RequestTypeData, ClientID: r.ClientID, Channel: r.Channel,
		Metadata: r.Metadata, Body: r.Body, ReplyChannel: reply, Timeout: r.Timeout,
		CacheKey: r.CacheKey, CacheTTL: r.CacheTTL, Span: r.Span, Tags: r.Tags,
	}
	got := make(chan *kubemqpb.Response, 1)
	b := s.requests
	var targets []*reqSub
	groups := map[string][]*reqSub{}
	b.mu.Lock()
	b.pending[reply] = got
	for rs := range b.subs {
		if rs.kind != kind || !subjectMatch(rs.pattern, r.Channel) {
			continue
		}
		if rs.group == "" {
			targets = append(targets, rs)
		} else {
			k := rs.pattern + "\x00" + rs.group
			groups[k] = append(groups[k], rs)
		}
	}
	for k, members := range groups {
		b.rr[k]++
		sortReqSubs(members)
		targets = append(targets, members[b.rr[k]%uint64(len(members))])
	}
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		delete(b.pending, reply)
		b.mu.Unlock()
	}()
	timer := time.NewTimer(time.Duration(r.Timeout) * time.Millisecond)
	defer timer.Stop()
	for _, rs := range targets {
		select {
		case rs.out <- out:
		case <-rs.gone:
		case <-timer.C:
			return nil, internalErr(errRequestTimeout)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	select {
	case resp := <-got:
		if kind == kubemqpb.Subscribe_Commands {
			resp.Body, resp.Metadata, resp.CacheHit, resp.ReplyChannel = nil, "", false, ""
		}
		return resp, nil
	case <-timer.C:
		return nil, internalErr(errRequestTimeout)
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-s.ctx.Done():
		return nil, errShutdown()
	}
}

func sortReqSubs(subs []*reqSub) {
	for i := 1; i < len(subs); i++ {
		for j := i; j > 0 && subs[j].pattern+subs[j].group < subs[j-1].pattern+subs[j-1].group; j-- {
			subs[j], subs[j-1] = subs[j-1], subs[j]
		}
	}
}

// SendResponse answers a request received through SubscribeToRequests. A reply nobody waits for
// any more is dropped, as on the real server.
func (s *Server) SendResponse(_ context.Context, r *kubemqpb.Response) (*kubemqpb.Empty, error) {
	switch {
	case r.ClientID == "":
		return nil, internalErr(errClientID)
	case r.ReplyChannel == "":
		return nil, internalErr(errChannelEmpty)
	case strings.HasSuffix(r.ReplyChannel, "."):
		return nil, internalErr(errEndDot)
	case strings.Contains(r.ReplyChannel, " "):
		return nil, internalErr(errWhitespace)
	case strings.ContainsAny(r.ReplyChannel, "*>"):
		return nil, internalErr(errWildcards)
	case r.RequestID == "":
		return nil, internalErr(errRequestID)
	}
	b := s.requests
	b.mu.Lock()
	ch := b.pending[r.ReplyChannel]
	delete(b.pending, r.ReplyChannel)
	b.mu.Unlock()
	if ch != nil {
		resp := &kubemqpb.Response{
			ClientID: r.ClientID, RequestID: r.RequestID, ReplyChannel: r.ReplyChannel, Metadata: r.Metadata,
			Body: r.Body, CacheHit: r.CacheHit, Timestamp: r.Timestamp, Executed: r.Executed, Error: r.Error,
			Span: r.Span, Tags: r.Tags,
		}
		if resp.Timestamp == 0 {
			resp.Timestamp = s.now().UnixNano()
		}
		ch <- resp
	}
	return &kubemqpb.Empty{}, nil
}
