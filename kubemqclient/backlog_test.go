package kubemqclient

import (
	"math/rand/v2"
	"testing"
)

// TestQueuesIndexMatchesLookup: the index answers every name as the linear Lookup does,
// including names the server lists trimmed, listed twice, or not at all.
func TestQueuesIndexMatchesLookup(t *testing.T) {
	pool := []string{"a", "_a", "a.", "Qa", "b", "amqp.v.q", "amqp.v.q.", "gcp.sub.s", "E", "x_", "x", "y"}
	r := rand.New(rand.NewPCG(1, 2))
	for range 500 {
		var info QueuesInfo
		for range r.IntN(6) {
			n := pool[r.IntN(len(pool))]
			info.Queues = append(info.Queues, QueueInfo{Name: ListedQueueName(n), Waiting: r.Int64N(100)})
			if r.IntN(3) == 0 {
				info.Queues = append(info.Queues, QueueInfo{Name: n, Waiting: r.Int64N(100)})
			}
		}
		x := info.Index()
		for _, n := range pool {
			want, wl := info.Lookup(n)
			got, gl := x.Lookup(n)
			if want != got || wl != gl {
				t.Fatalf("%q in %+v: index %+v %v, Lookup %+v %v", n, info.Queues, got, gl, want, wl)
			}
		}
	}
}
