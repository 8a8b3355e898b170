package amqp091

import (
	"crypto/sha256"
	"encoding/hex"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kubemq-io/kubemq-proxy/amqp091/wire"
)

func allTypesTable() wire.Table {
	return wire.Table{
		"bool":    true,
		"int8":    int8(-8),
		"uint8":   uint8(200),
		"int16":   int16(-1600),
		"uint16":  uint16(60000),
		"int32":   int32(-320000),
		"uint32":  uint32(4000000000),
		"int64":   int64(-1 << 40),
		"float32": float32(1.5),
		"float64": float64(2),
		"nan":     math.NaN(),
		"inf":     math.Inf(-1),
		"decimal": wire.Decimal{Scale: 2, Value: 12345},
		"string":  "héllo",
		"badutf8": "\xff\xfe",
		"bytes":   []byte{0, 1, 2, 255},
		"array":   []any{int32(1), "two", []any{}, wire.Table{"x": nil}},
		"time":    time.Unix(1700000000, 0).UTC(),
		"table":   wire.Table{"nested": wire.Table{"deep": int16(3)}},
		"void":    nil,
		"$t":      "a key that looks like a type marker",
		"empty":   wire.Table{},
	}
}

func TestMessageRoundTrip(t *testing.T) {
	props := wire.Properties{
		ContentType: "application/json", ContentEncoding: "gzip", Headers: allTypesTable(),
		DeliveryMode: 2, Priority: 7, CorrelationID: "corr", ReplyTo: "reply\xffq", Expiration: "60000",
		MessageID: "mid", Timestamp: time.Unix(1700000001, 0).UTC(), Type: "t", UserID: "guest", AppID: "app",
		ClusterID: "",
	}
	props.FlagNonZero()
	props.Flags |= wire.FlagClusterID // present but empty must survive
	meta, tags, err := encodeMessage("ex", "rk", &props)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(meta, `{"amqp_headers":{`) {
		t.Fatalf("metadata %q", meta)
	}
	for k, want := range map[string]string{
		TagExchange: "ex", TagRoutingKey: "rk", "content-type": "application/json", "delivery-mode": "2",
		"priority": "7", "timestamp": "1700000001", "cluster-id": "", "string": "héllo", "int32": "-320000",
		"bool": "true",
	} {
		if got, ok := tags[k]; !ok || got != want {
			t.Errorf("tag %s = %q (%v), want %q", k, got, ok, want)
		}
	}
	if _, ok := tags["reply-to"]; ok {
		t.Error("non-UTF-8 reply-to went into a tag")
	}
	if _, ok := tags["badutf8"]; ok {
		t.Error("non-UTF-8 header went into a tag")
	}
	ex, rk, got := decodeMessage("q", meta, tags)
	if ex != "ex" || rk != "rk" {
		t.Fatalf("routing context %q %q", ex, rk)
	}
	// NaN never equals itself: compare it apart.
	if !math.IsNaN(got.Headers["nan"].(float64)) {
		t.Fatalf("nan: %v", got.Headers["nan"])
	}
	delete(got.Headers, "nan")
	delete(props.Headers, "nan")
	if !reflect.DeepEqual(got, props) {
		t.Fatalf("round trip:\n got %#v\nwant %#v", got, props)
	}
}

func TestMessageEmptyAndNative(t *testing.T) {
	var p wire.Properties
	meta, tags, err := encodeMessage("", "q", &p)
	if err != nil || meta != emptyHeadersMeta || len(tags) != 2 {
		t.Fatalf("empty message: %q %v %v", meta, tags, err)
	}
	ex, rk, got := decodeMessage("q", meta, tags)
	if ex != "" || rk != "q" || got.Flags != 0 {
		t.Fatalf("empty decode: %q %q %+v", ex, rk, got)
	}
	// A native KubeMQ message: tags become headers, metadata a header.
	ex, rk, got = decodeMessage("orders", "some metadata", map[string]string{"k": "v"})
	if ex != "" || rk != "orders" || got.Flags != wire.FlagHeaders ||
		!reflect.DeepEqual(got.Headers, wire.Table{"k": "v", HeaderKubeMQMeta: "some metadata"}) {
		t.Fatalf("native: %q %q %+v", ex, rk, got)
	}
	// JSON metadata that is not our envelope is native too.
	_, _, got = decodeMessage("q", `{"other":1}`, nil)
	if got.Headers[HeaderKubeMQMeta] != `{"other":1}` {
		t.Fatalf("foreign JSON: %+v", got)
	}
	_, _, got = decodeMessage("q", "", nil)
	if got.Flags != 0 {
		t.Fatalf("bare native: %+v", got)
	}
}

func TestHeadersJSONIsReadable(t *testing.T) {
	p := wire.Properties{Headers: wire.Table{"s": "x", "n": int64(5), "b": false, "i": int32(1)}, Flags: wire.FlagHeaders}
	meta, _, err := encodeMessage("", "q", &p)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"amqp_headers":{"b":false,"i":{"$t":"I","v":1},"n":5,"s":"x"}}`
	if meta != want {
		t.Fatalf("got  %s\nwant %s", meta, want)
	}
}

func FuzzDecodeMessage(f *testing.F) {
	f.Add(`{"amqp_headers":{"a":{"$t":"F","b64":"AAAA"}}}`, "content-type", "x")
	f.Add(`{"amqp_headers":{"a":{"$t":"D","v":{"scale":1,"value":2}}}}`, "priority", "300")
	f.Add(`{"amqp_headers":[1]}`, "timestamp", "-1")
	f.Add(`{"amqp_headers":{"a":{"$t":"T","v":99999999999999999}}}`, "delivery-mode", "x")
	f.Fuzz(func(t *testing.T, meta, k, v string) {
		decodeMessage("q", meta, map[string]string{k: v}) // must not panic
	})
}

func TestUsers(t *testing.T) {
	sum := sha256.Sum256([]byte("s3cret"))
	u := users{"plain": "pw", "hashed": hashPrefix + hex.EncodeToString(sum[:])}
	if err := u.validate(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		user, pw string
		ok       bool
	}{
		{"plain", "pw", true}, {"plain", "pW", false}, {"hashed", "s3cret", true},
		{"hashed", hashPrefix + hex.EncodeToString(sum[:]), false}, {"nobody", "pw", false},
	} {
		if got := u.check(c.user, c.pw); got != c.ok {
			t.Errorf("check(%q, %q) = %v", c.user, c.pw, got)
		}
	}
	if !(users{}).check("anyone", "anything") {
		t.Error("empty user set must accept any login")
	}
	if err := (users{"x": "sha256:zz"}).validate(); err == nil {
		t.Error("bad hash accepted")
	}
}

func TestParseLogin(t *testing.T) {
	if u, p, ok := parseLogin("PLAIN", "\x00guest\x00pw"); !ok || u != "guest" || p != "pw" {
		t.Errorf("PLAIN: %q %q %v", u, p, ok)
	}
	if u, p, ok := parseLogin("PLAIN", "authz\x00guest\x00p\x00w"); !ok || u != "guest" || p != "p\x00w" {
		t.Errorf("PLAIN with authzid: %q %q %v", u, p, ok)
	}
	if u, _, ok := parseLogin("PLAIN", "garbage"); !ok || u != "" {
		t.Errorf("malformed PLAIN: %q %v", u, ok)
	}
	tbl, _ := wire.AppendTable(nil, wire.Table{"LOGIN": "guest", "PASSWORD": "pw"})
	if u, p, ok := parseLogin("AMQPLAIN", string(tbl[4:])); !ok || u != "guest" || p != "pw" {
		t.Errorf("AMQPLAIN: %q %q %v", u, p, ok)
	}
	if _, _, ok := parseLogin("EXTERNAL", ""); ok {
		t.Error("EXTERNAL accepted")
	}
}
