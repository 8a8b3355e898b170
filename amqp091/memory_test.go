package amqp091

import (
	"bytes"
	"context"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/kubemq-io/kubemq-proxy/embedded"
	"github.com/kubemq-io/kubemq-proxy/internal/kubemqtest"
)

// An embedded backend at its memory bound (embedded.max_memory) refuses to store a publish: the
// publisher gets a basic.nack for it (its connection and channel stay open); once a consumer
// has drained the queue, publishes are confirmed again.
func TestPublishAtMemoryLimitIsNacked(t *testing.T) {
	if kubemqtest.External() {
		t.Skip("max_memory is a limit of the embedded server")
	}
	addr, srv := kubemqtest.StartEmbedded(t, embedded.Options{Strict: true, MaxMemory: 256 << 10})
	kubemqtest.CheckStrict(t, srv)
	e := &env{t: t, vhost: "t-" + randHex(4), regChan: "amqptest.registry." + randHex(4), kubemq: addr}
	if kubemqtest.InProcess(false) {
		e.kubemq, e.conn = "embedded", srv.Channel(embedded.SharePayloads())
	}
	e.log = zaptest.NewLogger(t, zaptest.Level(zap.ErrorLevel)) // each refused store is a warning
	e.start()

	c := e.dial()
	defer c.Close()
	ch := e.channel(c)
	q, err := ch.QueueDeclare("mem", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	body := bytes.Repeat([]byte("m"), 8<<10)
	publish := func() bool {
		t.Helper()
		dc, err := ch.PublishWithDeferredConfirm("", q.Name, false, false, amqp.Publishing{Body: body})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		ok, err := dc.WaitContext(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	acked := 0
	for acked < 100 && publish() {
		acked++
	}
	if acked == 0 || acked > 32 {
		t.Fatalf("%d publishes of 8 KiB confirmed under a 256 KiB bound", acked)
	}
	if srv.MemoryUsed() > 256<<10 {
		t.Fatalf("memory used %d over the bound", srv.MemoryUsed())
	}
	// The channel is still usable after a nack.
	if publish() {
		t.Fatal("publish confirmed at the memory bound")
	}

	msgs, err := ch.Consume(q.Name, "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := 0
	deadline := time.After(40 * time.Second)
	for got < acked {
		select {
		case m := <-msgs:
			if err := m.Ack(false); err != nil {
				t.Fatal(err)
			}
			got++
		case <-deadline:
			t.Fatalf("consumed %d of %d", got, acked)
		}
	}
	// The lease records of the consumed messages come back after their delay and are dropped.
	for start := time.Now(); !publish(); time.Sleep(200 * time.Millisecond) {
		if time.Since(start) > 40*time.Second {
			t.Fatalf("publish still nacked after the queue was drained (memory used %d)", srv.MemoryUsed())
		}
	}
}
