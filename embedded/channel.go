package embedded

import (
	"context"
	"errors"
	"io"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/kubemq-io/kubemq-proxy/kubemqpb"
)

// channelBuffer is how many messages each direction of an in-process
// stream holds before its sender waits (gRPC's flow-control window).
const channelBuffer = 128

// Channel returns a client connection that calls the server's kubemq.kubemq
// handlers in this process: the same service, messages, handlers,
// interceptors, metadata, deadlines, cancellation and status codes as a
// gRPC connection, without HTTP/2 framing or protobuf encoding. Every
// message is copied as it crosses, so neither side sees the other's later
// changes, as with a network in between (SharePayloads relaxes this for
// the payloads a client stores). Use it as kubemqclient.Options.Conn. The
// server's own ServerOptions (e.g. test interceptors) apply only to its
// network listeners. Calls after Stop fail with Unavailable.
func (s *Server) Channel(opts ...ChannelOption) grpc.ClientConnInterface {
	ch := &channel{s: s, req: deep}
	for _, o := range opts {
		o(ch)
	}
	return ch
}

// ChannelOption configures a Channel.
type ChannelOption func(*channel)

// SharePayloads hands the Body and Tags of every Event and QueueMessage the
// client sends to the server as they are, instead of copying them: the
// server keeps them as the stored message. Everything else of a request,
// and every message towards the client, is still copied. The client must
// never change a byte or map entry it has sent, even after a failed call;
// the server never changes a stored message's Body or Tags. Storing a
// message then costs no copy of it before the log's: about a fifth of
// the proxy's CPU per published Pub/Sub message.
func SharePayloads() ChannelOption { return func(ch *channel) { ch.req = deepButPayload } }

type channel struct {
	s   *Server
	req depth // how requests are copied
}

var (
	unaryMethods  = map[string]*grpc.MethodDesc{}
	streamMethods = map[string]*grpc.StreamDesc{}
)

func init() {
	prefix := "/" + kubemqpb.Kubemq_ServiceDesc.ServiceName + "/"
	for i := range kubemqpb.Kubemq_ServiceDesc.Methods {
		m := &kubemqpb.Kubemq_ServiceDesc.Methods[i]
		unaryMethods[prefix+m.MethodName] = m
	}
	for i := range kubemqpb.Kubemq_ServiceDesc.Streams {
		d := &kubemqpb.Kubemq_ServiceDesc.Streams[i]
		streamMethods[prefix+d.StreamName] = d
	}
}

// errChannelClosed is what a call through Channel gets after Stop: what a
// client of a stopped server sees.
func errChannelClosed() error {
	return status.Error(codes.Unavailable, "connection error: embedded server stopped")
}

// channelCalls tracks the handlers running for Channel callers, so Stop can
// wait for them before it closes the store.
type channelCalls struct {
	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup

	abortOnce sync.Once
	aborted   chan struct{} // made by New; closed when Stop gives up waiting: stream sends and receives fail
}

func (c *channelCalls) begin() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false
	}
	c.wg.Add(1)
	return true
}

func (c *channelCalls) close() {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
}

// abort makes every stream handler's blocked send or receive fail with
// Unavailable, as a server's transport closing does.
func (c *channelCalls) abort() { c.abortOnce.Do(func() { close(c.aborted) }) }

// serverContext is what a handler sees: the caller's deadline and
// cancellation, its outgoing metadata as incoming metadata, and none of its
// other values.
func serverContext(ctx context.Context) (context.Context, context.CancelFunc) {
	md, _ := metadata.FromOutgoingContext(ctx)
	sctx, cancel := context.WithCancel(ctx)
	sctx = metadata.NewOutgoingContext(sctx, nil)
	return metadata.NewIncomingContext(sctx, md.Copy()), cancel
}

// begin starts a call's handler side: its context, or why it cannot run.
// The caller of a started call must end it with s.calls.wg.Done.
func (ch *channel) begin(ctx context.Context) (context.Context, context.CancelFunc, error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, status.FromContextError(err).Err()
	}
	if !ch.s.calls.begin() {
		return nil, nil, errChannelClosed()
	}
	sctx, cancel := serverContext(ctx)
	return sctx, cancel, nil
}

func (ch *channel) Invoke(ctx context.Context, method string, args, reply any, _ ...grpc.CallOption) error {
	s := ch.s
	desc, ok := unaryMethods[method]
	if !ok {
		return status.Errorf(codes.Unimplemented, "unknown method %s", method)
	}
	in, err := asMessage(args)
	if err != nil {
		return err
	}
	out, err := asMessage(reply)
	if err != nil {
		return err
	}
	if err := checkSize(in, s.opts.BodyLimit); err != nil {
		return err
	}
	sctx, cancel, err := ch.begin(ctx)
	if err != nil {
		return err
	}
	// As over a network, the caller's deadline or cancellation ends its
	// wait even when the handler does not return in time: the handler runs
	// on its own goroutine with its own copy of the request.
	type result struct {
		resp any
		err  error
	}
	cp := cloneMessage(in, ch.req)
	done := make(chan result, 1)
	go func() {
		defer s.calls.wg.Done()
		defer cancel() // as gRPC: the handler's context ends with the call
		dec := func(m any) error {
			copyMessage(m.(proto.Message), cp, shallow)
			return nil
		}
		resp, err := desc.Handler(s, sctx, dec, s.unaryInt)
		done <- result{resp, err}
	}()
	var r result
	select {
	case r = <-done:
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	}
	if r.err != nil {
		return status.Convert(r.err).Err()
	}
	if err := ctx.Err(); err != nil {
		return status.FromContextError(err).Err()
	}
	rm, err := asMessage(r.resp)
	if err != nil {
		return err
	}
	if err := checkSize(rm, maxGRPCMessage); err != nil {
		return err
	}
	copyMessage(out, rm, deep)
	return nil
}

// checkSize refuses what gRPC would refuse: a message over limit (the
// server's BodyLimit towards the server, 100 MiB towards the client).
func checkSize(m proto.Message, limit int) error {
	if n := sizeHint(m); n > limit {
		if n = proto.Size(m); n > limit {
			return status.Errorf(codes.ResourceExhausted, "grpc: received message larger than max (%d vs. %d)", n, limit)
		}
	}
	return nil
}

func (ch *channel) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, _ ...grpc.CallOption) (grpc.ClientStream, error) {
	s := ch.s
	sd, ok := streamMethods[method]
	if !ok {
		return nil, status.Errorf(codes.Unimplemented, "unknown method %s", method)
	}
	sctx, cancel, err := ch.begin(ctx)
	if err != nil {
		return nil, err
	}
	st := &chanStream{
		req:     ch.req,
		limit:   s.opts.BodyLimit,
		aborted: s.calls.aborted,
		cctx:    ctx,
		sctx:    sctx,
		cancel:  cancel,
		c2s:     make(chan proto.Message, channelBuffer),
		s2c:     make(chan proto.Message, channelBuffer),
		sendEnd: make(chan struct{}),
		hdrSent: make(chan struct{}),
		done:    make(chan struct{}),
	}
	info := &grpc.StreamServerInfo{FullMethod: method, IsClientStream: sd.ClientStreams, IsServerStream: sd.ServerStreams}
	go func() {
		defer s.calls.wg.Done()
		st.finish(s.streamInt(s, (*serverSide)(st), info, sd.Handler))
	}()
	return (*clientSide)(st), nil
}

// chanStream is one in-process stream. Messages travel as private copies
// through c2s and s2c; sendEnd is the client's CloseSend, done the end of
// the handler (err its status).
type chanStream struct {
	req     depth           // how the client's messages are copied
	limit   int             // the server's BodyLimit: the largest message towards it
	aborted <-chan struct{} // the server's forced stop
	cctx    context.Context // the caller's
	sctx    context.Context // the handler's: ends with the caller's or when the handler returns
	cancel  context.CancelFunc

	c2s, s2c chan proto.Message
	sendEnd  chan struct{}
	endOnce  sync.Once

	mu      sync.Mutex
	header  metadata.MD
	trailer metadata.MD
	hdrSent chan struct{}
	hdrOnce sync.Once

	done chan struct{}
	err  error // set before done is closed
}

func (st *chanStream) sendHeader() { st.hdrOnce.Do(func() { close(st.hdrSent) }) }

func (st *chanStream) finish(err error) {
	if err != nil {
		err = status.Convert(err).Err()
	}
	st.err = err
	st.sendHeader()
	close(st.done)
	st.cancel()
}

// clientSide is the caller's end (grpc.ClientStream).
type clientSide chanStream

func (c *clientSide) Context() context.Context { return c.cctx }

func (c *clientSide) Header() (metadata.MD, error) {
	select {
	case <-c.hdrSent:
	case <-c.cctx.Done():
		return nil, status.FromContextError(c.cctx.Err()).Err()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.header.Copy(), nil
}

func (c *clientSide) Trailer() metadata.MD {
	select {
	case <-c.done:
	default:
		return nil // as gRPC: only after RecvMsg has returned an error
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.trailer.Copy()
}

func (c *clientSide) CloseSend() error {
	c.endOnce.Do(func() { close(c.sendEnd) })
	return nil
}

func (c *clientSide) SendMsg(m any) error {
	pm, err := asMessage(m)
	if err != nil {
		return err
	}
	select {
	case <-c.sendEnd:
		return status.Error(codes.Internal, "SendMsg called after CloseSend")
	default:
	}
	if err := checkSize(pm, c.limit); err != nil {
		return err
	}
	cp := cloneMessage(pm, c.req)
	select {
	case c.c2s <- cp:
		return nil
	case <-c.done:
		return io.EOF // as gRPC: the status comes from RecvMsg
	case <-c.cctx.Done():
		return io.EOF
	}
}

func (c *clientSide) RecvMsg(m any) error {
	pm, err := asMessage(m)
	if err != nil {
		return err
	}
	select {
	case r := <-c.s2c:
		copyMessage(pm, r, shallow)
		return nil
	case <-c.done:
		// What the handler sent before it returned comes first.
		if r, ok := pending(c.s2c); ok {
			copyMessage(pm, r, shallow)
			return nil
		}
		if err := c.cctx.Err(); err != nil {
			return status.FromContextError(err).Err() // the caller ended it first
		}
		if c.err != nil {
			return c.err
		}
		return io.EOF
	case <-c.cctx.Done():
		return status.FromContextError(c.cctx.Err()).Err()
	}
}

// serverSide is the handler's end (grpc.ServerStream).
type serverSide chanStream

func (s *serverSide) Context() context.Context { return s.sctx }

func (s *serverSide) SetHeader(md metadata.MD) error {
	select {
	case <-s.hdrSent:
		return errors.New("transport: the stream is done or WriteHeader was already called")
	default:
	}
	s.mu.Lock()
	s.header = metadata.Join(s.header, md)
	s.mu.Unlock()
	return nil
}

func (s *serverSide) SendHeader(md metadata.MD) error {
	if err := s.SetHeader(md); err != nil {
		return err
	}
	(*chanStream)(s).sendHeader()
	return nil
}

func (s *serverSide) SetTrailer(md metadata.MD) {
	s.mu.Lock()
	s.trailer = metadata.Join(s.trailer, md)
	s.mu.Unlock()
}

func (s *serverSide) SendMsg(m any) error {
	pm, err := asMessage(m)
	if err != nil {
		return err
	}
	if err := checkSize(pm, maxGRPCMessage); err != nil {
		return err
	}
	(*chanStream)(s).sendHeader()
	cp := cloneMessage(pm, deep)
	select {
	case s.s2c <- cp:
		return nil
	case <-s.sctx.Done():
		return status.FromContextError(s.sctx.Err()).Err()
	case <-s.aborted:
		return errChannelClosed()
	}
}

func (s *serverSide) RecvMsg(m any) error {
	pm, err := asMessage(m)
	if err != nil {
		return err
	}
	select {
	case r := <-s.c2s:
		copyMessage(pm, r, shallow)
		return nil
	case <-s.sendEnd:
		// What the caller sent before CloseSend comes first.
		if r, ok := pending(s.c2s); ok {
			copyMessage(pm, r, shallow)
			return nil
		}
		return io.EOF
	case <-s.sctx.Done():
		return status.FromContextError(s.sctx.Err()).Err()
	case <-s.aborted:
		return errChannelClosed()
	}
}

func asMessage(m any) (proto.Message, error) {
	pm, ok := m.(proto.Message)
	if !ok {
		return nil, status.Errorf(codes.Internal, "embedded channel: %T is not a protobuf message", m)
	}
	return pm, nil
}

// pending returns a message ch holds, without waiting.
func pending(ch chan proto.Message) (proto.Message, bool) {
	select {
	case r := <-ch:
		return r, true
	default:
		return nil, false
	}
}
