package embedded

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/kubemq-io/kubemq-proxy/kubemqpb"
)

// eventBody is the body of the i-th test event (1 KiB).
func eventBody(i int) string { return fmt.Sprintf("%05d", i) + strings.Repeat("e", 1019) }

func publishN(t *testing.T, s *Server, ch string, from, to int, clk *fakeClock) {
	t.Helper()
	var lsn uint64
	for i := from; i <= to; i++ {
		res, l, msg := s.publish(&kubemqpb.Event{EventID: fmt.Sprintf("id%d", i), ClientID: "c", Channel: ch, Metadata: fmt.Sprintf("m%d", i),
			Body: []byte(eventBody(i)), Tags: map[string]string{"i": fmt.Sprint(i)}, Store: true})
		if msg != "" || !res.Sent {
			t.Fatal(msg, res.Error)
		}
		lsn = l
		if clk != nil {
			clk.add(time.Millisecond)
		}
	}
	if err := s.waitLog(lsn); err != nil {
		t.Fatal(err)
	}
}

// checkEvent fails unless e is the i-th test event, whole.
func checkEvent(t *testing.T, e *kubemqpb.EventReceive, ch string, i int) {
	t.Helper()
	if e.Sequence != uint64(i) || e.EventID != fmt.Sprintf("id%d", i) || e.Channel != ch || e.Metadata != fmt.Sprintf("m%d", i) ||
		string(e.Body) != eventBody(i) || len(e.Tags) != 1 || e.Tags["i"] != fmt.Sprint(i) || e.Timestamp == 0 {
		t.Fatalf("event %d read back as sequence %d, id %q, channel %q, metadata %q, body %.5q, tags %v", i, e.Sequence, e.EventID, e.Channel, e.Metadata, e.Body, e.Tags)
	}
}

// readAll reads the channel's events from sequence seq on as a dispatcher does (without
// registering as one) and checks them against the test events.
func readAll(t *testing.T, s *Server, ch string, seq uint64, wantFrom, wantTo int) {
	t.Helper()
	c := s.getChannel(ch, false)
	n := 0
	for {
		evs, first, _ := c.readFrom(s, nil, seq, 300)
		if len(evs) == 0 {
			break
		}
		es, err := s.loadEvents(evs, first)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range es {
			checkEvent(t, e, ch, wantFrom+n)
			n++
		}
		seq = first + uint64(len(es))
	}
	if n != wantTo-wantFrom+1 {
		t.Fatalf("read %d events from %d, want %d-%d", n, seq, wantFrom, wantTo)
	}
}

// With a data directory an events-store event is held as an index only and read back from its
// segment when replayed, also after a restart; retention drops old events and their segments are
// deleted; a start time finds the first event at or after it from the index.
func TestStoredEventsReadBack(t *testing.T) {
	dir := t.TempDir()
	clk := &fakeClock{t: time.Now()}
	opts := Options{DataDir: dir, SegmentBytes: 1 << 20, Now: clk.now, Logger: zaptest.NewLogger(t)}
	s, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { s.Stop() }()
	const n = 4000 // about 4 MiB: several segments
	publishN(t, s, "ev", 1, n, clk)
	c := s.getChannel("ev", false)
	c.mu.Lock()
	for i := range c.events {
		if c.events[i].e != nil {
			t.Fatalf("event %d is still held whole with no subscriber", i+1)
		}
	}
	c.mu.Unlock()
	if s.MemoryUsed() != 0 {
		t.Fatalf("MemoryUsed %d with every event in the log", s.MemoryUsed())
	}
	readAll(t, s, "ev", 1, 1, n)
	readAll(t, s, "ev", 1234, 1234, n)

	// The 2,500 oldest age out: their segments go (the rest pin theirs).
	segments := func() int {
		ents, _ := os.ReadDir(dir)
		return len(ents)
	}
	before := segments()
	clk.add(24*time.Hour - time.Duration(n-2500)*time.Millisecond)
	s.applyRetention()
	if c.first != 2501 || len(c.events) != n-2500 {
		t.Fatalf("after retention: first %d, %d events", c.first, len(c.events))
	}
	s.store.maintain()
	publishN(t, s, "other", 1, 1, nil) // a record in the newest segment after the snapshot
	s.store.maintain()
	if after := segments(); after >= before-1 {
		t.Fatalf("segments: %d before, %d after 2,500 of 4,000 events aged out", before, after)
	}
	readAll(t, s, "ev", 1, 2501, n)
	ts := func(i int) int64 {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.events[i-int(c.first)].ts
	}
	if cur := c.startCursor(kubemqpb.Subscribe_StartAtTime, ts(3000), clk.now()); cur != 2999 {
		t.Fatalf("StartAtTime of event 3000: cursor %d", cur)
	}

	// After a restart the index is rebuilt from the log (retention applies the same age rule).
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	want3000 := ts(3000)
	s, err = New(opts)
	if err != nil {
		t.Fatal(err)
	}
	s.applyRetention()
	c = s.getChannel("ev", false)
	if c.first != 2501 || c.last != n || len(c.events) != n-2500 || s.MemoryUsed() != 0 {
		t.Fatalf("after restart: first %d last %d, %d events, memory %d", c.first, c.last, len(c.events), s.MemoryUsed())
	}
	if got := ts(3000); got != want3000 {
		t.Fatalf("timestamp of event 3000 after restart %d, before %d", got, want3000)
	}
	readAll(t, s, "ev", 2000, 2501, n)
	publishN(t, s, "ev", n+1, n+10, clk)
	readAll(t, s, "ev", 3500, 3500, n+10)
}

// serveInternal serves s on a loopback listener and returns a client.
func serveInternal(t *testing.T, s *Server) kubemqpb.KubemqClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return kubemqpb.NewKubemqClient(conn)
}

func subscribeStoreAt(t *testing.T, c kubemqpb.KubemqClient, ctx context.Context, client, ch string, mode kubemqpb.Subscribe_EventsStoreType, v int64) kubemqpb.Kubemq_SubscribeToEventsClient {
	t.Helper()
	sub, err := c.SubscribeToEvents(ctx, &kubemqpb.Subscribe{SubscribeTypeData: kubemqpb.Subscribe_EventsStore, ClientID: client, Channel: ch,
		EventsStoreTypeData: mode, EventsStoreTypeValue: v})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sub.Header(); err != nil { // registered
		t.Fatal(err)
	}
	return sub
}

// A live subscriber gets new events from the send path without a read from the log; once it has
// read them they are dropped from memory. A subscriber that does not keep up holds at most
// hotEventBytes of whole events; the rest it reads back from the log, in order.
func TestLiveEventsStoreSubscriberReadsNoDisk(t *testing.T) {
	s, err := New(Options{DataDir: t.TempDir(), Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	client := serveInternal(t, s)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	sub := subscribeStoreAt(t, client, ctx, "live", "ev", kubemqpb.Subscribe_StartNewOnly, 0)
	const n = 2000
	done := make(chan error, 1)
	go func() {
		for i := 1; i <= n; i++ {
			e, err := sub.Recv()
			if err != nil {
				done <- err
				return
			}
			if e.Sequence != uint64(i) || string(e.Body) != eventBody(i) {
				done <- fmt.Errorf("event %d: sequence %d body %.5q", i, e.Sequence, e.Body)
				return
			}
		}
		done <- nil
	}()
	for i := 1; i <= n; i++ {
		publishN(t, s, "ev", i, i, nil) // one at a time: the subscriber keeps up
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if r := s.store.reads.Load(); r != 0 {
		t.Fatalf("%d reads from the log for a live subscriber", r)
	}
	// Everything read: nothing held whole once the dispatcher has looked for more.
	c := s.getChannel("ev", false)
	deadline := time.Now().Add(20 * time.Second)
	for s.MemoryUsed() != 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if s.MemoryUsed() != 0 {
		t.Fatalf("MemoryUsed %d after the subscriber read every event", s.MemoryUsed())
	}

	// A subscriber that does not read: the whole events kept for it stay within the bound.
	slow := subscribeStoreAt(t, client, ctx, "slow", "ev", kubemqpb.Subscribe_StartNewOnly, 0)
	const m = 12000 // about 12 MiB
	publishN(t, s, "ev", n+1, n+m, nil)
	c.mu.Lock()
	hot, used := c.hotBytes, s.MemoryUsed()
	c.mu.Unlock()
	if hot > hotEventBytes || used > hotEventBytes {
		t.Fatalf("%d bytes of whole events held (counted %d) for a subscriber that does not read, bound %d", hot, used, hotEventBytes)
	}
	for i := n + 1; i <= n+m; i++ {
		e, err := slow.Recv()
		if err != nil {
			t.Fatal(err)
		}
		checkEvent(t, e, "ev", i)
	}
	if s.store.reads.Load() == 0 {
		t.Fatal("a subscriber 12 MiB behind read nothing back from the log")
	}
}

// An event whose record is gone from the log ends the subscription with an error (the cursor
// stays before it); nothing panics or hangs.
func TestStoredEventUnreadable(t *testing.T) {
	dir := t.TempDir()
	opts := Options{DataDir: dir, Logger: zaptest.NewLogger(t)}
	s, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	publishN(t, s, "ev", 1, 3, nil)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = New(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	c := s.getChannel("ev", false)
	if err := os.Truncate(segPath(dir, c.events[0].seg), c.events[0].off+2); err != nil {
		t.Fatal(err)
	}
	client := serveInternal(t, s)
	sub := subscribeStoreAt(t, client, t.Context(), "r", "ev", kubemqpb.Subscribe_StartFromFirst, 0)
	_, err = sub.Recv()
	if status.Code(err) != codes.Internal || !strings.Contains(err.Error(), "Error 121: cannot read messages back from the store") {
		t.Fatalf("subscription over an unreadable event: %v", err)
	}
	if len(c.events) != 3 {
		t.Fatalf("%d events left", len(c.events))
	}
}

// With a data directory a delayed message is held as an index only until it is due, then read
// back from its record into its queue, whole; also when it was delayed before a restart. (Delays
// of 3 s: the checks before they end take well under that.)
func TestDelayedMessagesReadBack(t *testing.T) {
	dir := t.TempDir()
	opts := Options{DataDir: dir, Logger: zaptest.NewLogger(t)}
	s, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { s.Stop() }()
	send := func(s *Server, from, to int) {
		t.Helper()
		var lsn uint64
		for i := from; i <= to; i++ {
			var res *kubemqpb.SendQueueMessageResult
			res, lsn = s.sendQueue(&kubemqpb.QueueMessage{MessageID: fmt.Sprintf("id%d", i), ClientID: "c", Channel: "q", Metadata: "m",
				Body: []byte(eventBody(i)), Tags: map[string]string{"i": fmt.Sprint(i)}, Policy: &kubemqpb.QueueMessagePolicy{DelaySeconds: 3}}, s.now())
			if res.IsError {
				t.Fatal(res.Error)
			}
		}
		if err := s.waitLog(lsn); err != nil {
			t.Fatal(err)
		}
	}
	indexOnly := func(s *Server, want int) {
		t.Helper()
		d := s.delays
		d.mu.Lock()
		n := len(d.h)
		for _, x := range d.h {
			if x.m != nil {
				d.mu.Unlock()
				t.Fatal("a delayed message is held whole with a data dir")
			}
		}
		d.mu.Unlock()
		if n != want || s.MemoryUsed() != 0 {
			t.Fatalf("%d delayed messages held (want %d), MemoryUsed %d", n, want, s.MemoryUsed())
		}
	}
	arrive := func(s *Server, from, to int) {
		t.Helper()
		q := s.getQueue("q", true)
		deadline := time.Now().Add(30 * time.Second)
		for {
			q.mu.Lock()
			n := q.waitingLocked()
			q.mu.Unlock()
			if n >= int64(to-from+1) || time.Now().After(deadline) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		q.mu.Lock()
		got, _, _, _ := q.takeLocked(s.now().UnixNano(), to-from+1, 1<<62, nil, false)
		q.settleLocked(got)
		q.mu.Unlock()
		ms, err := s.deliveries(got, make([]int32, len(got)))
		if err != nil {
			t.Fatal(err)
		}
		if len(ms) != to-from+1 {
			t.Fatalf("%d delayed messages arrived, want %d", len(ms), to-from+1)
		}
		seen := map[string]bool{}
		for _, m := range ms {
			i := m.Tags["i"]
			var k int
			fmt.Sscan(i, &k)
			if m.MessageID != "id"+i || string(m.Body) != eventBody(k) || m.Metadata != "m" || k < from || k > to || seen[i] {
				t.Fatalf("delayed message arrived as id %q, tags %v, body %.5q", m.MessageID, m.Tags, m.Body)
			}
			seen[i] = true
		}
	}
	send(s, 1, 500)
	indexOnly(s, 500)
	arrive(s, 1, 500)
	send(s, 501, 800)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = New(opts)
	if err != nil {
		t.Fatal(err)
	}
	indexOnly(s, 300)
	arrive(s, 501, 800)
}
