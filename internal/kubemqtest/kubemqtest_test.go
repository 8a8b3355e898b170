package kubemqtest

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kubemq-io/kubemq-proxy/kubemqpb"
)

func TestAddressServesPing(t *testing.T) {
	addr := Address(t)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := kubemqpb.NewKubemqClient(conn).Ping(ctx, &kubemqpb.Empty{})
	if err != nil {
		t.Fatalf("ping %s: %v", addr, err)
	}
	if res.Version == "" {
		t.Fatalf("ping returned no version: %+v", res)
	}
}
