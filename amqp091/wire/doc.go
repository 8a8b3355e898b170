// Package wire is the byte-level codec of AMQP 0-9-1 in RabbitMQ's dialect:
// the protocol header, frames, methods, field tables, content headers with
// the basic properties, and reply codes with their AMQP exceptions.
//
// It holds no connection or channel state. The layer above owns one
// FrameReader and one FrameWriter per connection and decides what the frames
// mean; this package only guarantees that every length read from the wire is
// checked against the bytes available (and frame-max) before anything is
// allocated, and that bad input yields an error, never a panic.
//
// Reading a connection:
//
//	if err := wire.ReadProtocolHeader(conn); err != nil { ... write wire.ProtocolHeader, close }
//	fr := wire.NewFrameReader(bufio.NewReader(conn), wire.FrameMinSize)
//	f, err := fr.ReadFrame()             // f.Payload valid until the next ReadFrame
//	m, err := wire.DecodeMethod(f.Payload) // for f.Type == wire.FrameMethod
//	h, err := wire.DecodeContentHeader(f.Payload) // for f.Type == wire.FrameHeader
//
// Errors meant for the peer are *Error values carrying the reply code; a
// hard one closes the connection, a soft one the channel (Error.CloseMethod).
//
// The method structs, ids, reply codes and property flags in methods_gen.go
// are generated from the spec XML by ../internal/gen.
package wire

//go:generate go run ../internal/gen -o methods_gen.go
