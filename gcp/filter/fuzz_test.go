package filter

import (
	"errors"
	"math/rand/v2"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

var fuzzSeeds = []string{
	``,
	`attributes:domain`,
	`attributes:"iana.org/language_tag" AND (attributes.domain = "net" OR hasPrefix(attributes.domain, "co")) AND NOT hasPrefix(attributes.head, "foo")`,
	`attributes.domain != "com" OR attributes.language_tag = "en_US" OR (NOT hasPrefix(attributes.head, "moo") OR attributes.head = "moot" )`,
	`NOT attributes:"\u307F\u3093\u306A"`,
	`-(attributes.a = "x\"y" AND -attributes:b)`,
	`attributes.a = "\x41\101\U0001F600\t"`,
	`attributes:a AND attributes:b OR attributes:c`,
	`((((attributes:a))))`,
	`hasPrefix(attributes."a b", "")`,
	`attributes.a = 'x'`,
	`attributes.a = "\uD800"`,
	`NOT NOT -attributes:a`,
}

// FuzzParse: Parse never panics and fails only with an *Error at an offset
// inside the input; an accepted filter's canonical form parses, is stable,
// and matches exactly the same attribute maps as the original.
func FuzzParse(f *testing.F) {
	for i, s := range fuzzSeeds {
		f.Add(s, uint64(i))
	}
	f.Fuzz(func(t *testing.T, src string, seed uint64) {
		flt, err := Parse(src)
		if err != nil {
			var fe *Error
			if !errors.As(err, &fe) {
				t.Fatalf("%q: error %T %v", src, err, err)
			}
			if fe.Offset < 0 || fe.Offset > len(src) {
				t.Fatalf("%q: offset %d outside the input", src, fe.Offset)
			}
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("%q: code %v", src, status.Code(err))
			}
			return
		}
		canon := flt.String()
		again, err := parse(canon)
		if err != nil {
			t.Fatalf("%q: canonical %q does not parse: %v", src, canon, err)
		}
		if again.String() != canon {
			t.Fatalf("%q: canonical form not stable: %q then %q", src, canon, again.String())
		}
		rng := rand.New(rand.NewPCG(seed, uint64(len(src))))
		keys, vals := terms(flt.root)
		for range 64 {
			attrs := randomAttrs(rng, keys, vals)
			if flt.Match(attrs) != again.Match(attrs) {
				t.Fatalf("%q and canonical %q disagree on %q", src, canon, attrs)
			}
		}
	})
}

// terms collects the keys and values a filter mentions, so random
// attribute maps hit its conditions both ways.
func terms(n *node) (keys, vals []string) {
	var walk func(*node)
	walk = func(n *node) {
		if n == nil {
			return
		}
		switch n.op {
		case opHas:
			keys = append(keys, n.key)
		case opEq, opNe, opPrefix:
			keys = append(keys, n.key)
			vals = append(vals, n.val)
		}
		for _, k := range n.kids {
			walk(k)
		}
	}
	walk(n)
	return keys, vals
}

func randomAttrs(rng *rand.Rand, keys, vals []string) map[string]string {
	attrs := map[string]string{}
	for _, k := range keys {
		if rng.IntN(3) == 0 {
			continue
		}
		var v string
		switch {
		case len(vals) == 0 || rng.IntN(4) == 0:
			v = string(rune('a' + rng.IntN(3)))
		default:
			v = vals[rng.IntN(len(vals))]
			switch rng.IntN(3) {
			case 0: // a prefix match that is not equal
				v += "z"
			case 1: // a proper prefix
				v = v[:rng.IntN(len(v)+1)]
			}
		}
		attrs[k] = v
	}
	return attrs
}
