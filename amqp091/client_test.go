package amqp091

import (
	"fmt"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

func TestPublishConsumeAck(t *testing.T) {
	e := newEnv(t)
	c := e.dial()
	ch := e.channel(c)
	q, err := ch.QueueDeclare("", false, false, true, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(q.Name) != len("amq.gen-")+22 {
		t.Fatalf("server-named queue %q", q.Name)
	}
	for i := range 3 {
		err := ch.Publish("", q.Name, false, false, amqp.Publishing{ContentType: "text/plain", Body: []byte(fmt.Sprint("m", i)),
			Headers: amqp.Table{"n": int32(i)}, DeliveryMode: amqp.Persistent, MessageId: fmt.Sprint("id", i)})
		if err != nil {
			t.Fatal(err)
		}
	}
	msgs, err := ch.Consume(q.Name, "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		d := mustRecv(t, msgs, "delivery")
		if string(d.Body) != fmt.Sprint("m", i) || d.ContentType != "text/plain" || d.Headers["n"] != int32(i) ||
			d.DeliveryMode != amqp.Persistent || d.MessageId != fmt.Sprint("id", i) || d.Redelivered ||
			d.Exchange != "" || d.RoutingKey != q.Name {
			t.Fatalf("delivery %d: %+v", i, d)
		}
		if err := d.Ack(false); err != nil {
			t.Fatal(err)
		}
	}
	if err := ch.Close(); err != nil {
		t.Fatal(err)
	}
}
