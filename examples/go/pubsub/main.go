// Command pubsub publishes one message through kubemq-proxy with the Google
// Cloud Pub/Sub Go client (v2) and receives it.
//
//	PUBSUB_EMULATOR_HOST=localhost:8085 go run ./examples/go/pubsub
//
// The client sees PUBSUB_EMULATOR_HOST and talks plaintext without
// credentials, exactly as with Google's emulator.
package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
)

func main() {
	if os.Getenv("PUBSUB_EMULATOR_HOST") == "" {
		log.Fatal("set PUBSUB_EMULATOR_HOST to the proxy's Pub/Sub address, e.g. localhost:8085")
	}
	project := envOr("PUBSUB_PROJECT_ID", "example-project")
	suffix := fmt.Sprint(time.Now().UnixNano()) // fresh names on every run
	topicID, subID := "example-topic-"+suffix, "example-sub-"+suffix

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client, err := pubsub.NewClient(ctx, project)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	topic, err := client.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: "projects/" + project + "/topics/" + topicID})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := client.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{
		Name: "projects/" + project + "/subscriptions/" + subID, Topic: topic.Name,
	}); err != nil {
		log.Fatal(err)
	}

	pub := client.Publisher(topicID)
	id, err := pub.Publish(ctx, &pubsub.Message{Data: []byte("hello from Go Pub/Sub")}).Get(ctx)
	if err != nil {
		log.Fatal(err)
	}
	pub.Stop()
	fmt.Println("published", id)

	rctx, stop := context.WithCancel(ctx)
	err = client.Subscriber(subID).Receive(rctx, func(_ context.Context, m *pubsub.Message) {
		fmt.Printf("received %s\n", m.Data)
		m.Ack()
		stop()
	})
	if err != nil {
		log.Fatal(err)
	}
	if ctx.Err() != nil {
		log.Fatal("no message received within a minute")
	}
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
