package gcp

import (
	"context"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Exactly-once delivery (enable_exactly_once_delivery).
//
// A lease is not handed out again while its deadline runs (as on every
// subscription here: the subscription's runtime owns its leases, on one
// replica). What exactly-once adds is the answer to acks and modacks:
// each ack id that settles nothing (unknown, stale after a redelivery, a
// seek or a restart, already acked or nacked, or past its deadline)
// fails with FAILED_PRECONDITION and an ErrorInfo whose metadata maps it to
// PERMANENT_FAILURE_INVALID_ACK_ID, which the client libraries report
// through AckWithResult / ackWithResponse; and an ack is answered only
// once it is durable in the settlement log (cluster), so a message whose
// ack succeeded is dropped, not redelivered, when its lease record comes
// back, on this replica or the next owner after a crash.

const (
	eodReason       = "EXACTLY_ONCE_ACKID_FAILURE"
	eodDomain       = "pubsub.googleapis.com"
	eodInvalidAckID = "PERMANENT_FAILURE_INVALID_ACK_ID"
)

// exactlyOnce reports whether r's subscription has exactly-once delivery.
func (r *subRuntime) exactlyOnce() bool {
	e := r.entry()
	return e != nil && e.proto.GetEnableExactlyOnceDelivery()
}

// eodInvalid is the error naming the ack ids that settled nothing; nil
// when there are none.
func eodInvalid(missed []string) error {
	if len(missed) == 0 {
		return nil
	}
	md := make(map[string]string, len(missed))
	for _, id := range missed {
		md[id] = eodInvalidAckID
	}
	st, err := status.New(codes.FailedPrecondition, "Some acknowledgement ids in the request were invalid. This could be because the acknowledgement ids have expired or the acknowledgement ids were malformed.").
		WithDetails(&errdetails.ErrorInfo{Reason: eodReason, Domain: eodDomain, Metadata: md})
	if err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	return st.Err()
}

// ackExactlyOnce settles ids strictly and answers once the acks are
// durable.
func (s *Server) ackExactlyOnce(ctx context.Context, r *subRuntime, ids []string) error {
	missed := r.settleAcks(ids, true)
	if len(missed) < len(ids) {
		if err := r.h.Consumer().SyncSettlements(ctx); err != nil {
			// Not known durable: the client retries (a retry of an
			// applied ack then reports it invalid, as Google may).
			return status.Errorf(codes.Unavailable, "The acknowledgements could not be made durable: %v", err)
		}
	}
	return eodInvalid(missed)
}

// modackExactlyOnce extends or nacks ids strictly.
func (s *Server) modackExactlyOnce(r *subRuntime, ids []string, seconds int32) error {
	return eodInvalid(r.modackLeases(ids, seconds, true))
}
