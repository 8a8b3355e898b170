package schema

import (
	"encoding/binary"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
)

// BenchmarkValidate: the cost of checking one record of about 1 KiB (a
// 1,000-character string and a short one) in each type and encoding, with
// a compiled Validator (as the publish path holds one per revision).
func BenchmarkValidate(b *testing.B) {
	long := strings.Repeat("x", 1000)
	avroDef := `{"type":"record","name":"State","fields":[{"name":"name","type":"string"},{"name":"post_abbr","type":"string"}]}`
	protoDef := "syntax = \"proto3\";\nmessage State {\n  string name = 1;\n  string post_abbr = 2;\n}\n"
	jsonData := []byte(`{"name":"` + long + `","post_abbr":"AK"}`)
	avroBin := append(append(binary.AppendVarint(nil, int64(len(long))), long...), 4, 'A', 'K')
	protoBin := protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), long)
	protoBin = protowire.AppendString(protowire.AppendTag(protoBin, 2, protowire.BytesType), "AK")
	for _, tc := range []struct {
		name string
		typ  pubsubpb.Schema_Type
		def  string
		enc  pubsubpb.Encoding
		data []byte
	}{
		{"avro-json", pubsubpb.Schema_AVRO, avroDef, pubsubpb.Encoding_JSON, jsonData},
		{"avro-binary", pubsubpb.Schema_AVRO, avroDef, pubsubpb.Encoding_BINARY, avroBin},
		{"proto-json", pubsubpb.Schema_PROTOCOL_BUFFER, protoDef, pubsubpb.Encoding_JSON, jsonData},
		{"proto-binary", pubsubpb.Schema_PROTOCOL_BUFFER, protoDef, pubsubpb.Encoding_BINARY, protoBin},
	} {
		b.Run(tc.name, func(b *testing.B) {
			v := mustCompile(b, tc.typ, tc.def)
			b.SetBytes(int64(len(tc.data)))
			b.ReportAllocs()
			for b.Loop() {
				if err := v.Validate(tc.data, tc.enc); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
