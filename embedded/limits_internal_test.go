package embedded

import (
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/kubemq-io/kubemq-proxy/kubemqpb"
)

func sendQ(t *testing.T, s *Server, ch, body string, now time.Time) *kubemqpb.SendQueueMessageResult {
	t.Helper()
	res, lsn := s.sendQueue(&kubemqpb.QueueMessage{ClientID: "c", Channel: ch, Body: []byte(body)}, now)
	if err := s.waitLog(lsn); err != nil {
		t.Fatal(err)
	}
	return res
}

func publishE(t *testing.T, s *Server, ch, body string) *kubemqpb.Result {
	t.Helper()
	res, lsn, msg := s.publish(&kubemqpb.Event{ClientID: "c", Channel: ch, Body: []byte(body), Store: true})
	if msg != "" {
		t.Fatal(msg)
	}
	if err := s.waitLog(lsn); err != nil {
		t.Fatal(err)
	}
	return res
}

func TestRetentionForever(t *testing.T) {
	clk := &fakeClock{t: time.Now()}
	s, err := New(Options{Now: clk.now, MaxRetention: -1, MaxPurgeInactive: -1, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	sendQ(t, s, "q", "x", clk.now())
	publishE(t, s, "e", "x")
	clk.add(400 * 24 * time.Hour)
	s.applyRetention()
	s.purgeInactive()
	if q := s.getQueue("q", false); q == nil || q.count != 1 {
		t.Fatal("queue message gone with unlimited retention")
	}
	if c := s.getChannel("e", false); c == nil || len(c.events) != 1 {
		t.Fatal("event gone with unlimited retention")
	}
}

// STORE_MAX_PURGE_INACTIVE: a queue or channel without new messages and connected consumers for
// that long is deleted with its messages and durables; sequences start again; a restart does not
// bring it back.
func TestPurgeInactive(t *testing.T) {
	for _, dir := range []string{"", t.TempDir()} {
		clk := &fakeClock{t: time.Now()}
		opts := Options{Now: clk.now, DataDir: dir, MaxRetention: -1, MaxPurgeInactive: time.Hour, Logger: zaptest.NewLogger(t)}
		s, err := New(opts)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range []string{"a", "b"} {
			sendQ(t, s, "idle", b, clk.now())
			sendQ(t, s, "busy", b, clk.now())
			publishE(t, s, "ev", b)
		}
		s.mu.Lock()
		ch := s.channels["ev"]
		s.durables["k"] = &durable{key: "k", channel: "ev", ch: ch}
		s.mu.Unlock()
		clk.add(50 * time.Minute)
		sendQ(t, s, "busy", "c", clk.now())
		clk.add(20 * time.Minute)
		used := s.MemoryUsed()
		s.purgeInactive()
		if s.getQueue("idle", false) != nil || s.getChannel("ev", false) != nil {
			t.Fatal("inactive queue or channel not purged")
		}
		if q := s.getQueue("busy", false); q == nil || q.count != 3 {
			t.Fatal("active queue purged")
		}
		s.mu.RLock()
		_, dur := s.durables["k"]
		_, listed := s.listed["idle"]
		s.mu.RUnlock()
		if dur || listed {
			t.Fatalf("purged channel's durable kept %v, purged queue still listed %v", dur, listed)
		}
		// In memory the purged messages free their bytes; with a data dir they were held as an
		// index only (nothing counted), and stay at nothing.
		if got := s.MemoryUsed(); (dir == "" && got >= used) || (dir != "" && (used != 0 || got != 0)) {
			t.Fatalf("memory used %d after the purge, %d before", got, used)
		}
		// A new send starts a new queue, from sequence 1.
		if res := sendQ(t, s, "idle", "new", clk.now()); res.IsError {
			t.Fatal(res.Error)
		}
		if q := s.getQueue("idle", false); q.lastSeq != 1 || q.count != 1 {
			t.Fatalf("queue after purge: last sequence %d, %d messages", q.lastSeq, q.count)
		}
		if r := publishE(t, s, "ev", "new"); !r.Sent {
			t.Fatal(r.Error)
		}
		if c := s.getChannel("ev", false); c.first != 1 || c.last != 1 {
			t.Fatalf("channel after purge: %d..%d", c.first, c.last)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if dir == "" {
			continue
		}
		s, err = New(opts)
		if err != nil {
			t.Fatal(err)
		}
		q := s.getQueue("idle", false)
		c := s.getChannel("ev", false)
		if q == nil || q.count != 1 || headBody(t, s, q) != "new" || c == nil || len(c.events) != 1 || c.first != 1 {
			t.Fatalf("after restart the purged state came back: queue %+v channel %+v", q, c)
		}
		s.mu.RLock()
		_, dur = s.durables["k"]
		s.mu.RUnlock()
		if dur {
			t.Fatal("purged durable back after restart")
		}
		s.Stop()
	}
}

// A queue whose consumer waits, or that has messages held, is active.
func TestPurgeKeepsConsumedQueues(t *testing.T) {
	clk := &fakeClock{t: time.Now()}
	s, err := New(Options{Now: clk.now, MaxPurgeInactive: time.Hour, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	sendQ(t, s, "q", "a", clk.now())
	q := s.getQueue("q", false)
	q.mu.Lock()
	got, _, _, _ := q.takeLocked(clk.now().UnixNano(), 1, 1<<20, nil, false)
	q.mu.Unlock()
	clk.add(2 * time.Hour)
	s.purgeInactive()
	if s.getQueue("q", false) == nil {
		t.Fatal("queue with a held message purged")
	}
	q.mu.Lock()
	q.giveBackLocked(got)
	q.mu.Unlock()
	s.purgeInactive()
	if s.getQueue("q", false) != nil {
		t.Fatal("idle queue kept")
	}
}

// Per-channel limits lowered between runs apply at the restart.
func TestChannelLimitsAtRecovery(t *testing.T) {
	dir := t.TempDir()
	s, err := New(Options{DataDir: dir, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range []string{"1", "2", "3", "4"} {
		sendQ(t, s, "q", b, time.Now())
		publishE(t, s, "e", b)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = New(Options{DataDir: dir, MaxChannelMessages: 2, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	q := s.getQueue("q", false)
	c := s.getChannel("e", false)
	if q.count != 2 || headBody(t, s, q) != "3" || len(c.events) != 2 || c.first != 3 {
		t.Fatalf("after restart with a limit of 2: %d messages from %q, %d events from %d", q.count, headBody(t, s, q), len(c.events), c.first)
	}
}

// MaxMemory refuses a client's send beyond it with a clear error, takes it again once consumers
// freed memory, and never refuses delayed messages (lease records) or moves.
func TestMaxMemory(t *testing.T) {
	s, err := New(Options{MaxMemory: 10_000, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	body := strings.Repeat("x", 1000)
	n := 0
	var refusal string
	for i := 0; i < 20; i++ {
		res := sendQ(t, s, "q", body, time.Now())
		if res.IsError {
			refusal = res.Error
			break
		}
		n++
	}
	if n < 8 || n > 10 || !strings.HasPrefix(refusal, "memory limit reached:") {
		t.Fatalf("%d sends of 1 KB under a 10,000-byte limit, then %q", n, refusal)
	}
	if used := s.MemoryUsed(); used > 10_000 {
		t.Fatalf("memory used %d over the limit", used)
	}
	// Batches refuse per message.
	results, haveErrors, _ := s.sendBatch([]*kubemqpb.QueueMessage{{ClientID: "c", Channel: "q", Body: []byte(body)}})
	if !haveErrors || !strings.HasPrefix(results[0].Error, "memory limit reached:") {
		t.Fatalf("batch: %+v", results[0])
	}
	// Delayed messages are not refused.
	res, _ := s.sendQueue(&kubemqpb.QueueMessage{ClientID: "c", Channel: "lease", Body: []byte(body), Policy: &kubemqpb.QueueMessagePolicy{DelaySeconds: 60}}, time.Now())
	if res.IsError {
		t.Fatalf("delayed message refused: %s", res.Error)
	}
	// Events-store publishes have a reserve of an eighth beyond the limit, then are refused
	// with Sent=false.
	r, _, _ := s.publish(&kubemqpb.Event{ClientID: "c", Channel: "e", Body: []byte("small"), Store: true})
	if !r.Sent {
		t.Fatalf("small event refused inside the reserve: %s", r.Error)
	}
	r, _, _ = s.publish(&kubemqpb.Event{ClientID: "c", Channel: "e", Body: []byte(strings.Repeat("y", 3000)), Store: true})
	if r.Sent || !strings.HasPrefix(r.Error, "memory limit reached:") {
		t.Fatalf("event beyond the reserve: %+v", r)
	}
	// Consuming frees memory: sends are taken again.
	q := s.getQueue("q", false)
	q.mu.Lock()
	got, _, _, _ := q.takeLocked(time.Now().UnixNano(), 5, 1<<20, nil, false)
	q.settleLocked(got)
	q.mu.Unlock()
	if res := sendQ(t, s, "q", body, time.Now()); res.IsError {
		t.Fatalf("send after consumers freed memory: %s", res.Error)
	}
}

// headBody is the body of the first visible message of q, read back from the log if need be.
func headBody(t *testing.T, s *Server, q *queue) string {
	t.Helper()
	if q.head >= len(q.ready) {
		return ""
	}
	m, err := s.load(q.ready[q.head])
	if err != nil {
		t.Fatal(err)
	}
	return string(m.Body)
}
