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
		var ks keys
		return decodeQueueMessage(b, m, &ks)
	}
	return false
}

// field reads one field's tag and value: for bytes fields val is the
// content, for varint fields n holds the value.
type field struct {
	num protowire.Number
	typ protowire.Type
	val []byte
	n   uint64
}

// next consumes one field from b; ok is false for anything malformed or of
// a wire type other than varint and bytes.
func next(b []byte) (f field, rest []byte, ok bool) {
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

// str returns a bytes field as a string; ok is false for a wrong wire type
// or invalid UTF-8 (protobuf refuses those for proto3 strings).
func (f field) str() (string, bool) {
	if f.typ != protowire.BytesType || !utf8.Valid(f.val) {
		return "", false
	}
	return string(f.val), true
}

func (f field) bytes() ([]byte, bool) {
	if f.typ != protowire.BytesType {
		return nil, false
	}
	return append([]byte(nil), f.val...), true
}

func (f field) varint() (uint64, bool) { return f.n, f.typ == protowire.VarintType }

// keys interns tag keys within one decode: the messages of a batch share
// theirs (the proxy's reserved tags), and each would otherwise hold its own
// copies for as long as it is leased. A fixed array: it lives on the
// decoder's stack, where a slice would be allocated as it grew.
type keys struct {
	n  int
	ks [16]string
}

func (ks *keys) get(b []byte) (string, bool) {
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

// mapEntry decodes one map<string,string> entry into tags.
func mapEntry(b []byte, tags *map[string]string, ks *keys) bool {
	var k, v string
	for len(b) > 0 {
		f, rest, ok := next(b)
		if !ok {
			return false
		}
		b = rest
		switch f.num {
		case 1:
			if f.typ != protowire.BytesType {
				return false
			}
			if k, ok = ks.get(f.val); !ok {
				return false
			}
		case 2:
			if v, ok = f.str(); !ok {
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
	var ks keys
	for len(b) > 0 {
		f, rest, ok := next(b)
		if !ok {
			return false
		}
		b = rest
		switch f.num {
		case 1:
			m.EventID, ok = f.str()
		case 2:
			m.ClientID, ok = f.str()
		case 3:
			m.Channel, ok = f.str()
		case 4:
			m.Metadata, ok = f.str()
		case 5:
			m.Body, ok = f.bytes()
		case 6:
			var v uint64
			v, ok = f.varint()
			m.Store = v != 0
		case 7:
			ok = f.typ == protowire.BytesType && mapEntry(f.val, &m.Tags, &ks)
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
	var ks keys
	for len(b) > 0 {
		f, rest, ok := next(b)
		if !ok {
			return false
		}
		b = rest
		switch f.num {
		case 1:
			m.BatchID, ok = f.str()
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

func decodeQueueMessage(b []byte, m *kubemqpb.QueueMessage, ks *keys) bool {
	for len(b) > 0 {
		f, rest, ok := next(b)
		if !ok {
			return false
		}
		b = rest
		var v uint64
		switch f.num {
		case 1:
			m.MessageID, ok = f.str()
		case 2:
			m.ClientID, ok = f.str()
		case 3:
			m.Channel, ok = f.str()
		case 4:
			m.Metadata, ok = f.str()
		case 5:
			m.Body, ok = f.bytes()
		case 6:
			ok = f.typ == protowire.BytesType && mapEntry(f.val, &m.Tags, ks)
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
			m.Topic, ok = f.str()
		case 10:
			v, ok = f.varint()
			m.Partition = int32(v)
		case 11:
			m.PartitionKey, ok = f.str()
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
		f, rest, ok := next(b)
		if !ok {
			return false
		}
		b = rest
		var v uint64
		switch f.num {
		case 1:
			v, ok = f.varint()
			a.Timestamp = int64(v)
		case 2:
			a.Sequence, ok = f.varint()
		case 3:
			a.MD5OfBody, ok = f.str()
		case 4:
			v, ok = f.varint()
			a.ReceiveCount = int32(v)
		case 5:
			v, ok = f.varint()
			a.ReRouted = v != 0
		case 6:
			a.ReRoutedFromQueue, ok = f.str()
		case 7:
			v, ok = f.varint()
			a.ExpirationAt = int64(v)
		case 8:
			v, ok = f.varint()
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
		f, rest, ok := next(b)
		if !ok {
			return false
		}
		b = rest
		var v uint64
		switch f.num {
		case 1:
			v, ok = f.varint()
			p.ExpirationSeconds = int32(v)
		case 2:
			v, ok = f.varint()
			p.DelaySeconds = int32(v)
		case 3:
			v, ok = f.varint()
			p.MaxReceiveCount = int32(v)
		case 4:
			p.MaxReceiveQueue, ok = f.str()
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
	var ks keys
	for len(b) > 0 {
		f, rest, ok := next(b)
		if !ok {
			return false
		}
		b = rest
		var v uint64
		switch f.num {
		case 1:
			m.TransactionId, ok = f.str()
		case 2:
			m.RefRequestId, ok = f.str()
		case 3:
			v, ok = f.varint()
			m.RequestTypeData = kubemqpb.QueuesDownstreamRequestType(int32(v))
		case 4:
			q := &kubemqpb.QueueMessage{}
			ok = f.typ == protowire.BytesType && decodeQueueMessage(f.val, q, &ks)
			m.Messages = append(m.Messages, q)
		case 6:
			v, ok = f.varint()
			m.IsError = v != 0
		case 7:
			m.Error, ok = f.str()
		case 8:
			v, ok = f.varint()
			m.TransactionComplete = v != 0
		case 9:
			ok = f.typ == protowire.BytesType && mapEntry(f.val, &m.Metadata, &ks)
		default:
			return false
		}
		if !ok {
			return false
		}
	}
	return true
}
