package wire

import (
	"bufio"
	"bytes"
	"io"
	"testing"
	"time"
)

// A typical publish: basic.publish, a content header with a few properties
// and two headers, and a 1 KiB body.
func benchPublish() (*BasicPublish, *Properties, []byte) {
	m := &BasicPublish{Exchange: "orders", RoutingKey: "order.created.eu"}
	p := &Properties{
		ContentType:  "application/json",
		DeliveryMode: 2,
		MessageID:    "0b6b1f0e-4b8e-4bd7-9f57-4a0e3d3c9d11",
		Timestamp:    time.Unix(1700000000, 0),
		Headers:      Table{"x-tenant": "acme", "x-retry": int32(0)},
	}
	p.FlagNonZero()
	return m, p, bytes.Repeat([]byte{'b'}, 1024)
}

func BenchmarkEncodePublish(b *testing.B) {
	m, p, body := benchPublish()
	fw := NewFrameWriter(bufio.NewWriterSize(io.Discard, 64<<10), 131072)
	b.ReportAllocs()
	for b.Loop() {
		if err := fw.WriteContent(1, m, p, body); err != nil {
			b.Fatal(err)
		}
		if err := fw.Flush(); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodePublish(b *testing.B) {
	m, p, body := benchPublish()
	var stream bytes.Buffer
	fw := NewFrameWriter(bufio.NewWriter(&stream), 131072)
	if err := fw.WriteContent(1, m, p, body); err != nil {
		b.Fatal(err)
	}
	fw.Flush()
	in := stream.Bytes()
	b.SetBytes(int64(len(in)))

	rd := bytes.NewReader(in)
	br := bufio.NewReaderSize(rd, 64<<10)
	fr := NewFrameReader(br, 131072)
	assembled := make([]byte, 0, 4096) // the body buffer a channel would reuse
	b.ReportAllocs()
	for b.Loop() {
		rd.Reset(in)
		br.Reset(rd)
		f, err := fr.ReadFrame()
		if err != nil {
			b.Fatal(err)
		}
		if _, err := DecodeMethod(f.Payload); err != nil {
			b.Fatal(err)
		}
		f, err = fr.ReadFrame()
		if err != nil {
			b.Fatal(err)
		}
		h, err := DecodeContentHeader(f.Payload)
		if err != nil {
			b.Fatal(err)
		}
		assembled = assembled[:0]
		for uint64(len(assembled)) < h.BodySize {
			f, err = fr.ReadFrame()
			if err != nil {
				b.Fatal(err)
			}
			assembled = append(assembled, f.Payload...)
		}
	}
}

func BenchmarkDecodeTable(b *testing.B) {
	_, p, _ := benchPublish()
	enc, _ := AppendTable(nil, p.Headers)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeTable(enc); err != nil {
			b.Fatal(err)
		}
	}
}
