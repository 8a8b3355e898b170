package gcp_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
)

func seekTo(ctx context.Context, e *env, sub string, t time.Time) error {
	_, err := e.v2().SubscriptionAdminClient.Seek(ctx, &pubsubpb.SeekRequest{
		Subscription: e.subName(sub), Target: &pubsubpb.SeekRequest_Time{Time: timestamppb.New(t)}})
	return err
}

// publishNamed publishes one message per name (data = name, attribute
// keep=y on those listed in keep) and waits for them.
func publishNamed(t *testing.T, ctx context.Context, c *pubsub.Client, topicID string, keep []string, names ...string) {
	t.Helper()
	p := c.Publisher(topicID)
	defer p.Stop()
	var rs []*pubsub.PublishResult
	for _, n := range names {
		m := &pubsub.Message{Data: []byte(n)}
		if slices.Contains(keep, n) {
			m.Attributes = map[string]string{"keep": "y"}
		}
		rs = append(rs, p.Publish(ctx, m))
	}
	for _, r := range rs {
		if _, err := r.Get(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// pullAll pulls and acks until want distinct messages (by data) arrived,
// then for quiet more, and returns what arrived, sorted and without
// repeats; it fails on anything outside want.
func pullAll(t *testing.T, ctx context.Context, sc pubsubpb.SubscriberClient, sub string, want []string, quiet time.Duration) {
	t.Helper()
	seen := map[string]bool{}
	deadline := time.Now().Add(30 * time.Second)
	var until time.Time
	for {
		if len(seen) == len(want) && until.IsZero() {
			until = time.Now().Add(quiet)
		}
		if !until.IsZero() && time.Now().After(until) || time.Now().After(deadline) {
			break
		}
		wait := time.Second
		if !until.IsZero() {
			wait = time.Until(until)
		}
		pctx, cancel := context.WithTimeout(ctx, wait)
		resp, err := sc.Pull(pctx, &pubsubpb.PullRequest{Subscription: sub, MaxMessages: 100})
		cancel()
		if err != nil {
			if ctx.Err() == nil && (errors.Is(pctx.Err(), context.DeadlineExceeded) || statusCode(err) == codes.DeadlineExceeded) {
				continue
			}
			t.Fatal(err)
		}
		var ids []string
		for _, m := range resp.ReceivedMessages {
			d := string(m.Message.Data)
			if !slices.Contains(want, d) {
				t.Fatalf("%s: got %q, want only %v", sub, d, want)
			}
			seen[d] = true
			ids = append(ids, m.AckId)
		}
		if len(ids) > 0 {
			if _, err := sc.Acknowledge(ctx, &pubsubpb.AcknowledgeRequest{Subscription: sub, AckIds: ids}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if len(seen) != len(want) {
		t.Fatalf("%s: got %v, want %v", sub, seen, want)
	}
}

// TestSeekToTime: seeking to now empties the subscription and makes its
// outstanding ack ids stale; seeking to a past time delivers again every
// message published since, acked or not, through the subscription's
// filter; a Receive running across a seek goes on with the replayed
// messages.
func TestSeekToTime(t *testing.T) {
	e := startEnv(t)
	ctx := ctxT(t, 2*time.Minute)
	tid, all, kept := e.id("t"), e.id("all"), e.id("kept")
	e.createTopic(ctx, tid)
	e.createSub(ctx, &pubsubpb.Subscription{Name: e.subName(all), Topic: e.topicName(tid), AckDeadlineSeconds: 10})
	e.createSub(ctx, &pubsubpb.Subscription{Name: e.subName(kept), Topic: e.topicName(tid), Filter: "attributes:keep"})
	c := e.v2()
	sc := rawSubscriber(t, e)
	t0 := time.Now()
	publishNamed(t, ctx, c, tid, []string{"m0"}, "m0", "m1")
	t1 := time.Now()
	publishNamed(t, ctx, c, tid, []string{"m2"}, "m2")

	// Out to a client, one acked: seek to now drops the rest too.
	var got []*pubsubpb.ReceivedMessage
	for len(got) < 3 {
		got = append(got, pull(t, ctx, sc, e.subName(all), 10)...)
	}
	if _, err := sc.Acknowledge(ctx, &pubsubpb.AcknowledgeRequest{Subscription: e.subName(all), AckIds: []string{got[0].AckId}}); err != nil {
		t.Fatal(err)
	}
	// And a backlog nobody pulled yet.
	publishNamed(t, ctx, c, tid, nil, "b0", "b1")
	if err := seekTo(ctx, e, all, time.Now()); err != nil {
		t.Fatal(err)
	}
	// The old ack ids are stale: a nack through them brings nothing back.
	if _, err := sc.ModifyAckDeadline(ctx, &pubsubpb.ModifyAckDeadlineRequest{Subscription: e.subName(all),
		AckIds: []string{got[1].AckId, got[2].AckId}, AckDeadlineSeconds: 0}); err != nil {
		t.Fatal(err)
	}
	publishNamed(t, ctx, c, tid, nil, "m3")
	pullAll(t, ctx, sc, e.subName(all), []string{"m3"}, 2*time.Second)

	// To the past: everything since, acked or not.
	if err := seekTo(ctx, e, all, t0); err != nil {
		t.Fatal(err)
	}
	pullAll(t, ctx, sc, e.subName(all), []string{"m0", "m1", "m2", "b0", "b1", "m3"}, time.Second)
	// The v1 client's API for the same RPC.
	if err := e.v1().Subscription(all).SeekToTime(ctx, t1); err != nil {
		t.Fatal(err)
	}
	pullAll(t, ctx, sc, e.subName(all), []string{"m2", "b0", "b1", "m3"}, time.Second)
	// A filter applies to the replay as to publishing.
	pullAll(t, ctx, sc, e.subName(kept), []string{"m0", "m2"}, 0)
	if err := seekTo(ctx, e, kept, t0); err != nil {
		t.Fatal(err)
	}
	pullAll(t, ctx, sc, e.subName(kept), []string{"m0", "m2"}, time.Second)

	// A Receive running across a seek: its stream ends with UNAVAILABLE,
	// the client opens another and gets the replayed messages.
	var mu sync.Mutex
	count := map[string]int{}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- c.Subscriber(all).Receive(rctx, func(_ context.Context, m *pubsub.Message) {
			mu.Lock()
			count[string(m.Data)]++
			mu.Unlock()
			m.Ack()
		})
	}()
	publishNamed(t, ctx, c, tid, nil, "m4")
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			mu.Lock()
			done := ok()
			mu.Unlock()
			if done {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("Receive: %s never happened: %v", what, count)
			}
		}
	}
	waitFor("m4 received", func() bool { return count["m4"] == 1 })
	if err := seekTo(ctx, e, all, t1); err != nil {
		t.Fatal(err)
	}
	waitFor("m2..m4 received again", func() bool {
		return count["m2"] >= 1 && count["b0"] >= 1 && count["b1"] >= 1 && count["m3"] >= 1 && count["m4"] >= 2
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if count["m0"] != 0 || count["m1"] != 0 {
		t.Fatalf("messages published before the seek time delivered: %v", count)
	}
}

// TestSeekOrdered: a seek of an ordered subscription replays each key from
// its first message, in order, without the recovery hold a restart needs
// (this process ended the key windows itself).
func TestSeekOrdered(t *testing.T) {
	e := startEnv(t)
	ctx := ctxT(t, 2*time.Minute)
	tid, sid := e.id("t"), e.id("s")
	e.createTopic(ctx, tid)
	e.createSub(ctx, &pubsubpb.Subscription{Name: e.subName(sid), Topic: e.topicName(tid), EnableMessageOrdering: true})
	c := e.v2()
	sc := rawSubscriber(t, e)
	t0 := time.Now()
	publishKeyed(t, ctx, c, tid, 0, 10)
	leaseFirst(t, ctx, sc, e.subName(sid))
	if err := seekTo(ctx, e, sid, t0); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	drainKeyInOrder(t, ctx, sc, e.subName(sid), 10, "seek")
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("the key took %v after the seek: held as after a restart", d)
	}
}

func TestSeekErrors(t *testing.T) {
	e := startEnv(t)
	ctx := ctxT(t, time.Minute)
	tid, sid := e.id("t"), e.id("s")
	e.createTopic(ctx, tid)
	e.createSub(ctx, &pubsubpb.Subscription{Name: e.subName(sid), Topic: e.topicName(tid)})
	sc := rawSubscriber(t, e)
	_, err := sc.Seek(ctx, &pubsubpb.SeekRequest{Subscription: e.subName("nope"), Target: &pubsubpb.SeekRequest_Time{Time: timestamppb.Now()}})
	wantCode(t, err, codes.NotFound, "")
	_, err = sc.Seek(ctx, &pubsubpb.SeekRequest{Subscription: e.subName(sid), Target: &pubsubpb.SeekRequest_Snapshot{Snapshot: "projects/" + e.project + "/snapshots/no-such"}})
	wantCode(t, err, codes.NotFound, "")
	_, err = sc.Seek(ctx, &pubsubpb.SeekRequest{Subscription: e.subName(sid)})
	wantCode(t, err, codes.InvalidArgument, "")
	_, err = sc.Seek(ctx, &pubsubpb.SeekRequest{Subscription: "bad", Target: &pubsubpb.SeekRequest_Time{Time: timestamppb.Now()}})
	wantCode(t, err, codes.InvalidArgument, "")
	if _, err := rawPublisher(t, e).DetachSubscription(ctx, &pubsubpb.DetachSubscriptionRequest{Subscription: e.subName(sid)}); err != nil {
		t.Fatal(err)
	}
	_, err = sc.Seek(ctx, &pubsubpb.SeekRequest{Subscription: e.subName(sid), Target: &pubsubpb.SeekRequest_Time{Time: timestamppb.Now()}})
	wantCode(t, err, codes.FailedPrecondition, "detached")
}

// TestSeekDropsWhatTheEngineHolds: a message the lease engine took from
// KubeMQ for a Pull that gave up waits in the engine for the next fetch; a
// seek to now drops it with the rest of the backlog.
func TestSeekDropsWhatTheEngineHolds(t *testing.T) {
	e := startEnv(t)
	ctx := ctxT(t, time.Minute)
	tid, sid := e.id("t"), e.id("s")
	e.createTopic(ctx, tid)
	e.createSub(ctx, &pubsubpb.Subscription{Name: e.subName(sid), Topic: e.topicName(tid)})
	c := e.v2()
	sc := rawSubscriber(t, e)
	// The engine's Get for this Pull waits up to a second on KubeMQ, also
	// after the Pull gave up.
	pctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	resp, err := sc.Pull(pctx, &pubsubpb.PullRequest{Subscription: e.subName(sid), MaxMessages: 1})
	cancel()
	if err == nil && len(resp.ReceivedMessages) > 0 {
		t.Fatal("Pull of an empty subscription returned a message")
	}
	publishNamed(t, ctx, c, tid, nil, "x")
	time.Sleep(500 * time.Millisecond) // the Get returns with x
	if err := seekTo(ctx, e, sid, time.Now()); err != nil {
		t.Fatal(err)
	}
	publishNamed(t, ctx, c, tid, nil, "y")
	pullAll(t, ctx, sc, e.subName(sid), []string{"y"}, 2*time.Second)
}

// TestSeekWhilePublishing: seeks race a steady publisher and a Receive.
// After a seek to now, every message whose Publish started after the Seek
// returned must arrive; after a seek to a past time, every message
// published since that time must arrive (again).
func TestSeekWhilePublishing(t *testing.T) {
	e := startEnv(t)
	ctx := ctxT(t, 2*time.Minute)
	tid, sid := e.id("t"), e.id("s")
	e.createTopic(ctx, tid)
	e.createSub(ctx, &pubsubpb.Subscription{Name: e.subName(sid), Topic: e.topicName(tid)})
	c := e.v2()

	type sent struct {
		at, done time.Time // when its Publish started and returned
		data     string
	}
	var mu sync.Mutex
	var published []sent
	got := map[string]time.Time{} // data -> last arrival
	rctx, stopRecv := context.WithCancel(ctx)
	recvDone := make(chan error, 1)
	go func() {
		recvDone <- c.Subscriber(sid).Receive(rctx, func(_ context.Context, m *pubsub.Message) {
			mu.Lock()
			got[string(m.Data)] = time.Now()
			mu.Unlock()
			m.Ack()
		})
	}()
	pctx, stopPub := context.WithCancel(ctx)
	pubDone := make(chan error, 1)
	go func() {
		p := c.Publisher(tid)
		defer p.Stop()
		for i := 0; pctx.Err() == nil; i++ {
			d := "p" + strconv.Itoa(i)
			at := time.Now()
			if _, err := p.Publish(pctx, &pubsub.Message{Data: []byte(d)}).Get(pctx); err != nil {
				if pctx.Err() == nil {
					pubDone <- err
				}
				break
			}
			mu.Lock()
			published = append(published, sent{at, time.Now(), d})
			mu.Unlock()
			time.Sleep(2 * time.Millisecond)
		}
		pubDone <- nil
	}()

	// Seeks to now and to the past alternate (each drops what a client has
	// not received yet). A message published at or after the final seek's
	// time (200 ms in the past) must arrive again once that seek began (the
	// replayed copies may reach the client before the Seek's answer does);
	// one published after the seek, at all.
	time.Sleep(300 * time.Millisecond)
	var target, begun, final time.Time
	for round := range 4 {
		begun = time.Now()
		target = begun
		if round%2 == 1 {
			target = target.Add(-200 * time.Millisecond)
		}
		if err := seekTo(ctx, e, sid, target); err != nil {
			t.Fatal(err)
		}
		final = time.Now()
		time.Sleep(400 * time.Millisecond)
	}
	stopPub()
	if err := <-pubDone; err != nil {
		t.Fatal(err)
	}
	last := time.Now()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		mu.Lock()
		var missing []string
		for _, s := range published {
			at, ok := got[s.data]
			switch {
			case !s.at.Before(target) && s.at.Before(final) && (!ok || at.Before(begun)):
				missing = append(missing, s.data) // not replayed by the final seek
			case !s.at.Before(final) && !ok:
				missing = append(missing, s.data)
			case s.done.Before(target) && ok && at.After(final):
				t.Fatalf("%s, published before the final seek's time, was delivered after that seek", s.data)
			}
		}
		mu.Unlock()
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			mu.Lock()
			var seen []string
			for _, d := range missing {
				if at, ok := got[d]; ok {
					seen = append(seen, d+"@"+at.Sub(begun).String())
				}
			}
			mu.Unlock()
			t.Fatalf("%d messages never arrived after the seek that should have delivered them (since %v; final seek ended %v after the target): %v; last arrivals relative to the seek's start: %v",
				len(missing), time.Since(last), final.Sub(target), missing, seen)
		}
	}
	stopRecv()
	if err := <-recvDone; err != nil {
		t.Fatal(err)
	}
}
