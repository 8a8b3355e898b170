package kubemqclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestClassify(t *testing.T) {
	tests := []struct {
		gc        codes.Code
		msg       string
		code      int
		kind      error
		retryable bool
	}{
		{codes.Unavailable, "grpc server is not ready to accept requests", 0, ErrUnavailable, true},
		{codes.Unavailable, "error reading from server: EOF", 0, ErrUnavailable, true},
		{codes.Internal, "Error 101: clientID cannot be empty", 101, ErrInvalidArgument, false},
		{codes.OK, "Error 120: invalid queue name value a b", 120, ErrInvalidArgument, false},
		{codes.OK, "Error 133: invalid expiration seconds value, exceed max allowed", 133, ErrInvalidArgument, false},
		{codes.OK, "Error 134: invalid max receive count", 134, ErrInvalidArgument, false},
		{codes.OK, "Error 135: invalid delay seconds", 135, ErrInvalidArgument, false},
		{codes.OK, "Error 138: no new message in queue, wait time expired", 138, ErrWaitExpired, false},
		{codes.OK, "Error 129: current visibility timer expired", 129, ErrVisibilityExpired, false},
		{codes.OK, "Error 125: invalid ack sequence", 125, ErrInvalidSequence, false},
		{codes.OK, "Error 130: error sending message", 130, nil, true},
		{codes.Internal, "Error 301: timeout for request message", 301, ErrTimeout, true},
		{codes.Internal, "Error 302: connection not available", 302, ErrUnavailable, true},
		{codes.Internal, "Error 409: server in shutdown mode", 409, ErrUnavailable, true},
		{codes.OK, "transaction is completed or transaction id not found", 0, ErrTxNotFound, false},
		{codes.OK, "cannot ack messages with closed response", 0, ErrTxClosed, false},
		{codes.OK, "cannot get active offsets with closed response ", 0, ErrTxClosed, false},
		{codes.Internal, "stan: clientID already registered", 0, ErrClientIDInUse, false},
		{codes.OK, "invalid ack sequence id 999999", 0, ErrInvalidSequence, false},
		{codes.OK, "invalid nack sequence id 5", 0, ErrInvalidSequence, false},
		{codes.OK, "nats: connection closed", 0, ErrUnavailable, true},
		{codes.Unknown, "empty messages batch", 0, ErrInvalidArgument, false},
		{codes.DeadlineExceeded, "context deadline exceeded", 0, ErrTimeout, true},
		{codes.Canceled, "context canceled", 0, ErrCanceled, false},
		{codes.Aborted, "aborted", 0, nil, true},
		{codes.InvalidArgument, "bad", 0, ErrInvalidArgument, false},
		{codes.Internal, "stan: invalid subject", 0, nil, false},
		{codes.OK, "Error 1234: not a code", 0, nil, false},
		{codes.OK, "strict mode: settlement on a foreign stream", 0, ErrStrictMode, false},
		{codes.OK, "Error : nothing", 0, nil, false},
		{codes.OK, "Error 12", 0, nil, false},
		{codes.OK, "memory limit reached: the embedded server holds 10 bytes of messages and its limit (max_memory) is 9 bytes", 0, ErrResourceExhausted, false},
		{codes.OK, "too many channels", 0, ErrResourceExhausted, false},
		{codes.Internal, "too many subscriptions per channel", 0, ErrResourceExhausted, false},
		{codes.ResourceExhausted, "grpc: received message larger than max (30012 vs. 20000)", 0, ErrResourceExhausted, false},
	}
	for _, tt := range tests {
		e := classify("op", tt.gc, tt.msg)
		if e.Code != tt.code || e.kind != tt.kind || e.Retryable != tt.retryable || e.GRPC != tt.gc || e.Msg != tt.msg {
			t.Errorf("classify(%v, %q) = code %d kind %v retryable %v; want %d %v %v",
				tt.gc, tt.msg, e.Code, e.kind, e.Retryable, tt.code, tt.kind, tt.retryable)
		}
		if tt.kind != nil && !errors.Is(e, tt.kind) {
			t.Errorf("errors.Is(%v, %v) = false", e, tt.kind)
		}
		if IsRetryable(fmt.Errorf("wrapped: %w", e)) != tt.retryable {
			t.Errorf("IsRetryable through wrapping differs for %q", tt.msg)
		}
	}
}

func TestWrapErr(t *testing.T) {
	if wrapErr("op", nil) != nil {
		t.Fatal("nil not preserved")
	}
	e := wrapErr("Get", status.Error(codes.Unavailable, "connection refused"))
	if !errors.Is(e, ErrUnavailable) || !IsRetryable(e) {
		t.Fatalf("unavailable: %v", e)
	}
	e = wrapErr("Get", context.Canceled)
	if !errors.Is(e, context.Canceled) || !errors.Is(e, ErrCanceled) || IsRetryable(e) {
		t.Fatalf("canceled: %v", e)
	}
	e = wrapErr("Get", status.Error(codes.DeadlineExceeded, "deadline"))
	if !errors.Is(e, context.DeadlineExceeded) || !IsRetryable(e) {
		t.Fatalf("deadline: %v", e)
	}
	e = wrapErr("Recv", io.EOF)
	if !errors.Is(e, ErrUnavailable) || !errors.Is(e, io.EOF) {
		t.Fatalf("eof: %v", e)
	}
	inner := inBand("x", "Error 120: bad")
	if wrapErr("y", inner) != error(inner) {
		t.Fatal("*Error re-wrapped")
	}
	if got := inner.Error(); got != "kubemq x: Error 120: bad" {
		t.Fatalf("Error() = %q", got)
	}
	if got := wrapErr("Ping", status.Error(codes.Unavailable, "down")).Error(); got != "kubemq Ping: down (Unavailable)" {
		t.Fatalf("Error() = %q", got)
	}
	if errors.Is(inBand("x", "Error 120: bad"), ErrUnavailable) {
		t.Fatal("validation error matches ErrUnavailable")
	}
}
