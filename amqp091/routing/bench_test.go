package routing

import (
	"fmt"
	"testing"
)

// BenchmarkTopicRoute routes through a topic exchange with many bindings of
// mixed shapes, as a realistic event bus has: per-service literal keys,
// "*" and "#" wildcards.
func BenchmarkTopicRoute(b *testing.B) {
	for _, n := range []int{10, 1000, 10000} {
		b.Run(fmt.Sprintf("bindings=%d", n), func(b *testing.B) {
			tb := NewTable()
			tb.PutExchange(Exchange{Name: "events", Kind: Topic})
			for i := range n {
				q := fmt.Sprintf("q%d", i)
				tb.PutQueue(q)
				var key string
				switch i % 4 {
				case 0:
					key = fmt.Sprintf("svc%d.order.created", i)
				case 1:
					key = fmt.Sprintf("svc%d.*.created", i)
				case 2:
					key = fmt.Sprintf("svc%d.#", i)
				case 3:
					key = "*.order.created"
				}
				tb.Bind(Binding{Source: "events", Dest: QueueDest(q), Key: key})
			}
			keys := []string{"svc0.order.created", "svc1.payment.created", "svc2.a.b.c.d", "svc5.order.created"}
			out := make([]string, 0, n)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				var err error
				out, err = tb.Route("events", keys[i%len(keys)], nil, out[:0])
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkTopicFanout10 is the benchmark shape of the issue: one topic
// exchange routing every message to 10 queues.
func BenchmarkTopicFanout10(b *testing.B) {
	tb := NewTable()
	tb.PutExchange(Exchange{Name: "amq.topic", Kind: Topic})
	for i := range 10 {
		q := fmt.Sprintf("q%d", i)
		tb.PutQueue(q)
		tb.Bind(Binding{Source: "amq.topic", Dest: QueueDest(q), Key: "bench.#"})
	}
	out := make([]string, 0, 10)
	b.ReportAllocs()
	for b.Loop() {
		out, _ = tb.Route("amq.topic", "bench.key.x", nil, out[:0])
		if len(out) != 10 {
			b.Fatal(len(out))
		}
	}
}

func BenchmarkDirectRoute(b *testing.B) {
	tb := NewTable()
	for i := range 1000 {
		q := fmt.Sprintf("q%d", i)
		tb.PutQueue(q)
		tb.Bind(Binding{Source: "amq.direct", Dest: QueueDest(q), Key: q})
	}
	out := make([]string, 0, 1)
	b.ReportAllocs()
	for b.Loop() {
		out, _ = tb.Route("amq.direct", "q500", nil, out[:0])
	}
}
