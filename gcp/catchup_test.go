package gcp_test

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kubemq-io/kubemq-proxy/gcp"
	"github.com/kubemq-io/kubemq-proxy/registry"
)

// noPeers stands for a fleet whose other replicas consume nothing: the
// front-ends act as replicas of one (gcp.Options.Peers set).
type noPeers struct{}

func (noPeers) Owner(string) (string, bool)                   { return "", false }
func (noPeers) Conn(string) (grpc.ClientConnInterface, error) { return nil, nil }
func (noPeers) Propagate(context.Context)                     {}

// A topic, subscription or snapshot created through one replica is there
// at once through another, however late that one reads the registry log
// (here 300 ms): a lookup that finds nothing catches up with the log
// before it answers NOT_FOUND.
func TestCreateVisibleAtOnceOnAnotherReplica(t *testing.T) {
	e := startEnv(t, withGCP(func(o *gcp.Options) { o.Peers = noPeers{} }))
	ctx := ctxT(t, 60*time.Second)
	pa, sa := rawPublisher(t, e), rawSubscriber(t, e)
	e.followDelay = 300 * time.Millisecond
	addr2, _, stop2 := e.startReplica()
	defer stop2()
	other := &env{addr: addr2}
	pb, sb := rawPublisher(t, other), rawSubscriber(t, other)

	create := func(id string) (topic, sub string) {
		topic, sub = e.topicName(e.id("t"+id)), e.subName(e.id("s"+id))
		if _, err := pa.CreateTopic(ctx, &pubsubpb.Topic{Name: topic}); err != nil {
			t.Fatal(err)
		}
		if _, err := sa.CreateSubscription(ctx, &pubsubpb.Subscription{Name: sub, Topic: topic}); err != nil {
			t.Fatal(err)
		}
		return topic, sub
	}

	topic, _ := create("1")
	if _, err := pb.GetTopic(ctx, &pubsubpb.GetTopicRequest{Topic: topic}); err != nil {
		t.Fatalf("GetTopic on the other replica: %v", err)
	}
	topic, sub := create("2")
	if _, err := pb.Publish(ctx, &pubsubpb.PublishRequest{Topic: topic, Messages: []*pubsubpb.PubsubMessage{{Data: []byte("x")}}}); err != nil {
		t.Fatalf("Publish on the other replica: %v", err)
	}
	if got := pull(t, ctx, sa, sub, 10); len(got) != 1 {
		t.Fatalf("pulled %d through the first replica", len(got))
	}
	_, sub = create("3")
	if _, err := sb.GetSubscription(ctx, &pubsubpb.GetSubscriptionRequest{Subscription: sub}); err != nil {
		t.Fatalf("GetSubscription on the other replica: %v", err)
	}
	_, sub = create("4")
	if _, err := sb.Pull(ctx, &pubsubpb.PullRequest{Subscription: sub, MaxMessages: 1, ReturnImmediately: true}); err != nil {
		t.Fatalf("Pull on the other replica: %v", err)
	}
	_, sub = create("5")
	snap := "projects/" + e.project + "/snapshots/" + e.id("snap")
	if _, err := sa.CreateSnapshot(ctx, &pubsubpb.CreateSnapshotRequest{Name: snap, Subscription: sub}); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.GetSnapshot(ctx, &pubsubpb.GetSnapshotRequest{Snapshot: snap}); err != nil {
		t.Fatalf("GetSnapshot on the other replica: %v", err)
	}
	_, sub = create("6")
	if _, err := sb.DeleteSubscription(ctx, &pubsubpb.DeleteSubscriptionRequest{Subscription: sub}); err != nil {
		t.Fatalf("DeleteSubscription on the other replica: %v", err)
	}

	_, err := pb.GetTopic(ctx, &pubsubpb.GetTopicRequest{Topic: e.topicName("no-such")})
	wantCode(t, err, codes.NotFound, "Resource not found")
}

// propagatingPeers is a fleet of the test's replicas whose only link is the
// registry's peer service: Propagate waits for the replicas in conns to
// read the first replica's writes.
type propagatingPeers struct {
	mu    sync.Mutex
	reg   *registry.Registry
	conns map[string]grpc.ClientConnInterface
}

func (*propagatingPeers) Owner(string) (string, bool)                   { return "", false }
func (*propagatingPeers) Conn(string) (grpc.ClientConnInterface, error) { return nil, nil }
func (p *propagatingPeers) Propagate(ctx context.Context) {
	p.mu.Lock()
	reg, conns := p.reg, p.conns
	p.mu.Unlock()
	if reg != nil {
		reg.Propagate(ctx, conns)
	}
}

// A subscription created through one replica gets the messages published
// through another right after, however late that one reads the registry
// log (here 400 ms): CreateSubscription answers once the other replicas
// have read it. Before, the other replica, which knew the topic, made no
// copy for the subscription it had not read yet: the message was lost to
// it.
func TestSubscriptionReachesReplicasBeforeCreateAnswers(t *testing.T) {
	pp := &propagatingPeers{}
	e := startEnv(t, withGCP(func(o *gcp.Options) { o.Peers = pp }))
	pp.mu.Lock()
	pp.reg = e.reg
	pp.mu.Unlock()
	ctx := ctxT(t, 60*time.Second)
	pa, sa := rawPublisher(t, e), rawSubscriber(t, e)
	e.followDelay = 400 * time.Millisecond
	addr2, _, stop2 := e.startReplica()
	defer stop2()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	peerSrv := grpc.NewServer()
	registry.RegisterPeer(peerSrv, e.reg)
	go peerSrv.Serve(lis)
	defer peerSrv.Stop()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	pp.mu.Lock()
	pp.conns = map[string]grpc.ClientConnInterface{lis.Addr().String(): conn}
	pp.mu.Unlock()
	pb := rawPublisher(t, &env{addr: addr2})

	topic := e.topicName(e.id("t"))
	if _, err := pa.CreateTopic(ctx, &pubsubpb.Topic{Name: topic}); err != nil {
		t.Fatal(err)
	}
	if _, err := pb.GetTopic(ctx, &pubsubpb.GetTopicRequest{Topic: topic}); err != nil {
		t.Fatalf("GetTopic on the other replica: %v", err)
	}
	for i := range 3 {
		sub := e.subName(e.id(fmt.Sprintf("s%d", i)))
		if _, err := sa.CreateSubscription(ctx, &pubsubpb.Subscription{Name: sub, Topic: topic}); err != nil {
			t.Fatal(err)
		}
		if _, err := pb.Publish(ctx, &pubsubpb.PublishRequest{Topic: topic, Messages: []*pubsubpb.PubsubMessage{{Data: []byte("x")}}}); err != nil {
			t.Fatalf("Publish on the other replica: %v", err)
		}
		if got := pull(t, ctx, sa, sub, 10); len(got) != 1 {
			t.Fatalf("%s: pulled %d of the message published through the other replica right after the create", sub, len(got))
		}
	}
}
