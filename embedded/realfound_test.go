package embedded_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kubemq-io/kubemq-proxy/embedded"
	pb "github.com/kubemq-io/kubemq-proxy/kubemqpb"
)

// The behaviours of this file were found on the real server (COMPAT.md, "Found on the real
// server and kept here too").

// noAnswer fails t if recv returns within d.
func noAnswer[T any](t *testing.T, what string, d time.Duration, recv func() (*T, error)) {
	t.Helper()
	got := make(chan error, 1)
	go func() { _, err := recv(); got <- err }()
	select {
	case err := <-got:
		t.Fatalf("%s: the server answered or ended the stream (%v); the real server keeps it open", what, err)
	case <-time.After(d):
	}
}

func TestHalfCloseEndsNoQueueStream(t *testing.T) {
	e := newEnv(t, embedded.Options{}) // not strict: a second reader is the probe
	e.mustSend("q", "a", "b")
	d := e.downstream()
	r := d.get("q", 2, 1000)
	if err := d.s.CloseSend(); err != nil {
		t.Fatal(err)
	}
	noAnswer(t, "downstream after CloseSend", 300*time.Millisecond, d.s.Recv)
	// The half-closed stream still holds its transaction.
	other := e.downstream()
	if x := other.get("q", 2, 1000); len(x.Messages) != 0 {
		t.Fatalf("held messages handed to another stream after a half-close: %s", bodies(x.Messages))
	}
	d.cancel() // the client's cancel ends it, and the transaction's messages go back
	if x := other.get("q", 2, 1000); !equalSeqs(seqs(x.Messages), seqs(r.Messages)) {
		t.Fatalf("after cancel: %v, want %v", seqs(x.Messages), seqs(r.Messages))
	}

	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	up, err := e.c.QueuesUpstream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := up.Send(&pb.QueuesUpstreamRequest{RequestID: "u1", Messages: []*pb.QueueMessage{qmsg("q", "c")}}); err != nil {
		t.Fatal(err)
	}
	if res, err := up.Recv(); err != nil || res.RefRequestID != "u1" || res.IsError {
		t.Fatalf("upstream answer %+v %v", res, err)
	}
	if err := up.CloseSend(); err != nil {
		t.Fatal(err)
	}
	noAnswer(t, "upstream after CloseSend", 300*time.Millisecond, up.Recv)
}

func equalSeqs(a, b []int64) bool {
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

// A Get whose one slot goes to an expired message answers empty at once and keeps its transaction
// open: strict mode refuses the next Get on the queue until it is settled.
func TestGetOfExpiredHeadKeepsTransactionOpen(t *testing.T) {
	var skew atomic.Int64
	e := newEnv(t, embedded.Options{Strict: true, Now: func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }})
	m := qmsg("q", "expires")
	m.Policy = &pb.QueueMessagePolicy{ExpirationSeconds: 1}
	if res := e.send(m); res.IsError {
		t.Fatal(res.Error)
	}
	e.mustSend("q", "kept")
	skew.Store(int64(2 * time.Second))
	d := e.downstream()
	start := time.Now()
	r := d.get("q", 1, 5000)
	if len(r.Messages) != 0 {
		t.Fatalf("expired message delivered: %s", bodies(r.Messages))
	}
	if took := time.Since(start); took > time.Second {
		t.Fatalf("the Get waited %v; its slot was used up by the expired message", took)
	}
	// Open: ActiveOffsets answers (empty), not "closed response".
	_, probe := d.op(&pb.QueuesDownstreamRequest{RequestTypeData: pb.QueuesDownstreamRequestType_ActiveOffsets, RefTransactionId: r.TransactionId}, r.TransactionId)
	if probe.IsError || len(probe.ActiveOffsets) != 0 {
		t.Fatalf("ActiveOffsets of the empty transaction: %+v", probe)
	}
	d.send(&pb.QueuesDownstreamRequest{RequestTypeData: pb.QueuesDownstreamRequestType_Get, Channel: "q", MaxItems: 1, WaitTimeout: 1000})
	if x := d.recv(); !x.IsError || !strings.HasPrefix(x.Error, "strict mode: this stream already holds unsettled transaction "+r.TransactionId) {
		t.Fatalf("Get while the empty transaction is open: %+v", x)
	}
	d.send(&pb.QueuesDownstreamRequest{RequestTypeData: pb.QueuesDownstreamRequestType_CloseByClient, RefTransactionId: r.TransactionId})
	if x := d.get("q", 1, 1000); bodies(x.Messages) != "kept" {
		t.Fatalf("after CloseByClient: %q", bodies(x.Messages))
	}
	if st := e.srv.StrictStats(); st.SecondTransaction != 1 || st.Total() != 1 {
		t.Fatalf("strict stats %+v", st)
	}
}

func TestQueuesInfoCountsLikeTheRealServer(t *testing.T) {
	e := strictEnv(t)
	e.mustSend("q", "a", "b", "c")
	if i := e.info("q"); i.Waiting != 3 || i.Subscribers != 0 {
		t.Fatalf("before any read: %+v", i)
	}
	d := e.downstream()
	r := d.get("q", 2, 1000)
	if i := e.info("q"); i.Waiting != 3 || i.Subscribers != 1 {
		t.Fatalf("holding 2 of 3: waiting %d subscribers %d, want 3 and 1", i.Waiting, i.Subscribers)
	}
	d.op(&pb.QueuesDownstreamRequest{RequestTypeData: pb.QueuesDownstreamRequestType_AckAll, RefTransactionId: r.TransactionId}, r.TransactionId)
	if i := e.info("q"); i.Waiting != 1 {
		t.Fatalf("after AckAll: waiting %d, want 1", i.Waiting)
	}
	d.cancel()
	time.Sleep(50 * time.Millisecond)
	if i := e.info("q"); i.Subscribers != 1 {
		t.Fatalf("after every reader left: subscribers %d, want 1 (the real server keeps counting one)", i.Subscribers)
	}
}
