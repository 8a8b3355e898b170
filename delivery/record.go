package delivery

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// Reserved tags (see the package documentation).
const (
	TagRecord    = "_kmqp_record"
	TagAttempt   = "_kmqp_attempt"
	TagMessageID = "_kmqp_msgid"
	TagStored    = "_kmqp_stored"

	reservedPrefix = "_kmqp_"
	recordVersion  = "1"
)

// ownerID identifies one incarnation of a Consumer's lease table: random per Consumer start and
// renewed whenever the table is dropped, so "owner is me and the lease is unknown" always means
// "settled" (never "forgotten").
type ownerID [16]byte

// leaseKey is the random identity of one delivery; LeaseID is its text form.
type leaseKey [16]byte

// A lease record's body is a sequence of entries, each prefixed by its length (uvarint) so a
// reader can skip fields it does not know and bounce an entry byte for byte:
//
//	owner [16] | lease [16] | gen uvarint | attempt uvarint | expiresAt varint (Unix ms) |
//	id, metadata, body: uvarint length + bytes each | tag count uvarint |
//	per tag: key, value as uvarint length + bytes | [stored varint (Unix ns)]
//
// stored, when KubeMQ stored the original message, is left out when unknown; a reader that
// predates it ignores it, as it ignores any bytes after the fields it knows.
// There is no header: the version lives in the TagRecord value.

// entryFixed is the size of the fixed part of an entry (owner and lease).
const entryFixed = 32

// minEntry is the smallest well-formed entry: fixed part, gen, attempt, expiresAt, three empty
// strings and a zero tag count.
const minEntry = entryFixed + 7

// entry is one decoded lease-record entry. The message fields are decoded lazily (message)
// because most entries are dropped or bounced unread.
type entry struct {
	owner     ownerID
	lease     leaseKey
	gen       uint32
	attempt   uint32
	expiresAt int64  // Unix ms
	raw       []byte // the whole encoded entry, length prefix included
	msg       []byte // the encoded message fields (id .. tags), validated
	stored    int64  // Message.Stored; 0 when absent
}

// recordEntry is what the writer encodes.
type recordEntry struct {
	owner     ownerID
	lease     leaseKey
	gen       uint32
	attempt   uint32
	expiresAt int64
	msg       *Message // ID, Metadata, Body, Tags are written
}

func uvarintLen(x uint64) int {
	n := 1
	for x >= 0x80 {
		x >>= 7
		n++
	}
	return n
}

func strLen(n int) int { return uvarintLen(uint64(n)) + n }

// entrySize is the encoded size of e without its length prefix.
func (e *recordEntry) size() int {
	n := entryFixed + uvarintLen(uint64(e.gen)) + uvarintLen(uint64(e.attempt)) +
		uvarintLen(zigzag(e.expiresAt)) +
		strLen(len(e.msg.ID)) + strLen(len(e.msg.Metadata)) + strLen(len(e.msg.Body)) +
		uvarintLen(uint64(len(e.msg.Tags)))
	for k, v := range e.msg.Tags {
		n += strLen(len(k)) + strLen(len(v))
	}
	if e.msg.Stored != 0 {
		n += uvarintLen(zigzag(e.msg.Stored))
	}
	return n
}

func zigzag(v int64) uint64 { return uint64(v<<1) ^ uint64(v>>63) }

// appendEntry appends e with its length prefix; size is e.size().
func appendEntry(b []byte, e *recordEntry, size int) []byte {
	b = binary.AppendUvarint(b, uint64(size))
	b = append(b, e.owner[:]...)
	b = append(b, e.lease[:]...)
	b = binary.AppendUvarint(b, uint64(e.gen))
	b = binary.AppendUvarint(b, uint64(e.attempt))
	b = binary.AppendVarint(b, e.expiresAt)
	b = appendStr(b, e.msg.ID)
	b = appendStr(b, e.msg.Metadata)
	b = binary.AppendUvarint(b, uint64(len(e.msg.Body)))
	b = append(b, e.msg.Body...)
	b = binary.AppendUvarint(b, uint64(len(e.msg.Tags)))
	for k, v := range e.msg.Tags {
		b = appendStr(b, k)
		b = appendStr(b, v)
	}
	if e.msg.Stored != 0 {
		b = binary.AppendVarint(b, e.msg.Stored)
	}
	return b
}

func appendStr(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// recordWriter packs entries into record bodies of at most maxBytes each (an entry larger than
// that gets a record of its own). It keeps the entries until finish, which allocates every body
// at its exact size: a body stays alive as long as KubeMQ (the embedded server in process) or a
// lease recovered from it holds a reference, so spare capacity would be kept that long too.
type recordWriter struct {
	maxBytes int
	items    []recordItem
}

// recordItem is one entry to write: raw (an encoded entry, bounced unchanged) or e.
type recordItem struct {
	raw  []byte
	e    recordEntry
	size int // e's encoded size without its length prefix
}

func (it *recordItem) len() int {
	if it.raw != nil {
		return len(it.raw)
	}
	return uvarintLen(uint64(it.size)) + it.size
}

func (w *recordWriter) add(e *recordEntry) {
	w.items = append(w.items, recordItem{e: *e, size: e.size()})
}

// addRaw appends an encoded entry unchanged.
func (w *recordWriter) addRaw(raw []byte) {
	w.items = append(w.items, recordItem{raw: raw})
}

// finish returns the record bodies, in entry order.
func (w *recordWriter) finish() [][]byte {
	var bodies [][]byte
	for start := 0; start < len(w.items); {
		end, n := start, 0
		for end < len(w.items) && (end == start || n+w.items[end].len() <= w.maxBytes) {
			n += w.items[end].len()
			end++
		}
		b := make([]byte, 0, n)
		for i := start; i < end; i++ {
			it := &w.items[i]
			if it.raw != nil {
				b = append(b, it.raw...)
			} else {
				b = appendEntry(b, &it.e, it.size)
			}
		}
		bodies = append(bodies, b)
		start = end
	}
	w.items = nil
	return bodies
}

var errRecord = errors.New("delivery: malformed lease record")

// decodeRecord parses a record body. Entries before a malformed one are returned with the
// error, so one corrupt entry does not cost the others. Every length is checked against the
// bytes left before anything is sliced or allocated.
func decodeRecord(body []byte) ([]entry, error) {
	out := make([]entry, 0, min(len(body)/minEntry, 1024))
	for off := 0; off < len(body); {
		n, k := binary.Uvarint(body[off:])
		if k <= 0 || n > uint64(len(body)-off-k) {
			return out, fmt.Errorf("%w: entry at byte %d: bad length", errRecord, off)
		}
		raw := body[off : off+k+int(n)]
		e, err := decodeEntry(raw[k:])
		if err != nil {
			return out, fmt.Errorf("%w: entry at byte %d: %v", errRecord, off, err)
		}
		e.raw = raw
		out = append(out, e)
		off += len(raw)
	}
	return out, nil
}

func decodeEntry(b []byte) (entry, error) {
	var e entry
	if len(b) < entryFixed {
		return e, errors.New("short entry")
	}
	copy(e.owner[:], b[:16])
	copy(e.lease[:], b[16:32])
	r := reader{b: b[32:]}
	gen := r.uvarint()
	att := r.uvarint()
	e.expiresAt = r.varint()
	if r.err != nil {
		return e, r.err
	}
	if gen > math.MaxUint32 || att > math.MaxUint32 || att == 0 {
		return e, errors.New("generation or attempt out of range")
	}
	e.gen, e.attempt = uint32(gen), uint32(att)
	start := r.off
	r.bytes() // id
	r.bytes() // metadata
	r.bytes() // body
	nt := r.uvarint()
	if r.err == nil && nt > uint64(len(r.b)-r.off)/2 {
		return e, errors.New("tag count exceeds entry")
	}
	for i := uint64(0); i < nt && r.err == nil; i++ {
		r.bytes()
		r.bytes()
	}
	if r.err != nil {
		return e, r.err
	}
	e.msg = r.b[start:r.off]
	if r.off < len(r.b) {
		if v := r.varint(); r.err == nil {
			e.stored = v
		}
	}
	// Bytes after the known fields are ignored: room for later versions.
	return e, nil
}

// message decodes the entry's message fields (validated by decodeRecord). Body is a copy: a
// lease recovered from the entry may outlive the rest of the record by far, and must not keep
// the whole record alive.
func (e *entry) message() Message {
	r := reader{b: e.msg}
	m := Message{Stored: e.stored}
	m.ID = string(r.bytes())
	m.Metadata = string(r.bytes())
	if b := r.bytes(); len(b) > 0 {
		m.Body = bytes.Clone(b)
	}
	if nt := r.uvarint(); nt > 0 {
		m.Tags = make(map[string]string, nt)
		for i := uint64(0); i < nt; i++ {
			k := string(r.bytes())
			m.Tags[k] = string(r.bytes())
		}
	}
	return m
}

// reader reads uvarint-framed fields, remembering the first error.
type reader struct {
	b   []byte
	off int
	err error
}

func (r *reader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, k := binary.Uvarint(r.b[r.off:])
	if k <= 0 {
		r.err = errors.New("bad varint")
		return 0
	}
	r.off += k
	return v
}

func (r *reader) varint() int64 {
	if r.err != nil {
		return 0
	}
	v, k := binary.Varint(r.b[r.off:])
	if k <= 0 {
		r.err = errors.New("bad varint")
		return 0
	}
	r.off += k
	return v
}

func (r *reader) bytes() []byte {
	n := r.uvarint()
	if r.err != nil {
		return nil
	}
	if n > uint64(len(r.b)-r.off) {
		r.err = errors.New("field length exceeds entry")
		return nil
	}
	b := r.b[r.off : r.off+int(n)]
	r.off += int(n)
	return b
}
