package kubemqclient

import (
	"context"
	"errors"
	"io"
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Error is every failure the client reports: gRPC status errors and the
// in-band failures KubeMQ returns with status OK (Sent=false, IsError) are
// both mapped to it, once, by classify.
type Error struct {
	Op        string     // the client operation, e.g. "SendQueueMessages" or "AckAll"
	Code      int        // KubeMQ "Error NNN" number; 0 if the text carries none
	GRPC      codes.Code // gRPC status code; codes.OK for in-band errors
	Msg       string     // the server's (or the client's) text
	Retryable bool       // true when the same call may succeed later unchanged
	TxID      string     // for a downstream settlement failure: its transaction

	kind  error // one of the Err* sentinels, or nil
	cause error // the underlying Go error, if any
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("kubemq ")
	b.WriteString(e.Op)
	if e.TxID != "" {
		b.WriteString(" tx ")
		b.WriteString(e.TxID)
	}
	b.WriteString(": ")
	b.WriteString(e.Msg)
	if e.GRPC != codes.OK && e.GRPC != codes.Unknown {
		b.WriteString(" (")
		b.WriteString(e.GRPC.String())
		b.WriteString(")")
	}
	return b.String()
}

// Is matches the sentinel the error was classified as (and that sentinel's
// parent: every validation sentinel is also ErrInvalidArgument), plus the
// context errors for Canceled and DeadlineExceeded.
func (e *Error) Is(target error) bool {
	if e.kind != nil {
		if target == e.kind {
			return true
		}
		if p, ok := sentinelParent[e.kind]; ok && target == p {
			return true
		}
	}
	switch e.GRPC {
	case codes.Canceled:
		return target == context.Canceled
	case codes.DeadlineExceeded:
		return target == context.DeadlineExceeded
	}
	return false
}

func (e *Error) Unwrap() error { return e.cause }

// Sentinels for errors.Is. Each *Error matches at most one of them (plus a
// parent for the validation ones).
var (
	ErrUnavailable       = errors.New("kubemq unavailable")             // connection lost, server not ready, shutting down: retry later
	ErrClosed            = errors.New("kubemq client or stream closed") // Close was called
	ErrInvalidArgument   = errors.New("invalid argument")               // deterministic input error: do not retry
	ErrInvalidChannel    = errors.New("invalid channel name")           // also ErrInvalidArgument
	ErrInvalidSequence   = errors.New("invalid sequence")               // also ErrInvalidArgument
	ErrTxNotFound        = errors.New("transaction not found")          // unknown id, or a transaction of another stream
	ErrTxClosed          = errors.New("transaction closed")             // the transaction is already complete
	ErrWaitExpired       = errors.New("wait time expired")              // Error 138: no message within the wait
	ErrVisibilityExpired = errors.New("visibility expired")             // Error 129: the held message went back to the queue
	ErrClientIDInUse     = errors.New("client id already registered")   // events-store subscription with a ClientID in use
	ErrTimeout           = errors.New("timeout")                        // DeadlineExceeded; also matches context.DeadlineExceeded
	ErrCanceled          = errors.New("canceled")                       // also matches context.Canceled
	// ErrStrictMode is the embedded server's strict-mode refusal of a usage
	// pattern the real server mishandles (docs/kubemq.md 8, 9): a client bug.
	ErrStrictMode = errors.New("refused by strict mode")
	// ErrResourceExhausted is a store limit refusing a write: the embedded server's memory
	// bound ("memory limit reached"), the store's channel or subscriber caps ("too many
	// channels", "too many subscriptions per channel"), or gRPC ResourceExhausted (a message
	// over the server's body limit). Retrying unchanged helps only once something is freed.
	ErrResourceExhausted = errors.New("resource exhausted")
)

var sentinelParent = map[error]error{
	ErrInvalidChannel:  ErrInvalidArgument,
	ErrInvalidSequence: ErrInvalidArgument,
}

// IsRetryable reports whether err is an *Error marked retryable.
func IsRetryable(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Retryable
}

func invalidArg(op, msg string, kind error) *Error {
	if kind == nil {
		kind = ErrInvalidArgument
	}
	return &Error{Op: op, GRPC: codes.InvalidArgument, Msg: msg, kind: kind}
}

func closedErr(op string) *Error {
	return &Error{Op: op, GRPC: codes.Canceled, Msg: "closed", kind: ErrClosed}
}

// wrapErr maps any error from a gRPC call or stream to *Error.
func wrapErr(op string, err error) error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		return err
	}
	switch {
	case errors.Is(err, context.Canceled):
		return &Error{Op: op, GRPC: codes.Canceled, Msg: err.Error(), kind: ErrCanceled, cause: err}
	case errors.Is(err, context.DeadlineExceeded):
		return &Error{Op: op, GRPC: codes.DeadlineExceeded, Msg: err.Error(), kind: ErrTimeout, Retryable: true, cause: err}
	case errors.Is(err, io.EOF):
		// A stream the server ended without a status: treat as a lost connection.
		return &Error{Op: op, GRPC: codes.Unavailable, Msg: "stream ended by server", kind: ErrUnavailable, Retryable: true, cause: err}
	}
	if st, ok := status.FromError(err); ok {
		e := classify(op, st.Code(), st.Message())
		e.cause = err
		return e
	}
	e = classify(op, codes.Unknown, err.Error())
	e.cause = err
	return e
}

// inBand maps an error reported inside an OK response (Result.Sent=false,
// IsError=true) to *Error.
func inBand(op, msg string) *Error { return classify(op, codes.OK, msg) }

// classify is the one mapping from (gRPC code, text) to *Error; both error
// shapes (docs/kubemq.md 5.5) go through it.
func classify(op string, gc codes.Code, msg string) *Error {
	e := &Error{Op: op, GRPC: gc, Msg: msg, Code: errorNumber(msg)}
	lower := strings.ToLower(msg)
	switch {
	case gc == codes.Unavailable:
		e.kind, e.Retryable = ErrUnavailable, true
	case e.Code == 138:
		e.kind = ErrWaitExpired
	case e.Code == 129:
		e.kind = ErrVisibilityExpired
	case e.Code == 125:
		e.kind = ErrInvalidSequence
	case e.Code == 130, e.Code == 301:
		e.Retryable = true
		if e.Code == 301 {
			e.kind = ErrTimeout
		}
	case e.Code == 302, e.Code == 409:
		e.kind, e.Retryable = ErrUnavailable, true
	case e.Code >= 101 && e.Code <= 122, e.Code == 126, e.Code == 127,
		e.Code >= 131 && e.Code <= 136, e.Code == 206, e.Code == 207:
		e.kind = ErrInvalidArgument
	case strings.HasPrefix(msg, "strict mode:"):
		e.kind = ErrStrictMode
	case gc == codes.ResourceExhausted, strings.HasPrefix(lower, "memory limit reached"),
		lower == "too many channels", lower == "too many subscriptions per channel":
		e.kind = ErrResourceExhausted
	case strings.Contains(lower, "transaction id not found"):
		e.kind = ErrTxNotFound
	case strings.Contains(lower, "closed response"):
		e.kind = ErrTxClosed
	case strings.Contains(lower, "clientid already registered"):
		e.kind = ErrClientIDInUse
	case strings.Contains(lower, "invalid ack sequence"), strings.Contains(lower, "invalid nack sequence"):
		e.kind = ErrInvalidSequence
	case strings.Contains(lower, "not ready to accept requests"), strings.Contains(lower, "connection closed"):
		// "nats: connection closed" is the server's broken store connection.
		e.kind, e.Retryable = ErrUnavailable, true
	case strings.Contains(lower, "empty messages batch"):
		e.kind = ErrInvalidArgument
	case gc == codes.DeadlineExceeded:
		e.kind, e.Retryable = ErrTimeout, true
	case gc == codes.Canceled:
		e.kind = ErrCanceled
	case gc == codes.Aborted:
		e.Retryable = true
	case gc == codes.InvalidArgument, gc == codes.OutOfRange:
		e.kind = ErrInvalidArgument
	}
	return e
}

// errorNumber extracts NNN from KubeMQ's "Error NNN: ..." text; 0 if absent.
func errorNumber(msg string) int {
	i := strings.Index(msg, "Error ")
	if i < 0 {
		return 0
	}
	rest := msg[i+len("Error "):]
	j := 0
	for j < len(rest) && j < 4 && rest[j] >= '0' && rest[j] <= '9' {
		j++
	}
	if j == 0 || j == 4 || j == len(rest) || rest[j] != ':' {
		return 0
	}
	n, _ := strconv.Atoi(rest[:j])
	return n
}
