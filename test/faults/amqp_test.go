package faults

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// amqpEvent is something an AMQP client observed: its connection closed
// under it ("closed": Server tells a connection.close from the proxy,
// Code 320 and so on, from a dropped socket, which amqp091-go reports as
// 501 with Server false), a channel exception while the connection stayed
// up ("channel"), or a failed connection attempt ("dial").
type amqpEvent struct {
	At     time.Time
	Who    string
	Kind   string
	Code   int
	Server bool
	Reason string
}

func (e amqpEvent) label() string {
	switch {
	case e.Kind == "dial" && e.Code == 0:
		return "dial:refused"
	case e.Kind == "dial":
		return fmt.Sprintf("dial:%d", e.Code)
	case e.Server:
		return fmt.Sprintf("%s:%d", e.Kind, e.Code)
	default:
		return e.Kind + ":dropped"
	}
}

type amqpEvents struct {
	mu     sync.Mutex // guards events
	events []amqpEvent
}

func (l *amqpEvents) record(who, kind string, err error) {
	ev := amqpEvent{At: time.Now(), Who: who, Kind: kind, Reason: err.Error()}
	var ae *amqp.Error
	if errors.As(err, &ae) {
		ev.Code, ev.Server, ev.Reason = ae.Code, ae.Server, ae.Reason
	}
	l.mu.Lock()
	l.events = append(l.events, ev)
	l.mu.Unlock()
}

func (l *amqpEvents) Between(from, to time.Time) []amqpEvent {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []amqpEvent
	for _, e := range l.events {
		if !e.At.Before(from) && !e.At.After(to) {
			out = append(out, e)
		}
	}
	return out
}

func countEvents(evs []amqpEvent) (map[string]int, string) {
	m := map[string]int{}
	for _, e := range evs {
		m[e.label()]++
	}
	var parts []string
	for k, n := range m {
		parts = append(parts, fmt.Sprintf("%s=%d", k, n))
	}
	sort.Strings(parts)
	if len(parts) == 0 {
		return m, "none"
	}
	return m, strings.Join(parts, " ")
}

// amqpLoad is the AMQP side of a run: a durable direct exchange bound to a
// durable queue, one publisher in confirm mode and two consumers with
// manual acks, each on its own connection. amqp091-go has no automatic
// reconnection, so each loop reconnects (and redeclares) after its
// connection closes, as applications do.
type amqpLoad struct {
	led      *ledger
	events   *amqpEvents
	url      string
	exchange string
	queue    string
	rate     int

	pubCancel context.CancelFunc
	pubDone   chan struct{}
	subCancel context.CancelFunc
	subDone   sync.WaitGroup
}

const amqpKey = "load"

func newAMQPLoad(e *env, rate int) (*amqpLoad, error) {
	l := &amqpLoad{led: newLedger("amqp", "am"+e.suffix), events: &amqpEvents{}, url: "amqp://guest:guest@" + e.amqpAddr + "/",
		exchange: "faults-ex-" + e.suffix, queue: "faults-q-" + e.suffix, rate: rate}
	conn, err := amqp.Dial(l.url)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	return l, l.declare(ch)
}

func (l *amqpLoad) declare(ch *amqp.Channel) error {
	if err := ch.ExchangeDeclare(l.exchange, "direct", true, false, false, false, nil); err != nil {
		return err
	}
	if _, err := ch.QueueDeclare(l.queue, true, false, false, false, nil); err != nil {
		return err
	}
	return ch.QueueBind(l.queue, amqpKey, l.exchange, false, nil)
}

// open dials and opens a channel; setup runs on it. Failures are recorded.
func (l *amqpLoad) open(who string, setup func(*amqp.Channel) error) (*amqp.Connection, *amqp.Channel, error) {
	conn, err := amqp.Dial(l.url)
	if err != nil {
		l.events.record(who, "dial", err)
		return nil, nil, err
	}
	ch, err := conn.Channel()
	if err == nil {
		err = setup(ch)
	}
	if err != nil {
		// The connection closing during setup is observed like any other
		// close; a channel exception during setup is one too.
		if cerr := conn.Close(); errors.Is(cerr, amqp.ErrClosed) {
			l.events.record(who, "closed", err)
		} else {
			l.events.record(who, "channel", err)
		}
		return nil, nil, err
	}
	return conn, ch, nil
}

// watch records why conn (or ch) closed and closes broken then. A
// connection close reaches the channel too, so a channel error is a
// channel exception only when the connection stays open.
//
// Closing is how the loop closes conn itself: amqp091-go can report its
// own orderly close as a 501 EOF when the server drops the socket right
// after close-ok, which is not an outage the client suffered.
func (l *amqpLoad) watch(who string, conn *amqp.Connection, ch *amqp.Channel) (broken chan struct{}, closing func()) {
	connClosed := conn.NotifyClose(make(chan *amqp.Error, 1))
	chClosed := ch.NotifyClose(make(chan *amqp.Error, 1))
	var ours atomic.Bool
	record := func(kind string, e *amqp.Error) {
		if e != nil && !ours.Load() {
			l.events.record(who, kind, e)
		}
	}
	broken = make(chan struct{})
	go func() {
		defer close(broken)
		select {
		case e := <-connClosed:
			record("closed", e)
		case e := <-chClosed:
			select {
			case ce := <-connClosed:
				record("closed", ce)
			case <-time.After(500 * time.Millisecond):
				record("channel", e)
				ours.Store(true)
				conn.Close()
			}
		}
	}()
	return broken, func() {
		// A connection already closed by the server keeps its recorded
		// reason even if the watcher has not read it yet.
		if !conn.IsClosed() {
			ours.Store(true)
		}
		conn.Close()
		<-broken
	}
}

func (l *amqpLoad) Start() {
	pctx, pcancel := context.WithCancel(context.Background())
	sctx, scancel := context.WithCancel(context.Background())
	l.pubCancel, l.subCancel = pcancel, scancel
	l.pubDone = make(chan struct{})
	go l.publish(pctx)
	for i := 0; i < 2; i++ {
		l.subDone.Add(1)
		go l.consume(sctx, fmt.Sprintf("consumer%d", i))
	}
}

type pendingConfirm struct {
	id string
	dc *amqp.DeferredConfirmation
}

// publish sends at the paced rate with publisher confirms; a window of 512
// unconfirmed messages bounds it. Confirms are resolved in order by one
// goroutine; a closed connection resolves its outstanding ones as not
// acknowledged.
func (l *amqpLoad) publish(ctx context.Context) {
	defer close(l.pubDone)
	confirms := make(chan pendingConfirm, 512)
	var outstanding atomic.Int64 // published, confirm not resolved yet
	confirmerDone := make(chan struct{})
	go func() {
		defer close(confirmerDone)
		for p := range confirms {
			if p.dc.Wait() {
				l.led.Acked(p.id)
			} else {
				l.led.Failed(p.id, errors.New("basic.nack or connection closed before the confirm"))
			}
			outstanding.Add(-1)
		}
	}()
	defer func() {
		close(confirms)
		<-confirmerDone
	}()
	for ctx.Err() == nil {
		conn, ch, err := l.open("publisher", func(ch *amqp.Channel) error {
			if err := l.declare(ch); err != nil {
				return err
			}
			return ch.Confirm(false)
		})
		if err != nil {
			retryWait(ctx)
			continue
		}
		broken, closing := l.watch("publisher", conn, ch)
		pace(ctx, l.rate, func() bool {
			select {
			case <-broken:
				return false
			default:
			}
			id, body := l.led.Next()
			dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), l.exchange, amqpKey, false, false,
				amqp.Publishing{DeliveryMode: amqp.Persistent, MessageId: id, Body: body})
			if err != nil {
				l.led.Failed(id, err)
				return false
			}
			outstanding.Add(1)
			confirms <- pendingConfirm{id, dc}
			return true
		})
		if ctx.Err() != nil {
			// Stopping: let the outstanding confirms arrive before closing.
			deadline := time.Now().Add(30 * time.Second)
			for outstanding.Load() > 0 && time.Now().Before(deadline) {
				select {
				case <-broken:
					deadline = time.Now()
				case <-time.After(20 * time.Millisecond):
				}
			}
		}
		closing()
	}
}

// consume receives with manual acks (prefetch 50) and reconnects when its
// connection closes.
func (l *amqpLoad) consume(ctx context.Context, who string) {
	defer l.subDone.Done()
	for ctx.Err() == nil {
		var msgs <-chan amqp.Delivery
		conn, ch, err := l.open(who, func(ch *amqp.Channel) error {
			if _, err := ch.QueueDeclare(l.queue, true, false, false, false, nil); err != nil {
				return err
			}
			if err := ch.Qos(50, 0, false); err != nil {
				return err
			}
			var err error
			msgs, err = ch.Consume(l.queue, "", false, false, false, false, nil)
			return err
		})
		if err != nil {
			retryWait(ctx)
			continue
		}
		_, closing := l.watch(who, conn, ch)
	loop:
		for {
			select {
			case <-ctx.Done():
				break loop
			case d, ok := <-msgs:
				if !ok {
					break loop
				}
				l.led.Delivered(d.Body, d.Redelivered)
				d.Ack(false)
			}
		}
		closing()
	}
}

// errStallInterrupted: the stalled consumer's connection was closed by the
// proxy (an outage) before the stall ended.
var errStallInterrupted = errors.New("the proxy closed the stalled consumer's channel")

// Stall opens a consumer with the given prefetch that takes deliveries and
// acks none, holds them for hold, then closes its channel: they must come
// back to the other consumers, flagged redelivered.
func (l *amqpLoad) Stall(hold time.Duration, prefetch int) error {
	conn, err := amqp.Dial(l.url)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := ch.Qos(prefetch, 0, false); err != nil {
		return err
	}
	msgs, err := ch.Consume(l.queue, "stalled", false, false, false, false, nil)
	if err != nil {
		return err
	}
	held := 0
	end := time.After(hold)
	for done := false; !done; {
		select {
		case d, ok := <-msgs:
			if !ok {
				l.led.Released()
				return fmt.Errorf("%w after %d deliveries", errStallInterrupted, held)
			}
			l.led.Held(d.Body)
			held++
		case <-end:
			done = true
		}
	}
	if held == 0 {
		return errors.New("stalled consumer received nothing")
	}
	l.led.Released()
	return ch.Close()
}

func (l *amqpLoad) StopPublishing() {
	l.pubCancel()
	<-l.pubDone
}

func (l *amqpLoad) Close() {
	if l.subCancel != nil {
		l.subCancel()
		l.subDone.Wait()
	}
}

// retryWait is the reconnect delay of the AMQP loops.
func retryWait(ctx context.Context) {
	select {
	case <-ctx.Done():
	case <-time.After(250 * time.Millisecond):
	}
}
