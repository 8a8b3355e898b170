package console_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap/zaptest"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kubemq-io/kubemq-proxy/amqp091"
	"github.com/kubemq-io/kubemq-proxy/gcp"
	"github.com/kubemq-io/kubemq-proxy/internal/kubemqtest"
	"github.com/kubemq-io/kubemq-proxy/kubemqclient"
	"github.com/kubemq-io/kubemq-proxy/proxy"
)

// factories are the two front-ends as frontends.go builds them, with default knobs.
func factories() []proxy.FrontendFactory {
	return []proxy.FrontendFactory{
		{Name: "gcp", Listen: func(c *proxy.Config) []string { return []string{c.GCP.Listen} },
			New: func(d proxy.Deps) (proxy.Frontend, error) {
				return gcp.New(gcp.Options{Client: d.Client, Registry: d.Registry, Deliveries: d.Deliveries,
					Logger: d.Logger.Named("gcp"), Metrics: d.Metrics, Ready: d.Ready})
			}},
		{Name: "amqp", Listen: func(c *proxy.Config) []string { return []string{c.AMQP.Listen} },
			New: func(d proxy.Deps) (proxy.Frontend, error) {
				return amqp091.New(amqp091.Options{Client: d.Client, Registry: d.Registry, Deliveries: d.Deliveries,
					Logger: d.Logger.Named("amqp"), Metrics: d.Metrics, Ready: d.Ready})
			}},
	}
}

// startProxy runs a proxy with both front-ends on an embedded backend (or the KubeMQ of
// KUBEMQ_ADDRESS) and waits until it is ready; edit changes the configuration first.
func startProxy(t *testing.T, edit func(*proxy.Config)) *proxy.Proxy {
	t.Helper()
	cfg := proxy.Defaults()
	cfg.GCP.Listen = "127.0.0.1:0"
	cfg.AMQP.Listen = "127.0.0.1:0"
	cfg.AMQP.TLSListen = ""
	cfg.HTTP.Listen = "127.0.0.1:0"
	cfg.Embedded.Listen = "127.0.0.1:0"
	cfg.Embedded.DataDir = t.TempDir()
	cfg.Embedded.Strict = true
	cfg.Registry.Channel = kubemqclient.Channel("kubemq-proxy-test.registry", t.Name(), time.Now().Format("150405.000000000"))
	if kubemqtest.External() {
		cfg.KubeMQ.Address = kubemqtest.Address(t)
	}
	if edit != nil {
		edit(&cfg)
	}
	p, err := proxy.New(cfg, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(context.Background(), factories()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := p.Shutdown(ctx); err != nil {
			t.Error(err)
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for p.Ready() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("not ready: %v", p.Ready())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return p
}

func unique(prefix string) string { return fmt.Sprintf("%s-%d", prefix, time.Now().UnixNano()) }

func pubsubClient(t *testing.T, addr string) *pubsub.Client {
	t.Helper()
	c, err := pubsub.NewClient(context.Background(), "console-test",
		option.WithEndpoint(addr), option.WithoutAuthentication(),
		option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func amqpChannel(t *testing.T, addr string) *amqp.Channel {
	t.Helper()
	conn, err := amqp.DialConfig("amqp://guest:guest@"+addr+"/", amqp.Config{Properties: amqp.Table{"connection_name": "console-test"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

// fixture is a proxy with a topic, a subscription, an exchange bound to a queue with a hostile
// name, and messages published through both protocols.
type fixture struct {
	p                     *proxy.Proxy
	base                  string
	ps                    *pubsub.Client
	ch                    *amqp.Channel
	topic, sub            string
	queue, exchange, bkey string
}

// hostile is part of a queue name: markup and quotes the pages must escape.
const hostile = `<script>alert("q")</script>&'<img src=x onerror=alert(1)>`

func newFixture(t *testing.T, edit func(*proxy.Config)) *fixture {
	t.Helper()
	p := startProxy(t, edit)
	f := &fixture{p: p, base: "http://" + p.Addr("http"), topic: unique("console-topic"), sub: unique("console-sub"),
		queue: unique("q" + hostile), exchange: unique("console-x"), bkey: "console.key"}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	f.ps = pubsubClient(t, p.Addr("gcp"))
	if _, err := f.ps.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: "projects/console-test/topics/" + f.topic}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.ps.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{
		Name: "projects/console-test/subscriptions/" + f.sub, Topic: "projects/console-test/topics/" + f.topic, AckDeadlineSeconds: 10}); err != nil {
		t.Fatal(err)
	}
	f.ch = amqpChannel(t, p.Addr("amqp"))
	if err := f.ch.ExchangeDeclare(f.exchange, "direct", false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := f.ch.QueueDeclare(f.queue, false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := f.ch.QueueBind(f.queue, f.bkey, f.exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	return f
}

// publish sends n messages through each protocol and waits until they are stored.
func (f *fixture) publish(t *testing.T, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pub := f.ps.Publisher(f.topic)
	defer pub.Stop()
	for i := 0; i < n; i++ {
		if _, err := pub.Publish(ctx, &pubsub.Message{Data: []byte(fmt.Sprintf("ps-%d", i))}).Get(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		c, err := f.ch.PublishWithDeferredConfirmWithContext(ctx, f.exchange, f.bkey, false, false, amqp.Publishing{Body: []byte(fmt.Sprintf("amqp-%d", i))})
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := c.WaitContext(ctx); !ok || err != nil {
			t.Fatalf("publish %d not confirmed: %v", i, err)
		}
	}
}

// do sends one request; header pairs are name, value.
func do(t *testing.T, method, u string, body url.Values, header ...string) (int, string, http.Header) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		rd = strings.NewReader(body.Encode())
	}
	req, err := http.NewRequest(method, u, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for i := 0; i+1 < len(header); i += 2 {
		if strings.EqualFold(header[i], "Host") {
			req.Host = header[i+1]
			continue
		}
		req.Header.Set(header[i], header[i+1])
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

// actionResult is an action's JSON answer as the tests read it.
type actionResult struct {
	OK       bool   `json:"ok"`
	Message  string `json:"message"`
	Error    string `json:"error"`
	Messages []struct {
		Body string            `json:"body"`
		Tags map[string]string `json:"tags"`
	} `json:"messages"`
}

// act runs a console action as the console's script does and decodes the answer.
func act(t *testing.T, base, name string, form url.Values, header ...string) (int, actionResult) {
	t.Helper()
	code, body, _ := do(t, "POST", base+"/console/action/"+name, form, append([]string{"X-Console-Request", "1"}, header...)...)
	var r actionResult
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		t.Fatalf("%s: %d %q: %v", name, code, body, err)
	}
	return code, r
}
