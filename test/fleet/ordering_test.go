package fleet

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/kubemq-io/kubemq-proxy/internal/kubemqtest"
)

// Ordering keys across the fleet: one ordered subscription, a subscriber on every replica (all
// but the holder's forwarded to it), messages over orderKeys keys published through every
// replica, each key from one publisher client so that its order is defined.

const orderKeys = 20

// keyLog checks Pub/Sub's per-key order: each key's messages (sequence 0, 1, ...) arrive in
// publish order; a redelivery may restart a key from an earlier message, after which the key
// goes on in order from there. A jump forward (a message before an earlier one of its key
// that was never delivered since the restart) is a violation.
type keyLog struct {
	mu         sync.Mutex
	next       map[string]int // the sequence expected next, per key
	seen       map[string]map[int]bool
	restarts   int
	deliveries int
	violations []violation
	byReplica  map[string]int
	changed    chan struct{}
}

// violation is a message that arrived before an earlier one of its key.
type violation struct{ key, text string }

func newKeyLog() *keyLog {
	return &keyLog{next: map[string]int{}, seen: map[string]map[int]bool{}, byReplica: map[string]int{}, changed: make(chan struct{}, 1)}
}

func (k *keyLog) deliver(key string, seq int, replica string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.deliveries++
	k.byReplica[replica]++
	if k.seen[key] == nil {
		k.seen[key] = map[int]bool{}
	}
	k.seen[key][seq] = true
	switch next := k.next[key]; {
	case seq == next:
	case seq < next:
		k.restarts++ // a redelivery: the key starts over from seq
	default:
		if len(k.violations) < 20 {
			k.violations = append(k.violations, violation{key, fmt.Sprintf("%s: message %d arrived at %s while %d was expected", key, seq, replica, next)})
		}
	}
	k.next[key] = seq + 1
	select {
	case k.changed <- struct{}{}:
	default:
	}
}

// done reports whether every key got all its messages and its last delivery was its last one.
func (k *keyLog) done(want map[string]int) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	for key, n := range want {
		if k.next[key] != n || len(k.seen[key]) != n {
			return false
		}
	}
	return true
}

func (k *keyLog) waitDone(t testing.TB, want map[string]int, d time.Duration) {
	t.Helper()
	deadline := time.After(d)
	for !k.done(want) {
		select {
		case <-k.changed:
		case <-deadline:
			k.mu.Lock()
			var missing []string
			for key, n := range want {
				if k.next[key] != n || len(k.seen[key]) != n {
					missing = append(missing, fmt.Sprintf("%s: %d of %d seen, next %d", key, len(k.seen[key]), n, k.next[key]))
				}
			}
			k.mu.Unlock()
			sort.Strings(missing)
			t.Fatalf("keys not complete after %v: %s", d, strings.Join(missing, "; "))
		}
	}
}

// receiveOrdered runs an ordered subscriber of sub on r until ctx ends.
func receiveOrdered(ctx context.Context, t testing.TB, wg *sync.WaitGroup, r *replica, sub string, k *keyLog) {
	c := r.pubsub(t)
	s := c.Subscriber(sub)
	s.ReceiveSettings.MaxOutstandingMessages = 100
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			err := s.Receive(ctx, func(_ context.Context, m *pubsub.Message) {
				seq, err := strconv.Atoi(m.Attributes["s"])
				if err != nil || m.OrderingKey == "" {
					t.Errorf("%s: a message without key or sequence: %q %v", r.name, m.OrderingKey, m.Attributes)
				}
				k.deliver(m.OrderingKey, seq, r.name)
				m.Ack()
			})
			if err != nil && ctx.Err() == nil {
				t.Logf("%s: Receive ended: %v; again", r.name, err)
				time.Sleep(100 * time.Millisecond)
			}
		}
	}()
}

// publishOrdered sends n messages round-robin over orderKeys keys, key i from replica
// i % replicas; fault, if set, runs once half of them are confirmed, after which every key is
// published from the last replica (its earlier messages all confirmed, so the order stays
// defined). It returns the number of messages per key.
func (f *fleet) publishOrdered(t testing.TB, topic string, n int, fault func()) map[string]int {
	t.Helper()
	pubs := make([]*pubsub.Publisher, len(f.replicas))
	for i, r := range f.replicas {
		pubs[i] = r.pubsub(t).Publisher(topic)
		pubs[i].EnableMessageOrdering = true
		pubs[i].PublishSettings.CountThreshold = 50
		defer pubs[i].Stop()
	}
	body := make([]byte, 256)
	want := map[string]int{}
	var results []*pubsub.PublishResult
	wait := func() {
		for _, r := range results {
			if _, err := r.Get(context.Background()); err != nil {
				t.Fatalf("publish: %v", err)
			}
		}
		results = results[:0]
	}
	faulted := false
	for i := range n {
		if i == n/2 && fault != nil {
			wait()
			fault()
			faulted = true
		}
		ki := i % orderKeys
		key := fmt.Sprintf("key-%02d", ki)
		p := pubs[ki%len(pubs)]
		if faulted {
			p = pubs[len(pubs)-1]
		}
		seq := want[key]
		want[key]++
		results = append(results, p.Publish(context.Background(), &pubsub.Message{Data: body, OrderingKey: key,
			Attributes: map[string]string{"s": strconv.Itoa(seq)}}))
	}
	wait()
	return want
}

func orderedRun(t *testing.T, stop bool) {
	if testing.Short() {
		t.Skip("a fleet of processes: over 30 s")
	}
	f := newFleet(t, 3)
	topic, sub := f.setupSub(t, "ordered-"+f.suffix, func(s *pubsubpb.Subscription) { s.EnableMessageOrdering = true })
	q := f.subQueue(t, sub)
	k := newKeyLog()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	// The first replica's subscriber first, so that it holds the subscription.
	receiveOrdered(ctx, t, &wg, f.replicas[0], sub, k)
	h := f.holder(t, q, 30*time.Second)
	victim := f.others(h)[0]
	vctx, vcancel := context.WithCancel(ctx)
	var vwg sync.WaitGroup
	for _, r := range f.replicas[1:] {
		if r == victim {
			receiveOrdered(vctx, t, &vwg, r, sub, k)
		} else {
			receiveOrdered(ctx, t, &wg, r, sub, k)
		}
	}
	start := time.Now()
	var fault func()
	if stop {
		if victim == f.replicas[len(f.replicas)-1] {
			t.Fatalf("the victim %s is the replica that publishes after the fault", victim.name)
		}
		fault = func() {
			// A pod stops: its application's subscriber first, then the sidecar.
			vcancel()
			vwg.Wait()
			t.Logf("%s's subscriber ended %v after the first publish", victim.name, time.Since(start).Round(time.Millisecond))
			if err := victim.p.Stop(30 * time.Second); err != nil {
				t.Errorf("%s: %v", victim.name, err)
			}
			t.Logf("%s (not the holder %s) stopped %v after the first publish", victim.name, h.name, time.Since(start).Round(time.Millisecond))
		}
	}
	n := messages(t) / 4
	want := f.publishOrdered(t, topic, n, fault)
	published := time.Since(start)
	k.waitDone(t, want, 5*time.Minute)
	took := time.Since(start)
	t.Logf("published in %v, all delivered in order %v after the first publish", published.Round(time.Millisecond), took.Round(time.Millisecond))
	// A late redelivery would restart a key: it must then go on to the key's end again.
	time.Sleep(10 * time.Second)
	k.waitDone(t, want, time.Minute)
	cancel()
	vcancel()
	wg.Wait()
	vwg.Wait()
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, v := range k.violations {
		if kubemqMisordered(t, h, v.key) {
			continue
		}
		t.Error("out of order: " + v.text)
	}
	names := make([]string, 0, len(k.byReplica))
	for r := range k.byReplica {
		names = append(names, r)
	}
	sort.Strings(names)
	split := ""
	for _, r := range names {
		split += fmt.Sprintf(" %s=%d", r, k.byReplica[r])
	}
	t.Logf("FLEET pubsub ordered (stop=%v): %d messages over %d keys in %v, holder %s, %d deliveries (%d key restarts by redelivery), per replica:%s",
		stop, n, orderKeys, took.Round(time.Millisecond), h.name, k.deliveries, k.restarts, split)
	if !stop && k.deliveries != n {
		t.Errorf("%d deliveries of %d messages without any fault", k.deliveries, n)
	}
	if len(k.byReplica) < 2 {
		t.Errorf("the keys went to %d subscriber(s) only: %s", len(k.byReplica), split)
	}
	f.checkProblems()
}

// kubemqMisordered reports, on an external KubeMQ, whether the holder h logged that KubeMQ
// handed out a message of key after a later one of the key without the key having waited
// for it: the real KubeMQ v2.4.0 was seen to answer a send before its messages were visible
// to a Get, and to hand out a later send's messages first (docs/kubemq.md 10.6). The holder
// keeps the key back for such a message (gcp/keychain.go), at most 2 s; one later than that
// (logged with "held":false) is the known limit it is (README). Any other violation, one whose
// message the key waited for included, fails the run.
func kubemqMisordered(t *testing.T, h *replica, key string) bool {
	if os.Getenv(kubemqtest.EnvAddress) == "" {
		return false
	}
	for _, line := range logLines(h.p) {
		if strings.Contains(line, "KubeMQ handed out a message after a later one of its key") && strings.Contains(line, `"key":"`+key+`"`) &&
			strings.Contains(line, `"held":false`) {
			t.Logf("KNOWN LIMIT (README, docs/kubemq.md 10.6): %s got out of order because KubeMQ handed it out so; %s logged: %s", key, h.name, line)
			return true
		}
	}
	return false
}

// TestPubSubFleetOrdering: per-key order holds across replicas, nothing lost or repeated.
func TestPubSubFleetOrdering(t *testing.T) { orderedRun(t, false) }

// TestPubSubFleetOrderingStop: the same with a replica that does not hold the subscription
// stopped (SIGTERM) mid-run: its keys move on to other subscribers, in order, nothing lost.
func TestPubSubFleetOrderingStop(t *testing.T) { orderedRun(t, true) }
