package load

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// amqpClient is one held AMQP connection with its channels and the
// notification channels that report a close by the server.
type amqpClient struct {
	conn      *amqp.Connection
	connClose chan *amqp.Error
	chs       []*amqp.Channel
	chClose   []chan *amqp.Error
}

// parallel runs f(0..n-1) on at most workers goroutines and returns the
// first error; the rest of the work still runs (so every client opened is
// in the result and gets closed).
func parallel(n, workers int, f func(i int) error) error {
	var (
		next  atomic.Int64
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := f(i); err != nil {
					once.Do(func() { first = fmt.Errorf("#%d: %w", i, err) })
				}
			}
		}()
	}
	wg.Wait()
	return first
}

// amqpRoundTrip checks that ch still works: queue.declare passive, a
// publish to the queue and a basic.get of that very message.
func amqpRoundTrip(ch *amqp.Channel, queue, body string) error {
	if _, err := ch.QueueDeclarePassive(queue, false, false, false, false, nil); err != nil {
		return fmt.Errorf("queue.declare passive %s: %w", queue, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := ch.PublishWithContext(ctx, "", queue, true, false, amqp.Publishing{Body: []byte(body)}); err != nil {
		return fmt.Errorf("publish to %s: %w", queue, err)
	}
	// The publish is asynchronous; the stored copy shows up on a get soon
	// after, on this channel in order, so poll briefly.
	for ctx.Err() == nil {
		d, ok, err := ch.Get(queue, false)
		if err != nil {
			return fmt.Errorf("basic.get %s: %w", queue, err)
		}
		if ok {
			if string(d.Body) != body {
				return fmt.Errorf("basic.get %s: body %q, want %q", queue, d.Body, body)
			}
			return d.Ack(false)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("basic.get %s: message %q not back within 10s", queue, body)
}

// TestLoadAMQP holds LOAD_AMQP_CONNS connections (default 1,000) with
// LOAD_AMQP_CHANNELS channels each (default 10), idle but for heartbeats
// every LOAD_AMQP_HEARTBEAT/2 both ways (default 3s negotiated: a margin
// of seconds for a loaded CI machine; the hold outlasts both timeouts), for
// LOAD_AMQP_HOLD (default 10s). None may be closed by the server, sample
// channels must still work at the end, and the proxy's goroutines must come
// back to the baseline once they close. It reports the proxy process's RSS
// and goroutines per connection and per channel.
func TestLoadAMQP(t *testing.T) {
	nConns := envInt(t, "LOAD_AMQP_CONNS", 1000, 100)
	nChans := envInt(t, "LOAD_AMQP_CHANNELS", 10, 10)
	hold := envDuration(t, "LOAD_AMQP_HOLD", 10*time.Second)
	hb := envDuration(t, "LOAD_AMQP_HEARTBEAT", 3*time.Second)
	if hb%time.Second != 0 {
		t.Fatalf("LOAD_AMQP_HEARTBEAT=%v: AMQP negotiates whole seconds", hb)
	}
	const workers = 32 // concurrent handshakes: modest on a shared machine

	e := startProxy(t)
	url := "amqp://guest:guest@" + e.amqpAddr + "/"
	dial := func(name string) (*amqp.Connection, error) {
		return amqp.DialConfig(url, amqp.Config{Heartbeat: hb, Locale: "en_US",
			Properties: amqp.Table{"connection_name": name}})
	}

	// Warm-up: declare the sample queues and do one round trip, so that
	// whatever the proxy starts lazily on first use is in the baseline.
	nSamples := min(10, nConns)
	queues := make([]string, nSamples)
	{
		c, err := dial("load-warmup")
		if err != nil {
			t.Fatal(err)
		}
		ch, err := c.Channel()
		if err != nil {
			t.Fatal(err)
		}
		for k := range queues {
			queues[k] = fmt.Sprintf("load-%s-%d", e.suffix, k)
			if _, err := ch.QueueDeclare(queues[k], true, false, false, false, nil); err != nil {
				t.Fatal(err)
			}
		}
		for _, q := range queues {
			if err := amqpRoundTrip(ch, q, "warmup"); err != nil {
				t.Fatal(err)
			}
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
	before, ok := e.waitMetric(leakWait, func(m metrics) bool { return m["kubemq_proxy_amqp_connections"] == 0 })
	if !ok {
		t.Fatalf("warm-up connection still open in the proxy: kubemq_proxy_amqp_connections=%v", before["kubemq_proxy_amqp_connections"])
	}

	clients := make([]*amqpClient, nConns)
	defer func() {
		// On an early failure: close what is open so the proxy (killed at
		// cleanup anyway) and this process do not hold thousands of sockets.
		for _, c := range clients {
			if c != nil && c.conn != nil {
				c.conn.Close()
			}
		}
	}()

	// Phase 1: the connections alone, to split the cost of a connection
	// from that of its channels.
	err := parallel(nConns, workers, func(i int) error {
		conn, err := dial(fmt.Sprintf("load-%d", i))
		if err != nil {
			return err
		}
		c := &amqpClient{conn: conn, connClose: conn.NotifyClose(make(chan *amqp.Error, 1))}
		clients[i] = c
		if got := conn.Config.Heartbeat; got != hb {
			return fmt.Errorf("negotiated heartbeat %v, want %v", got, hb)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("open connections: %v", err)
	}
	connsOnly, ok := e.waitMetric(leakWait, func(m metrics) bool { return m["kubemq_proxy_amqp_connections"] == float64(nConns) })
	if !ok {
		t.Fatalf("proxy counts %v connections, want %d", connsOnly["kubemq_proxy_amqp_connections"], nConns)
	}

	// Phase 2: the channels.
	err = parallel(nConns, workers, func(i int) error {
		c := clients[i]
		for j := 0; j < nChans; j++ {
			ch, err := c.conn.Channel()
			if err != nil {
				return fmt.Errorf("channel %d: %w", j, err)
			}
			c.chs = append(c.chs, ch)
			c.chClose = append(c.chClose, ch.NotifyClose(make(chan *amqp.Error, 1)))
		}
		return nil
	})
	if err != nil {
		t.Fatalf("open channels: %v", err)
	}
	opened, ok := e.waitMetric(leakWait, func(m metrics) bool {
		return m["kubemq_proxy_amqp_channels"] == float64(nConns*nChans)
	})
	if !ok {
		t.Fatalf("proxy counts %v channels, want %d", opened["kubemq_proxy_amqp_channels"], nConns*nChans)
	}

	// Watch every connection for a close by the server while held. A
	// missed heartbeat either way ends in one: the proxy drops a client
	// silent for 2 heartbeats, the client library one silent for 1.5.
	var (
		closed    atomic.Int64
		closedMu  sync.Mutex
		closedErr []string
		stop      = make(chan struct{})
		watchers  sync.WaitGroup
	)
	for i, c := range clients {
		watchers.Add(1)
		go func() {
			defer watchers.Done()
			select {
			case err := <-c.connClose:
				closed.Add(1)
				closedMu.Lock()
				if len(closedErr) < 10 {
					closedErr = append(closedErr, fmt.Sprintf("conn %d at %s: %v", i, time.Now().Format("15:04:05.000"), err))
				}
				closedMu.Unlock()
			case <-stop:
			}
		}()
	}
	stopWatch := sync.OnceFunc(func() { close(stop); watchers.Wait() })
	defer stopWatch()

	// Hold, sampling once a second; fail at once on a close.
	heldAt := time.Now()
	peak := opened
	for time.Since(heldAt) < hold {
		time.Sleep(time.Second)
		e.alive()
		m := e.scrape()
		if m.RSS() > peak.RSS() {
			peak["process_resident_memory_bytes"] = m.RSS()
		}
		if m.Goroutines() > peak.Goroutines() {
			peak["go_goroutines"] = m.Goroutines()
		}
		if n := closed.Load(); n > 0 {
			closedMu.Lock()
			first := append([]string(nil), closedErr...)
			closedMu.Unlock()
			t.Fatalf("%d connections closed %v into the hold: %v", n, time.Since(heldAt).Round(time.Millisecond), first)
		}
	}
	held := e.scrape()
	if held["kubemq_proxy_amqp_connections"] != float64(nConns) || held["kubemq_proxy_amqp_channels"] != float64(nConns*nChans) {
		t.Errorf("after the hold the proxy counts %v connections and %v channels, want %d and %d",
			held["kubemq_proxy_amqp_connections"], held["kubemq_proxy_amqp_channels"], nConns, nConns*nChans)
	}

	// Sample channels spread over the connections must still work.
	for k := 0; k < nSamples; k++ {
		i := k * nConns / nSamples
		j := k % nChans
		if err := amqpRoundTrip(clients[i].chs[j], queues[k], fmt.Sprintf("sample-%d-%d", i, j)); err != nil {
			t.Errorf("conn %d channel %d after the hold: %v", i, j, err)
		}
	}

	// Nothing may have been closed, channels included.
	stopWatch()
	if n := closed.Load(); n > 0 {
		t.Fatalf("%d connections closed during the hold: %v", n, closedErr)
	}
	var closedChans []string
	for i, c := range clients {
		if c.conn.IsClosed() {
			t.Errorf("conn %d is closed", i)
		}
		for j, ch := range c.chs {
			select {
			case err := <-c.chClose[j]:
				closedChans = append(closedChans, fmt.Sprintf("conn %d channel %d: %v", i, j, err))
			default:
				if ch.IsClosed() {
					closedChans = append(closedChans, fmt.Sprintf("conn %d channel %d: closed", i, j))
				}
			}
		}
	}
	if len(closedChans) > 0 {
		t.Fatalf("%d channels closed during the hold, first: %v", len(closedChans), closedChans[:min(10, len(closedChans))])
	}

	// Close everything and check the proxy gives back its goroutines.
	err = parallel(nConns, workers, func(i int) error {
		c := clients[i]
		clients[i] = nil
		if err := c.conn.Close(); err != nil && !errors.Is(err, amqp.ErrClosed) {
			return err
		}
		return nil
	})
	if err != nil {
		t.Errorf("close: %v", err)
	}
	if m, ok := e.waitMetric(leakWait, func(m metrics) bool { return m["kubemq_proxy_amqp_connections"] == 0 }); !ok {
		t.Errorf("proxy still counts %v connections %v after every client closed", m["kubemq_proxy_amqp_connections"], leakWait)
	}
	after := e.leakCheck("AMQP connections", before.Goroutines())

	channels := nConns * nChans
	report(t, "amqp conns=%d channels=%d heartbeat=%v hold=%v rss_before=%.1fMiB rss_conns=%.1fMiB rss_held=%.1fMiB rss_peak=%.1fMiB rss_after=%.1fMiB "+
		"per_conn_kib=%.1f (conn_only_kib=%.1f per_channel_kib=%.1f) goroutines_before=%.0f goroutines_conns=%.0f goroutines_held=%.0f goroutines_after=%.0f "+
		"goroutines_per_conn=%.2f (conn_only=%.2f per_channel=%.2f) heap_before=%.1fMiB heap_conns=%.1fMiB heap_held=%.1fMiB heap_conn_only_kib=%.1f heap_per_channel_kib=%.1f",
		nConns, channels, hb, hold, mib(before.RSS()), mib(connsOnly.RSS()), mib(held.RSS()), mib(peak.RSS()), mib(after.RSS()),
		(held.RSS()-before.RSS())/float64(nConns)/1024,
		(connsOnly.RSS()-before.RSS())/float64(nConns)/1024, (held.RSS()-connsOnly.RSS())/float64(channels)/1024,
		before.Goroutines(), connsOnly.Goroutines(), held.Goroutines(), after.Goroutines(),
		(held.Goroutines()-before.Goroutines())/float64(nConns),
		(connsOnly.Goroutines()-before.Goroutines())/float64(nConns), (held.Goroutines()-connsOnly.Goroutines())/float64(channels),
		mib(before.Heap()), mib(connsOnly.Heap()), mib(held.Heap()),
		(connsOnly.Heap()-before.Heap())/float64(nConns)/1024, (held.Heap()-connsOnly.Heap())/float64(channels)/1024)
	e.stop()
}
