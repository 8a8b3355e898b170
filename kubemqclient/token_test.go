package kubemqclient_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/kubemq-io/kubemq-proxy/embedded"
	"github.com/kubemq-io/kubemq-proxy/internal/kubemqtest"
	kc "github.com/kubemq-io/kubemq-proxy/kubemqclient"
)

// authLog records the authorization metadata of every call by method.
type authLog struct {
	mu   sync.Mutex
	seen map[string][]string // method suffix -> authorization values, one entry per call
}

func (a *authLog) record(ctx context.Context, method string) {
	md, _ := metadata.FromIncomingContext(ctx)
	v := strings.Join(md.Get("authorization"), ",")
	a.mu.Lock()
	a.seen[method[strings.LastIndex(method, "/")+1:]] = append(a.seen[method[strings.LastIndex(method, "/")+1:]], v)
	a.mu.Unlock()
}

func (a *authLog) last(method string) (string, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	v := a.seen[method]
	if len(v) == 0 {
		return "", false
	}
	return v[len(v)-1], true
}

func startAuthLogged(t *testing.T) (string, *authLog) {
	a := &authLog{seen: map[string][]string{}}
	addr, _ := kubemqtest.StartEmbedded(t, embedded.Options{Strict: true, ServerOptions: []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			a.record(ctx, info.FullMethod)
			return h(ctx, req)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			a.record(ss.Context(), info.FullMethod)
			return h(srv, ss)
		}),
	}})
	return addr, a
}

func TestAuthToken(t *testing.T) {
	for _, tc := range []struct {
		name, def, ctxTok string
		useCtx            bool
		want              string
	}{
		{name: "none", want: ""},
		{name: "config", def: "cfg-token", want: "cfg-token"},
		{name: "context overrides config", def: "cfg-token", ctxTok: "conn-token", useCtx: true, want: "conn-token"},
		{name: "context without config", ctxTok: "conn-token", useCtx: true, want: "conn-token"},
		{name: "empty context token sends none", def: "cfg-token", useCtx: true, want: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr, a := startAuthLogged(t)
			c, err := kc.Dial(context.Background(), kc.Options{Address: addr, AuthToken: tc.def})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if err := c.WaitReady(timeout(t, 10*time.Second)); err != nil {
				t.Fatal(err)
			}
			if got, ok := a.last("Ping"); !ok || got != tc.def {
				t.Errorf("health ping carried %q (seen %v), want the configured %q", got, ok, tc.def)
			}
			ctx := timeout(t, 10*time.Second)
			if tc.useCtx {
				ctx = kc.WithToken(ctx, tc.ctxTok)
			}
			// Caller metadata survives, and authorization is set once.
			ctx = metadata.AppendToOutgoingContext(ctx, "x-other", "1")
			if _, err := c.SendQueueMessages(ctx, []kc.QueueMessage{{Channel: fresh(t, "q"), Body: []byte("x")}}); err != nil {
				t.Fatal(err)
			}
			if got, _ := a.last("SendQueueMessagesBatch"); got != tc.want {
				t.Errorf("send carried authorization %q, want %q", got, tc.want)
			}
		})
	}
}
