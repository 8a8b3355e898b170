package embedded_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/kubemq-io/kubemq-proxy/embedded"
	"github.com/kubemq-io/kubemq-proxy/internal/kubemqtest"
	pb "github.com/kubemq-io/kubemq-proxy/kubemqpb"
)

func delayedMsg(ch, body string, secs int32) *pb.QueueMessage {
	return &pb.QueueMessage{ClientID: "c", Channel: ch, Body: []byte(body), Policy: &pb.QueueMessagePolicy{DelaySeconds: secs}}
}

// sendDelayed stores n delayed messages on ch in one batch.
func (e *env) sendDelayed(ch string, n int, secs int32) {
	e.t.Helper()
	msgs := make([]*pb.QueueMessage, n)
	for i := range msgs {
		msgs[i] = delayedMsg(ch, fmt.Sprint(i), secs)
	}
	res, err := e.c.SendQueueMessagesBatch(e.ctx, &pb.QueueMessagesBatchRequest{BatchID: ch, Messages: msgs})
	if err != nil || res.HaveErrors {
		e.t.Fatalf("send delayed batch to %s: %v %+v", ch, err, res)
	}
}

// awaitAll takes n messages from ch and returns when the last one arrived.
func (e *env) awaitAll(ch string, n int) time.Time {
	e.t.Helper()
	d := e.downstream()
	for got := 0; got < n; {
		r := d.get(ch, int32(n-got), 10000)
		if r.IsError || len(r.Messages) == 0 {
			e.t.Fatalf("%s: %d of %d arrived: %+v", ch, got, n, r)
		}
		got += len(r.Messages)
		d.send(&pb.QueuesDownstreamRequest{RequestTypeData: pb.QueuesDownstreamRequestType_AckAll, RefTransactionId: r.TransactionId})
	}
	return time.Now()
}

// With ScanDelays the delay processor holds the 1024 earliest delayed messages and releases the
// due ones every 500 ms, as the real server does (docs/kubemq.md 9.1): 1,100 messages delayed
// 2 s, sent first, make 10 messages delayed 1 s on another queue wait until they are released.
// Without it every message arrives when due.
func TestScanDelaysHeadOfLine(t *testing.T) {
	for _, scan := range []bool{false, true} {
		t.Run(fmt.Sprintf("scan=%v", scan), func(t *testing.T) {
			if !scan && kubemqtest.ScanDelays() {
				t.Skip("$KUBEMQ_SCAN_DELAYS makes every server scan")
			}
			e := newEnv(t, embedded.Options{Strict: true, ScanDelays: scan})
			start := time.Now()
			e.sendDelayed("slow", 1100, 2)
			e.sendDelayed("fast", 10, 1)
			fast := e.awaitAll("fast", 10).Sub(start)
			slow := e.awaitAll("slow", 1100).Sub(start)
			t.Logf("fast after %v, slow after %v", fast, slow)
			if fast < time.Second || slow < 2*time.Second {
				t.Fatalf("delivered before due: fast %v, slow %v", fast, slow)
			}
			if scan && fast < 2*time.Second {
				t.Fatalf("fast messages passed the 1024 earlier ones held by the processor: %v", fast)
			}
			if !scan && fast > 1900*time.Millisecond {
				t.Fatalf("exact delays: fast messages waited for slow ones: %v", fast)
			}
		})
	}
}

// A delayed message whose MessageID is still delayed is a hazard (the real server keys its delay
// processor by MessageID and loses one): strict mode refuses it, alone or in a batch, and counts
// it; the ID is free again once the first copy was delivered.
func TestRepeatedDelayedMessageID(t *testing.T) {
	for _, scan := range []bool{false, true} {
		t.Run(fmt.Sprintf("scan=%v", scan), func(t *testing.T) {
			e := newEnv(t, embedded.Options{Strict: true, ScanDelays: scan})
			m := delayedMsg("a", "first", 1)
			m.MessageID = "dup"
			if res := e.send(m); res.IsError {
				t.Fatal(res.Error)
			}
			again := delayedMsg("b", "second", 1)
			again.MessageID = "dup"
			if res := e.send(again); !res.IsError || !strings.HasPrefix(res.Error, "strict mode") {
				t.Fatalf("repeated delayed MessageID accepted: %+v", res)
			}
			other := delayedMsg("b", "other", 1)
			other.MessageID = "other"
			batch, err := e.c.SendQueueMessagesBatch(e.ctx, &pb.QueueMessagesBatchRequest{BatchID: "b", Messages: []*pb.QueueMessage{again, other}})
			if err != nil || !batch.HaveErrors || !batch.Results[0].IsError || batch.Results[1].IsError {
				t.Fatalf("batch: %v %+v", err, batch)
			}
			// Not delayed: no hazard.
			now := qmsg("b", "now")
			now.MessageID = "dup"
			if res := e.send(now); res.IsError {
				t.Fatal(res.Error)
			}
			if st := e.srv.StrictStats(); st.RepeatedDelayedID != 2 {
				t.Fatalf("counted %+v", st)
			}
			e.awaitAll("a", 1)
			if res := e.send(again); res.IsError {
				t.Fatalf("MessageID not freed after delivery: %s", res.Error)
			}
		})
	}
}

// Delayed messages kept in a data directory come back after a restart in scan mode too, in send
// order, and still count against their MessageID.
func TestScanDelaysRestore(t *testing.T) {
	dir := t.TempDir()
	open := func() *env {
		return newEnv(t, embedded.Options{Strict: true, ScanDelays: true, DataDir: dir, Logger: zaptest.NewLogger(t)})
	}
	e := open()
	for i, ch := range []string{"r", "r", "s"} {
		m := delayedMsg(ch, fmt.Sprint(i), 2)
		m.MessageID = fmt.Sprint("id-", i)
		if res := e.send(m); res.IsError {
			t.Fatal(res.Error)
		}
	}
	if err := e.srv.Close(); err != nil {
		t.Fatal(err)
	}
	e = open()
	m := delayedMsg("s", "x", 1)
	m.MessageID = "id-2"
	if res := e.send(m); !res.IsError {
		t.Fatal("restored delayed MessageID not counted")
	}
	d := e.downstream()
	r := d.get("r", 2, 10000)
	if bodies(r.Messages) != "0" && bodies(r.Messages) != "0,1" {
		t.Fatalf("restored order %s", bodies(r.Messages))
	}
	e.awaitAll("s", 1)
}
