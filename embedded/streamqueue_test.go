package embedded_test

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kubemq-io/kubemq-proxy/embedded"
	pb "github.com/kubemq-io/kubemq-proxy/kubemqpb"
)

type sq struct {
	t      testing.TB
	s      pb.Kubemq_StreamQueueMessageClient
	cancel context.CancelFunc
}

func (e *env) streamQueue() *sq {
	ctx, cancel := context.WithCancel(e.ctx)
	s, err := e.c.StreamQueueMessage(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(cancel)
	return &sq{t: e.t, s: s, cancel: cancel}
}

func (q *sq) do(r *pb.StreamQueueMessagesRequest) *pb.StreamQueueMessagesResponse {
	q.t.Helper()
	if r.ClientID == "" {
		r.ClientID = "c"
	}
	if err := q.s.Send(r); err != nil {
		q.t.Fatal(err)
	}
	x, err := q.s.Recv()
	if err != nil {
		q.t.Fatalf("stream queue recv: %v", err)
	}
	return x
}

func (q *sq) receive(ch string, vis, wait int32) *pb.StreamQueueMessagesResponse {
	return q.do(&pb.StreamQueueMessagesRequest{RequestID: "rcv", StreamRequestTypeData: pb.StreamRequestType_ReceiveMessage, Channel: ch, VisibilitySeconds: vis, WaitTimeSeconds: wait})
}

func (q *sq) ended() {
	q.t.Helper()
	if _, err := q.s.Recv(); err != io.EOF {
		q.t.Fatalf("stream did not end: %v", err)
	}
}

func TestStreamQueueAckRejectAndErrors(t *testing.T) {
	e := strictEnv(t)
	e.mustSend("q", "a", "b")
	s := e.streamQueue()
	r := s.receive("q", 10, 1)
	if r.IsError || string(r.Message.Body) != "a" || r.RequestID != "rcv" || r.Message.Attributes.ReceiveCount != 1 {
		t.Fatalf("receive %+v", r)
	}
	if x := s.receive("q", 10, 1); x.Error != "Error 128: subscription to queue is already active" {
		t.Fatalf("second receive %+v", x)
	}
	if x := s.do(&pb.StreamQueueMessagesRequest{StreamRequestTypeData: pb.StreamRequestType_AckMessage, RefSequence: 99}); !strings.HasPrefix(x.Error, "Error 125") {
		t.Fatalf("bad ref %+v", x)
	}
	if x := s.do(&pb.StreamQueueMessagesRequest{ClientID: "", StreamRequestTypeData: pb.StreamRequestType_ModifyVisibility, VisibilitySeconds: 20}); x.IsError {
		t.Fatalf("modify visibility %+v", x)
	}
	if x := s.do(&pb.StreamQueueMessagesRequest{StreamRequestTypeData: pb.StreamRequestType_ModifyVisibility, VisibilitySeconds: 43201}); !strings.HasPrefix(x.Error, "Error 127") {
		t.Fatalf("bad visibility %+v", x)
	}
	if x := s.do(&pb.StreamQueueMessagesRequest{StreamRequestTypeData: pb.StreamRequestType_AckMessage, RefSequence: r.Message.Attributes.Sequence}); x.IsError {
		t.Fatalf("ack %+v", x)
	}
	s.ended()

	s2 := e.streamQueue()
	r = s2.receive("q", 10, 1)
	if x := s2.do(&pb.StreamQueueMessagesRequest{StreamRequestTypeData: pb.StreamRequestType_RejectMessage, RefSequence: r.Message.Attributes.Sequence}); x.IsError {
		t.Fatalf("reject %+v", x)
	}
	s2.ended()
	s3 := e.streamQueue()
	if r := s3.receive("q", 10, 1); string(r.Message.Body) != "b" || r.Message.Attributes.ReceiveCount != 2 || r.Message.Attributes.Sequence != 3 {
		t.Fatalf("rejected copy %+v", r.Message)
	}
	// Unknown request types are refused and the stream stays usable.
	if x := s3.do(&pb.StreamQueueMessagesRequest{StreamRequestTypeData: 42}); !strings.HasPrefix(x.Error, "Error 132") {
		t.Fatalf("unknown type %+v", x)
	}
}

func TestStreamQueueWaitExpiresAndVisibility(t *testing.T) {
	e := strictEnv(t)
	s := e.streamQueue()
	start := time.Now()
	if r := s.receive("empty", 1, 1); r.Error != "Error 138: no new message in queue, wait time expired" || time.Since(start) < time.Second {
		t.Fatalf("empty receive %+v", r)
	}
	s.ended()

	e.mustSend("v", "a")
	s = e.streamQueue()
	r := s.receive("v", 1, 1)
	if r.IsError {
		t.Fatal(r)
	}
	x, err := s.s.Recv()
	if err != nil || x.Error != "Error 129: current visibility timer expired" {
		t.Fatalf("visibility expiry %+v %v", x, err)
	}
	s.ended()
	s = e.streamQueue()
	if r := s.receive("v", 10, 1); r.Message.Attributes.ReceiveCount != 2 || r.Message.Attributes.Sequence != 2 {
		t.Fatalf("after expiry %+v", r.Message)
	}
	// Cancel while holding puts the message back with rc+1.
	s.cancel()
	s = e.streamQueue()
	if r := s.receive("v", 10, 5); r.IsError || r.Message.Attributes.ReceiveCount != 3 {
		t.Fatalf("after cancel %+v", r)
	}
}

func TestStreamQueueResendAndModified(t *testing.T) {
	e := strictEnv(t)
	e.mustSend("q", "a", "b")
	s := e.streamQueue()
	s.receive("q", 10, 1)
	if x := s.do(&pb.StreamQueueMessagesRequest{StreamRequestTypeData: pb.StreamRequestType_ResendMessage, Channel: "other"}); x.IsError {
		t.Fatal(x)
	}
	s.ended()
	s = e.streamQueue()
	s.receive("q", 10, 1)
	if x := s.do(&pb.StreamQueueMessagesRequest{StreamRequestTypeData: pb.StreamRequestType_SendModifiedMessage, ModifiedMessage: qmsg("other", "B")}); x.IsError {
		t.Fatal(x)
	}
	s.ended()
	d := e.downstream()
	r := d.get("other", 2, 1000)
	if bodies(r.Messages) != "a,B" || r.Messages[0].Attributes.ReceiveCount != 1 {
		t.Fatalf("other %s %+v", bodies(r.Messages), r.Messages[0].Attributes)
	}
	if info := e.info("q"); info.Messages != 0 {
		t.Fatalf("q kept %d", info.Messages)
	}
}

func TestStopEndsStreamsUnavailable(t *testing.T) {
	e := newEnv(t, embedded.Options{Strict: true})
	d := e.downstream()
	d.send(&pb.QueuesDownstreamRequest{RequestTypeData: pb.QueuesDownstreamRequestType_Get, Channel: "q", MaxItems: 1, WaitTimeout: 60000})
	s := e.mustSubscribe(storeSub("x", "es", "", pb.Subscribe_StartNewOnly, 0))
	done := make(chan struct{})
	go func() { e.srv.Stop(); close(done) }()
	if _, err := d.s.Recv(); status.Code(err) != codes.Unavailable {
		t.Fatalf("downstream after stop: %v", err)
	}
	if _, err := s.s.Recv(); status.Code(err) != codes.Unavailable {
		t.Fatalf("subscription after stop: %v", err)
	}
	<-done
}

func TestCommandsAndQueries(t *testing.T) {
	e := strictEnv(t)
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	sub, err := e.c.SubscribeToRequests(ctx, &pb.Subscribe{SubscribeTypeData: pb.Subscribe_Queries, ClientID: "r", Channel: "svc.*"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sub.Header(); err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			req, err := sub.Recv()
			if err != nil {
				return
			}
			_, _ = e.c.SendResponse(ctx, &pb.Response{ClientID: "r", RequestID: req.RequestID, ReplyChannel: req.ReplyChannel, Body: append([]byte("re:"), req.Body...), Executed: true})
		}
	}()
	resp, err := e.c.SendRequest(e.ctx, &pb.Request{RequestID: "q1", RequestTypeData: pb.Request_Query, ClientID: "c", Channel: "svc.a", Body: []byte("hi"), Timeout: 10000})
	if err != nil || string(resp.Body) != "re:hi" || resp.RequestID != "q1" || !resp.Executed {
		t.Fatalf("query: %+v %v", resp, err)
	}
	// A command nobody subscribes to times out with Error 301.
	_, err = e.c.SendRequest(e.ctx, &pb.Request{RequestTypeData: pb.Request_Command, ClientID: "c", Channel: "svc.a", Body: []byte("x"), Timeout: 100})
	if status.Code(err) != codes.Internal || !strings.Contains(err.Error(), "Error 301: timeout for request message") {
		t.Fatalf("command timeout: %v", err)
	}
	for _, bad := range []*pb.Request{
		{RequestTypeData: pb.Request_Query, Channel: "x", Body: []byte("x"), Timeout: 1},
		{RequestTypeData: pb.Request_Query, ClientID: "c", Channel: "x", Body: []byte("x")},
		{RequestTypeData: pb.Request_Query, ClientID: "c", Channel: "x", Timeout: 1},
		{ClientID: "c", Channel: "x", Body: []byte("x"), Timeout: 1},
	} {
		if _, err := e.c.SendRequest(e.ctx, bad); status.Code(err) != codes.Internal || !strings.HasPrefix(status.Convert(err).Message(), "Error 1") && !strings.HasPrefix(status.Convert(err).Message(), "Error 2") {
			t.Errorf("%+v: %v", bad, err)
		}
	}
	if _, err := e.c.SendResponse(e.ctx, &pb.Response{ClientID: "r", ReplyChannel: "nobody", RequestID: "x"}); err != nil {
		t.Fatalf("orphan response: %v", err)
	}
}
