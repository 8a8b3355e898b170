package gcp

import (
	"testing"
	"time"
)

func TestFlowAllowance(t *testing.T) {
	f := newFlow(10, 0)
	now := time.Unix(1000, 0)
	ls := make([]*lease, 30)
	for i := range ls {
		ls[i] = &lease{bytes: 100}
	}
	for _, l := range ls[:10] {
		f.take(l)
	}
	if r := f.room(now); r != 0 {
		t.Fatalf("room with the window full = %d", r)
	}
	// Settlements heard count as acks in transit for ackWindow.
	for _, l := range ls[:5] {
		f.release(l, true)
	}
	heardAt := time.Now()
	if r := f.room(heardAt); r != 5+5 {
		t.Fatalf("room after 5 acks = %d, want 10", r)
	}
	if r := f.room(heardAt.Add(ackWindow + ackWindow/ackBuckets)); r != 5 {
		t.Fatalf("room once the acks aged out = %d, want 5", r)
	}
	// Expiries free credit but are not acks in transit.
	f.release(ls[5], false)
	if r := f.room(heardAt.Add(2 * ackWindow)); r != 6 {
		t.Fatalf("room after an expiry = %d, want 6", r)
	}
	// Bytes: the byte limit plus the bytes heard.
	g := newFlow(100, 1000)
	for _, l := range ls[:10] {
		g.take(l)
	}
	if r := g.room(time.Now()); r != 0 {
		t.Fatalf("room with the byte window full = %d", r)
	}
	g.release(ls[0], true)
	if r := g.room(time.Now()); r == 0 {
		t.Fatal("no room after an ack under the byte limit")
	}
}
