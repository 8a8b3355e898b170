package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/kubemq-io/kubemq-proxy/embedded"
	"github.com/kubemq-io/kubemq-proxy/kubemqclient"
)

// healthHandlers adds /healthz (the process answers), /readyz (200 when
// ready returns nil, else 503 with the reason) and /metrics to mux: the
// part of the side port every mode of the binary serves.
func healthHandlers(mux *http.ServeMux, reg *prometheus.Registry, ready func() error) {
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if err := ready(); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte("not ready: " + err.Error() + "\n"))
			return
		}
		w.Write([]byte("ready\n"))
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
}

// EmbeddedSidePort is the HTTP side port of `kubemq-proxy embedded` (the
// backend alone): /healthz, /readyz, /metrics and Go's profiles
// (/debug/pprof/, admin only as on the proxy's side port) on http.listen. Readiness
// is the server answering its own health ping in memory (the proxy's
// client with kubemq.outage_detection's schedule), so a wedged store shows
// as 503 as a frozen process does to its clients.
type EmbeddedSidePort struct {
	log      *zap.Logger
	client   *kubemqclient.Client
	srv      *http.Server
	lis      net.Listener
	stopping atomic.Bool
	done     chan error
}

// StartEmbeddedSidePort serves the side port for srv on cfg.HTTP.Listen; ""
// serves nothing (a nil *EmbeddedSidePort, whose methods do nothing).
func StartEmbeddedSidePort(cfg Config, srv *embedded.Server, log *zap.Logger) (*EmbeddedSidePort, error) {
	if cfg.HTTP.Listen == "" {
		return nil, nil
	}
	interval, timeout, silence, backoff := cfg.KubeMQ.HealthPings()
	c, err := kubemqclient.Dial(context.Background(), kubemqclient.Options{Address: "embedded", Conn: srv.Channel(),
		ClientID: "kubemq-proxy-embedded-health", Logger: log.Named("health"),
		PingInterval: interval, PingTimeout: timeout, OutageSilence: silence, MaxBackoff: backoff})
	if err != nil {
		return nil, err
	}
	lis, err := net.Listen("tcp", cfg.HTTP.Listen)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("http.listen: %w", err)
	}
	sp := &EmbeddedSidePort{log: log, client: c, lis: lis, done: make(chan error, 1)}
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewGoCollector(), prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}))
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "kubemq_proxy", Name: "ready",
		Help: "1 while the embedded server answers its own health ping, 0 otherwise.",
	}, func() float64 {
		if sp.ready() == nil {
			return 1
		}
		return 0
	}))
	mux := http.NewServeMux()
	healthHandlers(mux, reg, sp.ready)
	profileHandlers(mux, func(h http.Handler) http.Handler { return adminGuard(cfg.HTTP.AdminToken, h) })
	sp.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	log.Info("listening", zap.String("listener", "http"), zap.String("address", lis.Addr().String()))
	go func() {
		err := sp.srv.Serve(lis)
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		sp.done <- err
	}()
	return sp, nil
}

func (sp *EmbeddedSidePort) ready() error {
	switch {
	case sp.stopping.Load():
		return errors.New("shutting down")
	case !sp.client.Ready():
		return errors.New("the embedded server does not answer its health ping")
	}
	return nil
}

// Errors delivers the listener's unexpected end (nil channel when not serving).
func (sp *EmbeddedSidePort) Errors() <-chan error {
	if sp == nil {
		return nil
	}
	return sp.done
}

// BeginShutdown turns readiness off (call it before stopping the server).
func (sp *EmbeddedSidePort) BeginShutdown() {
	if sp != nil {
		sp.stopping.Store(true)
	}
}

// Close stops the health client and the listener.
func (sp *EmbeddedSidePort) Close(ctx context.Context) {
	if sp == nil {
		return
	}
	sp.stopping.Store(true)
	sp.client.Close()
	sp.srv.Shutdown(ctx)
}
