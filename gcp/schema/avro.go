package schema

import (
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/hamba/avro/v2"
	jsoniter "github.com/json-iterator/go"
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
	kind       avroKind
	name       string // full name of a named type, else the type name; union branches are chosen by it in JSON
	fields     []avroField
	symbols    map[string]int32 // enum: symbol -> index+1
	nsymbols   int32
	fieldIndex map[string]int // record: field name -> index in fields
	size       int            // fixed
	items      *avroNode      // array items, map values
	branches   []*avroNode    // union
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
		n := &avroNode{kind: avroRecord, name: s.FullName(), fieldIndex: map[string]int{}}
		c.named[s.FullName()] = n // before the fields: they may refer to it
		for i, f := range s.Fields() {
			n.fieldIndex[f.Name()] = i
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
			n.symbols[sym] = int32(i) + 1
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

// jsonAPI reads JSON for the Avro walk: json-iterator streams through the
// data once without building values (encoding/json's Unmarshal into an
// interface, or even its Valid, costs several times as much). Where
// json-iterator is lenient the walk adds the checks: string contents
// (checkJSONStrings, one pass before), number syntax (jsonNumber), data
// after the value, and members a record does not define are walked as
// strictly as the rest (skipJSON) rather than skipped. FuzzAvroJSON holds
// the walk to encoding/json's verdicts.
var jsonAPI = jsoniter.Config{}.Froze()

// validateJSON checks data in the Avro specification's JSON encoding: a
// record is an object with every field present (extra members are
// ignored; defaults are not applied, as Google's validator does not), a
// union value is null or an object with one member named after the branch
// type, bytes and fixed are strings (a fixed value has size characters),
// an enum is one of its symbols. It returns "" when data conforms.
func (a *avroSchema) validateJSON(data []byte) string {
	if msg := checkJSONStrings(data); msg != "" {
		return "invalid JSON: " + msg
	}
	it := jsonAPI.BorrowIterator(data)
	defer jsonAPI.ReturnIterator(it)
	if err := jsonValue(it, a.root, 0); err != nil {
		if it.Error != nil && !errors.Is(it.Error, io.EOF) {
			return "invalid JSON: " + trimJSONIterError(it.Error)
		}
		return err.Error()
	}
	if it.Error != nil && !errors.Is(it.Error, io.EOF) {
		return "invalid JSON: " + trimJSONIterError(it.Error)
	}
	// Only whitespace may follow the value (a number at the very end has
	// already met the end of the data).
	if it.WhatIsNext() != jsoniter.InvalidValue || !errors.Is(it.Error, io.EOF) {
		return "invalid JSON: data after the top-level value"
	}
	return ""
}

// trimJSONIterError keeps json-iterator's reason and drops its dump of the
// surrounding bytes.
func trimJSONIterError(err error) string {
	s := err.Error()
	if i := strings.Index(s, ", error found in #"); i >= 0 {
		s = s[:i]
	}
	return s
}

// checkJSONStrings checks what json-iterator does not inside strings: no
// raw control characters, only JSON's escapes. Outside strings it leaves
// everything to the walk.
func checkJSONStrings(b []byte) string {
	for i := 0; i < len(b); i++ {
		if b[i] != '"' {
			continue
		}
		for i++; ; i++ {
			if i >= len(b) {
				return "unterminated string"
			}
			c := b[i]
			if c == '"' {
				break
			}
			if c < 0x20 {
				return fmt.Sprintf("control character %#02x in a string", c)
			}
			if c != '\\' {
				continue
			}
			if i++; i >= len(b) {
				return "unterminated string"
			}
			switch b[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if i+4 >= len(b) || !isHex(b[i+1]) || !isHex(b[i+2]) || !isHex(b[i+3]) || !isHex(b[i+4]) {
					return "invalid \\u escape in a string"
				}
				i += 4
			default:
				return fmt.Sprintf("invalid escape \\%c in a string", b[i])
			}
		}
	}
	return ""
}

func isHex(c byte) bool { return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F' }

// jsonNumber reports whether s has JSON's number syntax
// (-?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?); json-iterator reads any
// run of digits, signs, dots and exponents as a number.
func jsonNumber(s string) bool {
	i := 0
	digits := func() int {
		n := 0
		for i < len(s) && '0' <= s[i] && s[i] <= '9' {
			i++
			n++
		}
		return n
	}
	if i < len(s) && s[i] == '-' {
		i++
	}
	if i < len(s) && s[i] == '0' {
		i++
	} else if digits() == 0 {
		return false
	}
	if i < len(s) && s[i] == '.' {
		i++
		if digits() == 0 {
			return false
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		if digits() == 0 {
			return false
		}
	}
	return i == len(s)
}

// readNumber reads a number with JSON's syntax.
func readNumber(it *jsoniter.Iterator) (string, error) {
	num := string(it.ReadNumber())
	if !jsonNumber(num) {
		if it.Error == nil || errors.Is(it.Error, io.EOF) {
			it.Error = fmt.Errorf("invalid number %q", num)
		}
		return num, &pathError{msg: fmt.Sprintf("invalid number %q", num)}
	}
	return num, nil
}

// skipJSON consumes a value nothing is checked against (a member a record
// does not define), with the walk's strictness.
func skipJSON(it *jsoniter.Iterator, depth int) error {
	if depth > maxDepth {
		return &pathError{msg: "nesting too deep"}
	}
	var err error
	switch it.WhatIsNext() {
	case jsoniter.NumberValue:
		_, err = readNumber(it)
	case jsoniter.ObjectValue:
		it.ReadObjectCB(func(it *jsoniter.Iterator, _ string) bool {
			err = skipJSON(it, depth+1)
			return err == nil
		})
	case jsoniter.ArrayValue:
		it.ReadArrayCB(func(it *jsoniter.Iterator) bool {
			err = skipJSON(it, depth+1)
			return err == nil
		})
	default:
		it.Skip() // strings (checked before), literals, or an error
	}
	return err
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

var jsonKinds = map[jsoniter.ValueType]string{jsoniter.NilValue: "null", jsoniter.BoolValue: "boolean",
	jsoniter.NumberValue: "number", jsoniter.StringValue: "string", jsoniter.ArrayValue: "array", jsoniter.ObjectValue: "object"}

func mismatch(n *avroNode, t jsoniter.ValueType) error {
	if t == jsoniter.InvalidValue {
		return &pathError{msg: fmt.Sprintf("invalid JSON: no value where %s was expected", n.name)}
	}
	return &pathError{msg: fmt.Sprintf("expected %s, got %s", n.name, jsonKinds[t])}
}

// jsonTypeOf is the JSON type a value of each kind (but a union) has.
var jsonTypeOf = [...]jsoniter.ValueType{avroNull: jsoniter.NilValue, avroBoolean: jsoniter.BoolValue, avroInt: jsoniter.NumberValue,
	avroLong: jsoniter.NumberValue, avroFloat: jsoniter.NumberValue, avroDouble: jsoniter.NumberValue, avroBytes: jsoniter.StringValue,
	avroString: jsoniter.StringValue, avroRecord: jsoniter.ObjectValue, avroEnum: jsoniter.StringValue, avroArray: jsoniter.ArrayValue,
	avroMap: jsoniter.ObjectValue, avroUnion: jsoniter.InvalidValue, avroFixed: jsoniter.StringValue}

// jsonValue checks the value at the iterator against n and consumes it.
func jsonValue(it *jsoniter.Iterator, n *avroNode, depth int) error {
	if depth > maxDepth {
		return &pathError{msg: "nesting too deep"}
	}
	t := it.WhatIsNext()
	if w := jsonTypeOf[n.kind]; n.kind != avroUnion && w != t {
		return mismatch(n, t)
	}
	var err error
	switch n.kind {
	case avroNull, avroBoolean, avroBytes, avroString:
		it.Skip()
	case avroInt, avroLong:
		num, err := readNumber(it)
		if err != nil {
			return err
		}
		bits := 64
		if n.kind == avroInt {
			bits = 32
		}
		if !integral(num, bits) {
			return &pathError{msg: fmt.Sprintf("%s is not a %d-bit integer (%s)", num, bits, n.name)}
		}
	case avroFloat, avroDouble:
		num, err := readNumber(it)
		if err != nil {
			return err
		}
		if !finite(num) {
			return &pathError{msg: fmt.Sprintf("%s is out of range for %s", num, n.name)}
		}
	case avroFixed:
		if c := utf8.RuneCountInString(it.ReadString()); c != n.size {
			return &pathError{msg: fmt.Sprintf("fixed %s needs %d characters, got %d", n.name, n.size, c)}
		}
	case avroEnum:
		if s := it.ReadString(); n.symbols[s] == 0 {
			return &pathError{msg: fmt.Sprintf("%q is not a symbol of enum %s", s, n.name)}
		}
	case avroRecord:
		seen := make([]bool, len(n.fields))
		it.ReadObjectCB(func(it *jsoniter.Iterator, key string) bool {
			i, ok := n.fieldIndex[key]
			if !ok {
				// Extra members are ignored, but must be JSON.
				if err = skipJSON(it, depth+1); err != nil {
					err = within(err, key)
					return false
				}
				return true
			}
			seen[i] = true
			if err = jsonValue(it, n.fields[i].node, depth+1); err != nil {
				err = within(err, key)
				return false
			}
			return true
		})
		if err != nil {
			return err
		}
		for i, f := range n.fields {
			if !seen[i] {
				return &pathError{path: f.name, msg: "missing field of record " + n.name}
			}
		}
	case avroArray:
		i := 0
		it.ReadArrayCB(func(it *jsoniter.Iterator) bool {
			if err = jsonValue(it, n.items, depth+1); err != nil {
				err = within(err, "["+strconv.Itoa(i)+"]")
				return false
			}
			i++
			return true
		})
	case avroMap:
		it.ReadObjectCB(func(it *jsoniter.Iterator, key string) bool {
			if err = jsonValue(it, n.items, depth+1); err != nil {
				err = within(err, "["+strconv.Quote(key)+"]")
				return false
			}
			return true
		})
	case avroUnion:
		switch t {
		case jsoniter.NilValue:
			it.Skip()
			for _, b := range n.branches {
				if b.kind == avroNull {
					return nil
				}
			}
			return &pathError{msg: "null is not a branch of the union"}
		case jsoniter.ObjectValue:
		case jsoniter.InvalidValue:
			return mismatch(n, t)
		default:
			return &pathError{msg: fmt.Sprintf("a union value must be null or an object with one member naming its type, got %s", jsonKinds[t])}
		}
		members := 0
		it.ReadObjectCB(func(it *jsoniter.Iterator, name string) bool {
			if members++; members > 1 {
				err = &pathError{msg: "a union value must be null or an object with one member naming its type, got more members"}
				return false
			}
			for _, b := range n.branches {
				if b.name == name && b.kind != avroNull {
					if err = jsonValue(it, b, depth+1); err != nil {
						err = within(err, "<"+name+">")
						return false
					}
					return true
				}
			}
			err = &pathError{msg: fmt.Sprintf("%q is not a branch of the union", name)}
			return false
		})
		if err == nil && members == 0 {
			err = &pathError{msg: "a union value must be null or an object with one member naming its type, got an empty object"}
		}
	}
	return err
}

// finite reports whether a JSON number fits a double.
func finite(s string) bool {
	_, err := strconv.ParseFloat(s, 64)
	return err == nil
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
