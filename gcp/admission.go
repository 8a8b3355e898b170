package gcp

import (
	"context"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
)

// Publish admission.
//
// Publishers that outrun KubeMQ would otherwise pile up decoded requests:
// gRPC reads a unary request whole before any handler or interceptor runs,
// and every call a client has in flight (the Go client keeps up to 25 batches
// per CPU) was being decoded and held while it waited for KubeMQ. Thirty-two
// such clients took a proxy past 800 MiB.
//
// Publish is therefore served as a stream handler (the wire is the same: a
// unary call is a stream of one request and one response), which takes a
// place in the publish budget before it reads its request. A call that
// finds the budget spent waits in line (first come, first served) with its
// request unread: its bytes stay in the client or in the stream's HTTP/2
// window (gcp/server.go), which stops the client's sending. Nothing is
// refused, so clients do not back off (the Go client's retry backoff grows
// fourfold per attempt).
//
// The budget counts the encoded size of the requests admitted. A call is
// admitted while the total is under the budget, counted as admitReserve
// until its request is read, then as its real size until it has answered.
// The total may so exceed the budget by the requests being read when it
// filled (at most budget/admitReserve of them).

// admitReserve is what a call counts for while its request is read: the
// Go and Node clients' default batch limit is 1 MB.
const admitReserve = 1 << 20

// publishBudget is the shared budget of the Publish calls in progress.
type publishBudget struct {
	limit int64

	mu      sync.Mutex
	used    int64
	waiters []chan struct{} // in arrival order; closed when admitted
}

func newPublishBudget(limit int64) *publishBudget { return &publishBudget{limit: limit} }

// admit waits until the budget has room and counts admitReserve for the
// caller, or returns ctx's error (and counts nothing).
func (b *publishBudget) admit(ctx context.Context) error {
	b.mu.Lock()
	if len(b.waiters) == 0 && b.used < b.limit {
		b.used += admitReserve
		b.mu.Unlock()
		return nil
	}
	ch := make(chan struct{})
	b.waiters = append(b.waiters, ch)
	b.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	select {
	case <-ch: // admitted as the context ended: give the place back
		b.used -= admitReserve
		b.wakeLocked()
	default:
		for i, w := range b.waiters {
			if w == ch {
				b.waiters = append(b.waiters[:i], b.waiters[i+1:]...)
				break
			}
		}
	}
	return ctx.Err()
}

// add changes the caller's count by delta (negative to give back).
func (b *publishBudget) add(delta int64) {
	b.mu.Lock()
	b.used += delta
	b.wakeLocked()
	b.mu.Unlock()
}

// wakeLocked admits waiters in order while there is room.
func (b *publishBudget) wakeLocked() {
	for len(b.waiters) > 0 && b.used < b.limit {
		close(b.waiters[0])
		b.waiters[0] = nil
		b.waiters = b.waiters[1:]
		b.used += admitReserve
	}
}

// state is the bytes counted and the calls waiting (metrics).
func (b *publishBudget) state() (used int64, waiting int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used, len(b.waiters)
}

// publisherDesc is the Publisher service with Publish served by
// publishStream (see above); every other method stays unary.
func (s *Server) publisherDesc() *grpc.ServiceDesc {
	d := pubsubpb.Publisher_ServiceDesc
	d.Methods = nil
	for _, m := range pubsubpb.Publisher_ServiceDesc.Methods {
		if m.MethodName != "Publish" {
			d.Methods = append(d.Methods, m)
		}
	}
	d.Streams = append([]grpc.StreamDesc{{StreamName: "Publish", Handler: s.publishStream}}, d.Streams...)
	return &d
}

// publishStream admits the call (publishBudget), reads its one request,
// runs it through the unary interceptors and Publish as a unary call would,
// and answers. gRPC does not run stream interceptors for a method that
// streams neither way.
func (s *Server) publishStream(srv any, ss grpc.ServerStream) error {
	ctx := ss.Context()
	if s.pubBudget != nil {
		if err := s.pubBudget.admit(ctx); err != nil {
			err = status.FromContextError(err).Err()
			s.m.rpc(pubsubpb.Publisher_Publish_FullMethodName, status.Code(err))
			return err
		}
	}
	counted := int64(admitReserve)
	defer func() {
		if s.pubBudget != nil {
			s.pubBudget.add(-counted)
		}
	}()
	req := new(pubsubpb.PublishRequest)
	if err := ss.RecvMsg(req); err != nil {
		s.m.rpc(pubsubpb.Publisher_Publish_FullMethodName, rpcCode(err))
		return err
	}
	if s.pubBudget != nil {
		size := int64(proto.Size(req))
		s.pubBudget.add(size - counted)
		counted = size
	}
	info := &grpc.UnaryServerInfo{Server: srv, FullMethod: pubsubpb.Publisher_Publish_FullMethodName}
	resp, err := s.unary(ctx, req, info, func(ctx context.Context, req any) (any, error) {
		return srv.(pubsubpb.PublisherServer).Publish(ctx, req.(*pubsubpb.PublishRequest))
	})
	if err != nil {
		return err
	}
	return ss.SendMsg(resp)
}

// chainUnary is the interceptors ints in order, as grpc.ChainUnaryInterceptor
// runs them; publishStream needs the chain as a value.
func chainUnary(ints ...grpc.UnaryServerInterceptor) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		next := h
		for i := len(ints) - 1; i >= 0; i-- {
			in, nx := ints[i], next
			next = func(ctx context.Context, req any) (any, error) { return in(ctx, req, info, nx) }
		}
		return next(ctx, req)
	}
}
