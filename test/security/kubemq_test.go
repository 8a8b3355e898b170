package security

import (
	"bytes"
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/kubemq-io/kubemq-proxy/embedded"
)

// countingListener counts accepted connections.
type countingListener struct {
	net.Listener
	n atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// startKubeMQ runs an embedded KubeMQ-compatible server on 127.0.0.1:0.
func startKubeMQ(t *testing.T, opts embedded.Options) (string, *countingListener) {
	t.Helper()
	opts.Strict = true
	opts.Logger = zaptest.NewLogger(t)
	srv, err := embedded.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cl := &countingListener{Listener: lis}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(cl) }()
	t.Cleanup(func() {
		srv.Close()
		<-done
	})
	return lis.Addr().String(), cl
}

// TestKubeMQTLS: the proxy reaches a KubeMQ that serves TLS when given
// kubemq.tls and the CA; with the wrong CA it stays not ready.
func TestKubeMQTLS(t *testing.T) {
	kubemqCA := newCA(t, "kubemq")
	cert := kubemqCA.issue(t, "localhost", true)
	addr, lis := startKubeMQ(t, embedded.Options{TLS: &tls.Config{Certificates: []tls.Certificate{cert.tls}, MinVersion: tls.VersionTLS12}})

	t.Run("right CA", func(t *testing.T) {
		p := startProxy(t, []string{"http", "amqp"}, "--kubemq.address", addr, "--kubemq.tls", "--kubemq.ca_file", kubemqCA.file,
			"--kubemq.server_name", "localhost", "--registry.channel", uniq("registry-tls"))
		p.waitReady(t)
		conn, err := amqp.Dial("amqp://guest:guest@" + p.addr("amqp") + "/")
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		roundTrip(t, conn, uniq("via-tls-backend"), "stored over TLS")
	})
	t.Run("wrong CA", func(t *testing.T) {
		other := newCA(t, "other")
		before := lis.n.Load()
		p := startProxy(t, []string{"http", "amqp"}, "--kubemq.address", addr, "--kubemq.tls", "--kubemq.ca_file", other.file,
			"--kubemq.server_name", "localhost", "--registry.channel", uniq("registry-tls"))
		// The proxy has tried (and failed) the TLS handshake several
		// times and never became ready.
		stayUnready(t, p, lis, before, 3, "with the wrong CA")
		if code := p.readyz(); code != http.StatusServiceUnavailable {
			t.Fatalf("/readyz = %d with the wrong CA, want 503", code)
		}
		// The connection opens and its first method is refused with 320 (amqp091/README.md:
		// the one point at which every client reports CONNECTION_FORCED).
		conn, err := amqp.Dial("amqp://guest:guest@" + p.addr("amqp") + "/")
		if err == nil {
			_, err = conn.Channel()
			conn.Close()
		}
		if err == nil || !strings.Contains(err.Error(), "320") {
			t.Fatalf("AMQP while KubeMQ is unreachable: %v; want 320 CONNECTION_FORCED", err)
		}
	})
	t.Run("plaintext client against the TLS server", func(t *testing.T) {
		before := lis.n.Load()
		p := startProxy(t, []string{"http"}, "--kubemq.address", addr, "--registry.channel", uniq("registry-tls"))
		stayUnready(t, p, lis, before, 2, "without kubemq.tls")
	})
}

// stayUnready waits until the backend's listener has seen n more
// connections than before (at most 30 s), checking all along that the
// proxy's /readyz says 503.
func stayUnready(t *testing.T, p *proc, lis *countingListener, before, n int64, why string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for lis.n.Load()-before < n {
		if code := p.readyz(); code != http.StatusServiceUnavailable {
			t.Fatalf("/readyz = %d %s, want 503", code, why)
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d connection attempts in 30s", lis.n.Load()-before, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// call is one KubeMQ call seen by the server.
type call struct {
	method string
	token  string
	batch  []stored // SendQueueMessagesBatch: channel and body of each message
}

type stored struct {
	channel string
	body    []byte
}

// callLog records the authorization metadata of every KubeMQ call.
type callLog struct {
	mu    sync.Mutex
	calls []call
}

func (l *callLog) options() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			l.add(ctx, info.FullMethod, req)
			return h(ctx, req)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			l.add(ss.Context(), info.FullMethod, nil)
			return h(srv, ss)
		}),
	}
}

func (l *callLog) add(ctx context.Context, method string, req any) {
	md, _ := metadata.FromIncomingContext(ctx)
	c := call{method: method[strings.LastIndex(method, "/")+1:], token: strings.Join(md.Get("authorization"), ",")}
	if m, ok := req.(proto.Message); ok && c.method == "SendQueueMessagesBatch" {
		// Read through reflection: only kubemqclient and embedded import
		// the KubeMQ wire types.
		r := m.ProtoReflect()
		msgs := r.Get(r.Descriptor().Fields().ByName("Messages")).List()
		for i := 0; i < msgs.Len(); i++ {
			qm := msgs.Get(i).Message()
			f := func(name protoreflect.Name) protoreflect.Value { return qm.Get(qm.Descriptor().Fields().ByName(name)) }
			c.batch = append(c.batch, stored{channel: f("Channel").String(), body: f("Body").Bytes()})
		}
	}
	l.mu.Lock()
	l.calls = append(l.calls, c)
	l.mu.Unlock()
}

func (l *callLog) snapshot() []call {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]call(nil), l.calls...)
}

// TestAuthTokenFromConfig: kubemq.auth_token is the authorization
// metadata of every call the proxy makes.
func TestAuthTokenFromConfig(t *testing.T) {
	log := &callLog{}
	addr, _ := startKubeMQ(t, embedded.Options{ServerOptions: log.options()})
	p := startProxy(t, []string{"http", "amqp"}, "--kubemq.address", addr, "--kubemq.auth_token", "proxy-secret",
		"--registry.channel", uniq("registry-token"))
	p.waitReady(t)
	conn, err := amqp.Dial("amqp://guest:guest@" + p.addr("amqp") + "/")
	if err != nil {
		t.Fatal(err)
	}
	roundTrip(t, conn, uniq("token"), "with the configured token")
	conn.Close()
	methods := map[string]bool{}
	for _, c := range log.snapshot() {
		methods[c.method] = true
		if c.token != "proxy-secret" {
			t.Errorf("%s carried authorization %q, want proxy-secret", c.method, c.token)
		}
	}
	for _, m := range []string{"Ping", "SendQueueMessagesBatch", "SubscribeToEvents"} {
		if !methods[m] {
			t.Errorf("no %s call seen (saw %v)", m, methods)
		}
	}
}

// TestPasswordAsToken: with amqp.password_as_kubemq_token each
// connection's publishes carry its own password as the KubeMQ token, even
// when connections publish to the same queue at once; the proxy's own
// calls keep kubemq.auth_token.
func TestPasswordAsToken(t *testing.T) {
	log := &callLog{}
	addr, _ := startKubeMQ(t, embedded.Options{ServerOptions: log.options()})
	p := startProxy(t, []string{"http", "amqp"}, "--kubemq.address", addr, "--kubemq.auth_token", "proxy-secret",
		"--amqp.password_as_kubemq_token", "--registry.channel", uniq("registry-pass"))
	p.waitReady(t)
	shared := uniq("shared")
	const n = 100
	users := []string{"alice", "bob"}
	var wg sync.WaitGroup
	errs := make(chan error, len(users))
	for _, u := range users {
		conn, err := amqp.Dial("amqp://" + u + ":" + u + "-token@" + p.addr("amqp") + "/")
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		own := uniq(u)
		for _, q := range []string{own, shared} {
			if _, err := ch.QueueDeclare(q, false, false, false, false, nil); err != nil {
				t.Fatal(err)
			}
		}
		if err := ch.Confirm(false); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			var confs []*amqp.DeferredConfirmation
			for i := range n {
				for _, q := range []string{own, shared} {
					c, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", q, false, false, amqp.Publishing{Body: []byte("from-" + u + "-" + string(rune('a'+i%26)))})
					if err != nil {
						errs <- err
						return
					}
					confs = append(confs, c)
				}
			}
			for _, c := range confs {
				if ok, err := c.WaitContext(ctx); err != nil || !ok {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("publish: %v", err)
	}
	perToken := map[string]int{}
	for _, c := range log.snapshot() {
		if c.method != "SendQueueMessagesBatch" {
			// queue.declare's message count asks KubeMQ for the client;
			// everything else is the proxy's own business.
			if c.token != "proxy-secret" && !(c.method == "QueuesInfo" && (c.token == "alice-token" || c.token == "bob-token")) {
				t.Errorf("%s carried %q, want the proxy's token", c.method, c.token)
			}
			continue
		}
		for _, m := range c.batch {
			if strings.Contains(m.channel, "registry") {
				continue
			}
			perToken[c.token]++
			// Every copy is stored with its publisher's token.
			if user, ok := strings.CutSuffix(c.token, "-token"); !ok || !bytes.Contains(m.body, []byte("from-"+user+"-")) {
				t.Fatalf("message %q on %s stored with token %q", m.body, m.channel, c.token)
			}
		}
	}
	for _, u := range users {
		if perToken[u+"-token"] != 2*n {
			t.Errorf("%s's token carried %d copies, want %d (all: %v)", u, perToken[u+"-token"], 2*n, perToken)
		}
	}
}

// TestEmbeddedModeTLS: `kubemq-proxy embedded` with a certificate serves
// KubeMQ's gRPC API over TLS, and a proxy process reaches it with
// kubemq.tls and the CA, as it would a real KubeMQ with TLS enabled.
func TestEmbeddedModeTLS(t *testing.T) {
	caCert := newCA(t, "embedded")
	cert := caCert.issue(t, "localhost", true)
	backend := startProxy(t, []string{"embedded-kubemq"}, "embedded",
		"--embedded.tls_cert_file", cert.certFile, "--embedded.tls_key_file", cert.keyFile)
	addr := backend.addr("embedded-kubemq")

	p := startProxy(t, []string{"http", "amqp"}, "--kubemq.address", addr, "--kubemq.tls", "--kubemq.ca_file", caCert.file,
		"--kubemq.server_name", "localhost", "--registry.channel", uniq("registry-embedded-tls"))
	p.waitReady(t)
	conn, err := amqp.Dial("amqp://guest:guest@" + p.addr("amqp") + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	roundTrip(t, conn, uniq("via-embedded-tls"), "stored over TLS")
}
