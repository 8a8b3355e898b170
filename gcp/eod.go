package gcp

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/kubemq-io/kubemq-proxy/delivery"
	"github.com/kubemq-io/kubemq-proxy/kubemqclient"
)

// Exactly-once delivery (enable_exactly_once_delivery).
//
// A lease is not handed out again while its deadline runs (as on every
// subscription here: the subscription's runtime owns its leases, on one
// replica). What exactly-once adds:
//   - acks and modacks answer per ack id: each id that settles nothing
//     (unknown, stale after a redelivery, a seek or a restart, already
//     acked or nacked, or past its deadline) fails with FAILED_PRECONDITION
//     and an ErrorInfo whose metadata maps it to
//     PERMANENT_FAILURE_INVALID_ACK_ID, which the client libraries report
//     through AckWithResult / ackWithResponse;
//   - an ack is answered only once it is durable, in the subscription's
//     acked-id log (below) and the engine's acknowledgement log, and a
//     delivery of a message listed there is dropped, so a message whose ack
//     succeeded is not delivered again, by this replica or the next owner
//     after a crash.

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
// durable: in the acked-id log and in the engine's acknowledgement log.
func (s *Server) ackExactlyOnce(ctx context.Context, r *subRuntime, ids []string) error {
	_, _, missed, err := s.ackDurably(ctx, r, ids)
	if err != nil {
		// Not known durable: the client retries (a retry of an applied
		// ack then reports it invalid, as Google may).
		return err
	}
	return eodInvalid(missed)
}

// ackDurably settles ids strictly and returns once the acks are durable.
// acked are the ack ids that settled their lease (unordered those of them
// held behind an earlier message of their ordering key), missed those
// that settled nothing; err (a status) when the acks could not be made
// durable.
func (s *Server) ackDurably(ctx context.Context, r *subRuntime, ids []string) (acked, unordered, missed []string, err error) {
	missed, lines, unordered := r.settleAcks(ids, true)
	if len(lines) == 0 {
		return nil, nil, missed, nil
	}
	acked = make([]string, len(lines))
	for i, line := range lines {
		acked[i], _, _ = strings.Cut(line, " ")
	}
	r.eod.add(time.Now(), lines...)
	e := r.entry()
	if e == nil {
		return acked, unordered, missed, status.Error(codes.NotFound, "The subscription was deleted.")
	}
	err = s.be.appendLog(ctx, []kubemqclient.Event{{Channel: eodAckChannel(e), Metadata: "acked", Body: []byte(strings.Join(lines, "\n"))}})
	if err == nil {
		err = r.h.Consumer().SyncSettlements(ctx)
	}
	if err != nil {
		return acked, unordered, missed, status.Errorf(codes.Unavailable, "The acknowledgements could not be made durable: %v", err)
	}
	return acked, unordered, missed, nil
}

// confirmStream applies the acks and modacks of a StreamingPull request on
// an exactly-once subscription and returns what Google answers on the
// stream for them: an acknowledge confirmation once the acks are durable
// (an ack that settled nothing is invalid; one that could not be made
// durable is a temporary failure, to be sent again), and a modify
// deadline confirmation. nil when the request had neither.
func (s *Server) confirmStream(ctx context.Context, r *subRuntime, req *pubsubpb.StreamingPullRequest) *pubsubpb.StreamingPullResponse {
	var resp *pubsubpb.StreamingPullResponse
	if ids := req.GetAckIds(); len(ids) > 0 {
		acked, unordered, missed, err := s.ackDurably(ctx, r, ids)
		c := &pubsubpb.StreamingPullResponse_AcknowledgeConfirmation{InvalidAckIds: missed}
		if err != nil {
			c.TemporaryFailedAckIds = acked
		} else {
			held := make(map[string]bool, len(unordered))
			for _, id := range unordered {
				held[id] = true
			}
			for _, id := range acked {
				if !held[id] {
					c.AckIds = append(c.AckIds, id)
				}
			}
			c.UnorderedAckIds = unordered
		}
		resp = &pubsubpb.StreamingPullResponse{AcknowledgeConfirmation: c}
	}
	secs, ids := req.GetModifyDeadlineSeconds(), req.GetModifyDeadlineAckIds()
	if len(ids) == 0 {
		return resp
	}
	c := &pubsubpb.StreamingPullResponse_ModifyAckDeadlineConfirmation{}
	for i := 0; i < len(ids); {
		j := i + 1
		for j < len(ids) && secs[j] == secs[i] {
			j++
		}
		missed := r.modackLeases(ids[i:j], secs[i], true)
		bad := make(map[string]bool, len(missed))
		for _, id := range missed {
			bad[id] = true
		}
		for _, id := range ids[i:j] {
			if !bad[id] {
				c.AckIds = append(c.AckIds, id)
			}
		}
		c.InvalidAckIds = append(c.InvalidAckIds, missed...)
		i = j
	}
	if resp == nil {
		resp = &pubsubpb.StreamingPullResponse{}
	}
	resp.ModifyAckDeadlineConfirmation = c
	return resp
}

// modackExactlyOnce extends or nacks ids strictly.
func (s *Server) modackExactlyOnce(r *subRuntime, ids []string, seconds int32) error {
	return eodInvalid(r.modackLeases(ids, seconds, true))
}

// The acked-id log. The lease engine's acknowledgement log covers the
// lease records of a crashed replica, but a real KubeMQ may also hand a
// crashed consumer's messages out once more by themselves (its transaction
// ended before KubeMQ applied the ack of the batch). So the message ids
// whose acks succeeded are written, before the ack is answered, to an
// events-store channel of the subscription (eodAckChannel), and whoever
// consumes the subscription reads the last eodWindow of it before it hands
// anything out and drops (acks) every delivery of a message listed there.

// eodWindow is how far back the acked ids are remembered: beyond the
// longest ack deadline (600 s) plus the lease-record delays after which a
// crashed replica's messages come back.
const eodWindow = 15 * time.Minute

const eodAckPrefix = "gcp.eodacks"

func eodAckChannel(e *subEntry) string { return kubemqclient.Channel(eodAckPrefix, e.id, e.uid) }

// eodAcks is a runtime's set of acked message ids (guarded by its mu
// field; load runs once, callers wait for it).
type eodAcks struct {
	loadMu sync.Mutex           // serialises loads
	loaded bool                 // guarded by loadMu
	mu     sync.Mutex           // guards ids, adds
	ids    map[string]time.Time // message id -> when its ack was heard
	adds   int
}

// add records acks, each "{ack id} {message id}".
func (a *eodAcks) add(now time.Time, lines ...string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.ids == nil {
		a.ids = map[string]time.Time{}
	}
	for _, line := range lines {
		// The ack id is kept in the log for diagnosis only.
		if _, msg, ok := strings.Cut(line, " "); ok && msg != "" {
			a.ids[msg] = now
		}
	}
	if a.adds += len(lines); a.adds >= 10_000 {
		a.adds = 0
		for id, t := range a.ids {
			if now.Sub(t) > eodWindow {
				delete(a.ids, id)
			}
		}
	}
}

func (a *eodAcks) reset() {
	a.mu.Lock()
	a.ids = nil
	a.mu.Unlock()
}

// eodReset marks in the acked-id log a seek of the subscription: what was
// acked before counts no more.
const eodReset = "reset"

// resetAcked records a seek of e in its acked-id log.
func (s *Server) resetAcked(ctx context.Context, e *subEntry) error {
	if !e.proto.GetEnableExactlyOnceDelivery() {
		return nil
	}
	return s.be.appendLog(ctx, []kubemqclient.Event{{Channel: eodAckChannel(e), Metadata: eodReset}})
}

func (a *eodAcks) has(id string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	_, ok := a.ids[id]
	return ok
}

// loadAcked reads the subscription's acked-id log once, before the
// runtime's first hand-out.
func (r *subRuntime) loadAcked(ctx context.Context, e *subEntry) error {
	if !e.proto.GetEnableExactlyOnceDelivery() {
		return nil
	}
	r.eod.loadMu.Lock()
	defer r.eod.loadMu.Unlock()
	if r.eod.loaded {
		return nil
	}
	now := time.Now()
	err := r.s.be.readLog(ctx, eodAckChannel(e), now.Add(-eodWindow), func(evs []kubemqclient.EventReceive) error {
		for _, ev := range evs {
			if ev.Metadata == eodReset {
				r.eod.reset()
				continue
			}
			r.eod.add(now, strings.Split(string(ev.Body), "\n")...)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("exactly-once: read the acked-id log: %w", err)
	}
	r.eod.loaded = true
	return nil
}

// dropAcked acks, and leaves out, deliveries of messages whose acks have
// succeeded.
func (r *subRuntime) dropAcked(e *subEntry, ds []*delivery.Delivery) []*delivery.Delivery {
	if !e.proto.GetEnableExactlyOnceDelivery() || len(ds) == 0 {
		return ds
	}
	out := ds[:0]
	var drop []string
	for _, d := range ds {
		if r.eod.has(pubsubID(d)) {
			drop = append(drop, d.LeaseID)
			continue
		}
		out = append(out, d)
	}
	if len(drop) > 0 {
		r.h.Ack(drop...)
		r.s.log.Info("exactly-once: dropped deliveries of acked messages", zap.String("subscription", e.id), zap.Int("messages", len(drop)))
	}
	return out
}

// pubsubID is the Pub/Sub message id of a delivery.
func pubsubID(d *delivery.Delivery) string {
	if id := d.Tags[TagMessageID]; id != "" {
		return id
	}
	return d.MessageID
}
