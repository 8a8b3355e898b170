package gcp_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/kubemq-io/kubemq-proxy/gcp"
)

// TestRESTSplitPort: gRPC and REST on one port, raw peers that write their
// first bytes one at a time, a silent peer that must not hold up others,
// and one that closes at once.
func TestRESTSplitPort(t *testing.T) {
	e := startEnv(t)
	ctx := ctxT(t, 60*time.Second)

	// A silent connection, open throughout: the others must not wait for it.
	silent, err := net.Dial("tcp", e.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	// One that closes before writing anything.
	if c, err := net.Dial("tcp", e.addr); err == nil {
		c.Close()
	}

	// REST over HTTP/1.1, the request line written byte by byte ("P" could
	// still be "PRI ").
	c, err := net.Dial("tcp", e.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	req := "PUT /v1/projects/" + e.project + "/topics/" + e.id("split") + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
	for i := range len(req) {
		if _, err := c.Write([]byte{req[i]}); err != nil {
			t.Fatal(err)
		}
		if i < 5 {
			time.Sleep(20 * time.Millisecond)
		}
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || !strings.Contains(string(body), e.id("split")) {
		t.Fatalf("REST over a slow writer: %d %s", resp.StatusCode, body)
	}

	// gRPC: the HTTP/2 preface written in pieces reaches gRPC's transport,
	// which answers with its SETTINGS frame.
	g, err := net.Dial("tcp", e.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	g.SetDeadline(time.Now().Add(30 * time.Second))
	for _, part := range []string{"P", "RI", " * HTTP/2.0\r\n\r\nSM\r\n\r\n", "\x00\x00\x00\x04\x00\x00\x00\x00\x00"} {
		if _, err := g.Write([]byte(part)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	var hdr [9]byte
	if _, err := io.ReadFull(g, hdr[:]); err != nil {
		t.Fatalf("no HTTP/2 frame from the gRPC side: %v", err)
	}
	if hdr[3] != 0x4 { // SETTINGS
		t.Fatalf("first frame type %d, want SETTINGS", hdr[3])
	}

	// The Go gRPC client on the same port, while the silent peer waits.
	conn, err := grpc.NewClient(e.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	tp, err := pubsubpb.NewPublisherClient(conn).GetTopic(ctx, &pubsubpb.GetTopicRequest{Topic: e.topicName(e.id("split"))})
	if err != nil {
		t.Fatal(err)
	}
	if tp.GetName() != e.topicName(e.id("split")) {
		t.Fatalf("gRPC GetTopic: %v", tp)
	}
	// Keep-alive: several requests on one HTTP/1.1 connection.
	rc := newRESTClient(t, e.addr)
	for range 3 {
		rc.do("GET", "/v1/projects/"+e.project+"/topics/"+e.id("split"), nil).wantOK(t, "keep-alive")
	}
}

// TestRESTDisabled: with DisableREST the port is gRPC only; an HTTP/1.1
// request gets no REST answer.
func TestRESTDisabled(t *testing.T) {
	e := startEnv(t, withGCP(func(o *gcp.Options) { o.Config.DisableREST = true }))
	hc := &http.Client{Timeout: 10 * time.Second}
	resp, err := hc.Get("http://" + e.addr + "/v1/projects/" + e.project + "/topics")
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Fatal("REST answered with DisableREST")
		}
	}
	conn, err := grpc.NewClient(e.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := pubsubpb.NewPublisherClient(conn).ListTopics(ctxT(t, 30*time.Second), &pubsubpb.ListTopicsRequest{Project: "projects/" + e.project}); err != nil {
		t.Fatal(err)
	}
}

// TestRESTShutdownDuringPull: a REST pull waiting for messages when the
// server shuts down is answered, and Shutdown returns.
func TestRESTShutdownDuringPull(t *testing.T) {
	e := startEnv(t)
	c := newRESTClient(t, e.addr)
	p := "/v1/projects/" + e.project
	c.do("PUT", p+"/topics/"+e.id("sd"), map[string]any{}).wantOK(t, "topic")
	c.do("PUT", p+"/subscriptions/"+e.id("sd"), map[string]any{"topic": e.topicName(e.id("sd"))}).wantOK(t, "sub")
	done := make(chan restReply, 1)
	go func() {
		req, _ := http.NewRequest("POST", c.base+p+"/subscriptions/"+e.id("sd")+":pull", strings.NewReader(`{"maxMessages":1}`))
		req.Header.Set("Content-Type", "application/json")
		resp, err := c.hc.Do(req)
		if err != nil {
			done <- restReply{status: -1, raw: err.Error()}
			return
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		done <- restReply{status: resp.StatusCode, raw: string(raw)}
	}()
	time.Sleep(500 * time.Millisecond) // the pull is waiting
	stopped := make(chan struct{})
	go func() { e.stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(30 * time.Second):
		t.Fatal("Shutdown did not return with a REST pull waiting")
	}
	select {
	case r := <-done:
		if r.status != 200 && r.status != 503 {
			t.Fatalf("pull during shutdown: %d %s", r.status, r.raw)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the REST pull was not answered")
	}
}
