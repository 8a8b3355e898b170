package gcp

import (
	"context"
	"time"

	"golang.org/x/sync/errgroup"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/kubemq-io/kubemq-proxy/gcp/names"
	"github.com/kubemq-io/kubemq-proxy/kubemqclient"
)

// Publish validates the whole request (limits, then the topic's schema),
// then stores every message once in the topic log and once per matching
// subscription, and answers with the ids (in request order) only when
// every copy is stored: a returned id means the message is durable in
// every subscription.
func (p *publisher) Publish(ctx context.Context, req *pubsubpb.PublishRequest) (*pubsubpb.PublishResponse, error) {
	start := time.Now()
	tn, err := names.ParseTopic(req.GetTopic())
	if err != nil {
		return nil, err
	}
	s := p.s
	if err := s.pubLimits.Validate(req.GetTopic(), req.GetMessages()); err != nil {
		return nil, err
	}
	if err := checkReservedAttributes(req.GetMessages()); err != nil {
		return nil, err
	}
	t, ok := s.findTopic(ctx, tn.ID)
	if !ok {
		return nil, notFound(tn.ID)
	}
	if t.proto.GetSchemaSettings() != nil {
		// Every message is checked before anything is stored; the schema
		// attributes are added to the request's messages (schematopic.go).
		ts, err := s.resolveTopicSchema(t, tn.Project)
		if err != nil {
			return nil, err
		}
		if err := ts.enforce(req.GetMessages()); err != nil {
			return nil, err
		}
	}
	// FailFast: a KubeMQ that stops answering fails the publish with
	// UNAVAILABLE when the outage is detected (kubemq.outage_detection)
	// rather than at the client's deadline; the client retries.
	ids, err := s.publish(kubemqclient.FailFast(ctx), t, req.GetMessages())
	if err != nil {
		return nil, toStatus(err)
	}
	s.m.publishLatency.Observe(time.Since(start).Seconds())
	label := s.m.topic(tn.ID)
	s.m.published.WithLabelValues(label).Add(float64(len(ids)))
	s.m.publishedBytes.WithLabelValues(label).Add(float64(messagesBytes(req.GetMessages())))
	return &pubsubpb.PublishResponse{MessageIds: ids}, nil
}

// messagesBytes is the data and attribute size of msgs (for metrics).
func messagesBytes(msgs []*pubsubpb.PubsubMessage) int {
	n := 0
	for _, m := range msgs {
		n += len(m.GetData())
		for k, v := range m.GetAttributes() {
			n += len(k) + len(v)
		}
	}
	return n
}

// checkReservedAttributes refuses attributes named like the reserved tags:
// they would be overwritten in KubeMQ and stripped on delivery.
func checkReservedAttributes(msgs []*pubsubpb.PubsubMessage) error {
	for _, m := range msgs {
		for k := range m.GetAttributes() {
			if isReservedTag(k) {
				return status.Errorf(codes.InvalidArgument,
					"The attribute %q in the request has a key reserved by kubemq-proxy.", k)
			}
		}
	}
	return nil
}

// publish stores already validated messages in the topic log (the source
// of truth for native readers and replay) and in every subscription. It is
// also the dead-letter path's way to republish.
func (s *Server) publish(ctx context.Context, t *topicEntry, msgs []*pubsubpb.PubsubMessage) ([]string, error) {
	defer s.pubs.begin()() // a seek waits for it (seek.go)
	now := time.Now()
	ids := make([]string, len(msgs))
	events := make([]kubemqclient.Event, len(msgs))
	channel := topicChannel(t.id)
	published := formatPublishTime(now) // one publish time for the batch
	for i, m := range msgs {
		ids[i] = s.ids.next()
		events[i] = kubemqclient.Event{
			EventID:  ids[i],
			Channel:  channel,
			Metadata: messageMetadata,
			Body:     m.GetData(),
			Tags:     encodeTags(m.GetAttributes(), ids[i], published, m.GetOrderingKey()),
		}
	}
	subs := s.cat.fanout(t)
	copies := make([]kubemqclient.QueueMessage, 0, len(subs)*len(msgs))
	var links []chainLink
	for _, sub := range subs {
		ordered := sub.proto.GetEnableMessageOrdering()
		for i, m := range msgs {
			if sub.match != nil && !sub.match(m.GetAttributes()) {
				continue // filtered out: never enqueued, as Google acks it for the subscriber
			}
			tags := events[i].Tags
			if key := m.GetOrderingKey(); ordered && key != "" {
				l := s.chains.link(sub.queue, key, ids[i], now)
				links = append(links, l)
				if l.prev != "" {
					tags = withTag(tags, TagPrevID, l.prev)
				}
			}
			copies = append(copies, subscriptionCopy(sub.queue, ids[i], events[i].Body, tags))
		}
	}
	// The log and the copies are written concurrently: the answer waits
	// for both, and a failure of either fails the request (the client's
	// retry may then duplicate what was stored: at-least-once).
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return s.be.appendLog(gctx, events) })
	if len(copies) > 0 {
		g.Go(func() error { return s.be.enqueue(gctx, copies) })
	}
	if err := g.Wait(); err != nil {
		// The client's retry stores these messages under new ids: the next copy of each
		// key links to what was stored before them.
		s.chains.unlink(links)
		return nil, err
	}
	return ids, nil
}
