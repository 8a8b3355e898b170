package embedded_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kubemq-io/kubemq-proxy/embedded"
	"github.com/kubemq-io/kubemq-proxy/internal/kubemqtest"
	pb "github.com/kubemq-io/kubemq-proxy/kubemqpb"
)

type env struct {
	t   testing.TB
	srv *embedded.Server
	c   pb.KubemqClient
	ctx context.Context
}

func newEnv(t *testing.T, opts embedded.Options) *env {
	t.Helper()
	addr, srv := kubemqtest.StartEmbedded(t, opts)
	c := dial(t, addr)
	if kubemqtest.InProcess(false) {
		// The whole suite through the in-process channel: it must behave
		// as the network does.
		c = pb.NewKubemqClient(srv.Channel())
	}
	return &env{t: t, srv: srv, c: c, ctx: testCtx(t)}
}

// strictEnv is an in-memory strict server.
func strictEnv(t *testing.T) *env { return newEnv(t, embedded.Options{Strict: true}) }

func dial(t testing.TB, addr string) pb.KubemqClient {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(100<<20), grpc.MaxCallSendMsgSize(100<<20)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return pb.NewKubemqClient(conn)
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func qmsg(ch, body string) *pb.QueueMessage {
	return &pb.QueueMessage{ClientID: "c", Channel: ch, Body: []byte(body)}
}

func (e *env) send(m *pb.QueueMessage) *pb.SendQueueMessageResult {
	e.t.Helper()
	res, err := e.c.SendQueueMessage(e.ctx, m)
	if err != nil {
		e.t.Fatalf("send: %v", err)
	}
	return res
}

func (e *env) mustSend(ch string, bodies ...string) {
	e.t.Helper()
	for _, b := range bodies {
		if res := e.send(qmsg(ch, b)); res.IsError {
			e.t.Fatalf("send %q: %s", b, res.Error)
		}
	}
}

// ds is a downstream stream for tests.
type ds struct {
	t      testing.TB
	s      pb.Kubemq_QueuesDownstreamClient
	cancel context.CancelFunc
	n      int
}

func (e *env) downstream() *ds {
	e.t.Helper()
	ctx, cancel := context.WithCancel(e.ctx)
	s, err := e.c.QueuesDownstream(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(cancel)
	return &ds{t: e.t, s: s, cancel: cancel}
}

func (d *ds) send(r *pb.QueuesDownstreamRequest) {
	d.t.Helper()
	d.n++
	if r.RequestID == "" {
		r.RequestID = fmt.Sprintf("r%d", d.n)
	}
	if r.ClientID == "" {
		r.ClientID = "c"
	}
	if err := d.s.Send(r); err != nil {
		d.t.Fatalf("downstream send: %v", err)
	}
}

func (d *ds) recv() *pb.QueuesDownstreamResponse {
	d.t.Helper()
	r, err := d.s.Recv()
	if err != nil {
		d.t.Fatalf("downstream recv: %v", err)
	}
	return r
}

func (d *ds) get(ch string, max, waitMs int32) *pb.QueuesDownstreamResponse {
	d.t.Helper()
	d.send(&pb.QueuesDownstreamRequest{RequestTypeData: pb.QueuesDownstreamRequestType_Get, Channel: ch, MaxItems: max, WaitTimeout: waitMs})
	r := d.recv()
	if r.IsError {
		d.t.Fatalf("get %s: %s", ch, r.Error)
	}
	return r
}

// op sends a settlement and then an ActiveOffsets probe on tx probe, so that a silent success is
// observable: it returns the error reply of op, or nil, and the probe's reply.
func (d *ds) op(r *pb.QueuesDownstreamRequest, probeTx string) (opErr *pb.QueuesDownstreamResponse, probe *pb.QueuesDownstreamResponse) {
	d.t.Helper()
	d.send(r)
	d.send(&pb.QueuesDownstreamRequest{RequestTypeData: pb.QueuesDownstreamRequestType_ActiveOffsets, RefTransactionId: probeTx, RequestID: "probe"})
	x := d.recv()
	if x.RefRequestId != "probe" {
		opErr = x
		x = d.recv()
	}
	return opErr, x
}

func bodies(ms []*pb.QueueMessage) string {
	var b []string
	for _, m := range ms {
		b = append(b, string(m.Body))
	}
	return strings.Join(b, ",")
}

func seqs(ms []*pb.QueueMessage) []int64 {
	var out []int64
	for _, m := range ms {
		out = append(out, int64(m.Attributes.Sequence))
	}
	return out
}

type optsT = embedded.Options

func embeddedOpts(f func(*optsT)) embedded.Options {
	o := embedded.Options{Strict: true}
	f(&o)
	return o
}

func listen(t testing.TB) net.Listener {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return lis
}
