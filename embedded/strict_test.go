package embedded_test

import (
	"runtime"
	"strings"
	"testing"

	"github.com/kubemq-io/kubemq-proxy/embedded"
	pb "github.com/kubemq-io/kubemq-proxy/kubemqpb"
)

func TestStrictSecondTransactionOnQueue(t *testing.T) {
	e := strictEnv(t)
	e.mustSend("q", "a", "b")
	d1 := e.downstream()
	r := d1.get("q", 1, 1000)
	// Same stream, same queue, unsettled: refused.
	d1.send(&pb.QueuesDownstreamRequest{RequestTypeData: pb.QueuesDownstreamRequestType_Get, Channel: "q", MaxItems: 1})
	if x := d1.recv(); !x.IsError || !strings.HasPrefix(x.Error, "strict mode: this stream already holds unsettled transaction "+r.TransactionId) {
		t.Fatalf("same-stream second Get: %+v", x)
	}
	// Another stream: refused too.
	d2 := e.downstream()
	d2.send(&pb.QueuesDownstreamRequest{RequestTypeData: pb.QueuesDownstreamRequestType_Get, Channel: "q", MaxItems: 1})
	if x := d2.recv(); !x.IsError || !strings.HasPrefix(x.Error, "strict mode: queue q already has an open downstream transaction") {
		t.Fatalf("other-stream Get: %+v", x)
	}
	// Another queue is fine, and after settlement the queue is free again.
	e.mustSend("q2", "x")
	d2.get("q2", 1, 1000)
	d1.send(&pb.QueuesDownstreamRequest{RequestTypeData: pb.QueuesDownstreamRequestType_AckAll, RefTransactionId: r.TransactionId})
	if r2 := d1.get("q", 1, 1000); bodies(r2.Messages) != "b" {
		t.Fatalf("after settle: %s", bodies(r2.Messages))
	}
	if st := e.srv.StrictStats(); st.SecondTransaction != 2 {
		t.Fatalf("stats %+v", st)
	}
}

func TestStrictRepeatedSequenceAndForeignSettlement(t *testing.T) {
	e := strictEnv(t)
	e.mustSend("q", "a", "b")
	d1 := e.downstream()
	r := d1.get("q", 2, 1000)
	d1.send(&pb.QueuesDownstreamRequest{RequestTypeData: pb.QueuesDownstreamRequestType_AckRange, RefTransactionId: r.TransactionId, SequenceRange: []int64{1, 2, 1}})
	if x := d1.recv(); !x.IsError || !strings.HasPrefix(x.Error, "strict mode: sequence 1 is listed twice") {
		t.Fatalf("repeated: %+v", x)
	}
	d2 := e.downstream()
	d2.send(&pb.QueuesDownstreamRequest{RequestTypeData: pb.QueuesDownstreamRequestType_AckAll, RefTransactionId: r.TransactionId})
	if x := d2.recv(); !x.IsError || !strings.HasPrefix(x.Error, "strict mode: transaction "+r.TransactionId+" belongs to another downstream stream") {
		t.Fatalf("foreign: %+v", x)
	}
	// Nothing was settled by either refusal.
	_, probe := d1.op(&pb.QueuesDownstreamRequest{RequestTypeData: pb.QueuesDownstreamRequestType_ActiveOffsets, RefTransactionId: r.TransactionId, RequestID: "a"}, r.TransactionId)
	if len(probe.ActiveOffsets) != 2 {
		t.Fatalf("active %+v", probe)
	}
	st := e.srv.StrictStats()
	if st.RepeatedSequence != 1 || st.ForeignSettlement != 1 || st.Total() != 2 {
		t.Fatalf("stats %+v", st)
	}
}

func TestNonStrictFollowsRealServer(t *testing.T) {
	e := newEnv(t, embedded.Options{})
	e.mustSend("q", "a", "b", "c")
	d1 := e.downstream()
	r := d1.get("q", 2, 1000)
	// The real server fails at the second copy and keeps what came before.
	opErr, probe := d1.op(&pb.QueuesDownstreamRequest{RequestTypeData: pb.QueuesDownstreamRequestType_AckRange, RefTransactionId: r.TransactionId, SequenceRange: []int64{1, 1, 2}}, r.TransactionId)
	if opErr == nil || opErr.Error != "invalid ack sequence id 1" || len(probe.ActiveOffsets) != 1 {
		t.Fatalf("repeated in non-strict: %+v %+v", opErr, probe)
	}
	d2 := e.downstream()
	d2.send(&pb.QueuesDownstreamRequest{RequestTypeData: pb.QueuesDownstreamRequestType_AckAll, RefTransactionId: r.TransactionId})
	if x := d2.recv(); x.Error != "transaction is completed or transaction id not found" {
		t.Fatalf("foreign: %+v", x)
	}
	// A second transaction is allowed (and counted).
	if r2 := d2.get("q", 1, 1000); bodies(r2.Messages) != "c" {
		t.Fatalf("second tx got %s", bodies(r2.Messages))
	}
	if st := e.srv.StrictStats(); st.SecondTransaction != 1 || st.RepeatedSequence != 1 || st.ForeignSettlement != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestStrictStreamEndedDuringGet(t *testing.T) {
	e := strictEnv(t)
	d := e.downstream()
	d.send(&pb.QueuesDownstreamRequest{RequestTypeData: pb.QueuesDownstreamRequestType_Get, Channel: "q", MaxItems: 1, WaitTimeout: 60000})
	// The Get is waiting once QueuesInfo shows it as a subscriber.
	for e.infoMaybe("q") == nil || e.infoMaybe("q").Subscribers == 0 {
		runtime.Gosched()
	}
	d.cancel()
	for e.srv.StrictStats().StreamEndedDuringGet == 0 {
		runtime.Gosched()
	}
	// The queue is free again.
	e.mustSend("q", "a")
	d2 := e.downstream()
	if r := d2.get("q", 1, 1000); bodies(r.Messages) != "a" {
		t.Fatal(r)
	}
}

func (e *env) infoMaybe(name string) *pb.QueueInfo {
	r, err := e.c.QueuesInfo(e.ctx, &pb.QueuesInfoRequest{QueueName: name})
	if err != nil || len(r.Info.Queues) == 0 {
		return nil
	}
	return r.Info.Queues[0]
}
