// Package schema owns Pub/Sub schema definitions and message validation:
// it compiles an Avro or Protocol Buffer definition (one schema revision)
// into a Validator and checks message data against it in either encoding,
// JSON or BINARY, as Google's Pub/Sub does on publish and in
// ValidateMessage.
//
// Definitions are parsed by libraries, never by hand: Avro by
// github.com/hamba/avro/v2, .proto sources by github.com/bufbuild/protocompile
// (a pre-compiled FileDescriptorSet by google.golang.org/protobuf/reflect/protodesc).
// Messages are checked by walking the parsed schema: Avro binary data with
// hamba's Reader primitives, Avro JSON data (the Avro specification's JSON
// encoding, which hamba does not implement) after encoding/json has parsed
// it, Protocol Buffer data by decoding it into a dynamicpb message with
// proto or protojson.
//
// The package is pure: it knows nothing of resources, revisions or the
// registry. A Validator is immutable and safe for concurrent use, so the
// caller compiles a revision once and keeps the Validator (gcp caches one per
// schema revision). Errors are plain errors; the caller chooses the gRPC
// status and Google's text, which differ between Publish and
// ValidateMessage.
package schema

import (
	"errors"
	"fmt"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
)

// MaxDefinitionBytes bounds a definition (Google's limit is "300 KB"; the
// larger reading is taken so that nothing Google accepts is refused).
const MaxDefinitionBytes = 300 << 10

// Errors of Compile that are not about the definition's content.
var (
	// ErrType: the type is unspecified or unknown.
	ErrType = errors.New("invalid schema type")
	// ErrTooLarge: the definition is over MaxDefinitionBytes.
	ErrTooLarge = errors.New("schema definition too large")
)

// DefinitionError is a definition that does not parse or is not a usable
// Pub/Sub schema; Detail says why.
type DefinitionError struct{ Detail string }

func (e *DefinitionError) Error() string { return "could not parse schema definition: " + e.Detail }

func badDefinition(format string, args ...any) error {
	return &DefinitionError{Detail: fmt.Sprintf(format, args...)}
}

// MessageError is message data that does not conform to the schema in the
// given encoding; Detail says where and why.
type MessageError struct {
	Type     pubsubpb.Schema_Type
	Encoding pubsubpb.Encoding
	Detail   string
}

func (e *MessageError) Error() string { return e.Detail }

// Validator checks message data against one compiled schema revision. It is
// immutable and safe for concurrent use.
type Validator struct {
	typ   pubsubpb.Schema_Type
	avro  *avroSchema
	proto *protoSchema
}

// Type is the schema type the Validator was compiled from.
func (v *Validator) Type() pubsubpb.Schema_Type { return v.typ }

// Compile parses and checks one schema revision: its type and either its
// definition or (Protocol Buffers only) its pre-compiled descriptor set.
// A panic in a parsing library is turned into a DefinitionError: a bad
// definition must never take the server down (FuzzCompile has found none).
func Compile(s *pubsubpb.Schema) (v *Validator, err error) {
	defer func() {
		if p := recover(); p != nil {
			v, err = nil, badDefinition("the definition could not be parsed (%v)", p)
		}
	}()
	if len(s.GetDefinition()) > MaxDefinitionBytes {
		return nil, ErrTooLarge
	}
	cps := s.GetCompiledProtoSchema()
	switch s.GetType() {
	case pubsubpb.Schema_AVRO:
		if cps != nil {
			return nil, badDefinition("compiled_proto_schema needs type PROTOCOL_BUFFER")
		}
		a, err := compileAvro(s.GetDefinition())
		if err != nil {
			return nil, err
		}
		return &Validator{typ: pubsubpb.Schema_AVRO, avro: a}, nil
	case pubsubpb.Schema_PROTOCOL_BUFFER:
		var p *protoSchema
		var err error
		switch {
		case cps != nil && s.GetDefinition() != "":
			return nil, badDefinition("definition and compiled_proto_schema are mutually exclusive")
		case cps != nil:
			if len(cps.GetCompiledBytes()) > MaxDefinitionBytes {
				return nil, ErrTooLarge
			}
			p, err = compileDescriptorSet(cps.GetRootMessage(), cps.GetCompiledBytes())
		default:
			p, err = compileProto(s.GetDefinition())
		}
		if err != nil {
			return nil, err
		}
		return &Validator{typ: pubsubpb.Schema_PROTOCOL_BUFFER, proto: p}, nil
	}
	return nil, ErrType
}

// Validate checks data in the given encoding. A nil error means the data
// conforms; a *MessageError says why it does not; any other error is a bad
// encoding argument.
func (v *Validator) Validate(data []byte, enc pubsubpb.Encoding) error {
	var detail string
	switch {
	case enc != pubsubpb.Encoding_JSON && enc != pubsubpb.Encoding_BINARY:
		return fmt.Errorf("invalid encoding %v", enc)
	case v.avro != nil && enc == pubsubpb.Encoding_JSON:
		detail = v.avro.validateJSON(data)
	case v.avro != nil:
		detail = v.avro.validateBinary(data)
	case enc == pubsubpb.Encoding_JSON:
		detail = v.proto.validateJSON(data)
	default:
		detail = v.proto.validateBinary(data)
	}
	if detail == "" {
		return nil
	}
	return &MessageError{Type: v.typ, Encoding: enc, Detail: detail}
}
