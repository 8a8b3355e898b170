// Package limits owns the Pub/Sub v1 protocol limits that kubemq-proxy
// enforces as Google does: the publish rules (batch size, request and
// message size, attributes, ordering keys), and the range checks on topic
// and subscription settings (ack deadlines, retention, retry and
// dead-letter policies, expiration, push endpoints, pull sizes).
//
// Every check returns a gRPC status error ready to hand to the client,
// INVALID_ARGUMENT with Google's wording where it is known, so a client
// library sees the same failure it would see against Google. Validation is
// pure: nothing here touches the registry or KubeMQ. Resource names are the
// names package's job and filters the filter package's (which also enforces
// the 256-byte filter limit).
//
// The protobuf types are cloud.google.com/go/pubsub/v2/apiv1/pubsubpb; the
// v1 module's cloud.google.com/go/pubsub/apiv1/pubsubpb is a set of type
// aliases of it, so both client generations share these types.
package limits

import (
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Publish limits (Google's resource limits; the connector enforces them too).
const (
	DefaultMaxMessagesPerRequest  = 1000
	DefaultMaxRequestBytes        = 10 << 20 // Google reports request_size > 10,000,000; 10 MiB here, see Publish
	DefaultMaxMessageBytes        = 10 << 20
	DefaultMaxAttributes          = 100
	DefaultMaxAttributeKeyBytes   = 256
	DefaultMaxAttributeValueBytes = 1024
	DefaultMaxOrderingKeyBytes    = 1024
)

// ReservedAttributePrefix starts attribute keys that Google keeps for
// itself; AllowedGoogAttributePrefix is the exception Google's own client
// libraries use (the Go client's OpenTelemetry propagation writes
// "googclient_*" attributes), so it must pass.
const (
	ReservedAttributePrefix    = "goog"
	AllowedGoogAttributePrefix = "googclient_"
)

// Subscription and topic setting ranges (v1 proto comments).
const (
	DefaultAckDeadlineSeconds = 10
	MinAckDeadlineSeconds     = 10
	MaxAckDeadlineSeconds     = 600
	MinModifyDeadlineSeconds  = 0 // ModifyAckDeadline: 0 is a nack
	MaxModifyDeadlineSeconds  = 600

	MinRetention                 = 10 * time.Minute
	MaxTopicRetention            = 31 * 24 * time.Hour
	MaxSubscriptionRetention     = 31 * 24 * time.Hour // current proto; pstest still says 7 days
	DefaultSubscriptionRetention = 7 * 24 * time.Hour

	MaxBackoff            = 600 * time.Second
	DefaultMinimumBackoff = 10 * time.Second
	DefaultMaximumBackoff = 600 * time.Second

	MinDeliveryAttempts     = 5
	MaxDeliveryAttempts     = 100
	DefaultDeliveryAttempts = 5 // max_delivery_attempts = 0 with a dead-letter topic

	MinExpirationTTL     = 24 * time.Hour
	DefaultExpirationTTL = 31 * 24 * time.Hour

	MaxPullMessages = 1000

	// MaxAckRequestBytes is Google's limit on an Acknowledge or
	// ModifyAckDeadline request ("Request payload size exceeds the limit:
	// 524288 bytes"); client libraries split their ack ids to stay under it.
	MaxAckRequestBytes = 512 << 10
)

// quotasURL is where Google's attribute-limit texts point.
const quotasURL = "https://cloud.google.com/pubsub/quotas"

func invalid(format string, args ...any) error {
	return status.Error(codes.InvalidArgument, fmt.Sprintf(format, args...))
}

// tooLarge and tooSmall are Google's generic range texts
// ("The value for request_size is too large. You passed 10006011 in the
// request, but the maximum value is 10000000."). Google's server currently
// swaps the two placeholders in some of them; we print them the sensible way.
func tooLarge(field string, got, max int64) error {
	return invalid("The value for %s is too large. You passed %d in the request, but the maximum value is %d.", field, got, max)
}

func tooSmall(field string, got, min int64) error {
	return invalid("The value for %s is too small. You passed %d in the request, but the minimum value is %d.", field, got, min)
}
