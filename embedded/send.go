package embedded

import (
	"context"
	"io"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kubemq-io/kubemq-proxy/kubemqpb"
)

// checkQueueMessage validates a message for sending, in the real server's order (client id,
// name, empty message, then policy limits), plus the name and size checks the real store would
// fail on later.
func (s *Server) checkQueueMessage(m *kubemqpb.QueueMessage) string {
	if m == nil {
		return errInvalidQueueMsg
	}
	if m.ClientID == "" {
		return errClientID
	}
	if e := checkChannel(m.Channel, kindQueue); e != "" {
		return e
	}
	if m.Metadata == "" && len(m.Body) == 0 {
		return errMessageEmpty
	}
	if n := messageSize(m); n > int64(s.opts.MaxMessageBytes) {
		return errTooLarge(int(n), s.opts.MaxMessageBytes)
	}
	if p := m.Policy; p != nil {
		o := &s.opts
		if p.ExpirationSeconds < 0 || int(p.ExpirationSeconds) > o.MaxExpirationSeconds {
			return errExpiration
		}
		if p.DelaySeconds < 0 || int(p.DelaySeconds) > o.MaxDelaySeconds {
			return errDelay
		}
		if p.MaxReceiveCount < 0 || int(p.MaxReceiveCount) > o.MaxReceiveCount {
			return errMaxReceiveCount
		}
		if p.MaxReceiveQueue != "" {
			if e := checkChannel(p.MaxReceiveQueue, kindQueue); e != "" {
				return e + " (MaxReceiveQueue)"
			}
		}
	}
	return ""
}

// storedQueueMessage is a stored queue message with its attributes and policy.
type storedQueueMessage struct {
	msg    kubemqpb.QueueMessage
	attrs  kubemqpb.QueueMessageAttributes
	policy kubemqpb.QueueMessagePolicy
}

// prepareQueue validates m and builds its stored form and result. stored is nil on error.
func (s *Server) prepareQueue(m *kubemqpb.QueueMessage, now time.Time) (res *kubemqpb.SendQueueMessageResult, stored *kubemqpb.QueueMessage) {
	if e := s.checkQueueMessage(m); e != "" {
		res := &kubemqpb.SendQueueMessageResult{IsError: true, Error: e}
		if m != nil {
			res.MessageID = m.MessageID
		}
		return res, nil
	}
	id := m.MessageID
	if id == "" {
		id = nuids.next()
	}
	st := new(storedQueueMessage) // one allocation for the message, its attributes and policy
	p := &st.policy
	if m.Policy != nil {
		p.ExpirationSeconds = m.Policy.ExpirationSeconds
		p.DelaySeconds = m.Policy.DelaySeconds
		p.MaxReceiveCount = m.Policy.MaxReceiveCount
		p.MaxReceiveQueue = m.Policy.MaxReceiveQueue
	}
	if p.MaxReceiveCount == 0 {
		p.MaxReceiveCount = int32(s.opts.MaxReceiveCount)
	}
	ns := now.UnixNano()
	var delayedTo, expAt int64
	if p.DelaySeconds > 0 {
		delayedTo = ns + int64(p.DelaySeconds)*int64(time.Second)
	}
	if p.ExpirationSeconds > 0 {
		expAt = ns + int64(p.DelaySeconds+p.ExpirationSeconds)*int64(time.Second)
	}
	stored = &st.msg
	stored.MessageID, stored.ClientID, stored.Channel, stored.Metadata = id, m.ClientID, m.Channel, m.Metadata
	stored.Body, stored.Tags = m.Body, m.Tags
	st.attrs.ExpirationAt, st.attrs.DelayedTo = expAt, delayedTo
	stored.Attributes, stored.Policy = &st.attrs, p
	return &kubemqpb.SendQueueMessageResult{MessageID: id, SentAt: ns, ExpirationAt: expAt, DelayedTo: delayedTo}, stored
}

// sendQueue validates and stores one message. The result is final except that the caller must
// wait for the returned log position before handing it out.
func (s *Server) sendQueue(m *kubemqpb.QueueMessage, now time.Time) (*kubemqpb.SendQueueMessageResult, uint64) {
	res, stored := s.prepareQueue(m, now)
	if stored == nil {
		return res, 0
	}
	if stored.Attributes.DelayedTo != 0 {
		if e := s.canCreateQueue(stored.Channel); e != "" {
			return refused(res, e), 0
		}
		lsn, ok := s.delays.add(stored)
		if !ok {
			return refusedDelay(res), 0
		}
		return res, lsn
	}
	if e := s.memFull(messageSize(stored), 0); e != "" {
		return refused(res, e), 0
	}
	q, e := s.lockQueue(m.Channel, true)
	if e != "" {
		return refused(res, e), 0
	}
	lsn := q.appendLocked(stored, now.UnixNano())
	q.mu.Unlock()
	return res, lsn
}

// refused turns the result of a message the store refused (a limit) into an error.
func refused(res *kubemqpb.SendQueueMessageResult, e string) *kubemqpb.SendQueueMessageResult {
	return &kubemqpb.SendQueueMessageResult{MessageID: res.MessageID, IsError: true, Error: e}
}

// refusedDelay turns the result of a delayed message that strict mode refused into an error.
func refusedDelay(res *kubemqpb.SendQueueMessageResult) *kubemqpb.SendQueueMessageResult {
	return &kubemqpb.SendQueueMessageResult{MessageID: res.MessageID, IsError: true,
		Error: "strict mode: a message with this MessageID is still delayed; the real server loses one of them (docs/kubemq.md 9.1)"}
}

// durable waits until the log holds everything up to lsn; on failure every result that was not
// already an error becomes one.
func (s *Server) durable(lsn uint64, results ...*kubemqpb.SendQueueMessageResult) {
	if err := s.waitLog(lsn); err != nil {
		for _, r := range results {
			if !r.IsError {
				r.IsError, r.Error, r.SentAt = true, "Error 130: error during send message to queue: "+err.Error(), 0
			}
		}
	}
}

// SendQueueMessage stores one message and answers once it is durable.
func (s *Server) SendQueueMessage(_ context.Context, m *kubemqpb.QueueMessage) (*kubemqpb.SendQueueMessageResult, error) {
	res, lsn := s.sendQueue(m, s.now())
	s.durable(lsn, res)
	return res, nil
}

// sendBatch stores messages in order; consecutive messages for one queue share a lock hold.
func (s *Server) sendBatch(msgs []*kubemqpb.QueueMessage) ([]*kubemqpb.SendQueueMessageResult, bool, uint64) {
	now := s.now()
	ns := now.UnixNano()
	results := make([]*kubemqpb.SendQueueMessageResult, len(msgs))
	var last uint64
	haveErrors := false
	var q *queue
	for i, m := range msgs {
		res, stored := s.prepareQueue(m, now)
		results[i] = res
		if stored == nil {
			haveErrors = true
			continue
		}
		var lsn uint64
		if stored.Attributes.DelayedTo != 0 {
			if e := s.canCreateQueue(stored.Channel); e != "" {
				results[i] = refused(res, e)
				haveErrors = true
				continue
			}
			var ok bool
			if lsn, ok = s.delays.add(stored); !ok {
				results[i] = refusedDelay(res)
				haveErrors = true
				continue
			}
		} else {
			if e := s.memFull(messageSize(stored), 0); e != "" {
				results[i] = refused(res, e)
				haveErrors = true
				continue
			}
			if q == nil || q.name != stored.Channel {
				if q != nil {
					q.mu.Unlock()
					q = nil
				}
				var e string
				if q, e = s.lockQueue(stored.Channel, true); e != "" {
					results[i] = refused(res, e)
					haveErrors = true
					continue
				}
			}
			lsn = q.appendLocked(stored, ns)
		}
		last = max(last, lsn)
	}
	if q != nil {
		q.mu.Unlock()
	}
	return results, haveErrors, last
}

// SendQueueMessagesBatch stores many messages (any queues) and answers once all are durable.
func (s *Server) SendQueueMessagesBatch(_ context.Context, req *kubemqpb.QueueMessagesBatchRequest) (*kubemqpb.QueueMessagesBatchResponse, error) {
	if len(req.Messages) == 0 {
		return nil, status.Error(codes.Unknown, errEmptyBatch)
	}
	results, haveErrors, lsn := s.sendBatch(req.Messages)
	s.durable(lsn, results...)
	for _, r := range results {
		haveErrors = haveErrors || r.IsError
	}
	return &kubemqpb.QueueMessagesBatchResponse{BatchID: req.BatchID, Results: results, HaveErrors: haveErrors}, nil
}

// QueuesUpstream stores each request as one batch. Requests are stored in arrival order; the
// replies are sent as each batch becomes durable (group commit lets many batches share a write).
func (s *Server) QueuesUpstream(stream grpc.BidiStreamingServer[kubemqpb.QueuesUpstreamRequest, kubemqpb.QueuesUpstreamResponse]) error {
	type pending struct {
		res *kubemqpb.QueuesUpstreamResponse
		lsn uint64
	}
	out := make(chan pending, 256)
	sendErr := make(chan error, 1)
	go func() {
		// The only sender on this stream; exits when out is closed.
		var failed error
		for p := range out {
			if failed != nil {
				continue
			}
			s.durable(p.lsn, p.res.Results...)
			if err := stream.Send(p.res); err != nil {
				failed = err
			}
		}
		sendErr <- failed
	}()
	in := receiver(stream.Context(), stream.Recv)
	recvErr := func() error {
		for {
			var r recvd[kubemqpb.QueuesUpstreamRequest]
			select {
			case <-s.ctx.Done():
				return errShutdown()
			case <-stream.Context().Done():
				return stream.Context().Err()
			case r = <-in:
			}
			if r.err != nil {
				return r.err
			}
			req := r.m
			if len(req.Messages) == 0 {
				out <- pending{res: &kubemqpb.QueuesUpstreamResponse{RefRequestID: req.RequestID, IsError: true, Error: errEmptyBatch}}
				continue
			}
			results, _, lsn := s.sendBatch(req.Messages)
			out <- pending{res: &kubemqpb.QueuesUpstreamResponse{RefRequestID: req.RequestID, Results: results}, lsn: lsn}
		}
	}()
	close(out)
	serr := <-sendErr
	if recvErr == io.EOF {
		if serr != nil {
			return serr
		}
		// The real server never ends an upstream stream after the client's half-close
		// (docs/kubemq.md 5.9): a client that waits for the end waits until it cancels.
		return s.awaitStreamEnd(stream.Context())
	}
	return recvErr
}

// awaitStreamEnd holds a stream the client half-closed until the client cancels it or the
// server shuts down, as the real server holds its queue streams.
func (s *Server) awaitStreamEnd(ctx context.Context) error {
	select {
	case <-s.ctx.Done():
		return errShutdown()
	case <-ctx.Done():
		return ctx.Err()
	}
}

// recvd is one result of a stream's Recv.
type recvd[T any] struct {
	m   *T
	err error
}

// receiver runs a stream's Recv loop in its own goroutine so that handlers can also watch the
// server's shutdown. It exits on the first error or when the stream's context ends (which gRPC
// does when the handler returns).
func receiver[T any](ctx context.Context, recv func() (*T, error)) <-chan recvd[T] {
	ch := make(chan recvd[T], 16)
	go func() {
		for {
			m, err := recv()
			select {
			case ch <- recvd[T]{m, err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	return ch
}
