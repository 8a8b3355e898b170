package gcp

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/kubemq-io/kubemq-proxy/kubemqclient"
)

// TestReadEvents: the replay reader skips repeats, stops at the last
// sequence, reports a gap (the real server drops events a slow reader
// leaves in its buffer for 2 s) with the first missing sequence, cuts
// batches at logBatch, and passes fn's error on.
func TestReadEvents(t *testing.T) {
	feed := func(seqs ...uint64) func(context.Context) (kubemqclient.EventReceive, error) {
		return func(context.Context) (kubemqclient.EventReceive, error) {
			if len(seqs) == 0 {
				return kubemqclient.EventReceive{}, errors.New("no more")
			}
			s := seqs[0]
			seqs = seqs[1:]
			return kubemqclient.EventReceive{Sequence: s}, nil
		}
	}
	collect := func(got *[]uint64, batches *int) func([]kubemqclient.EventReceive) error {
		return func(evs []kubemqclient.EventReceive) error {
			*batches++
			for _, ev := range evs {
				*got = append(*got, ev.Sequence)
			}
			return nil
		}
	}
	ctx := context.Background()

	var got []uint64
	var batches int
	next := uint64(0)
	done, err := readEvents(ctx, feed(4, 5, 5, 6, 7, 8), &next, 7, collect(&got, &batches))
	if !done || err != nil || fmt.Sprint(got) != "[4 5 6 7]" || next != 8 {
		t.Fatalf("to the last: done %v err %v got %v next %d", done, err, got, next)
	}

	got, next = nil, 0
	done, err = readEvents(ctx, feed(1, 2, 5, 6), &next, 9, collect(&got, &batches))
	if done || err != nil || fmt.Sprint(got) != "[1 2]" || next != 3 {
		t.Fatalf("gap: done %v err %v got %v next %d", done, err, got, next)
	}
	// Resumed at the first missing one, with what was read before.
	done, err = readEvents(ctx, feed(2, 3, 4), &next, 4, collect(&got, &batches))
	if !done || err != nil || fmt.Sprint(got) != "[1 2 3 4]" {
		t.Fatalf("resume: done %v err %v got %v", done, err, got)
	}

	got, next, batches = nil, 0, 0
	seqs := make([]uint64, logBatch*2+1)
	for i := range seqs {
		seqs[i] = uint64(i + 1)
	}
	if done, err := readEvents(ctx, feed(seqs...), &next, uint64(len(seqs)), collect(&got, &batches)); !done || err != nil || len(got) != len(seqs) || batches != 3 {
		t.Fatalf("batches: done %v err %v got %d in %d batches", done, err, len(got), batches)
	}

	next = 0
	if _, err := readEvents(ctx, feed(1, 2), &next, 5, collect(&got, &batches)); err == nil {
		t.Fatal("a stream that ends before the last sequence is not an error")
	}
	boom := errors.New("boom")
	next = 0
	if _, err := readEvents(ctx, feed(1, 2), &next, 2, func([]kubemqclient.EventReceive) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("fn's error: %v", err)
	}
}

// TestInflightWait: wait returns once the publishes in progress have
// ended, and gives up with ctx.
func TestInflightWait(t *testing.T) {
	var f inflight
	if err := f.wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	endA := f.begin()
	waited := make(chan error, 1)
	go func() { waited <- f.wait(context.Background()) }()
	select {
	case <-waited:
		t.Fatal("wait returned while a publish was in progress")
	case <-time.After(50 * time.Millisecond):
	}
	endA()
	if err := <-waited; err != nil {
		t.Fatal(err)
	}
	endB := f.begin()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := f.wait(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("wait with a publish in progress and ctx done: %v", err)
	}
	endB()
	if err := f.wait(context.Background()); err != nil {
		t.Fatal(err)
	}
}
