package embedded_test

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kubemq-io/kubemq-proxy/embedded"
	pb "github.com/kubemq-io/kubemq-proxy/kubemqpb"
)

func channelClient(t *testing.T, opts embedded.Options, copts ...embedded.ChannelOption) (*embedded.Server, pb.KubemqClient) {
	t.Helper()
	srv, err := embedded.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return srv, pb.NewKubemqClient(srv.Channel(copts...))
}

// TestChannelCopies: what crosses the channel is a copy in both
// directions: a caller changing its request after the call, or the message
// it received, changes nothing stored. With SharePayloads the stored
// message is the sent Body and Tags (which the caller must then leave
// alone), and what a receiver gets is still a copy.
func TestChannelCopies(t *testing.T) {
	for _, share := range []bool{false, true} {
		t.Run(map[bool]string{false: "copy", true: "share"}[share], func(t *testing.T) { testChannelCopies(t, share) })
	}
}

func testChannelCopies(t *testing.T, share bool) {
	var copts []embedded.ChannelOption
	if share {
		copts = append(copts, embedded.SharePayloads())
	}
	_, c := channelClient(t, embedded.Options{Strict: true}, copts...)
	ctx := testCtx(t)
	m := &pb.QueueMessage{MessageID: "m1", ClientID: "c", Channel: "q", Body: []byte("body"), Tags: map[string]string{"k": "v"},
		Policy: &pb.QueueMessagePolicy{MaxReceiveCount: 3}}
	if res, err := c.SendQueueMessage(ctx, m); err != nil || res.IsError {
		t.Fatalf("send: %v %v", res, err)
	}
	m.Policy.MaxReceiveCount = 9 // never shared
	wantBody, wantTag := "body", "v"
	if share {
		wantBody, wantTag = "XXXX", "changed"
	}
	copy(m.Body, "XXXX")
	m.Tags["k"] = "changed"
	peek := func() *pb.QueueMessage {
		t.Helper()
		r, err := c.ReceiveQueueMessages(ctx, &pb.ReceiveQueueMessagesRequest{RequestID: "r", ClientID: "c", Channel: "q", MaxNumberOfMessages: 1, WaitTimeSeconds: 1, IsPeak: true})
		if err != nil || len(r.Messages) != 1 {
			t.Fatalf("peek: %v %v", r, err)
		}
		return r.Messages[0]
	}
	got := peek()
	if string(got.Body) != wantBody || got.Tags["k"] != wantTag || got.Policy.GetMaxReceiveCount() != 3 {
		t.Fatalf("stored message %q %v %v, want %q %q and 3 receives", got.Body, got.Tags, got.Policy, wantBody, wantTag)
	}
	copy(got.Body, "YYYY")
	got.Tags["k"] = "changed again"
	if again := peek(); string(again.Body) != wantBody || again.Tags["k"] != wantTag {
		t.Fatalf("stored message follows a receiver's changes: %q %v", again.Body, again.Tags)
	}
}

// TestChannelStreams: a bidirectional stream keeps order both ways, the
// handler's error status reaches the caller, and CloseSend ends the
// handler's input after what was sent.
func TestChannelStreams(t *testing.T) {
	_, c := channelClient(t, embedded.Options{Strict: true})
	ctx := testCtx(t)
	st, err := c.SendEventsStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const n = 500 // more than the stream's buffer each way
	go func() {
		for i := range n {
			if err := st.Send(&pb.Event{EventID: string(rune('a' + i%26)), ClientID: "c", Channel: "ev", Body: []byte{byte(i)}, Store: true}); err != nil {
				return
			}
		}
		st.CloseSend()
	}()
	for i := range n {
		r, err := st.Recv()
		if err != nil {
			t.Fatalf("result %d: %v", i, err)
		}
		if !r.Sent || r.EventID != string(rune('a'+i%26)) {
			t.Fatalf("result %d: %+v", i, r)
		}
	}
	if _, err := st.Recv(); err != io.EOF {
		t.Fatalf("after CloseSend: %v, want io.EOF", err)
	}

	// A handler's error is the caller's status.
	sub, err := c.SubscribeToEvents(ctx, &pb.Subscribe{SubscribeTypeData: pb.Subscribe_EventsStore, ClientID: "c", Channel: ""})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sub.Recv(); status.Code(err) == codes.OK {
		t.Fatalf("subscribe without a channel: %v, want an error status", err)
	}
}

// TestChannelCancel: cancelling the caller's context ends its stream with
// Canceled at once, and the handler sees it (a downstream transaction
// closes, so the queue can be read again).
func TestChannelCancel(t *testing.T) {
	_, c := channelClient(t, embedded.Options{Strict: true})
	ctx := testCtx(t)
	sctx, cancel := context.WithCancel(ctx)
	sub, err := c.SubscribeToEvents(sctx, &pb.Subscribe{SubscribeTypeData: pb.Subscribe_EventsStore, ClientID: "c", Channel: "ev",
		EventsStoreTypeData: pb.Subscribe_StartNewOnly})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sub.Header(); err != nil {
		t.Fatalf("header: %v", err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := sub.Recv()
		done <- err
	}()
	cancel()
	select {
	case err := <-done:
		if status.Code(err) != codes.Canceled {
			t.Fatalf("after cancel: %v, want Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Recv did not return after cancel")
	}
	// The same client id may subscribe again once the handler has ended.
	deadline := time.Now().Add(5 * time.Second)
	for {
		sub2, err := c.SubscribeToEvents(ctx, &pb.Subscribe{SubscribeTypeData: pb.Subscribe_EventsStore, ClientID: "c", Channel: "ev",
			EventsStoreTypeData: pb.Subscribe_StartNewOnly})
		if err == nil {
			if _, err = sub2.Header(); err == nil {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("resubscribe after cancel: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestChannelStop: Stop ends open streams with Unavailable, also one whose
// caller stopped reading while the handler sends, and refuses later calls.
func TestChannelStop(t *testing.T) {
	srv, c := channelClient(t, embedded.Options{})
	ctx := testCtx(t)
	for i := range 300 { // more than the stream buffer: the handler blocks sending
		if _, err := c.SendEvent(ctx, &pb.Event{EventID: "e", ClientID: "c", Channel: "ev", Body: []byte{byte(i)}, Store: true}); err != nil {
			t.Fatal(err)
		}
	}
	sub, err := c.SubscribeToEvents(ctx, &pb.Subscribe{SubscribeTypeData: pb.Subscribe_EventsStore, ClientID: "c", Channel: "ev",
		EventsStoreTypeData: pb.Subscribe_StartFromFirst})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sub.Recv(); err != nil {
		t.Fatal(err)
	}
	stopped := make(chan struct{})
	go func() { srv.Stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(20 * time.Second):
		t.Fatal("Stop did not return with a stream whose caller does not read")
	}
	var last error
	for range 400 {
		if _, last = sub.Recv(); last != nil {
			break
		}
	}
	if status.Code(last) != codes.Unavailable {
		t.Fatalf("stream after Stop: %v, want Unavailable", last)
	}
	if _, err := c.Ping(ctx, &pb.Empty{}); status.Code(err) != codes.Unavailable {
		t.Fatalf("Ping after Stop: %v, want Unavailable", err)
	}
	if _, err := c.QueuesDownstream(ctx); status.Code(err) != codes.Unavailable {
		t.Fatalf("stream after Stop: %v, want Unavailable", err)
	}
	if err := ctx.Err(); errors.Is(err, context.DeadlineExceeded) {
		t.Fatal(err)
	}
}

// TestChannelDeadline: a unary call ends at its deadline with
// DeadlineExceeded while the handler still waits.
func TestChannelDeadline(t *testing.T) {
	_, c := channelClient(t, embedded.Options{Strict: true})
	ctx, cancel := context.WithTimeout(testCtx(t), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := c.ReceiveQueueMessages(ctx, &pb.ReceiveQueueMessagesRequest{RequestID: "r", ClientID: "c", Channel: "empty",
		MaxNumberOfMessages: 1, WaitTimeSeconds: 5})
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("got %v, want DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("returned after %v", d)
	}
}
