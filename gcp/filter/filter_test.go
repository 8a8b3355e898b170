package filter

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// messages is a fixed attribute set (the same shape as pstest's filter
// tests, plus keys that need quoting) that every match case runs against.
var messages = map[int]map[string]string{
	1:  {"lang": "en", "name": "com", "timezone": "UTC"},
	2:  {"lang": "en", "name": "net", "timezone": "UTC"},
	3:  {"lang": "en", "name": "org", "timezone": "UTC"},
	4:  {"lang": "cn", "name": "com", "timezone": "UTC"},
	5:  {"lang": "cn", "name": "net", "timezone": "UTC"},
	6:  {"lang": "cn", "name": "org", "timezone": "UTC"},
	7:  {"lang": "jp", "name": "co", "timezone": "UTC"},
	8:  {"lang": "jp", "timezone": "UTC"},
	9:  {"name": "com", "timezone": "UTC"},
	10: {"lang": "jp", "みんな": "dummy1"},
	11: {"みんな": "dummy2"},
	12: {"name": "com", "みんな": "dummy3"},
	13: {"name": "contains\"quote"},
	14: {"iana.org/language_tag": "en", "ce-type": "dev.order", "name": ""},
	15: {},
}

func matching(t *testing.T, f *Filter) []int {
	t.Helper()
	var ids []int
	for id, attrs := range messages {
		if f.Match(attrs) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

func all() []int {
	var ids []int
	for id := range messages {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

func TestMatch(t *testing.T) {
	cases := []struct {
		filter string
		want   []int
	}{
		// pstest's table: Google's semantics for each operator.
		{`attributes.name = "com"`, []int{1, 4, 9, 12}},
		{`attributes.name != "com"`, []int{2, 3, 5, 6, 7, 8, 10, 11, 13, 14, 15}}, // != matches a missing key
		{`attributes.name = "contains\"quote"`, []int{13}},
		{`hasPrefix(attributes.name, "co")`, []int{1, 4, 7, 9, 12, 13}},
		{`attributes:name`, []int{1, 2, 3, 4, 5, 6, 7, 9, 12, 13, 14}},
		{`NOT attributes:name`, []int{8, 10, 11, 15}},
		{`(NOT attributes:name) OR attributes.name = "co"`, []int{7, 8, 10, 11, 15}},
		{`NOT (attributes:name OR attributes.lang = "jp")`, []int{11, 15}},
		{`attributes.name = "com" AND -attributes:"lang"`, []int{9, 12}},
		{`attributes:"みんな"`, []int{10, 11, 12}},
		{`attributes:"\u307F\u3093\u306A"`, []int{10, 11, 12}}, // Google's doc example: escapes in a key
		{`NOT attributes:"\u307F\u3093\u306A"`, []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 14, 15}},
		// Keys that need quoting, and bare keys with '-' and '_'.
		{`attributes."iana.org/language_tag" = "en"`, []int{14}},
		{`attributes:"iana.org/language_tag" AND attributes.ce-type = "dev.order"`, []int{14}},
		{`attributes.ce-type="dev.order"`, []int{14}},
		{`hasPrefix(attributes.ce-type, "dev.")`, []int{14}},
		{`attributes.name = ""`, []int{14}},
		{`hasPrefix(attributes.name, "")`, []int{1, 2, 3, 4, 5, 6, 7, 9, 12, 13, 14}}, // key must exist
		{`attributes:timezone`, []int{1, 2, 3, 4, 5, 6, 7, 8, 9}},
		// Boolean structure.
		{`attributes.lang = "en" OR attributes.lang = "jp" OR attributes.lang = "cn"`, []int{1, 2, 3, 4, 5, 6, 7, 8, 10}},
		{`attributes.lang = "en" AND attributes.name != "com" AND attributes:timezone`, []int{2, 3}},
		{`attributes:lang AND (attributes.name = "net" OR attributes.name = "org")`, []int{2, 3, 5, 6}},
		{`(attributes.lang = "en" AND attributes.name = "com") OR (attributes.lang = "cn" AND attributes.name = "org")`, []int{1, 6}},
		{`((attributes:lang))`, []int{1, 2, 3, 4, 5, 6, 7, 8, 10}},
		{`NOT NOT attributes:lang`, []int{1, 2, 3, 4, 5, 6, 7, 8, 10}},
		{`--attributes:lang`, []int{1, 2, 3, 4, 5, 6, 7, 8, 10}},
		{`-(attributes:lang OR attributes:name)`, []int{11, 15}},
		{`NOT(attributes:lang)`, []int{9, 11, 12, 13, 14, 15}},
		{`NOT -attributes:lang`, []int{1, 2, 3, 4, 5, 6, 7, 8, 10}},
		{"attributes:lang\tAND\nattributes:name", []int{1, 2, 3, 4, 5, 6, 7}},
		{` attributes : lang AND attributes . name = "co" `, []int{7}},
		{`attributes:lang AND NOT hasPrefix(attributes.name, "c")`, []int{2, 3, 5, 6, 8, 10}},
		// Google's documented compound example.
		{`attributes:"iana.org/language_tag" AND (attributes.ce-type = "net" OR hasPrefix(attributes.ce-type, "dev")) AND NOT hasPrefix(attributes.name, "foo")`, []int{14}},
		// Empty filter: no filtering.
		{``, all()},
		{`   `, all()},
	}
	for _, tc := range cases {
		t.Run(tc.filter, func(t *testing.T) {
			f, err := Parse(tc.filter)
			if err != nil {
				t.Fatal(err)
			}
			if got := matching(t, f); !slices.Equal(got, tc.want) {
				t.Fatalf("matched %v, want %v", got, tc.want)
			}
			// The canonical form matches the same messages.
			g, err := parse(f.String())
			if err != nil {
				t.Fatalf("canonical %q does not parse: %v", f.String(), err)
			}
			if got := matching(t, g); !slices.Equal(got, tc.want) {
				t.Fatalf("canonical %q matched %v, want %v", f.String(), got, tc.want)
			}
		})
	}
}

func TestEscapes(t *testing.T) {
	cases := map[string]string{
		`"a\\b"`:           `a\b`,
		`"q\"q"`:           `q"q`,
		`"\'\` + "`" + `"`: "'`",
		`"\?"`:             "?",
		`"\a\b\f\n\r\t\v"`: "\a\b\f\n\r\t\v",
		`"\x41\X42"`:       "AB",
		`"\xe9"`:           "é", // \x names a code point, as in CEL strings
		`"\101\000"`:       "A\x00",
		`"\u00e9\u307F"`:   "éみ",
		`"\U0001F600"`:     "😀",
		`"tab	raw"`:        "tab\traw",
		`"ü"`:              "ü",
	}
	for lit, want := range cases {
		f, err := Parse(`attributes.k = ` + lit)
		if err != nil {
			t.Fatalf("%s: %v", lit, err)
		}
		if !f.Match(map[string]string{"k": want}) {
			t.Fatalf("%s does not decode to %q (canonical %s)", lit, want, f)
		}
	}
}

func TestParseErrors(t *testing.T) {
	cases := []struct {
		filter string
		offset int
		has    string
	}{
		// What Google documents as invalid.
		{`attributes:a AND attributes:b OR attributes:c`, 30, "AND and OR cannot be combined"},
		{`attributes:a OR attributes:b AND attributes:c`, 29, "AND and OR cannot be combined"},
		{`(attributes:a OR attributes:b) AND attributes:c OR attributes:d`, 48, "AND and OR cannot be combined"},
		{`attributes.name = com`, 18, "expected a string literal value"},
		{`"com" = attributes.name`, 0, "must begin with attributes"},
		{`attributes.name = 'com'`, 18, "double quotes"},
		{`attributes:'name'`, 11, "double quotes"},
		{`attributes:a and attributes:b`, 13, "expected AND, OR"},
		{`not attributes:a`, 0, "must be uppercase"},
		{`attributes:iana.org/language_tag`, 11, "must be a string literal"},
		{`attributes.a.b = "x"`, 11, "must be a string literal"},
		{`attributes:みんな`, 11, "must be a string literal"},
		{`attributes./x = "y"`, 11, "must be a string literal"},
		{`attributes.domain > "x"`, 18, "expected = or !="},
		{`attributes.domain == "x"`, 19, "expected a string literal value"},
		{`data = "x"`, 0, `unknown identifier "data"`},
		{`message.attributes:x`, 0, `unknown identifier "message"`},
		{`hasprefix(attributes.a, "x")`, 0, `unknown identifier "hasprefix"`},
		{`hasSuffix(attributes.a, "x")`, 0, `unknown identifier "hasSuffix"`},
		{`hasPrefix(attributes.a)`, 22, "expected ','"},
		{`hasPrefix(attributes.a, "x", "y")`, 27, "two arguments"},
		{`hasPrefix(attributes:a, "x")`, 20, "attributes.KEY"},
		{`hasPrefix("x", attributes.a)`, 10, "attributes.KEY"},
		{`hasPrefix(attributes.a, attributes.b)`, 24, "expected a string literal"},
		{`hasPrefix attributes.a`, 10, "expected '('"},
		{`attributes:a = "x"`, 13, "expected AND, OR"},
		{`attributes.a`, 12, "expected = or !="},
		{`attributes`, 10, "expected ':' or '.'"},
		{`attributes:`, 11, "expected an attribute key"},
		{`attributes.`, 11, "expected an attribute key"},
		{`attributes.a = `, 15, "expected a string literal"},
		{`attributes.a = $`, 15, "expected a string literal"},
		{`(attributes:a`, 13, "expected ')' to close the '(' at offset 0"},
		{`attributes:a)`, 12, "expected AND, OR"},
		{`()`, 1, "expected a condition"},
		{`attributes:a AND`, 16, "the end of the filter"},
		{`AND attributes:a`, 0, "before AND"},
		{`NOT`, 3, "the end of the filter"},
		{`-`, 1, "the end of the filter"},
		{`attributes:a attributes:b`, 13, "expected AND, OR"},
		{`attributes:a && attributes:b`, 13, "expected AND, OR"},
		{`attributes.a = "unterminated`, 15, "unterminated string"},
		{"attributes.a = \"line\nbreak\"", 20, "line break"},
		{`attributes.a = "bad\q"`, 19, `invalid escape sequence \q`},
		{`attributes.a = "\x4"`, 16, "expected 2 digits"},
		{`attributes.a = "\uD800"`, 16, "not a valid code point"},
		{`attributes.a = "\U00110000"`, 16, "not a valid code point"},
		{`attributes.a = "\8"`, 16, `invalid escape sequence \8`},
		{`attributes.a = "\0"`, 16, "expected 3 digits"},
		{`attributes.a = "x\`, 17, "unterminated string"},
		{"attributes.a = \"\xff\"", 16, "invalid UTF-8"},
		{`attributes:a OR`, 15, "the end of the filter"},
		{`attributes:"a" = "b"`, 15, "expected AND, OR"},
		{`attributes.a != `, 16, "expected a string literal"},
		{`attributes.a ! = "x"`, 13, "expected = or !="},
		{`attributes.a = "x" "y"`, 19, "expected AND, OR"},
		{`attributes:a AND OR attributes:b`, 17, "before OR"},
		{`attributes:a, attributes:b`, 12, "expected AND, OR"},
	}
	for _, tc := range cases {
		t.Run(tc.filter, func(t *testing.T) {
			f, err := Parse(tc.filter)
			if err == nil {
				t.Fatalf("accepted, canonical %q", f)
			}
			var fe *Error
			if !errors.As(err, &fe) {
				t.Fatalf("error %T is not *Error", err)
			}
			if fe.Offset != tc.offset {
				t.Errorf("offset %d, want %d (%v)", fe.Offset, tc.offset, err)
			}
			if !strings.Contains(fe.Msg, tc.has) {
				t.Errorf("message %q lacks %q", fe.Msg, tc.has)
			}
			if fe.Filter != tc.filter {
				t.Errorf("Filter = %q", fe.Filter)
			}
			st, ok := status.FromError(err)
			if !ok || st.Code() != codes.InvalidArgument || !strings.HasPrefix(st.Message(), "Invalid filter expression: ") {
				t.Errorf("status %v", st)
			}
		})
	}
}

func TestMaxLen(t *testing.T) {
	// 256 bytes exactly is allowed; the limit counts bytes, not characters.
	key := strings.Repeat("k", MaxLen-len(`attributes:`))
	if _, err := Parse(`attributes:` + key); err != nil {
		t.Fatalf("256 bytes: %v", err)
	}
	_, err := Parse(`attributes:` + key + "k")
	var fe *Error
	if !errors.As(err, &fe) || !strings.Contains(fe.Msg, "257 bytes long, the maximum is 256 bytes") {
		t.Fatalf("257 bytes: %v", err)
	}
	multi := `attributes:"` + strings.Repeat("é", 122) + `"` // 12 + 244 + 1 = 257 bytes, 135 characters
	if _, err := Parse(multi); err == nil {
		t.Fatalf("multi-byte filter of %d bytes accepted", len(multi))
	}
}

// Deep nesting within the limit parses; the depth guard only matters to
// the unbounded parser.
func TestNesting(t *testing.T) {
	depth := (MaxLen - len(`attributes:a`)) / 2
	s := strings.Repeat("(", depth) + "attributes:a" + strings.Repeat(")", depth)
	f, err := Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	if f.String() != "attributes:a" {
		t.Fatalf("canonical %q", f)
	}
	deep := strings.Repeat("(", 10000) + "attributes:a" + strings.Repeat(")", 10000)
	if _, err := parse(deep); err == nil || !strings.Contains(err.Error(), "nested too deeply") {
		t.Fatalf("got %v", err)
	}
	notDeep := strings.Repeat("NOT ", 10000) + "attributes:a"
	if _, err := parse(notDeep); err == nil || !strings.Contains(err.Error(), "nested too deeply") {
		t.Fatalf("got %v", err)
	}
}

func TestString(t *testing.T) {
	cases := map[string]string{
		``:                                   ``,
		`attributes:domain`:                  `attributes:domain`,
		`attributes:"domain"`:                `attributes:domain`,
		`attributes:"iana.org/language_tag"`: `attributes:"iana.org/language_tag"`,
		`attributes:""`:                      `attributes:""`,
		`attributes.ce-type="x"`:             `attributes.ce-type = "x"`,
		`attributes . a  !=  "x"`:            `attributes.a != "x"`,
		`hasPrefix( attributes.a ,"p" )`:     `hasPrefix(attributes.a, "p")`,
		`-attributes:a`:                      `NOT attributes:a`,
		`NOT(attributes:a)`:                  `NOT attributes:a`,
		`--attributes:a`:                     `NOT NOT attributes:a`,
		`-(attributes:a OR attributes:b)`:    `NOT (attributes:a OR attributes:b)`,
		`attributes:a AND (attributes:b AND attributes:c)`:            `attributes:a AND attributes:b AND attributes:c`,
		`(attributes:a OR attributes:b) OR attributes:c`:              `attributes:a OR attributes:b OR attributes:c`,
		`attributes:a AND (attributes:b OR attributes:c)`:             `attributes:a AND (attributes:b OR attributes:c)`,
		`(attributes:a AND attributes:b) OR NOT (attributes:c)`:       `(attributes:a AND attributes:b) OR NOT attributes:c`,
		`attributes.a = "q\"\\\n\x01\u00e9\U0001F600"`:                `attributes.a = "q\"\\\n\x01é😀"`,
		`attributes.a = "\u200b"`:                                     `attributes.a = "\u200b"`,
		`attributes."a b" = "x" OR hasPrefix(attributes."c\td", "y")`: `attributes."a b" = "x" OR hasPrefix(attributes."c\td", "y")`,
	}
	for in, want := range cases {
		f, err := Parse(in)
		if err != nil {
			t.Fatalf("%q: %v", in, err)
		}
		if got := f.String(); got != want {
			t.Errorf("String(%q) = %q, want %q", in, got, want)
		}
		again, err := Parse(want)
		if err != nil || again.String() != want {
			t.Errorf("canonical form %q is not stable: %q, %v", want, again, err)
		}
	}
}

func TestNilAndEmpty(t *testing.T) {
	var f *Filter
	if !f.Match(map[string]string{"a": "b"}) || !f.Match(nil) || !f.IsEmpty() || f.String() != "" {
		t.Fatal("nil filter must match everything")
	}
	e, err := Parse("")
	if err != nil || !e.IsEmpty() || !e.Match(nil) {
		t.Fatal(err)
	}
	g, _ := Parse("attributes:a")
	if g.IsEmpty() || g.Match(nil) {
		t.Fatal("non-empty filter matched a message without attributes")
	}
}

func BenchmarkMatch(b *testing.B) {
	filters := map[string]string{
		"eq":       `attributes.type = "order.paid"`,
		"compound": `attributes:"iana.org/language_tag" AND (attributes.domain = "net" OR hasPrefix(attributes.domain, "co")) AND NOT hasPrefix(attributes.head, "foo")`,
		"or10":     `attributes.r = "a" OR attributes.r = "b" OR attributes.r = "c" OR attributes.r = "d" OR attributes.r = "e" OR attributes.r = "f" OR attributes.r = "g" OR attributes.r = "h" OR attributes.r = "i" OR attributes.r = "j"`,
	}
	attrs := map[string]string{
		"type": "order.paid", "iana.org/language_tag": "en", "domain": "com", "head": "bar", "r": "j",
		"a1": "x", "a2": "x", "a3": "x", "a4": "x", "a5": "x",
	}
	for name, src := range filters {
		f, err := Parse(src)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if !f.Match(attrs) {
					b.Fatal("no match")
				}
			}
		})
	}
}

func BenchmarkParse(b *testing.B) {
	src := `attributes:"iana.org/language_tag" AND (attributes.domain = "net" OR hasPrefix(attributes.domain, "co")) AND NOT hasPrefix(attributes.head, "foo")`
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse(src); err != nil {
			b.Fatal(err)
		}
	}
}
