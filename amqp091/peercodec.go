package amqp091

import (
	"math"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/kubemq-io/kubemq-proxy/amqp091/peerpb"
	"github.com/kubemq-io/kubemq-proxy/kubemqclient/fastpb"
	"github.com/kubemq-io/kubemq-proxy/kubemqclient/wirecodec"
)

// PeerFast encodes and decodes the link's deliveries (peerpb.LinkResponse
// with a Delivery or Deliveries) without protobuf reflection, for the peer
// port's codec (wirecodec.CodecWith): protobuf-go encodes a tag map through
// reflection with allocations per entry, which made the encoding of the
// deliveries a sixth of what the replica that holds a queue spends serving
// a forwarded consumer (BenchmarkFleet profiles). The encoding is the
// standard one, so a replica with protobuf's codec reads it; the decoder
// leaves to protobuf whatever it does not know. Every other message is
// left to protobuf.
func PeerFast() *wirecodec.Fast {
	return &wirecodec.Fast{Marshal: marshalPeer, SizeHint: peerSizeHint, Unmarshal: unmarshalPeer}
}

// Field numbers of peer.proto.
const (
	respDelivery   protowire.Number = 2
	respDeliveries protowire.Number = 5
	itemsField     protowire.Number = 1
)

func peerSizeHint(v any) int {
	r, ok := v.(*peerpb.LinkResponse)
	if !ok || r == nil {
		return 0
	}
	switch k := r.Kind.(type) {
	case *peerpb.LinkResponse_Delivery:
		if k.Delivery != nil {
			return fastpb.SizeMessageField(respDelivery, sizePeerDelivery(k.Delivery))
		}
	case *peerpb.LinkResponse_Deliveries:
		if k.Deliveries != nil {
			return fastpb.SizeMessageField(respDeliveries, sizePeerItems(k.Deliveries.Items))
		}
	}
	return 0
}

func marshalPeer(b []byte, v any) ([]byte, bool) {
	r, ok := v.(*peerpb.LinkResponse)
	if !ok || r == nil || len(r.ProtoReflect().GetUnknown()) > 0 {
		return b, false
	}
	switch k := r.Kind.(type) {
	case *peerpb.LinkResponse_Delivery:
		d := k.Delivery
		if !peerDeliveryOK(d) {
			return b, false
		}
		b = fastpb.AppendMessageHeader(b, respDelivery, sizePeerDelivery(d))
		return appendPeerDelivery(b, d), true
	case *peerpb.LinkResponse_Deliveries:
		ds := k.Deliveries
		if ds == nil || len(ds.ProtoReflect().GetUnknown()) > 0 {
			return b, false
		}
		for _, d := range ds.Items {
			if !peerDeliveryOK(d) {
				return b, false
			}
		}
		b = fastpb.AppendMessageHeader(b, respDeliveries, sizePeerItems(ds.Items))
		for _, d := range ds.Items {
			b = fastpb.AppendMessageHeader(b, itemsField, sizePeerDelivery(d))
			b = appendPeerDelivery(b, d)
		}
		return b, true
	}
	return b, false
}

// peerDeliveryOK: d holds nothing the encoder leaves out (unknown fields)
// or that protobuf would refuse (a string that is not UTF-8).
func peerDeliveryOK(d *peerpb.Delivery) bool {
	return d != nil && len(d.ProtoReflect().GetUnknown()) == 0 && fastpb.ValidStrings(d.Metadata) && fastpb.ValidTags(d.Tags)
}

func sizePeerItems(ds []*peerpb.Delivery) int {
	n := 0
	for _, d := range ds {
		n += fastpb.SizeMessageField(itemsField, sizePeerDelivery(d))
	}
	return n
}

func sizePeerDelivery(d *peerpb.Delivery) int {
	n := fastpb.SizeVarintField(1, d.Key) + fastpb.SizeBytesField(2, d.Body) + fastpb.SizeStringField(3, d.Metadata) +
		fastpb.SizeTagsField(4, d.Tags) + fastpb.SizeVarintField(6, uint64(d.MessageCount)) + fastpb.SizeVarintField(7, uint64(d.StoredAt))
	if d.Redelivered {
		n += fastpb.SizeVarintField(5, 1)
	}
	return n
}

// appendPeerDelivery writes d's fields in field order, as protobuf-go does.
func appendPeerDelivery(b []byte, d *peerpb.Delivery) []byte {
	b = fastpb.AppendVarintField(b, 1, d.Key)
	b = fastpb.AppendBytesField(b, 2, d.Body)
	b = fastpb.AppendStringField(b, 3, d.Metadata)
	b = fastpb.AppendTagsField(b, 4, d.Tags)
	b = fastpb.AppendBoolField(b, 5, d.Redelivered)
	b = fastpb.AppendVarintField(b, 6, uint64(d.MessageCount))
	return fastpb.AppendVarintField(b, 7, uint64(d.StoredAt))
}

// unmarshalPeer decodes b into v when v is a LinkResponse and b holds one
// Delivery or Deliveries with only the fields peer.proto gives them, as
// fastpb.Unmarshal does (false, possibly after writing to v, otherwise: the
// codec then uses proto.Unmarshal, which resets v). Bodies and strings are
// copies.
func unmarshalPeer(b []byte, v any) bool {
	r, ok := v.(*peerpb.LinkResponse)
	if !ok {
		return false
	}
	r.Reset()
	var ks fastpb.Keys
	for len(b) > 0 {
		f, rest, ok := fastpb.NextField(b)
		if !ok || r.Kind != nil { // a oneof set twice: protobuf merges them
			return false
		}
		b = rest
		msg, ok := f.Message()
		if !ok {
			return false
		}
		switch f.Num() {
		case respDelivery:
			d := &peerpb.Delivery{}
			if !decodePeerDelivery(msg, d, &ks) {
				return false
			}
			r.Kind = &peerpb.LinkResponse_Delivery{Delivery: d}
		case respDeliveries:
			ds := &peerpb.Deliveries{}
			for len(msg) > 0 {
				f, rest, ok := fastpb.NextField(msg)
				if !ok || f.Num() != itemsField {
					return false
				}
				msg = rest
				item, ok := f.Message()
				d := &peerpb.Delivery{}
				if !ok || !decodePeerDelivery(item, d, &ks) {
					return false
				}
				ds.Items = append(ds.Items, d)
			}
			r.Kind = &peerpb.LinkResponse_Deliveries{Deliveries: ds}
		default:
			return false
		}
	}
	return true
}

func decodePeerDelivery(b []byte, d *peerpb.Delivery, ks *fastpb.Keys) bool {
	for len(b) > 0 {
		f, rest, ok := fastpb.NextField(b)
		if !ok {
			return false
		}
		b = rest
		var n uint64
		switch f.Num() {
		case 1:
			d.Key, ok = f.Varint()
		case 2:
			d.Body, ok = f.Bytes()
		case 3:
			d.Metadata, ok = f.Str()
		case 4:
			var entry []byte
			entry, ok = f.Message()
			ok = ok && fastpb.MapEntry(entry, &d.Tags, ks)
		case 5:
			n, ok = f.Varint()
			d.Redelivered = n != 0
		case 6:
			n, ok = f.Varint()
			d.MessageCount = uint32(n & math.MaxUint32) // protobuf keeps the low 32 bits
		case 7:
			n, ok = f.Varint()
			d.StoredAt = int64(n)
		default:
			return false
		}
		if !ok {
			return false
		}
	}
	return true
}
