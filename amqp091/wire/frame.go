package wire

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// FrameType is the first octet of a frame.
type FrameType uint8

// String names the frame type.
func (t FrameType) String() string {
	switch t {
	case FrameMethod:
		return "method"
	case FrameHeader:
		return "header"
	case FrameBody:
		return "body"
	case FrameHeartbeat:
		return "heartbeat"
	}
	return fmt.Sprintf("frame-type-%d", uint8(t))
}

const (
	// frameHeaderSize is type (1) + channel (2) + payload size (4).
	frameHeaderSize = 7
	// FrameOverhead is what a frame adds to its payload: the 7-byte header
	// and the frame-end octet. A frame's payload is at most frame-max minus
	// FrameOverhead.
	FrameOverhead = frameHeaderSize + 1
)

// Frame is one AMQP frame. A Frame returned by FrameReader.ReadFrame
// borrows the reader's buffer: Payload is valid only until the next
// ReadFrame call.
type Frame struct {
	Type    FrameType
	Channel uint16
	Payload []byte
}

// String describes the frame without its payload bytes.
func (f Frame) String() string {
	return fmt.Sprintf("%s frame channel=%d size=%d", f.Type, f.Channel, len(f.Payload))
}

// effectiveFrameMax turns a negotiated frame-max into the limit enforced.
// The spec lets peers always send frames of FrameMinSize, also before tuning,
// and 0 ("no limit" in connection.tune) is for the broker to resolve to its
// own maximum before it reaches the codec; both map to at least FrameMinSize.
func effectiveFrameMax(n uint32) uint32 {
	if n < FrameMinSize {
		return FrameMinSize
	}
	return n
}

// FrameReader reads frames from a connection with one reusable buffer.
// It is owned by a single goroutine (the connection's reader); it is not
// safe for concurrent use.
type FrameReader struct {
	r        *bufio.Reader
	frameMax uint32
	hdr      [frameHeaderSize]byte
	buf      []byte // payload + frame-end of the last frame, reused
}

// NewFrameReader returns a reader that accepts frames of at most frameMax
// bytes in total (header and frame-end included); see SetFrameMax.
func NewFrameReader(r *bufio.Reader, frameMax uint32) *FrameReader {
	return &FrameReader{r: r, frameMax: effectiveFrameMax(frameMax)}
}

// SetFrameMax changes the limit, e.g. after connection.tune-ok. Values below
// FrameMinSize (including 0) mean FrameMinSize.
func (fr *FrameReader) SetFrameMax(frameMax uint32) { fr.frameMax = effectiveFrameMax(frameMax) }

// FrameMax returns the limit in force.
func (fr *FrameReader) FrameMax() uint32 { return fr.frameMax }

// ReadFrame reads the next frame. The declared payload size is checked
// against frame-max before any buffer is grown, so a peer cannot make the
// reader allocate more than frame-max bytes.
//
// Errors: io.EOF when the stream ends cleanly between frames;
// io.ErrUnexpectedEOF when it ends inside one; a hard *Error with code
// FRAME_ERROR (501) for an oversized frame, an unknown frame type or a bad
// frame-end octet (the connection must be closed); or the transport error.
func (fr *FrameReader) ReadFrame() (Frame, error) {
	if _, err := io.ReadFull(fr.r, fr.hdr[:]); err != nil {
		return Frame{}, err
	}
	typ := FrameType(fr.hdr[0])
	channel := binary.BigEndian.Uint16(fr.hdr[1:3])
	size := binary.BigEndian.Uint32(fr.hdr[3:7])

	if uint64(size)+FrameOverhead > uint64(fr.frameMax) {
		return Frame{}, FrameError("%s frame of %d bytes on channel %d exceeds frame_max %d",
			typ, uint64(size)+FrameOverhead, channel, fr.frameMax)
	}
	switch typ {
	case FrameMethod, FrameHeader, FrameBody, FrameHeartbeat:
	default:
		return Frame{}, FrameError("unknown frame type %d on channel %d", uint8(typ), channel)
	}

	n := int(size) + 1 // payload + frame-end
	if cap(fr.buf) < n {
		fr.buf = make([]byte, n)
	}
	buf := fr.buf[:n]
	if _, err := io.ReadFull(fr.r, buf); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return Frame{}, err
	}
	if end := buf[size]; end != FrameEnd {
		return Frame{}, FrameError("%s frame on channel %d ends with 0x%02x, not 0x%02x",
			typ, channel, end, FrameEnd)
	}
	return Frame{Type: typ, Channel: channel, Payload: buf[:size:size]}, nil
}

// AppendFrame appends one complete frame (header, payload, frame-end) to dst.
func AppendFrame(dst []byte, typ FrameType, channel uint16, payload []byte) []byte {
	dst = append(dst, byte(typ))
	dst = binary.BigEndian.AppendUint16(dst, channel)
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(payload)))
	dst = append(dst, payload...)
	return append(dst, FrameEnd)
}

// ErrFrameTooLarge is returned by FrameWriter when a frame that cannot be
// split (method or content header) would exceed frame-max.
var ErrFrameTooLarge = errors.New("wire: frame exceeds frame_max")

// FrameWriter encodes frames into a bufio.Writer with one reusable scratch
// buffer. It never flushes on its own, so a caller can batch frames and
// Flush once. It is owned by a single goroutine (the connection's writer);
// it is not safe for concurrent use.
type FrameWriter struct {
	w        *bufio.Writer
	frameMax uint32
	hdr      [frameHeaderSize]byte // scratch for frame headers; a local would escape
	buf      []byte
}

// NewFrameWriter returns a writer that keeps every frame within frameMax
// bytes; see SetFrameMax.
func NewFrameWriter(w *bufio.Writer, frameMax uint32) *FrameWriter {
	return &FrameWriter{w: w, frameMax: effectiveFrameMax(frameMax)}
}

// SetFrameMax changes the limit, e.g. after connection.tune-ok. Values below
// FrameMinSize (including 0) mean FrameMinSize.
func (fw *FrameWriter) SetFrameMax(frameMax uint32) { fw.frameMax = effectiveFrameMax(frameMax) }

// FrameMax returns the limit in force.
func (fw *FrameWriter) FrameMax() uint32 { return fw.frameMax }

// Flush flushes the underlying bufio.Writer.
func (fw *FrameWriter) Flush() error { return fw.w.Flush() }

// WriteFrame writes one frame as is.
func (fw *FrameWriter) WriteFrame(f Frame) error {
	if uint64(len(f.Payload))+FrameOverhead > uint64(fw.frameMax) {
		return fmt.Errorf("%w: %s", ErrFrameTooLarge, f)
	}
	return fw.writeFrame(f.Type, f.Channel, f.Payload)
}

// writeFrame writes header, payload and frame-end without copying the
// payload into scratch space.
func (fw *FrameWriter) writeFrame(typ FrameType, channel uint16, payload []byte) error {
	hdr := fw.hdr[:]
	hdr[0] = byte(typ)
	binary.BigEndian.PutUint16(hdr[1:3], channel)
	binary.BigEndian.PutUint32(hdr[3:7], uint32(len(payload)))
	if _, err := fw.w.Write(hdr); err != nil {
		return err
	}
	if _, err := fw.w.Write(payload); err != nil {
		return err
	}
	return fw.w.WriteByte(FrameEnd)
}

// WriteHeartbeat writes a heartbeat frame (channel 0, empty payload).
func (fw *FrameWriter) WriteHeartbeat() error {
	return fw.writeFrame(FrameHeartbeat, 0, nil)
}

// WriteMethod encodes m into a method frame on channel.
func (fw *FrameWriter) WriteMethod(channel uint16, m Method) error {
	buf, err := AppendMethod(fw.buf[:0], m)
	fw.buf = buf[:0]
	if err != nil {
		return err
	}
	if uint64(len(buf))+FrameOverhead > uint64(fw.frameMax) {
		return fmt.Errorf("%w: %s on channel %d needs %d bytes, frame_max is %d",
			ErrFrameTooLarge, m.Name(), channel, len(buf)+FrameOverhead, fw.frameMax)
	}
	return fw.writeFrame(FrameMethod, channel, buf)
}

// WriteContent writes a content-carrying method (basic.deliver,
// basic.get-ok, basic.return, basic.publish) followed by its content header
// and the body split into body frames of at most frame-max. props may be
// nil for a message without properties.
func (fw *FrameWriter) WriteContent(channel uint16, m Method, props *Properties, body []byte) error {
	if !m.HasContent() {
		return fmt.Errorf("wire: %s carries no content", m.Name())
	}
	if err := fw.WriteMethod(channel, m); err != nil {
		return err
	}
	h := ContentHeader{ClassID: m.ClassID(), BodySize: uint64(len(body))}
	if props != nil {
		h.Properties = *props
	}
	buf, err := AppendContentHeader(fw.buf[:0], &h)
	fw.buf = buf[:0]
	if err != nil {
		return err
	}
	if uint64(len(buf))+FrameOverhead > uint64(fw.frameMax) {
		return fmt.Errorf("%w: content header on channel %d needs %d bytes, frame_max is %d",
			ErrFrameTooLarge, channel, len(buf)+FrameOverhead, fw.frameMax)
	}
	if err := fw.writeFrame(FrameHeader, channel, buf); err != nil {
		return err
	}
	return fw.WriteBody(channel, body)
}

// WriteBody writes body as body frames of at most frame-max each; an empty
// body writes no frame, as the spec requires.
func (fw *FrameWriter) WriteBody(channel uint16, body []byte) error {
	chunk := int(fw.frameMax - FrameOverhead)
	for len(body) > 0 {
		n := min(len(body), chunk)
		if err := fw.writeFrame(FrameBody, channel, body[:n]); err != nil {
			return err
		}
		body = body[n:]
	}
	return nil
}
