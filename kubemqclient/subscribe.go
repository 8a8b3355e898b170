package kubemqclient

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/kubemq-io/kubemq-proxy/kubemqpb"
)

// StartMode selects where an events-store subscription starts.
type StartMode int

// Start modes (docs/kubemq.md 5.3). The zero StartPosition is StartNewOnly.
const (
	StartNewOnly     StartMode = iota + 1 // only events published from now on
	StartFromFirst                        // everything still retained
	StartFromLast                         // the last stored event, then new ones
	StartAtSequence                       // from Sequence (> 0)
	StartAtTime                           // from Time
	StartAtTimeDelta                      // the last Delta (whole seconds, rounded up)
)

// StartPosition is a start mode and its value.
type StartPosition struct {
	Mode     StartMode
	Sequence uint64
	Time     time.Time
	Delta    time.Duration
}

// SubscribeOptions configure SubscribeEventsStore.
type SubscribeOptions struct {
	Channel string
	Group   string // optional load-balancing group
	Start   StartPosition
	// ClientID is the identity of the server's durable cursor. Empty means a
	// fresh unique id, so the start position is honoured. Re-using an id
	// resumes that cursor and ignores Start; only one live subscription may
	// hold an id.
	ClientID string
	// Buffer is how many received events are held client-side so the stream
	// is read promptly (the server drops events after a 2 s stall). Default
	// 1024.
	Buffer int
	// AutoResume re-subscribes, with backoff, when the stream breaks with a
	// retryable error, and Recv carries on. Without a Group and ClientID it
	// resumes with a fresh ClientID at StartAtSequence(last received + 1), so
	// nothing is lost or repeated; with a Group the group's cursor decides;
	// with a ClientID, that id's cursor decides.
	AutoResume bool
}

// EventsSubscription is a live events-store subscription. Recv may be
// called from one goroutine at a time.
type EventsSubscription struct {
	c       *Client
	opts    SubscribeOptions
	ch      chan EventReceive
	ctx     context.Context
	cancel  context.CancelFunc
	done    chan struct{} // closed when the reader exits; err is set then
	err     error
	closing atomic.Bool
	resumes atomic.Int64

	mu       sync.Mutex // guards clientID
	clientID string
}

func subscribePB(op string, clientID string, o *SubscribeOptions) (*kubemqpb.Subscribe, error) {
	if err := ValidChannel(o.Channel); err != nil {
		return nil, err
	}
	if o.Group != "" {
		if err := ValidChannel(o.Group); err != nil {
			return nil, err
		}
	}
	s := &kubemqpb.Subscribe{
		SubscribeTypeData: kubemqpb.Subscribe_EventsStore,
		ClientID:          clientID,
		Channel:           o.Channel,
		Group:             o.Group,
	}
	switch o.Start.Mode {
	case 0, StartNewOnly:
		s.EventsStoreTypeData = kubemqpb.Subscribe_StartNewOnly
	case StartFromFirst:
		s.EventsStoreTypeData = kubemqpb.Subscribe_StartFromFirst
	case StartFromLast:
		s.EventsStoreTypeData = kubemqpb.Subscribe_StartFromLast
	case StartAtSequence:
		if o.Start.Sequence == 0 || o.Start.Sequence > 1<<63-1 {
			return nil, invalidArg(op, "StartAtSequence needs a sequence > 0", nil)
		}
		s.EventsStoreTypeData = kubemqpb.Subscribe_StartAtSequence
		s.EventsStoreTypeValue = int64(o.Start.Sequence)
	case StartAtTime:
		if o.Start.Time.UnixNano() <= 0 {
			return nil, invalidArg(op, "StartAtTime needs a time after 1970", nil)
		}
		s.EventsStoreTypeData = kubemqpb.Subscribe_StartAtTime
		s.EventsStoreTypeValue = o.Start.Time.UnixNano()
	case StartAtTimeDelta:
		secs, err := ceilSeconds(op, "Delta", o.Start.Delta)
		if err != nil {
			return nil, err
		}
		if secs == 0 {
			return nil, invalidArg(op, "StartAtTimeDelta needs a positive delta", nil)
		}
		s.EventsStoreTypeData = kubemqpb.Subscribe_StartAtTimeDelta
		s.EventsStoreTypeValue = int64(secs)
	default:
		return nil, invalidArg(op, "unknown start mode", nil)
	}
	return s, nil
}

// SubscribeEventsStore subscribes to an events-store channel. ctx bounds
// only the opening; the subscription lives until Close or Client.Close.
// Server-side refusals (such as a ClientID already in use) are returned by
// Recv. Events within one subscription arrive in sequence order. To resume
// after the last processed sequence n without loss, subscribe with a fresh
// ClientID and StartAtSequence n+1 (AutoResume does this itself).
func (c *Client) SubscribeEventsStore(ctx context.Context, o SubscribeOptions) (*EventsSubscription, error) {
	const op = "SubscribeEventsStore"
	if c.isClosed() {
		return nil, closedErr(op)
	}
	clientID := o.ClientID
	if clientID == "" {
		clientID = c.subscriberID()
	} else if !isVerbatim(clientID) {
		return nil, invalidArg(op, "ClientID must match [A-Za-z0-9-][A-Za-z0-9_-]*", nil)
	}
	req, err := subscribePB(op, clientID, &o)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, wrapErr(op, err)
	}
	if o.Buffer <= 0 {
		o.Buffer = 1024
	}
	s := &EventsSubscription{c: c, opts: o, clientID: clientID, ch: make(chan EventReceive, o.Buffer), done: make(chan struct{})}
	s.ctx, s.cancel = context.WithCancel(c.ctx)
	t := c.startOp()
	stream, err := c.rpc.SubscribeToEvents(s.ctx, req)
	if err != nil {
		s.cancel()
		err = c.observe(wrapErr(op, err))
		t.end(OpSubscribeOpen, err)
		return nil, err
	}
	t.end(OpSubscribeOpen, nil)
	if !c.track(s) {
		s.cancel()
		return nil, closedErr(op)
	}
	c.goTracked(func() { s.run(stream) })
	return s, nil
}

func (c *Client) subscriberID() string { return c.clientID + "-sub-" + c.ids.next() }

// run owns the stream(s): it pumps events into ch and, with AutoResume,
// re-subscribes after retryable failures.
func (s *EventsSubscription) run(stream grpc.ServerStreamingClient[kubemqpb.EventReceive]) {
	defer close(s.done)
	defer close(s.ch)
	var last uint64 // sequence of the last event handed to ch
	backoff := s.c.opts.MinBackoff
	for {
		got, err := s.pump(stream, &last)
		if s.closing.Load() || s.ctx.Err() != nil {
			s.err = closedErr("EventsSubscription")
			return
		}
		s.err = err
		if !s.opts.AutoResume || !(IsRetryable(err) || s.opts.ClientID != "" && errors.Is(err, ErrClientIDInUse)) {
			return
		}
		if got {
			backoff = s.c.opts.MinBackoff
		}
		for {
			t := time.NewTimer(backoff/2 + rand.N(backoff/2+1))
			select {
			case <-s.ctx.Done():
				t.Stop()
				s.err = closedErr("EventsSubscription")
				return
			case <-t.C:
			}
			backoff = min(backoff*2, s.c.opts.MaxBackoff)
			req := s.resumeRequest(last)
			s.c.log.Info("events-store subscription resuming", zap.String("channel", s.opts.Channel),
				zap.String("client_id", req.ClientID), zap.Uint64("after", last), zap.Error(err))
			ot := s.c.startOp()
			stream, err = s.c.rpc.SubscribeToEvents(s.ctx, req)
			if err == nil {
				ot.end(OpSubscribeOpen, nil)
				s.resumes.Add(1)
				break
			}
			err = s.c.observe(wrapErr("EventsSubscription", err))
			ot.end(OpSubscribeOpen, err)
			if !IsRetryable(err) {
				s.err = err
				return
			}
		}
	}
}

// resumeRequest builds the re-subscription after last.
func (s *EventsSubscription) resumeRequest(last uint64) *kubemqpb.Subscribe {
	o := s.opts
	id := o.ClientID
	if id == "" {
		id = s.c.subscriberID()
		if o.Group == "" && last > 0 {
			o.Start = StartPosition{Mode: StartAtSequence, Sequence: last + 1}
		}
	}
	s.mu.Lock()
	s.clientID = id
	s.mu.Unlock()
	req, _ := subscribePB("EventsSubscription", id, &o) // validated at subscribe time
	return req
}

// pump reads one stream until it ends; it reports whether any event came.
func (s *EventsSubscription) pump(stream grpc.ServerStreamingClient[kubemqpb.EventReceive], last *uint64) (bool, error) {
	got := false
	for {
		e, err := stream.Recv()
		if err != nil {
			return got, s.c.observe(wrapErr("EventsSubscription", err))
		}
		s.c.hear()
		got = true
		// After a resume at last+1 nothing older may come again.
		if s.opts.Group == "" && *last > 0 && e.GetSequence() <= *last {
			continue
		}
		select {
		case s.ch <- eventReceiveFromPB(e):
			*last = e.GetSequence()
		case <-s.ctx.Done():
			return got, closedErr("EventsSubscription")
		}
	}
}

// ClientID is the subscription's current ClientID (its durable cursor
// identity); AutoResume may change it.
func (s *EventsSubscription) ClientID() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.clientID
}

// Resumes counts the re-subscriptions AutoResume made.
func (s *EventsSubscription) Resumes() int { return int(s.resumes.Load()) }

// Recv returns the next event. After the stream ends for good it returns
// the buffered events, then the reason.
func (s *EventsSubscription) Recv(ctx context.Context) (EventReceive, error) {
	select {
	case e, ok := <-s.ch:
		if !ok {
			<-s.done
			return EventReceive{}, s.err
		}
		return e, nil
	case <-ctx.Done():
		return EventReceive{}, wrapErr("EventsSubscription", ctx.Err())
	}
}

// Close ends the subscription. The server keeps its durable cursor.
func (s *EventsSubscription) Close() error {
	s.closing.Store(true)
	s.cancel()
	<-s.done
	s.c.untrack(s)
	return nil
}
