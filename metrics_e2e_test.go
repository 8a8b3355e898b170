package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	amqp "github.com/rabbitmq/amqp091-go"
)

// TestBacklogOverHTTP: the binary's /metrics (scraped as Prometheus does), /state and the
// management API on amqp.management_listen report the backlog left by real clients: an AMQP
// queue with 5 published and 2 held unacked (amqp091-go), a Pub/Sub subscription with 4
// published (the Go client).
func TestBacklogOverHTTP(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	p := startProxy(t, t.TempDir(), uniqueName("kubemq-proxy-e2e"))
	queue := uniqueName("e2e-backlog")
	conn, err := amqp.Dial("amqp://guest:guest@" + p.Addr("amqp") + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(queue, false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		dc, err := ch.PublishWithDeferredConfirm("", queue, false, false, amqp.Publishing{Body: []byte(fmt.Sprint(i))})
		if err != nil || !dc.Wait() {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	for range 2 {
		if _, ok, err := ch.Get(queue, false); err != nil || !ok {
			t.Fatalf("get: %v %v", ok, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const project = "backlog"
	tid, sid := uniqueName("bt"), uniqueName("bs")
	c := pubsubClient(t, p.Addr("gcp"), project)
	if _, err := c.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: "projects/" + project + "/topics/" + tid}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{Name: "projects/" + project + "/subscriptions/" + sid,
		Topic: "projects/" + project + "/topics/" + tid}); err != nil {
		t.Fatal(err)
	}
	pub := c.Publisher(tid)
	for i := range 4 {
		if _, err := pub.Publish(ctx, &pubsub.Message{Data: []byte(fmt.Sprint(i))}).Get(ctx); err != nil {
			t.Fatal(err)
		}
	}
	pub.Stop()

	httpGet := func(url, user string) (int, string) {
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		if user != "" {
			req.SetBasicAuth(user, user)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	want := []string{
		fmt.Sprintf(`kubemq_proxy_amqp_queue_messages_ready{queue=%q,vhost="/"} 3`, queue),
		fmt.Sprintf(`kubemq_proxy_amqp_queue_messages_unacked{queue=%q,vhost="/"} 2`, queue),
		fmt.Sprintf(`kubemq_proxy_gcp_subscription_num_undelivered_messages{subscription=%q} 4`, sid),
		fmt.Sprintf(`kubemq_proxy_gcp_subscription_messages_ready{subscription=%q} 4`, sid),
		"kubemq_proxy_amqp_publish_latency_seconds_count 5",
		"kubemq_proxy_amqp_delivery_latency_seconds_count 2",
		"kubemq_proxy_gcp_publish_latency_seconds_count 4",
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, body := httpGet("http://"+p.Addr("http")+"/metrics", "")
		var missing []string
		for _, w := range want {
			if !strings.Contains(body, w+"\n") {
				missing = append(missing, w)
			}
		}
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/metrics lacks:\n%s", strings.Join(missing, "\n"))
		}
		time.Sleep(300 * time.Millisecond)
	}

	code, body := httpGet("http://"+p.Addr("amqp-management")+"/api/queues/%2F/"+queue, "guest")
	var q struct {
		Messages int `json:"messages"`
		Ready    int `json:"messages_ready"`
		Unacked  int `json:"messages_unacknowledged"`
	}
	if err := json.Unmarshal([]byte(body), &q); err != nil || code != 200 || q.Messages != 5 || q.Ready != 3 || q.Unacked != 2 {
		t.Fatalf("management API: %d %s", code, body)
	}

	_, body = httpGet("http://"+p.Addr("http")+"/state", "")
	for _, w := range []string{`"messages_ready": 3`, `"messages_unacknowledged": 2`, `"messages_ready": 4`} {
		if !strings.Contains(body, w) {
			t.Errorf("/state lacks %s:\n%s", w, body)
		}
	}
	conn.Close()
	terminate(t, p)
}
