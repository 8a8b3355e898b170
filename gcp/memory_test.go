package gcp_test

import (
	"bytes"
	"context"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc/codes"

	"github.com/kubemq-io/kubemq-proxy/embedded"
	"github.com/kubemq-io/kubemq-proxy/internal/kubemqtest"
)

// An embedded backend at its memory bound (embedded.max_memory) refuses a publish with
// RESOURCE_EXHAUSTED and a clear message, not a crash or INTERNAL; once subscribers have
// acknowledged messages, publishing goes on.
func TestPublishAtMemoryLimit(t *testing.T) {
	if kubemqtest.External() {
		t.Skip("max_memory is a limit of the embedded server")
	}
	e := startEnv(t, withEmbedded(embedded.Options{Strict: true, MaxMemory: 256 << 10}))
	ctx := ctxT(t, 60*time.Second)
	tid, sid := e.id("mem"), e.id("mem-sub")
	e.createTopic(ctx, tid)
	e.createSub(ctx, &pubsubpb.Subscription{Name: e.subName(sid), Topic: e.topicName(tid)})
	data := bytes.Repeat([]byte("m"), 8<<10)
	raw := rawPublisher(t, e)
	published := 0
	var refusal error
	for range 100 {
		_, err := raw.Publish(ctx, &pubsubpb.PublishRequest{Topic: e.topicName(tid), Messages: []*pubsubpb.PubsubMessage{{Data: data}}})
		if err != nil {
			refusal = err
			break
		}
		published++
	}
	if published == 0 || published > 32 {
		t.Fatalf("%d publishes of 8 KiB under a 256 KiB bound", published)
	}
	wantCode(t, refusal, codes.ResourceExhausted, "memory limit reached")

	// The current client library sees the refusal too (it retries it until its deadline).
	c := e.v2()
	pub := c.Publisher(e.topicName(tid))
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	_, err := pub.Publish(pctx, &pubsub.Message{Data: data}).Get(pctx)
	cancel()
	if err == nil {
		t.Fatal("client publish accepted at the memory bound")
	}

	// Receiving and acknowledging frees the subscription's copies (and, once they come back
	// after the record delay, the lease records that held them): publishing resumes.
	var got atomic.Int32
	rctx, rcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- c.Subscriber(e.subName(sid)).Receive(rctx, func(_ context.Context, m *pubsub.Message) {
			m.Ack()
			got.Add(1)
		})
	}()
	defer func() {
		rcancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	deadline := time.Now().Add(40 * time.Second)
	for {
		_, err := raw.Publish(ctx, &pubsubpb.PublishRequest{Topic: e.topicName(tid), Messages: []*pubsubpb.PubsubMessage{{Data: data}}})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("publish still refused after %d messages were acknowledged: %v", got.Load(), err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if int(got.Load()) < published {
		t.Fatalf("publishing resumed after only %d of %d messages were received", got.Load(), published)
	}
}
