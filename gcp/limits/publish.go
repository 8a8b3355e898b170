package limits

import (
	"strings"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// Publish holds the publish limits. A zero field means its Default*
// constant, so Publish{} is Google's rule set and a config only needs to
// set what it changes (in practice MaxMessageBytes).
//
// MaxRequestBytes is the encoded PublishRequest size. Google reports
// "request_size" against 10,000,000 bytes (and its HTTP front end against
// 10 MiB); we default to 10 MiB so that nothing Google accepts is refused.
// The gRPC server's MaxRecvMsgSize must leave room above it, or gRPC itself
// answers RESOURCE_EXHAUSTED before this check can give Google's text.
//
// MaxMessageBytes bounds one message's payload: data + attribute keys and
// values + ordering key.
type Publish struct {
	MaxMessages            int
	MaxRequestBytes        int
	MaxMessageBytes        int
	MaxAttributes          int
	MaxAttributeKeyBytes   int
	MaxAttributeValueBytes int
	MaxOrderingKeyBytes    int
}

// DefaultPublish is Google's rule set with every field filled in.
func DefaultPublish() Publish { return Publish{}.withDefaults() }

func (p Publish) withDefaults() Publish {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&p.MaxMessages, DefaultMaxMessagesPerRequest)
	def(&p.MaxRequestBytes, DefaultMaxRequestBytes)
	def(&p.MaxMessageBytes, DefaultMaxMessageBytes)
	def(&p.MaxAttributes, DefaultMaxAttributes)
	def(&p.MaxAttributeKeyBytes, DefaultMaxAttributeKeyBytes)
	def(&p.MaxAttributeValueBytes, DefaultMaxAttributeValueBytes)
	def(&p.MaxOrderingKeyBytes, DefaultMaxOrderingKeyBytes)
	return p
}

// ValidatePublish checks a whole Publish request with Google's limits; see
// Publish.Validate.
func ValidatePublish(topic string, msgs []*pubsubpb.PubsubMessage) error {
	return Publish{}.Validate(topic, msgs)
}

// Validate checks the WHOLE batch before anything is stored: one bad message
// rejects the request and nothing may be written. topic is the request's
// raw topic field, counted in the request size. Errors are INVALID_ARGUMENT,
// except a batch that mixes ordering keys, which Google answers with
// FAILED_PRECONDITION. The first offending message (and, within it, the
// lexically smallest offending attribute key) decides the error, so the
// answer is deterministic.
func (p Publish) Validate(topic string, msgs []*pubsubpb.PubsubMessage) error {
	p = p.withDefaults()
	if len(msgs) == 0 {
		return tooSmall("message_count", 0, 1)
	}
	if len(msgs) > p.MaxMessages {
		return tooLarge("message_count", int64(len(msgs)), int64(p.MaxMessages))
	}
	// Bound the request first: a request within gRPC's receive size can
	// still be over ours, and per-message checks below are then moot.
	reqSize := protowire.SizeTag(1) + protowire.SizeBytes(len(topic))
	for _, m := range msgs {
		reqSize += protowire.SizeTag(2) + protowire.SizeBytes(wireSize(m))
	}
	if reqSize > p.MaxRequestBytes {
		return tooLarge("request_size", int64(reqSize), int64(p.MaxRequestBytes))
	}
	orderingKey := msgs[0].GetOrderingKey()
	for _, m := range msgs {
		if err := p.validateMessage(m); err != nil {
			return err
		}
		if m.GetOrderingKey() != orderingKey {
			return status.Error(codes.FailedPrecondition,
				"In a single publish request, all messages must have no ordering key or they must all have the same ordering key.")
		}
	}
	return nil
}

// ValidateMessage checks one message against the per-message rules (the
// schema service's ValidateMessage and dead-letter republishing reuse it).
func (p Publish) ValidateMessage(m *pubsubpb.PubsubMessage) error {
	return p.withDefaults().validateMessage(m)
}

func (p Publish) validateMessage(m *pubsubpb.PubsubMessage) error {
	if len(m.GetData()) == 0 && len(m.GetAttributes()) == 0 {
		return invalid("One or more messages in the publish request is empty. " +
			"Each message must contain either non-empty data, or at least one attribute.")
	}
	if n := len(m.GetAttributes()); n > p.MaxAttributes {
		return tooLarge("attributes_count", int64(n), int64(p.MaxAttributes))
	}
	size := len(m.GetData()) + len(m.GetOrderingKey())
	var badKey string
	var badErr error
	for k, v := range m.GetAttributes() {
		size += len(k) + len(v)
		if badErr != nil && k >= badKey {
			continue
		}
		if err := p.validateAttribute(k, v); err != nil {
			badKey, badErr = k, err
		}
	}
	if size > p.MaxMessageBytes {
		return tooLarge("message_size", int64(size), int64(p.MaxMessageBytes))
	}
	if badErr != nil {
		return badErr
	}
	if n := len(m.GetOrderingKey()); n > p.MaxOrderingKeyBytes {
		return invalid("The ordering key in the request is too long. The length is %d characters, "+
			"but the maximum allowed is %d. Refer to %s for more information.", n, p.MaxOrderingKeyBytes, quotasURL)
	}
	return nil
}

// validateAttribute applies the key and value rules. Lengths are bytes, as
// Google counts them, although its texts say "characters".
func (p Publish) validateAttribute(k, v string) error {
	if k == "" {
		return invalid("The attribute key in the request must not be empty.")
	}
	if len(k) > p.MaxAttributeKeyBytes {
		// Google prints an empty name here rather than echo the oversized key.
		return invalid("The attribute \"\" in the request has a key that is too long. The length is %d characters, "+
			"but the maximum allowed is %d. Refer to %s for more information.", len(k), p.MaxAttributeKeyBytes, quotasURL)
	}
	if strings.HasPrefix(k, ReservedAttributePrefix) && !strings.HasPrefix(k, AllowedGoogAttributePrefix) {
		return invalid("The attribute %q in the request has a key that starts with the reserved prefix %q.",
			k, ReservedAttributePrefix)
	}
	if len(v) > p.MaxAttributeValueBytes {
		return invalid("The attribute %q in the request has a value that is too long. The length is %d characters, "+
			"but the maximum allowed is %d. Refer to %s for more information.", k, len(v), p.MaxAttributeValueBytes, quotasURL)
	}
	return nil
}

// wireSize is proto.Size(m) computed field by field: proto.Size walks the
// attribute map through reflection and allocates for every entry, which
// showed up as most of the cost of validating a batch. A test keeps the two
// equal and fails if PubsubMessage gains a field this does not count.
func wireSize(m *pubsubpb.PubsubMessage) int {
	if m == nil {
		return 0
	}
	n := 0
	if l := len(m.GetData()); l > 0 {
		n += protowire.SizeTag(1) + protowire.SizeBytes(l)
	}
	for k, v := range m.GetAttributes() {
		// Map entries always carry both key and value.
		e := protowire.SizeTag(1) + protowire.SizeBytes(len(k)) + protowire.SizeTag(2) + protowire.SizeBytes(len(v))
		n += protowire.SizeTag(2) + protowire.SizeBytes(e)
	}
	if l := len(m.GetMessageId()); l > 0 {
		n += protowire.SizeTag(3) + protowire.SizeBytes(l)
	}
	if ts := m.GetPublishTime(); ts != nil {
		n += protowire.SizeTag(4) + protowire.SizeBytes(proto.Size(ts))
	}
	if l := len(m.GetOrderingKey()); l > 0 {
		n += protowire.SizeTag(5) + protowire.SizeBytes(l)
	}
	return n + len(m.ProtoReflect().GetUnknown())
}
