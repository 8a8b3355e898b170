package amqp091

import (
	"context"
	"errors"

	"github.com/kubemq-io/kubemq-proxy/amqp091/wire"
	"github.com/kubemq-io/kubemq-proxy/delivery"
	"github.com/kubemq-io/kubemq-proxy/kubemqclient"
)

// RabbitMQ names resources in its texts as "queue 'q' in vhost '/'"
// (rabbit_misc:rs/1); these helpers keep every text in that shape.

func rsQueue(name, vhost string) string    { return "queue '" + name + "' in vhost '" + vhost + "'" }
func rsExchange(name, vhost string) string { return "exchange '" + name + "' in vhost '" + vhost + "'" }

func errNoQueue(name, vhost string) *wire.Error {
	return wire.NotFound("no %s", rsQueue(name, vhost))
}

func errNoExchange(name, vhost string) *wire.Error {
	return wire.NotFound("no %s", rsExchange(name, vhost))
}

func errDefaultExchange() *wire.Error {
	return wire.AccessRefused("operation not permitted on the default exchange")
}

func errLocked(name, vhost string) *wire.Error {
	return wire.ResourceLocked("cannot obtain exclusive access to locked %s. It could be originally declared on another connection or the exclusive property value does not match that of the original declaration.", rsQueue(name, vhost))
}

// errShutdown is what every connection gets when the proxy stops, in
// RabbitMQ's words for a broker shutdown.
func errShutdown() *wire.Error {
	return wire.ConnectionForced("broker forced connection closure with reason 'shutdown'")
}

// errBackendDown is what connections get while KubeMQ is unreachable.
func errBackendDown(reason string) *wire.Error {
	return wire.ConnectionForced("KubeMQ backend unavailable: %s", reason)
}

// backendError maps a failure of a KubeMQ call (or of the registry or the
// lease engine built on it) to the AMQP exception the client gets. It is
// the one place where backend errors meet reply codes:
//
//   - unreachable backend, lost leases: 320 CONNECTION_FORCED, so clients
//     reconnect and retry (nothing acknowledged was lost);
//   - a deterministic refusal of the input: 406 PRECONDITION_FAILED on the
//     channel, which clients do not retry blindly;
//   - the connection going away under the call: 320 as well;
//   - anything else: 541 INTERNAL_ERROR.
func backendError(err error) *wire.Error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, kubemqclient.ErrUnavailable), errors.Is(err, delivery.ErrLeasesLost),
		errors.Is(err, kubemqclient.ErrTimeout), errors.Is(err, kubemqclient.ErrClosed):
		return errBackendDown(err.Error())
	case errors.Is(err, kubemqclient.ErrInvalidArgument):
		return wire.PreconditionFailed("KubeMQ refused the request: %v", err)
	case errors.Is(err, kubemqclient.ErrResourceExhausted):
		// A store limit (memory bound, channel cap): a publish is nacked instead (publish.go);
		// this is for the other calls.
		return wire.ResourceError("KubeMQ store full: %v", err)
	case errors.Is(err, context.Canceled), errors.Is(err, delivery.ErrClosed):
		return wire.ConnectionForced("connection closing")
	case errors.Is(err, delivery.ErrNotOwner), errors.Is(err, delivery.ErrHandedOver):
		// Another replica consumes the queue (now): the client reconnects and goes on.
		return wire.ConnectionForced("the queue is consumed through another kubemq-proxy replica: %v", err)
	}
	return wire.InternalError("KubeMQ call failed: %v", err)
}

// asAMQP returns err as an AMQP exception: itself if it already is one,
// else backendError's mapping.
func asAMQP(err error) *wire.Error {
	var e *wire.Error
	if errors.As(err, &e) {
		return e
	}
	return backendError(err)
}
