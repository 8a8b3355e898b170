package proctest

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Metric names of the Go and process collectors that the suites read.
const (
	MetricGoroutines = "go_goroutines"
	MetricRSS        = "process_resident_memory_bytes"
	MetricHeap       = "go_memstats_heap_inuse_bytes"
	MetricFDs        = "process_open_fds"
)

// Metrics is one /metrics scrape: every sample summed over its labels, by
// metric name, and each labelled series as printed (name{k="v",...}).
type Metrics map[string]float64

// Goroutines, RSS (bytes) and FDs are the Go and process collectors'
// figures.
func (m Metrics) Goroutines() float64 { return m[MetricGoroutines] }
func (m Metrics) RSS() float64        { return m[MetricRSS] }
func (m Metrics) FDs() float64        { return m[MetricFDs] }

// Heap is the Go heap in use: unlike RSS, it falls as soon as a GC has
// freed what the clients held, so it tells a leak from pages the runtime
// has not returned to the OS yet.
func (m Metrics) Heap() float64 { return m[MetricHeap] }

// Scrape reads http://httpAddr/metrics. It fails when go_goroutines,
// process_resident_memory_bytes or any metric named in need is missing,
// since the suites' figures come from them.
func Scrape(httpAddr string, need ...string) (Metrics, error) {
	lines, err := ScrapeLines(httpAddr)
	if err != nil {
		return nil, err
	}
	m := Metrics{}
	for _, line := range lines {
		// name{labels} value: the value is the last field; label values
		// may hold spaces, so split from the right.
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		name := line[:i]
		if j := strings.IndexByte(name, '{'); j >= 0 {
			name = name[:j]
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		m[strings.TrimSpace(name)] += v
		if series := line[:i]; series != name {
			m[series] = v // the labelled series too, for breakdowns
		}
	}
	for _, name := range append([]string{MetricGoroutines, MetricRSS}, need...) {
		if _, ok := m[name]; !ok {
			return nil, fmt.Errorf("/metrics lacks %s", name)
		}
	}
	return m, nil
}

// ScrapeLines returns the sample lines of http://httpAddr/metrics as
// printed, comments and blank lines left out.
func ScrapeLines(httpAddr string) ([]string, error) {
	hc := http.Client{Timeout: 30 * time.Second} // a race-built process on a loaded machine can be slow
	resp, err := hc.Get("http://" + httpAddr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("/metrics: %s", resp.Status)
	}
	var lines []string
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if line := sc.Text(); line != "" && line[0] != '#' {
			lines = append(lines, line)
		}
	}
	return lines, sc.Err()
}

// Get fetches url (a process's side port) and returns the body of a 200 answer.
func Get(url string) ([]byte, error) {
	hc := http.Client{Timeout: 60 * time.Second}
	resp, err := hc.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return io.ReadAll(resp.Body)
}
