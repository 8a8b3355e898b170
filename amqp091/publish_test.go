package amqp091

import (
	"fmt"
	"testing"
)

func TestConfirmTrackerFoldsRuns(t *testing.T) {
	tr := confirmTracker{ch: &channel{wake: make(chan struct{}, 1)}}
	for range 7 {
		tr.next()
	}
	show := func() string { return fmt.Sprint(tr.take()) }
	tr.complete(2, true)
	if got := show(); got != "[]" {
		t.Fatalf("seq 1 pending, got %s", got)
	}
	tr.complete(1, true)
	tr.complete(3, false)
	tr.complete(5, true)
	if got := show(); got != "[basic.ack{delivery-tag=2 multiple=true} basic.nack{delivery-tag=3 multiple=false requeue=false}]" {
		t.Fatalf("got %s", got)
	}
	tr.complete(4, true)
	tr.complete(6, true)
	if got := show(); got != "[basic.ack{delivery-tag=6 multiple=true}]" {
		t.Fatalf("got %s", got)
	}
	tr.complete(7, true)
	if got := show(); got != "[basic.ack{delivery-tag=7 multiple=false}]" {
		t.Fatalf("got %s", got)
	}
	tr.close()
	tr.complete(8, true)
	if got := show(); got != "[]" {
		t.Fatalf("after close: %s", got)
	}
}

func TestParseExpiration(t *testing.T) {
	for _, c := range []struct {
		in     string
		ms     int64
		reason string
	}{
		{"1000", 1000, ""}, {"0", 0, ""}, {"abc", 0, "no_integer"}, {"12x", 0, `{leftover_string,"x"}`},
		{"-1", 0, "{value_negative,-1}"}, {"99999999999", 0, "{value_too_large,99999999999}"},
	} {
		ms, reason := parseExpiration(c.in)
		if ms != c.ms || reason != c.reason {
			t.Errorf("%q: %d %q, want %d %q", c.in, ms, reason, c.ms, c.reason)
		}
	}
}
