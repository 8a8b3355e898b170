package embedded

import (
	"context"
	"sort"
	"strings"
	"time"

	"google.golang.org/grpc"

	"github.com/kubemq-io/kubemq-proxy/kubemqpb"
)

// waitSeconds turns a WaitTimeSeconds field into a duration: 0 means DefaultWaitSeconds (1 s);
// beyond 0..MaxWaitSeconds (3600) is Error 136.
func (s *Server) waitSeconds(v int32) (time.Duration, string) {
	if v < 0 || int(v) > s.opts.MaxWaitSeconds {
		return 0, errWaitTimeout
	}
	if v == 0 {
		v = int32(s.opts.DefaultWaitSeconds)
	}
	return time.Duration(v) * time.Second, ""
}

// collect takes up to max messages from q, waiting up to wait (or until ctx ends) for the rest.
// It returns the held messages and how many expired ones it met.
func (s *Server) collect(ctx context.Context, q *queue, max int, wait time.Duration) ([]*qmsg, int) {
	now := s.now().UnixNano()
	q.mu.Lock()
	q.consumers++
	q.read = true
	q.lastActive = now
	got, expired, _, moves := q.takeLocked(now, max, maxDeliveryBytes, nil, false)
	var w *waiter
	if len(got) < max && !budgetFull(got) {
		w = &waiter{max: max, maxBytes: maxDeliveryBytes, got: got, done: make(chan struct{})}
		for _, qm := range got {
			w.bytes += qm.cost()
		}
		q.waiters = append(q.waiters, w)
	}
	q.mu.Unlock()
	s.applyMoves(moves, now)
	if w != nil {
		t := time.NewTimer(wait)
		select {
		case <-w.done:
		case <-t.C:
		case <-ctx.Done():
		case <-s.ctx.Done():
		}
		t.Stop()
		q.mu.Lock()
		if !w.full {
			q.removeWaiterLocked(w)
		}
		got = w.got
		q.mu.Unlock()
	}
	q.mu.Lock()
	q.consumers--
	q.lastActive = s.now().UnixNano()
	q.mu.Unlock()
	return got, expired
}

// ReceiveQueueMessages is the simple pull: it consumes what it reads, and returns when it has
// MaxNumberOfMessages or the wait is over. A peek returns at once what is visible.
func (s *Server) ReceiveQueueMessages(ctx context.Context, req *kubemqpb.ReceiveQueueMessagesRequest) (*kubemqpb.ReceiveQueueMessagesResponse, error) {
	id := req.RequestID
	if id == "" {
		id = nuids.next()
	}
	resp := &kubemqpb.ReceiveQueueMessagesResponse{RequestID: id, IsPeak: req.IsPeak}
	fail := func(msg string) (*kubemqpb.ReceiveQueueMessagesResponse, error) {
		resp.IsError, resp.Error = true, msg
		return resp, nil
	}
	if req.ClientID == "" {
		return fail(errClientID)
	}
	if e := checkChannel(req.Channel, kindQueue); e != "" {
		return fail(e)
	}
	if req.MaxNumberOfMessages < 1 || int(req.MaxNumberOfMessages) > s.opts.MaxReceiveMessages {
		return fail(errMaxMessages)
	}
	wait, e := s.waitSeconds(req.WaitTimeSeconds)
	if e != "" {
		return fail(e)
	}
	q, e := s.openQueue(req.Channel)
	if e != "" {
		return fail(e)
	}
	if req.IsPeak {
		now := s.now().UnixNano()
		q.mu.Lock()
		for _, qm := range q.ready[q.head:] {
			if len(resp.Messages) >= int(req.MaxNumberOfMessages) {
				break
			}
			if qm.expiredAt(now) {
				continue
			}
			m, err := s.load(qm)
			if err != nil {
				q.mu.Unlock()
				return fail("Error 121: cannot read messages back from the store: " + err.Error())
			}
			resp.Messages = append(resp.Messages, delivery(m, qm.storedRC()+1))
		}
		q.mu.Unlock()
		resp.MessagesReceived = int32(len(resp.Messages))
		return resp, nil
	}
	got, expired := s.collect(ctx, q, int(req.MaxNumberOfMessages), wait)
	q.mu.Lock()
	if ctx.Err() != nil || s.ctx.Err() != nil {
		// Nobody will read the answer: do not consume.
		q.giveBackLocked(got)
		q.mu.Unlock()
		if s.ctx.Err() != nil {
			return nil, errShutdown()
		}
		return nil, ctx.Err()
	}
	q.mu.Unlock()
	// Read back before settling: a settled record's segment may be deleted.
	shown := make([]int32, len(got))
	for i, qm := range got {
		shown[i] = qm.storedRC() + 1
	}
	msgs, err := s.deliveries(got, shown)
	q.mu.Lock()
	if err != nil {
		q.giveBackLocked(got)
		q.mu.Unlock()
		return fail("Error 121: cannot read messages back from the store: " + err.Error())
	}
	q.settleLocked(got)
	q.mu.Unlock()
	resp.Messages = msgs
	resp.MessagesReceived = int32(len(got))
	resp.MessagesExpired = int32(expired)
	return resp, nil
}

// AckAllQueueMessages purges the queue: it consumes every visible message and whatever arrives
// within the wait. Messages held by a consumer are not touched.
func (s *Server) AckAllQueueMessages(ctx context.Context, req *kubemqpb.AckAllQueueMessagesRequest) (*kubemqpb.AckAllQueueMessagesResponse, error) {
	resp := &kubemqpb.AckAllQueueMessagesResponse{RequestID: req.RequestID}
	fail := func(msg string) (*kubemqpb.AckAllQueueMessagesResponse, error) {
		resp.IsError, resp.Error = true, msg
		return resp, nil
	}
	if req.ClientID == "" {
		return fail(errClientID)
	}
	if e := checkChannel(req.Channel, kindQueue); e != "" {
		return fail(e)
	}
	wait, e := s.waitSeconds(req.WaitTimeSeconds)
	if e != "" {
		return fail(e)
	}
	q, e := s.openQueue(req.Channel)
	if e != "" {
		return fail(e)
	}
	deadline := time.Now().Add(wait)
	var total uint64
	for {
		left := time.Until(deadline)
		if left <= 0 {
			break
		}
		got, expired := s.collect(ctx, q, 1<<30, left)
		q.mu.Lock()
		q.settleLocked(got)
		q.mu.Unlock()
		total += uint64(len(got) + expired)
		if ctx.Err() != nil || s.ctx.Err() != nil {
			break
		}
	}
	resp.AffectedMessages = total
	return resp, nil
}

// QueuesInfo reports per-queue statistics: all queues, or those listed under one of the
// ';'-separated names. As on the real server, a queue is listed under listedName(name), and the
// filter matches that name exactly: a queue whose name begins or ends with one of the trimmed
// characters is found only under its trimmed name, and shares it with others (docs/kubemq.md 5.9).
func (s *Server) QueuesInfo(_ context.Context, req *kubemqpb.QueuesInfoRequest) (*kubemqpb.QueuesInfoResponse, error) {
	var qs []*queue
	s.mu.RLock()
	if req.QueueName == "" {
		for _, q := range s.queues {
			qs = append(qs, q)
		}
	} else {
		seen := map[string]bool{}
		for _, n := range strings.Split(req.QueueName, ";") {
			if !seen[n] {
				seen[n] = true
				qs = append(qs, s.listed[n]...)
			}
		}
	}
	s.mu.RUnlock()
	sort.Slice(qs, func(i, j int) bool { return qs[i].name < qs[j].name })
	info := &kubemqpb.QueuesInfo{}
	for _, q := range qs {
		q.mu.Lock()
		// As on the real server (docs/kubemq.md 5.9): Waiting counts the messages held in open
		// transactions too, and Subscribers stays at 1 once the queue has been read, so
		// neither tells who else reads the queue.
		subs := q.consumers
		if q.read {
			subs = max(subs, 1)
		}
		qi := &kubemqpb.QueueInfo{
			Name: listedName(q.name), Messages: q.count, Bytes: q.bytes, LastSequence: int64(q.lastSeq),
			Sent: q.sent, Delivered: q.delivered, Waiting: q.waitingLocked() + q.held, Subscribers: subs,
		}
		if q.head < len(q.ready) {
			qi.FirstSequence = int64(q.ready[q.head].seq())
		}
		q.mu.Unlock()
		info.Queues = append(info.Queues, qi)
		info.Sent += qi.Sent
		info.Delivered += qi.Delivered
		info.Waiting += qi.Waiting
	}
	info.TotalQueue = int32(len(info.Queues))
	return &kubemqpb.QueuesInfoResponse{RefRequestID: req.RequestID, Info: info}, nil
}

// StreamQueueMessage serves one message per stream with a server-side visibility timer
// (docs/kubemq.md 5.4.3 b). The stream ends after settlement, a wait timeout or a visibility
// expiry.
func (s *Server) StreamQueueMessage(stream grpc.BidiStreamingServer[kubemqpb.StreamQueueMessagesRequest, kubemqpb.StreamQueueMessagesResponse]) error {
	ctx := stream.Context()
	in := receiver(ctx, stream.Recv)
	var (
		q       *queue
		held    *qmsg
		shown   int32
		active  bool
		visT    *time.Timer
		visC    <-chan time.Time
		inOpen  = true
		putBack = func() { // nack the held message: rc+1, DLQ rule
			s.nack(q, []*qmsg{held}, []int32{shown})
			held = nil
		}
	)
	defer func() {
		if visT != nil {
			visT.Stop()
		}
		if held != nil {
			putBack()
		}
	}()
	reply := func(req *kubemqpb.StreamQueueMessagesRequest, m *kubemqpb.QueueMessage, errMsg string) error {
		id := req.RequestID
		if id == "" {
			id = nuids.next()
		}
		return stream.Send(&kubemqpb.StreamQueueMessagesResponse{
			RequestID: id, StreamRequestTypeData: req.StreamRequestTypeData, Message: m,
			IsError: errMsg != "", Error: errMsg,
		})
	}
	for {
		var r recvd[kubemqpb.StreamQueueMessagesRequest]
		var inC <-chan recvd[kubemqpb.StreamQueueMessagesRequest]
		if inOpen {
			inC = in
		}
		select {
		case <-s.ctx.Done():
			return errShutdown()
		case <-ctx.Done():
			return nil
		case <-visC:
			putBack()
			return stream.Send(&kubemqpb.StreamQueueMessagesResponse{
				RequestID: nuids.next(), StreamRequestTypeData: kubemqpb.StreamRequestType_ReceiveMessage,
				IsError: true, Error: errVisExpired,
			})
		case r = <-inC:
		}
		if r.err != nil {
			if held == nil {
				return nil
			}
			// Half-closed while holding: the message stays held until visibility expires.
			inOpen = false
			continue
		}
		req := r.m
		if req.ClientID == "" {
			if err := reply(req, nil, errClientID); err != nil {
				return err
			}
			continue
		}
		switch req.StreamRequestTypeData {
		case kubemqpb.StreamRequestType_ReceiveMessage:
			if active {
				if err := reply(req, nil, errSubActive); err != nil {
					return err
				}
				continue
			}
			if e := checkChannel(req.Channel, kindQueue); e != "" {
				if err := reply(req, nil, e); err != nil {
					return err
				}
				continue
			}
			vis := req.VisibilitySeconds
			if vis < 0 || int(vis) > s.opts.MaxVisibilitySeconds {
				if err := reply(req, nil, errVisibility); err != nil {
					return err
				}
				continue
			}
			if vis == 0 {
				vis = int32(s.opts.DefaultVisibilitySeconds)
			}
			wait, e := s.waitSeconds(req.WaitTimeSeconds)
			if e != "" {
				if err := reply(req, nil, e); err != nil {
					return err
				}
				continue
			}
			if q, e = s.openQueue(req.Channel); e != "" {
				if err := reply(req, nil, e); err != nil {
					return err
				}
				continue
			}
			active = true
			got, _ := s.collect(ctx, q, 1, wait)
			if ctx.Err() != nil || s.ctx.Err() != nil {
				// Ended while waiting: what the wait caught goes back untouched.
				q.mu.Lock()
				q.giveBackLocked(got)
				q.mu.Unlock()
				continue
			}
			if len(got) == 0 {
				return reply(req, nil, errNoNewMessage)
			}
			q.mu.Lock()
			q.consumers++
			q.mu.Unlock()
			defer func(q *queue) {
				q.mu.Lock()
				q.consumers--
				q.mu.Unlock()
			}(q)
			held = got[0]
			shown = held.storedRC() + 1
			visT = time.NewTimer(time.Duration(vis) * time.Second)
			visC = visT.C
			m, lerr := s.load(held)
			if lerr != nil {
				visT.Stop()
				visC = nil
				q.mu.Lock()
				q.giveBackLocked(got)
				q.mu.Unlock()
				held = nil
				if err := reply(req, nil, "Error 121: cannot read messages back from the store: "+lerr.Error()); err != nil {
					return err
				}
				continue
			}
			if err := reply(req, delivery(m, shown), ""); err != nil {
				return err
			}
		case kubemqpb.StreamRequestType_AckMessage, kubemqpb.StreamRequestType_RejectMessage:
			ack := req.StreamRequestTypeData == kubemqpb.StreamRequestType_AckMessage
			if held == nil {
				msg := errNoMsgToAck
				if !ack {
					msg = errNoMsgToReject
				}
				if err := reply(req, nil, msg); err != nil {
					return err
				}
				continue
			}
			if req.RefSequence == 0 || req.RefSequence != held.seq() {
				if err := reply(req, nil, errAckSeq); err != nil {
					return err
				}
				continue
			}
			if ack {
				q.mu.Lock()
				q.settleLocked([]*qmsg{held})
				q.mu.Unlock()
				held = nil
			} else {
				putBack()
			}
			return reply(req, nil, "")
		case kubemqpb.StreamRequestType_ModifyVisibility:
			if held == nil {
				if err := reply(req, nil, errNoMsgToAck); err != nil {
					return err
				}
				continue
			}
			vis := req.VisibilitySeconds
			if vis < 0 || int(vis) > s.opts.MaxVisibilitySeconds {
				if err := reply(req, nil, errVisibility); err != nil {
					return err
				}
				continue
			}
			if vis == 0 {
				vis = int32(s.opts.DefaultVisibilitySeconds)
			}
			visT.Stop()
			visT = time.NewTimer(time.Duration(vis) * time.Second)
			visC = visT.C
			if err := reply(req, nil, ""); err != nil {
				return err
			}
		case kubemqpb.StreamRequestType_ResendMessage:
			if held == nil {
				if err := reply(req, nil, errNoMsgToSend); err != nil {
					return err
				}
				continue
			}
			if e := checkChannel(req.Channel, kindQueue); e != "" {
				if err := reply(req, nil, e); err != nil {
					return err
				}
				continue
			}
			s.moveTo(q, []*qmsg{held}, req.Channel)
			held = nil
			return reply(req, nil, "")
		case kubemqpb.StreamRequestType_SendModifiedMessage:
			if held == nil {
				if err := reply(req, nil, errNoMsgToSend); err != nil {
					return err
				}
				continue
			}
			if req.ModifiedMessage == nil {
				if err := reply(req, nil, errInvalidQueueMsg); err != nil {
					return err
				}
				continue
			}
			res, lsn := s.sendQueue(req.ModifiedMessage, s.now())
			s.durable(lsn, res)
			if res.IsError {
				if err := reply(req, nil, res.Error); err != nil {
					return err
				}
				continue
			}
			q.mu.Lock()
			q.settleLocked([]*qmsg{held})
			q.mu.Unlock()
			held = nil
			return reply(req, nil, "")
		default:
			if err := reply(req, nil, errStreamReqType); err != nil {
				return err
			}
		}
	}
}
