package delivery

import (
	"context"
	"testing"
	"time"
)

// TestPauseStandsStillAndKeepsLeases: a paused Consumer opens no transaction and takes
// nothing from the queue; its leases stay out (listed by LeasedMessages, not redelivered), and
// once resumed it goes on with what was sent meanwhile.
func TestPauseStandsStillAndKeepsLeases(t *testing.T) {
	f := newFakeKubeMQ(t)
	c, _ := newTestConsumer(t, f, Options{})
	defer closeConsumer(t, c)
	f.send(t, testQueue, ids(10, "a")...)
	out := fetchFor(t, c, 10, 10*time.Second)
	if len(out) != 10 {
		t.Fatalf("fetched %d of 10 before the pause", len(out))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resume, err := c.Pause(ctx)
	if err != nil {
		t.Fatalf("Pause: %v", err)
	}
	f.mu.Lock()
	holder := f.queue(testQueue).holder
	f.mu.Unlock()
	if holder != nil {
		t.Errorf("a transaction or Get is open on the queue during the pause")
	}
	gets := c.Stats().Gets
	f.send(t, testQueue, ids(5, "b")...)
	fctx, fcancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	during, _ := c.Fetch(fctx, 5)
	fcancel()
	if len(during) != 0 || c.Stats().Gets != gets {
		t.Errorf("paused Consumer delivered %d messages, %d Gets", len(during), c.Stats().Gets-gets)
	}
	if n := f.visible(testQueue); n != 5 {
		t.Errorf("queue holds %d visible messages during the pause, want 5", n)
	}
	leased := map[string]bool{}
	c.LeasedMessages(func(m *Message) { leased[m.ID] = true })
	for _, d := range out {
		if !leased[d.MessageID] {
			t.Errorf("leased message %s not listed", d.MessageID)
		}
	}
	if len(leased) != 10 {
		t.Errorf("LeasedMessages listed %d messages, want 10", len(leased))
	}
	if got := c.Ack(leaseIDs(out[:5])...); countTrue(got) != 5 {
		t.Errorf("acks during the pause: %v", got)
	}
	resume()
	after := fetchFor(t, c, 5, 10*time.Second)
	seen := map[string]int{}
	for _, d := range append(out, after...) {
		seen[d.MessageID]++
	}
	for id, n := range seen {
		if n != 1 {
			t.Errorf("%s delivered %d times", id, n)
		}
	}
	if len(after) != 5 || len(seen) != 15 {
		t.Errorf("after the pause: %d delivered, %d distinct in all (want 5, 15)", len(after), len(seen))
	}
	if v := f.Violations(); len(v) > 0 {
		t.Errorf("violations: %v", v)
	}
}

// TestPauseOfClosedConsumer: Pause of a closed Consumer fails rather than wait.
func TestPauseOfClosedConsumer(t *testing.T) {
	f := newFakeKubeMQ(t)
	c, _ := newTestConsumer(t, f, Options{})
	closeConsumer(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Pause(ctx); err == nil {
		t.Fatal("Pause of a closed Consumer succeeded")
	}
}
