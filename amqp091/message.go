package amqp091

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/kubemq-io/kubemq-proxy/amqp091/wire"
)

// How an AMQP message is stored as a KubeMQ queue message (amqp091/README.md,
// "Message mapping"). The names below are a documented contract:
// native KubeMQ clients read and write them.
//
//   - Body: the AMQP payload, unchanged.
//   - Metadata: always the JSON object {"amqp_headers":{...}} holding the
//     message's headers table losslessly (see encodeValue for the typed
//     form). If a property value is not valid UTF-8 (tags must be), it is
//     kept in the same object under "amqp_raw_properties" (base64).
//   - Tags: the routing context and the basic properties, one tag each when
//     present: x-amqp-exchange, x-amqp-routing-key, content-type,
//     content-encoding, delivery-mode, priority, correlation-id, reply-to,
//     expiration, message-id, timestamp (Unix seconds), type, user-id,
//     app-id, cluster-id. Headers whose values are strings, numbers or
//     booleans are mirrored as tags of the same name (for native
//     consumers), unless the name is one of the above. A copy that
//     expires also carries x-amqp-expires-at, its expiry in Unix
//     milliseconds (deadletter.go); it never reaches AMQP consumers.
//
// A message without that metadata object was written by a native KubeMQ
// client. It reaches AMQP consumers with exchange "" and the queue's name
// as routing key, its tags as long-string headers, and its Metadata (when
// not empty) in the header x-kubemq-metadata.
const (
	TagExchange        = "x-amqp-exchange"
	TagRoutingKey      = "x-amqp-routing-key"
	HeaderKubeMQMeta   = "x-kubemq-metadata"
	metaHeaders        = "amqp_headers"
	metaRawProperties  = "amqp_raw_properties"
	emptyHeadersMeta   = `{"amqp_headers":{}}`
	typeKey            = "$t"
	maxTimestampSecond = math.MaxInt64 / int64(time.Second)
)

// propertyTags names the tag of each string-valued basic property.
var propertyTags = []struct {
	flag wire.PropertyFlags
	tag  string
	get  func(*wire.Properties) *string
}{
	{wire.FlagContentType, "content-type", func(p *wire.Properties) *string { return &p.ContentType }},
	{wire.FlagContentEncoding, "content-encoding", func(p *wire.Properties) *string { return &p.ContentEncoding }},
	{wire.FlagCorrelationID, "correlation-id", func(p *wire.Properties) *string { return &p.CorrelationID }},
	{wire.FlagReplyTo, "reply-to", func(p *wire.Properties) *string { return &p.ReplyTo }},
	{wire.FlagExpiration, "expiration", func(p *wire.Properties) *string { return &p.Expiration }},
	{wire.FlagMessageID, "message-id", func(p *wire.Properties) *string { return &p.MessageID }},
	{wire.FlagType, "type", func(p *wire.Properties) *string { return &p.Type }},
	{wire.FlagUserID, "user-id", func(p *wire.Properties) *string { return &p.UserID }},
	{wire.FlagAppID, "app-id", func(p *wire.Properties) *string { return &p.AppID }},
	{wire.FlagClusterID, "cluster-id", func(p *wire.Properties) *string { return &p.ClusterID }},
}

const (
	tagDeliveryMode = "delivery-mode"
	tagPriority     = "priority"
	tagTimestamp    = "timestamp"
)

// reservedTag reports whether a header name may not be mirrored as a tag.
func reservedTag(name string) bool {
	switch name {
	case TagExchange, TagRoutingKey, tagDeliveryMode, tagPriority, tagTimestamp, tagExpiresAt:
		return true
	}
	for _, p := range propertyTags {
		if p.tag == name {
			return true
		}
	}
	return len(name) >= 6 && name[:6] == "_kmqp_" // the lease engine's own tags
}

// encodeMessage builds the Metadata and Tags of the KubeMQ copies of one
// published message. The tags map is shared by every copy and must not be
// modified afterwards.
func encodeMessage(exchange, routingKey string, p *wire.Properties) (metadata string, tags map[string]string, err error) {
	tags = make(map[string]string, 4+len(p.Headers))
	tags[TagExchange] = validTag(exchange)
	tags[TagRoutingKey] = validTag(routingKey)
	var raw map[string]string
	for _, pt := range propertyTags {
		if p.Flags&pt.flag == 0 {
			continue
		}
		v := *pt.get(p)
		if utf8.ValidString(v) {
			tags[pt.tag] = v
			continue
		}
		if raw == nil {
			raw = map[string]string{}
		}
		raw[pt.tag] = base64.StdEncoding.EncodeToString([]byte(v))
	}
	if p.Flags&wire.FlagDeliveryMode != 0 {
		tags[tagDeliveryMode] = strconv.Itoa(int(p.DeliveryMode))
	}
	if p.Flags&wire.FlagPriority != 0 {
		tags[tagPriority] = strconv.Itoa(int(p.Priority))
	}
	if p.Flags&wire.FlagTimestamp != 0 {
		tags[tagTimestamp] = strconv.FormatInt(p.Timestamp.Unix(), 10)
	}
	for k, v := range p.Headers {
		if reservedTag(k) || !utf8.ValidString(k) {
			continue
		}
		if s, ok := scalarTag(v); ok {
			tags[k] = s
		}
	}
	if len(p.Headers) == 0 && raw == nil {
		return emptyHeadersMeta, tags, nil
	}
	var b bytes.Buffer
	b.WriteString(`{"amqp_headers":`)
	if err := writeTable(&b, p.Headers, 0); err != nil {
		return "", nil, err
	}
	if raw != nil {
		b.WriteString(`,"amqp_raw_properties":`)
		j, _ := json.Marshal(raw)
		b.Write(j)
	}
	b.WriteByte('}')
	return b.String(), tags, nil
}

// validTag keeps a tag value sendable: tags are protobuf strings, which
// must be UTF-8. The exact routing context is only informative there.
func validTag(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return string([]rune(s)) // invalid bytes become U+FFFD
}

// scalarTag renders a header value as a tag, for scalar types only.
func scalarTag(v any) (string, bool) {
	switch x := v.(type) {
	case string:
		if utf8.ValidString(x) {
			return x, true
		}
	case bool:
		return strconv.FormatBool(x), true
	case int8, uint8, int16, uint16, int32, uint32, int64, int:
		return fmt.Sprint(x), true
	case float32:
		return strconv.FormatFloat(float64(x), 'g', -1, 32), true
	case float64:
		return strconv.FormatFloat(x, 'g', -1, 64), true
	}
	return "", false
}

// The typed JSON form of a field table: plain JSON where JSON is exact and
// the wire type is the usual one (long string, boolean, 64-bit integer,
// table, array, void), and {"$t": letter, "v": value} for every other type,
// using the field type letters of wire.Table: b B s u I i (integers), f d
// (floats; NaN and infinities as strings), D ({"scale":n,"value":n}), x
// (base64), T (Unix seconds). A string that is not valid UTF-8 is
// {"$t":"S","b64":...}. A table that cannot be written as a JSON object
// (a key that is not valid UTF-8 or is "$t") is {"$t":"F","b64":...} with
// its AMQP wire encoding.

const maxJSONDepth = wire.MaxTableDepth

func writeTable(b *bytes.Buffer, t map[string]any, depth int) error {
	if depth > maxJSONDepth {
		return fmt.Errorf("amqp091: headers nested deeper than %d", maxJSONDepth)
	}
	keys := make([]string, 0, len(t))
	plain := true
	for k := range t {
		keys = append(keys, k)
		if k == typeKey || !utf8.ValidString(k) {
			plain = false
		}
	}
	if !plain {
		enc, err := wire.AppendTable(nil, wire.Table(t))
		if err != nil {
			return err
		}
		// AppendTable writes the 4-byte length first; keep only the fields.
		fmt.Fprintf(b, `{"$t":"F","b64":%q}`, base64.StdEncoding.EncodeToString(enc[4:]))
		return nil
	}
	slices.Sort(keys)
	b.WriteByte('{')
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		writeJSONString(b, k)
		b.WriteByte(':')
		if err := writeValue(b, t[k], depth+1); err != nil {
			return err
		}
	}
	b.WriteByte('}')
	return nil
}

func writeJSONString(b *bytes.Buffer, s string) {
	j, _ := json.Marshal(s) // s is valid UTF-8 here
	b.Write(j)
}

func writeTyped(b *bytes.Buffer, letter string, v string) {
	b.WriteString(`{"$t":"`)
	b.WriteString(letter)
	b.WriteString(`","v":`)
	b.WriteString(v)
	b.WriteByte('}')
}

func jsonFloat(f float64, bits int) string {
	switch {
	case math.IsNaN(f):
		return `"NaN"`
	case math.IsInf(f, 1):
		return `"+Inf"`
	case math.IsInf(f, -1):
		return `"-Inf"`
	}
	return strconv.FormatFloat(f, 'g', -1, bits)
}

func writeValue(b *bytes.Buffer, v any, depth int) error {
	switch x := v.(type) {
	case nil:
		b.WriteString("null")
	case string:
		if utf8.ValidString(x) {
			writeJSONString(b, x)
		} else {
			fmt.Fprintf(b, `{"$t":"S","b64":%q}`, base64.StdEncoding.EncodeToString([]byte(x)))
		}
	case bool:
		b.WriteString(strconv.FormatBool(x))
	case int64:
		b.WriteString(strconv.FormatInt(x, 10))
	case int:
		b.WriteString(strconv.FormatInt(int64(x), 10))
	case int8:
		writeTyped(b, "b", strconv.Itoa(int(x)))
	case uint8:
		writeTyped(b, "B", strconv.Itoa(int(x)))
	case int16:
		writeTyped(b, "s", strconv.Itoa(int(x)))
	case uint16:
		writeTyped(b, "u", strconv.Itoa(int(x)))
	case int32:
		writeTyped(b, "I", strconv.Itoa(int(x)))
	case uint32:
		writeTyped(b, "i", strconv.FormatUint(uint64(x), 10))
	case float32:
		writeTyped(b, "f", jsonFloat(float64(x), 32))
	case float64:
		writeTyped(b, "d", jsonFloat(x, 64))
	case wire.Decimal:
		writeTyped(b, "D", fmt.Sprintf(`{"scale":%d,"value":%d}`, x.Scale, x.Value))
	case []byte:
		writeTyped(b, "x", strconv.Quote(base64.StdEncoding.EncodeToString(x)))
	case time.Time:
		writeTyped(b, "T", strconv.FormatInt(x.Unix(), 10))
	case wire.Table:
		return writeTable(b, x, depth)
	case map[string]any:
		return writeTable(b, x, depth)
	case []any:
		if depth > maxJSONDepth {
			return fmt.Errorf("amqp091: headers nested deeper than %d", maxJSONDepth)
		}
		b.WriteByte('[')
		for i, e := range x {
			if i > 0 {
				b.WriteByte(',')
			}
			if err := writeValue(b, e, depth+1); err != nil {
				return err
			}
		}
		b.WriteByte(']')
	default:
		return fmt.Errorf("amqp091: unsupported header value type %T", v)
	}
	return nil
}

// envelope is the metadata object of an AMQP message.
type envelope struct {
	Headers json.RawMessage   `json:"amqp_headers"`
	Raw     map[string]string `json:"amqp_raw_properties"`
}

// parseEnvelope recognises the metadata of a message an AMQP client
// published; ok is false for anything else (a native KubeMQ message).
func parseEnvelope(metadata string) (envelope, bool) {
	var env envelope
	if len(metadata) < len(emptyHeadersMeta) || metadata[0] != '{' {
		return env, false
	}
	if metadata == emptyHeadersMeta {
		return envelope{Headers: json.RawMessage("{}")}, true
	}
	if err := json.Unmarshal([]byte(metadata), &env); err != nil || env.Headers == nil {
		return env, false
	}
	return env, true
}

// decodeMessage rebuilds what basic.deliver and basic.get-ok carry from a
// stored KubeMQ message of queue.
func decodeMessage(queue, metadata string, tags map[string]string) (exchange, routingKey string, props wire.Properties) {
	env, ok := parseEnvelope(metadata)
	if !ok {
		// A native KubeMQ message.
		if len(tags) > 0 || metadata != "" {
			props.Headers = make(wire.Table, len(tags)+1)
			for k, v := range tags {
				props.Headers[k] = v
			}
			if metadata != "" {
				props.Headers[HeaderKubeMQMeta] = metadata
			}
			props.Flags |= wire.FlagHeaders
		}
		return "", queue, props
	}
	exchange, routingKey = tags[TagExchange], tags[TagRoutingKey]
	for _, pt := range propertyTags {
		v, ok := tags[pt.tag]
		if raw, isRaw := env.Raw[pt.tag]; isRaw {
			if b, err := base64.StdEncoding.DecodeString(raw); err == nil {
				v, ok = string(b), true
			}
		}
		if ok {
			*pt.get(&props) = v
			props.Flags |= pt.flag
		}
	}
	if v, ok := tags[tagDeliveryMode]; ok {
		if n, err := strconv.ParseUint(v, 10, 8); err == nil {
			props.DeliveryMode = uint8(n)
			props.Flags |= wire.FlagDeliveryMode
		}
	}
	if v, ok := tags[tagPriority]; ok {
		if n, err := strconv.ParseUint(v, 10, 8); err == nil {
			props.Priority = uint8(n)
			props.Flags |= wire.FlagPriority
		}
	}
	if v, ok := tags[tagTimestamp]; ok {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			props.Timestamp = time.Unix(n, 0).UTC()
			props.Flags |= wire.FlagTimestamp
		}
	}
	if len(env.Headers) > 0 && string(env.Headers) != "{}" {
		if h, err := decodeHeaders(env.Headers); err == nil && len(h) > 0 {
			props.Headers = h
			props.Flags |= wire.FlagHeaders
		}
	}
	return exchange, routingKey, props
}

func decodeHeaders(raw json.RawMessage) (wire.Table, error) {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	t, err := fromJSON(v, 0)
	if err != nil {
		return nil, err
	}
	tt, ok := t.(wire.Table)
	if !ok {
		return nil, fmt.Errorf("amqp091: headers are not a table")
	}
	return tt, nil
}

func fromJSON(v any, depth int) (any, error) {
	if depth > maxJSONDepth+1 {
		return nil, fmt.Errorf("amqp091: headers nested too deep")
	}
	switch x := v.(type) {
	case nil, string, bool:
		return x, nil
	case json.Number:
		n, err := x.Int64()
		if err != nil {
			// Written by someone else as a float: keep it as a double.
			f, ferr := x.Float64()
			if ferr != nil {
				return nil, err
			}
			return f, nil
		}
		return n, nil
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			d, err := fromJSON(e, depth+1)
			if err != nil {
				return nil, err
			}
			out[i] = d
		}
		return out, nil
	case map[string]any:
		if letter, ok := x[typeKey].(string); ok {
			return fromTyped(letter, x)
		}
		t := make(wire.Table, len(x))
		for k, e := range x {
			d, err := fromJSON(e, depth+1)
			if err != nil {
				return nil, err
			}
			t[k] = d
		}
		return t, nil
	}
	return nil, fmt.Errorf("amqp091: unexpected JSON value %T", v)
}

func fromTyped(letter string, x map[string]any) (any, error) {
	if b64, ok := x["b64"].(string); ok {
		raw, err := base64.StdEncoding.DecodeString(b64)
		if err != nil {
			return nil, err
		}
		switch letter {
		case "S":
			return string(raw), nil
		case "F":
			buf := make([]byte, 4, 4+len(raw))
			buf[0], buf[1], buf[2], buf[3] = byte(len(raw)>>24), byte(len(raw)>>16), byte(len(raw)>>8), byte(len(raw))
			t, err := wire.DecodeTable(append(buf, raw...))
			if t == nil && err == nil {
				t = wire.Table{}
			}
			return t, err
		}
		return nil, fmt.Errorf("amqp091: b64 form for type %q", letter)
	}
	v := x["v"]
	num := func() (int64, error) {
		n, ok := v.(json.Number)
		if !ok {
			return 0, fmt.Errorf("amqp091: type %q wants a number", letter)
		}
		return n.Int64()
	}
	fl := func() (float64, error) {
		switch n := v.(type) {
		case json.Number:
			return n.Float64()
		case string:
			switch n {
			case "NaN":
				return math.NaN(), nil
			case "+Inf":
				return math.Inf(1), nil
			case "-Inf":
				return math.Inf(-1), nil
			}
		}
		return 0, fmt.Errorf("amqp091: type %q wants a number", letter)
	}
	inRange := func(n, lo, hi int64) error {
		if n < lo || n > hi {
			return fmt.Errorf("amqp091: %d out of range for type %q", n, letter)
		}
		return nil
	}
	switch letter {
	case "b", "B", "s", "u", "I", "i", "T":
		n, err := num()
		if err != nil {
			return nil, err
		}
		switch letter {
		case "b":
			return int8(n), inRange(n, math.MinInt8, math.MaxInt8)
		case "B":
			return uint8(n), inRange(n, 0, math.MaxUint8)
		case "s":
			return int16(n), inRange(n, math.MinInt16, math.MaxInt16)
		case "u":
			return uint16(n), inRange(n, 0, math.MaxUint16)
		case "I":
			return int32(n), inRange(n, math.MinInt32, math.MaxInt32)
		case "i":
			return uint32(n), inRange(n, 0, math.MaxUint32)
		case "T":
			return time.Unix(n, 0).UTC(), inRange(n, -maxTimestampSecond, maxTimestampSecond)
		}
	case "f":
		f, err := fl()
		return float32(f), err
	case "d":
		return fl()
	case "D":
		m, ok := v.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("amqp091: decimal wants an object")
		}
		sc, _ := m["scale"].(json.Number)
		va, _ := m["value"].(json.Number)
		s, err1 := sc.Int64()
		n, err2 := va.Int64()
		if err1 != nil || err2 != nil || s < 0 || s > math.MaxUint8 || n < math.MinInt32 || n > math.MaxInt32 {
			return nil, fmt.Errorf("amqp091: bad decimal")
		}
		return wire.Decimal{Scale: uint8(s), Value: int32(n)}, nil
	case "x":
		s, ok := v.(string)
		if !ok {
			return nil, fmt.Errorf("amqp091: byte array wants base64")
		}
		return base64.StdEncoding.DecodeString(s)
	case "F":
		m, ok := v.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("amqp091: table wants an object")
		}
		t := make(wire.Table, len(m))
		for k, e := range m {
			d, err := fromJSON(e, 1)
			if err != nil {
				return nil, err
			}
			t[k] = d
		}
		return t, nil
	}
	return nil, fmt.Errorf("amqp091: unknown field type %q", letter)
}
