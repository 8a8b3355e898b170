package gcp

import (
	"context"
	"errors"
	"time"

	"go.uber.org/zap"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/emptypb"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/kubemq-io/kubemq-proxy/gcp/limits"
	"github.com/kubemq-io/kubemq-proxy/gcp/names"
)

// subscriber serves google.pubsub.v1.Subscriber.
type subscriber struct {
	pubsubpb.UnimplementedSubscriberServer
	s *Server
}

// errNotApplied: a registry write succeeded but the catalog does not show
// it, which would be a registry bug.
var errNotApplied = errors.New("topology write not visible after it succeeded")

// renderSub is the subscription as the caller sees it: named in the
// caller's project, topic "_deleted-topic_" once its topic is gone.
func (s *Server) renderSub(e *subEntry, project string) *pubsubpb.Subscription {
	out := cloneSub(e.proto)
	out.Name = names.SubscriptionName{Project: project, ID: e.id}.String()
	if s.cat.attached(e) {
		out.Topic = names.TopicName{Project: project, ID: e.topicID}.String()
	} else {
		out.Topic = names.DeletedTopic
	}
	if out.PushConfig == nil {
		// Google reports a pull subscription with an empty push config
		// ("an empty pushConfig signifies ... pull"); clients read
		// pushConfig.pushEndpoint without a nil check.
		out.PushConfig = &pubsubpb.PushConfig{}
	}
	return out
}

// storeSub writes e to the registry and answers with the subscription as
// the catalogue now holds it.
func (s *Server) storeSub(ctx context.Context, e *subEntry, project string) (*pubsubpb.Subscription, error) {
	if err := s.putSub(ctx, e); err != nil {
		return nil, toStatus(err)
	}
	got, ok := s.cat.sub(e.id)
	if !ok {
		return nil, toStatus(errNotApplied)
	}
	return s.renderSub(got, project), nil
}

func (s *Server) putSub(ctx context.Context, e *subEntry) error {
	rec, err := encodeSub(e)
	if err != nil {
		return err
	}
	return s.topo.Put(ctx, kindSubscription, e.id, rec)
}

// dropBacklog empties a subscription's queue and gives up its leases
// (detach, delete).
func (s *Server) dropBacklog(ctx context.Context, e *subEntry) error {
	if s.onDrop != nil {
		s.onDrop(e.id, e.uid)
	}
	return s.be.purge(ctx, e.queue)
}

// newSubQueue picks the queue of a new subscription: the readable
// "gcp.sub.{id}" unless KubeMQ already knows that queue (an earlier
// subscription of the same id used it), then one named for this
// incarnation.
func (s *Server) newSubQueue(ctx context.Context, id, uid string) (string, error) {
	q := subChannel(id)
	known, err := s.be.queueKnown(ctx, q)
	if err != nil {
		return "", err
	}
	if known {
		return subIncarnationChannel(id, uid), nil
	}
	return q, nil
}

// checkSubscription validates everything but the name and fills in the
// defaults Google reports back (ack deadline, retention, dead-letter
// attempts).
func (s *Server) checkSubscription(sub *pubsubpb.Subscription) error {
	// http endpoints are accepted anywhere, as by Google's emulator: the
	// proxy serves local and in-cluster setups (push.go).
	if err := limits.Subscription(sub, limits.SubscriptionOptions{AllowHTTPPush: true}); err != nil {
		return err
	}
	if err := s.push.allowed(sub.GetPushConfig()); err != nil {
		return err
	}
	ack, _ := limits.AckDeadline(sub.GetAckDeadlineSeconds())
	if sub.GetAckDeadlineSeconds() == 0 {
		ack = int32(s.cfg.DefaultAckDeadline.Seconds())
	}
	sub.AckDeadlineSeconds = ack
	if sub.MessageRetentionDuration == nil {
		ret, _ := limits.SubscriptionRetention(nil)
		sub.MessageRetentionDuration = durationpb.New(ret)
	}
	if dlp := sub.GetDeadLetterPolicy(); dlp != nil {
		attempts, ok, _ := limits.DeadLetterAttempts(dlp)
		if !ok {
			sub.DeadLetterPolicy = nil // no topic: the client cleared the policy
		} else {
			tn, err := names.ParseTopic(dlp.GetDeadLetterTopic())
			if err != nil {
				return err
			}
			if _, ok := s.cat.topic(tn.ID); !ok {
				return notFound(tn.ID)
			}
			dlp.MaxDeliveryAttempts = attempts
		}
	}
	if rp := sub.GetRetryPolicy(); rp != nil {
		b, _, _ := limits.RetryPolicy(rp)
		rp.MinimumBackoff = durationpb.New(b.Min)
		rp.MaximumBackoff = durationpb.New(b.Max)
	}
	return nil
}

func (p *subscriber) CreateSubscription(ctx context.Context, req *pubsubpb.Subscription) (*pubsubpb.Subscription, error) {
	sn, err := names.ParseSubscription(req.GetName())
	if err != nil {
		return nil, err
	}
	if req.GetTopic() == "" {
		return nil, invalidArgf("The topic field is required.")
	}
	tn, err := names.ParseTopic(req.GetTopic())
	if err != nil {
		return nil, err
	}
	s := p.s
	sub := cloneSub(req)
	if err := s.checkSubscription(sub); err != nil {
		return nil, err
	}
	var match matcher
	if sub.GetFilter() != "" {
		if match, err = compileFilter(sub.GetFilter()); err != nil {
			return nil, err
		}
	}
	sub.Detached = false
	sub.State = pubsubpb.Subscription_ACTIVE
	sub.AnalyticsHubSubscriptionInfo = nil
	s.adminMu.Lock()
	defer s.adminMu.Unlock()
	if _, ok := s.cat.sub(sn.ID); ok {
		return nil, alreadyExists(sn.ID)
	}
	t, ok := s.findTopic(ctx, tn.ID)
	if !ok {
		return nil, notFound(tn.ID)
	}
	sub.TopicMessageRetentionDuration = t.proto.GetMessageRetentionDuration()
	e := &subEntry{id: sn.ID, uid: newUID(), topicID: tn.ID, topicUID: t.uid, proto: sub, match: match}
	if e.queue, err = s.newSubQueue(ctx, sn.ID, e.uid); err != nil {
		return nil, toStatus(err)
	}
	s.noRecovery.Store(e.uid, time.Now())
	return s.storeSub(ctx, e, sn.Project)
}

func (p *subscriber) GetSubscription(ctx context.Context, req *pubsubpb.GetSubscriptionRequest) (*pubsubpb.Subscription, error) {
	sn, err := names.ParseSubscription(req.GetSubscription())
	if err != nil {
		return nil, err
	}
	e, ok := p.s.findSub(ctx, sn.ID)
	if !ok {
		return nil, notFound(sn.ID)
	}
	return p.s.renderSub(e, sn.Project), nil
}

// updatableSubFields are the UpdateSubscription mask paths we apply; name,
// topic, filter and enable_message_ordering are immutable, as on Google.
var updatableSubFields = map[string]bool{
	"ack_deadline_seconds":         true,
	"message_retention_duration":   true,
	"retain_acked_messages":        true,
	"labels":                       true,
	"expiration_policy":            true,
	"dead_letter_policy":           true,
	"retry_policy":                 true,
	"push_config":                  true,
	"enable_exactly_once_delivery": true,
}

func (p *subscriber) UpdateSubscription(ctx context.Context, req *pubsubpb.UpdateSubscriptionRequest) (*pubsubpb.Subscription, error) {
	if req.GetSubscription() == nil {
		return nil, invalidArgf("The subscription field is required.")
	}
	sn, err := names.ParseSubscription(req.GetSubscription().GetName())
	if err != nil {
		return nil, err
	}
	paths := req.GetUpdateMask().GetPaths()
	if len(paths) == 0 {
		return nil, invalidArgf("The update_mask in the UpdateSubscriptionRequest must be set.")
	}
	for _, path := range paths {
		if !updatableSubFields[path] {
			return nil, invalidArgf("Invalid update_mask provided in the UpdateSubscriptionRequest: the '%s' field is not updatable.", path)
		}
	}
	s := p.s
	s.adminMu.Lock()
	defer s.adminMu.Unlock()
	e, ok := s.findSub(ctx, sn.ID)
	if !ok {
		return nil, notFound(sn.ID)
	}
	sub := cloneSub(e.proto)
	in := req.GetSubscription()
	for _, path := range paths {
		switch path {
		case "ack_deadline_seconds":
			sub.AckDeadlineSeconds = in.GetAckDeadlineSeconds()
		case "message_retention_duration":
			sub.MessageRetentionDuration = in.GetMessageRetentionDuration()
		case "retain_acked_messages":
			sub.RetainAckedMessages = in.GetRetainAckedMessages()
		case "labels":
			sub.Labels = in.GetLabels()
		case "expiration_policy":
			sub.ExpirationPolicy = in.GetExpirationPolicy()
		case "dead_letter_policy":
			sub.DeadLetterPolicy = in.GetDeadLetterPolicy()
		case "retry_policy":
			sub.RetryPolicy = in.GetRetryPolicy()
		case "push_config":
			sub.PushConfig = in.GetPushConfig()
		case "enable_exactly_once_delivery":
			sub.EnableExactlyOnceDelivery = in.GetEnableExactlyOnceDelivery()
		}
	}
	if err := s.checkSubscription(sub); err != nil {
		return nil, err
	}
	ne := *e
	ne.proto = sub
	return s.storeSub(ctx, &ne, sn.Project)
}

func (p *subscriber) ListSubscriptions(ctx context.Context, req *pubsubpb.ListSubscriptionsRequest) (*pubsubpb.ListSubscriptionsResponse, error) {
	proj, err := names.ParseProject(req.GetProject())
	if err != nil {
		return nil, err
	}
	ids, next, err := page(p.s.cat.subIDs(), req.GetPageSize(), req.GetPageToken())
	if err != nil {
		return nil, err
	}
	resp := &pubsubpb.ListSubscriptionsResponse{NextPageToken: next}
	for _, id := range ids {
		if e, ok := p.s.cat.sub(id); ok {
			resp.Subscriptions = append(resp.Subscriptions, p.s.renderSub(e, proj.ID))
		}
	}
	return resp, nil
}

// DeleteSubscription removes the record first (fan-out stops at once),
// then drops the backlog and the leases.
func (p *subscriber) DeleteSubscription(ctx context.Context, req *pubsubpb.DeleteSubscriptionRequest) (*emptypb.Empty, error) {
	sn, err := names.ParseSubscription(req.GetSubscription())
	if err != nil {
		return nil, err
	}
	s := p.s
	s.adminMu.Lock()
	e, ok := s.findSub(ctx, sn.ID)
	if !ok {
		s.adminMu.Unlock()
		return nil, notFound(sn.ID)
	}
	err = s.topo.Delete(ctx, kindSubscription, sn.ID)
	s.adminMu.Unlock()
	if err != nil {
		return nil, toStatus(err)
	}
	// Outside the admin lock: ending a runtime waits for its poller's
	// backend Get (up to a second), and other admin calls need not wait
	// behind that. The record is gone, so no one can reach this
	// incarnation's queue any more.
	if err := s.dropBacklog(ctx, e); err != nil {
		// The subscription is gone, and a new one of the same id gets a
		// queue of its own: what is left waits for KubeMQ's retention.
		s.log.Warn("purging a deleted subscription's queue failed", zap.String("subscription", sn.ID), zap.Error(err))
	}
	return &emptypb.Empty{}, nil
}

// ModifyPushConfig switches a subscription between pull (an empty config)
// and push, or changes its endpoint; the pushers follow (push.go).
func (p *subscriber) ModifyPushConfig(ctx context.Context, req *pubsubpb.ModifyPushConfigRequest) (*emptypb.Empty, error) {
	sn, err := names.ParseSubscription(req.GetSubscription())
	if err != nil {
		return nil, err
	}
	pc := req.GetPushConfig()
	if pc == nil {
		pc = &pubsubpb.PushConfig{}
	}
	if err := limits.PushConfig(pc, true); err != nil {
		return nil, err
	}
	s := p.s
	if err := s.push.allowed(pc); err != nil {
		return nil, err
	}
	s.adminMu.Lock()
	defer s.adminMu.Unlock()
	e, ok := s.findSub(ctx, sn.ID)
	if !ok {
		return nil, notFound(sn.ID)
	}
	if e.proto.PushConfig == nil || !proto.Equal(e.proto.GetPushConfig(), pc) {
		ne := *e
		ne.proto = cloneSub(e.proto)
		ne.proto.PushConfig = proto.Clone(pc).(*pubsubpb.PushConfig)
		if err := s.putSub(ctx, &ne); err != nil {
			return nil, toStatus(err)
		}
	}
	return &emptypb.Empty{}, nil
}
