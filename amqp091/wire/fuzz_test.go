package wire

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// The fuzz targets run their seeds (testdata/fuzz/FuzzXxx plus the f.Add
// calls) as ordinary tests. Regenerate the committed seeds with
//
//	WIRE_WRITE_SEEDS=1 go test -run TestWriteFuzzSeeds ./amqp091/wire
//
// and fuzz with e.g. `go test -fuzz FuzzReadFrame ./amqp091/wire`.

const fuzzFrameMax = FrameMinSize

// chunkReader returns data in pieces whose sizes come from sizes, so the
// frame reader sees input split at arbitrary points (short reads, a header
// split across reads, a frame-end alone).
type chunkReader struct {
	data  []byte
	sizes []byte
	i     int
}

func (r *chunkReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, io.EOF
	}
	n := 1
	if len(r.sizes) > 0 {
		n = int(r.sizes[r.i%len(r.sizes)])%13 + 1
		r.i++
	}
	n = min(n, len(p), len(r.data))
	copy(p, r.data[:n])
	r.data = r.data[n:]
	return n, nil
}

// frameSummary records what a reader made of a stream, to compare a split
// read with a whole one.
type frameSummary struct {
	frames []string
	err    string
}

func readAll(r io.Reader) frameSummary {
	// The smallest bufio buffer, so frames span many fills.
	fr := NewFrameReader(bufio.NewReaderSize(r, 16), fuzzFrameMax)
	var s frameSummary
	for range 1000 {
		f, err := fr.ReadFrame()
		if err != nil {
			s.err = err.Error()
			return s
		}
		s.frames = append(s.frames, fmt.Sprintf("%d/%d/%x", f.Type, f.Channel, f.Payload))
	}
	return s
}

func FuzzReadFrame(f *testing.F) {
	f.Add(handshakeStream(), []byte{0})
	f.Add(handshakeStream(), []byte{6, 1, 12, 3})
	f.Fuzz(func(t *testing.T, data, sizes []byte) {
		whole := readAll(bytes.NewReader(data))
		split := readAll(&chunkReader{data: data, sizes: sizes})
		if fmt.Sprint(whole) != fmt.Sprint(split) {
			t.Fatalf("split read differs\nwhole %v\nsplit %v", whole, split)
		}
		// Every frame the reader accepts respects frame-max, and what it
		// carries decodes or fails cleanly.
		fr := NewFrameReader(bufio.NewReader(bytes.NewReader(data)), fuzzFrameMax)
		for {
			fm, err := fr.ReadFrame()
			if err != nil {
				var ae *Error
				if err != io.EOF && err != io.ErrUnexpectedEOF && (!errors.As(err, &ae) || ae.Code != ReplyFrameError) {
					t.Fatalf("unexpected error %v", err)
				}
				return
			}
			if len(fm.Payload)+FrameOverhead > fuzzFrameMax {
				t.Fatalf("accepted a %d-byte payload", len(fm.Payload))
			}
			switch fm.Type {
			case FrameMethod:
				checkMethod(t, fm.Payload)
			case FrameHeader:
				checkContentHeader(t, fm.Payload)
			}
		}
	})
}

func FuzzDecodeMethod(f *testing.F) {
	f.Add([]byte{0, 60, 0, 40, 0, 0, 2, 'e', 'x', 2, 'r', 'k', 1})
	f.Fuzz(func(t *testing.T, data []byte) { checkMethod(t, data) })
}

// checkMethod: a decode either fails with a 502/503 *Error or yields a
// method whose encoding is a fixed point of decode+encode.
func checkMethod(t *testing.T, data []byte) {
	m, err := DecodeMethod(data)
	if err != nil {
		var ae *Error
		if !errors.As(err, &ae) || (ae.Code != ReplySyntaxError && ae.Code != ReplyCommandInvalid) || !ae.Hard {
			t.Fatalf("DecodeMethod error %v is not a hard 502/503", err)
		}
		return
	}
	enc, err := AppendMethod(nil, m)
	if err != nil {
		t.Fatalf("re-encoding decoded %s: %v", m.Name(), err)
	}
	m2, err := DecodeMethod(enc)
	if err != nil {
		t.Fatalf("decoding re-encoded %s: %v", m.Name(), err)
	}
	enc2, err := AppendMethod(nil, m2)
	if err != nil || !bytes.Equal(enc, enc2) {
		t.Fatalf("%s: encoding is not stable (err %v)\n% x\n% x", m.Name(), err, enc, enc2)
	}
	_ = m.String()
}

func FuzzTable(f *testing.F) {
	f.Add([]byte{0, 0, 0, 4, 1, 'k', 't', 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		tab, err := DecodeTable(data)
		if err != nil {
			return
		}
		enc, err := AppendTable(nil, tab)
		if err != nil {
			t.Fatalf("re-encoding a decoded table: %v", err)
		}
		tab2, err := DecodeTable(enc)
		if err != nil {
			t.Fatalf("decoding a re-encoded table: %v", err)
		}
		enc2, err := AppendTable(nil, tab2)
		if err != nil || !bytes.Equal(enc, enc2) {
			t.Fatalf("table encoding is not stable (err %v)\n% x\n% x", err, enc, enc2)
		}
	})
}

func FuzzContentHeader(f *testing.F) {
	f.Add([]byte{0, 60, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5, 0x80, 0, 4, 't', 'e', 'x', 't'})
	f.Fuzz(func(t *testing.T, data []byte) { checkContentHeader(t, data) })
}

func checkContentHeader(t *testing.T, data []byte) {
	h, err := DecodeContentHeader(data)
	if err != nil {
		var ae *Error
		if !errors.As(err, &ae) || ae.Code != ReplySyntaxError {
			t.Fatalf("DecodeContentHeader error %v is not a 502", err)
		}
		return
	}
	if n, ok := ContentBodySize(data); !ok || n != h.BodySize {
		t.Fatalf("ContentBodySize = %d, %v; header says %d", n, ok, h.BodySize)
	}
	enc, err := AppendContentHeader(nil, &h)
	if err != nil {
		t.Fatalf("re-encoding a decoded header: %v", err)
	}
	h2, err := DecodeContentHeader(enc)
	if err != nil {
		t.Fatalf("decoding a re-encoded header: %v", err)
	}
	enc2, err := AppendContentHeader(nil, &h2)
	if err != nil || !bytes.Equal(enc, enc2) {
		t.Fatalf("header encoding is not stable (err %v)\n% x\n% x", err, enc, enc2)
	}
	_ = h.Flags.String()
}

// handshakeStream is a client's side of a connection: start-ok, tune-ok,
// open, channel.open, a publish with content, a heartbeat and close.
func handshakeStream() []byte {
	var buf bytes.Buffer
	fw := NewFrameWriter(bufio.NewWriter(&buf), fuzzFrameMax)
	must := func(err error) {
		if err != nil {
			panic(err)
		}
	}
	must(fw.WriteMethod(0, &ConnectionStartOk{
		ClientProperties: Table{"product": "amqp091-go", "capabilities": Table{"consumer_cancel_notify": true}},
		Mechanism:        "PLAIN", Response: "\x00guest\x00guest", Locale: "en_US",
	}))
	must(fw.WriteMethod(0, &ConnectionTuneOk{ChannelMax: 2047, FrameMax: 131072, Heartbeat: 60}))
	must(fw.WriteMethod(0, &ConnectionOpen{VirtualHost: "/"}))
	must(fw.WriteMethod(1, &ChannelOpen{}))
	props := fullProperties()
	must(fw.WriteContent(1, &BasicPublish{Exchange: "amq.topic", RoutingKey: "a.b"}, &props, bytes.Repeat([]byte("x"), 5000)))
	must(fw.WriteHeartbeat())
	must(fw.WriteMethod(0, &ConnectionClose{ReplyCode: 200, ReplyText: "bye"}))
	must(fw.Flush())
	return buf.Bytes()
}

// TestWriteFuzzSeeds regenerates the committed seed corpora; it only runs
// when WIRE_WRITE_SEEDS is set.
func TestWriteFuzzSeeds(t *testing.T) {
	if os.Getenv("WIRE_WRITE_SEEDS") == "" {
		t.Skip("set WIRE_WRITE_SEEDS=1 to rewrite testdata/fuzz")
	}
	rng := rand.New(rand.NewPCG(5, 6))
	write := func(target, name string, args ...[]byte) {
		dir := filepath.Join("testdata", "fuzz", target)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		b.WriteString("go test fuzz v1\n")
		for _, a := range args {
			b.WriteString("[]byte(" + strconv.Quote(string(a)) + ")\n")
		}
		if err := os.WriteFile(filepath.Join(dir, name), b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	// Methods: every method with values, plus a truncated and an unknown one.
	for _, zero := range zeroMethods() {
		m := newMethod(zero.ClassID(), zero.MethodID())
		fillMethod(t, m, rng)
		b, err := AppendMethod(nil, m)
		if err != nil {
			t.Fatal(err)
		}
		write("FuzzDecodeMethod", m.Name(), b)
	}
	write("FuzzDecodeMethod", "truncated", []byte{0, 50, 0, 10, 0, 0, 9, 'q'})
	write("FuzzDecodeMethod", "unknown", []byte{0, 99, 0, 1})

	// Tables: every field type, an x-death, a deep nesting.
	all := Table{}
	for _, c := range fieldGolden {
		all[c.name] = c.v
	}
	b, _ := AppendTable(nil, all)
	write("FuzzTable", "all-types", b)
	b, _ = AppendTable(nil, Table{"x-death": []any{Table{
		"count": int64(1), "reason": "expired", "queue": "q", "time": time.Unix(1700000000, 0).UTC(),
		"exchange": "dlx", "routing-keys": []any{"q"},
	}}})
	write("FuzzTable", "x-death", b)
	b, _ = AppendTable(nil, nest(MaxTableDepth-1))
	write("FuzzTable", "deepest", b)
	write("FuzzTable", "huge-array", cat(u32(7), []byte{1, 'k', 'A', 0x7F, 0xFF, 0xFF, 0xFF}))

	// Content headers.
	full := fullProperties()
	for name, p := range map[string]Properties{
		"full": full, "none": {},
		"some": {Flags: FlagContentType | FlagDeliveryMode, ContentType: "text/plain", DeliveryMode: 2},
	} {
		b, err := AppendContentHeader(nil, &ContentHeader{ClassID: ClassBasic, BodySize: 42, Properties: p})
		if err != nil {
			t.Fatal(err)
		}
		write("FuzzContentHeader", name, b)
	}

	// Frame streams, whole and with split patterns.
	hs := handshakeStream()
	write("FuzzReadFrame", "handshake", hs, []byte{0})
	write("FuzzReadFrame", "handshake-split", hs, []byte{6, 0, 1, 11, 2, 7})
	write("FuzzReadFrame", "too-large", []byte{3, 0, 1, 0, 0, 0x10, 0}, nil)
	write("FuzzReadFrame", "truncated", AppendFrame(nil, FrameHeartbeat, 0, nil)[:7:7], nil)
	bad := AppendFrame(nil, FrameBody, 1, []byte("abc"))
	bad[len(bad)-1] = 0
	write("FuzzReadFrame", "bad-end-byte", bad, []byte{2})
}
