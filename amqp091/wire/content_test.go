package wire

import (
	"bytes"
	"reflect"
	"strings"
	"testing"
	"time"
)

func fullProperties() Properties {
	p := Properties{
		ContentType:     "application/json",
		ContentEncoding: "gzip",
		Headers:         Table{"x-retry": int32(2), "trace": []byte{1, 2}},
		DeliveryMode:    2,
		Priority:        5,
		CorrelationID:   "corr-1",
		ReplyTo:         "amq.rabbitmq.reply-to.g1h2AA",
		Expiration:      "60000",
		MessageID:       "msg-1",
		Timestamp:       time.Unix(1700000000, 0).UTC(),
		Type:            "order.created",
		UserID:          "guest",
		AppID:           "shop",
		ClusterID:       "c1",
	}
	p.FlagNonZero()
	return p
}

func TestContentHeaderRoundTrip(t *testing.T) {
	full := fullProperties()
	if full.Flags != allPropertyFlags {
		t.Fatalf("FlagNonZero on full properties = %s", full.Flags)
	}
	cases := map[string]Properties{
		"none": {},
		"full": full,
		// Present but empty values survive: Flags, not the values, decide.
		"present empty": {Flags: FlagContentType | FlagDeliveryMode | FlagHeaders | FlagTimestamp},
		"timestamp 0":   {Flags: FlagTimestamp, Timestamp: time.Unix(0, 0).UTC()},
	}
	// Each property alone.
	for i := range 14 {
		p := full
		p.Flags = PropertyFlags(1 << (15 - i))
		keepOnly(&p)
		cases["only "+propertyFlagNames[i]] = p
	}
	for name, p := range cases {
		t.Run(name, func(t *testing.T) {
			h := ContentHeader{ClassID: ClassBasic, BodySize: 1 << 40, Properties: p}
			b, err := AppendContentHeader(nil, &h)
			if err != nil {
				t.Fatal(err)
			}
			got, err := DecodeContentHeader(b)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, h) {
				t.Fatalf("round trip\n got %+v\nwant %+v", got, h)
			}
			if n, ok := ContentBodySize(b); !ok || n != 1<<40 {
				t.Fatalf("ContentBodySize = %d %v", n, ok)
			}
			// Every prefix fails cleanly.
			for n := range len(b) {
				if _, err := DecodeContentHeader(b[:n]); err == nil {
					t.Fatalf("prefix of %d bytes decoded", n)
				}
			}
		})
	}
}

// keepOnly zeroes the values whose flag is not set, so that a decoded header
// (which only fills flagged values) can equal it.
func keepOnly(p *Properties) {
	q := Properties{Flags: p.Flags}
	f := p.Flags
	if f&FlagContentType != 0 {
		q.ContentType = p.ContentType
	}
	if f&FlagContentEncoding != 0 {
		q.ContentEncoding = p.ContentEncoding
	}
	if f&FlagHeaders != 0 {
		q.Headers = p.Headers
	}
	if f&FlagDeliveryMode != 0 {
		q.DeliveryMode = p.DeliveryMode
	}
	if f&FlagPriority != 0 {
		q.Priority = p.Priority
	}
	if f&FlagCorrelationID != 0 {
		q.CorrelationID = p.CorrelationID
	}
	if f&FlagReplyTo != 0 {
		q.ReplyTo = p.ReplyTo
	}
	if f&FlagExpiration != 0 {
		q.Expiration = p.Expiration
	}
	if f&FlagMessageID != 0 {
		q.MessageID = p.MessageID
	}
	if f&FlagTimestamp != 0 {
		q.Timestamp = p.Timestamp
	}
	if f&FlagType != 0 {
		q.Type = p.Type
	}
	if f&FlagUserID != 0 {
		q.UserID = p.UserID
	}
	if f&FlagAppID != 0 {
		q.AppID = p.AppID
	}
	if f&FlagClusterID != 0 {
		q.ClusterID = p.ClusterID
	}
	*p = q
}

func TestContentHeaderGolden(t *testing.T) {
	h := ContentHeader{ClassID: ClassBasic, BodySize: 5, Properties: Properties{
		Flags:        FlagContentType | FlagHeaders | FlagDeliveryMode | FlagTimestamp,
		ContentType:  "text/plain",
		Headers:      Table{"k": "v"},
		DeliveryMode: 2,
		Timestamp:    time.Unix(1700000000, 0).UTC(),
	}}
	want := cat(
		[]byte{0, 60}, // class basic
		[]byte{0, 0},  // weight
		[]byte{0, 0, 0, 0, 0, 0, 0, 5},
		[]byte{0xB0, 0x40}, // content-type (15), headers (13), delivery-mode (12), timestamp (6)
		[]byte{10}, []byte("text/plain"),
		u32(8), []byte{1, 'k', 'S'}, u32(1), []byte("v"),
		[]byte{2},
		[]byte{0, 0, 0, 0, 0x65, 0x53, 0xF1, 0x00},
	)
	got, err := AppendContentHeader(nil, &h)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("content header\n got % x\nwant % x", got, want)
	}
	dec, err := DecodeContentHeader(want)
	if err != nil || !reflect.DeepEqual(dec, h) {
		t.Fatalf("decode: %+v %v", dec, err)
	}
}

func TestContentHeaderErrors(t *testing.T) {
	valid, _ := AppendContentHeader(nil, &ContentHeader{ClassID: ClassBasic, Properties: Properties{Flags: FlagType, Type: "t"}})
	for _, c := range []struct {
		name string
		in   []byte
		text string
	}{
		{"short", []byte{0, 60, 0}, "cannot decode content header"},
		{"class", cat([]byte{0, 50, 0, 0}, make([]byte, 8), []byte{0, 0}), "content header for class 50"},
		{"continuation bit", cat([]byte{0, 60, 0, 0}, make([]byte, 8), []byte{0, 1}, []byte{0, 0}), "0x0001"},
		{"undefined flag", cat([]byte{0, 60, 0, 0}, make([]byte, 8), []byte{0, 2}), "0x0002"},
		{"trailing", append(bytes.Clone(valid), 'x'), "1 bytes after the last property"},
		{"string overrun", cat([]byte{0, 60, 0, 0}, make([]byte, 8), []byte{0x80, 0, 200, 'a'}), "short string needs 200 bytes, 1 remain"},
		{"headers overrun", cat([]byte{0, 60, 0, 0}, make([]byte, 8), []byte{0x20, 0}, u32(0xFFFFFFF0)), "field table declares"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := DecodeContentHeader(c.in)
			wantAMQPError(t, err, ReplySyntaxError, c.text)
		})
	}
	if _, ok := ContentBodySize(valid[:11]); ok {
		t.Error("ContentBodySize accepted 11 bytes")
	}
	if _, err := AppendContentHeader(nil, &ContentHeader{ClassID: ClassQueue}); err == nil {
		t.Error("encoded a header for class queue")
	}
	if _, err := AppendContentHeader(nil, &ContentHeader{ClassID: ClassBasic, Properties: Properties{Flags: 1}}); err == nil {
		t.Error("encoded an undefined flag")
	}
	if _, err := AppendContentHeader(nil, &ContentHeader{ClassID: ClassBasic, Properties: Properties{Flags: FlagAppID, AppID: strings.Repeat("a", 256)}}); err == nil {
		t.Error("encoded a 256-byte app-id")
	}
}

func TestPropertyFlags(t *testing.T) {
	if got := (FlagContentType | FlagClusterID | 1).String(); got != "{content-type,cluster-id,0x0001}" {
		t.Errorf("String() = %q", got)
	}
	if len(propertyFlagNames) != 14 {
		t.Errorf("%d property flags, want the 14 basic properties", len(propertyFlagNames))
	}
	var p Properties
	p.FlagNonZero()
	if p.Flags != 0 {
		t.Errorf("zero properties flagged %s", p.Flags)
	}
	p = Properties{Flags: FlagPriority, DeliveryMode: 1}
	p.FlagNonZero()
	if p.Flags != FlagPriority|FlagDeliveryMode {
		t.Errorf("FlagNonZero dropped or missed flags: %s", p.Flags)
	}
}
