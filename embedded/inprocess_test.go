package embedded_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kubemq-io/kubemq-proxy/embedded"
	pb "github.com/kubemq-io/kubemq-proxy/kubemqpb"
)

// TestDialInProcess: the same API through memory; dialling after Stop fails.
func TestDialInProcess(t *testing.T) {
	srv, err := embedded.New(embedded.Options{Strict: true, DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient("passthrough:///embedded", grpc.WithContextDialer(srv.DialInProcess),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := pb.NewKubemqClient(conn)
	if _, err := c.Ping(ctx, &pb.Empty{}); err != nil {
		t.Fatal(err)
	}
	res, err := c.SendQueueMessage(ctx, &pb.QueueMessage{MessageID: "m1", ClientID: "c", Channel: "q", Body: []byte("x")})
	if err != nil || res.IsError {
		t.Fatalf("send: %v %v", res, err)
	}
	got, err := c.ReceiveQueueMessages(ctx, &pb.ReceiveQueueMessagesRequest{RequestID: "r", ClientID: "c", Channel: "q", MaxNumberOfMessages: 1, WaitTimeSeconds: 1})
	if err != nil || len(got.Messages) != 1 || string(got.Messages[0].Body) != "x" {
		t.Fatalf("receive: %v %v", got, err)
	}
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.DialInProcess(ctx, ""); err == nil {
		t.Fatal("dial after Stop succeeded")
	}
}
