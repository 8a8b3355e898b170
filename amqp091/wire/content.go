package wire

import (
	"encoding/binary"
	"fmt"
	"strings"
	"time"
)

// PropertyFlags says which basic properties a content header carries, one
// bit per property (FlagContentType ... FlagClusterID).
type PropertyFlags uint16

// allPropertyFlags is every flag basic defines.
const allPropertyFlags = FlagContentType | FlagContentEncoding | FlagHeaders | FlagDeliveryMode |
	FlagPriority | FlagCorrelationID | FlagReplyTo | FlagExpiration | FlagMessageID |
	FlagTimestamp | FlagType | FlagUserID | FlagAppID | FlagClusterID

// String lists the set flags by property name.
func (f PropertyFlags) String() string {
	var names []string
	for i, name := range propertyFlagNames {
		if f&(1<<(15-i)) != 0 {
			names = append(names, name)
		}
	}
	if rest := f &^ allPropertyFlags; rest != 0 {
		names = append(names, fmt.Sprintf("0x%04x", uint16(rest)))
	}
	return "{" + strings.Join(names, ",") + "}"
}

// Properties are the 14 properties of class basic. Flags is authoritative:
// the encoder writes exactly the flagged properties (so a present-but-empty
// property survives a round trip), and the decoder sets the flag of every
// property it read. FlagNonZero derives Flags from the values for callers
// building a message.
type Properties struct {
	Flags           PropertyFlags
	ContentType     string    // MIME type
	ContentEncoding string    // MIME encoding
	Headers         Table     // application headers
	DeliveryMode    uint8     // 1 transient, 2 persistent
	Priority        uint8     // 0..9 in the spec
	CorrelationID   string    // application correlation id
	ReplyTo         string    // address to reply to
	Expiration      string    // per-message TTL in milliseconds, as a decimal string
	MessageID       string    // application message id
	Timestamp       time.Time // whole seconds, UTC when decoded
	Type            string    // application message type
	UserID          string    // creating user id (RabbitMQ checks it)
	AppID           string    // creating application id
	ClusterID       string    // deprecated "reserved" property
}

// FlagNonZero sets the flag of every property whose value is not the zero
// value, keeping flags already set.
func (p *Properties) FlagNonZero() {
	set := func(f PropertyFlags, nonZero bool) {
		if nonZero {
			p.Flags |= f
		}
	}
	set(FlagContentType, p.ContentType != "")
	set(FlagContentEncoding, p.ContentEncoding != "")
	set(FlagHeaders, len(p.Headers) > 0)
	set(FlagDeliveryMode, p.DeliveryMode != 0)
	set(FlagPriority, p.Priority != 0)
	set(FlagCorrelationID, p.CorrelationID != "")
	set(FlagReplyTo, p.ReplyTo != "")
	set(FlagExpiration, p.Expiration != "")
	set(FlagMessageID, p.MessageID != "")
	set(FlagTimestamp, !p.Timestamp.IsZero())
	set(FlagType, p.Type != "")
	set(FlagUserID, p.UserID != "")
	set(FlagAppID, p.AppID != "")
	set(FlagClusterID, p.ClusterID != "")
}

// ContentHeader is the payload of a header frame: it follows a
// content-carrying method and announces the body frames.
type ContentHeader struct {
	ClassID  uint16 // must equal the method's class (basic)
	Weight   uint16 // unused, always 0
	BodySize uint64 // total size of the body frames that follow
	Properties
}

// AppendContentHeader appends the payload of a header frame to dst. It
// supports class basic only, the only content class of 0-9-1.
func AppendContentHeader(dst []byte, h *ContentHeader) ([]byte, error) {
	if h.ClassID != ClassBasic {
		return dst, fmt.Errorf("wire: content header for class %d: only basic (%d) carries content", h.ClassID, ClassBasic)
	}
	p := &h.Properties
	if p.Flags&^allPropertyFlags != 0 {
		return dst, fmt.Errorf("wire: content header: undefined property flags %s", p.Flags&^allPropertyFlags)
	}
	e := encoder{buf: dst}
	e.short(h.ClassID)
	e.short(h.Weight)
	e.longlong(h.BodySize)
	e.short(uint16(p.Flags))
	f := p.Flags
	if f&FlagContentType != 0 {
		e.shortstr(p.ContentType)
	}
	if f&FlagContentEncoding != 0 {
		e.shortstr(p.ContentEncoding)
	}
	if f&FlagHeaders != 0 {
		e.table(p.Headers)
	}
	if f&FlagDeliveryMode != 0 {
		e.octet(p.DeliveryMode)
	}
	if f&FlagPriority != 0 {
		e.octet(p.Priority)
	}
	if f&FlagCorrelationID != 0 {
		e.shortstr(p.CorrelationID)
	}
	if f&FlagReplyTo != 0 {
		e.shortstr(p.ReplyTo)
	}
	if f&FlagExpiration != 0 {
		e.shortstr(p.Expiration)
	}
	if f&FlagMessageID != 0 {
		e.shortstr(p.MessageID)
	}
	if f&FlagTimestamp != 0 {
		e.timestamp(p.Timestamp)
	}
	if f&FlagType != 0 {
		e.shortstr(p.Type)
	}
	if f&FlagUserID != 0 {
		e.shortstr(p.UserID)
	}
	if f&FlagAppID != 0 {
		e.shortstr(p.AppID)
	}
	if f&FlagClusterID != 0 {
		e.shortstr(p.ClusterID)
	}
	if e.err != nil {
		return dst, fmt.Errorf("wire: encoding content header: %w", e.err)
	}
	return e.buf, nil
}

// DecodeContentHeader decodes the payload of a header frame. Every length is
// checked against the payload and strings are copied, so the frame buffer
// may be reused. Errors are hard *Error values with SYNTAX_ERROR (502): a
// truncated header, trailing bytes, a class other than basic, flags basic
// does not define, or a continued flag word. BodySize is reported as sent;
// checking it against a message size limit is the caller's policy.
func DecodeContentHeader(payload []byte) (ContentHeader, error) {
	var h ContentHeader
	d := decoder{buf: payload}
	h.ClassID = d.short()
	h.Weight = d.short()
	h.BodySize = d.longlong()
	flags := PropertyFlags(d.short())
	if d.err != nil {
		return ContentHeader{}, SyntaxError("cannot decode content header: %v", d.err)
	}
	if h.ClassID != ClassBasic {
		return ContentHeader{}, SyntaxError("content header for class %d, only basic (%d) carries content", h.ClassID, ClassBasic)
	}
	if flags&^allPropertyFlags != 0 {
		// Bit 0 would announce a second flag word; basic has no properties for it.
		return ContentHeader{}, SyntaxError("content header has property flags %s that basic does not define", flags&^allPropertyFlags)
	}
	p := &h.Properties
	p.Flags = flags
	if flags&FlagContentType != 0 {
		p.ContentType = d.shortstr()
	}
	if flags&FlagContentEncoding != 0 {
		p.ContentEncoding = d.shortstr()
	}
	if flags&FlagHeaders != 0 {
		p.Headers = d.table()
	}
	if flags&FlagDeliveryMode != 0 {
		p.DeliveryMode = d.octet()
	}
	if flags&FlagPriority != 0 {
		p.Priority = d.octet()
	}
	if flags&FlagCorrelationID != 0 {
		p.CorrelationID = d.shortstr()
	}
	if flags&FlagReplyTo != 0 {
		p.ReplyTo = d.shortstr()
	}
	if flags&FlagExpiration != 0 {
		p.Expiration = d.shortstr()
	}
	if flags&FlagMessageID != 0 {
		p.MessageID = d.shortstr()
	}
	if flags&FlagTimestamp != 0 {
		p.Timestamp = d.timestamp()
	}
	if flags&FlagType != 0 {
		p.Type = d.shortstr()
	}
	if flags&FlagUserID != 0 {
		p.UserID = d.shortstr()
	}
	if flags&FlagAppID != 0 {
		p.AppID = d.shortstr()
	}
	if flags&FlagClusterID != 0 {
		p.ClusterID = d.shortstr()
	}
	if d.err == nil && d.remaining() != 0 {
		d.fail("%d bytes after the last property", d.remaining())
	}
	if d.err != nil {
		return ContentHeader{}, SyntaxError("cannot decode content header: %v", d.err)
	}
	return h, nil
}

// contentHeaderPrefix is class, weight and body size: enough to read the
// body size without decoding the properties.
const contentHeaderPrefix = 12

// ContentBodySize returns the body size a header frame payload declares
// without decoding its properties, so a receiver can reject an oversized
// message before parsing anything else.
func ContentBodySize(payload []byte) (uint64, bool) {
	if len(payload) < contentHeaderPrefix {
		return 0, false
	}
	return binary.BigEndian.Uint64(payload[4:]), true
}
