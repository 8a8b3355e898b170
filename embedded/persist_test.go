package embedded_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/kubemq-io/kubemq-proxy/embedded"
	pb "github.com/kubemq-io/kubemq-proxy/kubemqpb"
)

// startOn runs a server on dir until the test ends or stop is called.
func startOn(t *testing.T, dir string) (*env, func()) {
	t.Helper()
	srv, err := embedded.New(embedded.Options{Strict: true, DataDir: dir, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(lis) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			if err := srv.Close(); err != nil {
				t.Errorf("close: %v", err)
			}
			<-done
		})
	}
	t.Cleanup(stop)
	return &env{t: t, srv: srv, c: dial(t, lis.Addr().String()), ctx: testCtx(t)}, stop
}

func TestPersistAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	e, stop := startOn(t, dir)
	e.mustSend("q", "1", "2", "3", "4")
	e.send(&pb.QueueMessage{ClientID: "c", Channel: "q", Body: []byte("late"), Policy: &pb.QueueMessagePolicy{DelaySeconds: 1}})
	d := e.downstream()
	r := d.get("q", 3, 1000)
	d.op(&pb.QueuesDownstreamRequest{RequestTypeData: pb.QueuesDownstreamRequestType_AckRange, RefTransactionId: r.TransactionId, SequenceRange: []int64{1}}, r.TransactionId)
	d.op(&pb.QueuesDownstreamRequest{RequestTypeData: pb.QueuesDownstreamRequestType_NAckRange, RefTransactionId: r.TransactionId, SequenceRange: []int64{2}}, r.TransactionId)
	// seq 3 stays held by the open transaction.
	e.publish("es", true, "a", "b")
	s := e.mustSubscribe(storeSub("dur", "es", "", pb.Subscribe_StartFromFirst, 0))
	if got := s.next(2); got != "a@1,b@2" {
		t.Fatal(got)
	}
	s.cancel()
	e.waitReleased("dur")
	e.publish("es", true, "c")
	stop()

	e2, _ := startOn(t, dir)
	d2 := e2.downstream()
	r2 := d2.get("q", 3, 1000)
	// The held seq 3 comes back (unchanged), 4 as it was, the nacked copy as seq 5 with rc 2.
	if got := fmt.Sprint(seqs(r2.Messages)); got != "[3 4 5]" || bodies(r2.Messages) != "3,4,2" {
		t.Fatalf("after restart %s %s", got, bodies(r2.Messages))
	}
	if rc := r2.Messages[0].Attributes.ReceiveCount; rc != 1 {
		t.Fatalf("held copy rc %d", rc)
	}
	if rc := r2.Messages[2].Attributes.ReceiveCount; rc != 2 {
		t.Fatalf("nacked copy rc %d", rc)
	}
	d2.send(&pb.QueuesDownstreamRequest{RequestTypeData: pb.QueuesDownstreamRequestType_AckAll, RefTransactionId: r2.TransactionId})
	// The delayed message still arrives, with the next sequence.
	d2.send(&pb.QueuesDownstreamRequest{RequestTypeData: pb.QueuesDownstreamRequestType_Get, Channel: "q", MaxItems: 1, WaitTimeout: 10000, AutoAck: true})
	if x := d2.recv(); bodies(x.Messages) != "late" || x.Messages[0].Attributes.Sequence != 6 {
		t.Fatalf("delayed after restart %+v", x)
	}
	e2.mustSend("q", "new")
	if info := e2.info("q"); info.LastSequence != 7 {
		t.Fatalf("sequence did not continue: %+v", info)
	}
	// The durable cursor resumes after what was handed out before the restart; the store keeps
	// every event with its sequence.
	s2 := e2.mustSubscribe(storeSub("dur", "es", "", pb.Subscribe_StartFromFirst, 0))
	e2.publish("es", true, "d")
	if got := s2.next(2); got != "c@3,d@4" {
		t.Fatalf("durable after restart %s", got)
	}
}

// TestHelperServer is the child process of TestCrashKill9: it serves on a data dir until killed.
func TestHelperServer(t *testing.T) {
	dir := os.Getenv("EMBEDDED_HELPER_DIR")
	if dir == "" {
		t.Skip("helper process for TestCrashKill9")
	}
	srv, err := embedded.New(embedded.Options{Strict: true, DataDir: dir})
	if err != nil {
		fmt.Println("ERR", err)
		os.Exit(1)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Println("ERR", err)
		os.Exit(1)
	}
	fmt.Println("ADDR", lis.Addr().String())
	_ = srv.Serve(lis)
}

func startChild(t *testing.T, dir string) (*exec.Cmd, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperServer$", "-test.count=1")
	cmd.Env = append(os.Environ(), "EMBEDDED_HELPER_DIR="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		line := sc.Text()
		if addr, ok := strings.CutPrefix(line, "ADDR "); ok {
			go func() {
				for sc.Scan() {
				}
			}()
			return cmd, addr
		}
		if strings.HasPrefix(line, "ERR") {
			t.Fatal(line)
		}
	}
	t.Fatalf("child exited without an address: %v", sc.Err())
	return nil, ""
}

// TestCrashKill9 sends queue and events-store load, kills the server with SIGKILL mid-load,
// restarts it on the same directory and checks that every acknowledged message is there.
func TestCrashKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("crash test")
	}
	dir := t.TempDir()
	cmd, addr := startChild(t, dir)
	c := dial(t, addr)
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()

	var mu sync.Mutex
	ackedQ := map[string]bool{}
	ackedE := map[string]bool{}
	body := []byte(strings.Repeat("x", 1024))
	var wg sync.WaitGroup
	enough := make(chan struct{})
	var once sync.Once
	for w := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				var msgs []*pb.QueueMessage
				for j := range 50 {
					m := &pb.QueueMessage{MessageID: fmt.Sprintf("q%d-%d-%d", w, i, j), ClientID: "c", Channel: fmt.Sprintf("crash%d", j%2), Body: body}
					if w == 2 && j%10 == 0 {
						// Delayed messages must survive too, and still come due.
						m.Channel = "crash.delayed"
						m.Policy = &pb.QueueMessagePolicy{DelaySeconds: 1}
					}
					msgs = append(msgs, m)
				}
				res, err := c.SendQueueMessagesBatch(ctx, &pb.QueueMessagesBatchRequest{Messages: msgs})
				if err != nil {
					return
				}
				mu.Lock()
				for _, r := range res.Results {
					if !r.IsError {
						ackedQ[r.MessageID] = true
					}
				}
				if len(ackedQ) >= 6000 {
					once.Do(func() { close(enough) })
				}
				mu.Unlock()
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		st, err := c.SendEventsStream(ctx)
		if err != nil {
			return
		}
		go func() {
			for i := 0; ; i++ {
				if st.Send(&pb.Event{EventID: fmt.Sprintf("e%d", i), ClientID: "p", Channel: "crash.events", Body: body, Store: true}) != nil {
					return
				}
			}
		}()
		for {
			r, err := st.Recv()
			if err != nil {
				return
			}
			if r.Sent {
				mu.Lock()
				ackedE[r.EventID] = true
				mu.Unlock()
			}
		}
	}()
	select {
	case <-enough:
	case <-ctx.Done():
		t.Fatal("load did not reach 6000 acknowledged messages")
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	wg.Wait()
	mu.Lock()
	nq, ne := len(ackedQ), len(ackedE)
	mu.Unlock()
	if ne == 0 {
		t.Fatal("no events acknowledged before the kill")
	}
	t.Logf("acknowledged before SIGKILL: %d queue messages, %d events", nq, ne)

	_, addr2 := startChild(t, dir)
	c2 := dial(t, addr2)
	e := &env{t: t, c: c2, ctx: testCtx(t)}
	seen := map[string]bool{}
	for _, q := range []string{"crash0", "crash1"} {
		info := e.info(q)
		d := e.downstream()
		for n := info.Waiting; n > 0; {
			r := d.get(q, int32(min(n, 5000)), 1000)
			for _, m := range r.Messages {
				seen[m.MessageID] = true
			}
			n -= int64(len(r.Messages))
			d.send(&pb.QueuesDownstreamRequest{RequestTypeData: pb.QueuesDownstreamRequestType_AckAll, RefTransactionId: r.TransactionId})
		}
	}
	// Delayed ones arrive within about a second of the restart.
	dd := e.downstream()
	for {
		want := 0
		for id := range ackedQ {
			var w, i, j int
			if _, err := fmt.Sscanf(id, "q%d-%d-%d", &w, &i, &j); err == nil && w == 2 && j%10 == 0 && !seen[id] {
				want++
			}
		}
		if want == 0 {
			break
		}
		dd.send(&pb.QueuesDownstreamRequest{RequestTypeData: pb.QueuesDownstreamRequestType_Get, Channel: "crash.delayed", MaxItems: int32(want), WaitTimeout: 5000, AutoAck: true})
		r := dd.recv()
		if len(r.Messages) == 0 {
			break // the final check below reports what is missing
		}
		for _, m := range r.Messages {
			seen[m.MessageID] = true
		}
	}
	missing := 0
	for id := range ackedQ {
		if !seen[id] {
			missing++
		}
	}
	if missing > 0 {
		t.Fatalf("%d of %d acknowledged queue messages lost", missing, nq)
	}
	// Replay the channel up to a marker published after the restart.
	e.publish("crash.events", true, "marker")
	s := e.mustSubscribe(storeSub("check", "crash.events", "", pb.Subscribe_StartFromFirst, 0))
	got := 0
	var last uint64
	for {
		ev, err := s.s.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if ev.Sequence != last+1 {
			t.Fatalf("events sequence gap: %d after %d", ev.Sequence, last)
		}
		last = ev.Sequence
		if string(ev.Body) == "marker" {
			break
		}
		if ackedE[ev.EventID] {
			got++
		}
	}
	if got != ne {
		t.Fatalf("%d of %d acknowledged events lost", ne-got, ne)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) == 0 || filepath.Ext(ents[0].Name()) != ".log" {
		t.Fatalf("data dir %v", ents)
	}
}

// Events-store events replay from the log after a restart, whole (id, metadata, body, tags,
// sequence, timestamp), from the first, from a sequence, from a time, from a time delta and from
// the last; the sequence continues.
func TestEventsStoreReplayAfterRestart(t *testing.T) {
	dir := t.TempDir()
	e, stop := startOn(t, dir)
	const n = 300
	for i := 1; i <= n; i++ {
		r, err := e.c.SendEvent(e.ctx, &pb.Event{EventID: fmt.Sprintf("id%d", i), ClientID: "pub", Channel: "replay", Metadata: fmt.Sprintf("m%d", i),
			Body: []byte(fmt.Sprintf("body %d", i)), Tags: map[string]string{"i": fmt.Sprint(i), "x": "y"}, Store: true})
		if err != nil || !r.Sent {
			t.Fatalf("publish %d: %v %+v", i, err, r)
		}
	}
	read := func(e *env, s *sub, k int) []*pb.EventReceive {
		t.Helper()
		var out []*pb.EventReceive
		for range k {
			ev, err := s.s.Recv()
			if err != nil {
				t.Fatalf("recv: %v", err)
			}
			out = append(out, ev)
		}
		return out
	}
	before := read(e, e.mustSubscribe(storeSub("before", "replay", "", pb.Subscribe_StartFromFirst, 0)), n)
	stop()

	e2, _ := startOn(t, dir)
	same := func(got []*pb.EventReceive, from int) {
		t.Helper()
		for k, ev := range got {
			w := before[from-1+k]
			if ev.Sequence != uint64(from+k) || ev.EventID != w.EventID || ev.Channel != "replay" || ev.Metadata != w.Metadata ||
				string(ev.Body) != string(w.Body) || ev.Timestamp != w.Timestamp || len(ev.Tags) != 2 || ev.Tags["i"] != w.Tags["i"] || ev.Tags["x"] != "y" {
				t.Fatalf("after restart event %d is %+v, before %+v", from+k, ev, w)
			}
		}
	}
	same(read(e2, e2.mustSubscribe(storeSub("first", "replay", "", pb.Subscribe_StartFromFirst, 0)), n), 1)
	same(read(e2, e2.mustSubscribe(storeSub("seq", "replay", "", pb.Subscribe_StartAtSequence, 250)), n-249), 250)
	same(read(e2, e2.mustSubscribe(storeSub("time", "replay", "", pb.Subscribe_StartAtTime, before[199].Timestamp)), n-199), 200)
	same(read(e2, e2.mustSubscribe(storeSub("delta", "replay", "", pb.Subscribe_StartAtTimeDelta, 3600)), n), 1)
	last := e2.mustSubscribe(storeSub("last", "replay", "", pb.Subscribe_StartFromLast, 0))
	same(read(e2, last, 1), n)
	e2.publish("replay", true, "new")
	if got := last.next(1); got != fmt.Sprintf("new@%d", n+1) {
		t.Fatalf("after the replay: %s", got)
	}
}
