package wire

import (
	"encoding/binary"
	"fmt"
)

// Method is one AMQP method: a pointer to one of the generated structs in
// methods_gen.go (*ConnectionStart, *BasicPublish, ...). The set is closed;
// switch on the concrete type to handle a method.
type Method interface {
	// ClassID and MethodID are the method's ids on the wire.
	ClassID() uint16
	MethodID() uint16
	// Name is the spec name, e.g. "basic.publish".
	Name() string
	// String describes the method and its fields for logs, with SASL
	// responses and secrets redacted.
	String() string
	// HasContent reports whether a content header and body frames follow
	// the method frame (basic.publish, basic.deliver, basic.return, basic.get-ok).
	HasContent() bool
	// Sync reports whether the spec marks the method synchronous.
	Sync() bool

	// The codec state travels by value: through a pointer it would escape
	// to the heap on every call of these interface methods.
	encodeArgs(e encoder) encoder
	decodeArgs(d decoder) decoder
}

// MethodKey identifies a method by its class and method ids.
type MethodKey struct {
	Class, Method uint16
}

// MethodInfo is what the spec says about one method.
type MethodInfo struct {
	Key     MethodKey
	Name    string // "queue.declare"
	Sync    bool   // synchronous in the spec
	Content bool   // content frames follow
	// ToServer is set when the server implements the method, i.e. a client
	// may send it; ToClient when a server may send it. A method that arrives
	// at a server with ToServer false is a protocol error.
	ToServer, ToClient bool
	// Responses lists the methods that answer this one; nil when none is
	// expected.
	Responses []MethodKey
}

// LookupMethod returns the spec description of a method, or nil if the spec
// defines no method with these ids.
func LookupMethod(class, method uint16) *MethodInfo {
	i := methodIndex(class, method)
	if i < 0 {
		return nil
	}
	return &methodInfos[i]
}

// Methods returns the description of every method in spec order.
func Methods() []MethodInfo {
	out := make([]MethodInfo, len(methodInfos))
	copy(out, methodInfos[:])
	return out
}

// MethodName returns "class.method" for known ids and "class-id.method-id"
// in digits otherwise, for error texts about arbitrary input.
func MethodName(class, method uint16) string {
	if info := LookupMethod(class, method); info != nil {
		return info.Name
	}
	return fmt.Sprintf("%d.%d", class, method)
}

// AppendMethod appends the payload of a method frame (class id, method id,
// arguments) to dst. It fails only for values the wire cannot carry: a short
// string over 255 bytes or an unsupported Go type in a table.
func AppendMethod(dst []byte, m Method) ([]byte, error) {
	e := encoder{buf: dst}
	e.short(m.ClassID())
	e.short(m.MethodID())
	e = m.encodeArgs(e)
	if e.err != nil {
		return dst, fmt.Errorf("wire: encoding %s: %w", m.Name(), e.err)
	}
	return e.buf, nil
}

// DecodeMethod decodes the payload of a method frame. Every length is checked
// against the payload before use and strings are copied, so the payload's
// buffer may be reused once DecodeMethod returns. Errors are *Error values
// ready to send: COMMAND_INVALID (503) for ids the spec does not define,
// SYNTAX_ERROR (502) for a payload that does not decode (truncated, trailing
// bytes, bad table), both with the method ids set when known.
func DecodeMethod(payload []byte) (Method, error) {
	if len(payload) < 4 {
		return nil, SyntaxError("method frame payload of %d bytes is shorter than its class and method ids", len(payload))
	}
	class := binary.BigEndian.Uint16(payload)
	id := binary.BigEndian.Uint16(payload[2:])
	m := newMethod(class, id)
	if m == nil {
		err := CommandInvalid("unknown method %d.%d", class, id)
		err.Class, err.Method = class, id
		return nil, err
	}
	d := decoder{buf: payload[4:]}
	d = m.decodeArgs(d)
	if d.err == nil && d.remaining() != 0 {
		d.fail("%d bytes after the last field", d.remaining())
	}
	if d.err != nil {
		err := SyntaxError("cannot decode %s: %v", m.Name(), d.err)
		err.Class, err.Method = class, id
		return nil, err
	}
	return m, nil
}
