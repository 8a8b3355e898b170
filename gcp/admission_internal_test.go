package gcp

import (
	"context"
	"testing"
	"time"
)

// TestPublishBudget: admission while under the limit, a line served in
// arrival order as room frees, and a waiter whose context ends leaving the
// line without taking room.
func TestPublishBudget(t *testing.T) {
	b := newPublishBudget(admitReserve + 1)
	ctx := context.Background()
	for range 2 { // admitted while under the limit: the total may exceed it
		if err := b.admit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if u, w := b.state(); u != 2*admitReserve || w != 0 {
		t.Fatalf("state %d %d", u, w)
	}
	order := make(chan int, 3)
	cctx, cancel := context.WithCancel(ctx)
	gone := make(chan error, 1)
	for i := range 3 {
		c := ctx
		if i == 1 {
			c = cctx
		}
		go func() {
			if err := b.admit(c); err != nil {
				gone <- err
				return
			}
			order <- i
		}()
		for _, w := b.state(); w != i+1; _, w = b.state() {
			time.Sleep(time.Millisecond)
		}
	}
	cancel()
	if err := <-gone; err != context.Canceled {
		t.Fatalf("cancelled waiter: %v", err)
	}
	if u, w := b.state(); u != 2*admitReserve || w != 2 {
		t.Fatalf("after the cancel: state %d %d", u, w)
	}
	b.add(-admitReserve / 2) // a request read smaller than its reserve: still over the limit
	select {
	case i := <-order:
		t.Fatalf("waiter %d admitted over the limit", i)
	case <-time.After(50 * time.Millisecond):
	}
	b.add(-admitReserve / 2) // under the limit: the first in line only
	if i := <-order; i != 0 {
		t.Fatalf("first admitted: %d", i)
	}
	select {
	case i := <-order:
		t.Fatalf("waiter %d admitted over the limit", i)
	case <-time.After(50 * time.Millisecond):
	}
	b.add(-2 * admitReserve)
	if i := <-order; i != 2 {
		t.Fatalf("second admitted: %d", i)
	}
	if u, w := b.state(); u != admitReserve || w != 0 {
		t.Fatalf("end state %d %d", u, w)
	}
}
