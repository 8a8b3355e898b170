package kubemqclient

import "time"

// Operation names passed to Options.Observe. They are a small fixed set, so
// they can be metric labels as they are.
//
// The duration runs from the call (after local validation) to the server's
// answer; on the pipelined streams (publish_events, upstream_send,
// downstream_get) from this call's send to its own answer, so it includes
// queueing behind other callers. Receives (downstream_get, receive_queue,
// visibility_receive, ack_all_queue) include the server's wait for
// messages. The server answers downstream settlements only when they fail,
// and later, so downstream_ack, _nack, _requeue and _close_tx time the hand
// to the stream and report only a failed send; their refusals come back in
// downstream_sync's error. The *_open and subscribe_open names time opening
// a stream (a refused subscription shows in its Recv, not here).
const (
	OpPing                   = "ping" // the health loop's pings too
	OpPublishEvents          = "publish_events"
	OpSendQueue              = "send_queue"
	OpSendQueueBatch         = "send_queue_batch"
	OpQueuesInfo             = "queues_info"
	OpAckAllQueue            = "ack_all_queue"
	OpReceiveQueue           = "receive_queue"
	OpUpstreamOpen           = "upstream_open"
	OpUpstreamSend           = "upstream_send"
	OpDownstreamOpen         = "downstream_open"
	OpDownstreamGet          = "downstream_get"
	OpDownstreamAck          = "downstream_ack"      // AckAll, AckRange
	OpDownstreamNack         = "downstream_nack"     // NAckAll, NAckRange
	OpDownstreamRequeue      = "downstream_requeue"  // ReQueueAll, ReQueueRange
	OpDownstreamCloseTx      = "downstream_close_tx" // CloseByClient
	OpDownstreamOffsets      = "downstream_offsets"  // ActiveOffsets
	OpDownstreamSync         = "downstream_sync"
	OpVisibilityReceive      = "visibility_receive"
	OpVisibilityAck          = "visibility_ack"
	OpVisibilityReject       = "visibility_reject"
	OpVisibilityExtend       = "visibility_extend"
	OpVisibilityResend       = "visibility_resend"
	OpVisibilitySendModified = "visibility_send_modified"
	OpSubscribeOpen          = "subscribe_open" // SubscribeEventsStore and each AutoResume
)

var observedOps = []string{
	OpPing, OpPublishEvents, OpSendQueue, OpSendQueueBatch, OpQueuesInfo, OpAckAllQueue, OpReceiveQueue,
	OpUpstreamOpen, OpUpstreamSend, OpDownstreamOpen, OpDownstreamGet, OpDownstreamAck, OpDownstreamNack,
	OpDownstreamRequeue, OpDownstreamCloseTx, OpDownstreamOffsets, OpDownstreamSync, OpVisibilityReceive,
	OpVisibilityAck, OpVisibilityReject, OpVisibilityExtend, OpVisibilityResend, OpVisibilitySendModified,
	OpSubscribeOpen,
}

// ObservedOps returns every operation name Options.Observe may be called
// with.
func ObservedOps() []string { return append([]string(nil), observedOps...) }

// opTimer times one operation for Options.Observe. The zero timer (Observe
// nil) does nothing, so an unobserved client pays one branch per call: no
// clock read, no allocation.
type opTimer struct {
	fn    func(op string, d time.Duration, err error)
	start time.Time
}

// startOp starts timing an operation that is about to reach the server
// (after local validation: refusals that never leave the client are not
// observed).
func (c *Client) startOp() opTimer {
	if c.opts.Observe == nil {
		return opTimer{}
	}
	return opTimer{fn: c.opts.Observe, start: time.Now()}
}

// end reports the operation once; it is meant for the point where the
// server's answer (or the failure) is in hand.
func (t opTimer) end(op string, err error) {
	if t.fn != nil {
		t.fn(op, time.Since(t.start), err)
	}
}

// endBatch is end for a batch call: one that succeeded as a whole but had
// an item refused is reported with the first refusal.
func endBatch[R PublishResult | SendResult](t opTimer, op string, rs []R, err error) {
	if t.fn == nil {
		return
	}
	if err == nil {
		err = FirstError(rs)
	}
	t.fn(op, time.Since(t.start), err)
}
