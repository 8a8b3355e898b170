package gcp

import (
	"context"
	"errors"
	"io"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/kubemq-io/kubemq-proxy/cluster"
	"github.com/kubemq-io/kubemq-proxy/delivery"
)

// Several replicas on one KubeMQ: one of them consumes a subscription at a time (the delivery
// engine's Owners). Another replica that a client reaches forwards the subscription's consuming
// calls to that one, unchanged, as the client made them: Pull, StreamingPull (the whole stream,
// both ways), Acknowledge, ModifyAckDeadline and Seek. Ack ids are the consuming replica's, so
// a client may ack through any replica. A forwarded call is never forwarded again: a replica
// that no longer consumes the subscription answers it UNAVAILABLE, and the client retries.

// Peers reaches the replica that consumes a subscription when several share one KubeMQ.
type Peers interface {
	// Owner returns the peer address of another replica that consumes queue; false when none
	// does, or this one does.
	Owner(queue string) (addr string, ok bool)
	// Conn returns a connection to the replica at addr (its peer port).
	Conn(addr string) (grpc.ClientConnInterface, error)
	// Propagate returns once every other live replica has read this
	// replica's registry writes so far, or could not in a bounded time
	// (registry.Registry.Propagate): a create, update or delete answers
	// after it, so the client's next call through any replica finds the
	// change (a publish makes its copy for a subscription created a moment
	// ago through another replica).
	Propagate(ctx context.Context)
}

// errMoved answers a call that reached a replica which does not consume the subscription (a
// forwarded call that raced a handover): the client calls again and is forwarded anew.
var errMoved = status.Error(codes.Unavailable, "kubemq-proxy: another replica consumes this subscription now; retry")

// remote returns a Subscriber client on the replica that consumes queue, if it is another one
// and the call may be forwarded (it was not forwarded already).
func (s *Server) remote(ctx context.Context, queue string) (pubsubpb.SubscriberClient, bool, error) {
	if s.peers == nil || cluster.Forwarded(ctx) {
		return nil, false, nil
	}
	addr, ok := s.peers.Owner(queue)
	if !ok {
		return nil, false, nil
	}
	conn, err := s.peers.Conn(addr)
	if err != nil {
		return nil, false, err
	}
	s.m.forwarded.Inc()
	return pubsubpb.NewSubscriberClient(conn), true, nil
}

// notOwner reports whether err says another replica consumes the queue, and then what to do: a
// client to forward to, or the status to answer.
func (s *Server) notOwner(ctx context.Context, queue string, err error) (pubsubpb.SubscriberClient, error, bool) {
	if !errors.Is(err, delivery.ErrNotOwner) && !errors.Is(err, delivery.ErrHandedOver) {
		return nil, nil, false
	}
	sc, ok, ferr := s.remote(ctx, queue)
	switch {
	case ferr != nil:
		return nil, ferr, true
	case !ok:
		return nil, errMoved, true
	}
	return sc, nil, true
}

// ownerWait bounds how long a pull waits for the replica that consumes its subscription to be
// known and reachable (a dead one's hold lapses after cluster.lease, 8 s by default); ownerRetry
// is the pause between attempts.
const (
	ownerWait  = 15 * time.Second
	ownerRetry = 250 * time.Millisecond
)

// relayStream serves a StreamingPull whose subscription another replica consumes (or will,
// once a dead one's hold has lapsed): the stream is relayed to that replica, which is awaited
// (ownerWait) rather than the stream failed at once, since each failure makes the client back
// off further. The client's requests are read once, for every attempt.
func (s *Server) relayStream(ctx context.Context, stream pubsubpb.Subscriber_StreamingPullServer, first *pubsubpb.StreamingPullRequest, e *subEntry) error {
	in := make(chan *pubsubpb.StreamingPullRequest, 64)
	// Read until the RPC ends (Recv fails once this handler returns); counted, like the local
	// receive loops, so that Shutdown waits for it.
	s.streams.Add(1)
	go func() {
		defer s.streams.Done()
		defer close(in)
		for {
			req, err := stream.Recv()
			if err != nil {
				return // EOF: the client is done sending; answers may still come
			}
			select {
			case in <- req:
			case <-ctx.Done():
				return
			}
		}
	}()
	wait := time.Now().Add(ownerWait)
	for {
		_, release, err := s.runtime(ctx, e)
		if err == nil {
			// This replica took the subscription over meanwhile: the client's next stream is
			// served here.
			release()
			return errMoved
		}
		sc, ferr, moved := s.notOwner(ctx, e.queue, err)
		switch {
		case !moved:
			return toStatus(err)
		case ferr == nil:
			relayed, err := s.forwardStream(ctx, stream, first, in, sc)
			if relayed || status.Code(err) != codes.Unavailable || time.Now().After(wait) {
				return err
			}
		case time.Now().After(wait):
			return ferr
		}
		select {
		case <-time.After(ownerRetry):
		case <-ctx.Done():
			return ctx.Err()
		case <-s.stopping:
			return status.Error(codes.Unavailable, "kubemq-proxy is shutting down.")
		}
	}
}

// forwardStream relays one attempt of a StreamingPull to the replica that consumes its
// subscription: first, then the client's requests from in, and back everything the replica
// answers, until either side ends the stream. The replica's final status is the client's.
// relayed reports whether anything came back (a stream refused at once may be tried again).
func (s *Server) forwardStream(ctx context.Context, stream pubsubpb.Subscriber_StreamingPullServer, first *pubsubpb.StreamingPullRequest,
	in <-chan *pubsubpb.StreamingPullRequest, sc pubsubpb.SubscriberClient) (relayed bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	up, err := sc.StreamingPull(ctx)
	if err != nil {
		return false, err
	}
	if err := up.Send(first); err != nil {
		_, rerr := up.Recv()
		return false, rerr
	}
	sent := make(chan struct{})
	go func() { // ends with the attempt (ctx) or the client's side
		defer close(sent)
		for {
			select {
			case req, ok := <-in:
				if !ok {
					_ = up.CloseSend()
					return
				}
				if up.Send(req) != nil {
					return // the replica's side ended: its Recv below says why
				}
			case <-ctx.Done():
				return
			}
		}
	}()
	defer func() {
		cancel()
		<-sent
	}()
	for {
		resp, err := up.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return relayed, nil
			}
			return relayed, err
		}
		relayed = true
		if err := stream.Send(resp); err != nil {
			return relayed, err
		}
	}
}
