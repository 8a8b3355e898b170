package kubemqclient

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

	"google.golang.org/grpc"

	pb "github.com/kubemq-io/kubemq-proxy/kubemqpb"
)

// VisibleMessage is one message held through StreamQueueMessage with a
// server-side visibility timer. Settle it with exactly one of Ack, Reject,
// Resend or SendModified (the server then ends the stream); ExtendVisibility
// may come before. Close without settling returns the message to the queue
// at once with ReceiveCount+1. Methods are serialised.
type VisibleMessage struct {
	Message QueueMessage

	c      *Client
	stream grpc.BidiStreamingClient[pb.StreamQueueMessagesRequest, pb.StreamQueueMessagesResponse]
	ctx    context.Context // the stream's
	cancel context.CancelFunc
	resps  chan *pb.StreamQueueMessagesResponse // closed when the stream ends
	done   chan struct{}                        // closed when the reader exits; endErr set then
	endErr error

	mu      sync.Mutex // serialises operations; guards settled and expired
	settled bool
	expired error
}

// ReceiveWithVisibility takes one message from channel and holds it for
// visibility (whole seconds, rounded up; 0 = server default of 60 s),
// waiting up to wait (at least 1 s) for one to arrive. With no message in
// time it returns an error matching ErrWaitExpired.
func (c *Client) ReceiveWithVisibility(ctx context.Context, channel string, visibility, wait time.Duration) (*VisibleMessage, error) {
	const op = "ReceiveWithVisibility"
	if c.isClosed() {
		return nil, closedErr(op)
	}
	if err := ValidChannel(channel); err != nil {
		return nil, err
	}
	vs, err := ceilSeconds(op, "visibility", visibility)
	if err != nil {
		return nil, err
	}
	ws, err := waitSeconds(op, wait)
	if err != nil {
		return nil, err
	}
	t := c.startOp()
	v, err := c.receiveWithVisibility(ctx, channel, vs, ws)
	t.end(OpVisibilityReceive, err)
	return v, err
}

func (c *Client) receiveWithVisibility(ctx context.Context, channel string, vs, ws int32) (*VisibleMessage, error) {
	const op = "ReceiveWithVisibility"
	sctx, cancel := context.WithCancel(c.ctx)
	stream, err := c.rpc.StreamQueueMessage(sctx)
	if err != nil {
		cancel()
		return nil, c.observe(wrapErr(op, err))
	}
	v := &VisibleMessage{c: c, stream: stream, ctx: sctx, cancel: cancel,
		resps: make(chan *pb.StreamQueueMessagesResponse, 4), done: make(chan struct{})}
	c.goTracked(v.read)
	id := c.ids.next()
	if err := stream.Send(&pb.StreamQueueMessagesRequest{
		RequestID: id, ClientID: c.clientID, StreamRequestTypeData: pb.StreamRequestType_ReceiveMessage,
		Channel: channel, VisibilitySeconds: vs, WaitTimeSeconds: ws,
	}); err != nil {
		cancel()
		<-v.done
		return nil, c.observe(wrapErr(op, err))
	}
	select {
	case r, ok := <-v.resps:
		if !ok {
			<-v.done
			return nil, v.endErr
		}
		if r.GetIsError() || r.GetMessage() == nil {
			msg := r.GetError()
			if msg == "" {
				msg = "no message in the answer"
			}
			v.finish()
			return nil, inBand(op, msg)
		}
		v.Message = queueMessageFromPB(r.GetMessage())
		if !c.track(v) {
			cancel()
			<-v.done
			return nil, closedErr(op)
		}
		return v, nil
	case <-ctx.Done():
		cancel()
		<-v.done
		return nil, wrapErr(op, ctx.Err())
	}
}

func (v *VisibleMessage) read() {
	defer close(v.done)
	defer close(v.resps)
	for {
		r, err := v.stream.Recv()
		if err != nil {
			if errors.Is(err, context.Canceled) || v.c.ctx.Err() != nil {
				v.endErr = closedErr("VisibleMessage")
			} else if isEOF(err) {
				v.endErr = closedErr("VisibleMessage") // the server ends the stream after settlement
			} else {
				v.endErr = v.c.observe(wrapErr("VisibleMessage", err))
			}
			return
		}
		v.c.hear()
		select {
		case v.resps <- r:
		case <-v.ctx.Done():
			v.endErr = closedErr("VisibleMessage")
			return
		}
	}
}

// finish half-closes and waits for the server to end the stream.
func (v *VisibleMessage) finish() {
	_ = v.stream.CloseSend()
	t := time.NewTimer(v.c.opts.CloseTimeout)
	defer t.Stop()
drain:
	for {
		select {
		case _, ok := <-v.resps:
			if !ok {
				break drain
			}
		case <-t.C:
			break drain
		}
	}
	v.cancel()
	<-v.done
}

// do sends one operation and waits for its answer. An unsolicited answer
// (Error 129, visibility expired) marks the message lost to this holder.
func (v *VisibleMessage) do(ctx context.Context, op, obsOp string, req *pb.StreamQueueMessagesRequest, settles bool) error {
	t := v.c.startOp()
	err := v.exchange(ctx, op, req, settles)
	t.end(obsOp, err)
	return err
}

// exchange is do without the observation.
func (v *VisibleMessage) exchange(ctx context.Context, op string, req *pb.StreamQueueMessagesRequest, settles bool) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.expired != nil {
		return v.expired
	}
	if v.settled {
		return invalidArg(op, "message already settled", nil)
	}
	req.RequestID = v.c.ids.next()
	req.ClientID = v.c.clientID
	// A failed Send means the stream has ended; the reason (such as Error
	// 129) is among the answers still to be read.
	sendErr := v.stream.Send(req)
	for {
		select {
		case r, ok := <-v.resps:
			if !ok {
				<-v.done
				if sendErr == nil && settles && isClosedErr(v.endErr) {
					// The real server sometimes ends the stream without the
					// reply; the settlement was applied (docs/kubemq.md 8.9 e).
					v.settled = true
					return nil
				}
				if sendErr != nil && isClosedErr(v.endErr) {
					return v.c.observe(wrapErr(op, sendErr))
				}
				return v.endErr
			}
			mine := sendErr == nil && (r.GetRequestID() == req.RequestID || r.GetStreamRequestTypeData() == req.StreamRequestTypeData)
			if !mine {
				if r.GetIsError() {
					v.expired = inBand(op, r.GetError())
					return v.expired
				}
				continue
			}
			if r.GetIsError() {
				e := inBand(op, r.GetError())
				if errors.Is(e, ErrVisibilityExpired) {
					v.expired = e
				}
				return e
			}
			if settles {
				v.settled = true
			}
			return nil
		case <-ctx.Done():
			return wrapErr(op, ctx.Err())
		}
	}
}

// Ack deletes the message.
func (v *VisibleMessage) Ack(ctx context.Context) error {
	return v.do(ctx, "Ack", OpVisibilityAck, &pb.StreamQueueMessagesRequest{
		StreamRequestTypeData: pb.StreamRequestType_AckMessage, RefSequence: v.Message.Attributes.Sequence}, true)
}

// Reject returns the message to the tail of its queue as a new copy with
// ReceiveCount+1 (dead-lettered at MaxReceiveCount).
func (v *VisibleMessage) Reject(ctx context.Context) error {
	return v.do(ctx, "Reject", OpVisibilityReject, &pb.StreamQueueMessagesRequest{
		StreamRequestTypeData: pb.StreamRequestType_RejectMessage, RefSequence: v.Message.Attributes.Sequence}, true)
}

// ExtendVisibility restarts the visibility timer at d (a reset, not an
// addition).
func (v *VisibleMessage) ExtendVisibility(ctx context.Context, d time.Duration) error {
	s, err := ceilSeconds("ExtendVisibility", "visibility", d)
	if err != nil {
		return err
	}
	if s == 0 {
		return invalidArg("ExtendVisibility", "visibility must be positive", nil)
	}
	return v.do(ctx, "ExtendVisibility", OpVisibilityExtend, &pb.StreamQueueMessagesRequest{
		StreamRequestTypeData: pb.StreamRequestType_ModifyVisibility, VisibilitySeconds: s}, false)
}

// Resend moves the message to channel (ReceiveCount reset) and acknowledges
// the original.
func (v *VisibleMessage) Resend(ctx context.Context, channel string) error {
	if err := ValidChannel(channel); err != nil {
		return err
	}
	return v.do(ctx, "Resend", OpVisibilityResend, &pb.StreamQueueMessagesRequest{
		StreamRequestTypeData: pb.StreamRequestType_ResendMessage, Channel: channel}, true)
}

// SendModified enqueues m (its own channel and policy) in place of the held
// message and acknowledges the original.
func (v *VisibleMessage) SendModified(ctx context.Context, m QueueMessage) error {
	pm, err := v.c.queueMessageToPB("SendModified", &m)
	if err != nil {
		return err
	}
	return v.do(ctx, "SendModified", OpVisibilitySendModified, &pb.StreamQueueMessagesRequest{
		StreamRequestTypeData: pb.StreamRequestType_SendModifiedMessage, ModifiedMessage: pm}, true)
}

// Close ends the stream. An unsettled message goes back to the queue at once
// (ReceiveCount+1).
func (v *VisibleMessage) Close() error {
	v.mu.Lock()
	settled := v.settled
	v.mu.Unlock()
	if settled {
		v.finish()
	} else {
		v.cancel()
		<-v.done
	}
	v.c.untrack(v)
	return nil
}

func isClosedErr(err error) bool { return errors.Is(err, ErrClosed) }

func isEOF(err error) bool { return errors.Is(err, io.EOF) }
