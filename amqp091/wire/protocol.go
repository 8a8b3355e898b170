package wire

import (
	"errors"
	"fmt"
	"io"
)

// ProtocolHeader opens every AMQP 0-9-1 connection. A server that rejects a
// client's header answers with this one and closes the socket, as RabbitMQ
// does.
var ProtocolHeader = [8]byte{'A', 'M', 'Q', 'P', 0, ProtocolMajor, ProtocolMinor, ProtocolRevision}

// ErrProtocolHeader matches every *ProtocolHeaderError with errors.Is.
var ErrProtocolHeader = errors.New("wire: not an AMQP 0-9-1 protocol header")

// ProtocolHeaderError reports the 8 bytes a peer sent instead of
// ProtocolHeader: another AMQP version, or another protocol altogether.
type ProtocolHeaderError struct {
	Got [8]byte
}

// Error describes what was received.
func (e *ProtocolHeaderError) Error() string {
	g := e.Got
	if string(g[:4]) == "AMQP" {
		return fmt.Sprintf("wire: unsupported AMQP protocol header %d-%d-%d-%d, want 0-0-9-1", g[4], g[5], g[6], g[7])
	}
	return fmt.Sprintf("wire: not an AMQP protocol header: %q", g[:])
}

// Is makes errors.Is(err, ErrProtocolHeader) hold.
func (e *ProtocolHeaderError) Is(target error) bool { return target == ErrProtocolHeader }

// ReadProtocolHeader reads the 8-byte protocol header a client sends first.
// Anything but AMQP 0-9-1 is a *ProtocolHeaderError; the server should then
// write ProtocolHeader and close. A stream that ends early gives io.EOF or
// io.ErrUnexpectedEOF. It reads exactly 8 bytes, so a peer that sends fewer
// and waits blocks it: the caller bounds it with a read deadline (RabbitMQ's
// handshake timeout).
func ReadProtocolHeader(r io.Reader) error {
	var got [8]byte
	if _, err := io.ReadFull(r, got[:]); err != nil {
		return err
	}
	if got != ProtocolHeader {
		return &ProtocolHeaderError{Got: got}
	}
	return nil
}
