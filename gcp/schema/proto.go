package schema

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/bufbuild/protocompile"
	"github.com/bufbuild/protocompile/reporter"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
)

// protoFile is the name the definition is compiled under (it shows in
// the compiler's error positions).
const protoFile = "schema.proto"

type protoSchema struct {
	msg protoreflect.MessageDescriptor
}

// compileProto compiles a .proto source. Google's rules: proto2 or proto3,
// exactly one top-level type, which is the message validated, and no
// imports (there is nothing to import from: the source is compiled on its
// own).
func compileProto(def string) (*protoSchema, error) {
	if strings.TrimSpace(def) == "" {
		return nil, badDefinition("empty definition")
	}
	var first error
	comp := protocompile.Compiler{
		Resolver:       &protocompile.SourceResolver{Accessor: protocompile.SourceAccessorFromMap(map[string]string{protoFile: def})},
		MaxParallelism: 1,
		Reporter: reporter.NewReporter(func(err reporter.ErrorWithPos) error {
			if first == nil {
				first = err
			}
			return err
		}, nil),
	}
	files, err := comp.Compile(context.Background(), protoFile)
	if err != nil {
		if first != nil {
			err = first
		}
		return nil, badDefinition("%s", err.Error())
	}
	fd := files.FindFileByPath(protoFile)
	if fd == nil {
		return nil, badDefinition("compiler produced no file")
	}
	if fd.Messages().Len() != 1 || fd.Enums().Len() != 0 {
		return nil, badDefinition("a Protocol Buffer schema must define exactly one top-level message type and no other top-level type (found %d messages, %d enums)",
			fd.Messages().Len(), fd.Enums().Len())
	}
	return &protoSchema{msg: fd.Messages().Get(0)}, nil
}

// compileDescriptorSet loads a pre-compiled FileDescriptorSet and picks
// its root message by full name.
func compileDescriptorSet(root string, set []byte) (*protoSchema, error) {
	if root == "" {
		return nil, badDefinition("compiled_proto_schema.root_message is required")
	}
	var fds descriptorpb.FileDescriptorSet
	if err := proto.Unmarshal(set, &fds); err != nil {
		return nil, badDefinition("compiled_proto_schema.compiled_bytes is not a FileDescriptorSet: %v", err)
	}
	files, err := protodesc.NewFiles(&fds)
	if err != nil {
		return nil, badDefinition("compiled_proto_schema: %v", err)
	}
	d, err := files.FindDescriptorByName(protoreflect.FullName(strings.TrimPrefix(root, ".")))
	if err != nil {
		return nil, badDefinition("compiled_proto_schema: root message %q not found", root)
	}
	md, ok := d.(protoreflect.MessageDescriptor)
	if !ok {
		return nil, badDefinition("compiled_proto_schema: %q is not a message", root)
	}
	return &protoSchema{msg: md}, nil
}

// validateBinary decodes data as the message in the wire format (proto2
// required fields must be set; unknown fields are kept, as any proto
// parser does). It returns "" when data conforms.
func (p *protoSchema) validateBinary(data []byte) string {
	m := dynamicpb.NewMessage(p.msg)
	if err := proto.Unmarshal(data, m); err != nil {
		return cleanProtoError(err)
	}
	return ""
}

// validateJSON decodes data as the message in the Protocol Buffers JSON
// mapping (field names or their lowerCamelCase JSON names; unknown fields
// are errors). It returns "" when data conforms.
func (p *protoSchema) validateJSON(data []byte) string {
	m := dynamicpb.NewMessage(p.msg)
	if err := protojson.Unmarshal(data, m); err != nil {
		return cleanProtoError(err)
	}
	return ""
}

// cleanProtoError drops the library's unstable prefix ("proto: ", with a
// non-breaking space variant the protobuf module uses to discourage
// matching on its texts).
func cleanProtoError(err error) string {
	s := err.Error()
	for _, p := range []string{"proto:\u00a0", "proto: "} {
		if rest, ok := strings.CutPrefix(s, p); ok {
			s = rest
			break
		}
	}
	if s == "" {
		return fmt.Sprint(errors.Unwrap(err))
	}
	return s
}
