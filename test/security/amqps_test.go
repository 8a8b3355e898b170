package security

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/kubemq-io/kubemq-proxy/amqp091/wire"
)

// roundTrip publishes one confirmed message through conn and consumes it.
func roundTrip(t *testing.T, conn *amqp.Connection, queue, body string) {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if _, err := ch.QueueDeclare(queue, false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	conf, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, false, false, amqp.Publishing{Body: []byte(body)})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := conf.WaitContext(ctx); err != nil || !ok {
		t.Fatalf("publish not confirmed: ok=%v err=%v", ok, err)
	}
	msgs, err := ch.Consume(queue, "", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-msgs:
		if string(m.Body) != body {
			t.Fatalf("consumed %q, want %q", m.Body, body)
		}
	case <-ctx.Done():
		t.Fatal("message not delivered")
	}
}

func uniq(prefix string) string { return fmt.Sprintf("%s-%d", prefix, time.Now().UnixNano()) }

func amqpCode(err error) int {
	var ae *amqp.Error
	if errors.As(err, &ae) {
		return ae.Code
	}
	return 0
}

// TestAMQPS: the TLS listener serves AMQP with the configured certificate,
// which clients verify against the CA; the plain listener keeps working.
func TestAMQPS(t *testing.T) {
	serverCA := newCA(t, "server")
	srv := serverCA.issue(t, "localhost", true)
	p := startProxy(t, []string{"http", "amqp", "amqp-tls"}, "--amqp.cert_file", srv.certFile, "--amqp.key_file", srv.keyFile)
	p.waitReady(t)
	_, port, _ := net.SplitHostPort(p.addr("amqp-tls"))

	for _, host := range []string{"localhost", "127.0.0.1"} {
		conn, err := amqp.DialTLS("amqps://guest:guest@"+net.JoinHostPort(host, port)+"/", &tls.Config{RootCAs: serverCA.pool()})
		if err != nil {
			t.Fatalf("DialTLS %s: %v", host, err)
		}
		st := conn.ConnectionState()
		if !st.HandshakeComplete || len(st.PeerCertificates) == 0 || st.PeerCertificates[0].Subject.CommonName != "localhost" {
			t.Fatalf("TLS state: complete=%v peer=%v", st.HandshakeComplete, st.PeerCertificates)
		}
		roundTrip(t, conn, uniq("amqps"), "over tls via "+host)
		conn.Close()
	}

	// A client that trusts another CA refuses the server.
	other := newCA(t, "other")
	if _, err := amqp.DialTLS("amqps://guest:guest@127.0.0.1:"+port+"/", &tls.Config{RootCAs: other.pool()}); err == nil ||
		!strings.Contains(err.Error(), "certificate") {
		t.Fatalf("DialTLS with the wrong CA: %v, want a certificate error", err)
	}
	// Plain AMQP on the TLS port is not spoken.
	if c, err := amqp.Dial("amqp://guest:guest@127.0.0.1:" + port + "/"); err == nil {
		c.Close()
		t.Fatal("plain AMQP accepted on the TLS listener")
	}
	conn, err := amqp.Dial("amqp://guest:guest@" + p.addr("amqp") + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	roundTrip(t, conn, uniq("plain"), "plain still works")
}

// TestExternal: with amqp.client_ca_file a client certificate signed by
// that CA logs in with SASL EXTERNAL as the certificate's CN, which must be
// a configured user; without a certificate EXTERNAL is not offered.
func TestExternal(t *testing.T) {
	serverCA := newCA(t, "server")
	clientCA := newCA(t, "clients")
	srv := serverCA.issue(t, "localhost", true)
	cfg := writeConfig(t, "amqp:\n  users:\n    alice: alice-pw\n")
	p := startProxy(t, []string{"http", "amqp", "amqp-tls"}, "--config", cfg,
		"--amqp.cert_file", srv.certFile, "--amqp.key_file", srv.keyFile, "--amqp.client_ca_file", clientCA.file)
	p.waitReady(t)
	url := "amqps://" + p.addr("amqp-tls") + "/"
	tlsWith := func(certs ...tls.Certificate) *tls.Config {
		return &tls.Config{RootCAs: serverCA.pool(), ServerName: "localhost", Certificates: certs}
	}

	t.Run("certificate of a configured user", func(t *testing.T) {
		conn, err := amqp.DialTLS_ExternalAuth(url, tlsWith(clientCA.issue(t, "alice", false).tls))
		if err != nil {
			t.Fatalf("EXTERNAL login as alice: %v", err)
		}
		defer conn.Close()
		roundTrip(t, conn, uniq("external"), "logged in by certificate")
	})
	t.Run("certificate of an unknown user", func(t *testing.T) {
		// EXTERNAL is offered and chosen, then the login is refused
		// (amqp091-go reports a refused login as ErrCredentials, 403).
		_, err := amqp.DialTLS_ExternalAuth(url, tlsWith(clientCA.issue(t, "mallory", false).tls))
		if !errors.Is(err, amqp.ErrCredentials) {
			t.Fatalf("EXTERNAL as mallory: %v, want 403 login refused", err)
		}
	})
	t.Run("no certificate", func(t *testing.T) {
		// EXTERNAL is not offered, so the client gives up with 403.
		_, err := amqp.DialTLS_ExternalAuth(url, tlsWith())
		if !errors.Is(err, amqp.ErrSASL) || amqpCode(err) != amqp.AccessRefused {
			t.Fatalf("EXTERNAL without a certificate: %v, want 403 (no shared mechanism)", err)
		}
		// A client that insists gets RabbitMQ's answer.
		code, text := rawExternal(t, p.addr("amqp-tls"), tlsWith())
		if code != 503 || text != "COMMAND_INVALID - invalid authentication mechanism 'EXTERNAL'" {
			t.Fatalf("forced EXTERNAL without a certificate: %d %q", code, text)
		}
	})
	t.Run("certificate from another CA", func(t *testing.T) {
		// Sent even though the server asks for its own CAs: the TLS
		// handshake must fail.
		rogue := newCA(t, "rogue").issue(t, "alice", false).tls
		tc := tlsWith()
		tc.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &rogue, nil }
		if c, err := amqp.DialTLS_ExternalAuth(url, tc); err == nil {
			c.Close()
			t.Fatal("a certificate from an untrusted CA was accepted")
		}
		// Under TLS 1.3 the client learns of the refusal on its first
		// read, as an alert; amqp091-go may report it as a closed
		// connection, so check the alert on a raw connection.
		nc, err := tls.Dial("tcp", p.addr("amqp-tls"), tc)
		if err == nil {
			defer nc.Close()
			nc.SetDeadline(time.Now().Add(10 * time.Second))
			if _, err = nc.Write(wire.ProtocolHeader[:]); err == nil {
				_, err = nc.Read(make([]byte, 1))
			}
		}
		if err == nil || !strings.Contains(err.Error(), "certificate") {
			t.Fatalf("certificate from an untrusted CA: %v, want a TLS certificate alert", err)
		}
	})
	t.Run("password login still works over TLS", func(t *testing.T) {
		conn, err := amqp.DialTLS("amqps://alice:alice-pw@"+p.addr("amqp-tls")+"/", tlsWith(clientCA.issue(t, "bob", false).tls))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		roundTrip(t, conn, uniq("plain-over-tls"), "password over tls")
		if _, err := amqp.DialTLS("amqps://alice:wrong@"+p.addr("amqp-tls")+"/", tlsWith()); amqpCode(err) != amqp.AccessRefused {
			t.Fatalf("wrong password: %v, want 403", err)
		}
	})
	t.Run("plain listener never offers EXTERNAL", func(t *testing.T) {
		code, text := rawExternal(t, p.addr("amqp"), nil)
		if code != 503 || text != "COMMAND_INVALID - invalid authentication mechanism 'EXTERNAL'" {
			t.Fatalf("EXTERNAL on the plain listener: %d %q", code, text)
		}
	})
}

// rawExternal opens a connection (TLS when tc is set), reads
// connection.start, answers with mechanism EXTERNAL regardless of the
// offer, and returns the server's connection.close code and text.
func rawExternal(t *testing.T, addr string, tc *tls.Config) (int, string) {
	t.Helper()
	var nc net.Conn
	var err error
	if tc != nil {
		nc, err = tls.Dial("tcp", addr, tc)
	} else {
		nc, err = net.Dial("tcp", addr)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := nc.Write(wire.ProtocolHeader[:]); err != nil {
		t.Fatal(err)
	}
	fr := wire.NewFrameReader(bufio.NewReader(nc), 1<<20)
	fw := wire.NewFrameWriter(bufio.NewWriter(nc), 1<<20)
	read := func() wire.Method {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		m, err := wire.DecodeMethod(f.Payload)
		if err != nil {
			t.Fatalf("decode: %v", err)
		}
		return m
	}
	start, ok := read().(*wire.ConnectionStart)
	if !ok {
		t.Fatal("no connection.start")
	}
	if strings.Contains(start.Mechanisms, "EXTERNAL") {
		t.Fatalf("EXTERNAL offered without a client certificate: %q", start.Mechanisms)
	}
	caps := wire.Table{"authentication_failure_close": true}
	if err := fw.WriteMethod(0, &wire.ConnectionStartOk{ClientProperties: wire.Table{"capabilities": caps}, Mechanism: "EXTERNAL", Locale: "en_US"}); err != nil {
		t.Fatal(err)
	}
	if err := fw.Flush(); err != nil {
		t.Fatal(err)
	}
	cl, ok := read().(*wire.ConnectionClose)
	if !ok {
		t.Fatal("no connection.close")
	}
	return int(cl.ReplyCode), cl.ReplyText
}
