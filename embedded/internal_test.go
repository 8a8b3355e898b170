package embedded

import (
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/kubemq-io/kubemq-proxy/kubemqpb"
)

type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func TestRetentionRemovesOldMessagesAndEvents(t *testing.T) {
	clk := &fakeClock{t: time.Now()}
	s, err := New(Options{Now: clk.now, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	for range 3 {
		if res, _ := s.sendQueue(&kubemqpb.QueueMessage{ClientID: "c", Channel: "q", Body: []byte("x")}, clk.now()); res.IsError {
			t.Fatal(res.Error)
		}
		if _, _, msg := s.publish(&kubemqpb.Event{ClientID: "c", Channel: "e", Body: []byte("x"), Store: true}); msg != "" {
			t.Fatal(msg)
		}
	}
	clk.add(23 * time.Hour)
	s.sendQueue(&kubemqpb.QueueMessage{ClientID: "c", Channel: "q", Body: []byte("new")}, clk.now())
	s.publish(&kubemqpb.Event{ClientID: "c", Channel: "e", Body: []byte("new"), Store: true})
	clk.add(2 * time.Hour)
	s.applyRetention()
	q := s.getQueue("q", false)
	if q.waitingLocked() != 1 || q.count != 1 || headBody(t, s, q) != "new" {
		t.Fatalf("queue after retention: waiting %d count %d", q.waitingLocked(), q.count)
	}
	c := s.getChannel("e", false)
	if len(c.events) != 1 || c.first != 4 || c.last != 4 {
		t.Fatalf("channel after retention: first %d last %d n %d", c.first, c.last, len(c.events))
	}
}

func TestLogSegmentsAreDeletedWhenSettled(t *testing.T) {
	dir := t.TempDir()
	s, err := New(Options{DataDir: dir, SegmentBytes: 1 << 20, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	body := []byte(strings.Repeat("x", 1024))
	var lsn uint64
	for range 4000 { // about 4 MiB: several segments
		var res *kubemqpb.SendQueueMessageResult
		res, lsn = s.sendQueue(&kubemqpb.QueueMessage{ClientID: "c", Channel: "q", Body: body}, s.now())
		if res.IsError {
			t.Fatal(res.Error)
		}
	}
	if err := s.waitLog(lsn); err != nil {
		t.Fatal(err)
	}
	count := func() int {
		ents, _ := os.ReadDir(dir)
		return len(ents)
	}
	before := count()
	if before < 4 {
		t.Fatalf("only %d segments", before)
	}
	q := s.getQueue("q", false)
	q.mu.Lock()
	got, _, _, _ := q.takeLocked(s.now().UnixNano(), 1<<30, 1<<62, nil, false)
	q.settleLocked(got)
	q.mu.Unlock()
	s.store.maintain() // snapshot after the last rotation...
	s.sendQueue(&kubemqpb.QueueMessage{ClientID: "c", Channel: "q", Body: body}, s.now())
	s.store.maintain() // ...then delete what is settled
	if after := count(); after >= before || after > 2 {
		t.Fatalf("segments: %d before, %d after settling everything", before, after)
	}
	// The state survives a restart from what is left: the sequence goes on.
	s.Stop()
	s2, err := New(Options{DataDir: dir, SegmentBytes: 1 << 20, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Stop()
	q2 := s2.getQueue("q", false)
	if q2.lastSeq != 4001 || q2.count != 1 {
		t.Fatalf("after restart lastSeq %d count %d", q2.lastSeq, q2.count)
	}
}
