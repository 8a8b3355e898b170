package main

// End-to-end tests of the built binary: the real lifecycle, real listeners,
// real clients, and kill -9 of the whole process.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/kubemq-io/kubemq-proxy/internal/keyorder"
	"github.com/kubemq-io/kubemq-proxy/internal/kubemqtest"
	"github.com/kubemq-io/kubemq-proxy/internal/proctest"
)

// TestMain removes the built binary (tens of MB per run) after the tests.
func TestMain(m *testing.M) {
	proctest.Main(m)
}

// proxyBinary returns the command built with -race, once per test run.
func proxyBinary(t *testing.T) string {
	t.Helper()
	return proctest.Binary(t, true)
}

// requiredListeners are reported by every started proxy.
var requiredListeners = []string{"http", "gcp", "amqp"}

// startProxy runs the binary with every listener on 127.0.0.1:0, reads the
// bound addresses from its "listening" log lines and waits for /readyz.
// Its log is printed when the test fails or runs with -v.
func startProxy(t *testing.T, dataDir, registryChannel string, extra ...string) *proctest.Proc {
	t.Helper()
	args := []string{
		"--gcp.listen", "127.0.0.1:0", "--amqp.listen", "127.0.0.1:0", "--amqp.tls_listen", "", "--amqp.management_listen", "127.0.0.1:0",
		"--http.listen", "127.0.0.1:0", "--registry.channel", registryChannel,
	}
	if kubemqtest.External() {
		args = append(args, "--kubemq.address", kubemqtest.Address(t))
	} else {
		args = append(args, "--embedded.listen", "127.0.0.1:0", "--embedded.data_dir", dataDir)
		args = append(args, kubemqtest.BinaryFlags()...)
	}
	args = append(args, extra...)
	p, err := proctest.Start(proxyBinary(t), "proxy", t.TempDir(), requiredListeners, args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Kill()
		// Built with -race: a race report (or panic) in the log fails the
		// test even when the process was killed rather than stopped.
		if pr := p.Problems(); len(pr) > 0 {
			t.Errorf("proxy reported:\n%s", strings.Join(pr, "\n"))
		}
		if t.Failed() || testing.Verbose() {
			t.Logf("proxy log (%s):%s", p.LogPath(), p.Tail(0))
		}
	})
	if err := proctest.WaitReady(p.Addr("http"), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	return p
}

// terminate stops the proxy with SIGTERM and fails the test unless it
// exits 0 within 20 s.
func terminate(t *testing.T, p *proctest.Proc) {
	t.Helper()
	if err := p.Stop(20 * time.Second); err != nil {
		t.Fatal(err)
	}
}

func pubsubClient(t *testing.T, addr, project string) *pubsub.Client {
	t.Helper()
	c, err := pubsub.NewClient(context.Background(), project,
		option.WithEndpoint(addr), option.WithoutAuthentication(),
		option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func uniqueName(prefix string) string {
	return fmt.Sprintf("%s-%d", prefix, time.Now().UnixNano())
}

func TestPubSubSurvivesKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	dataDir := t.TempDir()
	regCh := uniqueName("kubemq-proxy-e2e")
	p := startProxy(t, dataDir, regCh)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const project = "e2e"
	topicID, subID := uniqueName("topic"), uniqueName("sub")
	c := pubsubClient(t, p.Addr("gcp"), project)
	topic, err := c.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: "projects/" + project + "/topics/" + topicID})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{
		Name: "projects/" + project + "/subscriptions/" + subID, Topic: topic.Name, AckDeadlineSeconds: 10,
	}); err != nil {
		t.Fatal(err)
	}
	// An ordered subscription of the same topic: four keys, each leased a
	// window at a time, must come back in order after the kill.
	orderedID := subID + "-ordered"
	if _, err := c.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{
		Name: "projects/" + project + "/subscriptions/" + orderedID, Topic: topic.Name, AckDeadlineSeconds: 10, EnableMessageOrdering: true,
	}); err != nil {
		t.Fatal(err)
	}
	pub := c.Publisher(topicID)
	pub.EnableMessageOrdering = true
	const n, keys = 200, 4
	var results []*pubsub.PublishResult
	for i := 0; i < n; i++ {
		results = append(results, pub.Publish(ctx, &pubsub.Message{Data: []byte(fmt.Sprintf("m%03d", i)),
			OrderingKey: fmt.Sprint("k", i%keys), Attributes: map[string]string{"i": strconv.Itoa(i / keys)}}))
	}
	for _, r := range results {
		if _, err := r.Get(ctx); err != nil {
			t.Fatal(err)
		}
	}
	pub.Stop()

	// Lease (receive without acking) some messages, then kill -9.
	sub := c.Subscriber(subID)
	sub.ReceiveSettings.MaxOutstandingMessages = 50
	held := make(chan struct{}, n)
	rctx, rcancel := context.WithCancel(ctx)
	go sub.Receive(rctx, func(_ context.Context, m *pubsub.Message) { held <- struct{}{} })
	heldOrdered := make(chan struct{}, n)
	go c.Subscriber(orderedID).Receive(rctx, func(_ context.Context, m *pubsub.Message) { heldOrdered <- struct{}{} })
	for _, ch := range []chan struct{}{held, heldOrdered} {
		for i := 0; i < 20; i++ {
			select {
			case <-ch:
			case <-time.After(30 * time.Second):
				t.Fatal("nothing delivered before the kill")
			}
		}
	}
	p.Kill()
	rcancel()
	c.Close()

	// The restarted proxy knows the topic and subscription and delivers
	// every message, including the leased ones, at least once.
	p2 := startProxy(t, dataDir, regCh)
	if out, err := exec.Command(proxyBinary(t), "healthcheck", "--http.listen", p2.Addr("http")).CombinedOutput(); err != nil {
		t.Fatalf("healthcheck mode on a ready proxy: %v %s", err, out)
	}
	c2 := pubsubClient(t, p2.Addr("gcp"), project)
	if _, err := c2.TopicAdminClient.GetTopic(ctx, &pubsubpb.GetTopicRequest{Topic: topic.Name}); err != nil {
		t.Fatalf("topic lost across kill -9: %v", err)
	}
	seen := map[string]bool{}
	var mu sync.Mutex
	rctx2, rcancel2 := context.WithCancel(ctx)
	defer rcancel2()
	all := make(chan struct{})
	go func() {
		c2.Subscriber(subID).Receive(rctx2, func(_ context.Context, m *pubsub.Message) {
			m.Ack()
			mu.Lock()
			seen[string(m.Data)] = true
			if len(seen) == n {
				close(all)
			}
			mu.Unlock()
		})
	}()
	// Each key of the ordered subscription starts again at its first
	// message (none was acked) and never skips ahead; a message may come
	// more than once (at-least-once).
	seq := map[string][]int{}
	seenOrdered := map[string]bool{}
	allOrdered := make(chan struct{})
	go func() {
		c2.Subscriber(orderedID).Receive(rctx2, func(_ context.Context, m *pubsub.Message) {
			m.Ack()
			i, _ := strconv.Atoi(m.Attributes["i"])
			mu.Lock()
			seq[m.OrderingKey] = append(seq[m.OrderingKey], i)
			seenOrdered[string(m.Data)] = true
			if len(seenOrdered) == n {
				close(allOrdered)
			}
			mu.Unlock()
		})
	}()
	for what, ch := range map[string]chan struct{}{"": all, "ordered ": allOrdered} {
		select {
		case <-ch:
		case <-time.After(90 * time.Second):
			mu.Lock()
			t.Fatalf("after restart only %d and %d (ordered) of %d messages delivered %s", len(seen), len(seenOrdered), n, what)
		}
	}
	rcancel2()
	mu.Lock()
	defer mu.Unlock()
	for k, s := range seq {
		if err := keyorder.Check(s, keyorder.Repeats); err != nil {
			t.Fatalf("key %s out of order after the restart: %v", k, err)
		}
	}
	terminate(t, p2)
}

func TestEmbeddedModeServesKubeMQ(t *testing.T) {
	if testing.Short() || kubemqtest.External() {
		t.Skip("runs the binary's embedded mode")
	}
	p, err := proctest.Start(proxyBinary(t), "embedded", t.TempDir(), []string{"embedded-kubemq", "http"},
		"embedded", "--embedded.listen", "127.0.0.1:0", "--http.listen", "127.0.0.1:0", "--embedded.data_dir", t.TempDir())
	if err != nil {
		t.Fatalf("embedded mode never reported its listeners: %v", err)
	}
	defer p.Kill()
	// The side port: liveness, readiness (the server answers its health ping), metrics and
	// Go's profiles (loopback here).
	if err := proctest.WaitReady(p.Addr("http"), 30*time.Second); err != nil {
		t.Fatalf("embedded mode /readyz: %v", err)
	}
	for path, want := range map[string]string{"/healthz": "ok", "/metrics": "kubemq_proxy_ready 1", "/debug/pprof/": "goroutine"} {
		resp, err := http.Get("http://" + p.Addr("http") + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(b), want) {
			t.Errorf("GET %s = %d, want 200 with %q", path, resp.StatusCode, want)
		}
	}
	if err := p.Stop(30 * time.Second); err != nil {
		t.Fatalf("embedded mode exit: %v", err)
	}
}

func TestAMQPSurvivesKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	dataDir := t.TempDir()
	regCh := uniqueName("kubemq-proxy-e2e")
	p := startProxy(t, dataDir, regCh)
	exchange, queue := uniqueName("ex"), uniqueName("q")

	conn, err := amqp.Dial("amqp://guest:guest@" + p.Addr("amqp") + "/")
	if err != nil {
		t.Fatal(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclare(exchange, "topic", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(queue, "orders.#", exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	const n = 200
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var confirms []*amqp.DeferredConfirmation
	for i := 0; i < n; i++ {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, "orders.eu.new", false, false,
			amqp.Publishing{DeliveryMode: amqp.Persistent, Body: []byte(fmt.Sprintf("m%03d", i))})
		if err != nil {
			t.Fatal(err)
		}
		confirms = append(confirms, dc)
	}
	for i, dc := range confirms {
		if ok, err := dc.WaitContext(ctx); err != nil || !ok {
			t.Fatalf("publish %d not confirmed: %v %v", i, ok, err)
		}
	}
	// Hold some deliveries unacked, then kill -9.
	if err := ch.Qos(20, 0, false); err != nil {
		t.Fatal(err)
	}
	msgs, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 20; i++ {
		select {
		case <-msgs:
		case <-time.After(30 * time.Second):
			t.Fatal("nothing delivered before the kill")
		}
	}
	p.Kill()
	conn.Close()

	p2 := startProxy(t, dataDir, regCh)
	conn2, err := amqp.Dial("amqp://guest:guest@" + p2.Addr("amqp") + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer conn2.Close()
	ch2, err := conn2.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch2.ExchangeDeclarePassive(exchange, "topic", true, false, false, false, nil); err != nil {
		t.Fatalf("durable exchange lost across kill -9: %v", err)
	}
	ch2, _ = conn2.Channel()
	// The binding survived too: a new message routes to the queue.
	if err := ch2.PublishWithContext(ctx, exchange, "orders.us.new", false, false, amqp.Publishing{Body: []byte("after")}); err != nil {
		t.Fatal(err)
	}
	msgs2, err := ch2.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		t.Fatalf("durable queue lost across kill -9: %v", err)
	}
	seen := map[string]bool{}
	deadline := time.After(90 * time.Second)
	for len(seen) < n+1 {
		select {
		case d := <-msgs2:
			seen[string(d.Body)] = true
			d.Ack(false)
		case <-deadline:
			t.Fatalf("after restart only %d of %d messages delivered", len(seen), n+1)
		}
	}
	conn2.Close()
	terminate(t, p2)
}

func TestLogLevelReloadAndStateView(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	file := filepath.Join(t.TempDir(), "proxy.yaml")
	if err := os.WriteFile(file, []byte("log:\n  level: info\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, t.TempDir(), uniqueName("kubemq-proxy-e2e"), "--config", file)
	base := "http://" + p.Addr("http")
	level := func() string {
		resp, err := http.Get(base + "/loglevel")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var v struct{ Level string }
		json.NewDecoder(resp.Body).Decode(&v)
		return v.Level
	}
	if got := level(); got != "info" {
		t.Fatalf("level %q, want info", got)
	}
	if err := os.WriteFile(file, []byte("log:\n  level: debug\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	p.Signal(syscall.SIGHUP)
	deadline := time.Now().Add(5 * time.Second)
	for level() != "debug" {
		if time.Now().After(deadline) {
			t.Fatal("SIGHUP did not apply log.level: debug")
		}
		time.Sleep(20 * time.Millisecond)
	}
	req, _ := http.NewRequest(http.MethodPut, base+"/loglevel", strings.NewReader(`{"level":"warn"}`))
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 200 {
		t.Fatalf("PUT /loglevel: %v", err)
	}
	if got := level(); got != "warn" {
		t.Fatalf("level %q after PUT, want warn", got)
	}

	// One AMQP connection and one Pub/Sub topic to show up in /state.
	conn, err := amqp.Dial("amqp://guest:guest@" + p.Addr("amqp") + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := pubsubClient(t, p.Addr("gcp"), "state").TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: "projects/state/topics/" + uniqueName("state")}); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get(base + "/state")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var state struct {
		Ready     string
		Backend   struct{ Up bool }
		Frontends struct {
			GCP  struct{ Topics int }
			AMQP struct {
				Connections []struct {
					ID       uint64
					Channels int
				}
			}
		}
	}
	if err := json.NewDecoder(resp.Body).Decode(&state); err != nil {
		t.Fatal(err)
	}
	if state.Ready != "ok" || !state.Backend.Up || state.Frontends.GCP.Topics < 1 || len(state.Frontends.AMQP.Connections) != 1 {
		t.Fatalf("unexpected /state: %+v", state)
	}
	conn.Close()
	terminate(t, p)
}

// TestRecordDelayReachesDelivery: delivery.record_delay sets the lease
// engine's record delay, which an ordered subscription's recovery hold
// after a restart follows (at least record delay + 5 s): with 2s, /state
// shows the hold's least end about 7 s after the first pull, not the
// default's 15 s, and the hold ends soon after (its sentinel record is
// back by then).
func TestRecordDelayReachesDelivery(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	dataDir, regCh := t.TempDir(), uniqueName("kubemq-proxy-e2e")
	delay := []string{"--delivery.record_delay", "2s"}
	p := startProxy(t, dataDir, regCh, delay...)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const project = "e2e"
	topicID, subID := uniqueName("topic"), uniqueName("sub")
	c := pubsubClient(t, p.Addr("gcp"), project)
	if _, err := c.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: "projects/" + project + "/topics/" + topicID}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{
		Name: "projects/" + project + "/subscriptions/" + subID, Topic: "projects/" + project + "/topics/" + topicID, EnableMessageOrdering: true,
	}); err != nil {
		t.Fatal(err)
	}
	terminate(t, p)

	p2 := startProxy(t, dataDir, regCh, delay...)
	c2 := pubsubClient(t, p2.Addr("gcp"), project)
	pulled := time.Now()
	pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
	_, err := c2.SubscriptionAdminClient.Pull(pctx, &pubsubpb.PullRequest{Subscription: "projects/" + project + "/subscriptions/" + subID, MaxMessages: 1})
	pcancel()
	if err != nil && status.Code(err) != codes.DeadlineExceeded {
		t.Fatal(err)
	}
	type subState struct {
		ID              string
		RecoveringUntil *time.Time `json:"recovering_until"`
		SentinelOut     *time.Time `json:"recovery_sentinel_out_until"`
	}
	state := func() subState {
		t.Helper()
		resp, err := http.Get("http://" + p2.Addr("http") + "/state")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var state struct {
			Frontends struct {
				GCP struct {
					Subscriptions []subState
				}
			}
		}
		if err := json.NewDecoder(resp.Body).Decode(&state); err != nil {
			t.Fatal(err)
		}
		for _, s := range state.Frontends.GCP.Subscriptions {
			if s.ID == subID {
				return s
			}
		}
		t.Fatalf("subscription %s not in /state", subID)
		return subState{}
	}
	s := state()
	if s.RecoveringUntil == nil {
		t.Fatal("the ordered subscription is not holding keyed messages after the restart")
	}
	if hold := s.RecoveringUntil.Sub(pulled); hold < 6*time.Second || hold > 8*time.Second {
		t.Fatalf("least recovery hold %v after the first pull, want about 7 s (record delay 2 s + 5 s)", hold)
	}
	// The hold ends once its sentinel record (2 s delay) is back and the
	// least hold has passed; the sentinel comes back only while the
	// subscription is pulled.
	for s.RecoveringUntil != nil && time.Since(pulled) < 30*time.Second {
		pctx, pcancel := context.WithTimeout(ctx, time.Second)
		_, err := c2.SubscriptionAdminClient.Pull(pctx, &pubsubpb.PullRequest{Subscription: "projects/" + project + "/subscriptions/" + subID, MaxMessages: 1})
		pcancel()
		if err != nil && status.Code(err) != codes.DeadlineExceeded {
			t.Fatal(err)
		}
		s = state()
	}
	if ended := time.Since(pulled); s.RecoveringUntil != nil || ended > 12*time.Second {
		t.Fatalf("recovery hold still on or ended late (%v after the first pull, sentinel out until %v)", ended, s.SentinelOut)
	}
	terminate(t, p2)
}
