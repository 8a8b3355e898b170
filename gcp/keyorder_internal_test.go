package gcp

import (
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kubemq-io/kubemq-proxy/delivery"
)

// TestCheckKeyOrder: a key's first delivery that the engine brings after a later message of the
// key from the same publishing process is logged, with both ids and sequences; messages of
// another process, another key or in order are not.
func TestCheckKeyOrder(t *testing.T) {
	core, logs := observer.New(zap.WarnLevel)
	r := &subRuntime{s: &Server{log: zap.New(core)}, id: "sub"}
	g, other := newIDGen(), newIDGen()
	for other.prefix == g.prefix {
		other = newIDGen()
	}
	ids := make([]string, 12)
	for i := range ids {
		ids[i] = g.next() // ids[8] is shorter than ids[9]: the counter gains a digit
	}
	deliver := func(key, id string, seq uint64) {
		r.checkKeyOrderLocked(&lease{key: key, d: &delivery.Delivery{Sequence: seq, Tags: map[string]string{TagMessageID: id}}})
	}
	deliver("a", ids[8], 1)
	deliver("a", ids[9], 2)
	deliver("a", ids[10], 3)
	deliver("b", ids[2], 4)       // another key
	deliver("a", other.next(), 5) // another process
	deliver("a", ids[11], 6)
	if n := logs.Len(); n != 0 {
		t.Fatalf("%d warnings for messages in order: %v", n, logs.All())
	}
	deliver("a", ids[10], 7) // after ids[11]
	es := logs.All()
	if len(es) != 1 {
		t.Fatalf("%d warnings, want 1", len(es))
	}
	f := es[0].ContextMap()
	if f["key"] != "a" || f["message_id"] != ids[10] || f["after_message_id"] != ids[11] || f["sequence"] != uint64(7) || f["after_sequence"] != uint64(6) {
		t.Fatalf("warning fields %v", f)
	}
}
