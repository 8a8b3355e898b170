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
// with the full decoding on every record that decodes (channel, attributes, policy, size).
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
	f.Fuzz(func(t *testing.T, p []byte) {
		r, err := indexQueueRecord(p)
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
