package kubemqclient_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/kubemq-io/kubemq-proxy/embedded"
	"github.com/kubemq-io/kubemq-proxy/internal/kubemqtest"
	kc "github.com/kubemq-io/kubemq-proxy/kubemqclient"
)

// serveEmbedded runs an embedded server with dir on addr until the returned
// stop is called (or the test ends).
func serveEmbedded(t *testing.T, addr, dir string) (stop func()) {
	t.Helper()
	srv, err := embedded.New(embedded.Options{Strict: true, DataDir: dir, Logger: zaptest.NewLogger(t).Named("server")})
	if err != nil {
		t.Fatal(err)
	}
	var lis net.Listener
	deadline := time.Now().Add(5 * time.Second)
	for {
		if lis, err = net.Listen("tcp", addr); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond) // the port of a just-stopped server
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	stopped := false
	stop = func() {
		if !stopped {
			stopped = true
			_ = srv.Close()
			<-done
		}
	}
	t.Cleanup(stop)
	return stop
}

// TestServerRestart takes the embedded server down and up again under a
// client with open streams: readiness follows, broken streams fail with
// retryable errors, the publisher and an AutoResume subscription carry on,
// and messages held by a broken downstream come back.
func TestServerRestart(t *testing.T) {
	if kubemqtest.External() {
		t.Skip("restarts an embedded server")
	}
	dir := t.TempDir()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	stop := serveEmbedded(t, addr, dir)

	c, err := kc.Dial(context.Background(), kc.Options{Address: addr, Logger: zaptest.NewLogger(t),
		PingInterval: 50 * time.Millisecond, MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	states := c.StateChanges()
	if !<-states {
		if !<-states {
			t.Fatal("never ready")
		}
	}
	q, ch := fresh(t, "q"), fresh(t, "es")
	sendN(t, c, q, 0, 5)
	publish(t, c, ch, 1, 3)
	sub := subscribe(t, c, kc.SubscribeOptions{Channel: ch, Start: kc.StartPosition{Mode: kc.StartFromFirst}, AutoResume: true})
	recvN(t, sub, 3)
	ds, err := c.OpenDownstream(timeout(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	held := get(t, ds, q, 2, 5*time.Second)

	stop()
	select {
	case up := <-states:
		if up {
			t.Fatal("ready while the server is down")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("readiness did not drop")
	}
	select {
	case <-ds.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("downstream did not notice the outage")
	}
	if err := ds.Err(); !kc.IsRetryable(err) {
		t.Fatalf("downstream ended with %v", err)
	}

	serveEmbedded(t, addr, dir)
	if err := c.WaitReady(timeout(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	// The publisher re-opens its streams; a publish may still meet the old
	// one and fail retryably.
	for i := 0; ; i++ {
		rs, err := c.PublishEvents(timeout(t, 5*time.Second), []kc.Event{{Channel: ch, Body: body(4)}})
		if err == nil {
			err = kc.FirstError(rs)
		}
		if err == nil {
			break
		}
		if !kc.IsRetryable(err) || i > 20 {
			t.Fatalf("publish after restart: %v", err)
		}
	}
	e := recv(t, sub, 10*time.Second)
	if e.Sequence != 4 || string(e.Body) != string(body(4)) {
		t.Fatalf("after resume: seq %d %q", e.Sequence, e.Body)
	}
	if sub.Resumes() < 1 {
		t.Fatal("subscription did not resume")
	}
	// The held messages come back with their sequences.
	ds2 := openDS(t, c)
	tx := get(t, ds2, q, 5, 5*time.Second)
	if len(tx.Messages) != 5 {
		t.Fatalf("after restart %d messages: %v", len(tx.Messages), bodies(tx.Messages))
	}
	want := map[uint64]bool{}
	for _, m := range held.Messages {
		want[m.Attributes.Sequence] = true
	}
	for _, m := range tx.Messages {
		delete(want, m.Attributes.Sequence)
	}
	if len(want) != 0 {
		t.Fatalf("held sequences %v did not come back", want)
	}
	ackAllSync(t, ds2, tx)
	if err := ds.Close(); err == nil || errors.Is(err, kc.ErrInvalidArgument) {
		t.Fatalf("Close of the broken downstream: %v", err)
	}
}
