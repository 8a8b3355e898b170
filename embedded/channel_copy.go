package embedded

import (
	"maps"
	"slices"

	"google.golang.org/protobuf/proto"

	pb "github.com/kubemq-io/kubemq-proxy/kubemqpb"
)

// The messages of the hot paths are copied field by field: protobuf's
// reflective Clone costs about three times as much (a fifth of a microsecond
// per tag map entry). copyInto's test fills every field of every message
// type by reflection, so a field added to the proto and not here fails it.

// depth says how much of a message a copy shares with its source.
type depth uint8

const (
	// shallow shares bytes, maps, lists and nested messages: for a message
	// that was already copied for this crossing.
	shallow depth = iota
	// deep copies everything.
	deep
	// deepButPayload copies everything except the payload of the messages
	// a client stores, Event and QueueMessage: their Body and Tags are
	// handed over (a SharePayloads channel's requests).
	deepButPayload
)

// cloneMessage returns a copy of m to depth d (deep or deepButPayload).
func cloneMessage(m proto.Message, d depth) proto.Message {
	var c proto.Message
	switch m.(type) { // the streamed ones: ProtoReflect().Type().New() costs more than the copy
	case *pb.Event:
		c = new(pb.Event)
	case *pb.Result:
		c = new(pb.Result)
	case *pb.EventReceive:
		c = new(pb.EventReceive)
	case *pb.QueuesUpstreamRequest:
		c = new(pb.QueuesUpstreamRequest)
	case *pb.QueuesUpstreamResponse:
		c = new(pb.QueuesUpstreamResponse)
	case *pb.QueuesDownstreamRequest:
		c = new(pb.QueuesDownstreamRequest)
	case *pb.QueuesDownstreamResponse:
		c = new(pb.QueuesDownstreamResponse)
	default:
		c = m.ProtoReflect().Type().New().Interface()
	}
	copyMessage(c, m, d)
	return c
}

// copyMessage sets dst (a message of src's type) to src's content.
func copyMessage(dst, src proto.Message, deep depth) {
	switch d := dst.(type) {
	case *pb.Event:
		copyEvent(d, src.(*pb.Event), deep)
	case *pb.Result:
		s := src.(*pb.Result)
		d.EventID, d.Sent, d.Error = s.EventID, s.Sent, s.Error
	case *pb.EventReceive:
		copyEventReceive(d, src.(*pb.EventReceive), deep)
	case *pb.QueueMessage:
		copyQueueMessage(d, src.(*pb.QueueMessage), deep)
	case *pb.SendQueueMessageResult:
		copySendResult(d, src.(*pb.SendQueueMessageResult))
	case *pb.QueueMessagesBatchRequest:
		s := src.(*pb.QueueMessagesBatchRequest)
		d.BatchID, d.Messages = s.BatchID, queueMessages(s.Messages, deep)
	case *pb.QueueMessagesBatchResponse:
		s := src.(*pb.QueueMessagesBatchResponse)
		d.BatchID, d.Results, d.HaveErrors = s.BatchID, sendResults(s.Results, deep), s.HaveErrors
	case *pb.QueuesUpstreamRequest:
		s := src.(*pb.QueuesUpstreamRequest)
		d.RequestID, d.Messages = s.RequestID, queueMessages(s.Messages, deep)
	case *pb.QueuesUpstreamResponse:
		s := src.(*pb.QueuesUpstreamResponse)
		d.RefRequestID, d.Results, d.IsError, d.Error = s.RefRequestID, sendResults(s.Results, deep), s.IsError, s.Error
	case *pb.QueuesDownstreamRequest:
		s := src.(*pb.QueuesDownstreamRequest)
		d.RequestID, d.ClientID, d.RequestTypeData, d.Channel = s.RequestID, s.ClientID, s.RequestTypeData, s.Channel
		d.MaxItems, d.WaitTimeout, d.AutoAck, d.ReQueueChannel = s.MaxItems, s.WaitTimeout, s.AutoAck, s.ReQueueChannel
		d.SequenceRange, d.RefTransactionId, d.Metadata = sliceOf(s.SequenceRange, deep), s.RefTransactionId, mapOf(s.Metadata, deep)
	case *pb.QueuesDownstreamResponse:
		s := src.(*pb.QueuesDownstreamResponse)
		d.TransactionId, d.RefRequestId, d.RequestTypeData = s.TransactionId, s.RefRequestId, s.RequestTypeData
		d.Messages, d.ActiveOffsets = queueMessages(s.Messages, deep), sliceOf(s.ActiveOffsets, deep)
		d.IsError, d.Error, d.TransactionComplete, d.Metadata = s.IsError, s.Error, s.TransactionComplete, mapOf(s.Metadata, deep)
	case *pb.QueuesInfoRequest:
		s := src.(*pb.QueuesInfoRequest)
		d.RequestID, d.QueueName = s.RequestID, s.QueueName
	case *pb.QueuesInfoResponse:
		s := src.(*pb.QueuesInfoResponse)
		d.RefRequestID, d.Info = s.RefRequestID, s.Info
		if deep != shallow {
			d.Info = cloneQueuesInfo(s.Info)
		}
	case *pb.Empty:
	case *pb.PingResult:
		s := src.(*pb.PingResult)
		d.Host, d.Version, d.ServerStartTime, d.ServerUpTimeSeconds = s.Host, s.Version, s.ServerStartTime, s.ServerUpTimeSeconds
	default:
		proto.Reset(dst)
		proto.Merge(dst, src)
	}
}

func copyEvent(d, s *pb.Event, deep depth) {
	d.EventID, d.ClientID, d.Channel, d.Metadata, d.Store = s.EventID, s.ClientID, s.Channel, s.Metadata, s.Store
	d.Body, d.Tags = sliceOf(s.Body, deep.payload()), mapOf(s.Tags, deep.payload())
}

func copyEventReceive(d, s *pb.EventReceive, deep depth) {
	d.EventID, d.Channel, d.Metadata, d.Timestamp, d.Sequence = s.EventID, s.Channel, s.Metadata, s.Timestamp, s.Sequence
	d.Body, d.Tags = sliceOf(s.Body, deep), mapOf(s.Tags, deep)
}

func copyQueueMessage(d, s *pb.QueueMessage, deep depth) {
	d.MessageID, d.ClientID, d.Channel, d.Metadata = s.MessageID, s.ClientID, s.Channel, s.Metadata
	d.Body, d.Tags = sliceOf(s.Body, deep.payload()), mapOf(s.Tags, deep.payload())
	d.Topic, d.Partition, d.PartitionKey = s.Topic, s.Partition, s.PartitionKey
	d.Attributes, d.Policy = s.Attributes, s.Policy
	if deep == shallow {
		return
	}
	if a := s.Attributes; a != nil {
		d.Attributes = &pb.QueueMessageAttributes{Timestamp: a.Timestamp, Sequence: a.Sequence, MD5OfBody: a.MD5OfBody, ReceiveCount: a.ReceiveCount,
			ReRouted: a.ReRouted, ReRoutedFromQueue: a.ReRoutedFromQueue, ExpirationAt: a.ExpirationAt, DelayedTo: a.DelayedTo}
	}
	if p := s.Policy; p != nil {
		d.Policy = &pb.QueueMessagePolicy{ExpirationSeconds: p.ExpirationSeconds, DelaySeconds: p.DelaySeconds,
			MaxReceiveCount: p.MaxReceiveCount, MaxReceiveQueue: p.MaxReceiveQueue}
	}
}

func cloneQueuesInfo(s *pb.QueuesInfo) *pb.QueuesInfo {
	if s == nil {
		return nil
	}
	d := &pb.QueuesInfo{TotalQueue: s.TotalQueue, Sent: s.Sent, Delivered: s.Delivered, Waiting: s.Waiting}
	if s.Queues == nil {
		return d
	}
	d.Queues = make([]*pb.QueueInfo, len(s.Queues))
	for i, q := range s.Queues {
		if q != nil {
			d.Queues[i] = &pb.QueueInfo{Name: q.Name, Messages: q.Messages, Bytes: q.Bytes, FirstSequence: q.FirstSequence,
				LastSequence: q.LastSequence, Sent: q.Sent, Delivered: q.Delivered, Waiting: q.Waiting, Subscribers: q.Subscribers}
		}
	}
	return d
}

func copySendResult(d, s *pb.SendQueueMessageResult) {
	d.MessageID, d.SentAt, d.ExpirationAt, d.DelayedTo, d.IsError = s.MessageID, s.SentAt, s.ExpirationAt, s.DelayedTo, s.IsError
	d.Error, d.RefChannel, d.RefTopic, d.RefPartition, d.RefHash = s.Error, s.RefChannel, s.RefTopic, s.RefPartition, s.RefHash
}

func queueMessages(ms []*pb.QueueMessage, deep depth) []*pb.QueueMessage {
	if deep == shallow || ms == nil {
		return ms
	}
	out := make([]*pb.QueueMessage, len(ms))
	backing := make([]pb.QueueMessage, len(ms)) // one allocation for the batch
	for i, m := range ms {
		if m != nil {
			copyQueueMessage(&backing[i], m, deep)
			out[i] = &backing[i]
		}
	}
	return out
}

func sendResults(rs []*pb.SendQueueMessageResult, deep depth) []*pb.SendQueueMessageResult {
	if deep == shallow || rs == nil {
		return rs
	}
	out := make([]*pb.SendQueueMessageResult, len(rs))
	backing := make([]pb.SendQueueMessageResult, len(rs))
	for i, r := range rs {
		if r != nil {
			copySendResult(&backing[i], r)
			out[i] = &backing[i]
		}
	}
	return out
}

// payload is the depth for a stored message's Body and Tags.
func (d depth) payload() depth {
	if d == deepButPayload {
		return shallow
	}
	return d
}

func sliceOf[T any](b []T, deep depth) []T {
	if deep == shallow || b == nil {
		return b
	}
	return slices.Clone(b)
}

func mapOf(m map[string]string, deep depth) map[string]string {
	if deep == shallow || m == nil {
		return m
	}
	return maps.Clone(m)
}

// sizeHint is a cheap upper bound of m's encoding for the messages that
// can be large, 0 for the others.
func sizeHint(m proto.Message) int {
	switch v := m.(type) {
	case *pb.Event:
		return 64 + len(v.EventID) + len(v.ClientID) + len(v.Channel) + len(v.Metadata) + len(v.Body) + tagsHint(v.Tags)
	case *pb.EventReceive:
		return 64 + len(v.EventID) + len(v.Channel) + len(v.Metadata) + len(v.Body) + tagsHint(v.Tags)
	case *pb.QueueMessage:
		return queueMessageHint(v)
	case *pb.QueueMessagesBatchRequest:
		return queueMessagesHint(v.Messages)
	case *pb.QueuesUpstreamRequest:
		return queueMessagesHint(v.Messages)
	case *pb.QueuesDownstreamResponse:
		return queueMessagesHint(v.Messages) + 16*len(v.ActiveOffsets) + tagsHint(v.Metadata)
	case *pb.ReceiveQueueMessagesResponse:
		return queueMessagesHint(v.Messages)
	case *pb.StreamQueueMessagesRequest:
		return 64 + queueMessageHint(v.ModifiedMessage)
	case *pb.StreamQueueMessagesResponse:
		return 64 + queueMessageHint(v.Message)
	case *pb.Request:
		return 128 + len(v.Metadata) + len(v.Body) + len(v.Span) + tagsHint(v.Tags)
	case *pb.Response:
		return 128 + len(v.Metadata) + len(v.Body) + len(v.Span) + len(v.Error) + tagsHint(v.Tags)
	}
	return 0
}

func tagsHint(m map[string]string) int {
	n := 0
	for k, v := range m {
		n += len(k) + len(v) + 16
	}
	return n
}

func queueMessageHint(m *pb.QueueMessage) int {
	if m == nil {
		return 0
	}
	n := 256 + len(m.MessageID) + len(m.ClientID) + len(m.Channel) + len(m.Metadata) + len(m.Body) + tagsHint(m.Tags) +
		len(m.Topic) + len(m.PartitionKey)
	if a := m.Attributes; a != nil {
		n += len(a.MD5OfBody) + len(a.ReRoutedFromQueue)
	}
	if p := m.Policy; p != nil {
		n += len(p.MaxReceiveQueue)
	}
	return n
}

func queueMessagesHint(ms []*pb.QueueMessage) int {
	n := 0
	for _, m := range ms {
		n += queueMessageHint(m)
	}
	return n
}
