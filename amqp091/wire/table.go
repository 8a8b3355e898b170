package wire

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// Table is an AMQP field table (RabbitMQ's dialect, which differs from the
// 0-9-1 spec text in the letters for short integers).
//
// Decoding yields exactly these Go types, one per field type letter:
//
//	't' bool        'b' int8     'B' uint8    's' int16   'u' uint16
//	'I' int32       'i' uint32   'l' int64    'f' float32 'd' float64
//	'D' Decimal     'S' string   'x' []byte   'A' []any   'T' time.Time (UTC, whole seconds)
//	'F' Table       'V' nil
//
// so a value's Go type preserves its wire type, including the difference
// between a long string (string) and a byte array ([]byte). Encoding accepts
// the same types plus int (written as 'l') and map[string]any (written as
// 'F'); any other type is an error.
//
// An empty top-level table (method arguments, message headers) decodes as
// nil. Nested empty tables, arrays and byte arrays decode as empty, non-nil
// values. Keys are written in sorted order, so encoding is deterministic.
type Table map[string]any

// Decimal is the AMQP decimal field type ('D'): Value × 10^-Scale.
type Decimal struct {
	Scale uint8
	Value int32
}

// MaxTableDepth bounds the nesting of tables and arrays, in both directions:
// decoding fails beyond it (no unbounded recursion on hostile input) and so
// does encoding (a Table that contains itself cannot loop forever).
// RabbitMQ's deepest real use, x-death, nests three levels.
const MaxTableDepth = 32

// AppendTable appends t's wire form (long-uint length, then fields) to dst.
func AppendTable(dst []byte, t Table) ([]byte, error) {
	e := encoder{buf: dst}
	e.table(t)
	return e.buf, e.err
}

// DecodeTable decodes one complete field table, length prefix included, from
// b. Bytes after the table are an error. Strings and byte arrays are copied,
// so b may be reused afterwards.
func DecodeTable(b []byte) (Table, error) {
	d := decoder{buf: b}
	t := d.table()
	if d.err == nil && d.remaining() != 0 {
		d.fail("%d bytes after field table", d.remaining())
	}
	if d.err != nil {
		return nil, fmt.Errorf("wire: field table: %w", d.err)
	}
	return t, nil
}

// DecodeTableFields decodes field-table entries that fill b exactly, with no
// length prefix. That is the form of the AMQPLAIN SASL response
// (LOGIN and PASSWORD entries) in connection.start-ok. An empty b gives nil.
func DecodeTableFields(b []byte) (Table, error) {
	d := decoder{buf: b, depth: 1} // the entries are a table's body: depth 1
	t := d.tableBody(len(b))
	if d.err != nil {
		return nil, fmt.Errorf("wire: field table entries: %w", d.err)
	}
	if len(t) == 0 {
		return nil, nil
	}
	return t, nil
}

func (e *encoder) table(t Table) { e.tableMap(t) }

func (e *encoder) tableMap(t map[string]any) {
	if e.err != nil {
		return
	}
	if e.depth >= MaxTableDepth {
		e.fail("wire: field tables nested deeper than %d", MaxTableDepth)
		return
	}
	e.depth++
	defer func() { e.depth-- }()

	at := len(e.buf)
	e.long(0)            // length, patched below
	var small [16]string // typical header and argument tables fit without allocating
	keys := small[:0]
	for k := range t {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if len(k) > 255 {
			e.fail("wire: field table key of %d bytes exceeds 255", len(k))
			return
		}
		e.shortstr(k)
		e.fieldValue(k, t[k])
	}
	e.patchLen(at)
}

// patchLen writes the length of everything after the 4-byte prefix at 'at'.
func (e *encoder) patchLen(at int) {
	n := len(e.buf) - at - 4
	if uint64(n) > maxLongstr {
		e.fail("wire: field table of %d bytes exceeds 2^32-1", n)
		return
	}
	e.buf[at] = byte(n >> 24)
	e.buf[at+1] = byte(n >> 16)
	e.buf[at+2] = byte(n >> 8)
	e.buf[at+3] = byte(n)
}

func (e *encoder) array(a []any) {
	if e.err != nil {
		return
	}
	if e.depth >= MaxTableDepth {
		e.fail("wire: field arrays nested deeper than %d", MaxTableDepth)
		return
	}
	e.depth++
	defer func() { e.depth-- }()
	at := len(e.buf)
	e.long(0)
	for _, v := range a {
		e.fieldValue("", v)
	}
	e.patchLen(at)
}

// fieldValue writes a type letter and value; key only names it in errors
// ("" for array elements).
func (e *encoder) fieldValue(key string, v any) {
	if e.err != nil {
		return
	}
	switch v := v.(type) {
	case bool:
		e.octet('t')
		if v {
			e.octet(1)
		} else {
			e.octet(0)
		}
	case int8:
		e.octet('b')
		e.octet(uint8(v))
	case uint8:
		e.octet('B')
		e.octet(v)
	case int16:
		e.octet('s')
		e.short(uint16(v))
	case uint16:
		e.octet('u')
		e.short(v)
	case int32:
		e.octet('I')
		e.long(uint32(v))
	case uint32:
		e.octet('i')
		e.long(v)
	case int64:
		e.octet('l')
		e.longlong(uint64(v))
	case int:
		e.octet('l')
		e.longlong(uint64(int64(v)))
	case float32:
		e.octet('f')
		e.long(math.Float32bits(v))
	case float64:
		e.octet('d')
		e.longlong(math.Float64bits(v))
	case Decimal:
		e.octet('D')
		e.octet(v.Scale)
		e.long(uint32(v.Value))
	case string:
		e.octet('S')
		e.longstr(v)
	case []byte:
		e.octet('x')
		e.longbytes(v)
	case []any:
		e.octet('A')
		e.array(v)
	case time.Time:
		e.octet('T')
		e.timestamp(v)
	case Table:
		e.octet('F')
		e.tableMap(v)
	case map[string]any:
		e.octet('F')
		e.tableMap(v)
	case nil:
		e.octet('V')
	default:
		if key == "" {
			e.fail("wire: unsupported Go type %T in field array", v)
		} else {
			e.fail("wire: field %q: unsupported Go type %T in field table", key, v)
		}
	}
}

// table reads a top-level table: empty decodes as nil.
func (d *decoder) table() Table {
	t := d.tableValue()
	if len(t) == 0 {
		return nil
	}
	return t
}

// tableValue reads a length-prefixed table, returning a non-nil Table.
func (d *decoder) tableValue() Table {
	n := d.longLen("field table")
	if d.err != nil {
		return nil
	}
	if d.depth >= MaxTableDepth {
		d.fail("field tables nested deeper than %d", MaxTableDepth)
		return nil
	}
	d.depth++
	defer func() { d.depth-- }()
	return d.tableBody(d.off + n)
}

// tableBody reads entries up to offset end, which the caller has checked
// lies within buf. While it runs, buf is cut at end, so no entry can borrow
// bytes from whatever follows the table.
func (d *decoder) tableBody(end int) Table {
	outer := d.limit(end)
	defer func() { d.buf = outer }()
	t := Table{}
	for d.err == nil && d.off < end {
		k := d.shortstr()
		v := d.fieldValue()
		if d.err != nil {
			return nil
		}
		t[k] = v
	}
	return t
}

// limit cuts buf at end and returns the previous buf for the caller to
// restore.
func (d *decoder) limit(end int) []byte {
	outer := d.buf
	d.buf = d.buf[:end]
	return outer
}

func (d *decoder) arrayValue() []any {
	n := d.longLen("field array")
	if d.err != nil {
		return nil
	}
	if d.depth >= MaxTableDepth {
		d.fail("field arrays nested deeper than %d", MaxTableDepth)
		return nil
	}
	d.depth++
	defer func() { d.depth-- }()

	end := d.off + n
	outer := d.limit(end)
	defer func() { d.buf = outer }()
	a := []any{}
	for d.err == nil && d.off < end {
		v := d.fieldValue()
		if d.err != nil {
			return nil
		}
		a = append(a, v)
	}
	return a
}

func (d *decoder) fieldValue() any {
	typ := d.octet()
	if d.err != nil {
		return nil
	}
	switch typ {
	case 't':
		return d.octet() != 0
	case 'b':
		return int8(d.octet())
	case 'B':
		return d.octet()
	case 's':
		return int16(d.short())
	case 'u':
		return d.short()
	case 'I':
		return int32(d.long())
	case 'i':
		return d.long()
	case 'l':
		return int64(d.longlong())
	case 'f':
		return math.Float32frombits(d.long())
	case 'd':
		return math.Float64frombits(d.longlong())
	case 'D':
		scale := d.octet()
		return Decimal{Scale: scale, Value: int32(d.long())}
	case 'S':
		return d.longstr()
	case 'x':
		return d.longbytes()
	case 'A':
		return d.arrayValue()
	case 'T':
		return d.timestamp()
	case 'F':
		return d.tableValue()
	case 'V':
		return nil
	}
	d.fail("unknown field type %q (0x%02x)", typ, typ)
	return nil
}
