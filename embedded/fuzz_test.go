package embedded

import (
	"bytes"
	"strings"
	"testing"
	"unicode"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/kubemq-io/kubemq-proxy/kubemqpb"
)

func FuzzCheckChannel(f *testing.F) {
	for _, s := range []string{"", "a", "a.b", "gcp.sub.s1", ".a", "a.", "a..b", "a/b", "a:b", "a b", "a\tb",
		"a.*", "a.>", "a.>.b", "*", ">", "a*", "\xff", strings.Repeat("x", 247), "ünï"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		for _, kind := range []channelKind{kindEvents, kindEventsSub, kindEventsStore, kindQueue} {
			if checkChannel(name, kind) != "" {
				continue
			}
			limit := maxEventsChannelLen
			if kind == kindQueue {
				limit = maxQueueNameLen
			}
			if len(name) == 0 || len(name) > limit || strings.HasPrefix(name, ".") || strings.HasSuffix(name, ".") ||
				strings.Contains(name, "..") || strings.ContainsAny(name, "/:") {
				t.Fatalf("kind %d accepted unsafe %q", kind, name)
			}
			for _, r := range name {
				if unicode.IsSpace(r) || unicode.IsControl(r) || r == unicode.ReplacementChar {
					t.Fatalf("kind %d accepted %q with %q", kind, name, r)
				}
			}
			if kind != kindEventsSub && strings.ContainsAny(name, "*>") {
				t.Fatalf("kind %d accepted wildcard %q", kind, name)
			}
			if kind == kindEventsSub {
				subjectMatch(name, "a.b.c") // must not panic
			}
		}
	})
}

func FuzzDecodeRecord(f *testing.F) {
	f.Add(frame(nil, recQueueDel, putStr(nil, "q")))
	f.Add(frame(nil, recCursor, cursorPayload("k", "c", 7)))
	f.Add(frame(nil, recChannelMeta, append(putStr(nil, "c"), 5)))
	f.Add([]byte{1, 0, 0, 0, 0, 0, 0, 0, 9})
	f.Add(frame(nil, recDelayDone, []byte{2, 1, 2}))
	f.Fuzz(func(t *testing.T, data []byte) {
		// Whatever the bytes, decoding returns an error or a record, never panics; a good frame
		// round-trips.
		for off := 0; off < len(data); {
			typ, payload, n, err := unframe(data[off:])
			if err != nil {
				break
			}
			if again := frame(nil, typ, payload); !bytes.Equal(again, data[off:off+n]) {
				t.Fatalf("frame round trip differs")
			}
			_, _ = decodeRecord(typ, payload)
			off += n
		}
		if len(data) > 0 {
			_, _ = decodeRecord(data[0], data[1:])
		}
	})
}

// FuzzIndexQueueRecord: recovery's index-only reading of a queue record never panics, and agrees
// with the full decoding on every record that decodes (channel, attributes, policy, size), also
// when it reads into the message it read the previous record into, as recovery does.
func FuzzIndexQueueRecord(f *testing.F) {
	for _, m := range []*kubemqpb.QueueMessage{
		{MessageID: "id", ClientID: "c", Channel: "q", Metadata: "meta", Body: []byte("body"), Tags: map[string]string{"k": "v", "a": ""},
			Attributes: &kubemqpb.QueueMessageAttributes{Sequence: 7, Timestamp: 9, ReceiveCount: 2, ExpirationAt: 11, ReRouted: true, ReRoutedFromQueue: "x"},
			Policy:     &kubemqpb.QueueMessagePolicy{MaxReceiveCount: 5, MaxReceiveQueue: "dlq", DelaySeconds: 1}},
		{Channel: "q", Attributes: &kubemqpb.QueueMessageAttributes{Sequence: 1}, Policy: &kubemqpb.QueueMessagePolicy{}},
	} {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0x3a, 0x02, 0x10})
	reused := &kubemqpb.QueueMessage{} // carries each input's fields into the next, within one process
	f.Fuzz(func(t *testing.T, p []byte) {
		r, err := indexQueueRecord(p)
		ri, ierr := indexQueueRecordInto(p, reused, false)
		if (err == nil) != (ierr == nil) {
			t.Fatalf("index into a reused message: %v, into a new one: %v", ierr, err)
		}
		if err == nil && (ri.qm.Channel != r.qm.Channel || ri.qm.MessageID != "" || ri.size != r.size ||
			!proto.Equal(ri.qm.Attributes, r.qm.Attributes) || !proto.Equal(ri.qm.Policy, r.qm.Policy)) {
			t.Fatalf("index into a reused message %+v (size %d), into a new one %+v (size %d)", ri.qm, ri.size, r.qm, r.size)
		}
		full, ferr := decodeRecord(recQueueMsg, p)
		if ferr != nil {
			return
		}
		if err != nil {
			t.Fatalf("index refused a record that decodes: %v", err)
		}
		if r.qm.Channel != full.qm.Channel || !proto.Equal(r.qm.Attributes, full.qm.Attributes) || !proto.Equal(r.qm.Policy, full.qm.Policy) {
			t.Fatalf("index %+v, decoded %+v", r.qm, full.qm)
		}
		if len(full.qm.Tags) == 0 || !duplicateTagKeys(p) {
			if want := messageSize(full.qm); r.size != want {
				t.Fatalf("index size %d, messageSize %d", r.size, want)
			}
		}
	})
}

// FuzzParseEventRecord: the event record decoder of replay and recovery never panics, and agrees
// with proto.Unmarshal on every record that decodes (every field, and the event's size).
func FuzzParseEventRecord(f *testing.F) {
	for _, e := range []*kubemqpb.EventReceive{
		{EventID: "id", Channel: "c", Metadata: "meta", Body: []byte("body"), Timestamp: 9, Sequence: 7, Tags: map[string]string{"k": "v", "a": ""}},
		{Channel: "c", Sequence: 1},
	} {
		b, err := proto.Marshal(e)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0x30, 0x01, 0x3a, 0x02, 0x10, 0x00})
	f.Add([]byte{0x30, 0x01, 0x12, 0x01, 0xff})
	f.Fuzz(func(t *testing.T, p []byte) {
		got, size, err := parseEventRecord(p, true)
		idx, isize, ierr := parseEventRecord(p, false)
		want := &kubemqpb.EventReceive{}
		if perr := proto.Unmarshal(p, want); perr != nil || want.Sequence == 0 {
			return
		}
		if err != nil || ierr != nil {
			t.Fatalf("refused a record that decodes: %v %v", err, ierr)
		}
		if got.EventID != want.EventID || got.Channel != want.Channel || got.Metadata != want.Metadata || string(got.Body) != string(want.Body) ||
			got.Timestamp != want.Timestamp || got.Sequence != want.Sequence || len(got.Tags) != len(want.Tags) {
			t.Fatalf("decoded %v, proto %v", got, want)
		}
		for k, v := range want.Tags {
			if got.Tags[k] != v {
				t.Fatalf("tag %q: %q, proto %q", k, got.Tags[k], v)
			}
		}
		if idx.Channel != want.Channel || idx.Sequence != want.Sequence || idx.Timestamp != want.Timestamp {
			t.Fatalf("index %v, proto %v", idx, want)
		}
		if s := eventSize(want); size != s || isize != s {
			t.Fatalf("size %d / %d, eventSize %d", size, isize, s)
		}
	})
}

// duplicateTagKeys reports whether a QueueMessage encoding may repeat a tag key (the map keeps
// one, the index counts both): the sizes are compared only without tags or when it cannot.
func duplicateTagKeys(p []byte) bool {
	seen := 0
	for len(p) > 0 {
		num, typ, n := protowire.ConsumeTag(p)
		if n < 0 {
			return true
		}
		p = p[n:]
		n = protowire.ConsumeFieldValue(num, typ, p)
		if n < 0 {
			return true
		}
		p = p[n:]
		if num == 6 {
			seen++
		}
	}
	return seen > 1
}

// FuzzIndexDelayRecord: recovery's index-only reading of a delayed message's record never panics,
// and agrees with the full decoding on every record that decodes (id, MessageID, channel,
// attributes, policy).
func FuzzIndexDelayRecord(f *testing.F) {
	m := &kubemqpb.QueueMessage{MessageID: "id", ClientID: "c", Channel: "q", Body: []byte("body"), Tags: map[string]string{"k": "v"},
		Attributes: &kubemqpb.QueueMessageAttributes{DelayedTo: 99, ReceiveCount: 1}, Policy: &kubemqpb.QueueMessagePolicy{DelaySeconds: 3}}
	b, err := proto.Marshal(m)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(append([]byte{7}, b...))
	f.Add([]byte{1, 0x3a, 0x00, 0x42, 0x00})
	f.Fuzz(func(t *testing.T, p []byte) {
		r, err := indexDelayRecord(p)
		full, ferr := decodeRecord(recDelayAdd, p)
		if ferr != nil {
			return
		}
		if err != nil {
			t.Fatalf("index refused a record that decodes: %v", err)
		}
		if r.id != full.id || r.qm.MessageID != full.qm.MessageID || r.qm.Channel != full.qm.Channel ||
			!proto.Equal(r.qm.Attributes, full.qm.Attributes) || !proto.Equal(r.qm.Policy, full.qm.Policy) {
			t.Fatalf("index %d %+v, decoded %d %+v", r.id, r.qm, full.id, full.qm)
		}
	})
}
