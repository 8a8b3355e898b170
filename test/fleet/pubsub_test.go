package fleet

import (
	"context"
	"fmt"
	"math"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kubemq-io/kubemq-proxy/internal/proctest"
)

const project = "fleet"

func (r *replica) pubsub(t testing.TB) *pubsub.Client {
	t.Helper()
	c, err := pubsub.NewClient(context.Background(), project, option.WithEndpoint(r.addr("gcp")), option.WithoutAuthentication(),
		option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// ledger records every delivery of a run, by message id.
type ledger struct {
	mu         sync.Mutex
	deliveries map[string]int
	byReplica  map[string]int
	after      map[string]int // by replica, since mark
	marked     bool
	markAt     time.Time
	acked      map[string]time.Time // first ack
	afterAck   int                  // deliveries of a message after its ack
	backAcked  []time.Time          // for each of those, when the message was first acked
	changed    chan struct{}
	lastNew    time.Time     // when the last message was first delivered
	last       time.Time     // the last delivery
	maxGap     time.Duration // the longest pause between deliveries since mark
	cancels    int           // AMQP consumers cancelled by the server (basic.cancel)
}

func newLedger() *ledger {
	return &ledger{deliveries: map[string]int{}, byReplica: map[string]int{}, after: map[string]int{}, acked: map[string]time.Time{}, changed: make(chan struct{}, 1)}
}

// serverCancel counts an AMQP consumer cancelled by the server.
func (l *ledger) serverCancel() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cancels++
}

// serverCancels is how many AMQP consumers the server cancelled.
func (l *ledger) serverCancels() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cancels
}

// mark starts counting deliveries per replica afresh (after a fault).
func (l *ledger) mark() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.marked = true
	l.markAt = time.Now()
}

// ackedSpan describes n deliveries of acked messages as the time the consumers took to ack as
// many just before mark (the fault): "1.2 s of acks at 650/s".
func (l *ledger) ackedSpan(n int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	const window = 2 * time.Second
	acks := 0
	for _, at := range l.acked {
		if at.Before(l.markAt) && !at.Before(l.markAt.Add(-window)) {
			acks++
		}
	}
	// The acks that did not hold: the oldest of them, against the fault.
	var oldest time.Duration
	later := 0
	for _, at := range l.backAcked {
		if d := l.markAt.Sub(at); d > oldest {
			oldest = d
		} else if d < 0 {
			later++
		}
	}
	held := fmt.Sprintf("; those acked before the fault were acked within its last %v, %d after it", oldest.Round(time.Millisecond), later)
	if acks == 0 {
		return "no acks in the 2 s before the fault" + held
	}
	rate := float64(acks) / window.Seconds()
	return fmt.Sprintf("%.2f s of acks at the %.0f/s before the fault", float64(n)/rate, rate) + held
}

// deliver records one delivery; it reports whether the message had been acked before.
func (l *ledger) deliver(id, replica string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	if l.marked && !l.last.IsZero() && now.Sub(l.last) > l.maxGap {
		l.maxGap = now.Sub(l.last)
	}
	l.last = now
	if l.deliveries[id] == 0 {
		l.lastNew = now
	}
	l.deliveries[id]++
	l.byReplica[replica]++
	if l.marked {
		l.after[replica]++
	}
	if at, ok := l.acked[id]; ok {
		l.afterAck++
		l.backAcked = append(l.backAcked, at)
	}
	select {
	case l.changed <- struct{}{}:
	default:
	}
}

func (l *ledger) ack(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.acked[id]; !ok {
		l.acked[id] = time.Now()
	}
}

// lastAt is when the last message was first delivered.
func (l *ledger) lastAt() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lastNew
}

// gap is the longest pause between deliveries since mark.
func (l *ledger) gap() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.maxGap
}

func (l *ledger) unique() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.deliveries)
}

// waitFor waits until n distinct messages were delivered.
func (l *ledger) waitFor(t testing.TB, n int, d time.Duration) {
	t.Helper()
	deadline := time.After(d)
	for l.unique() < n {
		select {
		case <-l.changed:
		case <-deadline:
			t.Fatalf("%d of %d messages delivered in %v", l.unique(), n, d)
		}
	}
}

// report checks that every id was delivered, and returns the duplicates (deliveries beyond
// the first) and those of acked messages.
func (l *ledger) report(t testing.TB, ids []string) (dups, afterAck int, split string) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	lost := 0
	for _, id := range ids {
		if l.deliveries[id] == 0 {
			lost++
		}
	}
	if lost > 0 {
		t.Errorf("%d of %d messages lost", lost, len(ids))
	}
	if l.cancels > 0 {
		// No run deletes its queue; a client that is not told to consume again would stop.
		t.Errorf("the server cancelled %d AMQP consumers (basic.cancel) of a queue that still exists", l.cancels)
	}
	for _, n := range l.deliveries {
		dups += n - 1
	}
	names := make([]string, 0, len(l.byReplica))
	for r := range l.byReplica {
		names = append(names, r)
	}
	sort.Strings(names)
	for _, r := range names {
		split += fmt.Sprintf(" %s=%d", r, l.byReplica[r])
		if l.marked {
			split += fmt.Sprintf(" (%d after the fault)", l.after[r])
		}
	}
	return dups, l.afterAck, split
}

// receiveOn runs a consumer of sub on r until ctx ends.
func receiveOn(ctx context.Context, t testing.TB, wg *sync.WaitGroup, r *replica, sub string, l *ledger) {
	c := r.pubsub(t)
	s := c.Subscriber(sub)
	s.ReceiveSettings.MaxOutstandingMessages = 100
	s.ReceiveSettings.NumGoroutines = 1
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			err := s.Receive(ctx, func(_ context.Context, m *pubsub.Message) {
				l.deliver(m.Attributes["n"], r.name)
				m.Ack()
				l.ack(m.Attributes["n"])
			})
			if err != nil && ctx.Err() == nil {
				t.Logf("%s: Receive ended: %v; again", r.name, err)
				time.Sleep(100 * time.Millisecond)
			}
		}
	}()
}

// setupPubSub creates a topic and a subscription through the first replica.
func (f *fleet) setupPubSub(t testing.TB) (topic, sub string) {
	t.Helper()
	return f.setupSub(t, "fleet-"+f.suffix, nil)
}

// setupSub creates a topic and a subscription named id through the first replica; edit, if
// set, adjusts the subscription before it is created.
func (f *fleet) setupSub(t testing.TB, id string, edit func(*pubsubpb.Subscription)) (topic, sub string) {
	t.Helper()
	c := f.replicas[0].pubsub(t)
	topic, sub = "projects/"+project+"/topics/"+id, "projects/"+project+"/subscriptions/"+id
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: topic}); err != nil {
		t.Fatal(err)
	}
	s := &pubsubpb.Subscription{Name: sub, Topic: topic, AckDeadlineSeconds: 20}
	if edit != nil {
		edit(s)
	}
	if _, err := c.SubscriptionAdminClient.CreateSubscription(ctx, s); err != nil {
		t.Fatal(err)
	}
	return topic, sub
}

// publish sends n messages (attribute n = 0..n-1) through the replicas in turn, and returns
// their ids; fault, if set, runs once half of them are out.
func (f *fleet) publish(t testing.TB, topic string, n int, fault func()) []string {
	t.Helper()
	pubs := make([]*pubsub.Publisher, len(f.replicas))
	for i, r := range f.replicas {
		pubs[i] = r.pubsub(t).Publisher(topic)
		pubs[i].PublishSettings.CountThreshold = 100
		defer pubs[i].Stop()
	}
	body := make([]byte, 1024)
	ids := make([]string, n)
	var results []*pubsub.PublishResult
	for i := range n {
		if i == n/2 && fault != nil {
			for _, r := range results {
				if _, err := r.Get(context.Background()); err != nil {
					t.Fatalf("publish: %v", err)
				}
			}
			results = results[:0]
			fault()
		}
		ids[i] = strconv.Itoa(i)
		p := pubs[i%len(pubs)]
		if fault != nil && i >= n/2 {
			p = pubs[len(pubs)-1] // a replica that stays up (the faults hit the first ones)
		}
		results = append(results, p.Publish(context.Background(), &pubsub.Message{Data: body, Attributes: map[string]string{"n": ids[i]}}))
	}
	for _, r := range results {
		if _, err := r.Get(context.Background()); err != nil {
			t.Fatalf("publish: %v", err)
		}
	}
	return ids
}

// TestPubSubFleet: three replicas (FLEET_REPLICAS), a consumer of one subscription on each, no
// fault: every message once, and the work shared within 20 % of even.
func TestPubSubFleet(t *testing.T) {
	f := newFleet(t, replicas(t))
	topic, sub := f.setupPubSub(t)
	l := newLedger()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, r := range f.replicas {
		receiveOn(ctx, t, &wg, r, sub, l)
	}
	// The split is only fair to judge once every subscriber's stream reached the holder.
	f.waitStreams(t, sub, len(f.replicas), time.Minute)
	n := messages(t)
	start := time.Now()
	ids := f.publish(t, topic, n, nil)
	l.waitFor(t, n, 5*time.Minute)
	took := time.Since(start)
	// Records of acked leases come back a record delay later: none may bring a message back.
	time.Sleep(15 * time.Second)
	cancel()
	wg.Wait()
	dups, afterAck, split := l.report(t, ids)
	t.Logf("FLEET pubsub %d messages in %v, %d duplicates (%d of acked messages), per replica:%s", n, took.Round(time.Millisecond), dups, afterAck, split)
	if !f.excused(dups, "duplicate deliveries") {
		t.Errorf("%d duplicate deliveries without any fault", dups)
	}
	even := float64(n) / float64(len(f.replicas))
	for _, r := range f.replicas {
		if got := float64(l.byReplica[r.name]); math.Abs(got-even) > 0.2*even {
			t.Errorf("%s got %d deliveries, more than 20%% off an even share (%.0f)", r.name, l.byReplica[r.name], even)
		}
	}
	f.checkProblems()
}

// waitStreams waits until the replica holding subscription sub counts at least n streams
// and Pull calls on it (its own clients' and those forwarded to it).
func (f *fleet) waitStreams(t testing.TB, sub string, n int, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	q := f.subQueue(t, sub)
	for {
		h := f.holder(t, q, time.Until(deadline))
		m, err := proctest.Scrape(h.addr("http"), "kubemq_proxy_gcp_subscription_consumers")
		if err != nil {
			t.Fatalf("%s: %v", h.name, err)
		}
		got := m["kubemq_proxy_gcp_subscription_consumers"]
		if got >= float64(n) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the holder %s counts %v streams on %s after %v, want %d", h.name, got, sub, d, n)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestPubSubFleetKill: a replica is killed (-9) mid-run and started again: nothing is lost.
func TestPubSubFleetKill(t *testing.T) {
	f := newFleet(t, faultReplicas(t))
	topic, sub := f.setupPubSub(t)
	l := newLedger()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, r := range f.replicas {
		receiveOn(ctx, t, &wg, r, sub, l)
	}
	n := messages(t)
	victim := f.replicas[0]
	var killed time.Time
	ids := f.publish(t, topic, n, func() {
		l.mark()
		killed = time.Now()
		victim.p.Kill()
		time.Sleep(time.Second)
		victim.start()
	})
	l.waitFor(t, n, 5*time.Minute)
	time.Sleep(15 * time.Second)
	cancel()
	wg.Wait()
	dups, afterAck, split := l.report(t, ids)
	t.Logf("FLEET pubsub kill -9: %d messages, %d duplicates (%d of acked messages: %s), longest pause in deliveries after the kill %v, all delivered %v after it, per replica:%s",
		n, dups, afterAck, l.ackedSpan(afterAck), l.gap().Round(time.Millisecond), l.lastAt().Sub(killed).Round(time.Millisecond), split)
	f.checkProblems()
}

// TestPubSubFleetStop: a replica is stopped (SIGTERM) mid-run: nothing is lost, and no acked
// message comes back.
func TestPubSubFleetStop(t *testing.T) {
	f := newFleet(t, faultReplicas(t))
	topic, sub := f.setupPubSub(t)
	l := newLedger()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	vctx, vcancel := context.WithCancel(ctx)
	var vwg sync.WaitGroup
	receiveOn(vctx, t, &vwg, f.replicas[0], sub, l)
	stopVictim := func() { vcancel(); vwg.Wait() }
	for _, r := range f.replicas[1:] {
		receiveOn(ctx, t, &wg, r, sub, l)
	}
	n := messages(t)
	victim := f.replicas[0]
	ids := f.publish(t, topic, n, func() {
		// A pod stops: its application's consumer first, then the sidecar.
		l.mark()
		stopVictim()
		if err := victim.p.Stop(30 * time.Second); err != nil {
			t.Errorf("%s: %v", victim.name, err)
		}
	})
	l.waitFor(t, n, 5*time.Minute)
	time.Sleep(15 * time.Second)
	cancel()
	wg.Wait()
	dups, afterAck, split := l.report(t, ids)
	t.Logf("FLEET pubsub SIGTERM: %d messages, %d duplicates (%d of acked messages), per replica:%s", n, dups, afterAck, split)
	if !f.excused(afterAck, "deliveries of acked messages") {
		t.Errorf("%d deliveries of acked messages after a graceful stop", afterAck)
	}
	f.checkProblems()
}
