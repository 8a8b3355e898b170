package amqp091

import (
	"testing"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/kubemq-io/kubemq-proxy/amqp091/peerpb"
)

// checkPeerEncoding encodes r with the peer codec's encoder and checks that protobuf decodes
// the same message, of protobuf's own size, within the size hint; or, when ok is false, that the
// encoder declined and appended nothing.
func checkPeerEncoding(t *testing.T, r *peerpb.LinkResponse, ok bool) {
	t.Helper()
	prefix := []byte("prefix")
	out, encoded := marshalPeer(prefix, r)
	if encoded != ok {
		t.Fatalf("encoded %v, want %v: %v", encoded, ok, r)
	}
	if !ok {
		if string(out) != "prefix" {
			t.Fatalf("declined, yet appended %q", out[len(prefix):])
		}
		return
	}
	b := out[len(prefix):]
	if n := proto.Size(r); len(b) != n {
		t.Fatalf("encoded %d bytes, protobuf's size %d: %v", len(b), n, r)
	}
	if h := peerSizeHint(r); h < len(b) {
		t.Fatalf("size hint %d below the encoding's %d", h, len(b))
	}
	var got peerpb.LinkResponse
	if err := proto.Unmarshal(b, &got); err != nil {
		t.Fatalf("protobuf cannot decode the encoding: %v", err)
	}
	if !proto.Equal(&got, r) {
		t.Fatalf("decoded %v, want %v", &got, r)
	}
}

func delivery1(key uint64, body, metadata string, tags map[string]string, redelivered bool, count uint32, stored int64) *peerpb.Delivery {
	return &peerpb.Delivery{Key: key, Body: []byte(body), Metadata: metadata, Tags: tags, Redelivered: redelivered, MessageCount: count, StoredAt: stored}
}

func TestPeerCodecEncodesDeliveries(t *testing.T) {
	full := delivery1(1<<40, "body", `{"content_type":"text/plain"}`, map[string]string{"x-exchange": "ex", "x-routing-key": "rk", "": "", "h": ""}, true, 7, 1_700_000_000_000_000_000)
	zero := &peerpb.Delivery{}
	negative := delivery1(3, "", "", nil, false, 0, -1)
	for _, r := range []*peerpb.LinkResponse{
		{Kind: &peerpb.LinkResponse_Delivery{Delivery: full}},
		{Kind: &peerpb.LinkResponse_Delivery{Delivery: zero}},
		{Kind: &peerpb.LinkResponse_Delivery{Delivery: negative}},
		{Kind: &peerpb.LinkResponse_Deliveries{Deliveries: &peerpb.Deliveries{Items: []*peerpb.Delivery{full, zero, negative}}}},
		{Kind: &peerpb.LinkResponse_Deliveries{Deliveries: &peerpb.Deliveries{}}},
	} {
		checkPeerEncoding(t, r, true)
	}
	// Left to protobuf: other kinds, nil messages, strings protobuf refuses, unknown fields.
	withUnknown := delivery1(4, "b", "", nil, false, 0, 0)
	withUnknown.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 99, protowire.VarintType), 1))
	for _, r := range []*peerpb.LinkResponse{
		nil,
		{},
		{Kind: &peerpb.LinkResponse_Opened{Opened: &peerpb.Opened{ReadAhead: true}}},
		{Kind: &peerpb.LinkResponse_Delivery{}},
		{Kind: &peerpb.LinkResponse_Deliveries{}},
		{Kind: &peerpb.LinkResponse_Deliveries{Deliveries: &peerpb.Deliveries{Items: []*peerpb.Delivery{full, nil}}}},
		{Kind: &peerpb.LinkResponse_Delivery{Delivery: delivery1(5, "", "\xff", nil, false, 0, 0)}},
		{Kind: &peerpb.LinkResponse_Delivery{Delivery: delivery1(6, "", "", map[string]string{"k": "\xfe"}, false, 0, 0)}},
		{Kind: &peerpb.LinkResponse_Deliveries{Deliveries: &peerpb.Deliveries{Items: []*peerpb.Delivery{full, withUnknown}}}},
	} {
		checkPeerEncoding(t, r, false)
	}
	if _, ok := marshalPeer(nil, &peerpb.LinkRequest{}); ok {
		t.Fatal("encoded a LinkRequest")
	}
}

// FuzzPeerCodec: whatever a delivery holds, the encoding is protobuf's, or the encoder declines
// (a string that is not UTF-8).
func FuzzPeerCodec(f *testing.F) {
	f.Add(uint64(1), []byte("body"), "meta", "x-exchange", "ex", true, uint32(3), int64(17))
	f.Add(uint64(0), []byte{}, "", "", "", false, uint32(0), int64(0))
	f.Add(uint64(1<<63), []byte{0, 1, 2}, "\xff", "k", "\xc3\x28", false, uint32(1<<31), int64(-5))
	f.Fuzz(func(t *testing.T, key uint64, body []byte, metadata, tk, tv string, redelivered bool, count uint32, stored int64) {
		d := &peerpb.Delivery{Key: key, Body: body, Metadata: metadata, Tags: map[string]string{tk: tv, "x-routing-key": tv}, Redelivered: redelivered, MessageCount: count, StoredAt: stored}
		valid := utf8.ValidString(metadata) && utf8.ValidString(tk) && utf8.ValidString(tv)
		checkPeerEncoding(t, &peerpb.LinkResponse{Kind: &peerpb.LinkResponse_Delivery{Delivery: d}}, valid)
		checkPeerEncoding(t, &peerpb.LinkResponse{Kind: &peerpb.LinkResponse_Deliveries{Deliveries: &peerpb.Deliveries{Items: []*peerpb.Delivery{d, d}}}}, valid)
	})
}

// checkPeerDecoding decodes b with the peer codec's decoder: when it accepts b, protobuf decodes
// b too, to the same message; when protobuf refuses b, the decoder refuses it too.
func checkPeerDecoding(t *testing.T, b []byte) (accepted bool) {
	t.Helper()
	var fast, slow peerpb.LinkResponse
	accepted = unmarshalPeer(b, &fast)
	err := proto.Unmarshal(b, &slow)
	switch {
	case accepted && err != nil:
		t.Fatalf("decoded %x, which protobuf refuses (%v), as %v", b, err, &fast)
	case accepted && !proto.Equal(&fast, &slow):
		t.Fatalf("decoded %x as %v, protobuf as %v", b, &fast, &slow)
	}
	return accepted
}

func TestPeerCodecDecodesDeliveries(t *testing.T) {
	full := delivery1(1<<40, "body", `{"content_type":"text/plain"}`, map[string]string{"x-exchange": "ex", "x-routing-key": "rk", "": "", "h": ""}, true, 7, 1_700_000_000_000_000_000)
	negative := delivery1(3, "", "", nil, false, 0, -1)
	for _, r := range []*peerpb.LinkResponse{
		{},
		{Kind: &peerpb.LinkResponse_Delivery{Delivery: full}},
		{Kind: &peerpb.LinkResponse_Delivery{Delivery: &peerpb.Delivery{}}},
		{Kind: &peerpb.LinkResponse_Deliveries{Deliveries: &peerpb.Deliveries{Items: []*peerpb.Delivery{full, negative, full}}}},
		{Kind: &peerpb.LinkResponse_Deliveries{Deliveries: &peerpb.Deliveries{}}},
	} {
		b, err := proto.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		if !checkPeerDecoding(t, b) {
			t.Fatalf("declined protobuf's encoding of %v", r)
		}
	}
	// Left to protobuf: other kinds, unknown fields, a oneof given twice, a message count
	// beyond 32 bits.
	opened, _ := proto.Marshal(&peerpb.LinkResponse{Kind: &peerpb.LinkResponse_Opened{Opened: &peerpb.Opened{ReadAhead: true}}})
	one, _ := proto.Marshal(&peerpb.LinkResponse{Kind: &peerpb.LinkResponse_Delivery{Delivery: full}})
	unknown := protowire.AppendVarint(protowire.AppendTag(nil, 99, protowire.VarintType), 1)
	inDelivery := protowire.AppendBytes(protowire.AppendTag(nil, respDelivery, protowire.BytesType), unknown)
	wide := protowire.AppendVarint(protowire.AppendTag(nil, 6, protowire.VarintType), 1<<33+5)
	wideDelivery := protowire.AppendBytes(protowire.AppendTag(nil, respDelivery, protowire.BytesType), wide)
	for name, b := range map[string][]byte{
		"opened": opened, "unknown field": append(append([]byte{}, one...), unknown...), "unknown in delivery": inDelivery,
		"twice": append(append([]byte{}, one...), one...), "truncated": one[:len(one)-1],
	} {
		if checkPeerDecoding(t, b) {
			t.Errorf("%s: decoded", name)
		}
	}
	// A count beyond 32 bits keeps its low bits, as protobuf does.
	if !checkPeerDecoding(t, wideDelivery) {
		t.Error("declined a message count beyond 32 bits")
	}
	if unmarshalPeer(one, &peerpb.LinkRequest{}) {
		t.Fatal("decoded into a LinkRequest")
	}
}

// FuzzPeerDecode: any bytes the decoder accepts, protobuf decodes to the same message.
func FuzzPeerDecode(f *testing.F) {
	for _, r := range []*peerpb.LinkResponse{
		{Kind: &peerpb.LinkResponse_Delivery{Delivery: delivery1(1, "b", "m", map[string]string{"k": "v"}, true, 2, 3)}},
		{Kind: &peerpb.LinkResponse_Deliveries{Deliveries: &peerpb.Deliveries{Items: []*peerpb.Delivery{delivery1(1, "b", "", nil, false, 0, -1), {}}}}},
		{Kind: &peerpb.LinkResponse_Cancelled{Cancelled: &peerpb.Cancelled{Reason: "gone"}}},
	} {
		b, err := proto.Marshal(r)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0x12, 0x02, 0x22, 0x00})
	f.Fuzz(func(t *testing.T, b []byte) { checkPeerDecoding(t, b) })
}
