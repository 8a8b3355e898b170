package kubemqclient_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/kubemq-io/kubemq-proxy/internal/kubemqtest"
	kc "github.com/kubemq-io/kubemq-proxy/kubemqclient"
)

// dial connects to kubemqtest.Address and waits until ready.
func dial(t testing.TB) *kc.Client {
	t.Helper()
	return dialAddr(t, kubemqtest.Address(t))
}

func dialAddr(t testing.TB, addr string) *kc.Client {
	t.Helper()
	log := zap.NewNop()
	if _, bench := t.(*testing.B); !bench {
		log = zaptest.NewLogger(t)
	}
	c, err := kc.Dial(context.Background(), kc.Options{Address: addr, Conn: kubemqtest.Link(addr), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.WaitReady(ctx); err != nil {
		t.Fatalf("WaitReady: %v", err)
	}
	return c
}

// timeout returns a context cancelled after d or at the end of the test.
func timeout(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// fresh returns a channel name unique to this run (tests may share an
// external server, whose state persists).
func fresh(t testing.TB, kind string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return kc.Channel("ct", kind, t.Name(), hex.EncodeToString(b))
}

func body(i int) []byte { return []byte(fmt.Sprintf("m%04d", i)) }

func sendN(t testing.TB, c *kc.Client, ch string, from, n int) []kc.SendResult {
	t.Helper()
	msgs := make([]kc.QueueMessage, n)
	for i := range msgs {
		msgs[i] = kc.QueueMessage{Channel: ch, Body: body(from + i), Tags: map[string]string{"i": fmt.Sprint(from + i)}}
	}
	rs, err := c.SendQueueMessages(timeout(t, 10*time.Second), msgs)
	if err != nil {
		t.Fatalf("SendQueueMessages: %v", err)
	}
	if err := kc.FirstError(rs); err != nil {
		t.Fatalf("SendQueueMessages result: %v", err)
	}
	return rs
}

func openDS(t testing.TB, c *kc.Client) *kc.Downstream {
	t.Helper()
	ds, err := c.OpenDownstream(timeout(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ds.Close() })
	return ds
}

// get runs one Get. A Get the server refuses for now on a stream that goes on (the real
// server's "Error 302: connection not available, please retry" under load) opened nothing and
// is sent again, as the proxy's poller does.
func get(t testing.TB, ds *kc.Downstream, ch string, max int, wait time.Duration) *kc.Transaction {
	t.Helper()
	ctx := timeout(t, wait+10*time.Second)
	for {
		tx, err := ds.Get(ctx, kc.GetRequest{Channel: ch, MaxItems: max, Wait: wait})
		if err == nil {
			return tx
		}
		if !kc.IsRetryable(err) || ds.Err() != nil || ctx.Err() != nil {
			t.Fatalf("Get(%s, %d): %v", ch, max, err)
		}
		t.Logf("Get(%s, %d) refused for now, again: %v", ch, max, err)
		time.Sleep(50 * time.Millisecond)
	}
}

func ackAllSync(t testing.TB, ds *kc.Downstream, tx *kc.Transaction) {
	t.Helper()
	if len(tx.Messages) == 0 {
		return
	}
	if err := ds.AckAll(tx.ID); err != nil {
		t.Fatalf("AckAll: %v", err)
	}
	if err := ds.Sync(timeout(t, 10*time.Second), tx.ID); err != nil {
		t.Fatalf("Sync after AckAll: %v", err)
	}
}

func seqs(msgs []kc.QueueMessage) []uint64 {
	out := make([]uint64, len(msgs))
	for i, m := range msgs {
		out[i] = m.Attributes.Sequence
	}
	return out
}

func bodies(msgs []kc.QueueMessage) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = string(m.Body)
	}
	return out
}

func publish(t testing.TB, c *kc.Client, ch string, from, n int) []kc.PublishResult {
	t.Helper()
	evs := make([]kc.Event, n)
	for i := range evs {
		evs[i] = kc.Event{Channel: ch, Body: body(from + i), Metadata: "md", Tags: map[string]string{"i": fmt.Sprint(from + i)}}
	}
	rs, err := c.PublishEvents(timeout(t, 10*time.Second), evs)
	if err != nil {
		t.Fatalf("PublishEvents: %v", err)
	}
	if err := kc.FirstError(rs); err != nil {
		t.Fatalf("PublishEvents result: %v", err)
	}
	return rs
}

func subscribe(t testing.TB, c *kc.Client, o kc.SubscribeOptions) *kc.EventsSubscription {
	t.Helper()
	s, err := c.SubscribeEventsStore(timeout(t, 10*time.Second), o)
	if err != nil {
		t.Fatalf("SubscribeEventsStore: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func recv(t testing.TB, s *kc.EventsSubscription, d time.Duration) kc.EventReceive {
	t.Helper()
	e, err := s.Recv(timeout(t, d))
	if err != nil {
		t.Fatalf("Recv: %v", err)
	}
	return e
}

// recvN receives n events.
func recvN(t testing.TB, s *kc.EventsSubscription, n int) []kc.EventReceive {
	t.Helper()
	out := make([]kc.EventReceive, n)
	for i := range out {
		out[i] = recv(t, s, 10*time.Second)
	}
	return out
}

// expectNoEvent asserts nothing arrives within d.
func expectNoEvent(t testing.TB, s *kc.EventsSubscription, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	if e, err := s.Recv(ctx); err == nil {
		t.Fatalf("unexpected event seq %d %q", e.Sequence, e.Body)
	}
}
