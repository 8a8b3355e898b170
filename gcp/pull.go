package gcp

import (
	"context"
	"errors"
	"math"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/kubemq-io/kubemq-proxy/delivery"
	"github.com/kubemq-io/kubemq-proxy/gcp/limits"
	"github.com/kubemq-io/kubemq-proxy/gcp/names"
)

// Unary Pull bounds: return_immediately waits only for what the poller
// already holds; otherwise Pull waits for a message up to maxPullWait (or
// the client's deadline) and then answers empty, as Google does.
const (
	immediateWait = 20 * time.Millisecond
	maxPullWait   = 25 * time.Second
)

// runtime returns the subscription's delivery runtime, starting it on
// first use, and counts the caller as its user until release is called
// (an idle runtime is retired, see retireIdle). The entry must be current
// (from the catalog).
func (s *Server) runtime(ctx context.Context, e *subEntry) (r *subRuntime, release func(), err error) {
	s.rtMu.Lock()
	for s.seeking[e.id] != nil { // a seek replaces the backlog: wait for it
		busy := s.seeking[e.id]
		s.rtMu.Unlock()
		select {
		case <-busy:
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
		s.rtMu.Lock()
	}
	defer s.rtMu.Unlock()
	if r, err = s.runtimeLocked(ctx, e); err != nil {
		return nil, nil, err
	}
	r.users++
	return r, func() {
		s.rtMu.Lock()
		r.users--
		r.lastUsed = time.Now()
		s.rtMu.Unlock()
	}, nil
}

func (s *Server) runtimeLocked(ctx context.Context, e *subEntry) (*subRuntime, error) {
	if s.rtClosed {
		return nil, errRuntimeClosed
	}
	if r := s.runtimes[e.id]; r != nil {
		if r.uid == e.uid {
			return r, nil
		}
		// A stale incarnation (deleted or re-created) whose drop has not
		// run yet: end it here, since its drop will no longer find it.
		delete(s.runtimes, e.id)
		s.endRuntimeLocked(r, true)
	}
	h, err := s.deliveries.Acquire(ctx, e.queue)
	if err != nil {
		return nil, err
	}
	h.SetDeadline(0) // this package runs the ack deadlines (lease.go)
	r := newSubRuntime(s, e, h)
	if r.ordered {
		h.OnUnsettled(r.unsettled)
		if at, done := s.noRecovery.Load(e.uid); !done || h.HeldElsewhereSince(at.(time.Time)) {
			// Created before this process started (and not yet recovered
			// by an earlier runtime here), or consumed by another replica
			// since: lease records of another process may still be on
			// their way back.
			r.mu.Lock()
			r.beginRecoveryLocked(time.Now())
			r.mu.Unlock()
		}
	}
	s.runtimes[e.id] = r
	return r, nil
}

// handedOver ends r, whose queue another replica consumes now (the engine gave it up): its
// streams and Pulls end with UNAVAILABLE, and the clients' next calls are forwarded.
func (s *Server) handedOver(r *subRuntime) {
	r.mu.Lock()
	if r.endErr == nil {
		r.endErr = delivery.ErrHandedOver
	}
	r.mu.Unlock()
	s.rtMu.Lock()
	defer s.rtMu.Unlock()
	if s.runtimes[r.id] == r {
		delete(s.runtimes, r.id)
		s.endRuntimeLocked(r, false)
	}
}

// endRuntimeLocked closes r, just taken out of s.runtimes, in the
// background: closing waits for its poller's backend Get (up to a second),
// which the caller need not. Called under rtMu, so that Shutdown's bg.Wait
// (after closeRuntimes) covers it.
func (s *Server) endRuntimeLocked(r *subRuntime, drop bool) {
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		r.close(drop)
	}()
}

// retireIdle ends r if no stream or Pull has used it for RuntimeIdle and
// it holds no leases: its poller, timers and engine handle go away, and
// the next pull starts a fresh runtime. Called by r's sweep.
func (s *Server) retireIdle(r *subRuntime, now time.Time) {
	s.rtMu.Lock()
	defer s.rtMu.Unlock()
	if s.runtimes[r.id] != r || r.users > 0 || now.Sub(r.lastUsed) < s.cfg.RuntimeIdle {
		return
	}
	r.mu.Lock()
	idle := len(r.leases) == 0
	// Nothing of an earlier process is still on its way back: a later
	// runtime of this incarnation needs no ordering recovery hold.
	recovered := len(r.awaiting) == 0 && now.After(r.recoveryEndLocked())
	r.mu.Unlock()
	if !idle {
		return
	}
	if recovered {
		s.noRecovery.Store(r.uid, now)
	}
	delete(s.runtimes, r.id)
	s.endRuntimeLocked(r, false)
}

// lookupRuntime finds a running runtime for acks; nil when the
// subscription has none on this replica (its ack ids are then stale).
func (s *Server) lookupRuntime(e *subEntry) *subRuntime {
	s.rtMu.Lock()
	defer s.rtMu.Unlock()
	if r := s.runtimes[e.id]; r != nil && r.uid == e.uid {
		return r
	}
	return nil
}

// dropRuntime ends the runtime of the subscription incarnation uid
// (deleted, detached or re-created): its leases are settled as consumed.
// A runtime of a newer incarnation of the same id is left alone.
func (s *Server) dropRuntime(id, uid string) {
	s.noRecovery.Delete(uid) // the incarnation is over: its mark would only pile up
	s.rtMu.Lock()
	defer s.rtMu.Unlock()
	if r := s.takeRuntimeLocked(id, uid); r != nil {
		s.endRuntimeLocked(r, true)
	}
}

// takeRuntimeLocked takes the runtime of the subscription incarnation uid
// out of s.runtimes; nil when none runs (or one of another incarnation,
// which stays).
func (s *Server) takeRuntimeLocked(id, uid string) *subRuntime {
	r := s.runtimes[id]
	if r == nil || r.uid != uid {
		return nil
	}
	delete(s.runtimes, id)
	return r
}

// closeRuntimes gives every lease back (shutdown).
func (s *Server) closeRuntimes() {
	s.rtMu.Lock()
	s.rtClosed = true
	rs := s.runtimes
	s.runtimes = map[string]*subRuntime{}
	s.rtMu.Unlock()
	for _, r := range rs {
		r.close(false)
	}
}

// pullable looks a subscription up for a pull: NOT_FOUND, or
// FAILED_PRECONDITION once detached.
func (s *Server) pullable(ctx context.Context, name string) (*subEntry, names.SubscriptionName, error) {
	sn, err := names.ParseSubscription(name)
	if err != nil {
		return nil, sn, err
	}
	e, ok := s.findSub(ctx, sn.ID)
	if !ok {
		return nil, sn, notFound(sn.ID)
	}
	if e.proto.GetDetached() {
		return nil, sn, status.Errorf(codes.FailedPrecondition, "Subscription %s is detached.", sn.ID)
	}
	return e, sn, nil
}

// deliveryStatus maps a fetch failure.
func (s *Server) deliveryStatus(sn names.SubscriptionName, err error) error {
	switch {
	case errors.Is(err, errSubGone):
		if e, ok := s.cat.sub(sn.ID); ok && e.proto.GetDetached() {
			return status.Errorf(codes.FailedPrecondition, "Subscription %s is detached.", sn.ID)
		}
		return notFound(sn.ID)
	case errors.Is(err, errSeeked):
		return status.Error(codes.Unavailable, "The subscription was seeked; pull again.")
	case errors.Is(err, errRuntimeClosed):
		return status.Error(codes.Unavailable, "kubemq-proxy is shutting down")
	}
	return toStatus(err)
}

func (p *subscriber) Pull(ctx context.Context, req *pubsubpb.PullRequest) (*pubsubpb.PullResponse, error) {
	s := p.s
	e, sn, err := s.pullable(ctx, req.GetSubscription())
	if err != nil {
		return nil, err
	}
	n, err := limits.PullMaxMessages(req.GetMaxMessages())
	if err != nil {
		return nil, err
	}
	rt, release, err := s.runtime(ctx, e)
	if sc, ferr, moved := s.notOwner(ctx, e.queue, err); moved {
		if ferr != nil {
			return nil, ferr
		}
		return sc.Pull(ctx, req)
	}
	if err != nil {
		return nil, s.deliveryStatus(sn, err)
	}
	defer release()
	wait := maxPullWait
	if req.GetReturnImmediately() {
		wait = immediateWait
	}
	if dl, ok := ctx.Deadline(); ok {
		// Answer (empty) a little before the client gives up.
		wait = min(wait, time.Until(dl)*9/10)
	}
	pctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	go func() {
		// A waiting Pull answers (empty) at shutdown instead of holding
		// GracefulStop for its whole wait.
		select {
		case <-s.stopping:
			cancel()
		case <-pctx.Done():
		}
	}()
	// Each call is its own stream for ordering: a key's messages out to one
	// Pull are not handed to another until they are settled.
	msgs, err := rt.fetch(pctx, int(n), newFlow(math.MaxInt64, 0), time.Duration(e.proto.GetAckDeadlineSeconds())*time.Second)
	if err != nil {
		if pctx.Err() != nil && ctx.Err() == nil {
			return &pubsubpb.PullResponse{}, nil
		}
		return nil, s.deliveryStatus(sn, err)
	}
	return &pubsubpb.PullResponse{ReceivedMessages: msgs}, nil
}

// ackTarget finds the runtime for an ack or modack, and the subscription's
// queue. A subscription with no runtime here has no live leases here: the
// ids are another replica's (forward.go), or stale, a no-op.
func (s *Server) ackTarget(name string, ids []string) (*subRuntime, string, error) {
	sn, err := names.ParseSubscription(name)
	if err != nil {
		return nil, "", err
	}
	if len(ids) == 0 {
		return nil, "", status.Error(codes.InvalidArgument, "No ack ids specified.")
	}
	e, ok := s.cat.sub(sn.ID)
	if !ok {
		return nil, "", notFound(sn.ID)
	}
	return s.lookupRuntime(e), e.queue, nil
}

func (p *subscriber) Acknowledge(ctx context.Context, req *pubsubpb.AcknowledgeRequest) (*emptypb.Empty, error) {
	rt, queue, err := p.s.ackTarget(req.GetSubscription(), req.GetAckIds())
	if err != nil {
		return nil, err
	}
	if rt != nil {
		if rt.exactlyOnce() {
			if err := p.s.ackExactlyOnce(ctx, rt, req.GetAckIds()); err != nil {
				return nil, err
			}
			return &emptypb.Empty{}, nil
		}
		rt.ack(req.GetAckIds())
		return &emptypb.Empty{}, nil
	}
	if sc, ok, err := p.s.remote(ctx, queue); err != nil || ok {
		if err != nil {
			return nil, err
		}
		return sc.Acknowledge(ctx, req)
	}
	return &emptypb.Empty{}, p.s.noLeases(req.GetSubscription(), req.GetAckIds())
}

// noLeases answers acks and modacks that reach no runtime (no lease is
// out anywhere): a no-op, or every id invalid with exactly-once.
func (s *Server) noLeases(sub string, ids []string) error {
	if sn, err := names.ParseSubscription(sub); err == nil {
		if e, ok := s.cat.sub(sn.ID); ok && e.proto.GetEnableExactlyOnceDelivery() {
			return eodInvalid(ids)
		}
	}
	return nil
}

func (p *subscriber) ModifyAckDeadline(ctx context.Context, req *pubsubpb.ModifyAckDeadlineRequest) (*emptypb.Empty, error) {
	if err := limits.ModifyAckDeadline(req.GetAckDeadlineSeconds()); err != nil {
		return nil, err
	}
	rt, queue, err := p.s.ackTarget(req.GetSubscription(), req.GetAckIds())
	if err != nil {
		return nil, err
	}
	if rt != nil {
		if rt.exactlyOnce() {
			if err := p.s.modackExactlyOnce(rt, req.GetAckIds(), req.GetAckDeadlineSeconds()); err != nil {
				return nil, err
			}
			return &emptypb.Empty{}, nil
		}
		rt.modack(req.GetAckIds(), req.GetAckDeadlineSeconds())
		return &emptypb.Empty{}, nil
	}
	if sc, ok, err := p.s.remote(ctx, queue); err != nil || ok {
		if err != nil {
			return nil, err
		}
		return sc.ModifyAckDeadline(ctx, req)
	}
	return &emptypb.Empty{}, p.s.noLeases(req.GetSubscription(), req.GetAckIds())
}
