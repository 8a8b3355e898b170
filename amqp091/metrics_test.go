package amqp091

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// metricsEnv is an option giving the server its own Prometheus registry.
func metricsEnv(reg *prometheus.Registry) func(*Options) {
	return func(o *Options) { o.Metrics = reg }
}

// metricValue reads one series of the registry: the counter or gauge
// named name (without the kubemq_proxy_amqp_ prefix) whose labels include
// labels (name, value pairs). A missing series reads 0.
func metricValue(t testing.TB, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "kubemq_proxy_amqp_"+name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, l := range m.GetLabel() {
					if l.GetName() == labels[i] && l.GetValue() == labels[i+1] {
						found = true
					}
				}
				if !found {
					continue series
				}
			}
			if c := m.GetCounter(); c != nil {
				return c.GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return 0
}
