package kubemqclient

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pb "github.com/kubemq-io/kubemq-proxy/kubemqpb"
)

// fake is a scripted KubeMQ server for the client behaviours the real
// servers cannot be made to show on demand (outages, out-of-order answers,
// requests in flight during Close).
type fake struct {
	pb.UnimplementedKubemqServer
	upstream   func(grpc.BidiStreamingServer[pb.QueuesUpstreamRequest, pb.QueuesUpstreamResponse]) error
	downstream func(grpc.BidiStreamingServer[pb.QueuesDownstreamRequest, pb.QueuesDownstreamResponse]) error
	events     func(grpc.BidiStreamingServer[pb.Event, pb.Result]) error
	auth       chan string // if set, receives the authorization metadata of each Ping
	subscribe  func(*pb.Subscribe, grpc.ServerStreamingServer[pb.EventReceive]) error
	sendBatch  func(context.Context, *pb.QueueMessagesBatchRequest) (*pb.QueueMessagesBatchResponse, error)

	srv  *grpc.Server
	addr string
	done chan struct{}
}

func (f *fake) Ping(ctx context.Context, _ *pb.Empty) (*pb.PingResult, error) {
	if f.auth != nil {
		md, _ := metadata.FromIncomingContext(ctx)
		select {
		case f.auth <- strings.Join(md.Get("authorization"), ","):
		default:
		}
	}
	return &pb.PingResult{Host: "fake", Version: "v0", ServerStartTime: 1}, nil
}

func (f *fake) QueuesUpstream(s grpc.BidiStreamingServer[pb.QueuesUpstreamRequest, pb.QueuesUpstreamResponse]) error {
	return f.upstream(s)
}

func (f *fake) QueuesDownstream(s grpc.BidiStreamingServer[pb.QueuesDownstreamRequest, pb.QueuesDownstreamResponse]) error {
	return f.downstream(s)
}

func (f *fake) SubscribeToEvents(r *pb.Subscribe, s grpc.ServerStreamingServer[pb.EventReceive]) error {
	if f.subscribe == nil {
		return status.Error(codes.Unimplemented, "no SubscribeToEvents")
	}
	return f.subscribe(r, s)
}

func (f *fake) SendQueueMessagesBatch(ctx context.Context, r *pb.QueueMessagesBatchRequest) (*pb.QueueMessagesBatchResponse, error) {
	if f.sendBatch == nil {
		return nil, status.Error(codes.Unimplemented, "no SendQueueMessagesBatch")
	}
	return f.sendBatch(ctx, r)
}

func (f *fake) SendEventsStream(s grpc.BidiStreamingServer[pb.Event, pb.Result]) error {
	return f.events(s)
}

// start serves f on addr ("127.0.0.1:0" for a fresh port).
func (f *fake) start(t *testing.T, addr string) {
	t.Helper()
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	f.addr = lis.Addr().String()
	f.srv = grpc.NewServer()
	pb.RegisterKubemqServer(f.srv, f)
	f.done = make(chan struct{})
	go func() {
		defer close(f.done)
		_ = f.srv.Serve(lis)
	}()
	t.Cleanup(f.stop)
}

func (f *fake) stop() {
	f.srv.Stop()
	<-f.done
}

func dialFake(t *testing.T, f *fake, o Options) *Client {
	t.Helper()
	o.Address = f.addr
	o.Logger = zaptest.NewLogger(t)
	c, err := Dial(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	return c
}

func within(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func nextState(t *testing.T, ch <-chan bool) bool {
	t.Helper()
	select {
	case up := <-ch:
		return up
	case <-time.After(10 * time.Second):
		t.Fatal("no readiness change")
		return false
	}
}

func TestReadinessFollowsServer(t *testing.T) {
	f := &fake{}
	f.start(t, "127.0.0.1:0")
	c := dialFake(t, f, Options{PingInterval: 20 * time.Millisecond, MinBackoff: 10 * time.Millisecond, MaxBackoff: 40 * time.Millisecond})
	states := c.StateChanges()
	if !nextState(t, states) {
		t.Fatal("initial state not ready")
	}
	hook := make(chan bool, 10)
	remove := c.OnStateChange(func(up bool) { hook <- up })
	defer remove()

	f.stop()
	if nextState(t, states) || <-hook {
		t.Fatal("still ready after the server stopped")
	}
	if c.Ready() {
		t.Fatal("Ready() true while down")
	}
	if _, err := c.QueuesInfo(within(t, time.Second)); !errors.Is(err, ErrUnavailable) || !IsRetryable(err) {
		t.Fatalf("call while down: %v", err)
	}
	f.start(t, f.addr)
	if !nextState(t, states) || !<-hook {
		t.Fatal("not ready after the server came back")
	}
	if err := c.WaitReady(within(t, time.Second)); err != nil {
		t.Fatal(err)
	}
	_ = c.Close()
	if _, ok := <-states; ok {
		t.Fatal("StateChanges not closed by Close")
	}
	if err := c.WaitReady(within(t, time.Second)); !errors.Is(err, ErrClosed) {
		t.Fatalf("WaitReady after Close: %v", err)
	}
}

func TestAuthTokenSent(t *testing.T) {
	f := &fake{auth: make(chan string, 1)}
	f.start(t, "127.0.0.1:0")
	dialFake(t, f, Options{AuthToken: "secret"})
	if got := <-f.auth; got != "secret" {
		t.Fatalf("authorization metadata %q", got)
	}
}

func TestDialOptions(t *testing.T) {
	if _, err := Dial(context.Background(), Options{}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("empty address: %v", err)
	}
	if _, err := Dial(context.Background(), Options{Address: "x:1", ClientID: "a.b"}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("bad ClientID: %v", err)
	}
}

// TestValidationSendsNothing points the client at a closed port: a refusal
// that reached the network would be Unavailable, not InvalidArgument.
func TestValidationSendsNothing(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	c, err := Dial(context.Background(), Options{Address: addr, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := within(t, 5*time.Second)
	bad := "a/b"
	check := func(name string, err error) {
		t.Helper()
		if !errors.Is(err, ErrInvalidArgument) || IsRetryable(err) {
			t.Errorf("%s: %v", name, err)
		}
	}
	_, err = c.SendQueueMessage(ctx, QueueMessage{Channel: bad, Body: []byte("x")})
	check("SendQueueMessage", err)
	_, err = c.SendQueueMessage(ctx, QueueMessage{Channel: "ok"})
	check("empty message", err)
	_, err = c.SendQueueMessage(ctx, QueueMessage{Channel: "ok", Body: []byte("x"), Policy: QueuePolicy{MaxReceiveQueue: bad}})
	check("bad dead-letter queue", err)
	_, err = c.SendQueueMessage(ctx, QueueMessage{Channel: "ok", Body: []byte("x"), Policy: QueuePolicy{Delay: -time.Second}})
	check("negative delay", err)
	_, err = c.SendQueueMessages(ctx, []QueueMessage{{Channel: "ok", Body: []byte("x")}, {Channel: bad, Body: []byte("x")}})
	check("SendQueueMessages", err)
	_, err = c.PublishEvents(ctx, []Event{{Channel: "ok", Body: []byte("x")}, {Channel: bad, Body: []byte("x")}})
	check("PublishEvents", err)
	_, err = c.SubscribeEventsStore(ctx, SubscribeOptions{Channel: bad})
	check("SubscribeEventsStore", err)
	_, err = c.SubscribeEventsStore(ctx, SubscribeOptions{Channel: "ok", Group: "a b"})
	check("bad group", err)
	_, err = c.SubscribeEventsStore(ctx, SubscribeOptions{Channel: "ok", Start: StartPosition{Mode: StartAtSequence}})
	check("sequence 0", err)
	_, err = c.SubscribeEventsStore(ctx, SubscribeOptions{Channel: "ok", ClientID: "a:b"})
	check("bad ClientID", err)
	_, err = c.QueuesInfo(ctx, "ok", bad)
	check("QueuesInfo", err)
	_, err = c.AckAllQueueMessages(ctx, bad, time.Second)
	check("AckAllQueueMessages", err)
	_, err = c.ReceiveQueueMessages(ctx, bad, 1, time.Second, false)
	check("ReceiveQueueMessages", err)
	_, err = c.ReceiveQueueMessages(ctx, "ok", 0, time.Second, false)
	check("max 0", err)
	_, err = c.ReceiveWithVisibility(ctx, bad, time.Second, time.Second)
	check("ReceiveWithVisibility", err)
}

func TestUpstreamMatchesOutOfOrderResponses(t *testing.T) {
	f := &fake{upstream: func(s grpc.BidiStreamingServer[pb.QueuesUpstreamRequest, pb.QueuesUpstreamResponse]) error {
		for {
			var reqs []*pb.QueuesUpstreamRequest
			for len(reqs) < 2 {
				r, err := s.Recv()
				if err != nil {
					return nil
				}
				reqs = append(reqs, r)
			}
			// Answer in reverse order.
			for i := len(reqs) - 1; i >= 0; i-- {
				resp := &pb.QueuesUpstreamResponse{RefRequestID: reqs[i].RequestID}
				for _, m := range reqs[i].Messages {
					resp.Results = append(resp.Results, &pb.SendQueueMessageResult{MessageID: string(m.Body), SentAt: 1})
				}
				if err := s.Send(resp); err != nil {
					return err
				}
			}
		}
	}}
	f.start(t, "127.0.0.1:0")
	c := dialFake(t, f, Options{})
	up, err := c.OpenUpstream(within(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	var wg sync.WaitGroup
	for _, b := range []string{"a", "b", "c", "d"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rs, err := up.Send(within(t, 5*time.Second), []QueueMessage{{Channel: "q", Body: []byte(b)}, {Channel: "q", Body: []byte(b + "2")}})
			if err != nil || len(rs) != 2 || rs[0].MessageID != b || rs[1].MessageID != b+"2" {
				t.Errorf("send %s: %v %+v", b, err, rs)
			}
		}()
	}
	wg.Wait()
}

// dsScript answers downstream requests from a test-controlled function and
// records every request it reads.
type dsScript struct {
	mu   sync.Mutex
	reqs []*pb.QueuesDownstreamRequest
	eof  chan struct{} // closed when the client has ended the stream
}

func (d *dsScript) types() []pb.QueuesDownstreamRequestType {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []pb.QueuesDownstreamRequestType
	for _, r := range d.reqs {
		out = append(out, r.RequestTypeData)
	}
	return out
}

func (d *dsScript) serve(answer func(*pb.QueuesDownstreamRequest) *pb.QueuesDownstreamResponse) func(grpc.BidiStreamingServer[pb.QueuesDownstreamRequest, pb.QueuesDownstreamResponse]) error {
	d.eof = make(chan struct{})
	return func(s grpc.BidiStreamingServer[pb.QueuesDownstreamRequest, pb.QueuesDownstreamResponse]) error {
		for {
			r, err := s.Recv()
			if err != nil {
				// The client ended the stream: a half-close (EOF) or, as Close does, a cancel.
				close(d.eof)
				if err == io.EOF {
					return nil
				}
				return err
			}
			d.mu.Lock()
			d.reqs = append(d.reqs, r)
			d.mu.Unlock()
			if resp := answer(r); resp != nil {
				resp.RefRequestId = r.RequestID
				resp.RequestTypeData = r.RequestTypeData
				if err := s.Send(resp); err != nil {
					return err
				}
			}
		}
	}
}

func msgs(seqs ...uint64) []*pb.QueueMessage {
	var out []*pb.QueueMessage
	for _, s := range seqs {
		out = append(out, &pb.QueueMessage{Channel: "q", Body: []byte("x"), Attributes: &pb.QueueMessageAttributes{Sequence: s, ReceiveCount: 1}})
	}
	return out
}

func TestDownstreamCloseIsClean(t *testing.T) {
	release := make(chan struct{})
	var script dsScript
	n := 0
	f := &fake{downstream: script.serve(func(r *pb.QueuesDownstreamRequest) *pb.QueuesDownstreamResponse {
		switch r.RequestTypeData {
		case pb.QueuesDownstreamRequestType_Get:
			n++
			if n == 2 {
				<-release // a Get still waiting when Close starts
			}
			// The server repeats a sequence (docs/kubemq.md 8.8).
			return &pb.QueuesDownstreamResponse{TransactionId: "T" + string(rune('0'+n)), Messages: msgs(uint64(2*n-1), uint64(2*n), uint64(2*n))}
		case pb.QueuesDownstreamRequestType_ActiveOffsets:
			return &pb.QueuesDownstreamResponse{TransactionId: r.RefTransactionId, IsError: true, Error: "cannot get active offsets with closed response "}
		}
		return nil
	})}
	f.start(t, "127.0.0.1:0")
	c := dialFake(t, f, Options{})
	ds, err := c.OpenDownstream(within(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	tx, err := ds.Get(within(t, 5*time.Second), GetRequest{Channel: "q", MaxItems: 3})
	if err != nil || tx.ID != "T1" || len(tx.Messages) != 2 {
		t.Fatalf("Get: %v %+v", err, tx)
	}
	got2 := make(chan *Transaction, 1)
	go func() {
		tx, err := ds.Get(within(t, 5*time.Second), GetRequest{Channel: "q", MaxItems: 3})
		if err != nil {
			t.Error(err)
		}
		got2 <- tx
	}()
	waitUntil(t, func() bool { return len(script.types()) == 2 })
	closed := make(chan error, 1)
	go func() { closed <- ds.Close() }()
	select {
	case err := <-closed:
		t.Fatalf("Close returned with a Get outstanding: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	if _, err := ds.Get(within(t, time.Second), GetRequest{Channel: "q", MaxItems: 1}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Get while closing: %v", err)
	}
	close(release)
	if err := <-closed; err != nil {
		t.Fatalf("Close: %v", err)
	}
	if tx := <-got2; tx == nil || tx.ID != "T2" {
		t.Fatalf("outstanding Get: %+v", tx)
	}
	<-script.eof
	G, AO, CBC := pb.QueuesDownstreamRequestType_Get, pb.QueuesDownstreamRequestType_ActiveOffsets, pb.QueuesDownstreamRequestType_CloseByClient
	want := []pb.QueuesDownstreamRequestType{G, G, AO, CBC, CBC, AO}
	if got := script.types(); !equalTypes(got, want) {
		t.Fatalf("requests %v, want %v", got, want)
	}
}

func equalTypes(a, b []pb.QueuesDownstreamRequestType) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// waitUntil polls a fake's recorded state, which has no signal to await.
func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestDownstreamAbandonedGetClosesTransaction(t *testing.T) {
	release := make(chan struct{})
	var script dsScript
	f := &fake{downstream: script.serve(func(r *pb.QueuesDownstreamRequest) *pb.QueuesDownstreamResponse {
		switch r.RequestTypeData {
		case pb.QueuesDownstreamRequestType_Get:
			<-release
			return &pb.QueuesDownstreamResponse{TransactionId: "T1", Messages: msgs(1)}
		case pb.QueuesDownstreamRequestType_ActiveOffsets:
			return &pb.QueuesDownstreamResponse{IsError: true, Error: "cannot get active offsets with closed response"}
		}
		return nil
	})}
	f.start(t, "127.0.0.1:0")
	c := dialFake(t, f, Options{})
	ds, err := c.OpenDownstream(within(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer ds.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := ds.Get(ctx, GetRequest{Channel: "q", MaxItems: 1}); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Get: %v", err)
	}
	close(release)
	waitUntil(t, func() bool { return len(script.types()) == 2 })
	if got := script.types()[1]; got != pb.QueuesDownstreamRequestType_CloseByClient {
		t.Fatalf("after an abandoned Get the client sent %v", got)
	}
	if len(ds.OpenTransactions()) != 0 {
		t.Fatal("abandoned transaction still open")
	}
}

func TestDownstreamSettlementFailures(t *testing.T) {
	var script dsScript
	f := &fake{downstream: script.serve(func(r *pb.QueuesDownstreamRequest) *pb.QueuesDownstreamResponse {
		switch r.RequestTypeData {
		case pb.QueuesDownstreamRequestType_Get:
			return &pb.QueuesDownstreamResponse{TransactionId: "T1", Messages: msgs(1, 2, 3)}
		case pb.QueuesDownstreamRequestType_AckRange:
			if len(r.SequenceRange) != 2 {
				return &pb.QueuesDownstreamResponse{TransactionId: r.RefTransactionId, IsError: true, Error: "repeated"}
			}
			return &pb.QueuesDownstreamResponse{TransactionId: r.RefTransactionId, IsError: true, Error: "invalid ack sequence id 9"}
		case pb.QueuesDownstreamRequestType_ActiveOffsets:
			return &pb.QueuesDownstreamResponse{TransactionId: r.RefTransactionId, ActiveOffsets: []int64{3}}
		}
		return nil // silent success
	})}
	f.start(t, "127.0.0.1:0")
	c := dialFake(t, f, Options{})
	ds, err := c.OpenDownstream(within(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer ds.Close()
	tx, err := ds.Get(within(t, 5*time.Second), GetRequest{Channel: "q", MaxItems: 3})
	if err != nil {
		t.Fatal(err)
	}
	if err := ds.NAckRange(tx.ID, []uint64{1}); err != nil {
		t.Fatal(err)
	}
	if err := ds.AckRange(tx.ID, []uint64{9, 2, 9}); err != nil { // repeats are sent once
		t.Fatal(err)
	}
	err = ds.Sync(within(t, 5*time.Second), tx.ID)
	var ke *Error
	if !errors.As(err, &ke) || !errors.Is(err, ErrInvalidSequence) || ke.TxID != "T1" || ke.Op != "AckRange" {
		t.Fatalf("Sync: %v", err)
	}
	select {
	case e := <-ds.Errors():
		if !errors.Is(e, ErrInvalidSequence) {
			t.Fatalf("Errors(): %v", e)
		}
	default:
		t.Fatal("Errors() empty")
	}
	if err := ds.Sync(within(t, 5*time.Second), tx.ID); err != nil {
		t.Fatalf("second Sync reports old failures: %v", err)
	}
	if err := ds.AckRange(tx.ID, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ds.Get(within(t, time.Second), GetRequest{Channel: "q", MaxItems: 0}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("MaxItems 0: %v", err)
	}
	if n := ds.Gets(); n != 1 {
		t.Fatalf("Gets() = %d, want 1", n)
	}
}

func TestDownstreamBrokenStream(t *testing.T) {
	var script dsScript
	f := &fake{downstream: script.serve(func(r *pb.QueuesDownstreamRequest) *pb.QueuesDownstreamResponse { return nil })}
	f.downstream = func(s grpc.BidiStreamingServer[pb.QueuesDownstreamRequest, pb.QueuesDownstreamResponse]) error {
		if _, err := s.Recv(); err != nil {
			return err
		}
		return status.Error(codes.Unavailable, "error reading from server: EOF")
	}
	f.start(t, "127.0.0.1:0")
	c := dialFake(t, f, Options{})
	ds, err := c.OpenDownstream(within(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	_, err = ds.Get(within(t, 5*time.Second), GetRequest{Channel: "q", MaxItems: 1})
	if !errors.Is(err, ErrUnavailable) || !IsRetryable(err) {
		t.Fatalf("Get on a broken stream: %v", err)
	}
	<-ds.Done()
	if !errors.Is(ds.Err(), ErrUnavailable) {
		t.Fatalf("Err: %v", ds.Err())
	}
	if err := ds.AckAll("T"); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("AckAll on a dead stream: %v", err)
	}
	if err := ds.Close(); err == nil {
		t.Fatal("Close of a broken stream reported clean")
	}
}

func TestPublisherReopensAndMatches(t *testing.T) {
	var mu sync.Mutex
	streams := 0
	f := &fake{events: func(s grpc.BidiStreamingServer[pb.Event, pb.Result]) error {
		mu.Lock()
		streams++
		first := streams == 1
		mu.Unlock()
		for i := 0; ; i++ {
			e, err := s.Recv()
			if err != nil {
				return nil
			}
			if first && i == 1 {
				return status.Error(codes.Unavailable, "gone")
			}
			r := &pb.Result{EventID: e.EventID, Sent: true}
			if string(e.Body) == "refuse" {
				r = &pb.Result{EventID: e.EventID, Error: "nats: invalid subject"}
			}
			if err := s.Send(r); err != nil {
				return err
			}
		}
	}}
	f.start(t, "127.0.0.1:0")
	c := dialFake(t, f, Options{PublishStreams: 1})
	rs, err := c.PublishEvents(within(t, 5*time.Second), []Event{{Channel: "c", Body: []byte("a")}, {Channel: "c", Body: []byte("b")}})
	if err != nil {
		t.Fatal(err)
	}
	if rs[0].Err != nil || !errors.Is(rs[1].Err, ErrUnavailable) || !IsRetryable(FirstError(rs)) {
		t.Fatalf("results across a broken stream: %+v", rs)
	}
	// The next publish opens a new stream; duplicate EventIDs are answered in order.
	rs, err = c.PublishEvents(within(t, 5*time.Second), []Event{
		{EventID: "same", Channel: "c", Body: []byte("ok")},
		{EventID: "same", Channel: "c", Body: []byte("refuse")},
		{Channel: "c", Body: []byte("ok")},
	})
	if err != nil {
		t.Fatal(err)
	}
	if rs[0].Err != nil || rs[1].Err == nil || rs[2].Err != nil || rs[2].EventID == "" || rs[0].EventID != "same" {
		t.Fatalf("second publish: %+v", rs)
	}
	var ke *Error
	if !errors.As(rs[1].Err, &ke) || ke.GRPC != codes.OK || ke.Retryable {
		t.Fatalf("Sent=false mapped to %#v", rs[1].Err)
	}
	if _, err := c.PublishEvent(within(t, 5*time.Second), Event{Channel: "c", Body: []byte("refuse")}); err == nil {
		t.Fatal("PublishEvent hid Sent=false")
	}
	_ = c.Close()
	if _, err := c.PublishEvents(within(t, time.Second), []Event{{Channel: "c", Body: []byte("a")}}); !errors.Is(err, ErrClosed) {
		t.Fatalf("publish after Close: %v", err)
	}
}

func TestUpstreamReopensAfterStreamFailure(t *testing.T) {
	var mu sync.Mutex
	streams := 0
	f := &fake{upstream: func(s grpc.BidiStreamingServer[pb.QueuesUpstreamRequest, pb.QueuesUpstreamResponse]) error {
		mu.Lock()
		streams++
		first := streams == 1
		mu.Unlock()
		for {
			r, err := s.Recv()
			if err != nil {
				return nil
			}
			if first {
				return status.Error(codes.Unavailable, "gone")
			}
			resp := &pb.QueuesUpstreamResponse{RefRequestID: r.RequestID}
			for range r.Messages {
				resp.Results = append(resp.Results, &pb.SendQueueMessageResult{MessageID: "id", SentAt: 1})
			}
			if err := s.Send(resp); err != nil {
				return err
			}
		}
	}}
	f.start(t, "127.0.0.1:0")
	c := dialFake(t, f, Options{})
	up, err := c.OpenUpstream(within(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	msg := []QueueMessage{{Channel: "q", Body: []byte("x")}}
	if _, err := up.Send(within(t, 5*time.Second), msg); !errors.Is(err, ErrUnavailable) || !IsRetryable(err) {
		t.Fatalf("send on a failing stream: %v", err)
	}
	rs, err := up.Send(within(t, 5*time.Second), msg)
	if err != nil || len(rs) != 1 || rs[0].Err != nil {
		t.Fatalf("send after reopen: %v %+v", err, rs)
	}
	if err := up.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := up.Send(within(t, time.Second), msg); !errors.Is(err, ErrClosed) {
		t.Fatalf("send after Close: %v", err)
	}
}

func TestSubscriptionEndsWithReason(t *testing.T) {
	f := &fake{}
	f.start(t, "127.0.0.1:0")
	c := dialFake(t, f, Options{})
	// The fake does not implement SubscribeToEvents: the refusal comes from Recv.
	s, err := c.SubscribeEventsStore(within(t, 5*time.Second), SubscribeOptions{Channel: "c"})
	if err != nil {
		t.Fatal(err)
	}
	var ke *Error
	if _, err := s.Recv(within(t, 5*time.Second)); !errors.As(err, &ke) || ke.GRPC != codes.Unimplemented {
		t.Fatalf("Recv: %v", err)
	}
	s2, err := c.SubscribeEventsStore(within(t, 5*time.Second), SubscribeOptions{Channel: "c"})
	if err != nil {
		t.Fatal(err)
	}
	if err := s2.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := s2.Recv(within(t, time.Second)); err == nil {
		t.Fatal("Recv after Close succeeded")
	}
}

func TestSubscriptionAutoResume(t *testing.T) {
	reqs := make(chan *pb.Subscribe, 4)
	f := &fake{subscribe: func(r *pb.Subscribe, s grpc.ServerStreamingServer[pb.EventReceive]) error {
		reqs <- r
		send := func(seq uint64) error {
			return s.Send(&pb.EventReceive{EventID: "e", Channel: r.Channel, Body: []byte{byte(seq)}, Sequence: seq})
		}
		if len(reqs) == 1 { // the first stream: two events, then an outage
			if err := send(1); err != nil {
				return err
			}
			if err := send(2); err != nil {
				return err
			}
			return status.Error(codes.Unavailable, "error reading from server: EOF")
		}
		for _, seq := range []uint64{2, 3} { // 2 is stale and must be skipped
			if err := send(seq); err != nil {
				return err
			}
		}
		<-s.Context().Done()
		return nil
	}}
	f.start(t, "127.0.0.1:0")
	c := dialFake(t, f, Options{MinBackoff: 10 * time.Millisecond, MaxBackoff: 20 * time.Millisecond})
	s, err := c.SubscribeEventsStore(within(t, 5*time.Second), SubscribeOptions{Channel: "c", Start: StartPosition{Mode: StartFromFirst}, AutoResume: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	first := s.ClientID()
	for want := uint64(1); want <= 3; want++ {
		e, err := s.Recv(within(t, 5*time.Second))
		if err != nil || e.Sequence != want {
			t.Fatalf("event %d: %+v %v", want, e, err)
		}
	}
	<-reqs
	r := <-reqs
	if r.EventsStoreTypeData != pb.Subscribe_StartAtSequence || r.EventsStoreTypeValue != 3 || r.ClientID == first || r.ClientID != s.ClientID() {
		t.Fatalf("resume request %+v (first id %s)", r, first)
	}
	if s.Resumes() != 1 {
		t.Fatalf("Resumes %d", s.Resumes())
	}
}

// A send the server leaves unanswered for SendAttempt is sent again, and the second answer
// is the call's; a caller's own deadline is never exceeded for it.
func TestUnansweredSendIsSentAgain(t *testing.T) {
	var calls atomic.Int32
	f := &fake{sendBatch: func(ctx context.Context, r *pb.QueueMessagesBatchRequest) (*pb.QueueMessagesBatchResponse, error) {
		if calls.Add(1) == 1 {
			<-ctx.Done() // the first attempt is never answered
			return nil, ctx.Err()
		}
		rs := make([]*pb.SendQueueMessageResult, len(r.Messages))
		for i, m := range r.Messages {
			rs[i] = &pb.SendQueueMessageResult{MessageID: m.MessageID, SentAt: 1}
		}
		return &pb.QueueMessagesBatchResponse{BatchID: r.BatchID, Results: rs}, nil
	}}
	f.start(t, "127.0.0.1:0")
	c := dialFake(t, f, Options{SendAttempt: 200 * time.Millisecond})
	rs, err := c.SendQueueMessages(within(t, 10*time.Second), []QueueMessage{{Channel: "q", Body: []byte("x")}})
	if err != nil || len(rs) != 1 || rs[0].Err != nil {
		t.Fatalf("send: %v %v", rs, err)
	}
	if n := calls.Load(); n != 2 {
		t.Fatalf("%d attempts, want 2", n)
	}
	if c.SendsResent() != 1 {
		t.Fatalf("SendsResent = %d, want 1", c.SendsResent())
	}

	// The caller's deadline shorter than an attempt: it is the caller's error, no retry.
	calls.Store(0)
	_, err = c.SendQueueMessages(within(t, 100*time.Millisecond), []QueueMessage{{Channel: "q", Body: []byte("x")}})
	if err == nil || calls.Load() != 1 {
		t.Fatalf("with a short caller deadline: %v after %d attempts, want an error after 1", err, calls.Load())
	}
}
