package fastpb

import (
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/kubemq-io/kubemq-proxy/kubemqpb"
)

// Unmarshal decodes b into v when v is one of the messages this package
// decodes and b holds only fields it knows, with the wire types the schema
// gives them. Otherwise it reports false, possibly after writing to v, and
// the caller decodes with proto.Unmarshal (which resets v first), so
// unknown fields, odd encodings and errors are handled as protobuf does.
// Decoded strings and bytes are copies: b may be reused afterwards.
func Unmarshal(b []byte, v any) bool {
	switch m := v.(type) {
	case *kubemqpb.Event:
		m.Reset()
		return decodeEvent(b, m)
	case *kubemqpb.QueueMessagesBatchRequest:
		m.Reset()
		return decodeBatch(b, m)
	case *kubemqpb.QueuesDownstreamResponse:
		m.Reset()
		return decodeDownstreamResponse(b, m)
	case *kubemqpb.QueueMessage:
		m.Reset()
		var ks Keys
		return decodeQueueMessage(b, m, &ks)
	}
	return false
}

// Field is one field's tag and value as NextField read it: for bytes
// fields val is the content, for varint fields n holds the value. Other
// packages' hand-written decoders use it too (amqp091's peer link).
type Field struct {
	num protowire.Number
	typ protowire.Type
	val []byte
	n   uint64
}

// NextField consumes one field from b; ok is false for anything malformed or of
// a wire type other than varint and bytes.
func NextField(b []byte) (f Field, rest []byte, ok bool) {
	num, typ, k := protowire.ConsumeTag(b)
	if k < 0 {
		return f, nil, false
	}
	b = b[k:]
	f.num, f.typ = num, typ
	switch typ {
	case protowire.VarintType:
		v, k := protowire.ConsumeVarint(b)
		if k < 0 {
			return f, nil, false
		}
		f.n = v
		return f, b[k:], true
	case protowire.BytesType:
		v, k := protowire.ConsumeBytes(b)
		if k < 0 {
			return f, nil, false
		}
		f.val = v
		return f, b[k:], true
	}
	return f, nil, false
}

// Str returns a bytes field as a string; ok is false for a wrong wire type
// or invalid UTF-8 (protobuf refuses those for proto3 strings).
func (f Field) Str() (string, bool) {
	if f.typ != protowire.BytesType || !utf8.Valid(f.val) {
		return "", false
	}
	return string(f.val), true
}

// Bytes returns a copy of a bytes field's content; ok is false for a wrong
// wire type.
func (f Field) Bytes() ([]byte, bool) {
	if f.typ != protowire.BytesType {
		return nil, false
	}
	return append([]byte(nil), f.val...), true
}

// Varint returns a varint field's value; ok is false for a wrong wire type.
func (f Field) Varint() (uint64, bool) { return f.n, f.typ == protowire.VarintType }

// Num is the field's number.
func (f Field) Num() protowire.Number { return f.num }

// Message returns a bytes field's content without copying it (a nested
// message to decode in turn); ok is false for a wrong wire type.
func (f Field) Message() ([]byte, bool) { return f.val, f.typ == protowire.BytesType }

// Keys interns tag keys within one decode: the messages of a batch share
// theirs (the proxy's reserved tags), and each would otherwise hold its own
// copies for as long as it is leased. A fixed array: it lives on the
// decoder's stack, where a slice would be allocated as it grew.
type Keys struct {
	n  int
	ks [16]string
}

// Get returns b as a UTF-8 string, the same string for the same key
// within this Keys; ok is false when b is not UTF-8.
func (ks *Keys) Get(b []byte) (string, bool) {
	for _, k := range ks.ks[:ks.n] {
		if k == string(b) { // no allocation for the comparison
			return k, true
		}
	}
	if !utf8.Valid(b) {
		return "", false
	}
	k := string(b)
	if ks.n < len(ks.ks) {
		ks.ks[ks.n] = k
		ks.n++
	}
	return k, true
}

// MapEntry decodes one map<string,string> entry into tags (made when nil).
func MapEntry(b []byte, tags *map[string]string, ks *Keys) bool {
	var k, v string
	for len(b) > 0 {
		f, rest, ok := NextField(b)
		if !ok {
			return false
		}
		b = rest
		switch f.num {
		case 1:
			if f.typ != protowire.BytesType {
				return false
			}
			if k, ok = ks.Get(f.val); !ok {
				return false
			}
		case 2:
			if v, ok = f.Str(); !ok {
				return false
			}
		default:
			return false
		}
	}
	if *tags == nil {
		*tags = make(map[string]string, 4)
	}
	(*tags)[k] = v
	return true
}

func decodeEvent(b []byte, m *kubemqpb.Event) bool {
	var ks Keys
	for len(b) > 0 {
		f, rest, ok := NextField(b)
		if !ok {
			return false
		}
		b = rest
		switch f.num {
		case 1:
			m.EventID, ok = f.Str()
		case 2:
			m.ClientID, ok = f.Str()
		case 3:
			m.Channel, ok = f.Str()
		case 4:
			m.Metadata, ok = f.Str()
		case 5:
			m.Body, ok = f.Bytes()
		case 6:
			var v uint64
			v, ok = f.Varint()
			m.Store = v != 0
		case 7:
			ok = f.typ == protowire.BytesType && MapEntry(f.val, &m.Tags, &ks)
		default:
			return false
		}
		if !ok {
			return false
		}
	}
	return true
}

func decodeBatch(b []byte, m *kubemqpb.QueueMessagesBatchRequest) bool {
	var ks Keys
	for len(b) > 0 {
		f, rest, ok := NextField(b)
		if !ok {
			return false
		}
		b = rest
		switch f.num {
		case 1:
			m.BatchID, ok = f.Str()
		case 2:
			q := &kubemqpb.QueueMessage{}
			ok = f.typ == protowire.BytesType && decodeQueueMessage(f.val, q, &ks)
			m.Messages = append(m.Messages, q)
		default:
			return false
		}
		if !ok {
			return false
		}
	}
	return true
}

func decodeQueueMessage(b []byte, m *kubemqpb.QueueMessage, ks *Keys) bool {
	for len(b) > 0 {
		f, rest, ok := NextField(b)
		if !ok {
			return false
		}
		b = rest
		var v uint64
		switch f.num {
		case 1:
			m.MessageID, ok = f.Str()
		case 2:
			m.ClientID, ok = f.Str()
		case 3:
			m.Channel, ok = f.Str()
		case 4:
			m.Metadata, ok = f.Str()
		case 5:
			m.Body, ok = f.Bytes()
		case 6:
			ok = f.typ == protowire.BytesType && MapEntry(f.val, &m.Tags, ks)
		case 7:
			if m.Attributes == nil {
				m.Attributes = &kubemqpb.QueueMessageAttributes{}
			}
			ok = f.typ == protowire.BytesType && decodeAttributes(f.val, m.Attributes)
		case 8:
			if m.Policy == nil {
				m.Policy = &kubemqpb.QueueMessagePolicy{}
			}
			ok = f.typ == protowire.BytesType && decodePolicy(f.val, m.Policy)
		case 9:
			m.Topic, ok = f.Str()
		case 10:
			v, ok = f.Varint()
			m.Partition = int32(v)
		case 11:
			m.PartitionKey, ok = f.Str()
		default:
			return false
		}
		if !ok {
			return false
		}
	}
	return true
}

func decodeAttributes(b []byte, a *kubemqpb.QueueMessageAttributes) bool {
	for len(b) > 0 {
		f, rest, ok := NextField(b)
		if !ok {
			return false
		}
		b = rest
		var v uint64
		switch f.num {
		case 1:
			v, ok = f.Varint()
			a.Timestamp = int64(v)
		case 2:
			a.Sequence, ok = f.Varint()
		case 3:
			a.MD5OfBody, ok = f.Str()
		case 4:
			v, ok = f.Varint()
			a.ReceiveCount = int32(v)
		case 5:
			v, ok = f.Varint()
			a.ReRouted = v != 0
		case 6:
			a.ReRoutedFromQueue, ok = f.Str()
		case 7:
			v, ok = f.Varint()
			a.ExpirationAt = int64(v)
		case 8:
			v, ok = f.Varint()
			a.DelayedTo = int64(v)
		default:
			return false
		}
		if !ok {
			return false
		}
	}
	return true
}

func decodePolicy(b []byte, p *kubemqpb.QueueMessagePolicy) bool {
	for len(b) > 0 {
		f, rest, ok := NextField(b)
		if !ok {
			return false
		}
		b = rest
		var v uint64
		switch f.num {
		case 1:
			v, ok = f.Varint()
			p.ExpirationSeconds = int32(v)
		case 2:
			v, ok = f.Varint()
			p.DelaySeconds = int32(v)
		case 3:
			v, ok = f.Varint()
			p.MaxReceiveCount = int32(v)
		case 4:
			p.MaxReceiveQueue, ok = f.Str()
		default:
			return false
		}
		if !ok {
			return false
		}
	}
	return true
}

// decodeDownstreamResponse leaves ActiveOffsets (rare, packed or not) to
// protobuf.
func decodeDownstreamResponse(b []byte, m *kubemqpb.QueuesDownstreamResponse) bool {
	var ks Keys
	for len(b) > 0 {
		f, rest, ok := NextField(b)
		if !ok {
			return false
		}
		b = rest
		var v uint64
		switch f.num {
		case 1:
			m.TransactionId, ok = f.Str()
		case 2:
			m.RefRequestId, ok = f.Str()
		case 3:
			v, ok = f.Varint()
			m.RequestTypeData = kubemqpb.QueuesDownstreamRequestType(int32(v))
		case 4:
			q := &kubemqpb.QueueMessage{}
			ok = f.typ == protowire.BytesType && decodeQueueMessage(f.val, q, &ks)
			m.Messages = append(m.Messages, q)
		case 6:
			v, ok = f.Varint()
			m.IsError = v != 0
		case 7:
			m.Error, ok = f.Str()
		case 8:
			v, ok = f.Varint()
			m.TransactionComplete = v != 0
		case 9:
			ok = f.typ == protowire.BytesType && MapEntry(f.val, &m.Metadata, &ks)
		default:
			return false
		}
		if !ok {
			return false
		}
	}
	return true
}
