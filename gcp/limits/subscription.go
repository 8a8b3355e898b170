package limits

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/protobuf/types/known/durationpb"
)

// AckDeadline checks a subscription's ack_deadline_seconds and returns the
// effective value: 0 means the default (10 s), otherwise 10..600.
func AckDeadline(seconds int32) (int32, error) {
	if seconds == 0 {
		return DefaultAckDeadlineSeconds, nil
	}
	if seconds < MinAckDeadlineSeconds || seconds > MaxAckDeadlineSeconds {
		return 0, invalid("Invalid ack deadline given (ack_deadline=%d). The ack deadline must be between %d and %d seconds.",
			seconds, MinAckDeadlineSeconds, MaxAckDeadlineSeconds)
	}
	return seconds, nil
}

// ModifyAckDeadline checks ModifyAckDeadline's ack_deadline_seconds (also
// StreamingPull's modify_deadline_seconds): 0..600, 0 being a nack. Google
// accepts 1..9 here; only the subscription default has a 10 s floor.
func ModifyAckDeadline(seconds int32) error {
	if seconds < MinModifyDeadlineSeconds || seconds > MaxModifyDeadlineSeconds {
		return invalid("Invalid ack deadline given (ack_deadline=%d). The ack deadline must be between %d and %d seconds.",
			seconds, MinModifyDeadlineSeconds, MaxModifyDeadlineSeconds)
	}
	return nil
}

// StreamAckDeadline checks StreamingPull's stream_ack_deadline_seconds, 10..600.
func StreamAckDeadline(seconds int32) error {
	if seconds < MinAckDeadlineSeconds || seconds > MaxAckDeadlineSeconds {
		return invalid("stream_ack_deadline_seconds must be between %d and %d seconds", MinAckDeadlineSeconds, MaxAckDeadlineSeconds)
	}
	return nil
}

// PullMaxMessages checks Pull's max_messages and returns the effective
// value. It must be positive; above MaxPullMessages it is capped, not
// refused, because Google only promises "up to" max_messages.
func PullMaxMessages(n int32) (int32, error) {
	if n <= 0 {
		return 0, tooSmall("max_messages", int64(n), 1)
	}
	return min(n, MaxPullMessages), nil
}

// TopicRetention checks a topic's message_retention_duration: unset (0
// returned: subscriptions decide) or 10 minutes..31 days.
func TopicRetention(d *durationpb.Duration) (time.Duration, error) {
	if d == nil {
		return 0, nil
	}
	return retention(d, MaxTopicRetention)
}

// SubscriptionRetention checks a subscription's message_retention_duration:
// unset means 7 days, otherwise 10 minutes..31 days (the current v1 proto;
// older docs and pstest cap subscriptions at 7 days).
func SubscriptionRetention(d *durationpb.Duration) (time.Duration, error) {
	if d == nil {
		return DefaultSubscriptionRetention, nil
	}
	return retention(d, MaxSubscriptionRetention)
}

func retention(d *durationpb.Duration, max time.Duration) (time.Duration, error) {
	v, ok := duration(d)
	if !ok || v < MinRetention || v > max {
		return 0, invalid("Invalid message_retention_duration given (%s). It must be between %s and %s.",
			showDuration(d), showDuration(durationpb.New(MinRetention)), showDuration(durationpb.New(max)))
	}
	return v, nil
}

// Backoff is a checked retry policy.
type Backoff struct {
	Min, Max time.Duration
}

// RetryPolicy checks a retry policy. ok is false when there is none (Google
// then redelivers as soon as possible). Unset bounds take Google's defaults
// (10 s, 600 s); each must be within 0..600 s and min may not exceed max.
func RetryPolicy(p *pubsubpb.RetryPolicy) (b Backoff, ok bool, err error) {
	if p == nil {
		return Backoff{}, false, nil
	}
	b = Backoff{Min: DefaultMinimumBackoff, Max: DefaultMaximumBackoff}
	for _, f := range []struct {
		name string
		in   *durationpb.Duration
		out  *time.Duration
	}{{"minimum_backoff", p.GetMinimumBackoff(), &b.Min}, {"maximum_backoff", p.GetMaximumBackoff(), &b.Max}} {
		if f.in == nil {
			continue
		}
		v, valid := duration(f.in)
		if !valid || v < 0 || v > MaxBackoff {
			return Backoff{}, false, invalid("Invalid %s given (%s). It must be between 0s and %s.",
				f.name, showDuration(f.in), showDuration(durationpb.New(MaxBackoff)))
		}
		*f.out = v
	}
	if b.Min > b.Max {
		return Backoff{}, false, invalid("Invalid retry policy given: minimum_backoff (%s) must not exceed maximum_backoff (%s).",
			showDuration(durationpb.New(b.Min)), showDuration(durationpb.New(b.Max)))
	}
	return b, true, nil
}

// DeadLetterAttempts checks a dead-letter policy's max_delivery_attempts
// and returns the effective value: 0 means the default 5, otherwise 5..100.
// ok is false when there is no policy (nil, or no dead-letter topic, which
// is how clients clear the policy). The dead-letter topic's name is checked
// by the names package and its existence by the caller.
func DeadLetterAttempts(p *pubsubpb.DeadLetterPolicy) (attempts int32, ok bool, err error) {
	if p.GetDeadLetterTopic() == "" {
		return 0, false, nil
	}
	n := p.GetMaxDeliveryAttempts()
	if n == 0 {
		return DefaultDeliveryAttempts, true, nil
	}
	if n < MinDeliveryAttempts || n > MaxDeliveryAttempts {
		return 0, false, invalid("Invalid max_delivery_attempts given (%d). It must be between %d and %d.",
			n, MinDeliveryAttempts, MaxDeliveryAttempts)
	}
	return n, true, nil
}

// ExpirationTTL checks an expiration policy and returns its TTL, 0 meaning
// "never expires". No policy means Google's default policy (31 days); a
// policy without a ttl never expires; a ttl must be at least 1 day.
func ExpirationTTL(p *pubsubpb.ExpirationPolicy) (time.Duration, error) {
	if p == nil {
		return DefaultExpirationTTL, nil
	}
	if p.GetTtl() == nil {
		return 0, nil
	}
	v, ok := duration(p.GetTtl())
	if !ok || v < MinExpirationTTL {
		return 0, invalid("Invalid expiration_policy.ttl given (%s). It must be at least %s, or unset for no expiration.",
			showDuration(p.GetTtl()), showDuration(durationpb.New(MinExpirationTTL)))
	}
	return v, nil
}

// PushConfig checks a push config. No config or an empty endpoint means a
// pull subscription. An endpoint must be an absolute https URL; plain http
// is allowed for loopback hosts, or for any host when allowHTTP is set (a
// sidecar pushing to a service inside its own cluster). The only endpoint
// attribute Google defines, x-goog-version, must be v1beta1, v1 or v1beta2.
func PushConfig(pc *pubsubpb.PushConfig, allowHTTP bool) error {
	ep := pc.GetPushEndpoint()
	if ep == "" {
		return nil
	}
	u, err := url.Parse(ep)
	if err != nil || u.Host == "" || u.Hostname() == "" || u.User != nil || u.Opaque != "" {
		return invalidEndpoint(ep)
	}
	switch strings.ToLower(u.Scheme) {
	case "https":
	case "http":
		if !allowHTTP && !isLoopback(u.Hostname()) {
			return invalidEndpoint(ep)
		}
	default:
		return invalidEndpoint(ep)
	}
	if v, ok := pc.GetAttributes()["x-goog-version"]; ok {
		switch v {
		case "v1beta1", "v1", "v1beta2":
		default:
			return invalid("Invalid push config attribute x-goog-version=%q. Supported values are v1beta1, v1 and v1beta2.", v)
		}
	}
	return nil
}

func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func invalidEndpoint(ep string) error {
	return invalid("Invalid push endpoint given (endpoint=%s). A push endpoint must be an absolute https URL "+
		"(http is accepted only for localhost).", ep)
}

// Topic checks what CreateTopic and UpdateTopic may set beyond the name,
// labels and schema: retention, and the configurations kubemq-proxy cannot
// serve (ingestion from other systems, message transforms), which are
// refused with a message that says so. kms_key_name is accepted and ignored.
func Topic(t *pubsubpb.Topic) error {
	if t.GetIngestionDataSourceSettings() != nil {
		return unsupported("ingestion_data_source_settings (ingestion topics)")
	}
	if len(t.GetMessageTransforms()) > 0 {
		return unsupported("message_transforms")
	}
	_, err := TopicRetention(t.GetMessageRetentionDuration())
	return err
}

// SubscriptionOptions tunes Subscription's checks.
type SubscriptionOptions struct {
	AllowHTTPPush bool // see PushConfig
}

// Subscription checks every setting of a subscription that is not a name or
// the filter (those belong to the names and filter packages): export
// configurations and message transforms are refused as unsupported, then
// ack deadline, retention, retry policy, dead-letter attempts, expiration
// and push config are range-checked. UpdateSubscription callers check only
// the fields in their mask with the per-field functions.
func Subscription(s *pubsubpb.Subscription, opts SubscriptionOptions) error {
	switch {
	case s.GetBigqueryConfig() != nil:
		return unsupported("bigquery_config (BigQuery export subscriptions)")
	case s.GetCloudStorageConfig() != nil:
		return unsupported("cloud_storage_config (Cloud Storage export subscriptions)")
	case s.GetBigtableConfig() != nil:
		return unsupported("bigtable_config (Bigtable export subscriptions)")
	case len(s.GetMessageTransforms()) > 0:
		return unsupported("message_transforms")
	}
	if _, err := AckDeadline(s.GetAckDeadlineSeconds()); err != nil {
		return err
	}
	if _, err := SubscriptionRetention(s.GetMessageRetentionDuration()); err != nil {
		return err
	}
	if _, _, err := RetryPolicy(s.GetRetryPolicy()); err != nil {
		return err
	}
	if _, _, err := DeadLetterAttempts(s.GetDeadLetterPolicy()); err != nil {
		return err
	}
	if _, err := ExpirationTTL(s.GetExpirationPolicy()); err != nil {
		return err
	}
	return PushConfig(s.GetPushConfig(), opts.AllowHTTPPush)
}

func unsupported(what string) error {
	return invalid("%s is not supported by kubemq-proxy.", what)
}

// duration converts a wire duration, refusing malformed ones (nanos out of
// range or of the wrong sign) and ones too large for time.Duration.
func duration(d *durationpb.Duration) (time.Duration, bool) {
	if d.CheckValid() != nil {
		return 0, false
	}
	return d.AsDuration(), true
}

// showDuration renders a wire duration in its JSON form ("600s", "0.5s"),
// which is how Google's REST surface shows durations.
func showDuration(d *durationpb.Duration) string {
	if v, ok := duration(d); ok {
		return strconv.FormatFloat(v.Seconds(), 'f', -1, 64) + "s"
	}
	return fmt.Sprintf("seconds=%d nanos=%d", d.GetSeconds(), d.GetNanos())
}
