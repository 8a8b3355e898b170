package gcp

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/kubemq-io/kubemq-proxy/kubemqclient"
)

// Reserved KubeMQ tags: a Pub/Sub message is stored with its attributes
// as tags plus these three, which native KubeMQ consumers see and which
// are turned back into message_id, publish_time and ordering_key (and
// stripped) when a Pub/Sub client receives the message. All three are
// always present; the ordering key's value is empty when there is none.
const (
	TagMessageID   = "_pubsub_message_id"
	TagPublishTime = "_pubsub_publish_time" // RFC 3339, nanoseconds, UTC
	TagOrderingKey = "_pubsub_ordering_key"
	// TagPrevID is on an ordered subscription's copy of a keyed message: the id of the
	// previous message of its key that the same process stored in that subscription
	// (keychain.go). Stripped on delivery.
	TagPrevID = "_pubsub_prev_id"
)

// messageMetadata is the KubeMQ Metadata of every stored Pub/Sub message:
// KubeMQ refuses a message with neither metadata nor body, and a Pub/Sub
// message may have empty data.
const messageMetadata = "pubsub"

// subscriptionCopy is the queue message that holds a subscription's copy
// of a published message: the topic log event's id, body and tags (shared,
// read-only) in the subscription's queue. Publish and Seek's replay store
// the same shape.
func subscriptionCopy(queue, id string, body []byte, tags map[string]string) kubemqclient.QueueMessage {
	return kubemqclient.QueueMessage{MessageID: id, Channel: queue, Metadata: messageMetadata, Body: body, Tags: tags}
}

func isReservedTag(k string) bool {
	return k == TagMessageID || k == TagPublishTime || k == TagOrderingKey || k == TagPrevID
}

// formatPublishTime is a publish time as the _pubsub_publish_time tag
// holds it.
func formatPublishTime(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// encodeTags is the KubeMQ tag map of one published message; published is
// formatPublishTime's.
func encodeTags(attrs map[string]string, id, published, orderingKey string) map[string]string {
	tags := make(map[string]string, len(attrs)+3)
	for k, v := range attrs {
		tags[k] = v
	}
	tags[TagMessageID] = id
	tags[TagPublishTime] = published
	tags[TagOrderingKey] = orderingKey
	return tags
}

// decodeMessage rebuilds the Pub/Sub message from a stored body and tags.
// A message a native producer wrote to a subscription's queue (no reserved
// tags) gets fallback as id and stored (when KubeMQ stored it) as publish
// time; now when stored is unknown.
func decodeMessage(body []byte, tags map[string]string, fallbackID string, stored, now time.Time) *pubsubpb.PubsubMessage {
	if stored.IsZero() {
		stored = now
	}
	m := &pubsubpb.PubsubMessage{Data: body, MessageId: fallbackID}
	pt := stored
	for k, v := range tags {
		switch k {
		case TagMessageID:
			if v != "" {
				m.MessageId = v
			}
		case TagPublishTime:
			if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
				pt = t
			}
		case TagOrderingKey:
			m.OrderingKey = v
		case TagPrevID:
		default:
			if m.Attributes == nil {
				m.Attributes = make(map[string]string, len(tags))
			}
			m.Attributes[k] = v
		}
	}
	if !pt.IsZero() {
		m.PublishTime = timestamppb.New(pt)
	}
	return m
}

// idGen mints message ids: decimal digits like Google's, unique across
// replicas and restarts without coordination. A fixed-width prefix (the
// process start in Unix seconds, 10 digits, and 6 random digits) is
// followed by a counter, so two generators never produce the same string.
type idGen struct {
	prefix string
	n      atomic.Uint64
}

func newIDGen() *idGen {
	var b [8]byte
	rand.Read(b[:])
	r := binary.BigEndian.Uint64(b[:]) % 1_000_000
	return &idGen{prefix: fmt.Sprintf("%010d%06d", time.Now().Unix()%10_000_000_000, r)}
}

func (g *idGen) next() string {
	return g.prefix + strconv.FormatUint(g.n.Add(1), 10)
}
