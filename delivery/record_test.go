package delivery

import (
	"bytes"
	"errors"
	"maps"
	"strings"
	"testing"
)

func testEntry(i int) *recordEntry {
	var o ownerID
	var k leaseKey
	o[0], k[0], k[15] = 7, byte(i), byte(i>>8)
	return &recordEntry{
		owner: o, lease: k, gen: uint32(i + 1), attempt: uint32(i%5 + 1), expiresAt: int64(1700000000000 + i),
		msg: &Message{ID: "id-" + string(rune('a'+i%26)), Metadata: "meta", Body: bytes.Repeat([]byte{byte(i)}, i),
			Tags: map[string]string{"a": "1", "b": strings.Repeat("x", i)}, Stored: int64(i%3) * 1_700_000_000_123_456_789},
	}
}

func TestRecordRoundTrip(t *testing.T) {
	w := recordWriter{maxBytes: 1024}
	var in []*recordEntry
	for i := range 40 {
		e := testEntry(i)
		in = append(in, e)
		w.add(e)
	}
	// An empty message and a negative expiry must survive too.
	empty := &recordEntry{attempt: 1, expiresAt: -5, msg: &Message{}}
	in = append(in, empty)
	w.add(empty)
	bodies := w.finish()
	if len(bodies) < 2 {
		t.Fatalf("expected the 1 KiB cap to split the record, got %d bodies", len(bodies))
	}
	var out []entry
	for _, b := range bodies {
		if len(b) > 1024 {
			t.Errorf("record body of %d bytes exceeds the cap", len(b))
		}
		es, err := decodeRecord(b)
		if err != nil {
			t.Fatalf("decode: %v", err)
		}
		out = append(out, es...)
	}
	if len(out) != len(in) {
		t.Fatalf("decoded %d entries, want %d", len(out), len(in))
	}
	for i, e := range out {
		want := in[i]
		if e.owner != want.owner || e.lease != want.lease || e.gen != want.gen || e.attempt != want.attempt || e.expiresAt != want.expiresAt {
			t.Errorf("entry %d header = %+v, want %+v", i, e, want)
		}
		m := e.message()
		if m.ID != want.msg.ID || m.Metadata != want.msg.Metadata || !bytes.Equal(m.Body, want.msg.Body) ||
			!maps.Equal(m.Tags, want.msg.Tags) || m.Stored != want.msg.Stored {
			t.Errorf("entry %d message = %+v, want %+v", i, m, *want.msg)
		}
	}
	// Bouncing raw entries reproduces the bytes exactly.
	w2 := recordWriter{maxBytes: 1 << 20}
	for _, e := range out {
		w2.addRaw(e.raw)
	}
	var all []byte
	for _, b := range bodies {
		all = append(all, b...)
	}
	if got := w2.finish(); len(got) != 1 || !bytes.Equal(got[0], all) {
		t.Errorf("raw bounce changed the encoding")
	}
}

func TestRecordOversizedEntryGetsOwnRecord(t *testing.T) {
	w := recordWriter{maxBytes: 1024}
	small := testEntry(1)
	big := &recordEntry{attempt: 1, msg: &Message{ID: "big", Body: make([]byte, 5000)}}
	w.add(small)
	w.add(big)
	w.add(small)
	if got := w.finish(); len(got) != 3 {
		t.Fatalf("got %d records, want 3 (small | big | small)", len(got))
	}
}

// A record body is allocated at its exact size: it lives as long as KubeMQ (the in-process
// embedded server) or a lease recovered from it refers to it, so spare capacity would be kept
// alive that long (a one-entry record once held 64 KiB).
func TestRecordBodiesHaveExactSize(t *testing.T) {
	w := recordWriter{maxBytes: 4096}
	for i := range 20 {
		w.add(testEntry(i + 1))
	}
	raw, err := decodeRecord(w.finish()[0])
	if err != nil {
		t.Fatal(err)
	}
	w.addRaw(raw[0].raw)
	w.add(testEntry(30))
	bodies := w.finish()
	w.add(testEntry(31))
	bodies = append(bodies, w.finish()...)
	for i, b := range bodies {
		if cap(b) != len(b) {
			t.Errorf("record %d: %d bytes in a buffer of %d", i, len(b), cap(b))
		}
	}
}

func TestDecodeRecordRejectsMalformed(t *testing.T) {
	w := recordWriter{maxBytes: 1 << 20}
	w.add(testEntry(3))
	w.add(testEntry(4))
	good := w.finish()[0]
	first, err := decodeRecord(good)
	if err != nil || len(first) != 2 {
		t.Fatalf("good record: %d entries, %v", len(first), err)
	}
	cases := map[string][]byte{
		"truncated":         good[:len(good)-1],
		"length too long":   append([]byte{0xff, 0xff, 0x03}, good...),
		"bad varint":        {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff},
		"short entry":       {3, 1, 2, 3},
		"zero attempt":      entryWithHeader(1, 0),
		"huge tag count":    append(entryHead(42), 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x0f),
		"field past entry":  append(entryHead(40), 0x7f, 0, 0, 0),
		"huge string field": append(entryHead(45), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0),
	}
	for name, b := range cases {
		t.Run(name, func(t *testing.T) {
			if _, err := decodeRecord(b); !errors.Is(err, errRecord) {
				t.Errorf("decodeRecord = %v, want errRecord", err)
			}
		})
	}
	// Entries before a corrupt one are salvaged.
	es, err := decodeRecord(append(append([]byte{}, good...), 0x05, 1, 2))
	if err == nil || len(es) != 2 {
		t.Errorf("salvage: %d entries, err %v; want 2 and an error", len(es), err)
	}
}

// entryHead is a length prefix n followed by owner, lease, gen 1, attempt 1, expiresAt 0.
func entryHead(n byte) []byte {
	b := []byte{n}
	b = append(b, make([]byte, 32)...)
	return append(b, 1, 1, 0)
}

func entryWithHeader(gen, attempt byte) []byte {
	b := []byte{39}
	b = append(b, make([]byte, 32)...)
	return append(b, gen, attempt, 0, 0, 0, 0, 0)
}

func TestLeaseIDRoundTrip(t *testing.T) {
	k := randomKeys(1)[0]
	s := k.String()
	got, ok := parseLeaseID(s)
	if !ok || got != k {
		t.Fatalf("parseLeaseID(%q) = %v, %v", s, got, ok)
	}
	for _, bad := range []string{"", "x", s + "A", s[:21] + "!", strings.Repeat("=", 22)} {
		if _, ok := parseLeaseID(bad); ok {
			t.Errorf("parseLeaseID(%q) accepted", bad)
		}
	}
}

func FuzzDecodeRecord(f *testing.F) {
	w := recordWriter{maxBytes: 1 << 20}
	w.add(testEntry(2))
	w.add(testEntry(9))
	f.Add(w.finish()[0])
	f.Add([]byte{})
	f.Add([]byte{0})
	f.Add(entryHead(40))
	f.Fuzz(func(t *testing.T, b []byte) {
		es, err := decodeRecord(b)
		total := 0
		for _, e := range es {
			total += len(e.raw)
			m := e.message()
			if len(m.Body) > len(b) {
				t.Fatalf("body longer than input")
			}
		}
		if err == nil && total != len(b) {
			t.Fatalf("entries cover %d of %d bytes without error", total, len(b))
		}
		// A record re-encoded from its raw entries decodes to the same entries.
		if err == nil && len(es) > 0 {
			w := recordWriter{maxBytes: 1 << 30}
			for _, e := range es {
				w.addRaw(e.raw)
			}
			again, err := decodeRecord(w.finish()[0])
			if err != nil || len(again) != len(es) {
				t.Fatalf("re-decode: %d entries, %v", len(again), err)
			}
			for i := range es {
				if again[i].stored != es[i].stored || again[i].gen != es[i].gen || !bytes.Equal(again[i].msg, es[i].msg) {
					t.Fatalf("entry %d changed when re-encoded from its raw bytes", i)
				}
			}
		}
	})
}
