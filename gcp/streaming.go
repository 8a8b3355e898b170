package gcp

import (
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/kubemq-io/kubemq-proxy/gcp/limits"
)

// maxStreamBatch bounds one StreamingPullResponse.
const maxStreamBatch = 1000

// StreamingPull is a receive loop (acks, modacks, deadline changes) and a
// send loop (messages within the client's flow control) reporting into one
// error channel. The server ends the stream with UNAVAILABLE after
// StreamCloseAfter, and at shutdown, so that clients reconnect.
func (p *subscriber) StreamingPull(stream pubsubpb.Subscriber_StreamingPullServer) error {
	s := p.s
	first, err := stream.Recv()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return nil
		}
		return err
	}
	if first.GetSubscription() == "" {
		return status.Error(codes.InvalidArgument, "The first StreamingPullRequest must name a subscription.")
	}
	e, sn, err := s.pullable(stream.Context(), first.GetSubscription())
	if err != nil {
		return err
	}
	if err := checkModacks(first); err != nil {
		return err
	}
	var deadline atomic.Int64 // the ack deadline of messages sent from now on
	if sec := first.GetStreamAckDeadlineSeconds(); sec != 0 {
		if err := limits.StreamAckDeadline(sec); err != nil {
			return err
		}
		deadline.Store(int64(sec) * int64(time.Second))
	} else {
		deadline.Store(int64(e.proto.GetAckDeadlineSeconds()) * int64(time.Second))
	}
	f := newFlow(first.GetMaxOutstandingMessages(), first.GetMaxOutstandingBytes())
	if f.maxMsgs <= 0 {
		f.maxMsgs = int64(s.cfg.MaxOutstandingMessages)
	}
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	outage := s.outageChan()
	rt, release, err := s.runtime(ctx, e)
	if _, _, moved := s.notOwner(ctx, e.queue, err); moved {
		return s.relayStream(ctx, stream, first, e)
	}
	if err != nil {
		return s.deliveryStatus(sn, err)
	}
	defer release()
	out := &streamSender{Subscriber_StreamingPullServer: stream}
	if err := p.applyStream(ctx, out, rt, first); err != nil {
		return s.deliveryStatus(sn, err)
	}

	errc := make(chan error, 2)
	// The receive loop ends when the RPC does (Recv fails then); it is
	// counted so that Shutdown waits for it.
	s.streams.Add(1)
	go func() {
		defer s.streams.Done()
		for {
			req, err := stream.Recv()
			if err != nil {
				if errors.Is(err, io.EOF) {
					err = nil // the client half-closed: it is done
				}
				errc <- err
				return
			}
			if err := checkModacks(req); err != nil {
				errc <- err
				return
			}
			if sec := req.GetStreamAckDeadlineSeconds(); sec != 0 {
				if err := limits.StreamAckDeadline(sec); err != nil {
					errc <- err
					return
				}
				deadline.Store(int64(sec) * int64(time.Second))
			}
			if err := p.applyStream(ctx, out, rt, req); err != nil {
				errc <- err
				return
			}
		}
	}()
	sendDone := make(chan struct{})
	go func() {
		defer close(sendDone)
		errc <- p.sendLoop(ctx, out, rt, f, &deadline)
	}()

	timer := time.NewTimer(s.cfg.StreamCloseAfter)
	defer timer.Stop()
	select {
	case err = <-errc:
		// A client cancel (the stream's context ends, the send loop
		// returns it bare) becomes CANCELED here; left bare, the
		// interceptors would count it as UNKNOWN.
		if err != nil {
			err = s.deliveryStatus(sn, err)
		}
	case <-timer.C:
		err = status.Error(codes.Unavailable, "The StreamingPull stream was closed by the server after its maximum lifetime; reconnect.")
	case <-s.stopping:
		err = status.Error(codes.Unavailable, "kubemq-proxy is shutting down.")
	case <-outage:
		// The leases are dropped (their records bring the messages back):
		// the client reconnects once KubeMQ is back.
		err = status.Error(codes.Unavailable, "KubeMQ is unreachable; reconnect later.")
	}
	cancel()
	<-sendDone
	return err
}

// checkModacks validates a request's modify deadlines before any of it is
// applied.
func checkModacks(req *pubsubpb.StreamingPullRequest) error {
	if len(req.GetModifyDeadlineSeconds()) != len(req.GetModifyDeadlineAckIds()) {
		return status.Error(codes.InvalidArgument, "modify_deadline_seconds and modify_deadline_ack_ids must have the same length.")
	}
	for _, sec := range req.GetModifyDeadlineSeconds() {
		if err := limits.ModifyAckDeadline(sec); err != nil {
			return err
		}
	}
	return nil
}

// streamSender serialises the sends of a stream's send loop and of its
// exactly-once confirmations.
type streamSender struct {
	pubsubpb.Subscriber_StreamingPullServer
	mu sync.Mutex
}

func (s *streamSender) Send(resp *pubsubpb.StreamingPullResponse) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.Subscriber_StreamingPullServer.Send(resp)
}

// applyStream applies a request's acks and modacks; on an exactly-once
// subscription it answers them on the stream with Google's confirmations
// (eod.go).
func (p *subscriber) applyStream(ctx context.Context, out *streamSender, rt *subRuntime, req *pubsubpb.StreamingPullRequest) error {
	if !rt.exactlyOnce() {
		applyStreamRequest(rt, req)
		return nil
	}
	resp := p.s.confirmStream(ctx, rt, req)
	if resp == nil {
		return nil
	}
	resp.SubscriptionProperties = streamProperties(rt.entry())
	return out.Send(resp)
}

// streamProperties are the subscription's properties as responses carry
// them; nil for a deleted subscription.
func streamProperties(e *subEntry) *pubsubpb.StreamingPullResponse_SubscriptionProperties {
	if e == nil {
		return nil
	}
	return &pubsubpb.StreamingPullResponse_SubscriptionProperties{
		MessageOrderingEnabled: e.proto.GetEnableMessageOrdering(),
		// The client libraries ack and modack exactly-once subscriptions
		// by unary RPCs and read each id's outcome from the answer; acks
		// sent on the stream are confirmed on it (eod.go).
		ExactlyOnceDeliveryEnabled: e.proto.GetEnableExactlyOnceDelivery(),
	}
}

func applyStreamRequest(rt *subRuntime, req *pubsubpb.StreamingPullRequest) {
	if ids := req.GetAckIds(); len(ids) > 0 {
		rt.ack(ids)
	}
	// Clients send runs of one deadline (receipts, extensions, nacks):
	// group them to take the lock once per run.
	secs, ids := req.GetModifyDeadlineSeconds(), req.GetModifyDeadlineAckIds()
	for i := 0; i < len(ids); {
		j := i + 1
		for j < len(ids) && secs[j] == secs[i] {
			j++
		}
		rt.modack(ids[i:j], secs[i])
		i = j
	}
}

// sendLoop sends what fetchLoop leases, one batch behind it: while a
// batch is on its way to the client the next Fetch already waits in the
// engine, so its poller keeps draining instead of idling during the send.
func (p *subscriber) sendLoop(ctx context.Context, stream *streamSender, rt *subRuntime, f *flow, deadline *atomic.Int64) error {
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	batches := make(chan fetched, 1)
	go p.fetchLoop(fctx, rt, f, deadline, batches)
	for {
		var b fetched
		select {
		case b = <-batches:
		case <-ctx.Done():
			return ctx.Err()
		}
		if b.err != nil {
			return b.err
		}
		resp := &pubsubpb.StreamingPullResponse{ReceivedMessages: b.msgs, SubscriptionProperties: streamProperties(rt.entry())}
		if err := stream.Send(resp); err != nil {
			// The messages stay leased until their deadline, as on Google
			// (and so do those fetched ahead).
			return err
		}
	}
}

// fetched is one batch leased for a stream, or the error that ends it.
type fetched struct {
	msgs []*pubsubpb.ReceivedMessage
	err  error
}

// fetchLoop leases batches within the stream's flow control and hands them
// to sendLoop; it ends with ctx or after handing over an error.
func (p *subscriber) fetchLoop(ctx context.Context, rt *subRuntime, f *flow, deadline *atomic.Int64, out chan<- fetched) {
	for {
		rt.mu.Lock()
		room := f.room(time.Now())
		rt.mu.Unlock()
		if room <= 0 {
			select {
			case <-f.changed:
				continue
			case <-ctx.Done():
				return
			}
		}
		msgs, err := rt.fetch(ctx, int(min(room, maxStreamBatch)), f, time.Duration(deadline.Load()))
		if err != nil && ctx.Err() != nil {
			return
		}
		select {
		case out <- fetched{msgs, err}:
		case <-ctx.Done():
			return
		}
		if err != nil {
			return
		}
	}
}
