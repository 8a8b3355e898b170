package limits

import (
	"fmt"
	"strings"
	"testing"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

const topic = "projects/p/topics/orders"

func msg(data string, attrs map[string]string) *pubsubpb.PubsubMessage {
	return &pubsubpb.PubsubMessage{Data: []byte(data), Attributes: attrs}
}

func batch(n int, m func(i int) *pubsubpb.PubsubMessage) []*pubsubpb.PubsubMessage {
	out := make([]*pubsubpb.PubsubMessage, n)
	for i := range out {
		out[i] = m(i)
	}
	return out
}

func manyAttrs(n int) map[string]string {
	a := make(map[string]string, n)
	for i := range n {
		a[fmt.Sprintf("k%03d", i)] = "v"
	}
	return a
}

func TestValidatePublish(t *testing.T) {
	ok := func(int) *pubsubpb.PubsubMessage { return msg("x", nil) }
	cases := []struct {
		name string
		msgs []*pubsubpb.PubsubMessage
		code codes.Code // OK = valid
		text string     // exact message when set
		has  string     // substring when set
	}{
		{name: "one data message", msgs: batch(1, ok)},
		{name: "attributes only", msgs: []*pubsubpb.PubsubMessage{msg("", map[string]string{"a": "b"})}},
		{name: "attribute with empty value", msgs: []*pubsubpb.PubsubMessage{msg("", map[string]string{"a": ""})}},
		{name: "1000 messages", msgs: batch(1000, ok)},
		{name: "no messages", msgs: nil, code: codes.InvalidArgument,
			text: "The value for message_count is too small. You passed 0 in the request, but the minimum value is 1."},
		{name: "1001 messages", msgs: batch(1001, ok), code: codes.InvalidArgument,
			text: "The value for message_count is too large. You passed 1001 in the request, but the maximum value is 1000."},
		{name: "empty message", msgs: []*pubsubpb.PubsubMessage{msg("x", nil), {}}, code: codes.InvalidArgument,
			text: "One or more messages in the publish request is empty. Each message must contain either non-empty data, or at least one attribute."},
		{name: "nil message", msgs: []*pubsubpb.PubsubMessage{nil}, code: codes.InvalidArgument, has: "is empty"},
		{name: "ordering key only is still empty", msgs: []*pubsubpb.PubsubMessage{{OrderingKey: "k"}}, code: codes.InvalidArgument, has: "is empty"},
		{name: "100 attributes", msgs: []*pubsubpb.PubsubMessage{msg("", manyAttrs(100))}},
		{name: "101 attributes", msgs: []*pubsubpb.PubsubMessage{msg("", manyAttrs(101))}, code: codes.InvalidArgument,
			text: "The value for attributes_count is too large. You passed 101 in the request, but the maximum value is 100."},
		{name: "key 256 bytes", msgs: []*pubsubpb.PubsubMessage{msg("", map[string]string{strings.Repeat("k", 256): "v"})}},
		{name: "key 257 bytes", msgs: []*pubsubpb.PubsubMessage{msg("", map[string]string{strings.Repeat("k", 257): "v"})}, code: codes.InvalidArgument,
			text: `The attribute "" in the request has a key that is too long. The length is 257 characters, but the maximum allowed is 256. Refer to https://cloud.google.com/pubsub/quotas for more information.`},
		{name: "key counted in bytes", msgs: []*pubsubpb.PubsubMessage{msg("", map[string]string{strings.Repeat("é", 129): "v"})}, code: codes.InvalidArgument,
			has: "The length is 258 characters"},
		{name: "value 1024 bytes", msgs: []*pubsubpb.PubsubMessage{msg("", map[string]string{"k": strings.Repeat("v", 1024)})}},
		{name: "value 1025 bytes", msgs: []*pubsubpb.PubsubMessage{msg("", map[string]string{"app_id": strings.Repeat("v", 1025)})}, code: codes.InvalidArgument,
			text: `The attribute "app_id" in the request has a value that is too long. The length is 1025 characters, but the maximum allowed is 1024. Refer to https://cloud.google.com/pubsub/quotas for more information.`},
		{name: "empty key", msgs: []*pubsubpb.PubsubMessage{msg("x", map[string]string{"": "v"})}, code: codes.InvalidArgument, has: "must not be empty"},
		{name: "goog key", msgs: []*pubsubpb.PubsubMessage{msg("x", map[string]string{"goog-x": "v"})}, code: codes.InvalidArgument, has: `reserved prefix "goog"`},
		{name: "goog exact", msgs: []*pubsubpb.PubsubMessage{msg("x", map[string]string{"goog": "v"})}, code: codes.InvalidArgument, has: "reserved"},
		{name: "googclient_ key is the clients' own", msgs: []*pubsubpb.PubsubMessage{msg("x", map[string]string{"googclient_traceparent": "00-ab"})}},
		{name: "Goog is not goog", msgs: []*pubsubpb.PubsubMessage{msg("x", map[string]string{"Google": "v"})}},
		{name: "ordering key 1024", msgs: []*pubsubpb.PubsubMessage{{Data: []byte("x"), OrderingKey: strings.Repeat("o", 1024)}}},
		{name: "ordering key 1025", msgs: []*pubsubpb.PubsubMessage{{Data: []byte("x"), OrderingKey: strings.Repeat("o", 1025)}}, code: codes.InvalidArgument,
			has: "ordering key in the request is too long. The length is 1025"},
		{name: "same ordering key", msgs: batch(3, func(int) *pubsubpb.PubsubMessage { return &pubsubpb.PubsubMessage{Data: []byte("x"), OrderingKey: "k"} })},
		{name: "mixed ordering keys", msgs: []*pubsubpb.PubsubMessage{{Data: []byte("x"), OrderingKey: "a"}, {Data: []byte("x"), OrderingKey: "b"}},
			code: codes.FailedPrecondition,
			text: "In a single publish request, all messages must have no ordering key or they must all have the same ordering key."},
		{name: "keyed and unkeyed", msgs: []*pubsubpb.PubsubMessage{{Data: []byte("x")}, {Data: []byte("x"), OrderingKey: "b"}},
			code: codes.FailedPrecondition, has: "same ordering key"},
		{name: "bad message after good ones rejects the batch", msgs: append(batch(999, ok), &pubsubpb.PubsubMessage{}),
			code: codes.InvalidArgument, has: "is empty"},
		{name: "message of 10 MiB", msgs: []*pubsubpb.PubsubMessage{{Data: make([]byte, 10<<20-100), Attributes: map[string]string{"a": "b"}}}},
		{name: "message over 10 MiB", msgs: []*pubsubpb.PubsubMessage{{Data: make([]byte, 10<<20), Attributes: map[string]string{"a": "b"}}},
			code: codes.InvalidArgument, has: "The value for request_size is too large"},
		{name: "request over 10 MiB", msgs: batch(11, func(int) *pubsubpb.PubsubMessage { return &pubsubpb.PubsubMessage{Data: make([]byte, 1<<20)} }),
			code: codes.InvalidArgument, has: "The value for request_size is too large. You passed 11534"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := ValidatePublish(topic, tc.msgs)
			st := status.Convert(err)
			if st.Code() != tc.code {
				t.Fatalf("code %v (%q), want %v", st.Code(), st.Message(), tc.code)
			}
			if tc.text != "" && st.Message() != tc.text {
				t.Fatalf("message\n got %q\nwant %q", st.Message(), tc.text)
			}
			if tc.has != "" && !strings.Contains(st.Message(), tc.has) {
				t.Fatalf("message %q lacks %q", st.Message(), tc.has)
			}
		})
	}
}

// The message-size rule is separate from the request-size rule when the
// configured message cap is below the request cap.
func TestPublishMessageBytesKnob(t *testing.T) {
	p := Publish{MaxMessageBytes: 1000}
	if err := p.Validate(topic, []*pubsubpb.PubsubMessage{{Data: make([]byte, 990), Attributes: map[string]string{"ab": "cdefghij"}}}); err != nil {
		t.Fatalf("1000 bytes refused: %v", err)
	}
	err := p.Validate(topic, []*pubsubpb.PubsubMessage{{Data: make([]byte, 990), Attributes: map[string]string{"ab": "cdefghijk"}}})
	want := "The value for message_size is too large. You passed 1001 in the request, but the maximum value is 1000."
	if status.Code(err) != codes.InvalidArgument || status.Convert(err).Message() != want {
		t.Fatalf("got %v", err)
	}
	// Ordering key bytes count towards the message.
	err = p.Validate(topic, []*pubsubpb.PubsubMessage{{Data: make([]byte, 1000), OrderingKey: "k"}})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("got %v", err)
	}
}

func TestPublishKnobsDefaultWhenZero(t *testing.T) {
	if got := DefaultPublish(); got != (Publish{
		MaxMessages: 1000, MaxRequestBytes: 10 << 20, MaxMessageBytes: 10 << 20, MaxAttributes: 100,
		MaxAttributeKeyBytes: 256, MaxAttributeValueBytes: 1024, MaxOrderingKeyBytes: 1024,
	}) {
		t.Fatalf("%+v", got)
	}
	p := Publish{MaxMessages: 2}
	if err := p.Validate(topic, batch(3, func(int) *pubsubpb.PubsubMessage { return msg("x", nil) })); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("got %v", err)
	}
}

// With several bad attributes the lexically smallest key decides, so the
// error does not depend on map iteration order.
func TestPublishErrorIsDeterministic(t *testing.T) {
	attrs := map[string]string{}
	for i := range 50 {
		attrs[fmt.Sprintf("key%02d", i)] = strings.Repeat("v", 2000)
	}
	m := []*pubsubpb.PubsubMessage{msg("", attrs)}
	want := status.Convert(ValidatePublish(topic, m)).Message()
	if !strings.Contains(want, `"key00"`) {
		t.Fatalf("got %q", want)
	}
	for range 20 {
		if got := status.Convert(ValidatePublish(topic, m)).Message(); got != want {
			t.Fatalf("got %q then %q", want, got)
		}
	}
}

func TestValidateMessage(t *testing.T) {
	if err := DefaultPublish().ValidateMessage(msg("x", nil)); err != nil {
		t.Fatal(err)
	}
	if err := (Publish{}).ValidateMessage(&pubsubpb.PubsubMessage{}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("got %v", err)
	}
}

func BenchmarkValidatePublish(b *testing.B) {
	msgs := batch(100, func(i int) *pubsubpb.PubsubMessage {
		return &pubsubpb.PubsubMessage{Data: make([]byte, 1024), Attributes: map[string]string{"type": "order", "region": "eu", "id": fmt.Sprint(i)}}
	})
	b.ReportAllocs()
	for b.Loop() {
		if err := ValidatePublish(topic, msgs); err != nil {
			b.Fatal(err)
		}
	}
}

func TestWireSizeIsProtoSize(t *testing.T) {
	fields := pubsubpbMessageFields()
	if fields != "1 2 3 4 5" {
		t.Fatalf("PubsubMessage fields are now %q: teach wireSize the new ones", fields)
	}
	withUnknown := &pubsubpb.PubsubMessage{Data: []byte("x")}
	withUnknown.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 99, protowire.VarintType), 300))
	msgs := []*pubsubpb.PubsubMessage{
		nil,
		{},
		{Data: []byte("x")},
		{Data: make([]byte, 200)},
		{Attributes: map[string]string{"": ""}},
		{Attributes: map[string]string{"k": strings.Repeat("v", 300), strings.Repeat("k", 130): "", "a": "b"}},
		{MessageId: "123", PublishTime: timestamppb.Now(), OrderingKey: "ok"},
		{PublishTime: &timestamppb.Timestamp{}},
		withUnknown,
	}
	for _, m := range msgs {
		if got, want := wireSize(m), proto.Size(m); got != want {
			t.Fatalf("wireSize(%v) = %d, proto.Size = %d", m, got, want)
		}
	}
}

func pubsubpbMessageFields() string {
	fd := (&pubsubpb.PubsubMessage{}).ProtoReflect().Descriptor().Fields()
	var nums []string
	for i := range fd.Len() {
		nums = append(nums, fmt.Sprint(fd.Get(i).Number()))
	}
	return strings.Join(nums, " ")
}
