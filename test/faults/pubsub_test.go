package faults

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// codeLog records the status of every failed gRPC call a Pub/Sub client
// makes (each retry attempt passes through the interceptors), so a run can
// assert what the client saw during a fault. It also feeds the wire trace.
type codeLog struct {
	tag   string // which client: "main" or "stalled"
	trace *wireTrace

	mu     sync.Mutex // guards events
	events []codeEvent
}

type codeEvent struct {
	At     time.Time
	Method string
	Code   codes.Code
	Msg    string
}

func (l *codeLog) record(method string, err error) {
	if err == nil || errors.Is(err, io.EOF) {
		return
	}
	st, _ := status.FromError(err)
	l.mu.Lock()
	l.events = append(l.events, codeEvent{At: time.Now(), Method: method[strings.LastIndex(method, "/")+1:], Code: st.Code(), Msg: st.Message()})
	l.mu.Unlock()
}

func (l *codeLog) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	err := invoker(ctx, method, req, reply, cc, opts...)
	l.record(method, err)
	switch r := req.(type) {
	case *pubsubpb.AcknowledgeRequest:
		l.trace.settled(l.tag, "ack", r.GetAckIds(), err)
	case *pubsubpb.ModifyAckDeadlineRequest:
		l.trace.settled(l.tag, fmt.Sprintf("modack %ds", r.GetAckDeadlineSeconds()), r.GetAckIds(), err)
	}
	return err
}

func (l *codeLog) stream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	cs, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil {
		l.record(method, err)
		return nil, err
	}
	return &observedStream{ClientStream: cs, log: l, method: method}, nil
}

type observedStream struct {
	grpc.ClientStream
	log    *codeLog
	method string
}

func (s *observedStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	s.log.record(s.method, err)
	if r, ok := m.(*pubsubpb.StreamingPullResponse); ok && err == nil {
		s.log.trace.received(s.log.tag, r.GetReceivedMessages())
	}
	return err
}

func (s *observedStream) SendMsg(m any) error {
	err := s.ClientStream.SendMsg(m)
	if r, ok := m.(*pubsubpb.StreamingPullRequest); ok {
		s.log.trace.settled(s.log.tag, "stream ack", r.GetAckIds(), err)
		ids, secs := r.GetModifyDeadlineAckIds(), r.GetModifyDeadlineSeconds()
		for i := range ids {
			if i < len(secs) {
				s.log.trace.settled(s.log.tag, fmt.Sprintf("stream modack %ds", secs[i]), ids[i:i+1], err)
			}
		}
	}
	return err
}

// wireTrace is what the Pub/Sub clients sent and received per message, by
// ledger id, so a lost or late message's history can be reported.
type wireTrace struct {
	onStalled func(id string) // a message reached the stalled client

	mu       sync.Mutex // guards the maps
	start    time.Time
	events   map[string][]string  // ledger id -> timeline
	ackIDs   map[string]string    // ack id -> ledger id
	receipts map[string][]receipt // ledger id -> every time a client read it
}

type receipt struct {
	at  time.Time
	tag string
}

func newWireTrace() *wireTrace {
	return &wireTrace{start: time.Now(), events: map[string][]string{}, ackIDs: map[string]string{}, receipts: map[string][]receipt{}}
}

func (w *wireTrace) received(tag string, ms []*pubsubpb.ReceivedMessage) {
	w.mu.Lock()
	defer w.mu.Unlock()
	at := time.Since(w.start).Round(time.Millisecond)
	for _, m := range ms {
		id := m.GetMessage().GetAttributes()["id"]
		if tag == "stalled" && w.onStalled != nil {
			w.onStalled(id)
		}
		w.ackIDs[m.GetAckId()] = id
		w.receipts[id] = append(w.receipts[id], receipt{time.Now(), tag})
		w.events[id] = append(w.events[id], fmt.Sprintf("%v received by %s client (message_id %s, ack id %s)", at, tag, m.GetMessage().GetMessageId(), m.GetAckId()))
	}
}

func (w *wireTrace) settled(tag, what string, ackIDs []string, err error) {
	if len(ackIDs) == 0 {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	at := time.Since(w.start).Round(time.Millisecond)
	res := "OK"
	if err != nil {
		res = status.Code(err).String()
	}
	for _, a := range ackIDs {
		if id, ok := w.ackIDs[a]; ok {
			w.events[id] = append(w.events[id], fmt.Sprintf("%v %s sent by %s client for ack id %s: %s", at, what, tag, a, res))
		}
	}
}

// Overdue checks that the proxy redelivers what the stalled client lets
// expire: every receipt by it at least within before release must be
// followed by another receipt of the message, by any client, within that
// time. late lists the messages where one was not.
func (w *wireTrace) Overdue(within time.Duration, release time.Time) (due int, late []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for id, rs := range w.receipts {
		bad := false
		for i, r := range rs {
			if r.tag != "stalled" || r.at.Add(within).After(release) {
				continue
			}
			due++
			if i+1 == len(rs) || rs[i+1].at.After(r.at.Add(within)) {
				bad = true
			}
		}
		if bad {
			late = append(late, id)
		}
	}
	sort.Strings(late)
	return due, late
}

// Trace is the timeline of one message (times since the run's start).
func (w *wireTrace) Trace(id string) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.events[id]) == 0 {
		return "    (never received by a client)"
	}
	return "    " + strings.Join(w.events[id], "\n    ")
}

// Between returns the events in [from, to].
func (l *codeLog) Between(from, to time.Time) []codeEvent {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []codeEvent
	for _, e := range l.events {
		if !e.At.Before(from) && !e.At.After(to) {
			out = append(out, e)
		}
	}
	return out
}

// countCodes renders "Unavailable=12 Canceled=1" for the report.
func countCodes(evs []codeEvent) (map[codes.Code]int, string) {
	m := map[codes.Code]int{}
	for _, e := range evs {
		m[e.Code]++
	}
	var parts []string
	for c, n := range m {
		parts = append(parts, fmt.Sprintf("%s=%d", c, n))
	}
	sort.Strings(parts)
	if len(parts) == 0 {
		return m, "none"
	}
	return m, strings.Join(parts, " ")
}

// pubsubLoad is the Pub/Sub side of a run: one topic, one subscription
// (ack deadline 10 s), a paced publisher that checks every result, and a
// Receive loop that acks everything. All with the client's defaults.
type pubsubLoad struct {
	led     *ledger
	codes   *codeLog
	trace   *wireTrace
	addr    string
	client  *pubsub.Client
	project string
	topicID string
	subID   string
	rate    int

	pubCancel context.CancelFunc
	pubDone   chan struct{}
	subCancel context.CancelFunc
	subDone   chan struct{}

	mu          sync.Mutex // guards receiveErrs
	receiveErrs []error    // Receive returned (a non-retryable error): the client did not recover
}

func newPubSubLoad(e *env, rate int) (*pubsubLoad, error) {
	tr := newWireTrace()
	l := &pubsubLoad{led: newLedger("pubsub", "ps"+e.suffix), codes: &codeLog{tag: "main", trace: tr}, trace: tr, addr: e.gcpAddr,
		project: "faults-" + e.suffix, topicID: "faults-topic-" + e.suffix, subID: "faults-sub-" + e.suffix, rate: rate}
	l.led.trace = tr.Trace
	tr.onStalled = l.led.HeldID
	c, err := l.newClient(l.codes)
	if err != nil {
		return nil, err
	}
	l.client = c
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	topic, err := c.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: "projects/" + l.project + "/topics/" + l.topicID})
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("create topic: %w", err)
	}
	if _, err := c.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{
		Name: "projects/" + l.project + "/subscriptions/" + l.subID, Topic: topic.Name, AckDeadlineSeconds: 10,
	}); err != nil {
		c.Close()
		return nil, fmt.Errorf("create subscription: %w", err)
	}
	return l, nil
}

// newClient is a Pub/Sub client with default settings whose calls obs
// observes.
func (l *pubsubLoad) newClient(obs *codeLog) (*pubsub.Client, error) {
	return pubsub.NewClient(context.Background(), l.project,
		option.WithEndpoint(l.addr), option.WithoutAuthentication(),
		option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())),
		option.WithGRPCDialOption(grpc.WithChainUnaryInterceptor(obs.unary)),
		option.WithGRPCDialOption(grpc.WithChainStreamInterceptor(obs.stream)))
}

// Start runs the publisher and the acking subscriber.
func (l *pubsubLoad) Start() {
	pctx, pcancel := context.WithCancel(context.Background())
	sctx, scancel := context.WithCancel(context.Background())
	l.pubCancel, l.subCancel = pcancel, scancel
	l.pubDone, l.subDone = make(chan struct{}), make(chan struct{})
	go l.publish(pctx)
	go l.receive(sctx)
}

func (l *pubsubLoad) publish(ctx context.Context) {
	defer close(l.pubDone)
	pub := l.client.Publisher(l.topicID)
	var results sync.WaitGroup
	pace(ctx, l.rate, func() bool {
		id, body := l.led.Next()
		r := pub.Publish(context.Background(), &pubsub.Message{Data: body, Attributes: map[string]string{"id": id}})
		results.Add(1)
		go func() {
			defer results.Done()
			if _, err := r.Get(context.Background()); err != nil {
				l.led.Failed(id, err)
				return
			}
			l.led.Acked(id)
		}()
		return true
	})
	pub.Stop() // flushes; every result resolves (ack or the client's own timeout)
	results.Wait()
}

func (l *pubsubLoad) receive(ctx context.Context) {
	defer close(l.subDone)
	sub := l.client.Subscriber(l.subID)
	for ctx.Err() == nil {
		err := sub.Receive(ctx, func(_ context.Context, m *pubsub.Message) {
			l.led.Delivered(m.Data, false)
			m.Ack()
		})
		if err != nil {
			l.mu.Lock()
			l.receiveErrs = append(l.receiveErrs, err)
			l.mu.Unlock()
		}
		// An application would log and call Receive again.
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

// Stall starts a second subscriber on the subscription, on a client of its
// own, whose callback blocks for hold without acking, with lease extension
// off (MaxExtension < 0) and a 10 s stream ack deadline, so its messages
// outlive their ack deadline;
// then the callbacks nack and the subscriber stops. It returns when the
// stall is over. Its calls are traced but its codes are not asserted.
func (l *pubsubLoad) Stall(hold time.Duration) error {
	c, err := l.newClient(&codeLog{tag: "stalled", trace: l.trace})
	if err != nil {
		return err
	}
	defer c.Close()
	sub := c.Subscriber(l.subID)
	sub.ReceiveSettings.MaxExtension = -1
	// The stream's own ack deadline (the client's default is 60 s) covers
	// messages the stalled client has not read yet; 10 s like the
	// subscription's.
	sub.ReceiveSettings.MaxDurationPerAckExtension = 10 * time.Second
	// No client-side flow control: the client keeps reading its stream, so
	// every message the proxy sends it is observed (a client that stops
	// reading leaves redeliveries unseen in its transport buffer), and
	// every one of them blocks in a callback.
	sub.ReceiveSettings.MaxOutstandingMessages = -1
	sub.ReceiveSettings.MaxOutstandingBytes = -1
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	release := make(chan struct{})
	errc := make(chan error, 1)
	go func() {
		errc <- sub.Receive(ctx, func(_ context.Context, m *pubsub.Message) {
			l.led.Held(m.Data)
			<-release
			m.Nack()
		})
	}()
	select {
	case <-time.After(hold):
	case err := <-errc:
		return fmt.Errorf("stalled subscriber's Receive ended early: %v", err)
	}
	l.led.Released()
	close(release)
	cancel()
	return <-errc
}

// StopPublishing ends the publisher and waits for every result.
func (l *pubsubLoad) StopPublishing() {
	l.pubCancel()
	<-l.pubDone
}

// Close stops the subscriber and the client.
func (l *pubsubLoad) Close() {
	if l.subCancel != nil {
		l.subCancel()
		<-l.subDone
	}
	l.client.Close()
}

func (l *pubsubLoad) ReceiveErrors() []error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]error(nil), l.receiveErrs...)
}

// pace calls send rate times per second (in 10 ms ticks) until ctx ends
// or send returns false.
func pace(ctx context.Context, rate int, send func() bool) {
	const tick = 10 * time.Millisecond
	t := time.NewTicker(tick)
	defer t.Stop()
	start := time.Now()
	n := 0
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			due := int(now.Sub(start).Seconds() * float64(rate))
			// After a stall (a blocked send) do not burst to catch up.
			if due-n > rate/10+1 {
				n = due - rate/10 - 1
			}
			for ; n < due; n++ {
				if ctx.Err() != nil || !send() {
					return
				}
			}
		}
	}
}
