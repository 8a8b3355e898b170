package amqp091

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Benchmarks of issue 17, proxy next to RabbitMQ in the same run (see
// bench_test.go):
//
//	go test -run '^$' -bench 'DLXRetry|DropHead|PriorityQueue' -benchtime 2000x ./amqp091/

// benchQueueArgs declares a queue with arguments, deleted afterwards.
func benchQueueArgs(b *testing.B, ch *amqp.Channel, name string, args amqp.Table) {
	b.Helper()
	if _, err := ch.QueueDeclare(name, benchDurable, false, false, false, args); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ch.QueueDelete(name, false, false, false) })
}

// BenchmarkDLXRetryLoop: every message is rejected once by the work
// queue's consumer, waits 20 ms in a TTL queue, comes back through the
// dead-letter exchange and is acked then. msg/s = messages through the
// whole loop (two deliveries and two dead-letterings each).
func BenchmarkDLXRetryLoop(b *testing.B) {
	for _, tg := range benchTargets(b) {
		b.Run(tg.name, func(b *testing.B) {
			c, ch := benchDial(b, tg.url)
			work, wait := "bench-work-"+randHex(3), "bench-wait-"+randHex(3)
			benchQueueArgs(b, ch, work, amqp.Table{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": wait})
			benchQueueArgs(b, ch, wait, amqp.Table{"x-message-ttl": int32(20), "x-dead-letter-exchange": "", "x-dead-letter-routing-key": work})
			cch, err := c.Channel()
			if err != nil {
				b.Fatal(err)
			}
			if err := cch.Qos(100, 0, false); err != nil {
				b.Fatal(err)
			}
			msgs, err := cch.Consume(work, "", false, false, false, false, nil)
			if err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			start := time.Now()
			fill(b, ch, work, b.N)
			for done := 0; done < b.N; {
				select {
				case m := <-msgs:
					if _, retried := m.Headers["x-death"]; retried {
						m.Ack(false)
						done++
					} else {
						m.Reject(false)
					}
				case <-time.After(time.Minute):
					b.Fatalf("%d of %d messages through the loop", done, b.N)
				}
			}
			b.StopTimer()
			report(b, start, b.N, "msg/s")
			reportMemory(b, tg.name)
		})
	}
}

// BenchmarkDropHead: publish with confirms (window 1000) into a queue
// with x-max-length 100 and drop-head, until every publish is confirmed
// and the queue holds the newest 100; the -bytes rows limit the queue by
// x-max-length-bytes to 100 bodies instead.
func BenchmarkDropHead(b *testing.B) {
	for _, tg := range benchTargets(b) {
		for _, v := range []struct {
			suffix string
			args   amqp.Table
		}{{"", amqp.Table{"x-max-length": int32(100)}}, {"-bytes", amqp.Table{"x-max-length-bytes": int32(100 * benchBody)}}} {
			benchDropHead(b, tg.name, v.suffix, tg.url, v.args)
		}
	}
}

func benchDropHead(b *testing.B, target, suffix, url string, args amqp.Table) {
	b.Run(target+suffix, func(b *testing.B) {
		_, ch := benchDial(b, url)
		q := "bench-drophead-" + randHex(3)
		benchQueueArgs(b, ch, q, args)
		benchPublishConfirmed(b, ch, q)
		st, err := ch.QueueDeclarePassive(q, false, false, false, false, nil)
		if err != nil {
			b.Fatal(err)
		}
		if want := min(b.N, 100); st.Messages != want {
			b.Fatalf("queue holds %d, want %d", st.Messages, want)
		}
		reportMemory(b, target)
	})
}

// BenchmarkPriorityQueue: a queue with x-max-priority 10 gets messages of
// priorities 0..9 in turn (confirms, window 1000), then a consumer
// (prefetch 100, ack each) takes them all; they must arrive highest
// priority first. msg/s = messages published and consumed over the
// whole run.
func BenchmarkPriorityQueue(b *testing.B) {
	for _, tg := range benchTargets(b) {
		b.Run(tg.name, func(b *testing.B) {
			c, ch := benchDial(b, tg.url)
			q := "bench-prio-" + randHex(3)
			benchQueueArgs(b, ch, q, amqp.Table{"x-max-priority": int32(10)})
			if err := ch.Confirm(false); err != nil {
				b.Fatal(err)
			}
			body := make([]byte, benchBody)
			b.ResetTimer()
			start := time.Now()
			var last *amqp.DeferredConfirmation
			for i := range b.N {
				p := benchPublishing(body)
				p.Priority = uint8(i % 10)
				dc, err := ch.PublishWithDeferredConfirm("", q, false, false, p)
				if err != nil {
					b.Fatal(err)
				}
				last = dc
				if i%1000 == 999 && !last.Wait() {
					b.Fatal("nack")
				}
			}
			if last != nil && !last.Wait() {
				b.Fatal("nack")
			}
			published := time.Since(start)
			cch, err := c.Channel()
			if err != nil {
				b.Fatal(err)
			}
			if err := cch.Qos(100, 0, false); err != nil {
				b.Fatal(err)
			}
			consumeStart := time.Now()
			msgs, err := cch.Consume(q, "", false, false, false, false, nil)
			if err != nil {
				b.Fatal(err)
			}
			prev := uint8(255)
			for range b.N {
				m := mustRecv(b, msgs, "delivery")
				if m.Priority > prev {
					b.Fatalf("priority %d after %d", m.Priority, prev)
				}
				prev = m.Priority
				m.Ack(false)
			}
			b.StopTimer()
			report(b, start, b.N, "msg/s")
			b.ReportMetric(float64(b.N)/published.Seconds(), "publish-msg/s")
			report(b, consumeStart, b.N, "consume-msg/s")
			reportMemory(b, tg.name)
		})
	}
}
