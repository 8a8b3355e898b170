package gcp

import (
	"context"
	"crypto/rand"
	"encoding/hex"

	"google.golang.org/protobuf/types/known/emptypb"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/kubemq-io/kubemq-proxy/gcp/limits"
	"github.com/kubemq-io/kubemq-proxy/gcp/names"
)

// publisher serves google.pubsub.v1.Publisher.
type publisher struct {
	pubsubpb.UnimplementedPublisherServer
	s *Server
}

func newUID() string {
	var b [12]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// renderTopic is the topic as the caller sees it: named in the caller's
// project (ids are global), its schema settings as they stand now
// (schemacatalog.go).
func (c *catalog) renderTopic(e *topicEntry, project string) *pubsubpb.Topic {
	t := cloneTopic(e.proto)
	t.Name = names.TopicName{Project: project, ID: e.id}.String()
	c.renderSchemaSettings(e, t, project)
	return t
}

func (p *publisher) CreateTopic(ctx context.Context, req *pubsubpb.Topic) (*pubsubpb.Topic, error) {
	tn, err := names.ParseTopic(req.GetName())
	if err != nil {
		return nil, err
	}
	if err := validateTopic(req); err != nil {
		return nil, err
	}
	s := p.s
	s.adminMu.Lock()
	defer s.adminMu.Unlock()
	if _, ok := s.cat.topic(tn.ID); ok {
		return nil, alreadyExists(tn.ID)
	}
	t := cloneTopic(req)
	t.State = pubsubpb.Topic_ACTIVE
	var schemaUID string
	if t.SchemaSettings, schemaUID, err = s.cat.bindSchemaSettings(req.GetSchemaSettings()); err != nil {
		return nil, err
	}
	rec, err := encodeTopic(newUID(), t, schemaUID)
	if err != nil {
		return nil, toStatus(err)
	}
	if err := s.topo.Put(ctx, kindTopic, tn.ID, rec); err != nil {
		return nil, toStatus(err)
	}
	e, ok := s.cat.topic(tn.ID)
	if !ok {
		return nil, toStatus(errNotApplied)
	}
	return p.s.cat.renderTopic(e, tn.Project), nil
}

func (p *publisher) GetTopic(ctx context.Context, req *pubsubpb.GetTopicRequest) (*pubsubpb.Topic, error) {
	tn, err := names.ParseTopic(req.GetTopic())
	if err != nil {
		return nil, err
	}
	e, ok := p.s.findTopic(ctx, tn.ID)
	if !ok {
		return nil, notFound(tn.ID)
	}
	return p.s.cat.renderTopic(e, tn.Project), nil
}

// updatableTopicFields are the UpdateTopic mask paths we apply.
var updatableTopicFields = map[string]bool{
	"labels":                     true,
	"message_retention_duration": true,
	"schema_settings":            true,
	"kms_key_name":               true, // accepted and ignored, like at create
	"message_storage_policy":     true, // single region: accepted and ignored
}

func (p *publisher) UpdateTopic(ctx context.Context, req *pubsubpb.UpdateTopicRequest) (*pubsubpb.Topic, error) {
	if req.GetTopic() == nil {
		return nil, invalidArgf("The topic field is required.")
	}
	tn, err := names.ParseTopic(req.GetTopic().GetName())
	if err != nil {
		return nil, err
	}
	paths := req.GetUpdateMask().GetPaths()
	if len(paths) == 0 {
		return nil, invalidArgf("The update_mask in the UpdateTopicRequest must be set.")
	}
	for _, path := range paths {
		if !updatableTopicFields[path] && schemaSettingsPaths[path] == nil {
			return nil, invalidArgf("Invalid update_mask provided in the UpdateTopicRequest: the '%s' field is not updatable.", path)
		}
	}
	s := p.s
	s.adminMu.Lock()
	defer s.adminMu.Unlock()
	e, ok := s.findTopic(ctx, tn.ID)
	if !ok {
		return nil, notFound(tn.ID)
	}
	t := cloneTopic(e.proto)
	in := req.GetTopic()
	schemaUID, bindSchema := e.schemaUID, false
	for _, path := range paths {
		if path == "schema_settings" || schemaSettingsPaths[path] != nil {
			mergeSchemaSettings(t, in.GetSchemaSettings(), path)
			bindSchema = true
			continue
		}
		switch path {
		case "labels":
			t.Labels = in.GetLabels()
		case "message_retention_duration":
			t.MessageRetentionDuration = in.GetMessageRetentionDuration()
		case "kms_key_name":
			t.KmsKeyName = in.GetKmsKeyName()
		case "message_storage_policy":
			t.MessageStoragePolicy = in.GetMessageStoragePolicy()
		}
	}
	if err := validateTopic(t); err != nil {
		return nil, err
	}
	if bindSchema {
		if t.SchemaSettings, schemaUID, err = s.cat.bindSchemaSettings(t.GetSchemaSettings()); err != nil {
			return nil, err
		}
	}
	rec, err := encodeTopic(e.uid, t, schemaUID)
	if err != nil {
		return nil, toStatus(err)
	}
	if err := s.topo.Put(ctx, kindTopic, tn.ID, rec); err != nil {
		return nil, toStatus(err)
	}
	if e, ok = s.cat.topic(tn.ID); !ok {
		return nil, toStatus(errNotApplied)
	}
	return p.s.cat.renderTopic(e, tn.Project), nil
}

func (p *publisher) ListTopics(ctx context.Context, req *pubsubpb.ListTopicsRequest) (*pubsubpb.ListTopicsResponse, error) {
	proj, err := names.ParseProject(req.GetProject())
	if err != nil {
		return nil, err
	}
	ids, next, err := page(p.s.cat.topicIDs(), req.GetPageSize(), req.GetPageToken())
	if err != nil {
		return nil, err
	}
	resp := &pubsubpb.ListTopicsResponse{NextPageToken: next}
	for _, id := range ids {
		if e, ok := p.s.cat.topic(id); ok {
			resp.Topics = append(resp.Topics, p.s.cat.renderTopic(e, proj.ID))
		}
	}
	return resp, nil
}

func (p *publisher) ListTopicSubscriptions(ctx context.Context, req *pubsubpb.ListTopicSubscriptionsRequest) (*pubsubpb.ListTopicSubscriptionsResponse, error) {
	tn, err := names.ParseTopic(req.GetTopic())
	if err != nil {
		return nil, err
	}
	e, ok := p.s.findTopic(ctx, tn.ID)
	if !ok {
		return nil, notFound(tn.ID)
	}
	ids, next, err := page(p.s.cat.topicSubs(e), req.GetPageSize(), req.GetPageToken())
	if err != nil {
		return nil, err
	}
	resp := &pubsubpb.ListTopicSubscriptionsResponse{NextPageToken: next}
	for _, id := range ids {
		resp.Subscriptions = append(resp.Subscriptions, names.SubscriptionName{Project: tn.Project, ID: id}.String())
	}
	return resp, nil
}

// DeleteTopic follows Google: the subscriptions survive, keep their
// backlog, report topic "_deleted-topic_" and never attach to a topic
// created later under the same id (they are bound to this incarnation's
// uid). The topic log stays in KubeMQ until its retention ends.
func (p *publisher) DeleteTopic(ctx context.Context, req *pubsubpb.DeleteTopicRequest) (*emptypb.Empty, error) {
	tn, err := names.ParseTopic(req.GetTopic())
	if err != nil {
		return nil, err
	}
	s := p.s
	s.adminMu.Lock()
	defer s.adminMu.Unlock()
	if _, ok := s.findTopic(ctx, tn.ID); !ok {
		return nil, notFound(tn.ID)
	}
	if err := s.topo.Delete(ctx, kindTopic, tn.ID); err != nil {
		return nil, toStatus(err)
	}
	return &emptypb.Empty{}, nil
}

// DetachSubscription marks the subscription detached: fan-out skips it,
// its backlog and leases are dropped, and Pull/StreamingPull answer
// FAILED_PRECONDITION.
func (p *publisher) DetachSubscription(ctx context.Context, req *pubsubpb.DetachSubscriptionRequest) (*pubsubpb.DetachSubscriptionResponse, error) {
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
	if !e.proto.Detached {
		ne := *e
		ne.proto = cloneSub(e.proto)
		ne.proto.Detached = true
		ne.proto.State = pubsubpb.Subscription_ACTIVE
		if err := s.putSub(ctx, &ne); err != nil {
			s.adminMu.Unlock()
			return nil, toStatus(err)
		}
	}
	s.adminMu.Unlock()
	if err := s.dropBacklog(ctx, e); err != nil {
		return nil, toStatus(err)
	}
	return &pubsubpb.DetachSubscriptionResponse{}, nil
}

// validateTopic checks the settings a topic may carry; schema settings
// are checked against the catalog by bindSchemaSettings.
func validateTopic(t *pubsubpb.Topic) error {
	return limits.Topic(t)
}
