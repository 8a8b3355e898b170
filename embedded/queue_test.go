package embedded_test

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kubemq-io/kubemq-proxy/internal/kubemqtest"
	pb "github.com/kubemq-io/kubemq-proxy/kubemqpb"
)

func TestQueueSendValidation(t *testing.T) {
	e := strictEnv(t)
	long := strings.Repeat("a", 247)
	cases := []struct {
		name string
		m    *pb.QueueMessage
		want string
	}{
		{"no client", &pb.QueueMessage{Channel: "q", Body: []byte("x")}, "Error 101: invalid clientID value, cannot be empty"},
		{"empty name", qmsg("", "x"), "Error 120: invalid queue name value"},
		{"trailing dot", qmsg("a.", "x"), "Error 120"},
		{"space", qmsg("a b", "x"), "Error 120"},
		{"wildcard", qmsg("a.*", "x"), "Error 120"},
		{"gt", qmsg("a.>", "x"), "Error 120"},
		{"leading dot", qmsg(".a", "x"), "cannot start with `.`"},
		{"empty token", qmsg("a..b", "x"), "empty token"},
		{"slash", qmsg("a/b", "x"), "`/` or `:`"},
		{"colon", qmsg("a:b", "x"), "`/` or `:`"},
		{"tab", qmsg("a\tb", "x"), "white space"},
		{"control", qmsg("a\x01b", "x"), "white space"},
		{"too long", qmsg(long, "x"), "longer than 246 bytes"},
		{"empty message", &pb.QueueMessage{ClientID: "c", Channel: "q"}, "Error 110: invalid message, cannot be empty"},
		{"expiration", &pb.QueueMessage{ClientID: "c", Channel: "q", Body: []byte("x"), Policy: &pb.QueueMessagePolicy{ExpirationSeconds: 43201}}, "Error 133"},
		{"negative expiration", &pb.QueueMessage{ClientID: "c", Channel: "q", Body: []byte("x"), Policy: &pb.QueueMessagePolicy{ExpirationSeconds: -1}}, "Error 133"},
		{"delay", &pb.QueueMessage{ClientID: "c", Channel: "q", Body: []byte("x"), Policy: &pb.QueueMessagePolicy{DelaySeconds: 43201}}, "Error 135"},
		{"max receive", &pb.QueueMessage{ClientID: "c", Channel: "q", Body: []byte("x"), Policy: &pb.QueueMessagePolicy{MaxReceiveCount: 1025}}, "Error 134"},
		{"bad dlq", &pb.QueueMessage{ClientID: "c", Channel: "q", Body: []byte("x"), Policy: &pb.QueueMessagePolicy{MaxReceiveQueue: "d:q"}}, "Error 120"},
	}
	for _, c := range cases {
		res := e.send(c.m)
		if !res.IsError || !strings.Contains(res.Error, c.want) || res.SentAt != 0 {
			t.Errorf("%s: got %+v, want error containing %q", c.name, res, c.want)
		}
	}
	if res := e.send(qmsg(strings.Repeat("a", 246), "x")); res.IsError {
		t.Errorf("246-byte name refused: %s", res.Error)
	}
	// Names the real server accepts stay accepted.
	for _, ok := range []string{"gcp.sub.s1", "A-b_c~d+e%f,g;h=i&j@k#l\\m", "ünï.cødé"} {
		if res := e.send(qmsg(ok, "x")); res.IsError {
			t.Errorf("%q refused: %s", ok, res.Error)
		}
	}
}

func TestQueueOversizeMessage(t *testing.T) {
	e := newEnv(t, embeddedOpts(func(o *optsT) { o.MaxMessageBytes = 1 << 10 }))
	res := e.send(qmsg("q", strings.Repeat("x", 2<<10)))
	if !res.IsError || !strings.Contains(res.Error, "exceeds the limit") {
		t.Fatalf("oversize accepted: %+v", res)
	}
}

func TestQueueBatchAndEmptyBatch(t *testing.T) {
	e := strictEnv(t)
	_, err := e.c.SendQueueMessagesBatch(e.ctx, &pb.QueueMessagesBatchRequest{BatchID: "b"})
	if status.Code(err) != codes.Unknown || !strings.Contains(err.Error(), "empty messages batch") {
		t.Fatalf("empty batch: %v", err)
	}
	res, err := e.c.SendQueueMessagesBatch(e.ctx, &pb.QueueMessagesBatchRequest{BatchID: "b1", Messages: []*pb.QueueMessage{
		qmsg("q1", "a"), qmsg("q2", "b"), qmsg("bad name", "c"), qmsg("q1", "d"),
	}})
	if err != nil {
		t.Fatal(err)
	}
	if res.BatchID != "b1" || !res.HaveErrors || len(res.Results) != 4 {
		t.Fatalf("batch response %+v", res)
	}
	for i, r := range res.Results {
		if (i == 2) != r.IsError {
			t.Errorf("result %d: %+v", i, r)
		}
		if !r.IsError && (r.MessageID == "" || r.SentAt == 0) {
			t.Errorf("result %d lacks id or SentAt: %+v", i, r)
		}
	}
	d := e.downstream()
	r := d.get("q1", 2, 1000)
	if bodies(r.Messages) != "a,d" || r.Messages[0].Attributes.Sequence != 1 || r.Messages[1].Attributes.Sequence != 2 {
		t.Fatalf("q1 got %v %v", bodies(r.Messages), seqs(r.Messages))
	}
}

func TestUpstream(t *testing.T) {
	e := strictEnv(t)
	up, err := e.c.QueuesUpstream(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i, id := range []string{"u1", "u2"} {
		if err := up.Send(&pb.QueuesUpstreamRequest{RequestID: id, Messages: []*pb.QueueMessage{qmsg("uq", "m"+id), qmsg("uq", "n"+id)}}); err != nil {
			t.Fatal(err)
		}
		_ = i
	}
	if err := up.Send(&pb.QueuesUpstreamRequest{RequestID: "u3"}); err != nil {
		t.Fatal(err)
	}
	got := map[string]*pb.QueuesUpstreamResponse{}
	for range 3 {
		r, err := up.Recv()
		if err != nil {
			t.Fatal(err)
		}
		got[r.RefRequestID] = r
	}
	if len(got["u1"].Results) != 2 || len(got["u2"].Results) != 2 || got["u1"].Results[0].IsError {
		t.Fatalf("upstream results %v", got)
	}
	if !got["u3"].IsError || got["u3"].Error != "empty messages batch" {
		t.Fatalf("empty upstream request: %+v", got["u3"])
	}
}

func TestDownstreamGetAttributesAndAckAll(t *testing.T) {
	e := strictEnv(t)
	before := time.Now().UnixNano()
	res := e.send(&pb.QueueMessage{ClientID: "c", Channel: "q", Body: []byte("a"), Tags: map[string]string{"k": "v"}, Metadata: "md",
		Policy: &pb.QueueMessagePolicy{ExpirationSeconds: 100}})
	if res.IsError || res.ExpirationAt < before+100e9 {
		t.Fatalf("send: %+v", res)
	}
	e.mustSend("q", "b")
	d := e.downstream()
	r := d.get("q", 2, 1000)
	if len(r.TransactionId) != 36 || r.RefRequestId != "r1" || r.RequestTypeData != pb.QueuesDownstreamRequestType_Get {
		t.Fatalf("get envelope %+v", r)
	}
	m := r.Messages[0]
	a := m.Attributes
	if string(m.Body) != "a" || m.Metadata != "md" || m.Tags["k"] != "v" || m.MessageID != res.MessageID || m.ClientID != "c" || m.Channel != "q" {
		t.Fatalf("message %+v", m)
	}
	if a.Sequence != 1 || a.ReceiveCount != 1 || a.Timestamp < before || a.ExpirationAt != res.ExpirationAt || a.DelayedTo != 0 || a.ReRouted {
		t.Fatalf("attributes %+v", a)
	}
	if m.Policy.MaxReceiveCount != 1024 || m.Policy.ExpirationSeconds != 100 {
		t.Fatalf("effective policy %+v", m.Policy)
	}
	opErr, probe := d.op(&pb.QueuesDownstreamRequest{RequestTypeData: pb.QueuesDownstreamRequestType_AckAll, RefTransactionId: r.TransactionId}, r.TransactionId)
	if opErr != nil {
		t.Fatalf("AckAll answered %+v", opErr)
	}
	if !probe.IsError || probe.Error != "cannot get active offsets with closed response " {
		t.Fatalf("probe after AckAll: %+v", probe)
	}
	d.send(&pb.QueuesDownstreamRequest{RequestTypeData: pb.QueuesDownstreamRequestType_AckAll, RefTransactionId: r.TransactionId})
	if x := d.recv(); x.Error != "cannot ack messages with closed response" || x.TransactionId != r.TransactionId {
		t.Fatalf("second AckAll: %+v", x)
	}
	d.send(&pb.QueuesDownstreamRequest{RequestTypeData: pb.QueuesDownstreamRequestType_AckAll, RefTransactionId: "nope"})
	if x := d.recv(); x.Error != "transaction is completed or transaction id not found" {
		t.Fatalf("unknown tx: %+v", x)
	}
	d.send(&pb.QueuesDownstreamRequest{RequestTypeData: pb.QueuesDownstreamRequestType_TransactionStatus, RefTransactionId: r.TransactionId})
	if x := d.recv(); x.Error != "request unknown" {
		t.Fatalf("TransactionStatus: %+v", x)
	}
	info := e.info("q")
	if info.Waiting != 0 || info.Messages != 0 || info.LastSequence != 2 || info.Sent != 2 {
		t.Fatalf("info after ack %+v", info)
	}
}

func (e *env) info(name string) *pb.QueueInfo {
	e.t.Helper()
	r, err := e.c.QueuesInfo(e.ctx, &pb.QueuesInfoRequest{RequestID: "i", QueueName: name})
	if err != nil {
		e.t.Fatal(err)
	}
	if len(r.Info.Queues) != 1 {
		e.t.Fatalf("info %q: %+v", name, r.Info)
	}
	return r.Info.Queues[0]
}

func TestDownstreamGetWaitsForMaxItemsOrTimeout(t *testing.T) {
	e := strictEnv(t)
	e.mustSend("w", "a")
	d := e.downstream()
	start := time.Now()
	r := d.get("w", 10, 200) // raised to 1000 ms
	if el := time.Since(start); el < 990*time.Millisecond || len(r.Messages) != 1 {
		t.Fatalf("Get returned after %v with %d messages, want >= 1s with 1", el, len(r.Messages))
	}
	d.send(&pb.QueuesDownstreamRequest{RequestTypeData: pb.QueuesDownstreamRequestType_AckAll, RefTransactionId: r.TransactionId})
	// A message arriving during the wait completes a Get that needs exactly one.
	d.send(&pb.QueuesDownstreamRequest{RequestTypeData: pb.QueuesDownstreamRequestType_Get, Channel: "w", MaxItems: 1, WaitTimeout: 30000})
	e.mustSend("w", "b")
	if r := d.recv(); bodies(r.Messages) != "b" {
		t.Fatalf("waiting Get got %+v", r)
	}
}

func TestDownstreamRangesNackRequeueClose(t *testing.T) {
	e := strictEnv(t)
	e.mustSend("q", "1", "2", "3", "4", "5", "6")
	d := e.downstream()
	r := d.get("q", 6, 1000)
	tx := r.TransactionId
	// AckRange stops at the first bad entry, keeping what came before.
	opErr, probe := d.op(&pb.QueuesDownstreamRequest{RequestTypeData: pb.QueuesDownstreamRequestType_AckRange, RefTransactionId: tx, SequenceRange: []int64{1, 999, 2}}, tx)
	if opErr == nil || opErr.Error != "invalid ack sequence id 999" {
		t.Fatalf("AckRange error %+v", opErr)
	}
	if got := probe.ActiveOffsets; len(got) != 5 || got[0] != 2 {
		t.Fatalf("active after partial ack: %v", got)
	}
	// NAckRange re-appends at the tail with a new sequence and rc+1.
	opErr, probe = d.op(&pb.QueuesDownstreamRequest{RequestTypeData: pb.QueuesDownstreamRequestType_NAckRange, RefTransactionId: tx, SequenceRange: []int64{2}}, tx)
	if opErr != nil || len(probe.ActiveOffsets) != 4 {
		t.Fatalf("nack: %+v %+v", opErr, probe)
	}
	opErr, _ = d.op(&pb.QueuesDownstreamRequest{RequestTypeData: pb.QueuesDownstreamRequestType_NAckRange, RefTransactionId: tx, SequenceRange: []int64{2}}, tx)
	if opErr == nil || opErr.Error != "invalid nack sequence id 2" {
		t.Fatalf("second nack %+v", opErr)
	}
	// ReQueueRange moves to another queue; as on the real server, ReRouted stays unset.
	opErr, _ = d.op(&pb.QueuesDownstreamRequest{RequestTypeData: pb.QueuesDownstreamRequestType_ReQueueRange, RefTransactionId: tx, SequenceRange: []int64{3}, ReQueueChannel: "other"}, tx)
	if opErr != nil {
		t.Fatalf("requeue %+v", opErr)
	}
	// CloseByClient gives 4, 5, 6 back with the same sequence and receive count.
	d.send(&pb.QueuesDownstreamRequest{RequestTypeData: pb.QueuesDownstreamRequestType_CloseByClient, RefTransactionId: tx})
	r2 := d.get("q", 4, 1000)
	if got := seqs(r2.Messages); len(got) != 4 || got[0] != 4 || got[1] != 5 || got[2] != 6 || got[3] != 7 {
		t.Fatalf("after close: %v (%s)", got, bodies(r2.Messages))
	}
	for i, m := range r2.Messages {
		want := int32(1)
		if i == 3 {
			want = 2 // the nacked one
		}
		if m.Attributes.ReceiveCount != want {
			t.Errorf("%s rc %d want %d", m.Body, m.Attributes.ReceiveCount, want)
		}
	}
	if string(r2.Messages[3].Body) != "2" {
		t.Fatalf("nacked copy %s", r2.Messages[3].Body)
	}
	d.send(&pb.QueuesDownstreamRequest{RequestTypeData: pb.QueuesDownstreamRequestType_AckAll, RefTransactionId: r2.TransactionId})
	o := d.get("other", 1, 1000)
	if m := o.Messages[0]; string(m.Body) != "3" || m.Attributes.ReRouted || m.Attributes.ReRoutedFromQueue != "" || m.Attributes.ReceiveCount != 1 {
		t.Fatalf("requeued %+v", m)
	}
}

func TestDownstreamStreamEndReturnsMessages(t *testing.T) {
	e := strictEnv(t)
	e.mustSend("q", "a", "b")
	d := e.downstream()
	r := d.get("q", 2, 1000)
	d.op(&pb.QueuesDownstreamRequest{RequestTypeData: pb.QueuesDownstreamRequestType_AckRange, RefTransactionId: r.TransactionId, SequenceRange: []int64{1}}, r.TransactionId)
	d.cancel()
	d2 := e.downstream()
	// The server gives the message back when it sees the cancel; wait for it with a long Get.
	// Until it has seen the cancel, the first stream's transaction is still open, which strict
	// mode refuses for a second one (a loaded machine can get there first): ask again.
	var r2 *pb.QueuesDownstreamResponse
	for deadline := time.Now().Add(10 * time.Second); ; {
		d2.send(&pb.QueuesDownstreamRequest{RequestTypeData: pb.QueuesDownstreamRequestType_Get, Channel: "q", MaxItems: 1, WaitTimeout: 30000})
		r2 = d2.recv()
		if !r2.IsError || !strings.Contains(r2.Error, "already has an open downstream transaction") || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if r2.IsError || len(r2.Messages) != 1 {
		t.Fatalf("after stream end: %+v", r2)
	}
	if m := r2.Messages[0]; string(m.Body) != "b" || m.Attributes.Sequence != 2 || m.Attributes.ReceiveCount != 1 {
		t.Fatalf("returned %+v", m)
	}
}

func TestDownstreamAutoAckAndMaxItemsDefault(t *testing.T) {
	e := strictEnv(t)
	e.mustSend("q", "a")
	d := e.downstream()
	d.send(&pb.QueuesDownstreamRequest{RequestTypeData: pb.QueuesDownstreamRequestType_Get, Channel: "q", MaxItems: 1, AutoAck: true})
	r := d.recv()
	if bodies(r.Messages) != "a" {
		t.Fatalf("autoack get %+v", r)
	}
	d.send(&pb.QueuesDownstreamRequest{RequestTypeData: pb.QueuesDownstreamRequestType_AckAll, RefTransactionId: r.TransactionId})
	if x := d.recv(); x.Error != "cannot ack messages with closed response" {
		t.Fatalf("ack after autoack: %+v", x)
	}
	if info := e.info("q"); info.Messages != 0 {
		t.Fatalf("autoack left %d", info.Messages)
	}
	// Validation errors come back in the reply.
	d.send(&pb.QueuesDownstreamRequest{RequestTypeData: pb.QueuesDownstreamRequestType_Get, Channel: "bad name", MaxItems: 1, ClientID: "c"})
	if x := d.recv(); !x.IsError || !strings.HasPrefix(x.Error, "Error 120") {
		t.Fatalf("bad name get %+v", x)
	}
}

func TestDeadLetterAfterMaxReceiveCount(t *testing.T) {
	e := strictEnv(t)
	e.send(&pb.QueueMessage{ClientID: "c", Channel: "q", Body: []byte("x"), Policy: &pb.QueueMessagePolicy{MaxReceiveCount: 2, MaxReceiveQueue: "dlq"}})
	e.send(&pb.QueueMessage{ClientID: "c", Channel: "q", Body: []byte("y"), Policy: &pb.QueueMessagePolicy{MaxReceiveCount: 1}})
	d := e.downstream()
	nack := func(r *pb.QueuesDownstreamResponse) {
		d.send(&pb.QueuesDownstreamRequest{RequestTypeData: pb.QueuesDownstreamRequestType_NAckAll, RefTransactionId: r.TransactionId})
	}
	r := d.get("q", 2, 1000)
	if r.Messages[0].Attributes.ReceiveCount != 1 {
		t.Fatal(r)
	}
	nack(r) // x back with rc 1 stored; y (max 1) dropped
	r = d.get("q", 1, 1000)
	if bodies(r.Messages) != "x" || r.Messages[0].Attributes.ReceiveCount != 2 {
		t.Fatalf("second delivery %+v", r.Messages)
	}
	nack(r) // to the DLQ
	r = d.get("dlq", 1, 1000)
	m := r.Messages[0]
	if string(m.Body) != "x" || !m.Attributes.ReRouted || m.Attributes.ReRoutedFromQueue != "q" || m.Attributes.ReceiveCount != 1 || m.Policy.MaxReceiveQueue != "" {
		t.Fatalf("dlq copy %+v", m)
	}
	d.send(&pb.QueuesDownstreamRequest{RequestTypeData: pb.QueuesDownstreamRequestType_AckAll, RefTransactionId: r.TransactionId})
	if info := e.info("q"); info.Messages != 0 || info.Waiting != 0 {
		t.Fatalf("q not empty: %+v", info)
	}
}

func TestDelayAndExpiry(t *testing.T) {
	e := strictEnv(t)
	start := time.Now()
	res := e.send(&pb.QueueMessage{ClientID: "c", Channel: "q", Body: []byte("d"), Policy: &pb.QueueMessagePolicy{DelaySeconds: 1}})
	if res.DelayedTo < start.Add(time.Second).UnixNano() {
		t.Fatalf("DelayedTo %+v", res)
	}
	e.mustSend("q", "now")
	d := e.downstream()
	r := d.get("q", 1, 1000)
	if bodies(r.Messages) != "now" {
		t.Fatalf("first %s", bodies(r.Messages))
	}
	d.send(&pb.QueuesDownstreamRequest{RequestTypeData: pb.QueuesDownstreamRequestType_AckAll, RefTransactionId: r.TransactionId})
	d.send(&pb.QueuesDownstreamRequest{RequestTypeData: pb.QueuesDownstreamRequestType_Get, Channel: "q", MaxItems: 1, WaitTimeout: 10000})
	r = d.recv()
	el := time.Since(start)
	late := 500 * time.Millisecond
	if kubemqtest.ScanDelays() {
		late += 500 * time.Millisecond // released by the next 500 ms scan
	}
	if bodies(r.Messages) != "d" || el < time.Second || el > time.Second+late {
		t.Fatalf("delayed arrived after %v: %+v", el, r.Messages)
	}
	if a := r.Messages[0].Attributes; a.Sequence != 2 || a.DelayedTo != 0 {
		t.Fatalf("delayed copy attrs %+v", a)
	}
	d.send(&pb.QueuesDownstreamRequest{RequestTypeData: pb.QueuesDownstreamRequestType_AckAll, RefTransactionId: r.TransactionId})

	// Expired messages are dropped when met and counted by ReceiveQueueMessages.
	e.send(&pb.QueueMessage{ClientID: "c", Channel: "x", Body: []byte("e"), Policy: &pb.QueueMessagePolicy{ExpirationSeconds: 1}})
	e.mustSend("x", "keep")
	// Wait out the expiry through the server: a delayed probe is exactly as late.
	e.send(&pb.QueueMessage{ClientID: "c", Channel: "tick", Body: []byte("t"), Policy: &pb.QueueMessagePolicy{DelaySeconds: 1}})
	d.send(&pb.QueuesDownstreamRequest{RequestTypeData: pb.QueuesDownstreamRequestType_Get, Channel: "tick", MaxItems: 1, WaitTimeout: 10000, AutoAck: true})
	d.recv()
	rr, err := e.c.ReceiveQueueMessages(e.ctx, &pb.ReceiveQueueMessagesRequest{ClientID: "c", Channel: "x", MaxNumberOfMessages: 1})
	if err != nil || rr.IsError || rr.MessagesExpired != 1 || bodies(rr.Messages) != "keep" {
		t.Fatalf("receive after expiry %+v %v", rr, err)
	}
}

func TestReceivePeekAckAllInfo(t *testing.T) {
	e := strictEnv(t)
	e.mustSend("p", "a", "b", "c")
	rr, err := e.c.ReceiveQueueMessages(e.ctx, &pb.ReceiveQueueMessagesRequest{ClientID: "c", Channel: "p", MaxNumberOfMessages: 2, IsPeak: true})
	if err != nil || bodies(rr.Messages) != "a,b" || !rr.IsPeak {
		t.Fatalf("peek %+v %v", rr, err)
	}
	for _, bad := range []*pb.ReceiveQueueMessagesRequest{
		{Channel: "p", MaxNumberOfMessages: 1},
		{ClientID: "c", Channel: "p", MaxNumberOfMessages: 0},
		{ClientID: "c", Channel: "p", MaxNumberOfMessages: 1025},
		{ClientID: "c", Channel: "p", MaxNumberOfMessages: 1, WaitTimeSeconds: 3601},
	} {
		rr, err := e.c.ReceiveQueueMessages(e.ctx, bad)
		if err != nil || !rr.IsError {
			t.Errorf("%+v accepted: %+v", bad, rr)
		}
	}
	rr, err = e.c.ReceiveQueueMessages(e.ctx, &pb.ReceiveQueueMessagesRequest{ClientID: "c", Channel: "p", MaxNumberOfMessages: 2})
	if err != nil || bodies(rr.Messages) != "a,b" || rr.MessagesReceived != 2 {
		t.Fatalf("receive %+v %v", rr, err)
	}
	info := e.info("p")
	if info.Waiting != 1 || info.Messages != 1 || info.FirstSequence != 3 || info.LastSequence != 3 || info.Delivered != 2 || info.Sent != 3 {
		t.Fatalf("info %+v", info)
	}
	ack, err := e.c.AckAllQueueMessages(e.ctx, &pb.AckAllQueueMessagesRequest{ClientID: "c", Channel: "p", RequestID: "x"})
	if err != nil || ack.AffectedMessages != 1 || ack.RequestID != "x" {
		t.Fatalf("ackall %+v %v", ack, err)
	}
	all, err := e.c.QueuesInfo(e.ctx, &pb.QueuesInfoRequest{})
	if err != nil || all.Info.TotalQueue != 1 {
		t.Fatalf("all info %+v", all)
	}
	two, _ := e.c.QueuesInfo(e.ctx, &pb.QueuesInfoRequest{QueueName: "p;nope"})
	if two.Info.TotalQueue != 1 {
		t.Fatalf("list info %+v", two.Info)
	}
}

func TestPing(t *testing.T) {
	e := newEnv(t, embeddedOpts(func(o *optsT) { o.Host = "h1" }))
	p, err := e.c.Ping(e.ctx, &pb.Empty{})
	if err != nil || p.Host != "h1" || p.Version != "v2.4.0-embedded" || p.ServerStartTime <= 0 || p.ServerStartTime > time.Now().Unix() {
		t.Fatalf("ping %+v %v", p, err)
	}
}
