package amqp091

import (
	"encoding/json"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

// TestState: the /state view lists open connections with their channels
// and consumers, and each vhost's queues with their consumers.
func TestState(t *testing.T) {
	e := newEnv(t)
	c, err := amqp.DialConfig(e.url(), amqp.Config{Properties: amqp.Table{"connection_name": "state-test"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ch := e.channel(c)
	e.channel(c) // a second, idle channel
	if _, err := ch.QueueDeclare("state-q", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.Consume("state-q", "", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	st := e.srv.State().(State)
	raw, _ := json.Marshal(st)
	t.Logf("%s", raw)
	var cs *ConnState
	for i := range st.Connections {
		if st.Connections[i].Client == "state-test" {
			cs = &st.Connections[i]
		}
	}
	if cs == nil || cs.Channels != 2 || cs.Consumers != 1 || cs.Vhost != e.vhost || cs.User != "guest" || cs.ID == 0 {
		t.Fatalf("connection state %+v in %s", cs, raw)
	}
	var qs *QueueState
	for _, v := range st.Vhosts {
		if v.Name != e.vhost {
			continue
		}
		if v.Exchanges == 0 {
			t.Fatalf("vhost %s lists no exchanges (amq.* are predeclared)", v.Name)
		}
		for i := range v.Queues {
			if v.Queues[i].Name == "state-q" {
				qs = &v.Queues[i]
			}
		}
	}
	if qs == nil || !qs.Durable || qs.Consumers != 1 || qs.Channel == "" {
		t.Fatalf("queue state %+v in %s", qs, raw)
	}
	c.Close()
	// The server forgets the connection once its reader has wound down.
	eventually(t, "closed connection unlisted", func() bool {
		for _, cs := range e.srv.State().(State).Connections {
			if cs.Client == "state-test" {
				return false
			}
		}
		return true
	})
}
