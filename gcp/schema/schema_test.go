package schema

import (
	"errors"
	"strings"
	"testing"

	"github.com/hamba/avro/v2"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
)

const (
	avroState = `{"type":"record","name":"State","namespace":"utilities","fields":[
		{"name":"name","type":"string"},{"name":"post_abbr","type":"string"}]}`
	avroAll = `{"type":"record","name":"All","namespace":"t","fields":[
		{"name":"n","type":"null"},{"name":"b","type":"boolean"},{"name":"i","type":"int"},{"name":"l","type":"long"},
		{"name":"f","type":"float"},{"name":"d","type":"double"},{"name":"by","type":"bytes"},{"name":"s","type":"string"},
		{"name":"e","type":{"type":"enum","name":"E","symbols":["A","B"]}},
		{"name":"a","type":{"type":"array","items":"int"}},
		{"name":"m","type":{"type":"map","values":"long"}},
		{"name":"u","type":["null","string",{"type":"record","name":"Inner","fields":[{"name":"x","type":"int"}]}]},
		{"name":"fx","type":{"type":"fixed","name":"F2","size":2}},
		{"name":"ts","type":{"type":"long","logicalType":"timestamp-millis"}}]}`
	avroList   = `{"type":"record","name":"Node","fields":[{"name":"v","type":"int"},{"name":"next","type":["null","Node"]}]}`
	protoState = `syntax = "proto3";
package utilities;
option java_outer_classname = "StateProto";
message State {
  string name = 1;
  string post_abbr = 2;
}
`
	proto2Req = `syntax = "proto2";
message Req {
  required string id = 1;
  optional int32 n = 2;
  message Inner { repeated int64 v = 1; }
  optional Inner inner = 3;
  enum Kind { UNKNOWN = 0; BIG = 1; }
  optional Kind kind = 4;
}
`
)

func mustCompile(t testing.TB, typ pubsubpb.Schema_Type, def string) *Validator {
	t.Helper()
	v, err := Compile(&pubsubpb.Schema{Type: typ, Definition: def})
	if err != nil {
		t.Fatalf("compile %.40q: %v", def, err)
	}
	return v
}

func TestCompileRefusals(t *testing.T) {
	for _, tc := range []struct {
		name string
		s    *pubsubpb.Schema
		want string // substring of the error; "type" = ErrType, "large" = ErrTooLarge
	}{
		{"unspecified", &pubsubpb.Schema{Definition: avroState}, "type"},
		{"unknown type", &pubsubpb.Schema{Type: 9, Definition: avroState}, "type"},
		{"nil", nil, "type"},
		{"avro empty", &pubsubpb.Schema{Type: pubsubpb.Schema_AVRO}, "empty definition"},
		{"avro not json", &pubsubpb.Schema{Type: pubsubpb.Schema_AVRO, Definition: "nope"}, "could not parse"},
		{"avro record without fields", &pubsubpb.Schema{Type: pubsubpb.Schema_AVRO, Definition: `{"type":"record","name":"x"}`}, "could not parse"},
		{"avro unknown type", &pubsubpb.Schema{Type: pubsubpb.Schema_AVRO, Definition: `{"type":"recor"}`}, "could not parse"},
		{"avro bad default", &pubsubpb.Schema{Type: pubsubpb.Schema_AVRO, Definition: `{"type":"record","name":"x","fields":[{"name":"a","type":"int","default":"s"}]}`}, "could not parse"},
		{"avro with compiled", &pubsubpb.Schema{Type: pubsubpb.Schema_AVRO, Definition: avroState,
			Configuration: &pubsubpb.Schema_CompiledProtoSchema{CompiledProtoSchema: &pubsubpb.CompiledProtoSchema{RootMessage: "x"}}}, "PROTOCOL_BUFFER"},
		{"too large", &pubsubpb.Schema{Type: pubsubpb.Schema_AVRO, Definition: strings.Repeat(" ", MaxDefinitionBytes+1)}, "large"},
		{"proto empty", &pubsubpb.Schema{Type: pubsubpb.Schema_PROTOCOL_BUFFER, Definition: " \n"}, "empty definition"},
		{"proto syntax", &pubsubpb.Schema{Type: pubsubpb.Schema_PROTOCOL_BUFFER, Definition: "message {"}, "schema.proto:1:"},
		{"proto two messages", &pubsubpb.Schema{Type: pubsubpb.Schema_PROTOCOL_BUFFER, Definition: "syntax = \"proto3\";\nmessage A {}\nmessage B {}\n"}, "exactly one top-level message"},
		{"proto top-level enum", &pubsubpb.Schema{Type: pubsubpb.Schema_PROTOCOL_BUFFER, Definition: "syntax = \"proto3\";\nenum E { Z = 0; }\nmessage A { E e = 1; }\n"}, "exactly one top-level message"},
		{"proto no message", &pubsubpb.Schema{Type: pubsubpb.Schema_PROTOCOL_BUFFER, Definition: "syntax = \"proto3\";\n"}, "exactly one top-level message"},
		{"proto import", &pubsubpb.Schema{Type: pubsubpb.Schema_PROTOCOL_BUFFER, Definition: "syntax = \"proto3\";\nimport \"google/protobuf/timestamp.proto\";\nmessage A { google.protobuf.Timestamp t = 1; }\n"}, "timestamp.proto"},
		{"proto unknown type", &pubsubpb.Schema{Type: pubsubpb.Schema_PROTOCOL_BUFFER, Definition: "syntax = \"proto3\";\nmessage A { strin a = 1; }\n"}, "strin"},
		{"proto both", &pubsubpb.Schema{Type: pubsubpb.Schema_PROTOCOL_BUFFER, Definition: protoState,
			Configuration: &pubsubpb.Schema_CompiledProtoSchema{CompiledProtoSchema: &pubsubpb.CompiledProtoSchema{RootMessage: "x"}}}, "mutually exclusive"},
		{"compiled no root", &pubsubpb.Schema{Type: pubsubpb.Schema_PROTOCOL_BUFFER,
			Configuration: &pubsubpb.Schema_CompiledProtoSchema{CompiledProtoSchema: &pubsubpb.CompiledProtoSchema{}}}, "root_message"},
		{"compiled garbage", &pubsubpb.Schema{Type: pubsubpb.Schema_PROTOCOL_BUFFER,
			Configuration: &pubsubpb.Schema_CompiledProtoSchema{CompiledProtoSchema: &pubsubpb.CompiledProtoSchema{RootMessage: "a.B", CompiledBytes: []byte{0xff}}}}, "FileDescriptorSet"},
		{"compiled missing root", &pubsubpb.Schema{Type: pubsubpb.Schema_PROTOCOL_BUFFER,
			Configuration: &pubsubpb.Schema_CompiledProtoSchema{CompiledProtoSchema: &pubsubpb.CompiledProtoSchema{RootMessage: "nope.Nope", CompiledBytes: timestampSet(t)}}}, "not found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Compile(tc.s)
			switch {
			case err == nil:
				t.Fatal("compiled")
			case tc.want == "type":
				if !errors.Is(err, ErrType) {
					t.Fatalf("got %v, want ErrType", err)
				}
			case tc.want == "large":
				if !errors.Is(err, ErrTooLarge) {
					t.Fatalf("got %v, want ErrTooLarge", err)
				}
			default:
				var de *DefinitionError
				if !errors.As(err, &de) || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("got %v, want a DefinitionError containing %q", err, tc.want)
				}
			}
		})
	}
}

// timestampSet is a FileDescriptorSet holding google/protobuf/timestamp.proto.
func timestampSet(t testing.TB) []byte {
	fds := &descriptorpb.FileDescriptorSet{File: []*descriptorpb.FileDescriptorProto{
		protodesc.ToFileDescriptorProto((&timestamppb.Timestamp{}).ProtoReflect().Descriptor().ParentFile())}}
	b, err := proto.Marshal(fds)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestCompiledProtoSchema(t *testing.T) {
	v, err := Compile(&pubsubpb.Schema{Type: pubsubpb.Schema_PROTOCOL_BUFFER, Configuration: &pubsubpb.Schema_CompiledProtoSchema{
		CompiledProtoSchema: &pubsubpb.CompiledProtoSchema{RootMessage: "google.protobuf.Timestamp", CompiledBytes: timestampSet(t)}}})
	if err != nil {
		t.Fatal(err)
	}
	bin, _ := proto.Marshal(timestamppb.New(timestamppb.Now().AsTime()))
	if err := v.Validate(bin, pubsubpb.Encoding_BINARY); err != nil {
		t.Fatalf("binary: %v", err)
	}
	// A Timestamp's JSON mapping is an RFC 3339 string.
	if err := v.Validate([]byte(`"2024-01-02T03:04:05Z"`), pubsubpb.Encoding_JSON); err != nil {
		t.Fatalf("json: %v", err)
	}
	if err := v.Validate([]byte(`{"seconds":1}`), pubsubpb.Encoding_JSON); err == nil {
		t.Fatal("a Timestamp object validated as JSON")
	}
}

type msgCase struct {
	data string
	ok   bool
	want string // substring of the detail when !ok
}

func runCases(t *testing.T, v *Validator, enc pubsubpb.Encoding, cases []msgCase) {
	t.Helper()
	for _, c := range cases {
		err := v.Validate([]byte(c.data), enc)
		if c.ok {
			if err != nil {
				t.Errorf("%v %q: %v", enc, c.data, err)
			}
			continue
		}
		var me *MessageError
		if !errors.As(err, &me) {
			t.Errorf("%v %q: got %v, want a MessageError", enc, c.data, err)
			continue
		}
		if me.Encoding != enc || me.Type != v.Type() || !strings.Contains(me.Detail, c.want) {
			t.Errorf("%v %q: got %+v, want detail containing %q", enc, c.data, me, c.want)
		}
	}
}

func TestAvroJSON(t *testing.T) {
	v := mustCompile(t, pubsubpb.Schema_AVRO, avroAll)
	const ok = `{"n":null,"b":true,"i":1,"l":-9007199254740993,"f":1.5,"d":-2e300,"by":"\u00ff\u0000","s":"x","e":"B","a":[1,2],"m":{"k":3},"u":{"t.Inner":{"x":1}},"fx":"ab","ts":1700000000000}`
	runCases(t, v, pubsubpb.Encoding_JSON, []msgCase{
		{ok, true, ""},
		{" \n" + ok + "\n ", true, ""},
		{strings.Replace(ok, `"u":{"t.Inner":{"x":1}}`, `"u":null`, 1), true, ""},
		{strings.Replace(ok, `"u":{"t.Inner":{"x":1}}`, `"u":{"string":"s"}`, 1), true, ""},
		{strings.Replace(ok, `"i":1`, `"i":1.0`, 1), true, ""},
		{strings.Replace(ok, `"s":"x"`, `"s":"x","extra":[1]`, 1), true, ""}, // extra members are ignored
		{strings.Replace(ok, `"u":{"t.Inner":{"x":1}}`, `"u":"s"`, 1), false, "u: a union value must be null or an object"},
		{strings.Replace(ok, `"u":{"t.Inner":{"x":1}}`, `"u":{"Inner":{"x":1}}`, 1), false, `"Inner" is not a branch`},
		{strings.Replace(ok, `"u":{"t.Inner":{"x":1}}`, `"u":{"t.Inner":{"x":"1"}}`, 1), false, "u.<t.Inner>.x: expected int, got string"},
		{strings.Replace(ok, `"u":{"t.Inner":{"x":1}}`, `"u":{"string":"a","int":1}`, 1), false, "one member"},
		{strings.Replace(ok, `"i":1`, `"i":3000000000`, 1), false, "i: 3000000000 is not a 32-bit integer"},
		{strings.Replace(ok, `"i":1`, `"i":1.5`, 1), false, "not a 32-bit integer"},
		{strings.Replace(ok, `"l":-9007199254740993`, `"l":1e19`, 1), false, "not a 64-bit integer"},
		{strings.Replace(ok, `"d":-2e300`, `"d":1e999`, 1), false, "out of range"},
		{strings.Replace(ok, `"d":-2e300`, `"d":"NaN"`, 1), false, "d: expected double, got string"},
		{strings.Replace(ok, `"e":"B"`, `"e":"C"`, 1), false, `"C" is not a symbol of enum t.E`},
		{strings.Replace(ok, `"fx":"ab"`, `"fx":"a"`, 1), false, "fixed t.F2 needs 2 characters, got 1"},
		{strings.Replace(ok, `"a":[1,2]`, `"a":[1,"x"]`, 1), false, "a[1]: expected int"},
		{strings.Replace(ok, `"m":{"k":3}`, `"m":{"k":true}`, 1), false, `m["k"]: expected long, got boolean`},
		{strings.Replace(ok, `"n":null,`, ``, 1), false, "n: missing field of record t.All"},
		{strings.Replace(ok, `"b":true`, `"b":null`, 1), false, "b: expected boolean, got null"},
		{ok + " x", false, "invalid JSON"},
		{ok + ok, false, "data after the top-level value"},
		{`[1]`, false, "expected t.All, got array"},
		{``, false, "invalid JSON"},
		{`{"a":`, false, "invalid JSON"},
	})
}

func TestAvroBinary(t *testing.T) {
	v := mustCompile(t, pubsubpb.Schema_AVRO, avroAll)
	s := avro.MustParse(avroAll)
	val := map[string]any{"n": nil, "b": true, "i": 1, "l": int64(-5), "f": float32(1.5), "d": 2.5, "by": []byte{0, 255}, "s": "x",
		"e": "B", "a": []int{1, 2}, "m": map[string]int64{"k": 3}, "u": map[string]any{"t.Inner": map[string]any{"x": 1}}, "fx": [2]byte{'a', 'b'},
		"ts": int64(1700000000000)}
	good, err := avro.Marshal(s, val)
	if err != nil {
		t.Fatal(err)
	}
	if err := v.Validate(good, pubsubpb.Encoding_BINARY); err != nil {
		t.Fatalf("hamba-encoded value: %v", err)
	}
	if err := v.Validate(append(good[:len(good):len(good)], 0), pubsubpb.Encoding_BINARY); err == nil || !strings.Contains(err.Error(), "too much data") {
		t.Fatalf("trailing byte: %v", err)
	}
	for i := range good {
		if err := v.Validate(good[:i], pubsubpb.Encoding_BINARY); err == nil {
			t.Fatalf("prefix of %d bytes validated", i)
		}
	}
	st := mustCompile(t, pubsubpb.Schema_AVRO, avroState)
	runCases(t, st, pubsubpb.Encoding_BINARY, []msgCase{
		{"\x0cAlaska\x04AK", true, ""},
		{"\x0cAlaska\x04AK\x00", false, "too much data"},
		{"\x0cAlaska\x04A", false, "not enough data"},
		{"\x0cAlaska\x03AK", false, "post_abbr: negative length -2"},
		{"", false, "not enough data"},
		{"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", false, ""}, // an over-long varint
	})
	en := mustCompile(t, pubsubpb.Schema_AVRO, `{"type":"enum","name":"E","symbols":["A","B"]}`)
	runCases(t, en, pubsubpb.Encoding_BINARY, []msgCase{{"\x02", true, ""}, {"\x04", false, "no symbol 2"}, {"\x01", false, "no symbol -1"}})
	un := mustCompile(t, pubsubpb.Schema_AVRO, `["null","int"]`)
	runCases(t, un, pubsubpb.Encoding_BINARY, []msgCase{{"\x00", true, ""}, {"\x02\x02", true, ""}, {"\x04", false, "no branch 2"}})
	bo := mustCompile(t, pubsubpb.Schema_AVRO, `"boolean"`)
	runCases(t, bo, pubsubpb.Encoding_BINARY, []msgCase{{"\x01", true, ""}, {"\x02", false, "invalid bool"}})
	// A block of billions of zero-width items is refused quickly.
	nulls := mustCompile(t, pubsubpb.Schema_AVRO, `{"type":"array","items":"null"}`)
	runCases(t, nulls, pubsubpb.Encoding_BINARY, []msgCase{
		{"\x06\x00", true, ""},
		{"\x05\x00\x00", true, ""}, // negative count: a block byte size follows
		{"\xfe\xff\xff\xff\xff\xff\xff\xff\x7f\x00", false, "too many values"},
	})
}

func TestAvroRecursive(t *testing.T) {
	v := mustCompile(t, pubsubpb.Schema_AVRO, avroList)
	runCases(t, v, pubsubpb.Encoding_JSON, []msgCase{
		{`{"v":1,"next":{"Node":{"v":2,"next":null}}}`, true, ""},
		{`{"v":1,"next":{"Node":{"v":2}}}`, false, "next.<Node>.next: missing field"},
	})
	runCases(t, v, pubsubpb.Encoding_BINARY, []msgCase{
		{"\x02\x02\x04\x00", true, ""},
		{strings.Repeat("\x02\x02", maxDepth) + "\x02\x00", false, "nesting too deep"},
	})
	deep := strings.Repeat(`{"v":1,"next":{"Node":`, maxDepth) + `{"v":1,"next":null}` + strings.Repeat(`}}`, maxDepth)
	runCases(t, v, pubsubpb.Encoding_JSON, []msgCase{{deep, false, "nesting too deep"}})
}

func TestProtoMessages(t *testing.T) {
	v := mustCompile(t, pubsubpb.Schema_PROTOCOL_BUFFER, protoState)
	runCases(t, v, pubsubpb.Encoding_JSON, []msgCase{
		{`{"name":"Alaska","post_abbr":"AK"}`, true, ""},
		{`{"name":"Alaska","postAbbr":"AK"}`, true, ""},
		{`{}`, true, ""},
		{`{"name":1}`, false, "name"},
		{`{"zz":1}`, false, "zz"},
		{`nope`, false, ""},
	})
	runCases(t, v, pubsubpb.Encoding_BINARY, []msgCase{
		{"\x0a\x06Alaska\x12\x02AK", true, ""},
		{"", true, ""},
		{"\x18\x01", true, ""}, // unknown field 3: kept, as by any proto parser
		{"\x0a\x06Alas", false, ""},
		{"\x0a\x02\xff\xfe", false, "UTF-8"},
		{"\xff\xff", false, ""},
	})
	r := mustCompile(t, pubsubpb.Schema_PROTOCOL_BUFFER, proto2Req)
	runCases(t, r, pubsubpb.Encoding_BINARY, []msgCase{
		{"\x0a\x01a", true, ""},
		{"\x10\x01", false, "required"},
	})
	runCases(t, r, pubsubpb.Encoding_JSON, []msgCase{
		{`{"id":"a","inner":{"v":["1",2]},"kind":"BIG"}`, true, ""},
		{`{"n":1}`, false, "required"},
		{`{"id":"a","kind":"HUGE"}`, false, "HUGE"},
	})
}

func TestValidateBadEncoding(t *testing.T) {
	v := mustCompile(t, pubsubpb.Schema_AVRO, avroState)
	err := v.Validate([]byte("{}"), pubsubpb.Encoding_ENCODING_UNSPECIFIED)
	var me *MessageError
	if err == nil || errors.As(err, &me) {
		t.Fatalf("got %v, want a plain error", err)
	}
}

// TestSeparateNameSpaces: two schemas may define the same record name
// differently (hamba's default cache would mix them up).
func TestSeparateNameSpaces(t *testing.T) {
	a := mustCompile(t, pubsubpb.Schema_AVRO, `{"type":"record","name":"R","fields":[{"name":"a","type":"int"}]}`)
	b := mustCompile(t, pubsubpb.Schema_AVRO, `{"type":"record","name":"R","fields":[{"name":"b","type":"string"}]}`)
	if a.Validate([]byte(`{"a":1}`), pubsubpb.Encoding_JSON) != nil || b.Validate([]byte(`{"b":"x"}`), pubsubpb.Encoding_JSON) != nil {
		t.Fatal("same-named records interfere")
	}
}

// TestAvroJSONStrictness: the streaming walk refuses what is not JSON as
// encoding/json does, also where json-iterator alone would let it pass.
func TestAvroJSONStrictness(t *testing.T) {
	st := mustCompile(t, pubsubpb.Schema_AVRO, avroState)
	runCases(t, st, pubsubpb.Encoding_JSON, []msgCase{
		{`{"name":"a\n\"b\u00e9\/","post_abbr":"AK"}`, true, ""},
		{"{\"name\":\"a\\n\tb\",\"post_abbr\":\"AK\"}", false, "control character 0x09 in a string"},
		{`{"name":"\q","post_abbr":"AK"}`, false, `invalid escape \q`},
		{`{"name":"\u12","post_abbr":"AK"}`, false, `invalid \u escape`},
		{`{"name":"A","post_abbr":"AK","x":[01]}`, false, `invalid number "01"`},
		{`{"name":"A","post_abbr":"AK","x":{"y":[1,{}]}}`, true, ""},
		{`{"name":"A","post_abbr":"AK","x":[1,]}`, false, "invalid JSON"},
		{`{"name":"A","post_abbr":"AK"} x`, false, "data after the top-level value"},
		{`{"name":"A","post_abbr":"AK"`, false, "invalid JSON"},
		{`{"name":"A","post_abbr":"AK}`, false, "unterminated string"},
	})
	num := mustCompile(t, pubsubpb.Schema_AVRO, `"long"`)
	runCases(t, num, pubsubpb.Encoding_JSON, []msgCase{
		{`-12`, true, ""}, {` 7 `, true, ""}, {`1e3`, true, ""},
		{`+1`, false, ""}, {`1.`, false, ""}, {`.5`, false, ""}, {`1e`, false, ""}, {`01`, false, ""}, {`--1`, false, ""},
	})
}
