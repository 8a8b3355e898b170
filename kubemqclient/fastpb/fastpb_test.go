package fastpb

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/kubemq-io/kubemq-proxy/kubemqpb"
)

func randStr(r *rand.Rand) string {
	if r.IntN(3) == 0 {
		return ""
	}
	b := make([]byte, r.IntN(300))
	for i := range b {
		b[i] = byte('a' + r.IntN(26))
	}
	if r.IntN(5) == 0 {
		return string(b) + "é✓"
	}
	return string(b)
}

func randBytes(r *rand.Rand) []byte {
	if r.IntN(4) == 0 {
		return nil
	}
	b := make([]byte, r.IntN(3000))
	for i := range b {
		b[i] = byte(r.IntN(256))
	}
	return b
}

func randInt(r *rand.Rand) int64 {
	switch r.IntN(4) {
	case 0:
		return 0
	case 1:
		return -r.Int64N(math.MaxInt64)
	case 2:
		return math.MaxInt64
	}
	return r.Int64N(1 << 40)
}

func randInt32(r *rand.Rand) int32 {
	switch r.IntN(3) {
	case 0:
		return 0
	case 1:
		return -r.Int32N(math.MaxInt32)
	}
	return r.Int32()
}

func randTags(r *rand.Rand) map[string]string {
	if r.IntN(4) == 0 {
		return nil
	}
	t := map[string]string{}
	for range r.IntN(6) {
		t[randStr(r)] = randStr(r)
	}
	return t
}

func randQueueMessage(r *rand.Rand) *kubemqpb.QueueMessage {
	m := &kubemqpb.QueueMessage{MessageID: randStr(r), ClientID: randStr(r), Channel: randStr(r), Metadata: randStr(r),
		Body: randBytes(r), Tags: randTags(r), Topic: randStr(r), Partition: randInt32(r), PartitionKey: randStr(r)}
	if r.IntN(2) == 0 {
		m.Attributes = &kubemqpb.QueueMessageAttributes{Timestamp: randInt(r), Sequence: uint64(randInt(r)), MD5OfBody: randStr(r),
			ReceiveCount: randInt32(r), ReRouted: r.IntN(2) == 0, ReRoutedFromQueue: randStr(r), ExpirationAt: randInt(r), DelayedTo: randInt(r)}
	}
	if r.IntN(2) == 0 {
		m.Policy = &kubemqpb.QueueMessagePolicy{ExpirationSeconds: randInt32(r), DelaySeconds: randInt32(r), MaxReceiveCount: randInt32(r), MaxReceiveQueue: randStr(r)}
	}
	return m
}

func randDownstream(r *rand.Rand) *kubemqpb.QueuesDownstreamResponse {
	d := &kubemqpb.QueuesDownstreamResponse{TransactionId: randStr(r), RefRequestId: randStr(r),
		RequestTypeData: kubemqpb.QueuesDownstreamRequestType(r.IntN(12)), IsError: r.IntN(2) == 0, Error: randStr(r),
		TransactionComplete: r.IntN(2) == 0, Metadata: randTags(r)}
	for range r.IntN(4) {
		d.Messages = append(d.Messages, randQueueMessage(r))
	}
	if r.IntN(3) == 0 {
		for range r.IntN(5) {
			d.ActiveOffsets = append(d.ActiveOffsets, randInt(r))
		}
	}
	return d
}

// TestRoundTrip: what Marshal writes, proto.Unmarshal reads back equal, and
// SizeHint is exact (nested lengths depend on it).
func TestRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 2500 {
		var in, out proto.Message
		switch i % 5 {
		case 0:
			in = &kubemqpb.Event{EventID: randStr(r), ClientID: randStr(r), Channel: randStr(r), Metadata: randStr(r),
				Body: randBytes(r), Store: r.IntN(2) == 0, Tags: randTags(r)}
			out = &kubemqpb.Event{}
		case 1:
			in = &kubemqpb.EventReceive{EventID: randStr(r), Channel: randStr(r), Metadata: randStr(r), Body: randBytes(r),
				Timestamp: randInt(r), Sequence: uint64(randInt(r)), Tags: randTags(r)}
			out = &kubemqpb.EventReceive{}
		case 2:
			in = randQueueMessage(r)
			out = &kubemqpb.QueueMessage{}
		case 3:
			b := &kubemqpb.QueueMessagesBatchRequest{BatchID: randStr(r)}
			for range r.IntN(5) {
				b.Messages = append(b.Messages, randQueueMessage(r))
			}
			in, out = b, &kubemqpb.QueueMessagesBatchRequest{}
		case 4:
			in, out = randDownstream(r), &kubemqpb.QueuesDownstreamResponse{}
		}
		enc, ok := Marshal([]byte("prefix"), in)
		if !ok {
			t.Fatalf("%d: Marshal refused %v", i, in)
		}
		if string(enc[:6]) != "prefix" {
			t.Fatal("prefix overwritten")
		}
		enc = enc[6:]
		if len(enc) != SizeHint(in) {
			t.Fatalf("%d: size %d, SizeHint %d", i, len(enc), SizeHint(in))
		}
		if len(enc) != proto.Size(in) {
			t.Fatalf("%d: size %d, proto.Size %d", i, len(enc), proto.Size(in))
		}
		if err := proto.Unmarshal(enc, out); err != nil {
			t.Fatalf("%d: %v", i, err)
		}
		if !proto.Equal(in, out) {
			t.Fatalf("%d: round trip differs:\n%v\n%v", i, in, out)
		}
	}
}

func TestRefusals(t *testing.T) {
	bad := string([]byte{0xff, 0xfe})
	for _, m := range []proto.Message{
		&kubemqpb.Event{Channel: bad},
		&kubemqpb.Event{Tags: map[string]string{"k": bad}},
		&kubemqpb.EventReceive{Tags: map[string]string{bad: "v"}},
		&kubemqpb.QueueMessage{Attributes: &kubemqpb.QueueMessageAttributes{MD5OfBody: bad}},
		&kubemqpb.QueueMessagesBatchRequest{Messages: []*kubemqpb.QueueMessage{{}, nil}},
		&kubemqpb.Result{EventID: "not encoded here"},
	} {
		if out, ok := Marshal([]byte("x"), m); ok || string(out) != "x" {
			t.Errorf("Marshal(%v) = %q, %v; want refused, nothing appended", m, out, ok)
		}
	}
	withUnknown := &kubemqpb.Event{EventID: "e"}
	withUnknown.ProtoReflect().SetUnknown([]byte{0xf8, 0x01, 0x01}) // field 31, varint 1
	if _, ok := Marshal(nil, withUnknown); ok {
		t.Error("a message with unknown fields was encoded")
	}
}

// TestDecode: Unmarshal agrees with proto.Unmarshal on what Marshal and
// protobuf write, and declines what it does not know.
func TestDecode(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for i := range 3000 {
		var in, out proto.Message
		if i%3 == 2 {
			d := randDownstream(r)
			d.ActiveOffsets = nil // left to protobuf
			in, out = d, &kubemqpb.QueuesDownstreamResponse{Error: "stale"}
		} else if i%3 == 0 {
			in = &kubemqpb.Event{EventID: randStr(r), ClientID: randStr(r), Channel: randStr(r), Metadata: randStr(r),
				Body: randBytes(r), Store: r.IntN(2) == 0, Tags: randTags(r)}
			out = &kubemqpb.Event{Channel: "stale", Tags: map[string]string{"stale": "x"}}
		} else {
			b := &kubemqpb.QueueMessagesBatchRequest{BatchID: randStr(r)}
			for range r.IntN(5) {
				b.Messages = append(b.Messages, randQueueMessage(r))
			}
			in, out = b, &kubemqpb.QueueMessagesBatchRequest{BatchID: "stale"}
		}
		enc, err := proto.Marshal(in)
		if err != nil {
			t.Fatal(err)
		}
		buf := append([]byte(nil), enc...)
		if !Unmarshal(buf, out) {
			t.Fatalf("%d: Unmarshal declined a plain encoding", i)
		}
		for j := range buf {
			buf[j] = 0 // decoded values must not alias the input
		}
		if !proto.Equal(in, out) {
			t.Fatalf("%d: decode differs:\n%v\n%v", i, in, out)
		}
	}
	// Repeated scalar fields: the last wins, as in protobuf.
	twice := append(AppendStringField(nil, 3, "first"), AppendStringField(nil, 3, "second")...)
	var e kubemqpb.Event
	if !Unmarshal(twice, &e) || e.Channel != "second" {
		t.Fatalf("repeated field: %v", &e)
	}
	for _, bad := range [][]byte{
		{0xf8, 0x01, 0x01},       // unknown field 31
		{0x1a, 0x05, 'a'},        // truncated string
		{0x1a, 0x02, 0xff, 0xfe}, // channel not UTF-8
		{0x30, 0x80},             // truncated varint
		{0x1d, 0, 0, 0, 0},       // fixed32 wire type
		{0x3a, 0x02, 0x18, 0x01}, // map entry with a third field
		{0x1a},                   // tag only
	} {
		var e kubemqpb.Event
		if Unmarshal(bad, &e) {
			t.Errorf("Unmarshal accepted %x: %v", bad, &e)
		}
	}
	if Unmarshal(nil, &kubemqpb.Result{}) {
		t.Error("Unmarshal decoded a type it does not know")
	}
}

func FuzzDecode(f *testing.F) {
	r := rand.New(rand.NewPCG(5, 6))
	for range 8 {
		enc, _ := proto.Marshal(&kubemqpb.QueueMessagesBatchRequest{BatchID: randStr(r), Messages: []*kubemqpb.QueueMessage{randQueueMessage(r)}})
		f.Add(enc, true)
		enc, _ = proto.Marshal(&kubemqpb.Event{Channel: randStr(r), Tags: randTags(r), Body: randBytes(r)})
		f.Add(enc, false)
	}
	for range 4 {
		enc, _ := proto.Marshal(randDownstream(r))
		f.Add(enc, true)
	}
	f.Fuzz(func(t *testing.T, b []byte, batch bool) {
		var fast, std proto.Message = &kubemqpb.Event{}, &kubemqpb.Event{}
		if batch {
			fast, std = &kubemqpb.QueueMessagesBatchRequest{}, &kubemqpb.QueueMessagesBatchRequest{}
		}
		if len(b) > 0 && b[0]%3 == 0 {
			fast, std = &kubemqpb.QueuesDownstreamResponse{}, &kubemqpb.QueuesDownstreamResponse{}
		}
		if !Unmarshal(b, fast) {
			return
		}
		if err := proto.Unmarshal(b, std); err != nil {
			t.Fatalf("fast decode accepted what protobuf refuses: %v", err)
		}
		if !proto.Equal(fast, std) {
			t.Fatalf("decodes differ:\n%v\n%v", fast, std)
		}
	})
}

// BenchmarkUnmarshal: decoding the client's hot messages (a published event,
// a batch of ten queue messages, a Get answer with ten) with the proxy's
// three reserved tags and a 1 KiB body each.
func BenchmarkUnmarshal(b *testing.B) {
	tags := map[string]string{"x-kubemq-proxy-id": "a1b2c3d4", "x-kubemq-proxy-ts": "1767225600000", "x-kubemq-proxy-attrs": "k=v"}
	body := make([]byte, 1024)
	qm := func(i int) *kubemqpb.QueueMessage {
		return &kubemqpb.QueueMessage{MessageID: fmt.Sprint("msg-", i), ClientID: "kubemq-proxy-1", Channel: "q.orders", Body: body, Tags: tags,
			Attributes: &kubemqpb.QueueMessageAttributes{Timestamp: 1767225600000000000, Sequence: uint64(i + 1), ReceiveCount: 1},
			Policy:     &kubemqpb.QueueMessagePolicy{MaxReceiveCount: 5, MaxReceiveQueue: "q.orders.dlq"}}
	}
	batch := &kubemqpb.QueueMessagesBatchRequest{BatchID: "batch-1"}
	get := &kubemqpb.QueuesDownstreamResponse{TransactionId: "tx-1", RefRequestId: "req-1", RequestTypeData: kubemqpb.QueuesDownstreamRequestType_Get}
	for i := range 10 {
		batch.Messages = append(batch.Messages, qm(i))
		get.Messages = append(get.Messages, qm(i))
	}
	for _, bc := range []struct {
		name string
		in   proto.Message
		out  func() proto.Message
	}{
		{"event", &kubemqpb.Event{EventID: "ev-1", ClientID: "kubemq-proxy-1", Channel: "events.orders", Body: body, Tags: tags, Store: true},
			func() proto.Message { return &kubemqpb.Event{} }},
		{"batch10", batch, func() proto.Message { return &kubemqpb.QueueMessagesBatchRequest{} }},
		{"get10", get, func() proto.Message { return &kubemqpb.QueuesDownstreamResponse{} }},
	} {
		enc, err := proto.Marshal(bc.in)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(enc)))
			for b.Loop() {
				if !Unmarshal(enc, bc.out()) {
					b.Fatal("declined")
				}
			}
		})
	}
}
