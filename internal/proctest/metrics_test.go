package proctest

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func serveMetrics(t *testing.T, status int, body string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		w.WriteHeader(status)
		w.Write([]byte(body))
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

const sample = `# HELP go_goroutines Number of goroutines.
# TYPE go_goroutines gauge
go_goroutines 42
go_memstats_heap_inuse_bytes 4.194304e+06
process_open_fds 17
process_resident_memory_bytes 2.097152e+07

kubemq_proxy_amqp_connections{vhost="/"} 3
kubemq_proxy_amqp_connections{vhost="a b"} 4
kubemq_proxy_publish_seconds_bucket{le="0.1"} 9
`

func TestScrape(t *testing.T) {
	m, err := Scrape(serveMetrics(t, 200, sample), MetricFDs)
	if err != nil {
		t.Fatal(err)
	}
	if m.Goroutines() != 42 || m.Heap() != 4<<20 || m.FDs() != 17 || m.RSS() != 20<<20 {
		t.Errorf("goroutines %v heap %v fds %v rss %v", m.Goroutines(), m.Heap(), m.FDs(), m.RSS())
	}
	if got := m["kubemq_proxy_amqp_connections"]; got != 7 {
		t.Errorf("summed over labels: %v, want 7", got)
	}
	if got := m[`kubemq_proxy_amqp_connections{vhost="a b"}`]; got != 4 {
		t.Errorf("labelled series with a space: %v, want 4", got)
	}
}

func TestScrapeMissingMetric(t *testing.T) {
	addr := serveMetrics(t, 200, "go_goroutines 1\nprocess_resident_memory_bytes 2\n")
	if _, err := Scrape(addr); err != nil {
		t.Fatalf("Scrape without need: %v", err)
	}
	if _, err := Scrape(addr, MetricFDs); err == nil || !strings.Contains(err.Error(), MetricFDs) {
		t.Fatalf("Scrape(need fds) = %v, want it named as missing", err)
	}
	if _, err := Scrape(serveMetrics(t, 200, "process_resident_memory_bytes 2\n")); err == nil || !strings.Contains(err.Error(), MetricGoroutines) {
		t.Fatalf("err = %v, want go_goroutines missing", err)
	}
}

func TestScrapeStatus(t *testing.T) {
	if _, err := Scrape(serveMetrics(t, 503, sample)); err == nil || !strings.Contains(err.Error(), "503") {
		t.Fatalf("err = %v, want the status", err)
	}
}

func TestScrapeLines(t *testing.T) {
	lines, err := ScrapeLines(serveMetrics(t, 200, sample))
	if err != nil {
		t.Fatal(err)
	}
	if len(lines) != 7 || lines[0] != "go_goroutines 42" || lines[6] != `kubemq_proxy_publish_seconds_bucket{le="0.1"} 9` {
		t.Errorf("lines = %q", lines)
	}
}
