package gcp_test

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"google.golang.org/api/iterator"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	pubsubv1 "cloud.google.com/go/pubsub"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
)

func TestTopicAdmin(t *testing.T) {
	e := startEnv(t)
	c := e.v2()
	ctx := ctxT(t, 30*time.Second)
	ta := c.TopicAdminClient

	id := e.id("orders")
	got, err := ta.CreateTopic(ctx, &pubsubpb.Topic{Name: e.topicName(id), Labels: map[string]string{"a": "b"}, KmsKeyName: "projects/p/locations/l/keyRings/r/cryptoKeys/k"})
	if err != nil {
		t.Fatal(err)
	}
	if got.Name != e.topicName(id) || got.Labels["a"] != "b" || got.State != pubsubpb.Topic_ACTIVE {
		t.Fatalf("created %v", got)
	}
	_, err = ta.CreateTopic(ctx, &pubsubpb.Topic{Name: e.topicName(id)})
	wantCode(t, err, codes.AlreadyExists, "Resource already exists")

	for name, code := range map[string]codes.Code{
		e.topicName("ab"):              codes.InvalidArgument,
		e.topicName("sub.reserved"):    codes.InvalidArgument,
		e.topicName("goog-x"):          codes.InvalidArgument,
		"projects/" + e.project + "/x": codes.InvalidArgument,
	} {
		_, err := ta.CreateTopic(ctx, &pubsubpb.Topic{Name: name})
		wantCode(t, err, code, "")
	}
	_, err = ta.CreateTopic(ctx, &pubsubpb.Topic{Name: e.topicName(e.id("ingest")), IngestionDataSourceSettings: &pubsubpb.IngestionDataSourceSettings{}})
	wantCode(t, err, codes.InvalidArgument, "not supported")
	_, err = ta.CreateTopic(ctx, &pubsubpb.Topic{Name: e.topicName(e.id("short")), MessageRetentionDuration: durationpb.New(time.Minute)})
	wantCode(t, err, codes.InvalidArgument, "message_retention_duration")

	// Ids are global: another project sees the topic under its own name.
	other, err := ta.GetTopic(ctx, &pubsubpb.GetTopicRequest{Topic: "projects/other/topics/" + id})
	if err != nil || other.Name != "projects/other/topics/"+id {
		t.Fatalf("cross-project get: %v %v", other, err)
	}
	_, err = ta.GetTopic(ctx, &pubsubpb.GetTopicRequest{Topic: e.topicName(e.id("missing"))})
	wantCode(t, err, codes.NotFound, "Resource not found")

	up, err := ta.UpdateTopic(ctx, &pubsubpb.UpdateTopicRequest{
		Topic:      &pubsubpb.Topic{Name: e.topicName(id), Labels: map[string]string{"x": "y"}, MessageRetentionDuration: durationpb.New(time.Hour)},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"labels", "message_retention_duration"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if up.Labels["x"] != "y" || up.Labels["a"] != "" || up.MessageRetentionDuration.AsDuration() != time.Hour {
		t.Fatalf("updated %v", up)
	}
	_, err = ta.UpdateTopic(ctx, &pubsubpb.UpdateTopicRequest{Topic: &pubsubpb.Topic{Name: e.topicName(id)}, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"name"}}})
	wantCode(t, err, codes.InvalidArgument, "not updatable")
	_, err = ta.UpdateTopic(ctx, &pubsubpb.UpdateTopicRequest{Topic: &pubsubpb.Topic{Name: e.topicName(id)}})
	wantCode(t, err, codes.InvalidArgument, "update_mask")

	snaps := ta.ListTopicSnapshots(ctx, &pubsubpb.ListTopicSnapshotsRequest{Topic: e.topicName(id)})
	if _, err := snaps.Next(); !errors.Is(err, iterator.Done) {
		t.Fatalf("snapshots: %v", err)
	}

	// Paging: 7 more topics, pages of 3, every topic once and in order.
	want := []string{e.topicName(id)}
	for i := range 7 {
		n := e.topicName(e.id(fmt.Sprintf("page%d", i)))
		if _, err := ta.CreateTopic(ctx, &pubsubpb.Topic{Name: n}); err != nil {
			t.Fatal(err)
		}
		want = append(want, n)
	}
	slices.Sort(want)
	var seen []string
	var pages int
	req := &pubsubpb.ListTopicsRequest{Project: "projects/" + e.project, PageSize: 3}
	// The gapic iterator hides the pages; ask the wire directly.
	pc := rawPublisher(t, e)
	for {
		resp, err := pc.ListTopics(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		pages++
		for _, tp := range resp.Topics {
			seen = append(seen, tp.Name)
		}
		if resp.NextPageToken == "" {
			break
		}
		req.PageToken = resp.NextPageToken
	}
	if !slices.Equal(seen, want) || pages != 3 {
		t.Fatalf("paged %d pages: %v, want %v", pages, seen, want)
	}
	_, err = pc.ListTopics(ctx, &pubsubpb.ListTopicsRequest{Project: "projects/" + e.project, PageToken: "garbage!"})
	wantCode(t, err, codes.InvalidArgument, "page token")

	if err := ta.DeleteTopic(ctx, &pubsubpb.DeleteTopicRequest{Topic: e.topicName(id)}); err != nil {
		t.Fatal(err)
	}
	wantCode(t, ta.DeleteTopic(ctx, &pubsubpb.DeleteTopicRequest{Topic: e.topicName(id)}), codes.NotFound, "")
}

func rawPublisher(t testing.TB, e *env) pubsubpb.PublisherClient {
	conn, err := grpc.NewClient(e.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return pubsubpb.NewPublisherClient(conn)
}

func rawSubscriber(t testing.TB, e *env) pubsubpb.SubscriberClient {
	conn, err := grpc.NewClient(e.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return pubsubpb.NewSubscriberClient(conn)
}

func TestDeleteTopicKeepsSubscriptions(t *testing.T) {
	e := startEnv(t)
	c := e.v2()
	ctx := ctxT(t, 30*time.Second)
	tid, sid := e.id("t"), e.id("s")
	if _, err := c.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: e.topicName(tid)}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{Name: e.subName(sid), Topic: e.topicName(tid)}); err != nil {
		t.Fatal(err)
	}
	pc := rawPublisher(t, e)
	ls, err := pc.ListTopicSubscriptions(ctx, &pubsubpb.ListTopicSubscriptionsRequest{Topic: e.topicName(tid)})
	if err != nil || !slices.Equal(ls.Subscriptions, []string{e.subName(sid)}) {
		t.Fatalf("topic subs: %v %v", ls, err)
	}
	if err := c.TopicAdminClient.DeleteTopic(ctx, &pubsubpb.DeleteTopicRequest{Topic: e.topicName(tid)}); err != nil {
		t.Fatal(err)
	}
	s, err := c.SubscriptionAdminClient.GetSubscription(ctx, &pubsubpb.GetSubscriptionRequest{Subscription: e.subName(sid)})
	if err != nil || s.Topic != "_deleted-topic_" {
		t.Fatalf("after delete: %v %v", s, err)
	}
	// A new topic of the same name does not adopt the old subscription.
	if _, err := c.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: e.topicName(tid)}); err != nil {
		t.Fatal(err)
	}
	s, err = c.SubscriptionAdminClient.GetSubscription(ctx, &pubsubpb.GetSubscriptionRequest{Subscription: e.subName(sid)})
	if err != nil || s.Topic != "_deleted-topic_" {
		t.Fatalf("after re-create: %v %v", s, err)
	}
	ls, err = pc.ListTopicSubscriptions(ctx, &pubsubpb.ListTopicSubscriptionsRequest{Topic: e.topicName(tid)})
	if err != nil || len(ls.Subscriptions) != 0 {
		t.Fatalf("re-created topic subs: %v %v", ls, err)
	}
}

func TestSubscriptionAdmin(t *testing.T) {
	e := startEnv(t)
	c := e.v2()
	ctx := ctxT(t, 30*time.Second)
	sa := c.SubscriptionAdminClient
	tid, dlq := e.id("t"), e.id("dlq")
	for _, id := range []string{tid, dlq} {
		if _, err := c.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: e.topicName(id)}); err != nil {
			t.Fatal(err)
		}
	}
	sid := e.id("s")
	s, err := sa.CreateSubscription(ctx, &pubsubpb.Subscription{Name: e.subName(sid), Topic: e.topicName(tid)})
	if err != nil {
		t.Fatal(err)
	}
	if s.AckDeadlineSeconds != 10 || s.MessageRetentionDuration.AsDuration() != 7*24*time.Hour || s.Topic != e.topicName(tid) || s.State != pubsubpb.Subscription_ACTIVE ||
		s.PushConfig == nil || s.PushConfig.PushEndpoint != "" {
		t.Fatalf("defaults: %v", s)
	}
	_, err = sa.CreateSubscription(ctx, &pubsubpb.Subscription{Name: e.subName(sid), Topic: e.topicName(tid)})
	wantCode(t, err, codes.AlreadyExists, "")

	bad := map[string]struct {
		sub  *pubsubpb.Subscription
		code codes.Code
	}{
		"ack 5":          {&pubsubpb.Subscription{AckDeadlineSeconds: 5}, codes.InvalidArgument},
		"ack 601":        {&pubsubpb.Subscription{AckDeadlineSeconds: 601}, codes.InvalidArgument},
		"no topic":       {&pubsubpb.Subscription{Topic: e.topicName(e.id("nope"))}, codes.NotFound},
		"dlq attempts 3": {&pubsubpb.Subscription{DeadLetterPolicy: &pubsubpb.DeadLetterPolicy{DeadLetterTopic: e.topicName(dlq), MaxDeliveryAttempts: 3}}, codes.InvalidArgument},
		"dlq missing":    {&pubsubpb.Subscription{DeadLetterPolicy: &pubsubpb.DeadLetterPolicy{DeadLetterTopic: e.topicName(e.id("nope"))}}, codes.NotFound},
		"push":           {&pubsubpb.Subscription{PushConfig: &pubsubpb.PushConfig{PushEndpoint: "https://example.com/push"}}, codes.Unimplemented},
		"bigquery":       {&pubsubpb.Subscription{BigqueryConfig: &pubsubpb.BigQueryConfig{Table: "p.d.t"}}, codes.InvalidArgument},
		"retry":          {&pubsubpb.Subscription{RetryPolicy: &pubsubpb.RetryPolicy{MinimumBackoff: durationpb.New(time.Hour)}}, codes.InvalidArgument},
		"retention":      {&pubsubpb.Subscription{MessageRetentionDuration: durationpb.New(time.Second)}, codes.InvalidArgument},
		"filter syntax":  {&pubsubpb.Subscription{Filter: "attributes.a = "}, codes.InvalidArgument},
		"bad name":       {&pubsubpb.Subscription{Name: e.subName("x")}, codes.InvalidArgument},
	}
	for name, tc := range bad {
		sub := tc.sub
		if sub.Name == "" {
			sub.Name = e.subName(e.id("bad"))
		}
		if sub.Topic == "" {
			sub.Topic = e.topicName(tid)
		}
		_, err := sa.CreateSubscription(ctx, sub)
		st := codes.OK
		if err != nil {
			st = statusCode(err)
		}
		if st != tc.code {
			t.Errorf("%s: got %v, want %v", name, err, tc.code)
		}
	}

	s2, err := sa.CreateSubscription(ctx, &pubsubpb.Subscription{
		Name: e.subName(e.id("dl")), Topic: e.topicName(tid),
		DeadLetterPolicy: &pubsubpb.DeadLetterPolicy{DeadLetterTopic: e.topicName(dlq)},
		RetryPolicy:      &pubsubpb.RetryPolicy{MinimumBackoff: durationpb.New(time.Second)},
	})
	if err != nil {
		t.Fatal(err)
	}
	if s2.DeadLetterPolicy.MaxDeliveryAttempts != 5 || s2.RetryPolicy.MaximumBackoff.AsDuration() != 600*time.Second {
		t.Fatalf("dlq/retry defaults: %v", s2)
	}

	up, err := sa.UpdateSubscription(ctx, &pubsubpb.UpdateSubscriptionRequest{
		Subscription: &pubsubpb.Subscription{Name: e.subName(sid), AckDeadlineSeconds: 42, Labels: map[string]string{"k": "v"}},
		UpdateMask:   &fieldmaskpb.FieldMask{Paths: []string{"ack_deadline_seconds", "labels"}},
	})
	if err != nil || up.AckDeadlineSeconds != 42 || up.Labels["k"] != "v" {
		t.Fatalf("update: %v %v", up, err)
	}
	for _, path := range []string{"filter", "topic", "enable_message_ordering"} {
		_, err = sa.UpdateSubscription(ctx, &pubsubpb.UpdateSubscriptionRequest{
			Subscription: &pubsubpb.Subscription{Name: e.subName(sid)},
			UpdateMask:   &fieldmaskpb.FieldMask{Paths: []string{path}},
		})
		wantCode(t, err, codes.InvalidArgument, "not updatable")
	}
	_, err = sa.UpdateSubscription(ctx, &pubsubpb.UpdateSubscriptionRequest{
		Subscription: &pubsubpb.Subscription{Name: e.subName(sid), AckDeadlineSeconds: 1000},
		UpdateMask:   &fieldmaskpb.FieldMask{Paths: []string{"ack_deadline_seconds"}},
	})
	wantCode(t, err, codes.InvalidArgument, "ack")

	if err := sa.ModifyPushConfig(ctx, &pubsubpb.ModifyPushConfigRequest{Subscription: e.subName(sid), PushConfig: &pubsubpb.PushConfig{}}); err != nil {
		t.Fatal(err)
	}
	err = sa.ModifyPushConfig(ctx, &pubsubpb.ModifyPushConfigRequest{Subscription: e.subName(sid), PushConfig: &pubsubpb.PushConfig{PushEndpoint: "https://example.com/x"}})
	wantCode(t, err, codes.Unimplemented, "")
	_, err = sa.Seek(ctx, &pubsubpb.SeekRequest{Subscription: e.subName(sid), Target: &pubsubpb.SeekRequest_Snapshot{Snapshot: "projects/" + e.project + "/snapshots/no-such"}})
	wantCode(t, err, codes.NotFound, "")

	var listed []string
	it := sa.ListSubscriptions(ctx, &pubsubpb.ListSubscriptionsRequest{Project: "projects/" + e.project})
	for {
		s, err := it.Next()
		if errors.Is(err, iterator.Done) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		listed = append(listed, s.Name)
	}
	if want := []string{e.subName(e.id("dl")), e.subName(sid)}; !slices.Equal(listed, want) {
		t.Fatalf("listed %v, want %v", listed, want)
	}

	// Detach: flagged, left out of the topic's list.
	if _, err := c.TopicAdminClient.DetachSubscription(ctx, &pubsubpb.DetachSubscriptionRequest{Subscription: e.subName(sid)}); err != nil {
		t.Fatal(err)
	}
	if s, err := sa.GetSubscription(ctx, &pubsubpb.GetSubscriptionRequest{Subscription: e.subName(sid)}); err != nil || !s.Detached {
		t.Fatalf("detached: %v %v", s, err)
	}
	ls, err := rawPublisher(t, e).ListTopicSubscriptions(ctx, &pubsubpb.ListTopicSubscriptionsRequest{Topic: e.topicName(tid)})
	if err != nil || !slices.Equal(ls.Subscriptions, []string{e.subName(e.id("dl"))}) {
		t.Fatalf("after detach: %v %v", ls, err)
	}

	if err := sa.DeleteSubscription(ctx, &pubsubpb.DeleteSubscriptionRequest{Subscription: e.subName(sid)}); err != nil {
		t.Fatal(err)
	}
	_, err = sa.GetSubscription(ctx, &pubsubpb.GetSubscriptionRequest{Subscription: e.subName(sid)})
	wantCode(t, err, codes.NotFound, "")
	wantCode(t, sa.DeleteSubscription(ctx, &pubsubpb.DeleteSubscriptionRequest{Subscription: e.subName(sid)}), codes.NotFound, "")
}

func statusCode(err error) codes.Code { return status.Code(err) }

func TestReadinessGate(t *testing.T) {
	e := startEnv(t)
	down := errors.New("kubemq down for the test")
	e.ready.Store(&down)
	ctx := ctxT(t, 10*time.Second)
	_, err := rawPublisher(t, e).GetTopic(ctx, &pubsubpb.GetTopicRequest{Topic: e.topicName("abc")})
	wantCode(t, err, codes.Unavailable, "kubemq down for the test")
	stream, err := rawSubscriber(t, e).StreamingPull(ctx)
	if err == nil {
		_, err = stream.Recv()
	}
	wantCode(t, err, codes.Unavailable, "not ready")
	e.ready.Store(nil)
	_, err = rawPublisher(t, e).GetTopic(ctx, &pubsubpb.GetTopicRequest{Topic: e.topicName("abc")})
	wantCode(t, err, codes.NotFound, "")
}

// TestV1ClientAdmin drives the admin surface through the previous client
// generation, which wraps the same wire service.
func TestV1ClientAdmin(t *testing.T) {
	e := startEnv(t)
	c := e.v1()
	ctx := ctxT(t, 30*time.Second)
	tp, err := c.CreateTopic(ctx, e.id("v1topic"))
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := tp.Exists(ctx); err != nil || !ok {
		t.Fatalf("exists: %v %v", ok, err)
	}
	if _, err := c.CreateTopic(ctx, e.id("v1topic")); statusCode(err) != codes.AlreadyExists {
		t.Fatalf("second create: %v", err)
	}
	sub, err := c.CreateSubscription(ctx, e.id("v1sub"), pubsubv1.SubscriptionConfig{Topic: tp, AckDeadline: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := sub.Config(ctx)
	if err != nil || cfg.AckDeadline != 20*time.Second || cfg.Topic.ID() != e.id("v1topic") {
		t.Fatalf("config: %+v %v", cfg, err)
	}
	if _, err := sub.Update(ctx, pubsubv1.SubscriptionConfigToUpdate{AckDeadline: 30 * time.Second}); err != nil {
		t.Fatal(err)
	}
	var topics []string
	for it := c.Topics(ctx); ; {
		tt, err := it.Next()
		if errors.Is(err, iterator.Done) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		topics = append(topics, tt.ID())
	}
	if !slices.Equal(topics, []string{e.id("v1topic")}) {
		t.Fatalf("topics %v", topics)
	}
	var subs []string
	for it := tp.Subscriptions(ctx); ; {
		s, err := it.Next()
		if errors.Is(err, iterator.Done) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		subs = append(subs, s.ID())
	}
	if !slices.Equal(subs, []string{e.id("v1sub")}) {
		t.Fatalf("subs %v", subs)
	}
	if err := tp.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	cfg, err = sub.Config(ctx)
	if err != nil || cfg.Topic.String() != "_deleted-topic_" {
		t.Fatalf("after delete: %+v %v", cfg, err)
	}
	if err := sub.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	if ok, err := sub.Exists(ctx); err != nil || ok {
		t.Fatalf("sub exists after delete: %v %v", ok, err)
	}
}
