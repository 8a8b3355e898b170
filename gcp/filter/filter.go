// Package filter owns Pub/Sub subscription filters: the attribute filter
// language Google documents (attributes:KEY, attributes.KEY = "v",
// attributes.KEY != "v", hasPrefix(attributes.KEY, "p"), NOT / -, AND, OR,
// parentheses, string literals with escapes), its 256-byte limit and its
// restrictions (AND and OR never mix without parentheses, values are string
// literals, operators are uppercase). Parse compiles a filter once, at
// CreateSubscription; Match evaluates it against a message's attributes at
// fan-out and is safe for concurrent use.
//
// Semantics follow Google's documentation and pstest: "=" and hasPrefix
// need the key to be present; "!=" is the negation of "=", so it matches a
// message that lacks the key.
package filter

import (
	"strconv"
	"strings"
)

// MaxLen is Google's limit on a filter's length, in bytes.
const MaxLen = 256

// Filter is a compiled subscription filter. The zero value and a nil
// *Filter match every message (no filter). A Filter is immutable.
type Filter struct {
	root *node
}

type opKind uint8

const (
	opHas    opKind = iota // attributes:key
	opEq                   // attributes.key = "val"
	opNe                   // attributes.key != "val"
	opPrefix               // hasPrefix(attributes.key, "val")
	opNot                  // NOT kids[0]
	opAnd                  // kids[0] AND kids[1] AND ...
	opOr                   // kids[0] OR kids[1] OR ...
)

type node struct {
	op   opKind
	key  string
	val  string
	kids []*node
}

// Match reports whether a message with these attributes passes the filter.
func (f *Filter) Match(attrs map[string]string) bool {
	if f == nil || f.root == nil {
		return true
	}
	return f.root.match(attrs)
}

func (n *node) match(attrs map[string]string) bool {
	switch n.op {
	case opHas:
		_, ok := attrs[n.key]
		return ok
	case opEq:
		v, ok := attrs[n.key]
		return ok && v == n.val
	case opNe:
		v, ok := attrs[n.key]
		return !ok || v != n.val
	case opPrefix:
		v, ok := attrs[n.key]
		return ok && strings.HasPrefix(v, n.val)
	case opNot:
		return !n.kids[0].match(attrs)
	case opAnd:
		for _, k := range n.kids {
			if !k.match(attrs) {
				return false
			}
		}
		return true
	case opOr:
		for _, k := range n.kids {
			if k.match(attrs) {
				return true
			}
		}
		return false
	}
	return false
}

// IsEmpty reports whether the filter lets every message through.
func (f *Filter) IsEmpty() bool { return f == nil || f.root == nil }

// String is the canonical form: NOT for "-", single spaces, keys bare when
// the bare form is legal, values double-quoted with escapes, parentheses
// only where AND meets OR or NOT meets a group. Parse(f.String()) matches
// exactly what f matches. The canonical form of a filter near the limit can
// be longer than MaxLen; store the filter the client sent, not this.
func (f *Filter) String() string {
	if f.IsEmpty() {
		return ""
	}
	var b strings.Builder
	f.root.write(&b)
	return b.String()
}

func (n *node) write(b *strings.Builder) {
	switch n.op {
	case opHas:
		b.WriteString("attributes:")
		writeKey(b, n.key)
	case opEq, opNe:
		b.WriteString("attributes.")
		writeKey(b, n.key)
		if n.op == opEq {
			b.WriteString(" = ")
		} else {
			b.WriteString(" != ")
		}
		b.WriteString(strconv.Quote(n.val))
	case opPrefix:
		b.WriteString("hasPrefix(attributes.")
		writeKey(b, n.key)
		b.WriteString(", ")
		b.WriteString(strconv.Quote(n.val))
		b.WriteString(")")
	case opNot:
		b.WriteString("NOT ")
		n.kids[0].writeOperand(b)
	case opAnd, opOr:
		sep := " AND "
		if n.op == opOr {
			sep = " OR "
		}
		for i, k := range n.kids {
			if i > 0 {
				b.WriteString(sep)
			}
			k.writeOperand(b)
		}
	}
}

// writeOperand parenthesises groups: an operand of NOT, AND or OR that is
// itself an AND or OR (same-kind groups were flattened by the parser).
func (n *node) writeOperand(b *strings.Builder) {
	if n.op == opAnd || n.op == opOr {
		b.WriteByte('(')
		n.write(b)
		b.WriteByte(')')
		return
	}
	n.write(b)
}

// writeKey writes a key bare when Google allows it bare, else as a string.
// strconv.Quote's escapes are a subset of the filter language's for valid
// UTF-8, which every parsed key is.
func writeKey(b *strings.Builder, key string) {
	if isBareKey(key) {
		b.WriteString(key)
		return
	}
	b.WriteString(strconv.Quote(key))
}

func isBareKey(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !isBareKeyByte(s[i]) {
			return false
		}
	}
	return true
}

// isBareKeyByte: "If a key contains characters other than hyphens,
// underscores, or alphanumeric characters, use a string literal."
func isBareKeyByte(c byte) bool {
	return ('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z') || ('0' <= c && c <= '9') || c == '_' || c == '-'
}
