package embedded

import (
	"bytes"
	"strings"
	"testing"
	"unicode"
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
