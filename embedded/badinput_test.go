package embedded_test

import (
	"runtime"
	"strings"
	"testing"

	pb "github.com/kubemq-io/kubemq-proxy/kubemqpb"
)

// Bad input gets the documented error and leaves the server usable.
func TestBadInputNeverBreaksTheServer(t *testing.T) {
	e := strictEnv(t)
	e.mustSend("q", "a")
	d := e.downstream()
	r := d.get("q", 1, 1000)
	for _, req := range []*pb.QueuesDownstreamRequest{
		{RequestTypeData: pb.QueuesDownstreamRequestType_PollRequestTypeUnknown},
		{RequestTypeData: pb.QueuesDownstreamRequestType_CloseByServer, RefTransactionId: r.TransactionId},
		{RequestTypeData: 99, RefTransactionId: r.TransactionId},
		{RequestTypeData: pb.QueuesDownstreamRequestType_AckRange, RefTransactionId: r.TransactionId, SequenceRange: []int64{-5}},
		{RequestTypeData: pb.QueuesDownstreamRequestType_AckRange, RefTransactionId: r.TransactionId, SequenceRange: []int64{0}},
		{RequestTypeData: pb.QueuesDownstreamRequestType_ReQueueAll, RefTransactionId: r.TransactionId, ReQueueChannel: ""},
		{RequestTypeData: pb.QueuesDownstreamRequestType_ReQueueRange, RefTransactionId: r.TransactionId, ReQueueChannel: "a/b", SequenceRange: []int64{1}},
		{RequestTypeData: pb.QueuesDownstreamRequestType_NAckRange, RefTransactionId: "", SequenceRange: []int64{1}},
		{RequestTypeData: pb.QueuesDownstreamRequestType_Get, ClientID: "c"},
	} {
		d.send(req)
		if x := d.recv(); !x.IsError || x.Error == "" || x.RefRequestId != req.RequestID {
			t.Errorf("%+v answered %+v", req, x)
		}
	}
	// Empty ClientID on a Get is Error 101.
	if err := d.s.Send(&pb.QueuesDownstreamRequest{RequestTypeData: pb.QueuesDownstreamRequestType_Get, Channel: "q"}); err != nil {
		t.Fatal(err)
	}
	if x := d.recv(); !strings.HasPrefix(x.Error, "Error 101") {
		t.Fatalf("no client id %+v", x)
	}
	// The transaction is intact.
	_, probe := d.op(&pb.QueuesDownstreamRequest{RequestTypeData: pb.QueuesDownstreamRequestType_ActiveOffsets, RefTransactionId: r.TransactionId}, r.TransactionId)
	if len(probe.ActiveOffsets) != 1 {
		t.Fatalf("active %+v", probe)
	}

	s := e.streamQueue()
	for _, req := range []*pb.StreamQueueMessagesRequest{
		{StreamRequestTypeData: pb.StreamRequestType_AckMessage, RefSequence: 1},
		{StreamRequestTypeData: pb.StreamRequestType_RejectMessage, RefSequence: 1},
		{StreamRequestTypeData: pb.StreamRequestType_ModifyVisibility},
		{StreamRequestTypeData: pb.StreamRequestType_ResendMessage, Channel: "x"},
		{StreamRequestTypeData: pb.StreamRequestType_SendModifiedMessage},
		{StreamRequestTypeData: pb.StreamRequestType_ReceiveMessage, Channel: "q", VisibilitySeconds: -1},
		{StreamRequestTypeData: pb.StreamRequestType_ReceiveMessage, Channel: "q", WaitTimeSeconds: 3601},
		{StreamRequestTypeData: pb.StreamRequestType_ReceiveMessage, Channel: ""},
		{StreamRequestTypeData: pb.StreamRequestType_StreamRequestTypeUnknown},
	} {
		if x := s.do(req); !x.IsError {
			t.Errorf("%+v answered %+v", req, x)
		}
	}
	// The only message is held by the open transaction, so the wait expires.
	if x := s.do(&pb.StreamQueueMessagesRequest{StreamRequestTypeData: pb.StreamRequestType_ReceiveMessage, Channel: "q"}); x.Error != "Error 138: no new message in queue, wait time expired" {
		t.Fatalf("receive %+v", x)
	}
	raw := e.streamQueue()
	if err := raw.s.Send(&pb.StreamQueueMessagesRequest{StreamRequestTypeData: pb.StreamRequestType_ReceiveMessage, Channel: "q"}); err != nil {
		t.Fatal(err)
	}
	if x, err := raw.s.Recv(); err != nil || !strings.HasPrefix(x.Error, "Error 101") || x.RequestID == "" {
		t.Fatalf("no client id: %+v %v", x, err)
	}
	// Unary calls with empty requests.
	if res, err := e.c.SendQueueMessage(e.ctx, &pb.QueueMessage{}); err != nil || !res.IsError {
		t.Fatalf("empty send %+v %v", res, err)
	}
	if res, err := e.c.AckAllQueueMessages(e.ctx, &pb.AckAllQueueMessagesRequest{}); err != nil || !res.IsError {
		t.Fatalf("empty ackall %+v %v", res, err)
	}
	if _, err := e.c.QueuesInfo(e.ctx, &pb.QueuesInfoRequest{QueueName: ";;;"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.SendEvent(e.ctx, &pb.Event{}); err == nil {
		t.Fatal("empty event accepted")
	}
}

func TestEventsStoreGroupResumesForNewMember(t *testing.T) {
	e := strictEnv(t)
	e.publish("gr", true, "1", "2")
	a := e.mustSubscribe(storeSub("ga", "gr", "grp", pb.Subscribe_StartFromFirst, 0))
	if got := a.next(2); got != "1@1,2@2" {
		t.Fatal(got)
	}
	a.cancel()
	e.waitReleased("ga")
	e.publish("gr", true, "3")
	// A new member of the same group resumes the group's position, whatever its start mode;
	// a different group starts fresh.
	b := e.mustSubscribe(storeSub("gb", "gr", "grp", pb.Subscribe_StartFromFirst, 0))
	other := e.mustSubscribe(storeSub("gc", "gr", "grp2", pb.Subscribe_StartFromFirst, 0))
	if got := b.next(1); got != "3@3" {
		t.Fatalf("group resume %s", got)
	}
	if got := other.next(3); got != "1@1,2@2,3@3" {
		t.Fatalf("other group %s", got)
	}
}

// waitReleased waits until the server has closed every events-store subscription of clientID
// (the id can be registered again); it leaves a cancelled probe subscription behind.
func (e *env) waitReleased(clientID string) {
	e.t.Helper()
	for {
		s, err := e.subscribe(storeSub(clientID, "release.probe", "", pb.Subscribe_StartNewOnly, 0))
		if err == nil {
			s.cancel()
			return
		}
		if !strings.Contains(err.Error(), "already registered") {
			e.t.Fatal(err)
		}
		runtime.Gosched()
	}
}
