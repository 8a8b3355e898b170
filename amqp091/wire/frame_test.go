package wire

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
)

func newTestWriter(w io.Writer, frameMax uint32) *FrameWriter {
	return NewFrameWriter(bufio.NewWriter(w), frameMax)
}

func readOne(t *testing.T, b []byte, frameMax uint32) Frame {
	t.Helper()
	fr := NewFrameReader(bufio.NewReader(bytes.NewReader(b)), frameMax)
	f, err := fr.ReadFrame()
	if err != nil {
		t.Fatalf("ReadFrame: %v", err)
	}
	return f
}

func wantAMQPError(t *testing.T, err error, code uint16, textPart string) *Error {
	t.Helper()
	var ae *Error
	if !errors.As(err, &ae) {
		t.Fatalf("err = %v (%T), want *Error %d", err, err, code)
	}
	if ae.Code != code || ae.Hard != IsHardError(code) || !strings.Contains(ae.Text, textPart) {
		t.Fatalf("err = %+v, want code %d with text containing %q", ae, code, textPart)
	}
	return ae
}

func TestReadFrameSequenceReusesBuffer(t *testing.T) {
	var in []byte
	in = AppendFrame(in, FrameMethod, 3, []byte{0, 60, 0, 80, 0, 0, 0, 0, 0, 0, 0, 7, 1})
	in = AppendFrame(in, FrameBody, 3, []byte("hello"))
	in = AppendFrame(in, FrameHeartbeat, 0, nil)
	fr := NewFrameReader(bufio.NewReader(bytes.NewReader(in)), 0)
	if fr.FrameMax() != FrameMinSize {
		t.Fatalf("FrameMax() = %d, want FrameMinSize for 0", fr.FrameMax())
	}

	f, err := fr.ReadFrame()
	if err != nil || f.Type != FrameMethod || f.Channel != 3 {
		t.Fatalf("frame 1: %v %v", f, err)
	}
	m, err := DecodeMethod(f.Payload)
	if err != nil || *(m.(*BasicAck)) != (BasicAck{DeliveryTag: 7, Multiple: true}) {
		t.Fatalf("method: %v %v", m, err)
	}
	first := &f.Payload[0]

	f, err = fr.ReadFrame()
	if err != nil || f.Type != FrameBody || string(f.Payload) != "hello" {
		t.Fatalf("frame 2: %v %v", f, err)
	}
	if &f.Payload[0] != first {
		t.Error("reader did not reuse its buffer")
	}
	if f.String() != "body frame channel=3 size=5" {
		t.Errorf("String() = %q", f.String())
	}
	f, err = fr.ReadFrame()
	if err != nil || f.Type != FrameHeartbeat || f.Channel != 0 || len(f.Payload) != 0 {
		t.Fatalf("frame 3: %v %v", f, err)
	}
	if _, err := fr.ReadFrame(); err != io.EOF {
		t.Fatalf("at end: err = %v, want io.EOF", err)
	}
}

func TestReadFrameTooLargeBeforeAllocating(t *testing.T) {
	const frameMax = 131072
	for _, size := range []uint32{frameMax - FrameOverhead + 1, 1 << 31, 0xFFFFFFFF} {
		hdr := []byte{byte(FrameBody), 0, 1, byte(size >> 24), byte(size >> 16), byte(size >> 8), byte(size)}
		fr := NewFrameReader(bufio.NewReader(bytes.NewReader(hdr)), frameMax)
		_, err := fr.ReadFrame()
		wantAMQPError(t, err, ReplyFrameError, "exceeds frame_max 131072")
		if cap(fr.buf) != 0 {
			t.Fatalf("size %d: reader allocated %d bytes before rejecting", size, cap(fr.buf))
		}
	}
	// Exactly frame_max is fine.
	payload := make([]byte, frameMax-FrameOverhead)
	f := readOne(t, AppendFrame(nil, FrameBody, 1, payload), frameMax)
	if len(f.Payload) != len(payload) {
		t.Fatalf("payload %d bytes", len(f.Payload))
	}
	// SetFrameMax tightens the limit on the same reader.
	in := AppendFrame(AppendFrame(nil, FrameBody, 1, payload), FrameBody, 1, payload)
	fr := NewFrameReader(bufio.NewReader(bytes.NewReader(in)), frameMax)
	if _, err := fr.ReadFrame(); err != nil {
		t.Fatal(err)
	}
	fr.SetFrameMax(FrameMinSize)
	_, err := fr.ReadFrame()
	wantAMQPError(t, err, ReplyFrameError, "exceeds frame_max 4096")
}

func TestReadFrameErrors(t *testing.T) {
	good := AppendFrame(nil, FrameMethod, 0, []byte{0, 10, 0, 51})
	badEnd := bytes.Clone(good)
	badEnd[len(badEnd)-1] = 0xCD
	badType := bytes.Clone(good)
	badType[0] = 4

	for _, c := range []struct {
		name string
		in   []byte
		code uint16
		text string
		err  error
	}{
		{name: "bad frame end", in: badEnd, code: ReplyFrameError, text: "ends with 0xcd, not 0xce"},
		{name: "unknown type", in: badType, code: ReplyFrameError, text: "unknown frame type 4"},
		{name: "empty", in: nil, err: io.EOF},
		{name: "partial header", in: good[:3], err: io.ErrUnexpectedEOF},
		{name: "header only", in: good[:7], err: io.ErrUnexpectedEOF},
		{name: "missing end", in: good[:len(good)-1], err: io.ErrUnexpectedEOF},
	} {
		t.Run(c.name, func(t *testing.T) {
			fr := NewFrameReader(bufio.NewReader(bytes.NewReader(c.in)), FrameMinSize)
			_, err := fr.ReadFrame()
			if c.err != nil {
				if err != c.err {
					t.Fatalf("err = %v, want %v", err, c.err)
				}
				return
			}
			wantAMQPError(t, err, c.code, c.text)
		})
	}
}

type failWriter struct{ err error }

func (w failWriter) Write([]byte) (int, error) { return 0, w.err }

func TestFrameWriter(t *testing.T) {
	var buf bytes.Buffer
	fw := newTestWriter(&buf, 0)
	if fw.FrameMax() != FrameMinSize {
		t.Fatalf("FrameMax() = %d", fw.FrameMax())
	}
	if err := fw.WriteHeartbeat(); err != nil {
		t.Fatal(err)
	}
	if err := fw.WriteFrame(Frame{Type: FrameBody, Channel: 9, Payload: []byte("ab")}); err != nil {
		t.Fatal(err)
	}
	if buf.Len() != 0 {
		t.Fatal("FrameWriter flushed on its own")
	}
	if err := fw.Flush(); err != nil {
		t.Fatal(err)
	}
	want := []byte{8, 0, 0, 0, 0, 0, 0, 0xCE, 3, 0, 9, 0, 0, 0, 2, 'a', 'b', 0xCE}
	if !bytes.Equal(buf.Bytes(), want) {
		t.Fatalf("got % x\nwant % x", buf.Bytes(), want)
	}

	// Frames that cannot be split must fit frame-max.
	err := fw.WriteFrame(Frame{Type: FrameBody, Payload: make([]byte, FrameMinSize)})
	if !errors.Is(err, ErrFrameTooLarge) {
		t.Errorf("oversized frame: %v", err)
	}
	err = fw.WriteMethod(1, &ConnectionStart{Mechanisms: strings.Repeat("x", FrameMinSize)})
	if !errors.Is(err, ErrFrameTooLarge) {
		t.Errorf("oversized method: %v", err)
	}
	err = fw.WriteContent(1, &BasicPublish{}, &Properties{Flags: FlagHeaders, Headers: Table{"h": strings.Repeat("x", FrameMinSize)}}, nil)
	if !errors.Is(err, ErrFrameTooLarge) {
		t.Errorf("oversized content header: %v", err)
	}
	if err := fw.WriteContent(1, &BasicAck{}, nil, nil); err == nil {
		t.Error("content written after a method without content")
	}

	// Transport errors surface.
	boom := errors.New("boom")
	fw = NewFrameWriter(bufio.NewWriterSize(failWriter{boom}, 16), FrameMinSize)
	if err := fw.WriteBody(1, make([]byte, 100)); !errors.Is(err, boom) {
		t.Errorf("transport error: %v", err)
	}
}

func TestWriteContentSplitsBody(t *testing.T) {
	const frameMax = FrameMinSize
	chunk := frameMax - FrameOverhead
	for _, size := range []int{0, 1, chunk - 1, chunk, chunk + 1, 3*chunk + 17} {
		body := bytes.Repeat([]byte{'z'}, size)
		for i := range body {
			body[i] = byte(i)
		}
		props := &Properties{Flags: FlagContentType, ContentType: "application/octet-stream"}
		var buf bytes.Buffer
		fw := newTestWriter(&buf, frameMax)
		if err := fw.WriteContent(5, &BasicDeliver{ConsumerTag: "c", DeliveryTag: 1}, props, body); err != nil {
			t.Fatal(err)
		}
		fw.Flush()

		fr := NewFrameReader(bufio.NewReader(&buf), frameMax)
		f, err := fr.ReadFrame()
		if err != nil || f.Type != FrameMethod {
			t.Fatalf("size %d: method frame %v %v", size, f, err)
		}
		f, err = fr.ReadFrame()
		if err != nil || f.Type != FrameHeader || f.Channel != 5 {
			t.Fatalf("size %d: header frame %v %v", size, f, err)
		}
		h, err := DecodeContentHeader(f.Payload)
		if err != nil || h.BodySize != uint64(size) || h.ContentType != props.ContentType || h.ClassID != ClassBasic {
			t.Fatalf("size %d: header %+v %v", size, h, err)
		}
		var got []byte
		frames := 0
		for uint64(len(got)) < h.BodySize {
			f, err = fr.ReadFrame()
			if err != nil || f.Type != FrameBody || f.Channel != 5 {
				t.Fatalf("size %d: body frame %v %v", size, f, err)
			}
			if len(f.Payload) == 0 || len(f.Payload) > chunk {
				t.Fatalf("size %d: body frame of %d bytes", size, len(f.Payload))
			}
			got = append(got, f.Payload...)
			frames++
		}
		if !bytes.Equal(got, body) {
			t.Fatalf("size %d: body differs", size)
		}
		if want := (size + chunk - 1) / chunk; frames != want {
			t.Fatalf("size %d: %d body frames, want %d", size, frames, want)
		}
		if _, err := fr.ReadFrame(); err != io.EOF {
			t.Fatalf("size %d: extra frames (%v)", size, err)
		}
	}
}

func TestProtocolHeader(t *testing.T) {
	if err := ReadProtocolHeader(bytes.NewReader([]byte("AMQP\x00\x00\x09\x01rest"))); err != nil {
		t.Fatalf("0-9-1: %v", err)
	}
	for _, c := range []struct {
		in   string
		text string
	}{
		{"AMQP\x00\x00\x09\x00", "unsupported AMQP protocol header 0-0-9-0"},
		{"AMQP\x00\x01\x00\x00", "unsupported AMQP protocol header 0-1-0-0"},
		{"AMQP\x03\x01\x00\x00", "unsupported AMQP protocol header 3-1-0-0"}, // SASL layer of 1.0
		{"GET / HTTP/1.1\r\n", `not an AMQP protocol header: "GET / HT"`},
	} {
		err := ReadProtocolHeader(strings.NewReader(c.in))
		var phe *ProtocolHeaderError
		if !errors.As(err, &phe) || !errors.Is(err, ErrProtocolHeader) || !strings.Contains(err.Error(), c.text) {
			t.Errorf("%q: err = %v", c.in, err)
		}
	}
	if err := ReadProtocolHeader(strings.NewReader("AMQ")); err != io.ErrUnexpectedEOF {
		t.Errorf("short: %v", err)
	}
	if err := ReadProtocolHeader(strings.NewReader("")); err != io.EOF {
		t.Errorf("empty: %v", err)
	}
	if string(ProtocolHeader[:]) != "AMQP\x00\x00\x09\x01" {
		t.Errorf("ProtocolHeader = %q", ProtocolHeader[:])
	}
}

func TestFrameTypeString(t *testing.T) {
	for typ, want := range map[FrameType]string{FrameMethod: "method", FrameHeader: "header", FrameBody: "body", FrameHeartbeat: "heartbeat", 7: "frame-type-7"} {
		if typ.String() != want {
			t.Errorf("%d: %q", typ, typ.String())
		}
	}
}
