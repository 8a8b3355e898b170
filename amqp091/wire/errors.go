package wire

import (
	"fmt"
	"unicode/utf8"
)

// Error is an AMQP exception: what a peer reports in connection.close (hard
// errors) or channel.close (soft errors), and what basic.return carries.
//
// Text is the complete reply-text as RabbitMQ formats it, the reply name
// followed by detail: "NOT_FOUND - no queue 'q' in vhost '/'". Class and
// Method identify the method that caused the error (0 when none did). Hard
// selects connection.close over channel.close; the constructors set it from
// the spec, and callers may override it where RabbitMQ escalates a soft code
// (a failed login is ACCESS_REFUSED on the connection).
type Error struct {
	Code          uint16
	Text          string
	Class, Method uint16
	Hard          bool
}

// Error formats the exception for logs.
func (e *Error) Error() string {
	level := "channel"
	if e.Hard {
		level = "connection"
	}
	if e.Class != 0 || e.Method != 0 {
		return fmt.Sprintf("amqp %s error %d (on %s): %s", level, e.Code, MethodName(e.Class, e.Method), e.Text)
	}
	return fmt.Sprintf("amqp %s error %d: %s", level, e.Code, e.Text)
}

// NewError builds an Error for any reply code. Text is the reply name, plus
// " - " and the formatted detail when format is not empty; Hard comes from the
// spec (unknown codes are hard).
func NewError(code uint16, format string, args ...any) *Error {
	text := ReplyName(code)
	if text == "" {
		text = fmt.Sprint(code)
	}
	if format != "" {
		text += " - " + fmt.Sprintf(format, args...)
	}
	return &Error{Code: code, Text: text, Hard: IsHardError(code)}
}

// OnMethod records the method that caused the error and returns e.
func (e *Error) OnMethod(class, method uint16) *Error {
	e.Class, e.Method = class, method
	return e
}

// CloseMethod returns the method that reports e to the peer:
// *ConnectionClose when e is hard, *ChannelClose otherwise. The text is cut
// to the 255 bytes a short string holds, at a UTF-8 boundary, because a
// reply built from long queue names must still be sendable.
func (e *Error) CloseMethod() Method {
	text := truncateShortstr(e.Text)
	if e.Hard {
		return &ConnectionClose{ReplyCode: e.Code, ReplyText: text, FailingClassID: e.Class, FailingMethodID: e.Method}
	}
	return &ChannelClose{ReplyCode: e.Code, ReplyText: text, FailingClassID: e.Class, FailingMethodID: e.Method}
}

func truncateShortstr(s string) string {
	if len(s) <= 255 {
		return s
	}
	s = s[:255]
	// Drop the bytes of a rune the cut split (at most UTFMax-1 of them).
	for i := 1; i < utf8.UTFMax && len(s) > 0; i++ {
		if r, size := utf8.DecodeLastRuneInString(s); r != utf8.RuneError || size != 1 {
			break
		}
		s = s[:len(s)-1]
	}
	return s
}

// Constructors, one per error reply code. Each formats the detail that
// follows the reply name; pass "" for the bare name ("NO_ROUTE").

// ContentTooLarge is 311 CONTENT_TOO_LARGE (soft).
func ContentTooLarge(format string, args ...any) *Error {
	return NewError(ReplyContentTooLarge, format, args...)
}

// NoRoute is 312 NO_ROUTE (soft), the basic.return code for an unroutable
// mandatory message.
func NoRoute(format string, args ...any) *Error { return NewError(ReplyNoRoute, format, args...) }

// NoConsumers is 313 NO_CONSUMERS (soft).
func NoConsumers(format string, args ...any) *Error {
	return NewError(ReplyNoConsumers, format, args...)
}

// ConnectionForced is 320 CONNECTION_FORCED (hard): the server closes the
// connection, e.g. on shutdown.
func ConnectionForced(format string, args ...any) *Error {
	return NewError(ReplyConnectionForced, format, args...)
}

// InvalidPath is 402 INVALID_PATH (hard).
func InvalidPath(format string, args ...any) *Error {
	return NewError(ReplyInvalidPath, format, args...)
}

// AccessRefused is 403 ACCESS_REFUSED (soft; set Hard for a refused login).
func AccessRefused(format string, args ...any) *Error {
	return NewError(ReplyAccessRefused, format, args...)
}

// NotFound is 404 NOT_FOUND (soft).
func NotFound(format string, args ...any) *Error { return NewError(ReplyNotFound, format, args...) }

// ResourceLocked is 405 RESOURCE_LOCKED (soft).
func ResourceLocked(format string, args ...any) *Error {
	return NewError(ReplyResourceLocked, format, args...)
}

// PreconditionFailed is 406 PRECONDITION_FAILED (soft).
func PreconditionFailed(format string, args ...any) *Error {
	return NewError(ReplyPreconditionFailed, format, args...)
}

// FrameError is 501 FRAME_ERROR (hard): a malformed frame.
func FrameError(format string, args ...any) *Error {
	return NewError(ReplyFrameError, format, args...)
}

// SyntaxError is 502 SYNTAX_ERROR (hard): a frame whose fields do not decode.
func SyntaxError(format string, args ...any) *Error {
	return NewError(ReplySyntaxError, format, args...)
}

// CommandInvalid is 503 COMMAND_INVALID (hard).
func CommandInvalid(format string, args ...any) *Error {
	return NewError(ReplyCommandInvalid, format, args...)
}

// ChannelError is 504 CHANNEL_ERROR (hard): a frame for a channel that is
// not open.
func ChannelError(format string, args ...any) *Error {
	return NewError(ReplyChannelError, format, args...)
}

// UnexpectedFrame is 505 UNEXPECTED_FRAME (hard): a frame out of sequence.
func UnexpectedFrame(format string, args ...any) *Error {
	return NewError(ReplyUnexpectedFrame, format, args...)
}

// ResourceError is 506 RESOURCE_ERROR (hard).
func ResourceError(format string, args ...any) *Error {
	return NewError(ReplyResourceError, format, args...)
}

// NotAllowed is 530 NOT_ALLOWED (hard).
func NotAllowed(format string, args ...any) *Error {
	return NewError(ReplyNotAllowed, format, args...)
}

// NotImplemented is 540 NOT_IMPLEMENTED (hard).
func NotImplemented(format string, args ...any) *Error {
	return NewError(ReplyNotImplemented, format, args...)
}

// InternalError is 541 INTERNAL_ERROR (hard).
func InternalError(format string, args ...any) *Error {
	return NewError(ReplyInternalError, format, args...)
}
