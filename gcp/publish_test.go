package gcp_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/kubemq-io/kubemq-proxy/gcp"
	"github.com/kubemq-io/kubemq-proxy/kubemqclient"
)

func (e *env) createTopic(ctx context.Context, id string) {
	e.t.Helper()
	if _, err := rawPublisher(e.t, e).CreateTopic(ctx, &pubsubpb.Topic{Name: e.topicName(id)}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) createSub(ctx context.Context, sub *pubsubpb.Subscription) {
	e.t.Helper()
	if _, err := rawSubscriber(e.t, e).CreateSubscription(ctx, sub); err != nil {
		e.t.Fatal(err)
	}
}

// logEvents reads n events of topic's log from the start, natively.
func (e *env) logEvents(ctx context.Context, topicID string, n int) []kubemqclient.EventReceive {
	e.t.Helper()
	sub, err := e.kc.SubscribeEventsStore(ctx, kubemqclient.SubscribeOptions{
		Channel: kubemqclient.Channel("gcp", topicID),
		Start:   kubemqclient.StartPosition{Mode: kubemqclient.StartFromFirst},
	})
	if err != nil {
		e.t.Fatal(err)
	}
	defer sub.Close()
	var out []kubemqclient.EventReceive
	for len(out) < n {
		ev, err := sub.Recv(ctx)
		if err != nil {
			e.t.Fatalf("after %d of %d events: %v", len(out), n, err)
		}
		out = append(out, ev)
	}
	return out
}

// waiting is how many messages wait in a subscription's queue.
func (e *env) waiting(ctx context.Context, subID string) int64 {
	e.t.Helper()
	q := kubemqclient.Channel("gcp.sub", subID)
	info, err := e.kc.QueuesInfo(ctx, q)
	if err != nil {
		e.t.Fatal(err)
	}
	qi, _ := info.Queue(q)
	return qi.Waiting
}

// TestPublishNativeInterop: a native KubeMQ reader of gcp.{topic} sees every
// message with its attributes and the reserved tags.
func TestPublishNativeInterop(t *testing.T) {
	e := startEnv(t)
	ctx := ctxT(t, 30*time.Second)
	tid := e.id("interop")
	e.createTopic(ctx, tid)
	c := e.v2()
	p := c.Publisher(tid)
	p.EnableMessageOrdering = true
	defer p.Stop()
	var ids []string
	for i := range 3 {
		r := p.Publish(ctx, &pubsub.Message{Data: []byte(fmt.Sprintf("m%d", i)), Attributes: map[string]string{"n": fmt.Sprint(i)}, OrderingKey: "k"})
		id, err := r.Get(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	evs := e.logEvents(ctx, tid, 3)
	for i, ev := range evs {
		if string(ev.Body) != fmt.Sprintf("m%d", i) || ev.Tags["n"] != fmt.Sprint(i) {
			t.Errorf("event %d: %q %v", i, ev.Body, ev.Tags)
		}
		if ev.Tags[gcp.TagMessageID] != ids[i] || ev.Tags[gcp.TagOrderingKey] != "k" {
			t.Errorf("event %d reserved tags %v, id %s", i, ev.Tags, ids[i])
		}
		pt, err := time.Parse(time.RFC3339Nano, ev.Tags[gcp.TagPublishTime])
		if err != nil || time.Since(pt) > time.Minute {
			t.Errorf("event %d publish time %q: %v", i, ev.Tags[gcp.TagPublishTime], err)
		}
	}
}

// TestPublishFanOut: one copy per attached subscription whose filter
// matches; detached subscriptions and filtered-out messages get none.
func TestPublishFanOut(t *testing.T) {
	e := startEnv(t)
	ctx := ctxT(t, 30*time.Second)
	tid := e.id("fan")
	e.createTopic(ctx, tid)
	all, red, gone := e.id("all"), e.id("red"), e.id("gone")
	e.createSub(ctx, &pubsubpb.Subscription{Name: e.subName(all), Topic: e.topicName(tid)})
	e.createSub(ctx, &pubsubpb.Subscription{Name: e.subName(red), Topic: e.topicName(tid), Filter: `attributes.color = "red"`})
	e.createSub(ctx, &pubsubpb.Subscription{Name: e.subName(gone), Topic: e.topicName(tid)})
	if _, err := rawPublisher(t, e).DetachSubscription(ctx, &pubsubpb.DetachSubscriptionRequest{Subscription: e.subName(gone)}); err != nil {
		t.Fatal(err)
	}
	var msgs []*pubsubpb.PubsubMessage
	for i := range 10 {
		color := "blue"
		if i%3 == 0 {
			color = "red"
		}
		msgs = append(msgs, &pubsubpb.PubsubMessage{Data: []byte("x"), Attributes: map[string]string{"color": color}})
	}
	resp, err := rawPublisher(t, e).Publish(ctx, &pubsubpb.PublishRequest{Topic: e.topicName(tid), Messages: msgs})
	if err != nil || len(resp.MessageIds) != 10 {
		t.Fatalf("publish: %v %v", resp, err)
	}
	if got := e.waiting(ctx, all); got != 10 {
		t.Errorf("all: %d waiting", got)
	}
	if got := e.waiting(ctx, red); got != 4 {
		t.Errorf("red: %d waiting, want 4", got)
	}
	if got := e.waiting(ctx, gone); got != 0 {
		t.Errorf("detached: %d waiting", got)
	}
}

// TestPublishErrors: every validation failure rejects the whole request
// and stores nothing, in the log or in any subscription.
func TestPublishErrors(t *testing.T) {
	e := startEnv(t)
	ctx := ctxT(t, 60*time.Second)
	tid, sid := e.id("errs"), e.id("errs-sub")
	e.createTopic(ctx, tid)
	e.createSub(ctx, &pubsubpb.Subscription{Name: e.subName(sid), Topic: e.topicName(tid)})
	pc := rawPublisher(t, e)
	good := func() *pubsubpb.PubsubMessage { return &pubsubpb.PubsubMessage{Data: []byte("ok")} }
	many := make([]*pubsubpb.PubsubMessage, 1001)
	for i := range many {
		many[i] = good()
	}
	attrs := map[string]string{}
	for i := range 101 {
		attrs[fmt.Sprint("k", i)] = "v"
	}
	cases := []struct {
		name  string
		topic string
		msgs  []*pubsubpb.PubsubMessage
		code  codes.Code
	}{
		{"missing topic", e.topicName(e.id("nope")), []*pubsubpb.PubsubMessage{good()}, codes.NotFound},
		{"bad topic name", "projects/p/topics/x", []*pubsubpb.PubsubMessage{good()}, codes.InvalidArgument},
		{"empty batch", e.topicName(tid), nil, codes.InvalidArgument},
		{"1001 messages", e.topicName(tid), many, codes.InvalidArgument},
		{"empty message", e.topicName(tid), []*pubsubpb.PubsubMessage{good(), {}}, codes.InvalidArgument},
		{"too big", e.topicName(tid), []*pubsubpb.PubsubMessage{good(), {Data: make([]byte, 10<<20+1)}}, codes.InvalidArgument},
		{"101 attributes", e.topicName(tid), []*pubsubpb.PubsubMessage{good(), {Data: []byte("x"), Attributes: attrs}}, codes.InvalidArgument},
		{"goog attribute", e.topicName(tid), []*pubsubpb.PubsubMessage{good(), {Data: []byte("x"), Attributes: map[string]string{"googx": "1"}}}, codes.InvalidArgument},
		{"long attribute key", e.topicName(tid), []*pubsubpb.PubsubMessage{{Data: []byte("x"), Attributes: map[string]string{strings.Repeat("k", 257): "1"}}}, codes.InvalidArgument},
		{"long attribute value", e.topicName(tid), []*pubsubpb.PubsubMessage{{Data: []byte("x"), Attributes: map[string]string{"k": strings.Repeat("v", 1025)}}}, codes.InvalidArgument},
		{"long ordering key", e.topicName(tid), []*pubsubpb.PubsubMessage{{Data: []byte("x"), OrderingKey: strings.Repeat("o", 1025)}}, codes.InvalidArgument},
		{"reserved attribute", e.topicName(tid), []*pubsubpb.PubsubMessage{good(), {Data: []byte("x"), Attributes: map[string]string{gcp.TagMessageID: "1"}}}, codes.InvalidArgument},
		{"mixed ordering keys", e.topicName(tid), []*pubsubpb.PubsubMessage{{Data: []byte("x"), OrderingKey: "a"}, {Data: []byte("y"), OrderingKey: "b"}}, codes.FailedPrecondition},
	}
	// Beyond the request limit plus the transport's headroom, gRPC refuses
	// the request from its length prefix, before reading (and buffering)
	// its body.
	huge := []*pubsubpb.PubsubMessage{{Data: make([]byte, 6<<20)}, {Data: make([]byte, 6<<20)}}
	cases = append(cases, struct {
		name  string
		topic string
		msgs  []*pubsubpb.PubsubMessage
		code  codes.Code
	}{"request over the transport bound", e.topicName(tid), huge, codes.ResourceExhausted})
	for _, tc := range cases {
		_, err := pc.Publish(ctx, &pubsubpb.PublishRequest{Topic: tc.topic, Messages: tc.msgs})
		if statusCode(err) != tc.code {
			t.Errorf("%s: got %v, want %v", tc.name, err, tc.code)
		}
	}
	// Nothing of the above was stored: the first event in the log and the
	// only message in the queue are the marker published now.
	if _, err := pc.Publish(ctx, &pubsubpb.PublishRequest{Topic: e.topicName(tid), Messages: []*pubsubpb.PubsubMessage{{Data: []byte("marker")}}}); err != nil {
		t.Fatal(err)
	}
	if ev := e.logEvents(ctx, tid, 1)[0]; string(ev.Body) != "marker" {
		t.Fatalf("first logged event %q: a rejected batch was stored", ev.Body)
	}
	if got := e.waiting(ctx, sid); got != 1 {
		t.Fatalf("queue holds %d messages, want only the marker", got)
	}
}

// TestNativeQueueToSubscriber: a native KubeMQ producer that writes to a
// subscription's queue (gcp.sub.{sub}) reaches its Pub/Sub subscribers:
// body as data, tags as attributes, the KubeMQ message id as message id and
// the store time as publish time, both kept when the message is nacked and
// delivered again.
func TestNativeQueueToSubscriber(t *testing.T) {
	e := startEnv(t)
	ctx := ctxT(t, 60*time.Second)
	tid, sid := e.id("native-t"), e.id("native-s")
	e.createTopic(ctx, tid)
	e.createSub(ctx, &pubsubpb.Subscription{Name: e.subName(sid), Topic: e.topicName(tid)})
	before := time.Now().Add(-time.Second)
	res, err := e.kc.SendQueueMessages(ctx, []kubemqclient.QueueMessage{
		{Channel: kubemqclient.Channel("gcp.sub", sid), Body: []byte("native-0"), Tags: map[string]string{"color": "red"}},
		{MessageID: "native-id-1", Channel: kubemqclient.Channel("gcp.sub", sid), Body: []byte("native-1")},
	})
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]string{"native-0": res[0].MessageID, "native-1": "native-id-1"}
	type seen struct {
		id  string
		pub time.Time
		n   int
	}
	got := map[string]*seen{}
	rctx, cancel := context.WithCancel(ctx)
	var mu sync.Mutex
	err = e.v2().Subscriber(sid).Receive(rctx, func(_ context.Context, m *pubsub.Message) {
		mu.Lock()
		defer mu.Unlock()
		s := got[string(m.Data)]
		if s == nil {
			s = &seen{id: m.ID, pub: m.PublishTime}
			got[string(m.Data)] = s
			if string(m.Data) == "native-0" && m.Attributes["color"] != "red" {
				t.Errorf("attributes %v, want the tags", m.Attributes)
			}
			if len(m.Attributes) > 1 {
				t.Errorf("%s: attributes %v carry more than the native tags", m.Data, m.Attributes)
			}
		} else if m.ID != s.id || !m.PublishTime.Equal(s.pub) {
			t.Errorf("%s redelivered as id %s published %v, first %s %v", m.Data, m.ID, m.PublishTime, s.id, s.pub)
		}
		s.n++
		if s.n == 1 {
			m.Nack()
			return
		}
		m.Ack()
		if len(got) == 2 && got["native-0"].n >= 2 && got["native-1"].n >= 2 {
			cancel()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	for body, want := range ids {
		s := got[body]
		if s == nil || s.n < 2 {
			t.Fatalf("%s: %+v, want a delivery and a redelivery", body, s)
		}
		if s.id != want {
			t.Errorf("%s: message id %q, want KubeMQ's %q", body, s.id, want)
		}
		if s.pub.Before(before) || s.pub.After(time.Now()) {
			t.Errorf("%s: publish time %v, want the store time", body, s.pub)
		}
	}
}
