// Package fastpb encodes the KubeMQ messages on the proxy's hot paths
// (events, queue messages and their batches) without protobuf reflection.
// Every message carries a tag map, and protobuf-go encodes maps through
// reflection, with several allocations per entry: for a 1 KiB message with
// three tags that was a fifth of the CPU of a publish. The output is the
// standard wire encoding (proto3: zero values omitted, map entries with
// key and value), so any protobuf decoder reads it.
//
// The Append functions report false, having appended nothing, when the
// message holds something they do not encode (unknown fields) or that
// protobuf would refuse (a string that is not UTF-8); the caller then uses
// proto.Marshal, which encodes or reports it as usual.
package fastpb

import (
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/kubemq-io/kubemq-proxy/kubemqpb"
)

// Marshal appends the encoding of v to b when v is one of the messages
// this package encodes.
func Marshal(b []byte, v any) ([]byte, bool) {
	switch m := v.(type) {
	case *kubemqpb.Event:
		return AppendEvent(b, m)
	case *kubemqpb.EventReceive:
		return AppendEventReceive(b, m)
	case *kubemqpb.QueueMessage:
		return AppendQueueMessage(b, m)
	case *kubemqpb.QueueMessagesBatchRequest:
		return AppendQueueMessagesBatchRequest(b, m)
	case *kubemqpb.QueuesDownstreamResponse:
		return AppendQueuesDownstreamResponse(b, m)
	}
	return b, false
}

// SizeHint is a capacity for Marshal's buffer: at least the encoded size
// of v for the messages Marshal encodes, 0 for others.
func SizeHint(v any) int {
	switch m := v.(type) {
	case *kubemqpb.Event:
		return sizeEvent(m)
	case *kubemqpb.EventReceive:
		return sizeEventReceive(m)
	case *kubemqpb.QueueMessage:
		return sizeQueueMessage(m)
	case *kubemqpb.QueueMessagesBatchRequest:
		return SizeStringField(1, m.BatchID) + sizeQueueMessages(2, m.Messages)
	case *kubemqpb.QueuesDownstreamResponse:
		return sizeDownstreamResponse(m)
	}
	return 0
}

// The field helpers below size and append one proto3 field as protobuf-go
// does (a zero value omitted); other packages' hand-written encoders use
// them too (amqp091's peer link).

// SizeStringField is the encoded size of string field num (0 when empty).
func SizeStringField(num protowire.Number, s string) int {
	if s == "" {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeBytes(len(s))
}

// SizeBytesField is the encoded size of bytes field num (0 when empty).
func SizeBytesField(num protowire.Number, b []byte) int {
	if len(b) == 0 {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeBytes(len(b))
}

// SizeVarintField is the encoded size of varint field num (0 when v is).
func SizeVarintField(num protowire.Number, v uint64) int {
	if v == 0 {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeVarint(v)
}

// SizeMessageField is the encoded size of message field num of n bytes.
func SizeMessageField(num protowire.Number, n int) int {
	return protowire.SizeTag(num) + protowire.SizeBytes(n)
}

// AppendMessageHeader appends the tag and length of message (or packed)
// field num of n bytes, whose content the caller appends next
// (SizeMessageField is the size of both).
func AppendMessageHeader(b []byte, num protowire.Number, n int) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendVarint(b, uint64(n))
}

// SizeTagsField is the encoded size of map<string, string> field num.
func SizeTagsField(num protowire.Number, tags map[string]string) int {
	n := 0
	for k, v := range tags {
		n += SizeMessageField(num, mapEntrySize(k, v))
	}
	return n
}

// mapEntrySize: protobuf-go writes both fields of a map entry, even empty.
func mapEntrySize(k, v string) int {
	return protowire.SizeTag(1) + protowire.SizeBytes(len(k)) + protowire.SizeTag(2) + protowire.SizeBytes(len(v))
}

// AppendStringField appends string field num unless s is empty.
func AppendStringField(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, s)
}

// AppendBytesField appends bytes field num unless v is empty.
func AppendBytesField(b []byte, num protowire.Number, v []byte) []byte {
	if len(v) == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendBytes(b, v)
}

// AppendVarintField appends varint field num unless v is 0.
func AppendVarintField(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

// AppendBoolField appends bool field num when v is true.
func AppendBoolField(b []byte, num protowire.Number, v bool) []byte {
	if !v {
		return b
	}
	return AppendVarintField(b, num, 1)
}

// AppendTagsField appends map<string, string> field num, an entry per tag.
func AppendTagsField(b []byte, num protowire.Number, tags map[string]string) []byte {
	for k, v := range tags {
		b = AppendMessageHeader(b, num, mapEntrySize(k, v))
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendString(b, k)
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendString(b, v)
	}
	return b
}

// ValidStrings reports whether every string is UTF-8 (protobuf refuses others).
func ValidStrings(ss ...string) bool {
	for _, s := range ss {
		if !utf8.ValidString(s) {
			return false
		}
	}
	return true
}

// ValidTags reports whether every key and value of tags is UTF-8.
func ValidTags(tags map[string]string) bool {
	for k, v := range tags {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return false
		}
	}
	return true
}

func sizeEvent(m *kubemqpb.Event) int {
	n := SizeStringField(1, m.EventID) + SizeStringField(2, m.ClientID) + SizeStringField(3, m.Channel) + SizeStringField(4, m.Metadata) +
		SizeBytesField(5, m.Body) + SizeTagsField(7, m.Tags)
	if m.Store {
		n += 2
	}
	return n
}

// AppendEvent appends the encoding of m.
func AppendEvent(b []byte, m *kubemqpb.Event) ([]byte, bool) {
	if m == nil || len(m.ProtoReflect().GetUnknown()) > 0 ||
		!ValidStrings(m.EventID, m.ClientID, m.Channel, m.Metadata) || !ValidTags(m.Tags) {
		return b, false
	}
	b = AppendStringField(b, 1, m.EventID)
	b = AppendStringField(b, 2, m.ClientID)
	b = AppendStringField(b, 3, m.Channel)
	b = AppendStringField(b, 4, m.Metadata)
	b = AppendBytesField(b, 5, m.Body)
	b = AppendBoolField(b, 6, m.Store)
	return AppendTagsField(b, 7, m.Tags), true
}

func sizeEventReceive(m *kubemqpb.EventReceive) int {
	return SizeStringField(1, m.EventID) + SizeStringField(2, m.Channel) + SizeStringField(3, m.Metadata) + SizeBytesField(4, m.Body) +
		SizeVarintField(5, uint64(m.Timestamp)) + SizeVarintField(6, m.Sequence) + SizeTagsField(7, m.Tags)
}

// AppendEventReceive appends the encoding of m.
func AppendEventReceive(b []byte, m *kubemqpb.EventReceive) ([]byte, bool) {
	if m == nil || len(m.ProtoReflect().GetUnknown()) > 0 ||
		!ValidStrings(m.EventID, m.Channel, m.Metadata) || !ValidTags(m.Tags) {
		return b, false
	}
	b = AppendStringField(b, 1, m.EventID)
	b = AppendStringField(b, 2, m.Channel)
	b = AppendStringField(b, 3, m.Metadata)
	b = AppendBytesField(b, 4, m.Body)
	b = AppendVarintField(b, 5, uint64(m.Timestamp))
	b = AppendVarintField(b, 6, m.Sequence)
	return AppendTagsField(b, 7, m.Tags), true
}

func sizeAttributes(a *kubemqpb.QueueMessageAttributes) int {
	n := SizeVarintField(1, uint64(a.Timestamp)) + SizeVarintField(2, a.Sequence) + SizeStringField(3, a.MD5OfBody) +
		SizeVarintField(4, uint64(int64(a.ReceiveCount))) + SizeStringField(6, a.ReRoutedFromQueue) +
		SizeVarintField(7, uint64(a.ExpirationAt)) + SizeVarintField(8, uint64(a.DelayedTo))
	if a.ReRouted {
		n += 2
	}
	return n
}

func sizePolicy(p *kubemqpb.QueueMessagePolicy) int {
	return SizeVarintField(1, uint64(int64(p.ExpirationSeconds))) + SizeVarintField(2, uint64(int64(p.DelaySeconds))) +
		SizeVarintField(3, uint64(int64(p.MaxReceiveCount))) + SizeStringField(4, p.MaxReceiveQueue)
}

func sizeQueueMessage(m *kubemqpb.QueueMessage) int {
	n := SizeStringField(1, m.MessageID) + SizeStringField(2, m.ClientID) + SizeStringField(3, m.Channel) + SizeStringField(4, m.Metadata) +
		SizeBytesField(5, m.Body) + SizeTagsField(6, m.Tags) + SizeStringField(9, m.Topic) +
		SizeVarintField(10, uint64(int64(m.Partition))) + SizeStringField(11, m.PartitionKey)
	if m.Attributes != nil {
		n += SizeMessageField(7, sizeAttributes(m.Attributes))
	}
	if m.Policy != nil {
		n += SizeMessageField(8, sizePolicy(m.Policy))
	}
	return n
}

// AppendQueueMessage appends the encoding of m.
func AppendQueueMessage(b []byte, m *kubemqpb.QueueMessage) ([]byte, bool) {
	if !queueMessageOK(m) {
		return b, false
	}
	return appendQueueMessage(b, m), true
}

func queueMessageOK(m *kubemqpb.QueueMessage) bool {
	if m == nil || len(m.ProtoReflect().GetUnknown()) > 0 ||
		!ValidStrings(m.MessageID, m.ClientID, m.Channel, m.Metadata, m.Topic, m.PartitionKey) || !ValidTags(m.Tags) {
		return false
	}
	if a := m.Attributes; a != nil && (len(a.ProtoReflect().GetUnknown()) > 0 || !ValidStrings(a.MD5OfBody, a.ReRoutedFromQueue)) {
		return false
	}
	if p := m.Policy; p != nil && (len(p.ProtoReflect().GetUnknown()) > 0 || !ValidStrings(p.MaxReceiveQueue)) {
		return false
	}
	return true
}

func appendQueueMessage(b []byte, m *kubemqpb.QueueMessage) []byte {
	b = AppendStringField(b, 1, m.MessageID)
	b = AppendStringField(b, 2, m.ClientID)
	b = AppendStringField(b, 3, m.Channel)
	b = AppendStringField(b, 4, m.Metadata)
	b = AppendBytesField(b, 5, m.Body)
	b = AppendTagsField(b, 6, m.Tags)
	if a := m.Attributes; a != nil {
		b = AppendMessageHeader(b, 7, sizeAttributes(a))
		b = AppendVarintField(b, 1, uint64(a.Timestamp))
		b = AppendVarintField(b, 2, a.Sequence)
		b = AppendStringField(b, 3, a.MD5OfBody)
		b = AppendVarintField(b, 4, uint64(int64(a.ReceiveCount)))
		b = AppendBoolField(b, 5, a.ReRouted)
		b = AppendStringField(b, 6, a.ReRoutedFromQueue)
		b = AppendVarintField(b, 7, uint64(a.ExpirationAt))
		b = AppendVarintField(b, 8, uint64(a.DelayedTo))
	}
	if p := m.Policy; p != nil {
		b = AppendMessageHeader(b, 8, sizePolicy(p))
		b = AppendVarintField(b, 1, uint64(int64(p.ExpirationSeconds)))
		b = AppendVarintField(b, 2, uint64(int64(p.DelaySeconds)))
		b = AppendVarintField(b, 3, uint64(int64(p.MaxReceiveCount)))
		b = AppendStringField(b, 4, p.MaxReceiveQueue)
	}
	b = AppendStringField(b, 9, m.Topic)
	b = AppendVarintField(b, 10, uint64(int64(m.Partition)))
	return AppendStringField(b, 11, m.PartitionKey)
}

// The repeated QueueMessage field of a batch and of a Get answer.

func sizeQueueMessages(num protowire.Number, ms []*kubemqpb.QueueMessage) int {
	n := 0
	for _, q := range ms {
		n += SizeMessageField(num, sizeQueueMessage(q))
	}
	return n
}

func queueMessagesOK(ms []*kubemqpb.QueueMessage) bool {
	for _, q := range ms {
		if !queueMessageOK(q) {
			return false
		}
	}
	return true
}

func appendQueueMessages(b []byte, num protowire.Number, ms []*kubemqpb.QueueMessage) []byte {
	for _, q := range ms {
		b = AppendMessageHeader(b, num, sizeQueueMessage(q))
		b = appendQueueMessage(b, q)
	}
	return b
}

// AppendQueueMessagesBatchRequest appends the encoding of m.
func AppendQueueMessagesBatchRequest(b []byte, m *kubemqpb.QueueMessagesBatchRequest) ([]byte, bool) {
	if m == nil || len(m.ProtoReflect().GetUnknown()) > 0 || !ValidStrings(m.BatchID) || !queueMessagesOK(m.Messages) {
		return b, false
	}
	b = AppendStringField(b, 1, m.BatchID)
	return appendQueueMessages(b, 2, m.Messages), true
}

// packedLen is the length of vs as a packed repeated varint field's content.
func packedLen(vs []int64) int {
	n := 0
	for _, v := range vs {
		n += protowire.SizeVarint(uint64(v))
	}
	return n
}

func sizePacked(num protowire.Number, vs []int64) int {
	if len(vs) == 0 {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeBytes(packedLen(vs))
}

func sizeDownstreamResponse(m *kubemqpb.QueuesDownstreamResponse) int {
	n := SizeStringField(1, m.TransactionId) + SizeStringField(2, m.RefRequestId) + SizeVarintField(3, uint64(int64(m.RequestTypeData))) +
		sizeQueueMessages(4, m.Messages) + sizePacked(5, m.ActiveOffsets) + SizeStringField(7, m.Error) + SizeTagsField(9, m.Metadata)
	if m.IsError {
		n += 2
	}
	if m.TransactionComplete {
		n += 2
	}
	return n
}

// AppendQueuesDownstreamResponse appends the encoding of m.
func AppendQueuesDownstreamResponse(b []byte, m *kubemqpb.QueuesDownstreamResponse) ([]byte, bool) {
	if m == nil || len(m.ProtoReflect().GetUnknown()) > 0 || !ValidStrings(m.TransactionId, m.RefRequestId, m.Error) ||
		!ValidTags(m.Metadata) || !queueMessagesOK(m.Messages) {
		return b, false
	}
	b = AppendStringField(b, 1, m.TransactionId)
	b = AppendStringField(b, 2, m.RefRequestId)
	b = AppendVarintField(b, 3, uint64(int64(m.RequestTypeData)))
	b = appendQueueMessages(b, 4, m.Messages)
	if len(m.ActiveOffsets) > 0 {
		b = AppendMessageHeader(b, 5, packedLen(m.ActiveOffsets))
		for _, v := range m.ActiveOffsets {
			b = protowire.AppendVarint(b, uint64(v))
		}
	}
	b = AppendBoolField(b, 6, m.IsError)
	b = AppendStringField(b, 7, m.Error)
	b = AppendBoolField(b, 8, m.TransactionComplete)
	return AppendTagsField(b, 9, m.Metadata), true
}
