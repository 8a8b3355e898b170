package proxy

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"

	"github.com/kubemq-io/kubemq-proxy/kubemqclient"
)

// BackendCallMetric is the histogram BackendObserver feeds.
const BackendCallMetric = "kubemq_proxy_backend_call_seconds"

// backendCallBuckets double from 50us to 13.1s: a loopback call, a batch
// stored on disk and a receive waiting out its full poll each fall inside.
var backendCallBuckets = prometheus.ExponentialBuckets(50e-6, 2, 19)

// BackendObserver returns a kubemqclient Options.Observe that records every
// KubeMQ call in the histogram kubemq_proxy_backend_call_seconds{op,result},
// registered with reg (an identical histogram already there is reused). op
// is the client's operation name (kubemqclient.ObservedOps; anything else
// becomes "other"); result is "ok" or the error's class, from a fixed set:
// the kubemqclient sentinel it matches ("unavailable", "timeout",
// "wait_expired", ...), else its gRPC code in snake case, "refused" for an
// in-band KubeMQ refusal of no known class, "other" for a non-kubemqclient
// error. A nil reg returns nil (observation off). It panics if reg holds a
// different collector of the same name, as MustRegister does.
func BackendObserver(reg prometheus.Registerer) func(op string, d time.Duration, err error) {
	if reg == nil {
		return nil
	}
	vec := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    BackendCallMetric,
		Help:    "KubeMQ calls made by the proxy: time from the call to the server's answer, by operation and result.",
		Buckets: backendCallBuckets,
	}, []string{"op", "result"})
	if err := reg.Register(vec); err != nil {
		var are prometheus.AlreadyRegisteredError
		if !errors.As(err, &are) {
			panic(fmt.Sprintf("proxy: register %s: %v", BackendCallMetric, err))
		}
		existing, ok := are.ExistingCollector.(*prometheus.HistogramVec)
		if !ok {
			panic(fmt.Sprintf("proxy: %s is registered as another kind of collector", BackendCallMetric))
		}
		vec = existing
	}
	h := &backendHist{vec: vec, ops: map[string]bool{}}
	for _, op := range kubemqclient.ObservedOps() {
		h.ops[op] = true
	}
	h.series.Store(&map[seriesKey]prometheus.Observer{})
	return h.observe
}

// backendHist resolves each (op, result) series once; the per-call path is
// a lock-free map read and the histogram's own atomic adds.
type backendHist struct {
	vec *prometheus.HistogramVec
	ops map[string]bool // read-only after construction

	mu     sync.Mutex // serialises additions to series
	series atomic.Pointer[map[seriesKey]prometheus.Observer]
}

type seriesKey struct{ op, result string }

func (h *backendHist) observe(op string, d time.Duration, err error) {
	k := seriesKey{op, backendResult(err)}
	o, ok := (*h.series.Load())[k]
	if !ok {
		o = h.add(k)
	}
	o.Observe(d.Seconds())
}

func (h *backendHist) add(k seriesKey) prometheus.Observer {
	if !h.ops[k.op] {
		k.op = "other"
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	old := *h.series.Load()
	if o, ok := old[k]; ok {
		return o
	}
	o := h.vec.WithLabelValues(k.op, k.result)
	next := make(map[seriesKey]prometheus.Observer, len(old)+1)
	for kk, v := range old {
		next[kk] = v
	}
	next[k] = o
	h.series.Store(&next)
	return o
}

// errorClasses are the kubemqclient sentinels, most specific first (an
// invalid channel also matches ErrInvalidArgument).
var errorClasses = []struct {
	err  error
	name string
}{
	{kubemqclient.ErrUnavailable, "unavailable"},
	{kubemqclient.ErrClosed, "closed"},
	{kubemqclient.ErrTimeout, "timeout"},
	{kubemqclient.ErrCanceled, "canceled"},
	{kubemqclient.ErrWaitExpired, "wait_expired"},
	{kubemqclient.ErrVisibilityExpired, "visibility_expired"},
	{kubemqclient.ErrTxNotFound, "tx_not_found"},
	{kubemqclient.ErrTxClosed, "tx_closed"},
	{kubemqclient.ErrClientIDInUse, "client_id_in_use"},
	{kubemqclient.ErrStrictMode, "strict_mode"},
	{kubemqclient.ErrInvalidChannel, "invalid_channel"},
	{kubemqclient.ErrInvalidSequence, "invalid_sequence"},
	{kubemqclient.ErrInvalidArgument, "invalid_argument"},
}

// grpcClasses name the gRPC codes of errors no sentinel matches.
var grpcClasses = [...]string{
	codes.OK:                 "refused", // in-band refusal inside an OK response
	codes.Canceled:           "canceled",
	codes.Unknown:            "unknown",
	codes.InvalidArgument:    "invalid_argument",
	codes.DeadlineExceeded:   "timeout",
	codes.NotFound:           "not_found",
	codes.AlreadyExists:      "already_exists",
	codes.PermissionDenied:   "permission_denied",
	codes.ResourceExhausted:  "resource_exhausted",
	codes.FailedPrecondition: "failed_precondition",
	codes.Aborted:            "aborted",
	codes.OutOfRange:         "out_of_range",
	codes.Unimplemented:      "unimplemented",
	codes.Internal:           "internal",
	codes.Unavailable:        "unavailable",
	codes.DataLoss:           "data_loss",
	codes.Unauthenticated:    "unauthenticated",
}

// backendResult is the result label of a call's outcome.
func backendResult(err error) string {
	if err == nil {
		return "ok"
	}
	for _, c := range errorClasses {
		if errors.Is(err, c.err) {
			return c.name
		}
	}
	var e *kubemqclient.Error
	if errors.As(err, &e) && int(e.GRPC) < len(grpcClasses) {
		return grpcClasses[e.GRPC]
	}
	return "other"
}
