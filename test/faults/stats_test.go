package faults

import (
	"fmt"
	"strings"
	"time"

	"github.com/kubemq-io/kubemq-proxy/internal/proctest"
)

// procStats is one /metrics sample of the proxy process, as a value the
// soak's averages and peaks can add up.
type procStats struct {
	At         time.Time
	Goroutines float64
	RSS        float64 // bytes
	FDs        float64
}

func (s procStats) String() string {
	return fmt.Sprintf("goroutines=%.0f rss=%.1fMiB fds=%.0f", s.Goroutines, s.RSS/(1<<20), s.FDs)
}

// scrape reads the standard Go and process collectors from /metrics; the
// open descriptors are required too, for the soak's leak check.
func scrape(httpAddr string) (procStats, error) {
	m, err := proctest.Scrape(httpAddr, proctest.MetricFDs)
	if err != nil {
		return procStats{}, err
	}
	return procStats{At: time.Now(), Goroutines: m.Goroutines(), RSS: m.RSS(), FDs: m.FDs()}, nil
}

// metricLines returns the proxy's own metric samples (kubemq_proxy_*,
// histogram buckets left out) for a failure report.
func metricLines(httpAddr string) string {
	lines, err := proctest.ScrapeLines(httpAddr)
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, line := range lines {
		if strings.HasPrefix(line, "kubemq_proxy_") && !strings.Contains(line, "_bucket{") {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}
