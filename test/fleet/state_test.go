package fleet

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kubemq-io/kubemq-proxy/internal/proctest"
)

// state is the part of a replica's GET /state these tests read.
type state struct {
	Queues []struct {
		Queue string `json:"Queue"`
	} `json:"queues"`
	Frontends struct {
		GCP struct {
			Subscriptions []struct {
				ID    string `json:"id"`
				Queue string `json:"queue"`
			} `json:"subscriptions"`
		} `json:"gcp"`
	} `json:"frontends"`
}

func (r *replica) state(t testing.TB) state {
	t.Helper()
	resp, err := http.Get("http://" + r.addr("http") + "/state")
	if err != nil {
		t.Fatalf("%s: /state: %v", r.name, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: /state: %v %s %s", r.name, err, resp.Status, b)
	}
	var s state
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatalf("%s: /state: %v", r.name, err)
	}
	return s
}

// subQueue is the KubeMQ queue behind subscription sub (projects/p/subscriptions/id).
func (f *fleet) subQueue(t testing.TB, sub string) string {
	t.Helper()
	id := sub[strings.LastIndex(sub, "/")+1:]
	for _, s := range f.replicas[0].state(t).Frontends.GCP.Subscriptions {
		if s.ID == id || s.ID == sub {
			return s.Queue
		}
	}
	t.Fatalf("subscription %s not in %s's /state", sub, f.replicas[0].name)
	return ""
}

// holder waits until exactly one running replica consumes the KubeMQ queue whose name is or
// ends with q (its delivery engine has a consumer of it), and returns it.
func (f *fleet) holder(t testing.TB, q string, d time.Duration) *replica {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		var hs []*replica
		for _, r := range f.replicas {
			if r.p.Exited() {
				continue
			}
			for _, s := range r.state(t).Queues {
				if strings.HasSuffix(s.Queue, q) {
					hs = append(hs, r)
				}
			}
		}
		if len(hs) == 1 {
			return hs[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("queue %s: %d replicas consume it after %v, want 1", q, len(hs), d)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// forwarded is how many Subscriber calls r forwarded to another replica so far.
func (r *replica) forwarded(t testing.TB) float64 {
	t.Helper()
	m, err := proctest.Scrape(r.addr("http"), "kubemq_proxy_gcp_forwarded_calls_total")
	if err != nil {
		t.Fatalf("%s: %v", r.name, err)
	}
	return m["kubemq_proxy_gcp_forwarded_calls_total"]
}

func (f *fleet) others(r *replica) []*replica {
	var out []*replica
	for _, o := range f.replicas {
		if o != r {
			out = append(out, o)
		}
	}
	return out
}

func (r *replica) String() string { return fmt.Sprintf("%s (gcp %s, amqp %s)", r.name, r.gcp, r.amqp) }
