package amqp091

import (
	"net"
	"net/url"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/kubemq-io/kubemq-proxy/internal/testenv"
)

// serveOn makes the env's server also listen on ip (a non-loopback address, so that the peer
// address the server sees is not loopback) and returns that listener's address.
func serveOn(t *testing.T, e *env, ip string) string {
	t.Helper()
	lis, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Skip(err)
	}
	go e.srv.Serve(lis)
	return lis.Addr().String()
}

// With no users configured, any credentials are accepted from loopback peers only, as
// RabbitMQ accepts its default guest user only from loopback; OpenLoginsFromAnywhere lifts
// the rule, and configured users are checked from any address.
func TestOpenLoginsLoopbackOnly(t *testing.T) {
	ip := testenv.NonLoopbackIP(t)
	dial := func(e *env, addr, user, pass string) error {
		c, err := amqp.Dial("amqp://" + user + ":" + pass + "@" + addr + "/" + url.PathEscape(e.vhost))
		if err == nil {
			c.Close()
		}
		return err
	}

	e := newEnv(t)
	remote := serveOn(t, e, ip)
	if err := dial(e, e.addr, "anyone", "anything"); err != nil {
		t.Fatalf("loopback peer, no users: %v", err)
	}
	err := dial(e, remote, "guest", "guest")
	if err == nil || !strings.Contains(err.Error(), "403") {
		t.Fatalf("non-loopback peer, no users: %v; want 403 ACCESS_REFUSED", err)
	}

	open := newEnv(t, func(o *Options) { o.OpenLoginsFromAnywhere = true })
	if err := dial(open, serveOn(t, open, ip), "anyone", "anything"); err != nil {
		t.Fatalf("non-loopback peer, open logins from anywhere: %v", err)
	}

	users := newEnv(t, func(o *Options) { o.Users = map[string]string{"alice": "pw"} })
	r := serveOn(t, users, ip)
	if err := dial(users, r, "alice", "pw"); err != nil {
		t.Fatalf("non-loopback peer, configured user: %v", err)
	}
	if err := dial(users, r, "alice", "wrong"); err == nil || !strings.Contains(err.Error(), "403") {
		t.Fatalf("non-loopback peer, wrong password: %v", err)
	}
}

func TestLoopbackPeer(t *testing.T) {
	for addr, want := range map[string]bool{"127.0.0.1:5672": true, "127.3.2.1:1": true, "[::1]:5672": true,
		"10.0.0.5:5672": false, "[2001:db8::1]:5672": false, "bogus": false} {
		a, _ := net.ResolveTCPAddr("tcp", addr)
		var na net.Addr
		if a != nil {
			na = a
		}
		if got := loopbackPeer(na); got != want {
			t.Errorf("loopbackPeer(%s) = %v, want %v", addr, got, want)
		}
	}
}
