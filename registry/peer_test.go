package registry_test

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/kubemq-io/kubemq-proxy/internal/kubemqtest"
	"github.com/kubemq-io/kubemq-proxy/kubemqclient"
	"github.com/kubemq-io/kubemq-proxy/registry"
	"github.com/kubemq-io/kubemq-proxy/registry/registrypb"
)

// servePeer serves r's peer service on a loopback port and returns a
// connection to it; with r nil, a server without the service (a replica of
// an older version).
func servePeer(t testing.TB, r *registry.Registry) (string, *grpc.ClientConn) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	if r != nil {
		registry.RegisterPeer(srv, r)
	}
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return lis.Addr().String(), conn
}

// A writer's Propagate returns once the other replica, which reads the log
// late, has read the write: a lookup there right after finds it, without
// catching up itself.
func TestPropagate(t *testing.T) {
	addr := kubemqtest.Address(t)
	ch := uniqueChannel(t)
	a := open(t, dial(t, addr), ch)
	defer a.Close()
	b := openLate(t, dial(t, addr), ch, 150*time.Millisecond)
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	baddr, bconn := servePeer(t, b)
	peers := map[string]grpc.ClientConnInterface{baddr: bconn}
	if err := a.Propagate(ctx, peers); err != nil {
		t.Fatalf("nothing written yet: %v", err)
	}
	for i := range 3 {
		key := fmt.Sprintf("q%d", i)
		if err := a.Put(ctx, "queue", key, key); err != nil {
			t.Fatal(err)
		}
		if _, ok := value(t, b, "queue", key); ok {
			t.Fatalf("%s: b saw the write before reading the log (the delay did not hold it back)", key)
		}
		if err := a.Propagate(ctx, peers); err != nil {
			t.Fatal(err)
		}
		if v, ok := value(t, b, "queue", key); !ok || v != key {
			t.Fatalf("%s: after Propagate b has %q, %v", key, v, ok)
		}
	}
	if err := a.Delete(ctx, "queue", "q0"); err != nil {
		t.Fatal(err)
	}
	if err := a.Propagate(ctx, peers); err != nil {
		t.Fatal(err)
	}
	if _, ok := value(t, b, "queue", "q0"); ok {
		t.Fatal("after Propagate b still has the deleted q0")
	}

	// A version nobody wrote: WaitRead ends at the caller's deadline, and
	// Propagate reports the replica.
	short, cancel2 := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel2()
	_, err := registrypb.NewRegistryPeerClient(bconn).WaitRead(short, &registrypb.WaitReadRequest{Writer: "nobody", Version: 1})
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("WaitRead of a write never made: %v, want DEADLINE_EXCEEDED", err)
	}
	if _, err := registrypb.NewRegistryPeerClient(bconn).WaitRead(ctx, &registrypb.WaitReadRequest{}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("WaitRead without a writer: %v, want INVALID_ARGUMENT", err)
	}
	// A replica of an older version, without the service: not waited for.
	oaddr, oconn := servePeer(t, nil)
	if err := a.Propagate(ctx, map[string]grpc.ClientConnInterface{oaddr: oconn, baddr: bconn}); err != nil {
		t.Fatalf("Propagate with a replica that lacks the service: %v", err)
	}
	// A replica that is gone: an error naming it, within PropagateWait.
	dead, err := grpc.NewClient("127.0.0.1:1", grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer dead.Close()
	start := time.Now()
	err = a.Propagate(ctx, map[string]grpc.ClientConnInterface{"127.0.0.1:1": dead, baddr: bconn})
	if err == nil || time.Since(start) > registry.PropagateWait+time.Second {
		t.Fatalf("Propagate with a gone replica: %v after %v", err, time.Since(start))
	}
}

// BenchmarkPropagate is what a topology change costs with one other
// replica: a write alone, and a write the other replica confirms it has
// read (Propagate over a loopback peer connection).
func BenchmarkPropagate(b *testing.B) {
	addr := kubemqtest.Address(b)
	ch := kubemqclient.Channel("kubemq-proxy-test.registry", "benchprop", time.Now().Format("150405.000000000"))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	openB := func() *registry.Registry {
		r, err := registry.Open(ctx, registry.Options{Client: dial(b, addr), Channel: ch})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(r.Close)
		if err := r.WaitReplayed(ctx); err != nil {
			b.Fatal(err)
		}
		return r
	}
	w, other := openB(), openB()
	oaddr, conn := servePeer(b, other)
	peers := map[string]grpc.ClientConnInterface{oaddr: conn}
	for _, propagate := range []bool{false, true} {
		name := "write"
		if propagate {
			name = "write+propagate"
		}
		b.Run(name, func(b *testing.B) {
			for i := range b.N {
				if err := w.Put(ctx, "queue", fmt.Sprintf("q%d", i%100), i); err != nil {
					b.Fatal(err)
				}
				if propagate {
					if err := w.Propagate(ctx, peers); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}
