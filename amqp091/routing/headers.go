package routing

import (
	"bytes"
	"fmt"
	"math"
	"reflect"
	"sort"
	"time"

	"github.com/kubemq-io/kubemq-proxy/amqp091/wire"
)

// matchMode is a headers binding's x-match.
type matchMode uint8

const (
	matchAll matchMode = iota
	matchAny
	matchAllWithX
	matchAnyWithX
)

// headersPattern is a parsed headers binding: the (key, value) pairs the
// message headers are matched against.
type headersPattern struct {
	mode matchMode
	keys []string // sorted
	vals []any    // vals[i] belongs to keys[i]; nil means "present, any value"
}

// ValidateBinding checks binding arguments the way RabbitMQ does for the
// exchange kind. It returns the detail text of a 406 PRECONDITION_FAILED, or
// "" when the binding is acceptable. Only headers exchanges look at
// arguments: x-match must be a long string naming a known mode (or absent).
func ValidateBinding(kind Kind, args wire.Table) string {
	if kind != Headers {
		return ""
	}
	v, ok := args["x-match"]
	if !ok {
		return ""
	}
	s, ok := v.(string)
	if !ok {
		return fmt.Sprintf("Invalid x-match field type %s (value %s); expected longstr", wire.ErlangType(v), erlangTerm(v))
	}
	switch s {
	case "all", "any", "all-with-x", "any-with-x":
		return ""
	}
	return fmt.Sprintf("Invalid x-match field value %s; expected all, any, all-with-x, or any-with-x", erlangTerm(v))
}

// parseHeadersPattern compiles binding arguments. Keys beginning "x-" only
// take part in the *-with-x modes, and x-match itself never does, as in
// RabbitMQ 3.10.
func parseHeadersPattern(args wire.Table) *headersPattern {
	p := &headersPattern{}
	switch args["x-match"] {
	case "any":
		p.mode = matchAny
	case "all-with-x":
		p.mode = matchAllWithX
	case "any-with-x":
		p.mode = matchAnyWithX
	default: // "all", absent, or (legacy, unvalidated) anything else
		p.mode = matchAll
	}
	withX := p.mode == matchAllWithX || p.mode == matchAnyWithX
	for k := range args {
		if k == "x-match" || (!withX && len(k) >= 2 && k[:2] == "x-") {
			continue
		}
		p.keys = append(p.keys, k)
	}
	sort.Strings(p.keys)
	p.vals = make([]any, len(p.keys))
	for i, k := range p.keys {
		p.vals[i] = args[k]
	}
	return p
}

// match reports whether message headers h satisfy the pattern. With "all"
// every pattern key must be present with an equal value (a void pattern
// value only needs presence); with "any" one such key is enough. A pattern
// with no keys matches everything under "all" and nothing under "any".
func (p *headersPattern) match(h wire.Table) bool {
	anyMode := p.mode == matchAny || p.mode == matchAnyWithX
	for i, k := range p.keys {
		v, present := h[k]
		ok := present && (p.vals[i] == nil || valuesEqual(p.vals[i], v))
		if anyMode && ok {
			return true
		}
		if !anyMode && !ok {
			return false
		}
	}
	return !anyMode
}

// valuesEqual compares two field values the way Erlang's == compares the
// values RabbitMQ decodes: numbers by value whatever their width or
// signedness (1 == 1.0), long strings and byte arrays by their bytes, and
// tables and arrays element by element.
func valuesEqual(a, b any) bool {
	if na, ok := number(a); ok {
		nb, ok := number(b)
		return ok && na.equal(nb)
	}
	if sa, ok := bytesOf(a); ok {
		sb, ok := bytesOf(b)
		return ok && bytes.Equal(sa, sb)
	}
	switch av := a.(type) {
	case nil:
		return b == nil
	case bool:
		bv, ok := b.(bool)
		return ok && av == bv
	case wire.Decimal:
		bv, ok := b.(wire.Decimal)
		return ok && av == bv
	case []any:
		bv, ok := b.([]any)
		if !ok || len(av) != len(bv) {
			return false
		}
		for i := range av {
			if !valuesEqual(av[i], bv[i]) {
				return false
			}
		}
		return true
	}
	ta, ok1 := asTable(a)
	tb, ok2 := asTable(b)
	if ok1 && ok2 {
		if len(ta) != len(tb) {
			return false
		}
		for k, v := range ta {
			w, ok := tb[k]
			if !ok || !valuesEqual(v, w) {
				return false
			}
		}
		return true
	}
	return reflect.DeepEqual(a, b)
}

func asTable(v any) (map[string]any, bool) {
	switch t := v.(type) {
	case wire.Table:
		return t, true
	case map[string]any:
		return t, true
	}
	return nil, false
}

func bytesOf(v any) ([]byte, bool) {
	switch s := v.(type) {
	case string:
		return []byte(s), true
	case []byte:
		return s, true
	}
	return nil, false
}

// num is a field number: an integer (exact, within int64 or as a uint64) or
// a float.
type num struct {
	kind uint8 // 0 int, 1 uint (above MaxInt64), 2 float
	i    int64
	u    uint64
	f    float64
}

func number(v any) (num, bool) {
	switch n := v.(type) {
	case int8:
		return num{i: int64(n)}, true
	case uint8:
		return num{i: int64(n)}, true
	case int16:
		return num{i: int64(n)}, true
	case uint16:
		return num{i: int64(n)}, true
	case int32:
		return num{i: int64(n)}, true
	case uint32:
		return num{i: int64(n)}, true
	case int64:
		return num{i: n}, true
	case int:
		return num{i: int64(n)}, true
	case uint64:
		if n > math.MaxInt64 {
			return num{kind: 1, u: n}, true
		}
		return num{i: int64(n)}, true
	case float32:
		return num{kind: 2, f: float64(n)}, true
	case float64:
		return num{kind: 2, f: n}, true
	case time.Time:
		// RabbitMQ keeps a timestamp as its integer seconds.
		return num{i: n.Unix()}, true
	}
	return num{}, false
}

func (a num) equal(b num) bool {
	if a.kind == 2 || b.kind == 2 {
		return a.float() == b.float()
	}
	if a.kind != b.kind {
		return false
	}
	return a.i == b.i && a.u == b.u
}

func (a num) float() float64 {
	switch a.kind {
	case 1:
		return float64(a.u)
	case 2:
		return a.f
	}
	return float64(a.i)
}

// erlangTerm prints a field value the way Erlang's ~p prints it in
// RabbitMQ's error texts (binaries as <<"...">>).
func erlangTerm(v any) string {
	switch x := v.(type) {
	case string:
		return fmt.Sprintf("<<%q>>", x)
	case []byte:
		return fmt.Sprintf("<<%q>>", x)
	case bool:
		return fmt.Sprint(x)
	case nil:
		return "undefined"
	case time.Time:
		return fmt.Sprint(x.Unix())
	}
	return fmt.Sprint(v)
}
