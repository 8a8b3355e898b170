package schema

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/hamba/avro/v2"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/dynamicpb"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
)

// The fuzz targets validate arbitrary data against a fixed set of schemas
// (which picks one). Their seed corpora live in testdata/fuzz and run with
// every `go test`; `go test -fuzz FuzzX ./gcp/schema/` explores further.

var fuzzAvro = []string{avroAll, avroList, avroState, `["null","int",{"type":"map","values":"bytes"}]`, `{"type":"array","items":"null"}`}

var fuzzProto = []string{protoState, proto2Req, `syntax = "proto3";
message M {
  map<string, int64> m = 1;
  repeated double d = 2;
  oneof o { string s = 3; bytes b = 4; }
  M child = 5;
  enum E { Z = 0; O = 1; }
  E e = 6;
  optional sint32 z = 7;
  fixed64 f = 8;
}
`}

func pick[T any](all []T, which uint8) T { return all[int(which)%len(all)] }

// compiled caches the fuzz schemas' validators: compiling a .proto on
// every input would make the fuzzer crawl.
var compiled sync.Map // definition -> *Validator

func fuzzValidator(t *testing.T, typ pubsubpb.Schema_Type, def string) *Validator {
	if v, ok := compiled.Load(def); ok {
		return v.(*Validator)
	}
	v := mustCompile(t, typ, def)
	compiled.Store(def, v)
	return v
}

// hambaAPI decodes with no size caps, as the oracle of the binary walk.
var hambaAPI = avro.Config{MaxByteSliceSize: -1}.Freeze()

// checkMessageError holds for every rejection: a *MessageError in the
// requested encoding with a detail.
func checkMessageError(t *testing.T, err error, enc pubsubpb.Encoding) {
	t.Helper()
	var me *MessageError
	if !errors.As(err, &me) || me.Encoding != enc || me.Detail == "" {
		t.Fatalf("rejection %v is not a MessageError with a detail", err)
	}
}

// FuzzAvroBinary: what the walk accepts, hamba's own decoder decodes.
func FuzzAvroBinary(f *testing.F) {
	f.Add([]byte("\x0cAlaska\x04AK"), uint8(2))
	f.Add([]byte("\x02\x02\x04\x00"), uint8(1))
	f.Fuzz(func(t *testing.T, data []byte, which uint8) {
		def := pick(fuzzAvro, which)
		v := fuzzValidator(t, pubsubpb.Schema_AVRO, def)
		err := v.Validate(data, pubsubpb.Encoding_BINARY)
		if err != nil {
			checkMessageError(t, err, pubsubpb.Encoding_BINARY)
			return
		}
		var out any
		if err := hambaAPI.Unmarshal(avro.MustParse(def), data, &out); err != nil {
			t.Fatalf("validated, but hamba cannot decode it: %v", err)
		}
	})
}

// FuzzAvroJSON: the streaming walk decides as a plain walk over
// encoding/json's decoded value does (refJSON), unless the data repeats an
// object member (the streaming walk checks every occurrence, the decoded
// value keeps the last); what is accepted stays accepted without its
// whitespace.
func FuzzAvroJSON(f *testing.F) {
	f.Add([]byte(`{"name":"Alaska","post_abbr":"AK"}`), uint8(2))
	f.Add([]byte(`{"v":1,"next":{"Node":{"v":2,"next":null}}}`), uint8(1))
	f.Fuzz(func(t *testing.T, data []byte, which uint8) {
		v := fuzzValidator(t, pubsubpb.Schema_AVRO, pick(fuzzAvro, which))
		err := v.Validate(data, pubsubpb.Encoding_JSON)
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.UseNumber()
		var val any
		ref := json.Valid(data) && dec.Decode(&val) == nil && refJSON(v.avro.root, val, 0)
		if ref != (err == nil) && !repeatsMember(data) {
			t.Fatalf("streaming walk says %v, the walk over the decoded value %v", err, ref)
		}
		if err != nil {
			checkMessageError(t, err, pubsubpb.Encoding_JSON)
			return
		}
		var compact bytes.Buffer
		if err := json.Compact(&compact, data); err != nil {
			t.Fatalf("validated, but it is not JSON: %v", err)
		}
		if err := v.Validate(compact.Bytes(), pubsubpb.Encoding_JSON); err != nil {
			t.Fatalf("compacted form refused: %v", err)
		}
	})
}

// protoRoundTrip checks that an accepted message is accepted in the other
// encoding too, once the library has re-encoded it.
func protoRoundTrip(t *testing.T, v *Validator, data []byte, from pubsubpb.Encoding) {
	m := dynamicpb.NewMessage(v.proto.msg)
	var out []byte
	var err error
	if from == pubsubpb.Encoding_BINARY {
		if err = proto.Unmarshal(data, m); err == nil {
			out, err = protojson.Marshal(m)
		}
	} else {
		if err = protojson.Unmarshal(data, m); err == nil {
			out, err = proto.Marshal(m)
		}
	}
	if err != nil && from == pubsubpb.Encoding_BINARY && strings.Contains(err.Error(), "invalid UTF-8") {
		return // proto2 strings need not be UTF-8 on the wire, JSON needs it
	}
	if err != nil {
		t.Fatalf("validated, but the library cannot re-encode it: %v", err)
	}
	to := pubsubpb.Encoding_JSON
	if from == pubsubpb.Encoding_JSON {
		to = pubsubpb.Encoding_BINARY
	}
	if err := v.Validate(out, to); err != nil {
		t.Fatalf("re-encoded as %v (%q), refused: %v", to, out, err)
	}
}

func FuzzProtoBinary(f *testing.F) {
	f.Add([]byte("\x0a\x06Alaska\x12\x02AK"), uint8(0))
	f.Add([]byte("\x0a\x01a"), uint8(1))
	f.Fuzz(func(t *testing.T, data []byte, which uint8) {
		v := fuzzValidator(t, pubsubpb.Schema_PROTOCOL_BUFFER, pick(fuzzProto, which))
		if err := v.Validate(data, pubsubpb.Encoding_BINARY); err != nil {
			checkMessageError(t, err, pubsubpb.Encoding_BINARY)
			return
		}
		protoRoundTrip(t, v, data, pubsubpb.Encoding_BINARY)
	})
}

func FuzzProtoJSON(f *testing.F) {
	f.Add([]byte(`{"name":"Alaska","postAbbr":"AK"}`), uint8(0))
	f.Add([]byte(`{"m":{"a":"1"},"d":[1.5,"NaN"],"s":"x","child":{"e":"O"}}`), uint8(2))
	f.Fuzz(func(t *testing.T, data []byte, which uint8) {
		v := fuzzValidator(t, pubsubpb.Schema_PROTOCOL_BUFFER, pick(fuzzProto, which))
		if err := v.Validate(data, pubsubpb.Encoding_JSON); err != nil {
			checkMessageError(t, err, pubsubpb.Encoding_JSON)
			return
		}
		protoRoundTrip(t, v, data, pubsubpb.Encoding_JSON)
	})
}

// FuzzCompile: any definition compiles or is refused with a typed error,
// never a panic or a hang.
func FuzzCompile(f *testing.F) {
	f.Add(avroAll, false)
	f.Add(protoState, true)
	f.Add(`{"type":"record","name":"x","fields":[{"name":"a","type":["null","x"]}]}`, false)
	f.Fuzz(func(t *testing.T, def string, isProto bool) {
		typ := pubsubpb.Schema_AVRO
		if isProto {
			typ = pubsubpb.Schema_PROTOCOL_BUFFER
		}
		v, err := Compile(&pubsubpb.Schema{Type: typ, Definition: def})
		if err != nil {
			var de *DefinitionError
			if !errors.As(err, &de) && !errors.Is(err, ErrTooLarge) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		// A compiled schema validates without panicking.
		v.Validate([]byte(def), pubsubpb.Encoding_JSON)
		v.Validate([]byte(def), pubsubpb.Encoding_BINARY)
	})
}

// refJSON is the Avro JSON check over a value encoding/json decoded (with
// UseNumber): slow, obviously right, the fuzzer's reference.
func refJSON(n *avroNode, v any, depth int) bool {
	if depth > maxDepth {
		return false
	}
	switch n.kind {
	case avroNull:
		return v == nil
	case avroBoolean:
		_, ok := v.(bool)
		return ok
	case avroInt, avroLong:
		num, ok := v.(json.Number)
		bits := 64
		if n.kind == avroInt {
			bits = 32
		}
		return ok && integral(string(num), bits)
	case avroFloat, avroDouble:
		num, ok := v.(json.Number)
		return ok && finite(string(num))
	case avroBytes, avroString:
		_, ok := v.(string)
		return ok
	case avroFixed:
		s, ok := v.(string)
		return ok && utf8.RuneCountInString(s) == n.size
	case avroEnum:
		s, ok := v.(string)
		return ok && n.symbols[s] != 0
	case avroRecord:
		obj, ok := v.(map[string]any)
		if !ok {
			return false
		}
		for _, f := range n.fields {
			fv, ok := obj[f.name]
			if !ok || !refJSON(f.node, fv, depth+1) {
				return false
			}
		}
		return true
	case avroArray:
		arr, ok := v.([]any)
		if !ok {
			return false
		}
		for _, item := range arr {
			if !refJSON(n.items, item, depth+1) {
				return false
			}
		}
		return true
	case avroMap:
		obj, ok := v.(map[string]any)
		if !ok {
			return false
		}
		for _, item := range obj {
			if !refJSON(n.items, item, depth+1) {
				return false
			}
		}
		return true
	case avroUnion:
		if v == nil {
			return slices.ContainsFunc(n.branches, func(b *avroNode) bool { return b.kind == avroNull })
		}
		obj, ok := v.(map[string]any)
		if !ok || len(obj) != 1 {
			return false
		}
		for name, bv := range obj {
			for _, b := range n.branches {
				if b.name == name && b.kind != avroNull {
					return refJSON(b, bv, depth+1)
				}
			}
		}
		return false
	}
	return false
}

// repeatsMember reports whether some JSON object in data names a member
// twice.
func repeatsMember(data []byte) bool {
	dec := json.NewDecoder(bytes.NewReader(data))
	type frame struct {
		keys   map[string]bool
		object bool
		key    bool // the next string token is a key
	}
	var stack []*frame
	for {
		tok, err := dec.Token()
		if err != nil {
			return false
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		switch tok := tok.(type) {
		case json.Delim:
			switch tok {
			case '{':
				if top != nil && top.object {
					top.key = true
				}
				stack = append(stack, &frame{keys: map[string]bool{}, object: true, key: true})
				continue
			case '[':
				if top != nil && top.object {
					top.key = true
				}
				stack = append(stack, &frame{})
				continue
			default:
				stack = stack[:len(stack)-1]
				continue
			}
		case string:
			if top != nil && top.object && top.key {
				if top.keys[tok] {
					return true
				}
				top.keys[tok] = true
				top.key = false
				continue
			}
		}
		if top != nil && top.object {
			top.key = true
		}
	}
}
