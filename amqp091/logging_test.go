package amqp091

import (
	"context"
	"errors"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kubemq-io/kubemq-proxy/kubemqclient"
)

// serverLevelMessages are the front-end's log messages that concern no
// single connection (accepting, KubeMQ readiness). Every other message of
// the amqp091 logger is about a connection and must carry its id.
var serverLevelMessages = map[string]bool{
	"connection refused: connection limit reached":  true,
	"KubeMQ reachable again: accepting connections": true,
	"KubeMQ unreachable: closing AMQP connections":  true,
}

// channelMessages are logged by a channel: they carry the channel number
// as well.
var channelMessages = map[string]bool{
	"channel error":                      true,
	"consumer cancelled by the server":   true,
	"consumer fetch failed":              true,
	"storing a published message failed": true,
	"storing published messages failed":  true,
}

// checkConnLogs asserts that every amqp091 entry in logs but the
// server-level ones carries a conn field (the same one throughout: the
// scenarios use one connection), channel messages a channel field too, and
// that other entries come only from the lease engine ("delivery": shared
// by all connections, its entries name the queue). It returns the
// messages seen.
func checkConnLogs(t *testing.T, logs *observer.ObservedLogs) map[string]bool {
	t.Helper()
	var id any
	seen := map[string]bool{}
	for _, le := range logs.All() {
		if !strings.HasPrefix(le.LoggerName, "amqp091") {
			if !strings.HasPrefix(le.LoggerName, "delivery") {
				t.Errorf("entry from logger %q: %s %q", le.LoggerName, le.Level, le.Message)
			}
			continue
		}
		seen[le.Message] = true
		if serverLevelMessages[le.Message] {
			continue
		}
		f := fieldsOf(le)
		conn, ok := f["conn"]
		if !ok {
			t.Errorf("%s %q has no conn field: %v", le.Level, le.Message, le.Context)
			continue
		}
		if id == nil {
			id = conn.Integer
		} else if conn.Integer != id {
			t.Errorf("%q: conn %v, want %v", le.Message, conn.Integer, id)
		}
		if _, ok := f["channel"]; channelMessages[le.Message] && !ok {
			t.Errorf("%q has no channel field: %v", le.Message, le.Context)
		}
	}
	return seen
}

func fieldsOf(e observer.LoggedEntry) map[string]zapcore.Field {
	m := map[string]zapcore.Field{}
	for _, f := range e.Context {
		m[f.Key] = f
	}
	return m
}

// Every log entry of the front-end about a connection carries the
// connection id, and a channel's the channel number too, through a full
// scenario at debug level.
func TestLogEntriesCarryConnectionID(t *testing.T) {
	core, logs := observer.New(zap.DebugLevel)
	e := newEnv(t, func(o *Options) { o.Logger = zap.New(core) })
	c := e.dial()
	ch1, ch2, ch3 := e.channel(c), e.channel(c), e.channel(c)
	if err := ch1.ExchangeDeclare("lx", "direct", false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch1.QueueDeclare("lq", false, false, true, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch1.QueueBind("lq", "k", "lx", false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch1.Confirm(false); err != nil {
		t.Fatal(err)
	}
	publishConfirmed(t, ch1, "lx", "k", "a", "b", "c")
	msgs, err := ch2.Consume("lq", "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := mustRecv(t, msgs, "delivery").Ack(false); err != nil {
			t.Fatal(err)
		}
	}
	// A consumer the server cancels (its queue deleted by another channel).
	if _, err := ch3.QueueDeclare("gone", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	cancels := ch2.NotifyCancel(make(chan string, 1))
	if _, err := ch2.Consume("gone", "ctag-gone", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch3.QueueDelete("gone", false, false, false); err != nil {
		t.Fatal(err)
	}
	if tag := mustRecv(t, cancels, "basic.cancel"); tag != "ctag-gone" {
		t.Fatalf("cancelled %q", tag)
	}
	// A channel error.
	if _, err := ch1.QueueDeclarePassive("missing", false, false, false, false, nil); amqpCode(err) != 404 {
		t.Fatalf("passive declare: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "connection closed", func() bool { return logs.FilterMessage("connection closed").Len() == 1 })

	seen := checkConnLogs(t, logs)
	// The scenario reached the connection's and the channels' logging.
	for _, m := range []string{"connection open", "channel error", "consumer cancelled by the server", "connection closed"} {
		if !seen[m] {
			t.Errorf("no %q entry; got %v", m, seen)
		}
	}
}

// A store KubeMQ refuses is logged on the publishing channel's logger.
func TestLogStoreFailureCarriesConnectionID(t *testing.T) {
	core, logs := observer.New(zap.DebugLevel)
	e := newEnv(t, func(o *Options) {
		o.Logger = zap.New(core)
		o.backend = failingBackend{o.Client}
	})
	c := e.dial()
	ch := e.channel(c)
	if _, err := ch.QueueDeclare("lf", false, false, true, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	dc, err := ch.PublishWithDeferredConfirm("", "lf", false, false, amqp.Publishing{Body: []byte("x")})
	if err != nil {
		t.Fatal(err)
	}
	if dc.Wait() {
		t.Fatal("a refused store was confirmed")
	}
	seen := checkConnLogs(t, logs)
	if !seen["storing published messages failed"] {
		t.Errorf("store failure not logged; got %v", seen)
	}
}

// failingBackend refuses every store.
type failingBackend struct{ backend }

func (failingBackend) SendQueueMessages(context.Context, []kubemqclient.QueueMessage) ([]kubemqclient.SendResult, error) {
	return nil, errors.New("injected store failure")
}
