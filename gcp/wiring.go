package gcp

import (
	"context"
	"errors"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kubemq-io/kubemq-proxy/delivery"
	"github.com/kubemq-io/kubemq-proxy/kubemqclient"
	"github.com/kubemq-io/kubemq-proxy/registry"
)

// Options are the front-end's dependencies and knobs.
type Options struct {
	Client   *kubemqclient.Client // required
	Registry *registry.Registry   // required; should have replayed (Ready gates on it)
	// Deliveries is the lease engine on KubeMQ queues. The front-end uses
	// it with engine deadlines off (it runs Pub/Sub ack deadlines itself)
	// and sets no hooks, so it may be shared with other front-ends. nil:
	// New builds one on Client and closes it at Shutdown.
	Deliveries *delivery.Manager
	Logger     *zap.Logger // nil = no logs
	Metrics    prometheus.Registerer
	// Ready reports nil when KubeMQ is reachable and the registry has
	// replayed; while it does not, every RPC answers UNAVAILABLE.
	Ready  func() error
	Config Config
	// Peers, with several replicas on one KubeMQ (Deliveries with Owners), reaches the replica
	// that consumes a subscription; nil for one replica.
	Peers Peers
}

// New builds the front-end; nothing listens until Serve.
func New(o Options) (*Server, error) {
	if o.Client == nil || o.Registry == nil {
		return nil, errors.New("gcp: Options.Client and Options.Registry are required")
	}
	var own *delivery.Manager
	if o.Deliveries == nil {
		log := o.Logger
		if log == nil {
			log = zap.NewNop()
		}
		m, err := delivery.NewManager(delivery.NewKubeMQBackend(o.Client), delivery.Options{Logger: log}, o.Metrics)
		if err != nil {
			return nil, err
		}
		o.Deliveries, own = m, m
	}
	s, err := newServer(core{
		cfg:   o.Config,
		log:   o.Logger,
		ready: o.Ready,
		topo:  registryTopology{r: o.Registry, peers: o.Peers},
		be:    kubemqBackend{o.Client},
		watch: o.Client.OnStateChange,
		backlog: func(ctx context.Context) (*kubemqclient.QueuesIndex, error) {
			idx, _, err := o.Client.QueuesInfoCached(ctx, BacklogMaxAge)
			return idx, err
		},

		metrics: o.Metrics,

		deliveries: o.Deliveries,
		peers:      o.Peers,
	})
	if err != nil {
		if own != nil {
			own.Close(context.Background())
		}
		return nil, err
	}
	s.ownDeliveries = own
	return s, nil
}

// registryTopology adapts the registry to topology. With replicas, a write
// returns once the others have read it (Peers.Propagate).
type registryTopology struct {
	r     *registry.Registry
	peers Peers
}

func (t registryTopology) Put(ctx context.Context, kind, key string, value any) error {
	return t.written(ctx, t.r.Put(ctx, kind, key, value))
}

func (t registryTopology) Delete(ctx context.Context, kind, key string) error {
	return t.written(ctx, t.r.Delete(ctx, kind, key))
}

func (t registryTopology) putIf(ctx context.Context, kind, key string, value any, base registry.Base) error {
	return t.written(ctx, t.r.PutIf(ctx, kind, key, value, base))
}

func (t registryTopology) written(ctx context.Context, err error) error {
	if err == nil && t.peers != nil {
		t.peers.Propagate(ctx)
	}
	return err
}

func (t registryTopology) baseOf(kind, key string) registry.Base { return t.r.BaseOf(kind, key) }

func (t registryTopology) catchUp(ctx context.Context) error { return t.r.CatchUp(ctx) }

func (t registryTopology) list(kind string) []record {
	recs := t.r.List(kind)
	out := make([]record, len(recs))
	for i, r := range recs {
		out[i] = record{Key: r.Key, Value: r.Value, Deleted: r.Deleted}
	}
	return out
}

func (t registryTopology) watch(fn func(kind string, r record)) func() {
	return t.r.OnChange(func(c registry.Change) {
		fn(c.Record.Kind, record{Key: c.Record.Key, Value: c.Record.Value, Deleted: c.Record.Deleted})
	})
}
