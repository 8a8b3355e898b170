package gcp

import (
	"context"
	"runtime/debug"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
)

// The interceptors run in this order: recovery (outermost, so a panic in
// any later stage is caught), logging, readiness gate.

func recoverUnary(log *zap.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (resp any, err error) {
		defer func() {
			if r := recover(); r != nil {
				log.Error("panic in handler", zap.String("method", info.FullMethod), zap.Any("panic", r), zap.ByteString("stack", debug.Stack()))
				resp, err = nil, status.Error(codes.Internal, "internal error in kubemq-proxy")
			}
		}()
		return h(ctx, req)
	}
}

func recoverStream(log *zap.Logger) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) (err error) {
		defer func() {
			if r := recover(); r != nil {
				log.Error("panic in stream handler", zap.String("method", info.FullMethod), zap.Any("panic", r), zap.ByteString("stack", debug.Stack()))
				err = status.Error(codes.Internal, "internal error in kubemq-proxy")
			}
		}()
		return h(srv, ss)
	}
}

// logLevel keeps expected outcomes (not found, already exists, client
// cancels) at debug and what an operator should see at warn/error.
func logLevel(c codes.Code) func(*zap.Logger, string, ...zap.Field) {
	switch c {
	case codes.Internal, codes.Unknown, codes.DataLoss:
		return (*zap.Logger).Error
	case codes.Unavailable:
		return (*zap.Logger).Warn
	default:
		return (*zap.Logger).Debug
	}
}

// logUnary and logStream also count every finished RPC by method and code.
func logUnary(log *zap.Logger, m *metrics) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		start := time.Now()
		resp, err := h(ctx, req)
		c := rpcCode(err)
		m.rpc(info.FullMethod, c)
		logLevel(c)(log, "rpc", zap.String("method", info.FullMethod), zap.Stringer("code", c), zap.Duration("took", time.Since(start)), zap.Error(err))
		return resp, err
	}
}

func logStream(log *zap.Logger, m *metrics) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		start := time.Now()
		log.Debug("stream open", zap.String("method", info.FullMethod))
		m.streams.Inc()
		m.openStreams.Add(1)
		err := h(srv, ss)
		m.openStreams.Add(-1)
		m.streams.Dec()
		code := rpcCode(err)
		m.rpc(info.FullMethod, code)
		c := code
		if c == codes.Canceled {
			c = codes.OK // the client went away: the normal end of a stream
		}
		logLevel(c)(log, "stream closed", zap.String("method", info.FullMethod), zap.Stringer("code", code), zap.Duration("took", time.Since(start)), zap.Error(err))
		return err
	}
}

// rpcCode is the code the client receives for a handler's error: gRPC
// sends a bare context error as CANCELED or DEADLINE_EXCEEDED, where
// status.Code would say UNKNOWN.
func rpcCode(err error) codes.Code {
	if st, ok := status.FromError(err); ok {
		return st.Code()
	}
	return status.FromContextError(err).Code()
}

// notReady is the gate's answer; clients retry UNAVAILABLE by themselves.
func notReady(err error) error {
	return status.Error(codes.Unavailable, "kubemq-proxy is not ready (KubeMQ unreachable or topology not loaded yet): "+err.Error())
}

// gateUnary refuses calls while ready fails, except the settlements of messages out to clients
// while the server drains them (settling reports true).
func gateUnary(ready func() error, settling func() bool) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if err := ready(); err != nil && !(settling() && isSettlement(info.FullMethod)) {
			return nil, notReady(err)
		}
		return h(ctx, req)
	}
}

// isSettlement reports whether method settles leases (acks and deadline changes).
func isSettlement(method string) bool {
	return method == pubsubpb.Subscriber_Acknowledge_FullMethodName || method == pubsubpb.Subscriber_ModifyAckDeadline_FullMethodName
}

func gateStream(ready func() error) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		if err := ready(); err != nil {
			return notReady(err)
		}
		return h(srv, ss)
	}
}
