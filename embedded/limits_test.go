package embedded_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kubemq-io/kubemq-proxy/embedded"
	"github.com/kubemq-io/kubemq-proxy/internal/kubemqtest"
	pb "github.com/kubemq-io/kubemq-proxy/kubemqpb"
)

// EnvLimitsAddress points the limit tests at a real KubeMQ started with the limits below, e.g.
//
//	STORE_MAX_MESSAGES=5 STORE_MAX_QUEUE_SIZE=4000 STORE_MAX_SUBSCRIBERS=2 \
//	QUEUE_MAX_NUMBER_OF_MESSAGES=10 QUEUE_MAX_RECEIVE_COUNT=7 GRPC_BODY_LIMIT=20000 \
//	kubemq-server start DIR
//
// so that the same checks run against it (they pass on v2.4.0).
const envLimitsAddress = "KUBEMQ_LIMITS_ADDRESS"

// limitOpts are the embedded options equal to the environment above.
var limitOpts = embedded.Options{
	Strict:             true,
	MaxChannelMessages: 5,
	MaxChannelBytes:    4000,
	MaxSubscribers:     2,
	MaxReceiveMessages: 10,
	MaxReceiveCount:    7,
	BodyLimit:          20000,
}

// limitsEnv is a server with limitOpts: the real one named by $KUBEMQ_LIMITS_ADDRESS, or an
// embedded one. suffix makes channel names unique (a real server keeps its store).
func limitsEnv(t *testing.T) (e *env, suffix string) {
	suffix = fmt.Sprintf("%d", time.Now().UnixNano())
	if a := os.Getenv(envLimitsAddress); a != "" {
		return &env{t: t, c: dial(t, a), ctx: testCtx(t)}, suffix
	}
	return newEnv(t, limitOpts), suffix
}

func receive(t *testing.T, e *env, ch string, n int32) *pb.ReceiveQueueMessagesResponse {
	t.Helper()
	r, err := e.c.ReceiveQueueMessages(e.ctx, &pb.ReceiveQueueMessagesRequest{ClientID: "c", Channel: ch, MaxNumberOfMessages: n, WaitTimeSeconds: 1})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// The real store never refuses a send for its per-channel limits: it drops the oldest messages
// (checked on v2.4.0: 8 sends with STORE_MAX_MESSAGES=5 leave sequences 4-8).
func TestStoreMaxMessagesDropsOldest(t *testing.T) {
	e, sfx := limitsEnv(t)
	q := "lim.msgs." + sfx
	for i := 1; i <= 8; i++ {
		if r := e.send(qmsg(q, fmt.Sprintf("m%d", i))); r.IsError {
			t.Fatalf("send %d refused: %s", i, r.Error)
		}
	}
	info, err := e.c.QueuesInfo(e.ctx, &pb.QueuesInfoRequest{RequestID: "i", QueueName: q})
	if err != nil {
		t.Fatal(err)
	}
	if len(info.Info.Queues) != 1 || info.Info.Queues[0].Messages != 5 || info.Info.Queues[0].FirstSequence != 4 {
		t.Fatalf("QueuesInfo %+v, want 5 messages from sequence 4", info.Info.Queues)
	}
	r := receive(t, e, q, 10)
	if r.IsError || bodies(r.Messages) != "m4,m5,m6,m7,m8" {
		t.Fatalf("received %q (%s), want m4..m8", bodies(r.Messages), r.Error)
	}

	// Events-store channels too.
	ch := "lim.ev." + sfx
	for i := 1; i <= 8; i++ {
		res, err := e.c.SendEvent(e.ctx, &pb.Event{ClientID: "c", Channel: ch, Body: []byte(fmt.Sprintf("e%d", i)), Store: true})
		if err != nil || !res.Sent {
			t.Fatalf("publish %d: %+v %v", i, res, err)
		}
	}
	time.Sleep(300 * time.Millisecond) // the real server acknowledges before storing
	ctx, cancel := context.WithTimeout(e.ctx, 2*time.Second)
	defer cancel()
	st, err := e.c.SubscribeToEvents(ctx, &pb.Subscribe{SubscribeTypeData: pb.Subscribe_EventsStore, ClientID: "lim-" + sfx, Channel: ch, EventsStoreTypeData: pb.Subscribe_StartFromFirst})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for len(got) < 5 {
		ev, err := st.Recv()
		if err != nil {
			t.Fatalf("after %v: %v", got, err)
		}
		got = append(got, fmt.Sprintf("%d:%s", ev.Sequence, ev.Body))
	}
	if strings.Join(got, ",") != "4:e4,5:e5,6:e6,7:e7,8:e8" {
		t.Fatalf("replayed %v, want sequences 4-8", got)
	}
}

// STORE_MAX_QUEUE_SIZE: the oldest go until the channel is within its bytes (4000 bytes keep
// three 1000-byte messages, on the real server, whose count includes its envelope, and here).
func TestStoreMaxQueueSizeDropsOldest(t *testing.T) {
	e, sfx := limitsEnv(t)
	q := "lim.bytes." + sfx
	for i := 1; i <= 10; i++ {
		if r := e.send(qmsg(q, fmt.Sprintf("b%02d", i)+strings.Repeat("x", 997))); r.IsError {
			t.Fatalf("send %d refused: %s", i, r.Error)
		}
	}
	r := receive(t, e, q, 10)
	var got []string
	for _, m := range r.Messages {
		got = append(got, string(m.Body[:3]))
	}
	if strings.Join(got, ",") != "b08,b09,b10" {
		t.Fatalf("kept %v, want b08,b09,b10", got)
	}
}

// STORE_MAX_SUBSCRIBERS counts an events-store channel's durables, offline ones included; one
// more is refused with gRPC Internal "too many subscriptions per channel" (real server v2.4.0).
func TestStoreMaxSubscribers(t *testing.T) {
	e, sfx := limitsEnv(t)
	ch := "lim.subs." + sfx
	if res, err := e.c.SendEvent(e.ctx, &pb.Event{ClientID: "c", Channel: ch, Body: []byte("x"), Store: true}); err != nil || !res.Sent {
		t.Fatalf("publish: %+v %v", res, err)
	}
	time.Sleep(300 * time.Millisecond)
	// subscribe reports the stream's error, or nil when it is still open after a while.
	subscribe := func(id string) (error, context.CancelFunc) {
		ctx, cancel := context.WithCancel(e.ctx)
		st, err := e.c.SubscribeToEvents(ctx, &pb.Subscribe{SubscribeTypeData: pb.Subscribe_EventsStore, ClientID: id + sfx, Channel: ch, EventsStoreTypeData: pb.Subscribe_StartNewOnly})
		if err != nil {
			return err, cancel
		}
		errc := make(chan error, 1)
		go func() { _, err := st.Recv(); errc <- err }()
		select {
		case err := <-errc:
			return err, cancel
		case <-time.After(700 * time.Millisecond):
			return nil, cancel
		}
	}
	err1, cancel1 := subscribe("a")
	defer cancel1()
	err2, cancel2 := subscribe("b")
	defer cancel2()
	if err1 != nil || err2 != nil {
		t.Fatalf("first two subscriptions: %v, %v", err1, err2)
	}
	isTooMany := func(err error) bool {
		return status.Code(err) == codes.Internal && strings.Contains(status.Convert(err).Message(), "too many subscriptions per channel")
	}
	err3, cancel3 := subscribe("c")
	defer cancel3()
	if !isTooMany(err3) {
		t.Fatalf("third subscription: %v, want Internal too many subscriptions per channel", err3)
	}
	cancel1() // a durable that goes offline still counts
	time.Sleep(300 * time.Millisecond)
	err3, cancel3b := subscribe("c")
	defer cancel3b()
	if !isTooMany(err3) {
		t.Fatalf("third subscription after one left: %v, want it refused (offline durables count)", err3)
	}
	err1, cancel1b := subscribe("a")
	defer cancel1b()
	if err1 != nil {
		t.Fatalf("an existing durable resubscribing: %v", err1)
	}
}

// The queue limits: QUEUE_MAX_NUMBER_OF_MESSAGES (Error 122), QUEUE_MAX_RECEIVE_COUNT (Error 134,
// and the value a 0 becomes), GRPC_BODY_LIMIT (gRPC ResourceExhausted before any handler).
func TestQueueLimits(t *testing.T) {
	e, sfx := limitsEnv(t)
	q := "lim.queue." + sfx
	if r := receive(t, e, q, 11); !r.IsError || !strings.HasPrefix(r.Error, "Error 122:") {
		t.Fatalf("receive 11 with a limit of 10: %+v", r)
	}
	m := qmsg(q, "x")
	m.Policy = &pb.QueueMessagePolicy{MaxReceiveCount: 8}
	if r := e.send(m); !r.IsError || !strings.HasPrefix(r.Error, "Error 134:") {
		t.Fatalf("MaxReceiveCount 8 with a limit of 7: %+v", r)
	}
	e.mustSend(q, "y")
	r := receive(t, e, q, 1)
	if len(r.Messages) != 1 || r.Messages[0].Policy.GetMaxReceiveCount() != 7 {
		t.Fatalf("a message sent with MaxReceiveCount 0 shows %+v, want 7", r.Messages)
	}
	_, err := e.c.SendQueueMessage(e.ctx, qmsg(q, strings.Repeat("z", 30000)))
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "vs. 20000") {
		t.Fatalf("30,000-byte body with a 20,000-byte limit: %v", err)
	}
	_, err = e.c.SendEvent(e.ctx, &pb.Event{ClientID: "c", Channel: q, Body: make([]byte, 30000), Store: true})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("30,000-byte event with a 20,000-byte limit: %v", err)
	}
}

// The same limits through the in-process channel the proxy uses.
func TestBodyLimitThroughChannel(t *testing.T) {
	_, srv := kubemqtest.StartEmbedded(t, embedded.Options{BodyLimit: 20000})
	c := pb.NewKubemqClient(srv.Channel())
	_, err := c.SendQueueMessage(testCtx(t), qmsg("q", strings.Repeat("z", 30000)))
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "vs. 20000") {
		t.Fatalf("30,000-byte body with a 20,000-byte limit: %v", err)
	}
	if r, err := c.SendQueueMessage(testCtx(t), qmsg("q", strings.Repeat("z", 10000))); err != nil || r.IsError {
		t.Fatalf("10,000 bytes: %+v %v", r, err)
	}
}

// Every other queue limit, embedded only (the real server's were read from its configuration
// and error texts; the defaults are checked by the other suites).
func TestQueuePolicyLimitsConfigurable(t *testing.T) {
	e := newEnv(t, embedded.Options{Strict: true, MaxExpirationSeconds: 10, MaxDelaySeconds: 5, MaxWaitSeconds: 2,
		MaxVisibilitySeconds: 3, DefaultVisibilitySeconds: 2})
	for _, c := range []struct {
		p    *pb.QueueMessagePolicy
		want string
	}{
		{&pb.QueueMessagePolicy{ExpirationSeconds: 11}, "Error 133:"},
		{&pb.QueueMessagePolicy{DelaySeconds: 6}, "Error 135:"},
	} {
		m := qmsg("q", "x")
		m.Policy = c.p
		if r := e.send(m); !r.IsError || !strings.HasPrefix(r.Error, c.want) {
			t.Errorf("%+v: %+v, want %s", c.p, r, c.want)
		}
	}
	m := qmsg("q", "x")
	m.Policy = &pb.QueueMessagePolicy{ExpirationSeconds: 10, DelaySeconds: 5}
	if r := e.send(m); r.IsError {
		t.Fatalf("at the limits: %s", r.Error)
	}
	r, err := e.c.ReceiveQueueMessages(e.ctx, &pb.ReceiveQueueMessagesRequest{ClientID: "c", Channel: "q", MaxNumberOfMessages: 1, WaitTimeSeconds: 3})
	if err != nil || !r.IsError || !strings.HasPrefix(r.Error, "Error 136:") {
		t.Fatalf("wait 3 s with a limit of 2: %+v %v", r, err)
	}
	st, err := e.c.StreamQueueMessage(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&pb.StreamQueueMessagesRequest{ClientID: "c", Channel: "q", StreamRequestTypeData: pb.StreamRequestType_ReceiveMessage, VisibilitySeconds: 4, WaitTimeSeconds: 1}); err != nil {
		t.Fatal(err)
	}
	if x, err := st.Recv(); err != nil || !x.IsError || !strings.HasPrefix(x.Error, "Error 127:") {
		t.Fatalf("visibility 4 with a limit of 3: %+v %v", x, err)
	}
}

func TestLimitOptionsValidated(t *testing.T) {
	for _, o := range []embedded.Options{
		{MaxChannels: -1}, {MaxChannels: 1}, {MaxSubscribers: -1}, {MaxChannelMessages: -1}, {MaxChannelBytes: -5},
		{MaxMemory: -1}, {MaxReceiveMessages: -1}, {BodyLimit: 100}, {BodyLimit: 200 << 20},
		{MaxWaitSeconds: 2, DefaultWaitSeconds: 3}, {MaxVisibilitySeconds: 10, DefaultVisibilitySeconds: 60},
	} {
		if s, err := embedded.New(o); err == nil {
			s.Stop()
			t.Errorf("%+v accepted", o)
		}
	}
}

// STORE_MAX_QUEUES counts queues and events-store channels plus the real server's internal
// delay channel: with 3, clients get two (checked on v2.4.0, where the third queue send got
// "too many channels" in its result and a subscription gRPC Internal "too many channels").
func TestStoreMaxChannels(t *testing.T) {
	e := newEnv(t, embedded.Options{Strict: true, MaxChannels: 3})
	e.mustSend("q1", "a")
	if res, err := e.c.SendEvent(e.ctx, &pb.Event{ClientID: "c", Channel: "e1", Body: []byte("x"), Store: true}); err != nil || !res.Sent {
		t.Fatalf("second channel: %+v %v", res, err)
	}
	if r := e.send(qmsg("q2", "b")); !r.IsError || r.Error != "too many channels" {
		t.Fatalf("third channel: %+v", r)
	}
	d := qmsg("q2", "b")
	d.Policy = &pb.QueueMessagePolicy{DelaySeconds: 1}
	if r := e.send(d); !r.IsError || r.Error != "too many channels" {
		t.Fatalf("delayed send to a third channel: %+v", r)
	}
	res, err := e.c.SendEvent(e.ctx, &pb.Event{ClientID: "c", Channel: "e2", Body: []byte("x"), Store: true})
	if err != nil || res.Sent || res.Error != "too many channels" {
		t.Fatalf("events-store publish to a third channel: %+v %v (the real server answers Sent=true and loses it)", res, err)
	}
	if _, err := e.subscribe(&pb.Subscribe{SubscribeTypeData: pb.Subscribe_EventsStore, ClientID: "s", Channel: "e3", EventsStoreTypeData: pb.Subscribe_StartNewOnly}); status.Code(err) != codes.Internal || !strings.Contains(err.Error(), "too many channels") {
		t.Fatalf("subscription to a third channel: %v", err)
	}
	if r := receive(t, e, "q3", 1); !r.IsError || r.Error != "too many channels" {
		t.Fatalf("receive from a third channel: %+v", r)
	}
	d2 := e.downstream()
	d2.send(&pb.QueuesDownstreamRequest{RequestTypeData: pb.QueuesDownstreamRequestType_Get, Channel: "q4", MaxItems: 1, WaitTimeout: 1000})
	if x := d2.recv(); !x.IsError || x.Error != "too many channels" {
		t.Fatalf("Get on a third channel: %+v", x)
	}
	e.mustSend("q1", "c") // existing channels go on
	if r := receive(t, e, "q1", 2); bodies(r.Messages) != "a,c" {
		t.Fatalf("q1: %q %s", bodies(r.Messages), r.Error)
	}
}
