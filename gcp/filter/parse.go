package filter

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Grammar (whitespace may separate any two tokens):
//
//	filter     = [ expr ] EOF
//	expr       = unary { "AND" unary } | unary { "OR" unary }   ; no mixing
//	unary      = [ "NOT" | "-" ] unary | primary
//	primary    = "(" expr ")"
//	           | "attributes" ":" key
//	           | "attributes" "." key ( "=" | "!=" ) string
//	           | "hasPrefix" "(" "attributes" "." key "," string ")"
//	key        = bare | string          ; bare = [A-Za-z0-9_-]+
//	string     = '"' { char | escape } '"'
//
// Escapes are CEL's: \\ \" \' \` \? \a \b \f \n \r \t \v, \xHH, \ooo
// (octal), \uHHHH and \UHHHHHHHH; \x and octal name code points, as in CEL
// strings. Where Google's rules are not documented (whitespace around
// operators, "NOT NOT", "NOT(" without a space) the parser accepts, so that
// no filter Google takes is refused here.

// maxDepth bounds recursion. A filter within MaxLen cannot reach it; it
// guards callers of the unbounded parser.
const maxDepth = 256

// Error is a filter that does not parse. It converts to an INVALID_ARGUMENT
// gRPC status (status.FromError, status.Code), so a handler can return it.
type Error struct {
	Filter string // the filter as given
	Offset int    // byte offset of the problem in Filter
	Msg    string // what is wrong
}

func (e *Error) Error() string {
	return fmt.Sprintf("Invalid filter expression: %s at offset %d", e.Msg, e.Offset)
}

// GRPCStatus makes the error an INVALID_ARGUMENT status.
func (e *Error) GRPCStatus() *status.Status {
	return status.New(codes.InvalidArgument, e.Error())
}

// Parse compiles a subscription filter. The empty filter is valid and
// matches every message. A filter longer than MaxLen bytes, malformed, or
// using anything outside the attribute language is an *Error.
func Parse(s string) (*Filter, error) {
	if len(s) > MaxLen {
		return nil, &Error{Filter: s, Offset: MaxLen,
			Msg: fmt.Sprintf("the filter is %d bytes long, the maximum is %d bytes", len(s), MaxLen)}
	}
	return parse(s)
}

// parse is Parse without the length limit (the canonical form of a
// filter can be longer than what was sent).
func parse(s string) (*Filter, error) {
	if !utf8.ValidString(s) {
		off := 0
		for off < len(s) {
			r, n := utf8.DecodeRuneInString(s[off:])
			if r == utf8.RuneError && n <= 1 {
				break
			}
			off += n
		}
		return nil, &Error{Filter: s, Offset: off, Msg: "invalid UTF-8"}
	}
	p := &parser{src: s}
	p.skipSpace()
	if p.eof() {
		return &Filter{}, nil
	}
	root, err := p.expr(0)
	if err != nil {
		return nil, err
	}
	p.skipSpace()
	if !p.eof() {
		return nil, p.errorf("expected AND, OR or the end of the filter, found %s", p.found())
	}
	return &Filter{root: root}, nil
}

type parser struct {
	src string
	pos int
}

func (p *parser) eof() bool { return p.pos >= len(p.src) }

func (p *parser) peek() byte {
	if p.eof() {
		return 0
	}
	return p.src[p.pos]
}

func (p *parser) skipSpace() {
	for !p.eof() {
		switch p.src[p.pos] {
		case ' ', '\t', '\n', '\r', '\f', '\v':
			p.pos++
		default:
			return
		}
	}
}

func (p *parser) errorf(format string, args ...any) error {
	return p.errorAt(p.pos, format, args...)
}

func (p *parser) errorAt(off int, format string, args ...any) error {
	return &Error{Filter: p.src, Offset: off, Msg: fmt.Sprintf(format, args...)}
}

// found describes what is at the cursor, for error messages.
func (p *parser) found() string {
	if p.eof() {
		return "the end of the filter"
	}
	if w := p.word(); w != "" {
		return fmt.Sprintf("%q", w)
	}
	r, _ := utf8.DecodeRuneInString(p.src[p.pos:])
	return fmt.Sprintf("%q", r)
}

// word is the identifier-like run at the cursor (not consumed).
func (p *parser) word() string {
	end := p.pos
	for end < len(p.src) && isWordByte(p.src[end]) {
		end++
	}
	return p.src[p.pos:end]
}

func isWordByte(c byte) bool {
	return ('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z') || ('0' <= c && c <= '9') || c == '_'
}

// keyword consumes w if the cursor is at w followed by a non-word byte.
func (p *parser) keyword(w string) bool {
	if !strings.HasPrefix(p.src[p.pos:], w) {
		return false
	}
	end := p.pos + len(w)
	if end < len(p.src) && isWordByte(p.src[end]) {
		return false
	}
	p.pos = end
	return true
}

// expr parses a chain of unaries joined by one kind of operator.
func (p *parser) expr(depth int) (*node, error) {
	if depth > maxDepth {
		return nil, p.errorf("filter nested too deeply")
	}
	first, err := p.unary(depth)
	if err != nil {
		return nil, err
	}
	var group *node
	for {
		p.skipSpace()
		at := p.pos
		var op opKind
		switch {
		case p.keyword("AND"):
			op = opAnd
		case p.keyword("OR"):
			op = opOr
		default:
			if group == nil {
				return first, nil
			}
			return group, nil
		}
		if group == nil {
			group = &node{op: op}
			group.add(first)
		} else if group.op != op {
			return nil, p.errorAt(at, "AND and OR cannot be combined without parentheses")
		}
		next, err := p.unary(depth)
		if err != nil {
			return nil, err
		}
		group.add(next)
	}
}

// add appends an operand, flattening a same-kind group so that
// "a AND (b AND c)" and "a AND b AND c" compile to the same node.
func (n *node) add(k *node) {
	if k.op == n.op {
		n.kids = append(n.kids, k.kids...)
		return
	}
	n.kids = append(n.kids, k)
}

func (p *parser) unary(depth int) (*node, error) {
	if depth > maxDepth {
		return nil, p.errorf("filter nested too deeply")
	}
	p.skipSpace()
	neg := p.keyword("NOT")
	if !neg && p.peek() == '-' {
		p.pos++
		neg = true
	}
	if neg {
		k, err := p.unary(depth + 1)
		if err != nil {
			return nil, err
		}
		return &node{op: opNot, kids: []*node{k}}, nil
	}
	return p.primary(depth)
}

func (p *parser) primary(depth int) (*node, error) {
	p.skipSpace()
	start := p.pos
	switch {
	case p.peek() == '(':
		p.pos++
		n, err := p.expr(depth + 1)
		if err != nil {
			return nil, err
		}
		p.skipSpace()
		if p.peek() != ')' {
			return nil, p.errorf("expected ')' to close the '(' at offset %d, found %s", start, p.found())
		}
		p.pos++
		return n, nil
	case p.keyword("attributes"):
		return p.comparison()
	case p.keyword("hasPrefix"):
		return p.hasPrefix()
	case p.eof():
		return nil, p.errorf("expected a condition, found the end of the filter")
	}
	w := p.word()
	switch w {
	case "and", "or", "not", "And", "Or", "Not":
		return nil, p.errorf("boolean operators must be uppercase (AND, OR, NOT), found %q", w)
	case "AND", "OR":
		return nil, p.errorf("expected a condition before %s", w)
	case "":
		if p.peek() == '"' {
			return nil, p.errorf("a condition must begin with attributes, not a value")
		}
		return nil, p.errorf("expected a condition, found %s", p.found())
	}
	return nil, p.errorf("unknown identifier %q: a condition is attributes:KEY, attributes.KEY = \"v\", attributes.KEY != \"v\" or hasPrefix(attributes.KEY, \"p\")", w)
}

// comparison parses what follows "attributes".
func (p *parser) comparison() (*node, error) {
	p.skipSpace()
	switch p.peek() {
	case ':':
		p.pos++
		key, err := p.key()
		if err != nil {
			return nil, err
		}
		return &node{op: opHas, key: key}, nil
	case '.':
		p.pos++
		key, err := p.key()
		if err != nil {
			return nil, err
		}
		p.skipSpace()
		var op opKind
		switch {
		case p.peek() == '=':
			p.pos++
			op = opEq
		case strings.HasPrefix(p.src[p.pos:], "!="):
			p.pos += 2
			op = opNe
		default:
			return nil, p.errorf("expected = or != after attributes.%s, found %s", key, p.found())
		}
		val, err := p.value()
		if err != nil {
			return nil, err
		}
		return &node{op: op, key: key, val: val}, nil
	}
	return nil, p.errorf("expected ':' or '.' after attributes, found %s", p.found())
}

func (p *parser) hasPrefix() (*node, error) {
	p.skipSpace()
	if p.peek() != '(' {
		return nil, p.errorf("expected '(' after hasPrefix, found %s", p.found())
	}
	p.pos++
	p.skipSpace()
	if !p.keyword("attributes") {
		return nil, p.errorf("the first argument of hasPrefix must be attributes.KEY, found %s", p.found())
	}
	p.skipSpace()
	if p.peek() != '.' {
		return nil, p.errorf("the first argument of hasPrefix must be attributes.KEY, found %s", p.found())
	}
	p.pos++
	key, err := p.key()
	if err != nil {
		return nil, err
	}
	p.skipSpace()
	if p.peek() != ',' {
		return nil, p.errorf("expected ',' after the first argument of hasPrefix, found %s", p.found())
	}
	p.pos++
	val, err := p.value()
	if err != nil {
		return nil, err
	}
	p.skipSpace()
	if p.peek() != ')' {
		return nil, p.errorf("hasPrefix takes two arguments; expected ')', found %s", p.found())
	}
	p.pos++
	return &node{op: opPrefix, key: key, val: val}, nil
}

// key parses a bare key or a string literal key.
func (p *parser) key() (string, error) {
	p.skipSpace()
	if c := p.peek(); c == '"' || c == '\'' {
		return p.str()
	}
	start := p.pos
	for !p.eof() && isBareKeyByte(p.src[p.pos]) {
		p.pos++
	}
	// A bare key runs into something only a quoted key may hold.
	if !p.eof() {
		switch c := p.src[p.pos]; {
		case c == '.' || c == '/' || c == '~' || c == '+' || c == '%' || c == '@' || c >= utf8.RuneSelf:
			return "", p.errorAt(start, "a key with characters other than letters, digits, '-' and '_' must be a string literal, as in attributes.\"a.b\"")
		}
	}
	if p.pos == start {
		return "", p.errorf("expected an attribute key, found %s", p.found())
	}
	return p.src[start:p.pos], nil
}

// value parses the string literal on the right of an operator.
func (p *parser) value() (string, error) {
	p.skipSpace()
	if c := p.peek(); c != '"' && c != '\'' {
		return "", p.errorf("expected a string literal value, found %s", p.found())
	}
	return p.str()
}

// str parses a double-quoted string literal and decodes its escapes.
func (p *parser) str() (string, error) {
	start := p.pos
	if p.peek() == '\'' {
		return "", p.errorf("string literals are written in double quotes")
	}
	p.pos++ // opening quote
	var b strings.Builder
	for {
		if p.eof() {
			return "", p.errorAt(start, "unterminated string literal")
		}
		c := p.src[p.pos]
		switch {
		case c == '"':
			p.pos++
			return b.String(), nil
		case c == '\n' || c == '\r':
			return "", p.errorf("unterminated string literal (line break inside it)")
		case c == '\\':
			if err := p.escape(&b); err != nil {
				return "", err
			}
		default:
			b.WriteByte(c)
			p.pos++
		}
	}
}

// escape decodes one escape sequence at the cursor (a backslash).
func (p *parser) escape(b *strings.Builder) error {
	start := p.pos
	p.pos++ // backslash
	if p.eof() {
		return p.errorAt(start, "unterminated string literal")
	}
	c := p.src[p.pos]
	p.pos++
	switch c {
	case '\\', '"', '\'', '`', '?':
		b.WriteByte(c)
	case 'a':
		b.WriteByte('\a')
	case 'b':
		b.WriteByte('\b')
	case 'f':
		b.WriteByte('\f')
	case 'n':
		b.WriteByte('\n')
	case 'r':
		b.WriteByte('\r')
	case 't':
		b.WriteByte('\t')
	case 'v':
		b.WriteByte('\v')
	case 'x', 'X':
		return p.codePoint(b, start, 2, 16)
	case 'u':
		return p.codePoint(b, start, 4, 16)
	case 'U':
		return p.codePoint(b, start, 8, 16)
	case '0', '1', '2', '3':
		p.pos-- // the first digit is part of the number
		return p.codePoint(b, start, 3, 8)
	default:
		return p.errorAt(start, "invalid escape sequence \\%c", c)
	}
	return nil
}

// codePoint reads n digits in base and writes that code point as UTF-8.
func (p *parser) codePoint(b *strings.Builder, start, n int, base rune) error {
	if p.pos+n > len(p.src) {
		return p.errorAt(start, "invalid escape sequence: expected %d digits", n)
	}
	var r rune
	for _, c := range []byte(p.src[p.pos : p.pos+n]) {
		d := digitVal(c)
		if d < 0 || d >= base {
			return p.errorAt(start, "invalid escape sequence: expected %d digits", n)
		}
		r = r*base + d
	}
	p.pos += n
	if !utf8.ValidRune(r) {
		return p.errorAt(start, "invalid escape sequence: %U is not a valid code point", r)
	}
	b.WriteRune(r)
	return nil
}

func digitVal(c byte) rune {
	switch {
	case '0' <= c && c <= '9':
		return rune(c - '0')
	case 'a' <= c && c <= 'f':
		return rune(c-'a') + 10
	case 'A' <= c && c <= 'F':
		return rune(c-'A') + 10
	}
	return -1
}
