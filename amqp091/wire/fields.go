package wire

import (
	"encoding/binary"
	"fmt"
	"time"
)

// encoder appends AMQP primitive fields to buf. The first failure sticks in
// err and later calls are no-ops, so generated encoders need no error plumbing.
type encoder struct {
	buf   []byte
	err   error
	depth int // nesting of tables/arrays being written
}

func (e *encoder) fail(format string, args ...any) {
	if e.err == nil {
		e.err = fmt.Errorf(format, args...)
	}
}

func (e *encoder) octet(v uint8) { e.buf = append(e.buf, v) }

func (e *encoder) short(v uint16) { e.buf = binary.BigEndian.AppendUint16(e.buf, v) }

func (e *encoder) long(v uint32) { e.buf = binary.BigEndian.AppendUint32(e.buf, v) }

func (e *encoder) longlong(v uint64) { e.buf = binary.BigEndian.AppendUint64(e.buf, v) }

func (e *encoder) shortstr(s string) {
	if len(s) > 255 {
		e.fail("wire: short string of %d bytes exceeds 255", len(s))
		return
	}
	e.buf = append(e.buf, uint8(len(s)))
	e.buf = append(e.buf, s...)
}

func (e *encoder) longstr(s string) {
	if uint64(len(s)) > maxLongstr {
		e.fail("wire: long string of %d bytes exceeds 2^32-1", len(s))
		return
	}
	e.long(uint32(len(s)))
	e.buf = append(e.buf, s...)
}

func (e *encoder) longbytes(b []byte) {
	if uint64(len(b)) > maxLongstr {
		e.fail("wire: byte array of %d bytes exceeds 2^32-1", len(b))
		return
	}
	e.long(uint32(len(b)))
	e.buf = append(e.buf, b...)
}

// timestamp writes seconds since the epoch; sub-second precision is dropped
// because the wire has none.
func (e *encoder) timestamp(t time.Time) { e.longlong(uint64(t.Unix())) }

// maxLongstr is the largest length a long-uint prefix can carry.
const maxLongstr = 1<<32 - 1

// decoder reads AMQP primitive fields from buf. Every read is checked
// against the bytes that remain before anything is sliced or allocated; the
// first failure sticks in err and later reads return zero values.
type decoder struct {
	buf   []byte
	off   int
	err   error
	depth int // nesting of tables/arrays being read
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf(format, args...)
	}
}

// need reports whether n more bytes are available, failing otherwise.
func (d *decoder) need(n int, what string) bool {
	if d.err != nil {
		return false
	}
	if n < 0 || len(d.buf)-d.off < n {
		d.fail("%s needs %d bytes, %d remain", what, n, len(d.buf)-d.off)
		return false
	}
	return true
}

func (d *decoder) remaining() int { return len(d.buf) - d.off }

func (d *decoder) octet() uint8 {
	if !d.need(1, "octet") {
		return 0
	}
	v := d.buf[d.off]
	d.off++
	return v
}

func (d *decoder) short() uint16 {
	if !d.need(2, "short") {
		return 0
	}
	v := binary.BigEndian.Uint16(d.buf[d.off:])
	d.off += 2
	return v
}

func (d *decoder) long() uint32 {
	if !d.need(4, "long") {
		return 0
	}
	v := binary.BigEndian.Uint32(d.buf[d.off:])
	d.off += 4
	return v
}

func (d *decoder) longlong() uint64 {
	if !d.need(8, "longlong") {
		return 0
	}
	v := binary.BigEndian.Uint64(d.buf[d.off:])
	d.off += 8
	return v
}

// raw returns the next n bytes without copying; callers copy what they keep
// because buf is usually a reused frame buffer.
func (d *decoder) raw(n int, what string) []byte {
	if !d.need(n, what) {
		return nil
	}
	b := d.buf[d.off : d.off+n : d.off+n]
	d.off += n
	return b
}

// longLen reads a long-uint length prefix and checks it against the bytes
// that remain, so a forged length cannot cause a large allocation.
func (d *decoder) longLen(what string) int {
	n := d.long()
	if d.err != nil {
		return 0
	}
	if uint64(n) > uint64(d.remaining()) {
		d.fail("%s declares %d bytes, %d remain", what, n, d.remaining())
		return 0
	}
	return int(n)
}

func (d *decoder) shortstr() string {
	n := int(d.octet())
	if n == 0 {
		return ""
	}
	return string(d.raw(n, "short string"))
}

func (d *decoder) longstr() string {
	n := d.longLen("long string")
	if n == 0 {
		return ""
	}
	return string(d.raw(n, "long string"))
}

// longbytes reads a long-uint prefixed byte array into a fresh slice
// (empty but non-nil when the array is empty).
func (d *decoder) longbytes() []byte {
	n := d.longLen("byte array")
	if d.err != nil {
		return nil
	}
	return append([]byte{}, d.raw(n, "byte array")...)
}

func (d *decoder) skipShort() { d.short() }

func (d *decoder) skipShortstr() { d.raw(int(d.octet()), "short string") }

func (d *decoder) skipLongstr() { d.raw(d.longLen("long string"), "long string") }

func (d *decoder) timestamp() time.Time {
	v := d.longlong()
	if d.err != nil {
		return time.Time{}
	}
	// The cast keeps all 64 bits: Unix() gives them back unchanged.
	return time.Unix(int64(v), 0).UTC()
}
