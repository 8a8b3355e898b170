package delivery

import (
	"context"
	"sync"
	"testing"
	"time"
)

// TestWaitersShareABatch: a batch that arrives while several Fetch calls wait is shared out
// evenly among them, not handed whole to the first.
func TestWaitersShareABatch(t *testing.T) {
	f := newFakeKubeMQ(t)
	c, _ := newTestConsumer(t, f, Options{})
	defer closeConsumer(t, c)
	const waiters, msgs = 4, 100
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Paused, the Consumer takes nothing until every Fetch waits and the whole batch is in
	// the queue, so one Get brings all of it.
	resume, err := c.Pause(ctx)
	if err != nil {
		t.Fatalf("Pause: %v", err)
	}
	f.send(t, testQueue, ids(msgs, "m")...)
	got := make([]int, waiters)
	var wg sync.WaitGroup
	for i := range waiters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ds, err := c.Fetch(ctx, msgs)
			if err != nil {
				t.Errorf("Fetch %d: %v", i, err)
			}
			got[i] = len(ds)
		}()
	}
	for c.Stats().Waiters < waiters {
		if ctx.Err() != nil {
			t.Fatal("the Fetch calls did not all wait")
		}
		time.Sleep(5 * time.Millisecond)
	}
	resume()
	wg.Wait()
	for _, n := range got {
		if n != msgs/waiters {
			t.Errorf("waiters got %v, want %d each", got, msgs/waiters)
			break
		}
	}
}
