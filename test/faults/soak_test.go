package faults

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// Soak leak criteria. "Before" is the fresh proxy with the topology
// declared and no client connected; "after" is the same proxy once the load
// stopped, every message settled and every client closed. Warm-up leaves
// some state behind (pollers, caches, gRPC connections to the backend), so
// the after values get slack; what must not happen is growth that keeps
// going with no load.
const (
	soakSample        = 5 * time.Second
	soakFaultEvery    = 90 * time.Second
	soakAfterWindow   = 60 * time.Second
	goroutineSlack    = 50  // absolute, on top of 25 % of before
	fdSlack           = 10  // absolute
	rssGrowthAfterMax = 0.1 // the after window's last third vs its first third
	rssGrowthAfterAbs = 8 << 20
)

// sampler scrapes the proxy's /metrics every soakSample in a phase.
type sampler struct {
	httpAddr string
	stop     chan struct{}
	done     chan struct{}

	mu      sync.Mutex // guards samples, errs
	samples map[string][]procStats
	phase   string
	errs    int
}

func newSampler(httpAddr string) *sampler {
	s := &sampler{httpAddr: httpAddr, stop: make(chan struct{}), done: make(chan struct{}), samples: map[string][]procStats{}}
	go s.loop()
	return s
}

func (s *sampler) Phase(p string) {
	s.mu.Lock()
	s.phase = p
	s.mu.Unlock()
	s.take()
}

func (s *sampler) take() {
	st, err := scrape(s.httpAddr)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.errs++ // the backend faults do not stop the proxy: count, report
		return
	}
	s.samples[s.phase] = append(s.samples[s.phase], st)
}

func (s *sampler) loop() {
	defer close(s.done)
	t := time.NewTicker(soakSample)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.take()
		}
	}
}

func (s *sampler) Stop() map[string][]procStats {
	close(s.stop)
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.samples
}

// runSoak keeps both loads running on one proxy process for d, injecting
// the faults that keep the proxy alive in turn every soakFaultEvery
// (backend unreachable, consumer stall, backend kill), then stops the load
// and watches the proxy idle. It fails on loss, and on goroutines, open
// files or RSS that keep growing once the load has stopped.
func runSoak(t *testing.T, d time.Duration) {
	began := time.Now()
	e := newEnv(t)
	smp := newSampler(e.httpAddr)
	smp.Phase("before") // a fresh proxy, no topology, no client
	r := startLoad(t, e)
	waitWarm(t, r)
	smp.Phase("load")

	var rotation []fault
	for _, f := range faults {
		if f.name == "ProxyKill" || f.killBackend && e.external {
			continue // the soak watches one proxy process
		}
		rotation = append(rotation, f)
	}
	end := began.Add(d)
	var injected []string
	for i := 0; time.Until(end) > soakFaultEvery; i++ {
		time.Sleep(soakFaultEvery / 2)
		f := rotation[i%len(rotation)]
		faultEnd := f.inject(t, r)
		ps, am := waitRecovered(t, r, faultEnd)
		injected = append(injected, f.name)
		t.Logf("soak: %s at %v; first ack/delivery after it: pubsub %v, amqp %v", f.name, faultEnd.Sub(began).Round(time.Second), ps, am)
		time.Sleep(time.Until(began.Add(time.Duration(i+1) * soakFaultEvery)))
	}
	time.Sleep(time.Until(end))

	stopPublishing(t, r)
	settle(t, r)
	r.ps.Close()
	r.am.Close()
	smp.Phase("after")
	time.Sleep(soakAfterWindow)
	samples := smp.Stop()

	checkLedger(t, "Soak", r.ps.led, recovery{}, strings.Join(injected, ","))
	checkLedger(t, "Soak", r.am.led, recovery{}, strings.Join(injected, ","))
	checkSoakStats(t, samples)
	e.stop()
	t.Logf("soak: %v of load with %d faults (%s), run took %v", d, len(injected), strings.Join(injected, ", "), time.Since(began).Round(time.Second))
}

func checkSoakStats(t *testing.T, samples map[string][]procStats) {
	t.Helper()
	before, load, after := samples["before"], samples["load"], samples["after"]
	if len(before) == 0 || len(load) < 4 || len(after) < 6 {
		t.Fatalf("too few /metrics samples: before %d, load %d, after %d", len(before), len(load), len(after))
	}
	b := before[0]
	q := len(load) / 4
	addStats("Soak               proxy before: %v | load 25%%: %v | load end: %v | peak rss %.1fMiB goroutines %.0f | after: first %v, last %v (%d samples over %v)",
		b, load[q], load[len(load)-1], peak(load, func(s procStats) float64 { return s.RSS })/(1<<20),
		peak(load, func(s procStats) float64 { return s.Goroutines }), after[0], after[len(after)-1], len(after), soakAfterWindow)

	var series []string
	for _, s := range after {
		series = append(series, fmt.Sprintf("%.0f/%.1f/%.0f", s.Goroutines, s.RSS/(1<<20), s.FDs))
	}
	addStats("Soak               after the load, every %v (goroutines/RSS MiB/fds): %s", soakSample, strings.Join(series, " "))

	last := after[len(after)-1]
	if limit := b.Goroutines*1.25 + goroutineSlack; last.Goroutines > limit {
		t.Errorf("goroutines after the load: %.0f, before it %.0f (limit %.0f): a goroutine leak", last.Goroutines, b.Goroutines, limit)
	}
	if limit := b.FDs + fdSlack; last.FDs > limit {
		t.Errorf("open fds after the load: %.0f, before it %.0f (limit %.0f): a descriptor leak", last.FDs, b.FDs, limit)
	}
	third := len(after) / 3
	first, final := mean(after[:third]), mean(after[len(after)-third:])
	if final.RSS > first.RSS*(1+rssGrowthAfterMax) && final.RSS-first.RSS > rssGrowthAfterAbs {
		t.Errorf("RSS keeps growing with no load: %.1fMiB -> %.1fMiB over %v", first.RSS/(1<<20), final.RSS/(1<<20), soakAfterWindow)
	}
	if final.Goroutines > first.Goroutines+5 {
		t.Errorf("goroutines keep growing with no load: %.0f -> %.0f over %v", first.Goroutines, final.Goroutines, soakAfterWindow)
	}
}

func peak(ss []procStats, f func(procStats) float64) float64 {
	m := 0.0
	for _, s := range ss {
		m = max(m, f(s))
	}
	return m
}

func mean(ss []procStats) procStats {
	var m procStats
	for _, s := range ss {
		m.Goroutines += s.Goroutines
		m.RSS += s.RSS
		m.FDs += s.FDs
	}
	n := float64(len(ss))
	m.Goroutines, m.RSS, m.FDs = m.Goroutines/n, m.RSS/n, m.FDs/n
	return m
}
