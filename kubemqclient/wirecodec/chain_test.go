package wirecodec

import "testing"

// fastFor is a Fast that handles values of type T only: it appends tag, hints its length and
// decodes only tag.
func fastFor[T any](tag string) *Fast {
	return &Fast{
		Marshal: func(b []byte, v any) ([]byte, bool) {
			if _, ok := v.(T); ok {
				return append(b, tag...), true
			}
			return b, false
		},
		SizeHint: func(v any) int {
			if _, ok := v.(T); ok {
				return len(tag)
			}
			return 0
		},
		Unmarshal: func(b []byte, v any) bool {
			_, ok := v.(T)
			return ok && string(b) == tag
		},
	}
}

func TestChain(t *testing.T) {
	if Chain() != nil {
		t.Fatal("a chain of none is not nil")
	}
	one := fastFor[int]("int")
	if Chain(one) != one {
		t.Fatal("a chain of one is not that one")
	}
	f := Chain(one, fastFor[string]("string"))
	for _, c := range []struct {
		v    any
		want string
	}{{1, "int"}, {"s", "string"}} {
		out, ok := f.Marshal(nil, c.v)
		if !ok || string(out) != c.want || f.SizeHint(c.v) != len(c.want) || !f.Unmarshal([]byte(c.want), c.v) {
			t.Errorf("%T: marshal %q %v, hint %d", c.v, out, ok, f.SizeHint(c.v))
		}
	}
	if out, ok := f.Marshal([]byte("x"), 1.5); ok || string(out) != "x" || f.SizeHint(1.5) != 0 || f.Unmarshal([]byte("int"), 1.5) {
		t.Error("a type no Fast of the chain encodes was encoded")
	}
}
