package cluster

import (
	"context"
	"crypto/subtle"
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/kubemq-io/kubemq-proxy/kubemqclient/wirecodec"
)

// Replicas forward work to a queue's owner over gRPC: the front-ends register their services
// on the peer server, and reach other replicas through Peers. Every peer call carries the
// cluster's shared secret, and the peer server refuses any call without it, so the peer port is
// never open to whoever can reach it.

// peerTokenKey is the metadata key of the shared secret.
const peerTokenKey = "kubemq-proxy-peer-token"

// ForwardedKey marks a call one replica forwarded to another: the receiver serves it itself,
// and never forwards it again.
const ForwardedKey = "kubemq-proxy-forwarded"

// PeerOptions configure the peer server and clients.
type PeerOptions struct {
	// Secret is shared by every replica; required.
	Secret string
	// ServerTLS, if set, makes the peer server speak TLS (for example mTLS with
	// ClientAuth RequireAndVerifyClientCert).
	ServerTLS *tls.Config
	// ClientTLS, if set, is used to dial other replicas.
	ClientTLS *tls.Config
	// Fast, if set, are hand-written encoders and decoders the codec of both ends tries before
	// protobuf's (wirecodec.CodecWith, whose buffer pool then serves the transport too); the
	// bytes on the wire are the same either way.
	Fast *wirecodec.Fast
}

// ErrNoSecret: the peer port needs a shared secret.
var ErrNoSecret = errors.New("cluster: the peer port needs a shared secret (cluster.secret)")

// NewPeerServer builds the gRPC server of the peer port: it checks the shared secret on every
// call before the given interceptors run.
func NewPeerServer(o PeerOptions, unary []grpc.UnaryServerInterceptor, stream []grpc.StreamServerInterceptor) (*grpc.Server, error) {
	if o.Secret == "" {
		return nil, ErrNoSecret
	}
	check := func(ctx context.Context) error {
		md, _ := metadata.FromIncomingContext(ctx)
		for _, v := range md.Get(peerTokenKey) {
			if subtle.ConstantTimeCompare([]byte(v), []byte(o.Secret)) == 1 {
				return nil
			}
		}
		return status.Error(codes.Unauthenticated, "kubemq-proxy peer port: missing or wrong cluster secret")
	}
	opts := []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(append([]grpc.UnaryServerInterceptor{func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if err := check(ctx); err != nil {
				return nil, err
			}
			return h(ctx, req)
		}}, unary...)...),
		grpc.ChainStreamInterceptor(append([]grpc.StreamServerInterceptor{func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			if err := check(ss.Context()); err != nil {
				return err
			}
			return h(srv, ss)
		}}, stream...)...),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		grpc.MaxRecvMsgSize(64 << 20),
		grpc.InitialWindowSize(peerStreamWindow),
		grpc.InitialConnWindowSize(peerConnWindow),
	}
	if o.ServerTLS != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(o.ServerTLS)))
	}
	if o.Fast != nil {
		opts = append(opts, grpc.ForceServerCodecV2(wirecodec.CodecWith(*o.Fast)), experimental.BufferPool(wirecodec.Pool()))
	}
	return grpc.NewServer(opts...), nil
}

// HTTP/2 flow-control windows of the peer port, both ways. gRPC's default
// (64 KiB, grown by its bandwidth estimate) held a forwarded consumer's
// deliveries to about 64 KiB per round trip (BenchmarkFleet); what one link
// has in flight is bounded by the credit it grants anyway.
const (
	peerStreamWindow = 1 << 20
	peerConnWindow   = 8 << 20
)

// Forwarded reports whether the incoming call was forwarded by another replica.
func Forwarded(ctx context.Context) bool {
	md, _ := metadata.FromIncomingContext(ctx)
	return len(md.Get(ForwardedKey)) > 0
}

// Peers dials other replicas, one connection per address, kept for reuse.
type Peers struct {
	o  PeerOptions
	mu sync.Mutex
	cs map[string]*grpc.ClientConn
}

// NewPeers returns a connection pool for o.
func NewPeers(o PeerOptions) (*Peers, error) {
	if o.Secret == "" {
		return nil, ErrNoSecret
	}
	return &Peers{o: o, cs: map[string]*grpc.ClientConn{}}, nil
}

// Conn returns the connection to the replica at addr. Every call on it carries the secret and
// the forwarded mark.
func (p *Peers) Conn(addr string) (grpc.ClientConnInterface, error) {
	if addr == "" || strings.ContainsAny(addr, " \t\n") {
		return nil, status.Errorf(codes.Unavailable, "kubemq-proxy: the replica that consumes this queue advertises no peer address (cluster.advertise)")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if c := p.cs[addr]; c != nil {
		return c, nil
	}
	creds := insecure.NewCredentials()
	if p.o.ClientTLS != nil {
		creds = credentials.NewTLS(p.o.ClientTLS)
	}
	dopts := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			return invoker(p.outgoing(ctx), method, req, reply, cc, opts...)
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			return streamer(p.outgoing(ctx), desc, cc, method, opts...)
		}),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 5 * time.Second, PermitWithoutStream: true}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20), grpc.MaxCallSendMsgSize(64<<20)),
		grpc.WithInitialWindowSize(peerStreamWindow),
		grpc.WithInitialConnWindowSize(peerConnWindow),
	}
	if p.o.Fast != nil {
		dopts = append(dopts, grpc.WithDefaultCallOptions(grpc.ForceCodecV2(wirecodec.CodecWith(*p.o.Fast))), experimental.WithBufferPool(wirecodec.Pool()))
	}
	c, err := grpc.NewClient(addr, dopts...)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "kubemq-proxy: dial replica %s: %v", addr, err)
	}
	p.cs[addr] = c
	return c, nil
}

// Others returns connections to every other live replica of c that
// advertises a peer address, by address; err joins the replicas that could
// not be dialled.
func (p *Peers) Others(c *Cluster) (conns map[string]grpc.ClientConnInterface, err error) {
	conns = map[string]grpc.ClientConnInterface{}
	var errs []error
	for _, m := range c.Members() {
		if m.ID == c.ID() || m.Addr == "" {
			continue
		}
		cc, err := p.Conn(m.Addr)
		if err != nil {
			errs = append(errs, fmt.Errorf("replica %s: %w", m.ID, err))
			continue
		}
		conns[m.Addr] = cc
	}
	return conns, errors.Join(errs...)
}

// outgoing adds the secret and the forwarded mark to ctx, keeping the caller's own metadata
// (deadlines travel as gRPC deadlines).
func (p *Peers) outgoing(ctx context.Context) context.Context {
	return metadata.AppendToOutgoingContext(ctx, peerTokenKey, p.o.Secret, ForwardedKey, "1")
}

// Close closes every connection.
func (p *Peers) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for a, c := range p.cs {
		errs = append(errs, c.Close())
		delete(p.cs, a)
	}
	return errors.Join(errs...)
}
