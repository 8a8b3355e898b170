package schema

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"unicode/utf8"

	"github.com/hamba/avro/v2"
)

// Bounds on one message's validation, so that a small hostile message
// cannot make the walk slow or deep: a recursive schema nests no deeper
// than maxDepth, and the binary walk visits at most a fixed allowance plus
// a few values per byte (an array block may claim billions of zero-width
// items in a few bytes).
const (
	maxDepth      = 1000
	stepAllowance = 1 << 16
	stepsPerByte  = 4
)

// avroKind is the shape of one schema node.
type avroKind uint8

const (
	avroNull avroKind = iota
	avroBoolean
	avroInt
	avroLong
	avroFloat
	avroDouble
	avroBytes
	avroString
	avroRecord
	avroEnum
	avroArray
	avroMap
	avroUnion
	avroFixed
)

// avroNode is a parsed schema compiled for walking: built once per
// revision from hamba's schema, shared read-only by every validation.
// Recursive schemas are cycles of pointers.
type avroNode struct {
	kind     avroKind
	name     string // full name of a named type, else the type name; union branches are chosen by it in JSON
	fields   []avroField
	symbols  map[string]int32 // enum
	nsymbols int32
	size     int         // fixed
	items    *avroNode   // array items, map values
	branches []*avroNode // union
}

type avroField struct {
	name string
	node *avroNode
}

type avroSchema struct {
	root *avroNode
}

func compileAvro(def string) (*avroSchema, error) {
	if def == "" {
		return nil, badDefinition("empty definition")
	}
	// A cache of its own: hamba's default cache is global, and named types
	// of one schema must not leak into (or clash with) another.
	s, err := avro.ParseWithCache(def, "", &avro.SchemaCache{})
	if err != nil {
		return nil, badDefinition("%s", trimAvroPrefix(err.Error()))
	}
	c := avroCompiler{named: map[string]*avroNode{}}
	root, err := c.node(s)
	if err != nil {
		return nil, err
	}
	return &avroSchema{root: root}, nil
}

func trimAvroPrefix(s string) string {
	if len(s) > 6 && s[:6] == "avro: " {
		return s[6:]
	}
	return s
}

type avroCompiler struct {
	named map[string]*avroNode // full name -> node, for references and cycles
}

func (c *avroCompiler) node(s avro.Schema) (*avroNode, error) {
	switch s := s.(type) {
	case *avro.RefSchema:
		return c.node(s.Schema())
	case *avro.NullSchema:
		return &avroNode{kind: avroNull, name: "null"}, nil
	case *avro.PrimitiveSchema:
		k, ok := map[avro.Type]avroKind{avro.Null: avroNull, avro.Boolean: avroBoolean, avro.Int: avroInt, avro.Long: avroLong,
			avro.Float: avroFloat, avro.Double: avroDouble, avro.Bytes: avroBytes, avro.String: avroString}[s.Type()]
		if !ok {
			return nil, badDefinition("unsupported primitive type %q", s.Type())
		}
		return &avroNode{kind: k, name: string(s.Type())}, nil
	case *avro.RecordSchema:
		if n, ok := c.named[s.FullName()]; ok {
			return n, nil
		}
		n := &avroNode{kind: avroRecord, name: s.FullName()}
		c.named[s.FullName()] = n // before the fields: they may refer to it
		for _, f := range s.Fields() {
			fn, err := c.node(f.Type())
			if err != nil {
				return nil, err
			}
			n.fields = append(n.fields, avroField{name: f.Name(), node: fn})
		}
		return n, nil
	case *avro.EnumSchema:
		if n, ok := c.named[s.FullName()]; ok {
			return n, nil
		}
		n := &avroNode{kind: avroEnum, name: s.FullName(), symbols: map[string]int32{}, nsymbols: int32(len(s.Symbols()))}
		for i, sym := range s.Symbols() {
			n.symbols[sym] = int32(i)
		}
		c.named[s.FullName()] = n
		return n, nil
	case *avro.FixedSchema:
		if n, ok := c.named[s.FullName()]; ok {
			return n, nil
		}
		n := &avroNode{kind: avroFixed, name: s.FullName(), size: s.Size()}
		c.named[s.FullName()] = n
		return n, nil
	case *avro.ArraySchema:
		items, err := c.node(s.Items())
		if err != nil {
			return nil, err
		}
		return &avroNode{kind: avroArray, name: "array", items: items}, nil
	case *avro.MapSchema:
		values, err := c.node(s.Values())
		if err != nil {
			return nil, err
		}
		return &avroNode{kind: avroMap, name: "map", items: values}, nil
	case *avro.UnionSchema:
		n := &avroNode{kind: avroUnion, name: "union"}
		for _, t := range s.Types() {
			b, err := c.node(t)
			if err != nil {
				return nil, err
			}
			n.branches = append(n.branches, b)
		}
		return n, nil
	}
	return nil, badDefinition("unsupported schema %T", s)
}

// validateJSON checks data in the Avro specification's JSON encoding: a
// record is an object with every field present (extra members are
// ignored; defaults are not applied, as Google's validator does not), a
// union value is null or an object with one member named after the branch
// type, bytes and fixed are strings (a fixed value has size characters),
// an enum is one of its symbols. It returns "" when data conforms.
func (a *avroSchema) validateJSON(data []byte) string {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return "invalid JSON: " + err.Error()
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return "invalid JSON: data after the top-level value"
	}
	if err := jsonValue(a.root, v, 0); err != nil {
		return err.Error()
	}
	return ""
}

// pathError says where in the value a mismatch is.
type pathError struct {
	path string
	msg  string
}

func (e *pathError) Error() string {
	if e.path == "" {
		return e.msg
	}
	return e.path + ": " + e.msg
}

func within(err error, step string) error {
	if pe, ok := err.(*pathError); ok {
		if pe.path == "" {
			pe.path = step
		} else if pe.path[0] == '[' {
			pe.path = step + pe.path
		} else {
			pe.path = step + "." + pe.path
		}
	}
	return err
}

func mismatch(n *avroNode, v any) error {
	return &pathError{msg: fmt.Sprintf("expected %s, got %s", n.name, jsonKind(v))}
}

func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean"
	case json.Number:
		return "number"
	case string:
		return "string"
	case []any:
		return "array"
	case map[string]any:
		return "object"
	}
	return fmt.Sprintf("%T", v)
}

func jsonValue(n *avroNode, v any, depth int) error {
	if depth > maxDepth {
		return &pathError{msg: "nesting too deep"}
	}
	switch n.kind {
	case avroNull:
		if v != nil {
			return mismatch(n, v)
		}
	case avroBoolean:
		if _, ok := v.(bool); !ok {
			return mismatch(n, v)
		}
	case avroInt, avroLong:
		num, ok := v.(json.Number)
		if !ok {
			return mismatch(n, v)
		}
		bits := 64
		if n.kind == avroInt {
			bits = 32
		}
		if !integral(string(num), bits) {
			return &pathError{msg: fmt.Sprintf("%s is not a %d-bit integer (%s)", num, bits, n.name)}
		}
	case avroFloat, avroDouble:
		num, ok := v.(json.Number)
		if !ok {
			return mismatch(n, v)
		}
		if _, err := strconv.ParseFloat(string(num), 64); err != nil {
			return &pathError{msg: fmt.Sprintf("%s is out of range for %s", num, n.name)}
		}
	case avroBytes, avroString:
		if _, ok := v.(string); !ok {
			return mismatch(n, v)
		}
	case avroFixed:
		s, ok := v.(string)
		if !ok {
			return mismatch(n, v)
		}
		if c := utf8.RuneCountInString(s); c != n.size {
			return &pathError{msg: fmt.Sprintf("fixed %s needs %d characters, got %d", n.name, n.size, c)}
		}
	case avroEnum:
		s, ok := v.(string)
		if !ok {
			return mismatch(n, v)
		}
		if _, ok := n.symbols[s]; !ok {
			return &pathError{msg: fmt.Sprintf("%q is not a symbol of enum %s", s, n.name)}
		}
	case avroRecord:
		obj, ok := v.(map[string]any)
		if !ok {
			return mismatch(n, v)
		}
		for _, f := range n.fields {
			fv, ok := obj[f.name]
			if !ok {
				return &pathError{path: f.name, msg: "missing field of record " + n.name}
			}
			if err := jsonValue(f.node, fv, depth+1); err != nil {
				return within(err, f.name)
			}
		}
	case avroArray:
		arr, ok := v.([]any)
		if !ok {
			return mismatch(n, v)
		}
		for i, item := range arr {
			if err := jsonValue(n.items, item, depth+1); err != nil {
				return within(err, "["+strconv.Itoa(i)+"]")
			}
		}
	case avroMap:
		obj, ok := v.(map[string]any)
		if !ok {
			return mismatch(n, v)
		}
		for k, item := range obj {
			if err := jsonValue(n.items, item, depth+1); err != nil {
				return within(err, "["+strconv.Quote(k)+"]")
			}
		}
	case avroUnion:
		if v == nil {
			for _, b := range n.branches {
				if b.kind == avroNull {
					return nil
				}
			}
			return &pathError{msg: "null is not a branch of the union"}
		}
		obj, ok := v.(map[string]any)
		if !ok || len(obj) != 1 {
			return &pathError{msg: fmt.Sprintf("a union value must be null or an object with one member naming its type, got %s", jsonKind(v))}
		}
		for name, bv := range obj {
			for _, b := range n.branches {
				if b.name == name && b.kind != avroNull {
					if err := jsonValue(b, bv, depth+1); err != nil {
						return within(err, "<"+name+">")
					}
					return nil
				}
			}
			return &pathError{msg: fmt.Sprintf("%q is not a branch of the union", name)}
		}
	}
	return nil
}

// integral reports whether a JSON number is an integer that fits in bits
// (1, -3, also 1.0 or 2e3, as Avro's Java decoder accepts).
func integral(s string, bits int) bool {
	if _, err := strconv.ParseInt(s, 10, bits); err == nil {
		return true
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f != math.Trunc(f) {
		return false
	}
	if bits == 32 {
		return f >= math.MinInt32 && f <= math.MaxInt32
	}
	return f >= -(1<<63) && f < 1<<63
}

// validateBinary checks data in Avro's binary encoding: exactly one value
// of the schema, no bytes left over. It returns "" when data conforms.
func (a *avroSchema) validateBinary(data []byte) string {
	w := binWalker{r: avro.NewReader(nil, 0).Reset(data), budget: stepAllowance + stepsPerByte*len(data)}
	if err := w.value(a.root, 0); err != nil {
		return err.Error()
	}
	if w.r.Error != nil {
		return "not enough data for the schema"
	}
	w.r.Peek()
	if w.r.Error == nil {
		return "too much data for the schema"
	}
	return ""
}

// binWalker reads one value with hamba's Reader primitives, checking what
// they leave to the caller (lengths, indexes, ranges).
type binWalker struct {
	r      *avro.Reader
	budget int
}

// errShort is a fresh error each time: within() adds to its path.
func errShort() error { return &pathError{msg: "not enough data for the schema"} }

func (w *binWalker) failed() error {
	if w.r.Error == nil {
		return nil
	}
	if errors.Is(w.r.Error, io.EOF) || errors.Is(w.r.Error, io.ErrUnexpectedEOF) {
		return errShort()
	}
	return &pathError{msg: trimAvroPrefix(w.r.Error.Error())}
}

// skip passes over n bytes of a string, bytes or fixed value.
func (w *binWalker) skip(n int64) error {
	if n < 0 {
		return &pathError{msg: fmt.Sprintf("negative length %d", n)}
	}
	if n > math.MaxInt32 {
		return errShort()
	}
	w.r.SkipNBytes(int(n))
	return w.failed()
}

func (w *binWalker) value(n *avroNode, depth int) error {
	if depth > maxDepth {
		return &pathError{msg: "nesting too deep"}
	}
	if w.budget--; w.budget < 0 {
		return &pathError{msg: "too many values to validate"}
	}
	switch n.kind {
	case avroNull:
	case avroBoolean:
		w.r.ReadBool()
	case avroInt:
		w.r.ReadInt()
	case avroLong:
		w.r.ReadLong()
	case avroFloat:
		w.r.SkipNBytes(4)
	case avroDouble:
		w.r.SkipNBytes(8)
	case avroBytes, avroString:
		l := w.r.ReadLong()
		if err := w.failed(); err != nil {
			return err
		}
		return w.skip(l)
	case avroFixed:
		return w.skip(int64(n.size))
	case avroEnum:
		i := w.r.ReadInt()
		if err := w.failed(); err != nil {
			return err
		}
		if i < 0 || i >= n.nsymbols {
			return &pathError{msg: fmt.Sprintf("enum %s has no symbol %d", n.name, i)}
		}
	case avroRecord:
		for _, f := range n.fields {
			if err := w.value(f.node, depth+1); err != nil {
				return within(err, f.name)
			}
		}
	case avroArray, avroMap:
		for i := 0; ; {
			count, _ := w.r.ReadBlockHeader()
			if err := w.failed(); err != nil {
				return err
			}
			if count == 0 {
				break
			}
			if count < 0 { // -(1<<63): ReadBlockHeader cannot negate it
				return &pathError{msg: "invalid block count"}
			}
			for ; count > 0; count-- {
				if n.kind == avroMap {
					l := w.r.ReadLong()
					if err := w.failed(); err != nil {
						return err
					}
					if err := w.skip(l); err != nil {
						return within(err, "[key]")
					}
				}
				if err := w.value(n.items, depth+1); err != nil {
					return within(err, "["+strconv.Itoa(i)+"]")
				}
				i++
			}
		}
	case avroUnion:
		i := w.r.ReadLong()
		if err := w.failed(); err != nil {
			return err
		}
		if i < 0 || i >= int64(len(n.branches)) {
			return &pathError{msg: fmt.Sprintf("union has no branch %d", i)}
		}
		b := n.branches[i]
		if err := w.value(b, depth+1); err != nil {
			return within(err, "<"+b.name+">")
		}
	}
	return w.failed()
}
