package kubemqclient

import (
	"context"
	"math"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kubemq-io/kubemq-proxy/kubemqpb"
)

// SendQueueMessage stores one message (synchronously: the server answers
// after the store's acknowledgement). A server-side refusal is returned as
// the error and in the result. With a FailFast ctx it fails at once with
// ErrUnavailable during an outage, and in flight when readiness is lost; the
// message may be stored all the same.
func (c *Client) SendQueueMessage(ctx context.Context, m QueueMessage) (SendResult, error) {
	const op = "SendQueueMessage"
	if c.isClosed() {
		return SendResult{}, closedErr(op)
	}
	pm, err := c.queueMessageToPB(op, &m)
	if err != nil {
		return SendResult{}, err
	}
	ctx, release, err := c.boundToReadiness(op, ctx)
	if err != nil {
		return SendResult{}, err
	}
	defer release()
	t := c.startOp()
	r, err := c.rpc.SendQueueMessage(ctx, pm)
	if err != nil {
		err = c.settleOutage(op, ctx, c.observe(wrapErr(op, err)), 1, m.Channel)
		t.end(OpSendQueue, err)
		return SendResult{}, err
	}
	c.hear()
	sr := sendResultFromPB(op, r)
	t.end(OpSendQueue, sr.Err)
	return sr, sr.Err
}

// SendQueueMessages stores a batch (one SendQueueMessagesBatch call; the
// messages may go to different queues). The whole batch is validated before
// anything is sent. The error is for the call as a whole; per-message
// refusals are in the results, one per message in order (see FirstError).
// A FailFast ctx makes outages fail it fast, as SendQueueMessage.
func (c *Client) SendQueueMessages(ctx context.Context, msgs []QueueMessage) ([]SendResult, error) {
	const op = "SendQueueMessages"
	if c.isClosed() {
		return nil, closedErr(op)
	}
	if len(msgs) == 0 {
		return nil, nil
	}
	pms, err := c.queueMessagesToPB(op, msgs)
	if err != nil {
		return nil, err
	}
	ctx, release, err := c.boundToReadiness(op, ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	var (
		r *kubemqpb.QueueMessagesBatchResponse
		t opTimer
	)
	for {
		t = c.startOp()
		actx, cancel := ctx, context.CancelFunc(func() {})
		if c.opts.SendAttempt > 0 {
			actx, cancel = context.WithTimeout(ctx, c.opts.SendAttempt)
		}
		r, err = c.rpc.SendQueueMessagesBatch(actx, &kubemqpb.QueueMessagesBatchRequest{BatchID: c.ids.next(), Messages: pms})
		// Unanswered within the attempt: its deadline passed here, or the server's copy of
		// it passed first there (the server then answers DeadlineExceeded a moment before
		// the local timer fires) when it was the attempt's, not the caller's.
		unanswered := err != nil && ctx.Err() == nil &&
			(actx.Err() != nil || (status.Code(err) == codes.DeadlineExceeded && attemptFirst(ctx, actx)))
		cancel()
		if err == nil {
			break
		}
		err = c.settleOutage(op, ctx, c.observe(wrapErr(op, err)), len(msgs), msgs[0].Channel)
		t.end(OpSendQueueBatch, err)
		if !unanswered || !c.ready.Load() {
			return nil, err
		}
		c.sendRetries.Add(1)
		c.log.Warn("kubemq left a send unanswered; sending it again", zap.Int("messages", len(msgs)),
			zap.String("channel", msgs[0].Channel), zap.Duration("attempt", c.opts.SendAttempt))
	}
	c.hear()
	rs, err := c.sendResults(op, len(msgs), r.GetResults())
	endBatch(t, OpSendQueueBatch, rs, err)
	return rs, err
}

// attemptFirst reports whether attempt (derived from ctx) ends before ctx does.
func attemptFirst(ctx, attempt context.Context) bool {
	a, ok := attempt.Deadline()
	if !ok {
		return false
	}
	d, ok := ctx.Deadline()
	return !ok || a.Before(d)
}

func (c *Client) queueMessagesToPB(op string, msgs []QueueMessage) ([]*kubemqpb.QueueMessage, error) {
	pms := make([]*kubemqpb.QueueMessage, len(msgs))
	for i := range msgs {
		pm, err := c.queueMessageToPB(op, &msgs[i])
		if err != nil {
			return nil, err
		}
		pms[i] = pm
	}
	return pms, nil
}

// sendResults converts a batch's results, which must be one per message.
func (c *Client) sendResults(op string, n int, rs []*kubemqpb.SendQueueMessageResult) ([]SendResult, error) {
	if len(rs) != n {
		return nil, &Error{Op: op, Msg: "server returned " + itoa(len(rs)) + " results for " + itoa(n) + " messages"}
	}
	out := make([]SendResult, n)
	for i, r := range rs {
		out[i] = sendResultFromPB(op, r)
	}
	return out, nil
}

// QueuesInfo returns statistics for the named queues, or for every queue
// when no name is given. Find a named queue's entry with QueuesInfo.Lookup:
// the real server lists some names altered (ListedQueueName).
func (c *Client) QueuesInfo(ctx context.Context, names ...string) (QueuesInfo, error) {
	const op = "QueuesInfo"
	if c.isClosed() {
		return QueuesInfo{}, closedErr(op)
	}
	for _, n := range names {
		if err := ValidChannel(n); err != nil {
			return QueuesInfo{}, err
		}
	}
	// Ask for each name as it is and as the server lists it (ListedQueueName), so Lookup finds
	// the queue whichever way the server names it.
	filter := make([]string, 0, 2*len(names))
	for _, n := range names {
		filter = append(filter, n)
		if l := ListedQueueName(n); l != n && l != "" {
			filter = append(filter, l)
		}
	}
	t := c.startOp()
	r, err := c.rpc.QueuesInfo(ctx, &kubemqpb.QueuesInfoRequest{RequestID: c.ids.next(), QueueName: strings.Join(filter, ";")})
	if err != nil {
		err = c.observe(wrapErr(op, err))
		t.end(OpQueuesInfo, err)
		return QueuesInfo{}, err
	}
	t.end(OpQueuesInfo, nil)
	return queuesInfoFromPB(r.GetInfo()), nil
}

// AckAllQueueMessages purges channel: it consumes everything that becomes
// available within wait (at least 1 s) and returns the count.
func (c *Client) AckAllQueueMessages(ctx context.Context, channel string, wait time.Duration) (uint64, error) {
	const op = "AckAllQueueMessages"
	if c.isClosed() {
		return 0, closedErr(op)
	}
	if err := ValidChannel(channel); err != nil {
		return 0, err
	}
	ws, err := waitSeconds(op, wait)
	if err != nil {
		return 0, err
	}
	t := c.startOp()
	r, err := c.rpc.AckAllQueueMessages(ctx, &kubemqpb.AckAllQueueMessagesRequest{
		RequestID: c.ids.next(), ClientID: c.clientID, Channel: channel, WaitTimeSeconds: ws,
	})
	if err == nil && r.GetIsError() {
		err = inBand(op, r.GetError())
	} else if err != nil {
		err = c.observe(wrapErr(op, err))
	}
	t.end(OpAckAllQueue, err)
	if err != nil {
		return 0, err
	}
	return r.GetAffectedMessages(), nil
}

// ReceiveResult is what ReceiveQueueMessages returns.
type ReceiveResult struct {
	Messages []QueueMessage
	Expired  int // expired messages met and dropped by the server
}

// ReceiveQueueMessages is the simple pull: it consumes on read (at most
// once; no ack step), or only looks when peek is set. It returns when max
// messages are in hand or after wait (at least 1 s).
func (c *Client) ReceiveQueueMessages(ctx context.Context, channel string, max int, wait time.Duration, peek bool) (ReceiveResult, error) {
	const op = "ReceiveQueueMessages"
	if c.isClosed() {
		return ReceiveResult{}, closedErr(op)
	}
	if err := ValidChannel(channel); err != nil {
		return ReceiveResult{}, err
	}
	if max < 1 || max > math.MaxInt32 {
		return ReceiveResult{}, invalidArg(op, "max must be at least 1", nil)
	}
	ws, err := waitSeconds(op, wait)
	if err != nil {
		return ReceiveResult{}, err
	}
	t := c.startOp()
	r, err := c.rpc.ReceiveQueueMessages(ctx, &kubemqpb.ReceiveQueueMessagesRequest{
		RequestID: c.ids.next(), ClientID: c.clientID, Channel: channel,
		MaxNumberOfMessages: int32(max), WaitTimeSeconds: ws, IsPeak: peek,
	})
	if err == nil && r.GetIsError() {
		err = inBand(op, r.GetError())
	} else if err != nil {
		err = c.observe(wrapErr(op, err))
	}
	t.end(OpReceiveQueue, err)
	if err != nil {
		return ReceiveResult{}, err
	}
	res := ReceiveResult{Expired: int(r.GetMessagesExpired())}
	for _, m := range r.GetMessages() {
		res.Messages = append(res.Messages, queueMessageFromPB(m))
	}
	return res, nil
}

// waitSeconds converts a wait to whole seconds for the unary receive calls,
// rounding up, with the server's 1 s minimum.
func waitSeconds(op string, wait time.Duration) (int32, error) {
	s, err := ceilSeconds(op, "wait", wait)
	if err != nil {
		return 0, err
	}
	return max(s, 1), nil
}

func itoa(n int) string { return strconv.Itoa(n) }
