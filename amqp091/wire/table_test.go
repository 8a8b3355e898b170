package wire

import (
	"bytes"
	"math"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"
)

// Each field type: the Go value, and the exact bytes of its type letter and
// value (RabbitMQ's dialect, rabbit_binary_generator).
var fieldGolden = []struct {
	name string
	v    any
	wire []byte
}{
	{"t true", true, []byte{'t', 1}},
	{"t false", false, []byte{'t', 0}},
	{"b", int8(-2), []byte{'b', 0xFE}},
	{"B", uint8(200), []byte{'B', 200}},
	{"s", int16(-3), []byte{'s', 0xFF, 0xFD}},
	{"u", uint16(65535), []byte{'u', 0xFF, 0xFF}},
	{"I", int32(-1), []byte{'I', 0xFF, 0xFF, 0xFF, 0xFF}},
	{"i", uint32(1 << 31), []byte{'i', 0x80, 0, 0, 0}},
	{"l", int64(-2), []byte{'l', 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFE}},
	{"f", float32(1.5), []byte{'f', 0x3F, 0xC0, 0, 0}},
	{"d", float64(-2.25), []byte{'d', 0xC0, 0x02, 0, 0, 0, 0, 0, 0}},
	{"D", Decimal{Scale: 2, Value: -12345}, []byte{'D', 2, 0xFF, 0xFF, 0xCF, 0xC7}},
	{"S", "héllo", cat([]byte{'S'}, u32(6), []byte("héllo"))},
	{"S empty", "", []byte{'S', 0, 0, 0, 0}},
	{"x", []byte{0, 1, 0xFF}, []byte{'x', 0, 0, 0, 3, 0, 1, 0xFF}},
	{"x empty", []byte{}, []byte{'x', 0, 0, 0, 0}},
	{"A", []any{int32(1), "a", nil}, cat([]byte{'A'}, u32(12), []byte{'I', 0, 0, 0, 1, 'S', 0, 0, 0, 1, 'a', 'V'})},
	{"A empty", []any{}, []byte{'A', 0, 0, 0, 0}},
	{"T", time.Unix(1700000000, 0).UTC(), []byte{'T', 0, 0, 0, 0, 0x65, 0x53, 0xF1, 0x00}},
	{"F", Table{"k": true}, cat([]byte{'F'}, u32(4), []byte{1, 'k', 't', 1})},
	{"F empty", Table{}, []byte{'F', 0, 0, 0, 0}},
	{"V", nil, []byte{'V'}},
}

func TestTableEveryFieldType(t *testing.T) {
	for _, c := range fieldGolden {
		t.Run(c.name, func(t *testing.T) {
			in := Table{"key": c.v}
			want := cat(u32(uint32(4+len(c.wire))), []byte{3, 'k', 'e', 'y'}, c.wire)
			got, err := AppendTable(nil, in)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("encode\n got % x\nwant % x", got, want)
			}
			out, err := DecodeTable(got)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(out, in) {
				t.Fatalf("decode: got %#v, want %#v", out, in)
			}
			if reflect.TypeOf(out["key"]) != reflect.TypeOf(c.v) {
				t.Fatalf("Go type %T, want %T", out["key"], c.v)
			}
		})
	}
}

func TestTableAllTypesTogether(t *testing.T) {
	in := Table{}
	for _, c := range fieldGolden {
		in[c.name] = c.v
	}
	// An x-death-shaped value: array of tables holding arrays.
	in["x-death"] = []any{Table{
		"count": int64(3), "reason": "rejected", "queue": "q", "exchange": "",
		"routing-keys": []any{"rk1", "rk2"}, "time": time.Unix(1, 0).UTC(),
	}}
	b, err := AppendTable(nil, in)
	if err != nil {
		t.Fatal(err)
	}
	out, err := DecodeTable(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(out, in) {
		t.Fatalf("round trip differs:\n got %#v\nwant %#v", out, in)
	}
	// Deterministic: same bytes every time despite map order.
	for range 10 {
		again, _ := AppendTable(nil, in)
		if !bytes.Equal(again, b) {
			t.Fatal("encoding is not deterministic")
		}
	}
}

func TestTableSpecialValues(t *testing.T) {
	// NaN and huge timestamps keep their bits.
	in := Table{
		"nan32": float32(math.NaN()), "nan64": math.NaN(), "inf": math.Inf(-1),
		"tmax": time.Unix(math.MaxInt64, 0).UTC(), "tneg": time.Unix(-1, 0).UTC(),
	}
	b, err := AppendTable(nil, in)
	if err != nil {
		t.Fatal(err)
	}
	out, err := DecodeTable(b)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := AppendTable(nil, out)
	if !bytes.Equal(again, b) {
		t.Fatalf("re-encode differs\n% x\n% x", again, b)
	}
	if got := out["tneg"].(time.Time).Unix(); got != -1 {
		t.Errorf("timestamp 2^64-1 came back as %d", got)
	}
}

func TestTableEncodeConveniences(t *testing.T) {
	b, err := AppendTable(nil, Table{"i": 7, "m": map[string]any{"k": "v"}})
	if err != nil {
		t.Fatal(err)
	}
	out, err := DecodeTable(b)
	if err != nil {
		t.Fatal(err)
	}
	want := Table{"i": int64(7), "m": Table{"k": "v"}}
	if !reflect.DeepEqual(out, want) {
		t.Fatalf("got %#v", out)
	}
}

func TestTableEncodeErrors(t *testing.T) {
	self := Table{}
	self["me"] = self
	for name, in := range map[string]Table{
		"unsupported type":  {"k": struct{}{}},
		"unsupported in A":  {"k": []any{uint64(1)}},
		"key over 255":      {strings.Repeat("k", 256): true},
		"self reference":    self,
		"too deep":          nest(MaxTableDepth),
		"arrays too deep":   {"a": nestArrays(MaxTableDepth)},
		"shortstr-free ptr": {"k": new(int)},
	} {
		if _, err := AppendTable(nil, in); err == nil {
			t.Errorf("%s: encoded without error", name)
		}
	}
	if _, err := AppendTable(nil, nest(MaxTableDepth-1)); err != nil {
		t.Errorf("depth %d: %v", MaxTableDepth, err)
	}
	if _, err := AppendTable(nil, Table{"a": nestArrays(MaxTableDepth - 1)}); err != nil {
		t.Errorf("arrays at depth %d: %v", MaxTableDepth, err)
	}
}

// nestArrays returns n arrays nested in each other.
func nestArrays(n int) []any {
	a := []any{}
	for range n - 1 {
		a = []any{a}
	}
	return a
}

// nest returns a table with n tables nested inside it (depth n+1).
func nest(n int) Table {
	t := Table{"leaf": true}
	for range n {
		t = Table{"t": t}
	}
	return t
}

func TestTableEmptyIsNil(t *testing.T) {
	out, err := DecodeTable([]byte{0, 0, 0, 0})
	if err != nil || out != nil {
		t.Fatalf("empty table: %#v %v", out, err)
	}
	b, err := AppendTable(nil, nil)
	if err != nil || !bytes.Equal(b, []byte{0, 0, 0, 0}) {
		t.Fatalf("nil table: % x %v", b, err)
	}
}

func TestTableDecodeBounds(t *testing.T) {
	for _, c := range []struct {
		name string
		in   []byte
		text string
	}{
		{"no length", []byte{0, 0}, "long needs 4 bytes"},
		{"length beyond input", cat(u32(100), []byte{1, 'k', 'V'}), "declares 100 bytes, 3 remain"},
		{"huge length", cat(u32(0xFFFFFFFF)), "declares 4294967295 bytes"},
		{"trailing bytes", cat(u32(0), []byte{1}), "1 bytes after field table"},
		{"key beyond table", cat(u32(2), []byte{5, 'k'}), "short string needs 5 bytes"},
		{"value beyond table", cat(u32(3), []byte{1, 'k', 'I', 0, 0, 0, 1}), "long needs 4 bytes, 0 remain"},
		{"missing type", cat(u32(2), []byte{1, 'k'}), "octet needs 1 bytes"},
		{"unknown type", cat(u32(3), []byte{1, 'k', 'Q'}), "unknown field type 'Q'"},
		{"spec-only L type", cat(u32(3), []byte{1, 'k', 'L'}), "unknown field type 'L'"},
		{"string beyond table", cat(u32(7), []byte{1, 'k', 'S', 0, 0, 0, 9}, []byte("123456789")), "long string declares 9 bytes, 0 remain"},
		{"huge byte array", cat(u32(7), []byte{1, 'k', 'x', 0xFF, 0xFF, 0xFF, 0xFF}), "byte array declares 4294967295 bytes, 0 remain"},
		{"huge array count", cat(u32(7), []byte{1, 'k', 'A', 0x7F, 0xFF, 0xFF, 0xFF}), "field array declares 2147483647 bytes, 0 remain"},
		{"array element overruns", cat(u32(9), []byte{1, 'k', 'A', 0, 0, 0, 2, 'I', 0}, []byte{0, 0, 0}), "long needs 4 bytes, 1 remain"},
		{"nested table overruns outer", cat(u32(8), []byte{1, 'k', 'F', 0, 0, 0, 4, 1}, []byte{'k', 'V', 0, 0}), "declares 4 bytes, 1 remain"},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, err := DecodeTable(c.in)
			if err == nil || !strings.Contains(err.Error(), c.text) {
				t.Fatalf("got %#v, err = %v; want error containing %q", out, err, c.text)
			}
		})
	}
}

func TestTableDecodeDepth(t *testing.T) {
	// buildF returns n nested tables: {k: {k: ... {}}}.
	buildF := func(n int) []byte {
		var b []byte
		for k := n; k >= 1; k-- { // level k (outermost n) holds level k-1
			b = append(b, u32(uint32(7*(k-1)))...)
			if k > 1 {
				b = append(b, 1, 'k', 'F')
			}
		}
		return b
	}
	// buildA returns a table holding n nested arrays: {k: [[...[]]]}.
	buildA := func(n int) []byte {
		b := cat(u32(uint32(3+4+5*(n-1))), []byte{1, 'k', 'A'})
		for k := n; k >= 1; k-- {
			b = append(b, u32(uint32(5*(k-1)))...)
			if k > 1 {
				b = append(b, 'A')
			}
		}
		return b
	}
	if out, err := DecodeTable(buildF(MaxTableDepth)); err != nil || out == nil {
		t.Errorf("tables at depth %d: %v", MaxTableDepth, err)
	}
	if out, err := DecodeTable(buildA(MaxTableDepth - 1)); err != nil || out == nil {
		t.Errorf("arrays at depth %d: %v", MaxTableDepth, err)
	}
	for name, in := range map[string][]byte{
		"tables one too deep":  buildF(MaxTableDepth + 1),
		"arrays one too deep":  buildA(MaxTableDepth),
		"100000 nested tables": buildF(100000),
		"100000 nested arrays": buildA(100000),
	} {
		_, err := DecodeTable(in)
		if err == nil || !strings.Contains(err.Error(), "nested deeper than 32") {
			t.Errorf("%s: err = %v", name, err)
		}
	}
}

func TestTableDecodeCopiesBytes(t *testing.T) {
	b, _ := AppendTable(nil, Table{"x": []byte("abc"), "s": "def"})
	out, err := DecodeTable(b)
	if err != nil {
		t.Fatal(err)
	}
	for i := range b {
		b[i] = 0
	}
	if string(out["x"].([]byte)) != "abc" || out["s"] != "def" {
		t.Fatalf("decoded values alias the input: %#v", out)
	}
}

func TestDecodeTableFields(t *testing.T) {
	// AMQPLAIN's response: LOGIN and PASSWORD entries without a length prefix.
	entries := cat([]byte{5}, []byte("LOGIN"), []byte{'S'}, u32(5), []byte("guest"),
		[]byte{8}, []byte("PASSWORD"), []byte{'S'}, u32(6), []byte("secret"))
	got, err := DecodeTableFields(entries)
	if err != nil || !reflect.DeepEqual(got, Table{"LOGIN": "guest", "PASSWORD": "secret"}) {
		t.Fatalf("got %#v, %v", got, err)
	}
	if got, err := DecodeTableFields(nil); got != nil || err != nil {
		t.Fatalf("empty: %#v, %v", got, err)
	}
	for _, bad := range [][]byte{entries[:len(entries)-1], {5, 'L'}, {1, 'k', 'Z'}} {
		if _, err := DecodeTableFields(bad); err == nil {
			t.Errorf("% x decoded", bad)
		}
	}
}

// Hostile length prefixes must not turn into allocations: decoding each of
// these inputs allocates a few hundred bytes, not the gigabytes declared.
func TestHostileLengthsAllocateLittle(t *testing.T) {
	inputs := map[string]func() error{
		"table length": func() error { _, err := DecodeTable(u32(0xFFFFFFFF)); return err },
		"byte array": func() error {
			_, err := DecodeTable(cat(u32(7), []byte{1, 'k', 'x', 0xFF, 0xFF, 0xFF, 0xF0}))
			return err
		},
		"array": func() error {
			_, err := DecodeTable(cat(u32(7), []byte{1, 'k', 'A', 0xFF, 0xFF, 0xFF, 0xF0}))
			return err
		},
		"method longstr": func() error {
			_, err := DecodeMethod(cat([]byte{0, 10, 0, 11}, u32(0xFFFFFFF0)))
			return err
		},
		"header table": func() error {
			_, err := DecodeContentHeader(cat([]byte{0, 60, 0, 0}, make([]byte, 8), []byte{0x20, 0}, u32(0xFFFFFFF0)))
			return err
		},
	}
	for name, decode := range inputs {
		if err := decode(); err == nil {
			t.Fatalf("%s: decoded", name)
		}
		if bytes := allocatedBytes(100, func() { _ = decode() }); bytes > 4096 {
			t.Errorf("%s: %d bytes allocated per decode", name, bytes)
		}
	}
}

func allocatedBytes(runs int, f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for range runs {
		f()
	}
	runtime.ReadMemStats(&after)
	return (after.TotalAlloc - before.TotalAlloc) / uint64(runs)
}
