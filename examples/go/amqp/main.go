// Command amqp publishes one message through kubemq-proxy with the
// RabbitMQ Go client (amqp091-go) and consumes it.
//
//	AMQP_URL=amqp://guest:guest@localhost:5672/ go run ./examples/go/amqp
package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

func main() {
	url := os.Getenv("AMQP_URL")
	if url == "" {
		url = "amqp://guest:guest@localhost:5672/"
	}
	conn, err := amqp.Dial(url)
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		log.Fatal(err)
	}
	// A server-named exclusive queue: it goes away with the connection.
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		log.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conf, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", q.Name, false, false,
		amqp.Publishing{ContentType: "text/plain", Body: []byte("hello from Go AMQP")})
	if err != nil {
		log.Fatal(err)
	}
	if ok, err := conf.WaitContext(ctx); err != nil || !ok {
		log.Fatalf("publish not confirmed (ok=%v, err=%v)", ok, err)
	}
	fmt.Println("published to", q.Name)

	msgs, err := ch.ConsumeWithContext(ctx, q.Name, "", false, false, false, false, nil)
	if err != nil {
		log.Fatal(err)
	}
	select {
	case m := <-msgs:
		fmt.Printf("received %s\n", m.Body)
		if err := m.Ack(false); err != nil {
			log.Fatal(err)
		}
	case <-ctx.Done():
		log.Fatal("no message received within a minute")
	}
}
