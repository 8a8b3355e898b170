package kubemqclient

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"regexp"
	"slices"
	"strings"
	"testing"
)

var (
	validName   = regexp.MustCompile(`^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$`)
	hashedToken = regexp.MustCompile(`^_[HM][0-9a-f]{40}$`)
)

func TestChannelExamples(t *testing.T) {
	long := strings.Repeat("a", 300)
	longSum := sha256.Sum256([]byte(long))
	tests := []struct {
		prefix string
		parts  []string
		want   string
	}{
		{"gcp", []string{"orders"}, "gcp.orders"},
		{"amqp", []string{"default", "task_queue"}, "amqp.default.task_queue"},
		{"gcp.sub", []string{"my-topic"}, "gcp.sub.my-topic"},
		{"gcp", []string{"0day"}, "gcp.0day"},
		{"gcp", []string{"-x"}, "gcp.-x"},
		{"gcp", []string{""}, "gcp._"},
		{"gcp", []string{"_hidden"}, "gcp.__5Fhidden"},
		{"gcp", []string{"a.b"}, "gcp._a_2Eb"},
		{"gcp", []string{"a_b.c"}, "gcp._a_5Fb_2Ec"},
		{"gcp", []string{"projects/p/topics/t"}, "gcp._projects_2Fp_2Ftopics_2Ft"},
		{"amqp", []string{"/", "q"}, "amqp.__2F.q"},
		{"amqp", []string{"v", "amq.gen-X1"}, "amqp.v._amq_2Egen-X1"},
		{"gcp", []string{"a b\tc"}, "gcp._a_20b_09c"},
		{"gcp", []string{"x:y~z+%"}, "gcp._x_3Ay_7Ez_2B_25"},
		{"gcp", []string{"é"}, "gcp.__C3_A9"},
		{"gcp", []string{"*", ">"}, "gcp.__2A.__3E"},
		{"gcp", []string{long}, "gcp._H" + hex.EncodeToString(longSum[:20])},
		{"", []string{"orders"}, "orders"},
		{"gcp", nil, "gcp"},
	}
	for _, tt := range tests {
		got := Channel(tt.prefix, tt.parts...)
		if got != tt.want {
			t.Errorf("Channel(%q, %q) = %q, want %q", tt.prefix, tt.parts, got, tt.want)
		}
		if err := ValidChannel(got); err != nil {
			t.Errorf("Channel(%q, %q) = %q is not valid: %v", tt.prefix, tt.parts, got, err)
		}
	}
}

func TestChannelLengthLimit(t *testing.T) {
	// Ties: the last of the longest tokens is hashed first.
	a, b := strings.Repeat("a", 120), strings.Repeat("b", 120)
	got := Channel("gcp.sub", a, b)
	toks := strings.Split(got, ".")
	if toks[2] != a || !hashedToken.MatchString(toks[3]) {
		t.Fatalf("tie not broken towards the last part: %q", got)
	}
	// The longest is hashed, and only as many as needed.
	c := strings.Repeat("c", 200)
	got = Channel("gcp", "short", c, strings.Repeat("d", 100))
	toks = strings.Split(got, ".")
	if toks[1] != "short" || !hashedToken.MatchString(toks[2]) || toks[3] != strings.Repeat("d", 100) {
		t.Fatalf("unexpected hashing: %q", got)
	}
	// Exactly at the limit stays readable.
	exact := strings.Repeat("e", MaxChannelLen-len("gcp."))
	if got := Channel("gcp", exact); got != "gcp."+exact {
		t.Fatalf("name at the limit was changed: %q", got)
	}
	if got := Channel("gcp", exact+"e"); !hashedToken.MatchString(strings.TrimPrefix(got, "gcp.")) {
		t.Fatalf("name over the limit was not hashed: %q", got)
	}
	// Too many parts for per-part hashing: one combined token.
	many := make([]string, 10)
	for i := range many {
		many[i] = strings.Repeat(string(rune('a'+i)), 50)
	}
	got = Channel("gcp", many...)
	if !strings.HasPrefix(got, "gcp._M") || ValidChannel(got) != nil {
		t.Fatalf("many long parts: %q", got)
	}
	// Many short parts that cannot shrink: combined too.
	short := make([]string, 100)
	for i := range short {
		short[i] = "abc"
	}
	if got := Channel("gcp", short...); ValidChannel(got) != nil {
		t.Fatalf("many short parts gave invalid %q", got)
	}
}

// TestHashedTokensCannotCollide checks the argument that a hashed token can
// never equal a verbatim or encoded token: verbatim tokens never start with
// "_", and an encoded token is "_" alone or holds an "_XX" escape after its
// first byte (a part that needs no escape and is non-empty is verbatim),
// while a hashed token has no "_" after the first byte.
func TestHashedTokensCannotCollide(t *testing.T) {
	inputs := []string{"", "_", "__", "H", "_H", "Habc", "H0123456789abcdef0123456789abcdef01234567",
		"_H0123456789abcdef0123456789abcdef01234567", "a.b", "M", "é", "\x00", "-", "a-b"}
	for _, p := range inputs {
		tok := encodePart(p)
		if tok[0] != '_' {
			if !isVerbatim(p) {
				t.Errorf("part %q encoded to %q without a leading _", p, tok)
			}
			continue
		}
		if tok != "_" && !strings.Contains(tok[1:], "_") {
			t.Errorf("encoded token %q has no escape after its first byte", tok)
		}
		if hashedToken.MatchString(tok) {
			t.Errorf("encoded token %q looks like a hashed token", tok)
		}
	}
	if _, ok := DecodePart(hashPart("x")); ok {
		t.Error("hashed token decoded as a part")
	}
}

func TestDecodePart(t *testing.T) {
	for _, p := range []string{"orders", "", "_x", "a.b", "projects/p/topics/t", "é\x00\xff", "-"} {
		got, ok := DecodePart(encodePart(p))
		if !ok || got != p {
			t.Errorf("DecodePart(encodePart(%q)) = %q, %v", p, got, ok)
		}
	}
	for _, tok := range []string{"_2e", "_a_2", "_a_ZZ", "_ab", "_a_41", "a.b", "", "_a b", hashPart("a")} {
		if got, ok := DecodePart(tok); ok {
			t.Errorf("DecodePart(%q) = %q, true; want false", tok, got)
		}
	}
}

func TestValidChannel(t *testing.T) {
	good := []string{"a", "gcp.orders", "gcp.sub.s1", "A-b_c.0", strings.Repeat("x", 240), "_"}
	bad := []string{"", ".", "a.", ".a", "a..b", "a b", "a\tb", "a/b", "a:b", "a*", "a>", "é",
		strings.Repeat("x", 241), "a.\x00"}
	for _, n := range good {
		if err := ValidChannel(n); err != nil {
			t.Errorf("ValidChannel(%q) = %v", n, err)
		}
	}
	for _, n := range bad {
		err := ValidChannel(n)
		if err == nil {
			t.Errorf("ValidChannel(%q) = nil", n)
			continue
		}
		if !errors.Is(err, ErrInvalidChannel) || !errors.Is(err, ErrInvalidArgument) || IsRetryable(err) {
			t.Errorf("ValidChannel(%q) = %v: wrong kind", n, err)
		}
	}
}

func splitParts(s string, sep byte) []string {
	if sep == 0 {
		return []string{s}
	}
	return strings.Split(s, string([]byte{sep}))
}

func FuzzChannel(f *testing.F) {
	f.Add("projects/p/topics/t", "projects/p/topics/t2", byte(0), byte(0))
	f.Add("projects/my-project/subscriptions/sub.1", "sub.1", byte('/'), byte(0))
	f.Add("amq.gen-JzTY20BRgKO-HjmUJj0wLg", "amq.gen", byte(0), byte('.'))
	f.Add("/|task_queue", "_2F|task_queue", byte('|'), byte('|'))
	f.Add("", "_", byte(0), byte(0))
	f.Add("a.b", "_a_2Eb", byte(0), byte(0))
	f.Add(strings.Repeat("k", 250), strings.Repeat("k", 249), byte(0), byte(0))
	f.Add("x\ty z", "x:y", byte(' '), byte(':'))
	f.Add("é~+%", "\x00\xff", byte(0), byte(0))
	f.Fuzz(func(t *testing.T, x, y string, sepX, sepY byte) {
		px, py := splitParts(x, sepX), splitParts(y, sepY)
		cx, cy := Channel("gcp.sub", px...), Channel("gcp.sub", py...)
		for _, c := range []string{cx, cy} {
			if err := ValidChannel(c); err != nil || !validName.MatchString(c) || len(c) > MaxChannelLen {
				t.Fatalf("invalid output %q: %v", c, err)
			}
		}
		if again := Channel("gcp.sub", px...); again != cx {
			t.Fatalf("not deterministic: %q then %q", cx, again)
		}
		if cx == cy && !slices.Equal(px, py) {
			t.Fatalf("collision: %q and %q both give %q", px, py, cx)
		}
		if cx != cy && slices.Equal(px, py) {
			t.Fatalf("same parts, different names")
		}
		// Every unhashed token decodes back to its part.
		toks := strings.Split(cx, ".")[2:]
		if len(toks) == len(px) {
			for i, tok := range toks {
				if hashedToken.MatchString(tok) {
					continue
				}
				if p, ok := DecodePart(tok); !ok || p != px[i] {
					t.Fatalf("token %q decodes to %q, %v; want %q", tok, p, ok, px[i])
				}
			}
		} else if len(toks) != 1 || !strings.HasPrefix(toks[0], "_M") {
			t.Fatalf("token count %d for %d parts: %q", len(toks), len(px), cx)
		}
	})
}

func FuzzValidChannel(f *testing.F) {
	for _, s := range []string{"gcp.orders", "a..b", "a.", "a b", "projects/p/topics/t", "é", strings.Repeat("a", 241), "_H00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		err := ValidChannel(s)
		want := validName.MatchString(s) && len(s) <= MaxChannelLen
		if (err == nil) != want {
			t.Fatalf("ValidChannel(%q) = %v, want valid=%v", s, err, want)
		}
		// Any string, used as a part, becomes a valid channel.
		if c := Channel("amqp", s); ValidChannel(c) != nil {
			t.Fatalf("Channel(amqp, %q) = %q invalid", s, c)
		}
	})
}
