package embedded

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/kubemq-io/kubemq-proxy/kubemqclient/fastpb"
	"github.com/kubemq-io/kubemq-proxy/kubemqpb"
)

// Log record types. A record is framed as [u32 length][u32 CRC-32C][u8 type][payload], length
// counting type and payload.
const (
	recQueueMsg    byte = 1 // proto QueueMessage, stored form (Attributes.Sequence is the key)
	recQueueDel    byte = 2 // queue name, count, sequences: copies settled or dropped
	recEvent       byte = 3 // proto EventReceive (Channel, Sequence, Timestamp)
	recDelayAdd    byte = 4 // delay id, proto QueueMessage with Attributes.DelayedTo
	recDelayDone   byte = 5 // count, delay ids moved into their queues
	recCursor      byte = 6 // durable key, channel, cursor
	recQueueMeta   byte = 7 // queue name, last sequence, sent, delivered
	recChannelMeta byte = 8 // channel name, last sequence
	recPurge       byte = 9 // kind (recPurgeQueue or recPurgeChannel), name: deleted for inactivity
)

// Kinds of recPurge.
const (
	recPurgeQueue   byte = 1
	recPurgeChannel byte = 2
)

const frameHeader = 9

// maxRecord bounds one record: a message plus its envelope.
const maxRecord = maxGRPCMessage + 1<<20

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

var errCorrupt = errors.New("corrupt log record")

// frame appends one framed record to dst.
func frame(dst []byte, typ byte, payload []byte) []byte {
	n := 1 + len(payload)
	var h [frameHeader]byte
	binary.LittleEndian.PutUint32(h[0:4], uint32(n))
	h[8] = typ
	c := crc32.Update(0, castagnoli, h[8:9])
	c = crc32.Update(c, castagnoli, payload)
	binary.LittleEndian.PutUint32(h[4:8], c)
	dst = append(dst, h[:]...)
	return append(dst, payload...)
}

// frameMessage appends one framed record whose payload is m's encoding, marshalled in place
// (no intermediate buffer; without reflection for the stored message types).
func frameMessage(dst []byte, typ byte, m proto.Message) []byte {
	start := len(dst)
	var h [frameHeader]byte
	h[8] = typ
	dst = append(dst, h[:]...)
	var ok bool
	if dst, ok = fastpb.Marshal(dst, m); !ok {
		dst, _ = proto.MarshalOptions{}.MarshalAppend(dst, m)
	}
	binary.LittleEndian.PutUint32(dst[start:start+4], uint32(len(dst)-start-8))
	c := crc32.Update(0, castagnoli, dst[start+8:])
	binary.LittleEndian.PutUint32(dst[start+4:start+8], c)
	return dst
}

// unframe reads the record at the start of b. n is the bytes consumed; err is errCorrupt for a
// torn or damaged frame (the log is cut there).
func unframe(b []byte) (typ byte, payload []byte, n int, err error) {
	if len(b) < frameHeader {
		return 0, nil, 0, errCorrupt
	}
	size := int(binary.LittleEndian.Uint32(b[0:4]))
	if size < 1 || size > maxRecord || len(b) < 8+size {
		return 0, nil, 0, errCorrupt
	}
	body := b[8 : 8+size]
	if crc32.Checksum(body, castagnoli) != binary.LittleEndian.Uint32(b[4:8]) {
		return 0, nil, 0, errCorrupt
	}
	return body[0], body[1:], 8 + size, nil
}

// dec reads the small hand-encoded records; the first failure sticks.
type dec struct {
	b   []byte
	err error
}

func (d *dec) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = errCorrupt
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *dec) str() string {
	n := d.uvarint()
	if d.err != nil {
		return ""
	}
	if n > uint64(len(d.b)) {
		d.err = errCorrupt
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}

func (d *dec) rest() []byte {
	b := d.b
	d.b = nil
	return b
}

func putStr(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// record is one decoded log record.
type record struct {
	typ     byte
	qm      *kubemqpb.QueueMessage // recQueueMsg, recDelayAdd
	ev      *kubemqpb.EventReceive // recEvent
	name    string                 // queue, channel or durable key
	channel string                 // recCursor
	id      uint64                 // recDelayAdd
	nums    []uint64               // recQueueDel sequences, recDelayDone ids; meta values
	size    int64                  // recQueueMsg read by indexQueueRecord: the message's messageSize
}

// indexQueueRecord reads what recovery keeps of a queue record (recQueueMsg) without copying its
// body or other contents: a message with only Channel, Attributes and Policy, and the stored
// message's messageSize. The record is read back whole when it is delivered. Malformed input is
// an error, never a panic.
func indexQueueRecord(p []byte) (record, error) {
	return indexQueueRecordInto(p, &kubemqpb.QueueMessage{}, true)
}

// indexQueueRecordInto is indexQueueRecord reading into m (see indexQueueInto), without the
// MessageID unless withID: recovery indexes every queue record through one m, so that a
// million records leave no garbage of their own behind.
func indexQueueRecordInto(p []byte, m *kubemqpb.QueueMessage, withID bool) (record, error) {
	r := record{typ: recQueueMsg, qm: m}
	var err error
	r.size, err = indexQueueInto(p, m, withID)
	if err == nil && (m.Attributes == nil || m.Policy == nil || m.Attributes.Sequence == 0) {
		err = errCorrupt
	}
	return r, err
}

// indexQueueFields is indexQueueRecord without the checks of a queue copy's fields.
func indexQueueFields(p []byte) (record, error) {
	r := record{typ: recQueueMsg, qm: &kubemqpb.QueueMessage{}}
	var err error
	r.size, err = indexQueueInto(p, r.qm, true)
	return r, err
}

// indexQueueInto reads into m, reset first, the fields of queue record p that an index needs
// (MessageID if withID, Channel, Attributes, Policy) and returns the stored message's
// messageSize. It reuses m's Attributes and Policy, and its Channel string when p names the same
// channel; a caller keeps none of them beyond the next call, except the Channel string (never
// changed once made).
func indexQueueInto(p []byte, m *kubemqpb.QueueMessage, withID bool) (size int64, err error) {
	attrs, pol, ch := m.Attributes, m.Policy, m.Channel
	proto.Reset(m)
	for len(p) > 0 {
		num, typ, n := protowire.ConsumeTag(p)
		if n < 0 {
			return size, errCorrupt
		}
		p = p[n:]
		if typ != protowire.BytesType {
			if n = protowire.ConsumeFieldValue(num, typ, p); n < 0 {
				return size, errCorrupt
			}
			p = p[n:]
			continue
		}
		v, n := protowire.ConsumeBytes(p)
		if n < 0 {
			return size, errCorrupt
		}
		p = p[n:]
		switch num {
		case 1:
			if withID {
				m.MessageID = string(v)
			}
			size += int64(len(v))
		case 2, 4, 5: // ClientID, Metadata, Body
			size += int64(len(v))
		case 3:
			if string(v) == ch {
				m.Channel = ch
			} else {
				m.Channel = string(v)
			}
			size += int64(len(v))
		case 6: // one Tags entry: key 1, value 2
			for len(v) > 0 {
				_, t, k := protowire.ConsumeTag(v)
				if k < 0 || t != protowire.BytesType {
					return size, errCorrupt
				}
				b, l := protowire.ConsumeBytes(v[k:])
				if l < 0 {
					return size, errCorrupt
				}
				size += int64(len(b))
				v = v[k+l:]
			}
		case 7:
			if m.Attributes == nil {
				if attrs != nil {
					proto.Reset(attrs)
					m.Attributes, attrs = attrs, nil
				} else {
					m.Attributes = &kubemqpb.QueueMessageAttributes{}
				}
			}
			if err := (proto.UnmarshalOptions{Merge: true}).Unmarshal(v, m.Attributes); err != nil {
				return size, errCorrupt
			}
		case 8:
			if m.Policy == nil {
				if pol != nil {
					proto.Reset(pol)
					m.Policy, pol = pol, nil
				} else {
					m.Policy = &kubemqpb.QueueMessagePolicy{}
				}
			}
			if err := (proto.UnmarshalOptions{Merge: true}).Unmarshal(v, m.Policy); err != nil {
				return size, errCorrupt
			}
		}
	}
	return size, nil
}

// indexDelayRecord reads what recovery keeps of a delayed message's record (recDelayAdd): its id
// and the message as indexQueueRecord reads it (MessageID, Channel, Attributes, Policy).
func indexDelayRecord(p []byte) (record, error) {
	d := &dec{b: p}
	id := d.uvarint()
	if d.err != nil {
		return record{}, errCorrupt
	}
	r, err := indexQueueFields(d.rest())
	r.typ, r.id = recDelayAdd, id
	if err == nil && (r.qm.Attributes == nil || r.qm.Policy == nil) {
		err = errCorrupt
	}
	return r, err // a delayed message has no sequence yet
}

// indexEventRecord reads what recovery keeps of an event record (recEvent): an event with only
// Channel, Sequence and Timestamp, and its eventSize. The record is read back whole when a
// subscription replays it.
func indexEventRecord(p []byte) (record, error) {
	e, size, err := parseEventRecord(p, false)
	return record{typ: recEvent, ev: e, size: size}, err
}

// parseEventRecord decodes an event record (protobuf EventReceive) without reflection. With full
// unset it keeps only Channel, Sequence and Timestamp; size is the event's eventSize either way.
// Body aliases p. Like proto.Unmarshal, the last of a repeated field wins and strings must be
// UTF-8; unknown fields are skipped. Malformed input is an error, never a panic.
func parseEventRecord(p []byte, full bool) (e *kubemqpb.EventReceive, size int64, err error) {
	e = &kubemqpb.EventReceive{}
	var lens [5]int64         // of fields 1-4 as last seen; [0] unused
	var tags map[string]int64 // value lengths by key (the last of a repeated key wins)
	for len(p) > 0 {
		num, typ, n := protowire.ConsumeTag(p)
		if n < 0 {
			return nil, 0, errCorrupt
		}
		p = p[n:]
		switch {
		case (num == 5 || num == 6) && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(p)
			if n < 0 {
				return nil, 0, errCorrupt
			}
			p = p[n:]
			if num == 5 {
				e.Timestamp = int64(v)
			} else {
				e.Sequence = v
			}
			continue
		case num >= 1 && num <= 4 && typ == protowire.BytesType, num == 7 && typ == protowire.BytesType:
		default:
			if n = protowire.ConsumeFieldValue(num, typ, p); n < 0 {
				return nil, 0, errCorrupt
			}
			p = p[n:]
			continue
		}
		v, n := protowire.ConsumeBytes(p)
		if n < 0 {
			return nil, 0, errCorrupt
		}
		p = p[n:]
		if num != 4 && num != 7 && !utf8.Valid(v) {
			return nil, 0, errCorrupt
		}
		switch num {
		case 1:
			lens[1] = int64(len(v))
			if full {
				e.EventID = string(v)
			}
		case 2:
			lens[2] = int64(len(v))
			e.Channel = string(v)
		case 3:
			lens[3] = int64(len(v))
			if full {
				e.Metadata = string(v)
			}
		case 4:
			lens[4] = int64(len(v))
			if full {
				e.Body = v
			}
		case 7: // one Tags entry: key 1, value 2
			var k, val []byte
			for len(v) > 0 {
				fn, t, kn := protowire.ConsumeTag(v)
				if kn < 0 {
					return nil, 0, errCorrupt
				}
				v = v[kn:]
				if (fn == 1 || fn == 2) && t == protowire.BytesType {
					b, l := protowire.ConsumeBytes(v)
					if l < 0 || !utf8.Valid(b) {
						return nil, 0, errCorrupt
					}
					if fn == 1 {
						k = b
					} else {
						val = b
					}
					v = v[l:]
					continue
				}
				l := protowire.ConsumeFieldValue(fn, t, v)
				if l < 0 {
					return nil, 0, errCorrupt
				}
				v = v[l:]
			}
			if tags == nil {
				tags = map[string]int64{}
			}
			tags[string(k)] = int64(len(val))
			if full {
				if e.Tags == nil {
					e.Tags = map[string]string{}
				}
				e.Tags[string(k)] = string(val)
			}
		}
	}
	size = lens[1] + lens[2] + lens[3] + lens[4]
	for k, v := range tags {
		size += int64(len(k)) + v
	}
	if e.Sequence == 0 {
		return nil, 0, errCorrupt
	}
	return e, size, nil
}

// decodeRecord parses a payload of the given type. Unknown types and malformed payloads are
// errors, never panics.
func decodeRecord(typ byte, p []byte) (record, error) {
	r := record{typ: typ}
	d := &dec{b: p}
	switch typ {
	case recQueueMsg:
		r.qm = &kubemqpb.QueueMessage{}
		if err := proto.Unmarshal(p, r.qm); err != nil {
			return r, errCorrupt
		}
		if r.qm.Attributes == nil || r.qm.Policy == nil || r.qm.Attributes.Sequence == 0 {
			return r, errCorrupt
		}
		return r, nil
	case recEvent:
		r.ev = &kubemqpb.EventReceive{}
		if err := proto.Unmarshal(p, r.ev); err != nil || r.ev.Sequence == 0 {
			return r, errCorrupt
		}
		return r, nil
	case recDelayAdd:
		r.id = d.uvarint()
		r.qm = &kubemqpb.QueueMessage{}
		if d.err != nil || proto.Unmarshal(d.rest(), r.qm) != nil || r.qm.Attributes == nil || r.qm.Policy == nil {
			return r, errCorrupt
		}
		return r, nil
	case recQueueDel, recDelayDone:
		if typ == recQueueDel {
			r.name = d.str()
		}
		n := d.uvarint()
		if d.err == nil && n > uint64(len(d.b)) {
			return r, errCorrupt
		}
		for i := uint64(0); i < n && d.err == nil; i++ {
			r.nums = append(r.nums, d.uvarint())
		}
	case recCursor:
		r.name = d.str()
		r.channel = d.str()
		r.nums = []uint64{d.uvarint()}
	case recQueueMeta:
		r.name = d.str()
		r.nums = []uint64{d.uvarint(), d.uvarint(), d.uvarint()}
	case recChannelMeta:
		r.name = d.str()
		r.nums = []uint64{d.uvarint()}
	case recPurge:
		r.nums = []uint64{d.uvarint()}
		r.name = d.str()
		if d.err == nil && r.nums[0] != uint64(recPurgeQueue) && r.nums[0] != uint64(recPurgeChannel) {
			return r, errCorrupt
		}
	default:
		return r, errCorrupt
	}
	if d.err != nil || len(d.b) != 0 {
		return r, errCorrupt
	}
	return r, nil
}
