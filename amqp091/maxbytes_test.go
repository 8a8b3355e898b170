package amqp091

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// x-max-length-bytes (limits.go): RabbitMQ counts the body bytes of the
// ready messages. Each scenario runs against the proxy and RabbitMQ with
// the same assertions.

// drainGet takes every ready message of q by basic.get (auto-ack).
func drainGet(t *testing.T, ch *amqp.Channel, q string) []string {
	t.Helper()
	var got []string
	for {
		m, ok, err := ch.Get(q, true)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return got
		}
		got = append(got, string(m.Body))
	}
}

// readyOf is q's message count from a passive declare.
func readyOf(t *testing.T, ch *amqp.Channel, q string) int {
	t.Helper()
	st, err := ch.QueueDeclarePassive(q, false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	return st.Messages
}

// deadBodies takes n dead-lettered messages from q, checking each x-death
// entry (reason maxlen from source).
func deadBodies(t *testing.T, ch *amqp.Channel, q, source string, n int) []string {
	t.Helper()
	var out []string
	for range n {
		m, ok := getWithin(t, ch, q, 5*time.Second)
		if !ok {
			t.Fatalf("dead-lettered so far: %v, want %d", out, n)
		}
		checkDeath(t, deaths(t, m)[0], 1, "maxlen", source, "", []string{source}, "")
		out = append(out, string(m.Body))
	}
	return out
}

// drop-head keeps the newest messages whose bodies fit; the dropped ones
// are dead-lettered (reason maxlen) when the queue has a DLX.
func TestMaxLengthBytesDropHead(t *testing.T) {
	brokers(t, func(t *testing.T, e *env) {
		c := e.dial()
		ch := confirmChannel(t, e, c)
		declareArgs(t, ch, "q", amqp.Table{"x-max-length-bytes": int32(10)})
		declare(t, ch, "dead")
		declareArgs(t, ch, "qd", amqp.Table{"x-max-length-bytes": int64(10), "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead"})
		for _, b := range []string{"1", "22", "333", "4444", "55555"} {
			for _, q := range []string{"q", "qd"} {
				if !publishWith(t, ch, q, amqp.Publishing{Body: []byte(b)}) {
					t.Fatalf("%s: nack for %q", q, b)
				}
			}
		}
		if n := readyOf(t, ch, "q"); n != 2 {
			t.Fatalf("q holds %d, want 2", n)
		}
		wantSeq(t, drainGet(t, ch, "q"), "4444", "55555")
		// A consumer sees the same.
		_, msgs := consumeWith(t, e, c, "qd", 10, nil)
		var got []string
		for range 2 {
			m := mustRecv(t, msgs, "qd delivery")
			got = append(got, string(m.Body))
			if err := m.Ack(false); err != nil {
				t.Fatal(err)
			}
		}
		wantSeq(t, got, "4444", "55555")
		nothingMore(t, 300*time.Millisecond, "qd after the kept ones", msgs)
		wantSeq(t, deadBodies(t, ch, "dead", "qd", 3), "1", "22", "333")
	})
}

// A message larger than the limit leaves a drop-head queue empty: it is
// dropped too (after the older ones).
func TestMaxLengthBytesLargerThanLimit(t *testing.T) {
	brokers(t, func(t *testing.T, e *env) {
		c := e.dial()
		ch := confirmChannel(t, e, c)
		declare(t, ch, "dead")
		declareArgs(t, ch, "q", amqp.Table{"x-max-length-bytes": int32(3), "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead"})
		for _, b := range []string{"ab", "toolarge"} {
			if !publishWith(t, ch, "q", amqp.Publishing{Body: []byte(b)}) {
				t.Fatalf("nack for %q", b)
			}
		}
		if n := readyOf(t, ch, "q"); n != 0 {
			t.Fatalf("q holds %d, want 0", n)
		}
		if got := drainGet(t, ch, "q"); len(got) != 0 {
			t.Fatalf("q gave %v", got)
		}
		wantSeq(t, deadBodies(t, ch, "dead", "q", 2), "ab", "toolarge")
		// reject-publish refuses it outright, even into an empty queue.
		declareArgs(t, ch, "r", amqp.Table{"x-max-length-bytes": int32(3), "x-overflow": "reject-publish"})
		if publishWith(t, ch, "r", amqp.Publishing{Body: []byte("toolarge")}) {
			t.Fatal("reject-publish acked a message larger than the limit")
		}
		if !publishWith(t, ch, "r", amqp.Publishing{Body: []byte("abc")}) {
			t.Fatal("reject-publish nacked a message that fits")
		}
		if publishWith(t, ch, "r", amqp.Publishing{}) != true {
			t.Fatal("reject-publish nacked an empty body at the limit")
		}
		wantSeq(t, drainGet(t, ch, "r"), "abc", "")
	})
}

// reject-publish refuses a publish whose body would take the ready bytes
// over the limit: confirms ack/nack in order; messages out (unacked) are
// not counted; a publisher without confirms is dropped silently.
func TestMaxLengthBytesRejectPublish(t *testing.T) {
	brokers(t, func(t *testing.T, e *env) {
		c := e.dial()
		ch := confirmChannel(t, e, c)
		declareArgs(t, ch, "q", amqp.Table{"x-max-length-bytes": int32(10), "x-overflow": "reject-publish"})
		var acks []bool
		for _, b := range []string{"aaaa", "bbbb", "cccc", "dd", "e"} {
			acks = append(acks, publishWith(t, ch, "q", amqp.Publishing{Body: []byte(b)}))
		}
		if want := []bool{true, true, false, true, false}; !slices.Equal(acks, want) {
			t.Fatalf("confirms %v, want %v", acks, want)
		}
		pch := e.channel(c)
		if err := pch.Publish("", "q", false, false, amqp.Publishing{Body: []byte("f")}); err != nil {
			t.Fatal(err)
		}
		if n := readyOf(t, pch, "q"); n != 3 {
			t.Fatalf("q holds %d, want 3", n)
		}
		// The head goes out unacked: its bytes no longer count.
		gch := e.channel(c)
		m, ok, err := gch.Get("q", false)
		if err != nil || !ok || string(m.Body) != "aaaa" {
			t.Fatalf("get: %q %v %v", m.Body, ok, err)
		}
		if !publishWith(t, ch, "q", amqp.Publishing{Body: []byte("gggg")}) {
			t.Fatal("nack although the unacked message's bytes are out")
		}
		if publishWith(t, ch, "q", amqp.Publishing{Body: []byte("h")}) {
			t.Fatal("ack over the limit")
		}
		if err := m.Ack(false); err != nil {
			t.Fatal(err)
		}
		wantSeq(t, drainGet(t, ch, "q"), "bbbb", "dd", "gggg")
		// Emptied: a publish fits again.
		if !publishWith(t, ch, "q", amqp.Publishing{Body: []byte("iiiiiiiiii")}) {
			t.Fatal("nack into the emptied queue")
		}
		wantSeq(t, drainGet(t, ch, "q"), "iiiiiiiiii")
	})
}

// reject-publish-dlx dead-letters the refused message (reason maxlen).
func TestMaxLengthBytesRejectPublishDLX(t *testing.T) {
	brokers(t, func(t *testing.T, e *env) {
		c := e.dial()
		ch := confirmChannel(t, e, c)
		declare(t, ch, "dead")
		declareArgs(t, ch, "qd", amqp.Table{"x-max-length-bytes": int32(5), "x-overflow": "reject-publish-dlx",
			"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead"})
		if !publishWith(t, ch, "qd", amqp.Publishing{Body: []byte("abc")}) {
			t.Fatal("nack for a message that fits")
		}
		if publishWith(t, ch, "qd", amqp.Publishing{Body: []byte("def")}) {
			t.Fatal("ack over the limit")
		}
		wantSeq(t, deadBodies(t, ch, "dead", "qd", 1), "def")
		wantSeq(t, drainGet(t, ch, "qd"), "abc")
	})
}

// x-max-length and x-max-length-bytes together: whichever is exceeded
// applies.
func TestMaxLengthBytesWithMaxLength(t *testing.T) {
	brokers(t, func(t *testing.T, e *env) {
		c := e.dial()
		ch := confirmChannel(t, e, c)
		declareArgs(t, ch, "q", amqp.Table{"x-max-length": int32(3), "x-max-length-bytes": int32(10)})
		for _, b := range []string{"1", "2", "3", "4", "xxxxxxxx"} {
			if !publishWith(t, ch, "q", amqp.Publishing{Body: []byte(b)}) {
				t.Fatalf("nack for %q", b)
			}
		}
		wantSeq(t, drainGet(t, ch, "q"), "3", "4", "xxxxxxxx")
		declareArgs(t, ch, "r", amqp.Table{"x-max-length": int32(2), "x-max-length-bytes": int32(5), "x-overflow": "reject-publish"})
		var acks []bool
		for _, b := range []string{"a", "bbbbb", "bbbb", "c", "d"} {
			acks = append(acks, publishWith(t, ch, "r", amqp.Publishing{Body: []byte(b)}))
		}
		// bbbbb: 6 bytes; bbbb: 5 bytes, 2 messages; c: a third message.
		if want := []bool{true, false, true, false, false}; !slices.Equal(acks, want) {
			t.Fatalf("confirms %v, want %v", acks, want)
		}
		wantSeq(t, drainGet(t, ch, "r"), "a", "bbbb")
	})
}

// A priority queue's drop-head by bytes drops what would be delivered
// next (the highest priority first).
func TestMaxLengthBytesPriority(t *testing.T) {
	brokers(t, func(t *testing.T, e *env) {
		c := e.dial()
		ch := confirmChannel(t, e, c)
		declareArgs(t, ch, "p", amqp.Table{"x-max-priority": int32(5), "x-max-length-bytes": int32(6)})
		for _, m := range []struct {
			body string
			prio uint8
		}{{"aaa", 0}, {"bbb", 5}, {"ccc", 0}} {
			if !publishWith(t, ch, "p", amqp.Publishing{Body: []byte(m.body), Priority: m.prio}) {
				t.Fatalf("nack for %q", m.body)
			}
		}
		wantSeq(t, drainGet(t, ch, "p"), "aaa", "ccc")
		declareArgs(t, ch, "pr", amqp.Table{"x-max-priority": int32(5), "x-max-length-bytes": int32(6), "x-overflow": "reject-publish"})
		var acks []bool
		for _, m := range []struct {
			body string
			prio uint8
		}{{"aaa", 0}, {"bbb", 5}, {"c", 3}} {
			acks = append(acks, publishWith(t, ch, "pr", amqp.Publishing{Body: []byte(m.body), Priority: m.prio}))
		}
		if want := []bool{true, true, false}; !slices.Equal(acks, want) {
			t.Fatalf("confirms %v, want %v", acks, want)
		}
		wantSeq(t, drainGet(t, ch, "pr"), "bbb", "aaa")
	})
}

func TestByteLedger(t *testing.T) {
	var l byteLedger
	if b, covered := l.ready(0); b != 0 || !covered {
		t.Fatalf("empty: %d %v", b, covered)
	}
	if b, covered := l.ready(2); b != 0 || covered {
		t.Fatalf("nothing known: %d %v", b, covered)
	}
	for _, s := range []int{1, 2, 3, 4} {
		l.add(s)
	}
	if b, covered := l.ready(2); b != 7 || !covered {
		t.Fatalf("newest 2: %d %v", b, covered)
	}
	// The two older entries are forgotten; four ready: two unknown at the
	// average (3.5, rounded down).
	if b, covered := l.ready(4); b != 7+2*3 || covered {
		t.Fatalf("newest 4: %d %v", b, covered)
	}
	m := l.mark()
	l.add(10) // stored while a scan ran
	l.rebuild([]int{5, 6}, m)
	if b, covered := l.ready(3); b != 21 || !covered || l.total() != 21 || !l.fresh() || l.scanCount() != 1 {
		t.Fatalf("after rebuild: %d %v total %d", b, covered, l.total())
	}
	if b, covered := l.ready(0); b != 0 || !covered || l.total() != 0 {
		t.Fatalf("emptied: %d %v", b, covered)
	}
	q := &queue{maxLen: -1, maxBytes: 10}
	if k := q.keepOf([]int{1, 2, 3, 4, 5}); k != 2 {
		t.Fatalf("keepOf bytes: %d", k)
	}
	q.maxLen = 1
	if k := q.keepOf([]int{1, 2, 3, 4, 5}); k != 1 {
		t.Fatalf("keepOf both: %d", k)
	}
	q.maxLen, q.maxBytes = -1, 3
	if k := q.keepOf([]int{1, 8}); k != 0 {
		t.Fatalf("keepOf too large: %d", k)
	}
}

// In a transaction the byte limit applies at the commit, in publish order:
// reject-publish drops what does not fit (the commit fails, partial),
// drop-head trims after the commit.
func TestMaxLengthBytesTransactional(t *testing.T) {
	brokers(t, func(t *testing.T, e *env) {
		c := e.dial()
		setup := e.channel(c)
		declareArgs(t, setup, "rp", amqp.Table{"x-max-length-bytes": int32(6), "x-overflow": "reject-publish"})
		declareArgs(t, setup, "dh", amqp.Table{"x-max-length-bytes": int32(6)})
		if err := setup.Publish("", "rp", false, false, amqp.Publishing{Body: []byte("bb")}); err != nil {
			t.Fatal(err)
		}
		commit := func(q string) error {
			ch := e.channel(c)
			if err := ch.Tx(); err != nil {
				t.Fatal(err)
			}
			for _, b := range []string{"111", "22", "3", "44"} {
				if err := ch.Publish("", q, false, false, amqp.Publishing{Body: []byte(b)}); err != nil {
					t.Fatal(err)
				}
			}
			return ch.TxCommit()
		}
		if err := commit("dh"); err != nil {
			t.Fatal(err)
		}
		wantSeq(t, drainGet(t, setup, "dh"), "22", "3", "44")
		err := commit("rp")
		if amqpCode(err) != 406 || !strings.Contains(err.Error(), "PRECONDITION_FAILED - partial tx completion") {
			t.Fatalf("commit into rp: %v", err)
		}
		// bb (2) + 111 (3) = 5; 22 would be 7; 3 fits (6); 44 would be 8.
		wantSeq(t, drainGet(t, setup, "rp"), "bb", "111", "3")
	})
}

// A drop-head queue that receives dead-lettered messages is trimmed to its
// limits too (its own dead-letter exchange gets what it drops).
func TestMaxLengthBytesDeadLetterTarget(t *testing.T) {
	brokers(t, func(t *testing.T, e *env) {
		c := e.dial()
		ch := confirmChannel(t, e, c)
		declare(t, ch, "dead2")
		declareArgs(t, ch, "dead", amqp.Table{"x-max-length-bytes": int32(5), "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead2"})
		declareArgs(t, ch, "src", amqp.Table{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead"})
		for _, b := range []string{"111", "222", "333"} {
			if !publishWith(t, ch, "src", amqp.Publishing{Body: []byte(b)}) {
				t.Fatalf("nack for %q", b)
			}
		}
		for range 3 {
			m, ok, err := ch.Get("src", false)
			if err != nil || !ok {
				t.Fatalf("get: %v %v", ok, err)
			}
			if err := m.Reject(false); err != nil {
				t.Fatal(err)
			}
		}
		// 222 is dropped once 333 is in.
		wantSeq(t, deadBodies(t, ch, "dead2", "dead", 2), "111", "222")
		wantSeq(t, drainGet(t, ch, "dead"), "333")
	})
}

// A queue longer than exactTrimMax is trimmed from the head by the bytes
// counted, without taking it all into hand.
func TestMaxLengthBytesLongQueue(t *testing.T) {
	const keep = exactTrimMax + 100
	brokers(t, func(t *testing.T, e *env) {
		c := e.dial()
		ch := confirmChannel(t, e, c)
		declareArgs(t, ch, "long", amqp.Table{"x-max-length-bytes": int32(keep * 8)})
		// Confirmed before the count: RabbitMQ's declare-ok may not count
		// a burst of publishes still on their way to the queue.
		var pending []*amqp.DeferredConfirmation
		for i := range keep + 50 {
			dc, err := ch.PublishWithDeferredConfirm("", "long", false, false, amqp.Publishing{Body: []byte(fmt.Sprintf("%08d", i))})
			if err != nil {
				t.Fatal(err)
			}
			pending = append(pending, dc)
		}
		for _, dc := range pending {
			if !dc.Wait() {
				t.Fatal("nack")
			}
		}
		// On a real KubeMQ the count this trim goes by can include, for a
		// moment, a batch the lease engine has just taken (amqp091/README.md):
		// the trim then drops up to one batch (500) too many.
		slack := 0
		if e.srv != nil && e.kubemq != "embedded" {
			slack = 500
		}
		n := readyOf(t, ch, "long")
		if n > keep || n < keep-slack {
			t.Fatalf("long holds %d, want %d (less at most %d)", n, keep, slack)
		}
		m, ok, err := ch.Get("long", true)
		if want := fmt.Sprintf("%08d", keep+50-n); err != nil || !ok || string(m.Body) != want {
			t.Fatalf("head %q %v %v, want %s", m.Body, ok, err, want)
		}
	})
}

// A full reject-publish queue refuses dead-lettered messages as it refuses
// publishes (RabbitMQ's queue process checks every delivery): they are
// dropped, or dead-lettered again from it (reason maxlen) under
// reject-publish-dlx.
func TestRejectPublishDeadLetterTarget(t *testing.T) {
	brokers(t, func(t *testing.T, e *env) {
		c := e.dial()
		ch := confirmChannel(t, e, c)
		declare(t, ch, "dead3")
		declareArgs(t, ch, "full", amqp.Table{"x-max-length": int32(1), "x-overflow": "reject-publish"})
		declareArgs(t, ch, "fulldlx", amqp.Table{"x-max-length-bytes": int32(3), "x-overflow": "reject-publish-dlx",
			"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead3"})
		declareArgs(t, ch, "src", amqp.Table{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "full"})
		declareArgs(t, ch, "src2", amqp.Table{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "fulldlx"})
		for _, b := range []string{"111", "222", "333"} {
			for _, q := range []string{"src", "src2"} {
				if !publishWith(t, ch, q, amqp.Publishing{Body: []byte(b)}) {
					t.Fatalf("%s: nack for %q", q, b)
				}
			}
		}
		for _, q := range []string{"src", "src2"} {
			for range 3 {
				m, ok, err := ch.Get(q, false)
				if err != nil || !ok {
					t.Fatalf("get %s: %v %v", q, ok, err)
				}
				if err := m.Reject(false); err != nil {
					t.Fatal(err)
				}
			}
		}
		var got []string
		for range 2 {
			m, ok := getWithin(t, ch, "dead3", 5*time.Second)
			if !ok {
				t.Fatalf("dead-lettered from fulldlx so far: %v, want 2", got)
			}
			ds := deaths(t, m)
			if len(ds) != 2 || ds[0]["reason"] != "maxlen" || ds[0]["queue"] != "fulldlx" || ds[1]["reason"] != "rejected" || ds[1]["queue"] != "src2" {
				t.Fatalf("x-death of %q: %v", m.Body, ds)
			}
			got = append(got, string(m.Body))
		}
		wantSeq(t, got, "222", "333")
		wantSeq(t, drainGet(t, ch, "full"), "111")
		wantSeq(t, drainGet(t, ch, "fulldlx"), "111")
		wantSeq(t, drainGet(t, ch, "dead3"))
	})
}
