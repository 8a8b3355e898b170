package limits

import (
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

func wantCode(t *testing.T, what string, err error, code codes.Code) {
	t.Helper()
	if status.Code(err) != code {
		t.Fatalf("%s: got %v, want %v", what, err, code)
	}
}

func TestAckDeadline(t *testing.T) {
	for in, want := range map[int32]int32{0: 10, 10: 10, 60: 60, 600: 600} {
		got, err := AckDeadline(in)
		if err != nil || got != want {
			t.Fatalf("AckDeadline(%d) = %d, %v", in, got, err)
		}
	}
	for _, in := range []int32{1, 9, 601, -1} {
		_, err := AckDeadline(in)
		wantCode(t, "ack deadline", err, codes.InvalidArgument)
	}
	_, err := AckDeadline(5)
	if want := "Invalid ack deadline given (ack_deadline=5). The ack deadline must be between 10 and 600 seconds."; status.Convert(err).Message() != want {
		t.Fatalf("got %q", status.Convert(err).Message())
	}
}

func TestModifyAckDeadline(t *testing.T) {
	for _, in := range []int32{0, 1, 9, 10, 600} {
		if err := ModifyAckDeadline(in); err != nil {
			t.Fatalf("%d: %v", in, err)
		}
	}
	err := ModifyAckDeadline(715)
	if want := "Invalid ack deadline given (ack_deadline=715). The ack deadline must be between 0 and 600 seconds."; status.Convert(err).Message() != want {
		t.Fatalf("got %v", err)
	}
	wantCode(t, "negative", ModifyAckDeadline(-1), codes.InvalidArgument)
}

func TestStreamAckDeadline(t *testing.T) {
	for _, in := range []int32{10, 600} {
		if err := StreamAckDeadline(in); err != nil {
			t.Fatal(err)
		}
	}
	for _, in := range []int32{0, 9, 601} {
		wantCode(t, "stream deadline", StreamAckDeadline(in), codes.InvalidArgument)
	}
}

func TestPullMaxMessages(t *testing.T) {
	for in, want := range map[int32]int32{1: 1, 1000: 1000, 5000: 1000} {
		got, err := PullMaxMessages(in)
		if err != nil || got != want {
			t.Fatalf("%d: %d %v", in, got, err)
		}
	}
	_, err := PullMaxMessages(0)
	if want := "The value for max_messages is too small. You passed 0 in the request, but the minimum value is 1."; status.Convert(err).Message() != want {
		t.Fatalf("got %v", err)
	}
}

func TestRetention(t *testing.T) {
	day := 24 * time.Hour
	if d, err := SubscriptionRetention(nil); err != nil || d != 7*day {
		t.Fatal(d, err)
	}
	if d, err := TopicRetention(nil); err != nil || d != 0 {
		t.Fatal(d, err)
	}
	for _, v := range []time.Duration{10 * time.Minute, day, 7 * day, 31 * day} {
		if d, err := SubscriptionRetention(durationpb.New(v)); err != nil || d != v {
			t.Fatalf("sub %v: %v %v", v, d, err)
		}
		if d, err := TopicRetention(durationpb.New(v)); err != nil || d != v {
			t.Fatalf("topic %v: %v %v", v, d, err)
		}
	}
	for _, v := range []time.Duration{0, 10*time.Minute - time.Second, 31*day + time.Second, -time.Hour} {
		_, err := SubscriptionRetention(durationpb.New(v))
		wantCode(t, "sub retention", err, codes.InvalidArgument)
		_, err = TopicRetention(durationpb.New(v))
		wantCode(t, "topic retention", err, codes.InvalidArgument)
	}
	_, err := TopicRetention(durationpb.New(time.Minute))
	if want := "Invalid message_retention_duration given (60s). It must be between 600s and 2678400s."; status.Convert(err).Message() != want {
		t.Fatalf("got %q", status.Convert(err).Message())
	}
	// Malformed durations (mixed signs) are refused, not misread.
	_, err = SubscriptionRetention(&durationpb.Duration{Seconds: 3600, Nanos: -1})
	wantCode(t, "malformed", err, codes.InvalidArgument)
}

func TestRetryPolicy(t *testing.T) {
	if _, ok, err := RetryPolicy(nil); ok || err != nil {
		t.Fatal(ok, err)
	}
	b, ok, err := RetryPolicy(&pubsubpb.RetryPolicy{})
	if err != nil || !ok || b != (Backoff{Min: 10 * time.Second, Max: 600 * time.Second}) {
		t.Fatal(b, ok, err)
	}
	b, _, err = RetryPolicy(&pubsubpb.RetryPolicy{MinimumBackoff: durationpb.New(0), MaximumBackoff: durationpb.New(500 * time.Millisecond)})
	if err != nil || b != (Backoff{Min: 0, Max: 500 * time.Millisecond}) {
		t.Fatal(b, err)
	}
	b, _, err = RetryPolicy(&pubsubpb.RetryPolicy{MinimumBackoff: durationpb.New(time.Second)})
	if err != nil || b != (Backoff{Min: time.Second, Max: 600 * time.Second}) {
		t.Fatal(b, err)
	}
	bad := []*pubsubpb.RetryPolicy{
		{MinimumBackoff: durationpb.New(601 * time.Second)},
		{MaximumBackoff: durationpb.New(601 * time.Second)},
		{MinimumBackoff: durationpb.New(-time.Second)},
		{MinimumBackoff: durationpb.New(20 * time.Second), MaximumBackoff: durationpb.New(15 * time.Second)},
		{MaximumBackoff: durationpb.New(5 * time.Second)}, // default min 10 s exceeds it
	}
	for _, p := range bad {
		_, _, err := RetryPolicy(p)
		wantCode(t, p.String(), err, codes.InvalidArgument)
	}
	_, _, err = RetryPolicy(&pubsubpb.RetryPolicy{MaximumBackoff: durationpb.New(700 * time.Second)})
	if want := "Invalid maximum_backoff given (700s). It must be between 0s and 600s."; status.Convert(err).Message() != want {
		t.Fatalf("got %q", status.Convert(err).Message())
	}
}

func TestDeadLetterAttempts(t *testing.T) {
	dlt := "projects/p/topics/dlq"
	if _, ok, err := DeadLetterAttempts(nil); ok || err != nil {
		t.Fatal(ok, err)
	}
	if _, ok, err := DeadLetterAttempts(&pubsubpb.DeadLetterPolicy{MaxDeliveryAttempts: 7}); ok || err != nil {
		t.Fatal("a policy without a topic is no policy", ok, err)
	}
	for in, want := range map[int32]int32{0: 5, 5: 5, 42: 42, 100: 100} {
		got, ok, err := DeadLetterAttempts(&pubsubpb.DeadLetterPolicy{DeadLetterTopic: dlt, MaxDeliveryAttempts: in})
		if err != nil || !ok || got != want {
			t.Fatalf("%d: %d %v %v", in, got, ok, err)
		}
	}
	for _, in := range []int32{1, 4, 101, -5} {
		_, _, err := DeadLetterAttempts(&pubsubpb.DeadLetterPolicy{DeadLetterTopic: dlt, MaxDeliveryAttempts: in})
		wantCode(t, "attempts", err, codes.InvalidArgument)
	}
}

func TestExpirationTTL(t *testing.T) {
	day := 24 * time.Hour
	if d, err := ExpirationTTL(nil); err != nil || d != 31*day {
		t.Fatal(d, err)
	}
	if d, err := ExpirationTTL(&pubsubpb.ExpirationPolicy{}); err != nil || d != 0 {
		t.Fatal("policy without ttl never expires", d, err)
	}
	if d, err := ExpirationTTL(&pubsubpb.ExpirationPolicy{Ttl: durationpb.New(day)}); err != nil || d != day {
		t.Fatal(d, err)
	}
	if d, err := ExpirationTTL(&pubsubpb.ExpirationPolicy{Ttl: durationpb.New(365 * day)}); err != nil || d != 365*day {
		t.Fatal(d, err)
	}
	_, err := ExpirationTTL(&pubsubpb.ExpirationPolicy{Ttl: durationpb.New(day - time.Second)})
	wantCode(t, "short ttl", err, codes.InvalidArgument)
	_, err = ExpirationTTL(&pubsubpb.ExpirationPolicy{Ttl: durationpb.New(0)})
	wantCode(t, "zero ttl", err, codes.InvalidArgument)
}

func TestPushConfig(t *testing.T) {
	good := []string{"", "https://example.com/push", "https://example.com:8443/a?b=c", "HTTPS://EXAMPLE.COM/x",
		"http://localhost:8080/push", "http://127.0.0.1/push", "http://[::1]:9000/"}
	for _, ep := range good {
		if err := PushConfig(&pubsubpb.PushConfig{PushEndpoint: ep}, false); err != nil {
			t.Fatalf("%q: %v", ep, err)
		}
	}
	if err := PushConfig(nil, false); err != nil {
		t.Fatal(err)
	}
	bad := []string{"http://example.com/push", "ftp://example.com", "example.com/push", "/push", "https://", "https:///x",
		"https://user:pw@example.com/", "mailto:a@b.c", "::", "https://exa mple.com/"}
	for _, ep := range bad {
		err := PushConfig(&pubsubpb.PushConfig{PushEndpoint: ep}, false)
		wantCode(t, ep, err, codes.InvalidArgument)
		if !strings.Contains(status.Convert(err).Message(), "Invalid push endpoint given (endpoint="+ep+")") {
			t.Fatalf("%q: %q", ep, status.Convert(err).Message())
		}
	}
	if err := PushConfig(&pubsubpb.PushConfig{PushEndpoint: "http://svc.ns.svc.cluster.local/push"}, true); err != nil {
		t.Fatalf("allowHTTP: %v", err)
	}
	for v, ok := range map[string]bool{"v1": true, "v1beta1": true, "v1beta2": true, "v2": false, "": false} {
		err := PushConfig(&pubsubpb.PushConfig{PushEndpoint: "https://e.com", Attributes: map[string]string{"x-goog-version": v}}, false)
		if (err == nil) != ok {
			t.Fatalf("x-goog-version %q: %v", v, err)
		}
	}
}

func TestTopicAndSubscription(t *testing.T) {
	if err := Topic(&pubsubpb.Topic{Name: "projects/p/topics/abc", KmsKeyName: "ignored"}); err != nil {
		t.Fatal(err)
	}
	wantCode(t, "ingestion", Topic(&pubsubpb.Topic{IngestionDataSourceSettings: &pubsubpb.IngestionDataSourceSettings{}}), codes.InvalidArgument)
	wantCode(t, "transforms", Topic(&pubsubpb.Topic{MessageTransforms: []*pubsubpb.MessageTransform{{}}}), codes.InvalidArgument)
	wantCode(t, "topic retention", Topic(&pubsubpb.Topic{MessageRetentionDuration: durationpb.New(time.Minute)}), codes.InvalidArgument)

	opts := SubscriptionOptions{}
	full := &pubsubpb.Subscription{
		AckDeadlineSeconds:       60,
		MessageRetentionDuration: durationpb.New(24 * time.Hour),
		RetryPolicy:              &pubsubpb.RetryPolicy{MinimumBackoff: durationpb.New(time.Second)},
		DeadLetterPolicy:         &pubsubpb.DeadLetterPolicy{DeadLetterTopic: "projects/p/topics/dlq", MaxDeliveryAttempts: 10},
		ExpirationPolicy:         &pubsubpb.ExpirationPolicy{},
		PushConfig:               &pubsubpb.PushConfig{PushEndpoint: "https://e.com/push"},
	}
	if err := Subscription(full, opts); err != nil {
		t.Fatal(err)
	}
	if err := Subscription(&pubsubpb.Subscription{}, opts); err != nil {
		t.Fatal(err)
	}
	bad := map[string]*pubsubpb.Subscription{
		"bigquery":   {BigqueryConfig: &pubsubpb.BigQueryConfig{}},
		"gcs":        {CloudStorageConfig: &pubsubpb.CloudStorageConfig{}},
		"bigtable":   {BigtableConfig: &pubsubpb.BigtableConfig{}},
		"transforms": {MessageTransforms: []*pubsubpb.MessageTransform{{}}},
		"deadline":   {AckDeadlineSeconds: 5},
		"retention":  {MessageRetentionDuration: durationpb.New(time.Second)},
		"retry":      {RetryPolicy: &pubsubpb.RetryPolicy{MaximumBackoff: durationpb.New(time.Hour)}},
		"dlq":        {DeadLetterPolicy: &pubsubpb.DeadLetterPolicy{DeadLetterTopic: "projects/p/topics/dlq", MaxDeliveryAttempts: 2}},
		"ttl":        {ExpirationPolicy: &pubsubpb.ExpirationPolicy{Ttl: durationpb.New(time.Hour)}},
		"push":       {PushConfig: &pubsubpb.PushConfig{PushEndpoint: "http://example.com"}},
	}
	for name, s := range bad {
		err := Subscription(s, opts)
		wantCode(t, name, err, codes.InvalidArgument)
	}
	if msg := status.Convert(Subscription(bad["bigquery"], opts)).Message(); !strings.Contains(msg, "not supported by kubemq-proxy") {
		t.Fatalf("got %q", msg)
	}
}
