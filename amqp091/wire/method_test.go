package wire

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
)

// fillMethod sets every exported field of m to a pseudo-random non-zero value
// (strings short enough for shortstr), so a round trip exercises all fields.
func fillMethod(t *testing.T, m Method, rng *rand.Rand) {
	t.Helper()
	v := reflect.ValueOf(m).Elem()
	for i := 0; i < v.NumField(); i++ {
		f := v.Field(i)
		switch f.Kind() {
		case reflect.Bool:
			f.SetBool(rng.IntN(2) == 1)
		case reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
			f.SetUint(rng.Uint64() | 1) // non-zero; SetUint truncates to the field size
		case reflect.String:
			f.SetString(randString(rng, 1+rng.IntN(40)))
		case reflect.Map: // Table
			f.Set(reflect.ValueOf(Table{
				"x-" + randString(rng, 5): int32(rng.Int32()),
				"s":                       randString(rng, 10),
				"nested":                  Table{"b": true},
			}))
		default:
			t.Fatalf("%s: field %s has unhandled kind %s", m.Name(), v.Type().Field(i).Name, f.Kind())
		}
	}
}

func randString(rng *rand.Rand, n int) string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz.-_:ABCDEF0123456789 \x00\xff"
	b := make([]byte, n)
	for i := range b {
		b[i] = alphabet[rng.IntN(len(alphabet))]
	}
	return string(b)
}

func boolFields(m Method) []int {
	v := reflect.ValueOf(m).Elem()
	var out []int
	for i := 0; i < v.NumField(); i++ {
		if v.Field(i).Kind() == reflect.Bool {
			out = append(out, i)
		}
	}
	return out
}

func roundTrip(t *testing.T, m Method) {
	t.Helper()
	payload, err := AppendMethod(nil, m)
	if err != nil {
		t.Fatalf("%s: encode: %v", m.Name(), err)
	}
	got, err := DecodeMethod(payload)
	if err != nil {
		t.Fatalf("%s: decode: %v", m.Name(), err)
	}
	if !reflect.DeepEqual(got, m) {
		t.Fatalf("%s: round trip mismatch\n got %s\nwant %s", m.Name(), got, m)
	}
	// Re-encoding gives the same bytes: the codec is deterministic.
	again, err := AppendMethod(nil, got)
	if err != nil || !bytes.Equal(again, payload) {
		t.Fatalf("%s: re-encode differs (err %v)\n% x\n% x", m.Name(), err, again, payload)
	}
}

func TestMethodRoundTripEveryMethod(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	ms := zeroMethods()
	if len(ms) != len(methodInfos) {
		t.Fatalf("zeroMethods has %d methods, methodInfos %d", len(ms), len(methodInfos))
	}
	for _, zero := range ms {
		t.Run(zero.Name(), func(t *testing.T) {
			// The zero value (nil table, empty strings, false bits).
			roundTrip(t, newMethod(zero.ClassID(), zero.MethodID()))
			// Random values, several times.
			for range 20 {
				m := newMethod(zero.ClassID(), zero.MethodID())
				fillMethod(t, m, rng)
				roundTrip(t, m)
			}
			// Each bit alone, then all bits: catches packing mistakes that
			// random values can hide.
			bits := boolFields(zero)
			for _, bi := range bits {
				m := newMethod(zero.ClassID(), zero.MethodID())
				reflect.ValueOf(m).Elem().Field(bi).SetBool(true)
				roundTrip(t, m)
			}
			if len(bits) > 0 {
				m := newMethod(zero.ClassID(), zero.MethodID())
				for _, bi := range bits {
					reflect.ValueOf(m).Elem().Field(bi).SetBool(true)
				}
				roundTrip(t, m)
			}
		})
	}
}

func TestMethodInfoMatchesTypes(t *testing.T) {
	seen := map[MethodKey]bool{}
	for _, m := range zeroMethods() {
		key := MethodKey{m.ClassID(), m.MethodID()}
		if seen[key] {
			t.Errorf("duplicate method key %v", key)
		}
		seen[key] = true
		info := LookupMethod(m.ClassID(), m.MethodID())
		if info == nil {
			t.Fatalf("%s: no info", m.Name())
		}
		if info.Key != key || info.Name != m.Name() || info.Content != m.HasContent() || info.Sync != m.Sync() {
			t.Errorf("%s: info %+v disagrees with the type", m.Name(), info)
		}
		if !info.ToServer && !info.ToClient {
			t.Errorf("%s: sent by nobody", m.Name())
		}
		for _, r := range info.Responses {
			if LookupMethod(r.Class, r.Method) == nil {
				t.Errorf("%s: response %v unknown", m.Name(), r)
			}
		}
		if MethodName(m.ClassID(), m.MethodID()) != m.Name() {
			t.Errorf("MethodName(%v) = %q", key, MethodName(m.ClassID(), m.MethodID()))
		}
		if got := reflect.TypeOf(newMethod(key.Class, key.Method)); got != reflect.TypeOf(m) {
			t.Errorf("dispatch for %v gives %v, want %T", key, got, m)
		}
	}
	if len(Methods()) != len(seen) {
		t.Errorf("Methods() has %d entries, want %d", len(Methods()), len(seen))
	}
	if LookupMethod(60, 999) != nil || MethodName(60, 999) != "60.999" {
		t.Error("unknown ids should not resolve")
	}
	// Spot checks against the spec and RabbitMQ.
	for _, c := range []struct {
		name               string
		key                MethodKey
		toServer, toClient bool
		content            bool
		responses          []MethodKey
	}{
		{"basic.publish", MethodKey{ClassBasic, MethodBasicPublish}, true, false, true, nil},
		{"basic.get", MethodKey{ClassBasic, MethodBasicGet}, true, false, false,
			[]MethodKey{{ClassBasic, MethodBasicGetOk}, {ClassBasic, MethodBasicGetEmpty}}},
		{"basic.recover", MethodKey{ClassBasic, MethodBasicRecover}, true, false, false,
			[]MethodKey{{ClassBasic, MethodBasicRecoverOk}}},
		{"connection.update-secret", MethodKey{ClassConnection, MethodConnectionUpdateSecret}, true, false, false,
			[]MethodKey{{ClassConnection, MethodConnectionUpdateSecretOk}}},
		{"connection.start", MethodKey{ClassConnection, MethodConnectionStart}, false, true, false,
			[]MethodKey{{ClassConnection, MethodConnectionStartOk}}},
		{"exchange.unbind-ok", MethodKey{ClassExchange, MethodExchangeUnbindOk}, false, true, false, nil},
	} {
		info := LookupMethod(c.key.Class, c.key.Method)
		if info == nil || info.Name != c.name || info.ToServer != c.toServer || info.ToClient != c.toClient ||
			info.Content != c.content || !reflect.DeepEqual(info.Responses, c.responses) {
			t.Errorf("%s: info %+v", c.name, info)
		}
	}
}

func TestDecodeMethodTruncatedAndTrailing(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, zero := range zeroMethods() {
		m := newMethod(zero.ClassID(), zero.MethodID())
		fillMethod(t, m, rng)
		payload, err := AppendMethod(nil, m)
		if err != nil {
			t.Fatal(err)
		}
		// Every proper prefix is an error, never a panic.
		for n := 0; n < len(payload); n++ {
			_, err := DecodeMethod(payload[:n])
			var ae *Error
			if !errors.As(err, &ae) || ae.Code != ReplySyntaxError || !ae.Hard {
				t.Fatalf("%s truncated to %d bytes: err = %v, want hard SYNTAX_ERROR", m.Name(), n, err)
			}
			if n >= 4 && (ae.Class != m.ClassID() || ae.Method != m.MethodID()) {
				t.Fatalf("%s truncated: error names %d.%d", m.Name(), ae.Class, ae.Method)
			}
		}
		// A trailing byte is an error too (RabbitMQ's decoder is exact).
		_, err = DecodeMethod(append(payload, 0))
		var ae *Error
		if !errors.As(err, &ae) || ae.Code != ReplySyntaxError || !strings.Contains(ae.Text, "after the last field") {
			t.Fatalf("%s + trailing byte: err = %v", m.Name(), err)
		}
	}
}

func TestDecodeMethodUnknown(t *testing.T) {
	_, err := DecodeMethod([]byte{0, 60, 0, 99})
	var ae *Error
	if !errors.As(err, &ae) || ae.Code != ReplyCommandInvalid || !ae.Hard || ae.Class != 60 || ae.Method != 99 {
		t.Fatalf("err = %#v", err)
	}
	if ae.Text != "COMMAND_INVALID - unknown method 60.99" {
		t.Errorf("text = %q", ae.Text)
	}
}

func TestEncodeMethodLimits(t *testing.T) {
	long := strings.Repeat("q", 256)
	if _, err := AppendMethod(nil, &BasicPublish{Exchange: long}); err == nil || !strings.Contains(err.Error(), "basic.publish") {
		t.Errorf("256-byte shortstr: err = %v", err)
	}
	if _, err := AppendMethod(nil, &BasicPublish{Exchange: long[:255]}); err != nil {
		t.Errorf("255-byte shortstr: %v", err)
	}
	// Long strings may exceed 255 bytes.
	roundTrip(t, &ConnectionStart{Mechanisms: strings.Repeat("PLAIN ", 1000), Locales: "en_US"})
	// Unsupported table value.
	if _, err := AppendMethod(nil, &QueueDeclare{Arguments: Table{"x": struct{}{}}}); err == nil {
		t.Error("unsupported table type encoded")
	}
	// dst is returned untouched on error.
	dst := []byte("keep")
	got, err := AppendMethod(dst, &BasicPublish{Exchange: long})
	if err == nil || string(got) != "keep" {
		t.Errorf("AppendMethod on error returned %q", got)
	}
}

func TestMethodStringRedactsSecrets(t *testing.T) {
	s := (&ConnectionStartOk{Mechanism: "PLAIN", Response: "\x00guest\x00s3cret"}).String()
	if strings.Contains(s, "s3cret") || !strings.Contains(s, "response=<13 bytes>") {
		t.Errorf("start-ok String() = %s", s)
	}
	s = (&ConnectionUpdateSecret{NewSecret: "jwt.token.here", Reason: "refresh"}).String()
	if strings.Contains(s, "jwt") {
		t.Errorf("update-secret String() = %s", s)
	}
	if got := (&BasicPublish{Exchange: "ex", RoutingKey: "rk", Mandatory: true}).String(); got !=
		`basic.publish{exchange="ex" routing-key="rk" mandatory=true immediate=false}` {
		t.Errorf("String() = %s", got)
	}
	if got := (&TxSelect{}).String(); got != "tx.select{}" {
		t.Errorf("String() = %s", got)
	}
}

// Golden bytes, laid out by hand from the spec (section 4.2 framing, 4.2.5
// field types) and the method definitions.

func TestGoldenConnectionStart(t *testing.T) {
	m := &ConnectionStart{
		VersionMajor: 0, VersionMinor: 9,
		ServerProperties: Table{
			"product":      "RabbitMQ",
			"capabilities": Table{"publisher_confirms": true},
		},
		Mechanisms: "PLAIN",
		Locales:    "en_US",
	}
	want := cat(
		[]byte{1, 0, 0}, u32(4+2+4+60+4+5+4+5), // method frame, channel 0, size
		[]byte{0, 10, 0, 10}, // connection.start
		[]byte{0, 9},         // version 0-9
		u32(60),              // server-properties length; keys sorted
		[]byte{12}, []byte("capabilities"), []byte{'F'}, u32(21),
		[]byte{18}, []byte("publisher_confirms"), []byte{'t', 1},
		[]byte{7}, []byte("product"), []byte{'S'}, u32(8), []byte("RabbitMQ"),
		u32(5), []byte("PLAIN"),
		u32(5), []byte("en_US"),
		[]byte{0xCE},
	)
	var buf bytes.Buffer
	fw := newTestWriter(&buf, FrameMinSize)
	if err := fw.WriteMethod(0, m); err != nil {
		t.Fatal(err)
	}
	fw.Flush()
	if !bytes.Equal(buf.Bytes(), want) {
		t.Fatalf("connection.start\n got % x\nwant % x", buf.Bytes(), want)
	}
	f := readOne(t, want, FrameMinSize)
	got, err := DecodeMethod(f.Payload)
	if err != nil || !reflect.DeepEqual(got, m) {
		t.Fatalf("decode: %v %v", got, err)
	}
}

func TestGoldenBasicPublish(t *testing.T) {
	m := &BasicPublish{Exchange: "ex", RoutingKey: "rk", Mandatory: true}
	want := []byte{
		1, 0, 1, 0, 0, 0, 13, // method frame, channel 1, 13 bytes
		0, 60, 0, 40, // basic.publish
		0, 0, // reserved-1 (ticket)
		2, 'e', 'x',
		2, 'r', 'k',
		0b01, // mandatory=1 (bit 0), immediate=0 (bit 1)
		0xCE,
	}
	var buf bytes.Buffer
	fw := newTestWriter(&buf, FrameMinSize)
	if err := fw.WriteMethod(1, m); err != nil {
		t.Fatal(err)
	}
	fw.Flush()
	if !bytes.Equal(buf.Bytes(), want) {
		t.Fatalf("basic.publish\n got % x\nwant % x", buf.Bytes(), want)
	}
	want[len(want)-2] = 0b10 // immediate only
	f := readOne(t, want, FrameMinSize)
	got, err := DecodeMethod(f.Payload)
	if err != nil || !reflect.DeepEqual(got, &BasicPublish{Exchange: "ex", RoutingKey: "rk", Immediate: true}) {
		t.Fatalf("decode: %v %v", got, err)
	}
}

// More than eight consecutive bits would spill into a second octet; the spec
// has none, but five (exchange.declare) must share one octet.
func TestGoldenPackedBits(t *testing.T) {
	m := &ExchangeDeclare{Exchange: "e", Type: "topic", Durable: true, Internal: true, NoWait: true}
	got, err := AppendMethod(nil, m)
	if err != nil {
		t.Fatal(err)
	}
	want := cat([]byte{0, 40, 0, 10, 0, 0, 1, 'e', 5}, []byte("topic"), []byte{0b11010}, u32(0))
	if !bytes.Equal(got, want) {
		t.Fatalf("exchange.declare\n got % x\nwant % x", got, want)
	}
}

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

func u32(n uint32) []byte { return []byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)} }
