package embedded

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/kubemq-io/kubemq-proxy/kubemqpb"
)

// With a data directory a stored queue message is held as an index only and read back from its
// segment when delivered; segments whose records are all settled are still deleted, and the
// others still read back, also after a restart.
func TestSpilledMessagesReadBack(t *testing.T) {
	dir := t.TempDir()
	opts := Options{DataDir: dir, SegmentBytes: 1 << 20, Logger: zaptest.NewLogger(t)}
	s, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { s.Stop() }()
	const n = 4000 // about 4 MiB: several segments
	body := func(i int) string { return fmt.Sprintf("%05d", i) + strings.Repeat("x", 1019) }
	var lsn uint64
	for i := 1; i <= n; i++ {
		var res *kubemqpb.SendQueueMessageResult
		res, lsn = s.sendQueue(&kubemqpb.QueueMessage{ClientID: "c", Channel: "q", Body: []byte(body(i)), Tags: map[string]string{"i": fmt.Sprint(i)}}, s.now())
		if res.IsError {
			t.Fatal(res.Error)
		}
	}
	if err := s.waitLog(lsn); err != nil {
		t.Fatal(err)
	}
	q := s.getQueue("q", false)
	for _, qm := range q.ready[q.head:] {
		if qm.m != nil {
			t.Fatal("a stored message is still held in memory with a data dir")
		}
	}
	if s.MemoryUsed() != 0 {
		t.Fatalf("MemoryUsed %d with every message in the log", s.MemoryUsed())
	}
	take := func(s *Server, max int, from int) []*qmsg {
		t.Helper()
		q := s.getQueue("q", false)
		q.mu.Lock()
		got, _, _, _ := q.takeLocked(s.now().UnixNano(), max, 1<<62, nil, false)
		q.mu.Unlock()
		shown := make([]int32, len(got))
		msgs, err := s.deliveries(got, shown)
		if err != nil {
			t.Fatal(err)
		}
		for i, m := range msgs {
			if string(m.Body) != body(from+i) || m.Tags["i"] != fmt.Sprint(from+i) || m.Attributes.Sequence != uint64(from+i) {
				t.Fatalf("message %d read back as sequence %d, body %.5q, tags %v", from+i, m.Attributes.Sequence, m.Body, m.Tags)
			}
		}
		return got
	}
	segments := func() int {
		ents, _ := os.ReadDir(dir)
		return len(ents)
	}
	before := segments()
	got := take(s, 3000, 1)
	q.mu.Lock()
	q.settleLocked(got)
	q.mu.Unlock()
	s.store.maintain()
	s.sendQueue(&kubemqpb.QueueMessage{ClientID: "c", Channel: "q", Body: []byte(body(n + 1)), Tags: map[string]string{"i": fmt.Sprint(n + 1)}}, s.now())
	s.store.maintain()
	if after := segments(); after >= before {
		t.Fatalf("segments: %d before, %d after settling 3000 of 4000", before, after)
	}
	got = take(s, 500, 3001)
	q.mu.Lock()
	q.giveBackLocked(got)
	q.mu.Unlock()

	// After a restart the index is rebuilt from the log and the rest reads back.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = New(opts)
	if err != nil {
		t.Fatal(err)
	}
	take(s, n+1-3000, 3001)
}

// A record that cannot be read back is an error for the consumer, never a panic, and the
// messages stay in the queue.
func TestSpilledMessageUnreadable(t *testing.T) {
	dir := t.TempDir()
	opts := Options{DataDir: dir, Logger: zaptest.NewLogger(t)}
	s, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	res, lsn := s.sendQueue(&kubemqpb.QueueMessage{ClientID: "c", Channel: "q", Body: []byte("x")}, s.now())
	if res.IsError || s.waitLog(lsn) != nil {
		t.Fatal(res.Error)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = New(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	q := s.getQueue("q", false)
	qm := q.ready[q.head]
	if err := os.Truncate(segPath(dir, qm.seg), qm.off+2); err != nil {
		t.Fatal(err)
	}
	resp, _ := s.ReceiveQueueMessages(t.Context(), &kubemqpb.ReceiveQueueMessagesRequest{ClientID: "c", Channel: "q", MaxNumberOfMessages: 1, WaitTimeSeconds: 1})
	if !resp.IsError || !strings.Contains(resp.Error, "cannot read messages back") {
		t.Fatalf("receive of an unreadable message: %+v", resp)
	}
	if q.count != 1 || q.waitingLocked() != 1 {
		t.Fatalf("the unreadable message left the queue: count %d waiting %d", q.count, q.waitingLocked())
	}
}

// A torn or damaged tail of the last segment (a crash mid-write) is cut off at the last good
// record when the log is replayed through its buffered reader; everything before it stays.
func TestReplayCutsTornTail(t *testing.T) {
	for name, tail := range map[string][]byte{
		"short header":   {0x10, 0, 0},
		"short record":   {0x20, 0, 0, 0, 1, 2, 3, 4, recQueueMsg, 1, 2},
		"bad checksum":   {0x03, 0, 0, 0, 1, 2, 3, 4, recQueueDel, 0, 0},
		"absurd length":  {0xff, 0xff, 0xff, 0x7f, 0, 0, 0, 0, 1},
		"zero length":    {0, 0, 0, 0, 0, 0, 0, 0, 0},
		"one good, torn": append(frame(nil, recChannelMeta, putStr(nil, "zz")), 0x40, 0),
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			opts := Options{DataDir: dir, Logger: zaptest.NewLogger(t)}
			s, err := New(opts)
			if err != nil {
				t.Fatal(err)
			}
			for i := 1; i <= 3; i++ {
				res, lsn := s.sendQueue(&kubemqpb.QueueMessage{ClientID: "c", Channel: "q", Body: []byte(fmt.Sprint(i))}, s.now())
				if res.IsError || s.waitLog(lsn) != nil {
					t.Fatal(res.Error)
				}
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			ents, _ := os.ReadDir(dir)
			last := dir + "/" + ents[len(ents)-1].Name()
			before, _ := os.Stat(last)
			f, err := os.OpenFile(last, os.O_APPEND|os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			f.Write(tail)
			f.Close()
			s, err = New(opts)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Stop()
			q := s.getQueue("q", false)
			if q == nil || q.count != 3 || headBody(t, s, q) != "1" {
				t.Fatalf("after a damaged tail: %+v", q)
			}
			after, _ := os.Stat(last)
			if name != "one good, torn" && after.Size() != before.Size() {
				t.Fatalf("segment %d bytes after the cut, %d before the damage", after.Size(), before.Size())
			}
		})
	}
}

// Recovery indexes every queue record through one reused message: each recovered index entry
// still has its own record's fields (queue, sequence, timestamp, expiry, receive limit, size, position),
// with the records of several queues and policies interleaved in the log, also in strict mode.
func TestRecoveryIndexesEachRecordsOwnFields(t *testing.T) {
	for _, strict := range []bool{false, true} {
		t.Run(fmt.Sprintf("strict=%v", strict), func(t *testing.T) {
			opts := Options{DataDir: t.TempDir(), SegmentBytes: 1 << 20, Strict: strict, Logger: zaptest.NewLogger(t)}
			s, err := New(opts)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { s.Stop() }()
			queues := []string{"a", "bb", "a.long.queue.name"}
			var lsn uint64
			for i := range 1500 { // about 1.5 MiB: two segments
				m := &kubemqpb.QueueMessage{ClientID: "c", Channel: queues[i%len(queues)], Body: []byte(strings.Repeat("x", 1+(i%400)*5))}
				if i%5 != 0 { // every fifth without a policy, the others with their own
					m.Policy = &kubemqpb.QueueMessagePolicy{MaxReceiveCount: int32(1 + i%7), ExpirationSeconds: int32(i%4) * 3600}
				}
				if i%2 == 0 {
					m.MessageID = fmt.Sprint("id-", i)
					m.Tags = map[string]string{"i": fmt.Sprint(i)}
				}
				var res *kubemqpb.SendQueueMessageResult
				res, lsn = s.sendQueue(m, s.now().Add(time.Duration(i)*time.Millisecond))
				if res.IsError {
					t.Fatal(res.Error)
				}
			}
			if err := s.waitLog(lsn); err != nil {
				t.Fatal(err)
			}
			type entry struct {
				seq       uint64
				ts, expAt int64
				size, off int64
				seg, n    uint32
				rc, maxRC int32
			}
			index := func(s *Server) map[string][]entry {
				got := map[string][]entry{}
				for _, name := range queues {
					q := s.getQueue(name, false)
					if q == nil {
						t.Fatalf("queue %s missing", name)
					}
					q.mu.Lock()
					for _, qm := range q.ready[q.head:] {
						if qm.m != nil {
							t.Fatalf("queue %s: message %d held whole", name, qm.seq())
						}
						got[name] = append(got[name], entry{qm.seq(), qm.ts, qm.expAt, qm.size, qm.off, qm.seg, qm.n, qm.rc, qm.maxRC})
					}
					q.mu.Unlock()
				}
				return got
			}
			before := index(s)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s, err = New(opts)
			if err != nil {
				t.Fatal(err)
			}
			after := index(s)
			for _, name := range queues {
				if len(before[name]) != 500 || len(after[name]) != len(before[name]) {
					t.Fatalf("queue %s: %d entries before the restart, %d after (want 500)", name, len(before[name]), len(after[name]))
				}
				for i := range before[name] {
					if before[name][i] != after[name][i] {
						t.Fatalf("queue %s entry %d: %+v before the restart, %+v after", name, i, before[name][i], after[name][i])
					}
				}
			}
		})
	}
}
