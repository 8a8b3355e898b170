package registry

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kubemq-io/kubemq-proxy/registry/registrypb"
)

// PropagateWait bounds how long Propagate waits for one replica.
const PropagateWait = 2 * time.Second

// RegisterPeer serves the registry's peer service (WaitRead) for r on a
// replica's peer port.
func RegisterPeer(s grpc.ServiceRegistrar, r *Registry) {
	registrypb.RegisterRegistryPeerServer(s, peerService{r: r})
}

type peerService struct {
	registrypb.UnimplementedRegistryPeerServer
	r *Registry
}

func (p peerService) WaitRead(ctx context.Context, req *registrypb.WaitReadRequest) (*registrypb.WaitReadResponse, error) {
	if req.GetWriter() == "" {
		return nil, status.Error(codes.InvalidArgument, "kubemq-proxy: no writer")
	}
	if err := p.r.WaitRead(ctx, req.GetWriter(), req.GetVersion()); err != nil {
		if ctx.Err() != nil {
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		return nil, status.Error(codes.Unavailable, "kubemq-proxy: "+err.Error())
	}
	return &registrypb.WaitReadResponse{}, nil
}

// Propagate waits until each of the other replicas (conns, by peer
// address) has read this replica's writes so far from the log (WaitRead), each for
// at most PropagateWait. A front-end calls it after a topology change and
// before it answers the client, so the client's next call through any
// replica finds the change. It returns the replicas' errors joined (a
// replica that is gone or slow); the change itself is made either way and
// reaches that replica when it reads the log. A replica without the service
// (an older version, during a rolling upgrade) is not waited for.
func (r *Registry) Propagate(ctx context.Context, conns map[string]grpc.ClientConnInterface) error {
	writer, version := r.Written()
	if version == 0 || len(conns) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, PropagateWait)
	defer cancel()
	req := &registrypb.WaitReadRequest{Writer: writer, Version: version}
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
	)
	for addr, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := registrypb.NewRegistryPeerClient(c).WaitRead(ctx, req)
			if status.Code(err) == codes.Unimplemented {
				err = nil // a replica of a version before this service (a rolling upgrade): not waited for
			}
			if err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("replica at %s: %w", addr, err))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
