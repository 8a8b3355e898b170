package gcp

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kubemq-io/kubemq-proxy/delivery"
	"github.com/kubemq-io/kubemq-proxy/kubemqclient"
)

// toStatus is the one place where an error becomes a gRPC status. Handler
// errors that already are statuses (validation with Google's texts,
// NOT_FOUND, ...) pass unchanged; backend errors become UNAVAILABLE when
// the same call may succeed later (the client libraries retry it) and
// INTERNAL otherwise; context errors keep their meaning.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	var ke *kubemqclient.Error
	if _, ok := status.FromError(err); ok && !errors.As(err, &ke) {
		return err
	}
	switch {
	case errors.Is(err, kubemqclient.ErrResourceExhausted):
		// The backend's store is full (the embedded server's max_memory, or a KubeMQ store
		// limit): the client libraries back off and retry.
		return status.Error(codes.ResourceExhausted, "KubeMQ store full, retry later: "+err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, "request canceled")
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, "deadline exceeded while storing in KubeMQ")
	case errors.Is(err, kubemqclient.ErrUnavailable), errors.Is(err, kubemqclient.ErrClosed), kubemqclient.IsRetryable(err),
		errors.Is(err, delivery.ErrLeasesLost), errors.Is(err, delivery.ErrNotOwner), errors.Is(err, delivery.ErrHandedOver):
		return status.Error(codes.Unavailable, "KubeMQ unavailable, retry: "+err.Error())
	}
	return status.Error(codes.Internal, "kubemq-proxy: "+err.Error())
}

// notFound and alreadyExists carry Google's texts; resource is the id.
func notFound(resource string) error {
	return status.Errorf(codes.NotFound, "Resource not found (resource=%s).", resource)
}

func alreadyExists(resource string) error {
	return status.Errorf(codes.AlreadyExists, "Resource already exists in the project (resource=%s).", resource)
}

func invalidArgf(format string, args ...any) error {
	return status.Errorf(codes.InvalidArgument, format, args...)
}

func unimplementedf(format string, args ...any) error {
	return status.Errorf(codes.Unimplemented, format, args...)
}
