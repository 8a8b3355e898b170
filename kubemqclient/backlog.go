package kubemqclient

import (
	"context"
	"sync"
	"time"
)

// backlogCache keeps the last QueuesInfo of every queue for QueuesInfoCached. mu is held
// across a refresh, so concurrent callers (two front-ends answering one scrape, a scrape
// and a management request) share one call.
type backlogCache struct {
	mu  sync.Mutex
	at  time.Time
	idx *QueuesIndex
}

// backlogTimeout bounds QueuesInfoCached's call to KubeMQ.
const backlogTimeout = 5 * time.Second

// QueuesInfoCached returns QueuesInfo of every queue as an index, asking KubeMQ at most once
// per maxAge: metrics, GET /state and the management API read per-queue backlogs from it, so
// a scrape costs one QueuesInfo call whatever the number of queues, and frequent scrapes cost
// nothing more. The time is when the answer was taken. A failed refresh is returned as the
// error and is not cached.
func (c *Client) QueuesInfoCached(ctx context.Context, maxAge time.Duration) (*QueuesIndex, time.Time, error) {
	b := &c.backlog
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.idx != nil && time.Since(b.at) < maxAge {
		return b.idx, b.at, nil
	}
	at := time.Now()
	// Bounded, and failing at once during an outage: callers share the cache's lock, and a
	// frozen server must not hold every scrape of /metrics, /state and the management API
	// behind one unanswered call.
	ctx, cancel := context.WithTimeout(FailFast(ctx), backlogTimeout)
	defer cancel()
	info, err := c.QueuesInfo(ctx)
	if err != nil {
		return nil, time.Time{}, err
	}
	b.idx, b.at = info.Index(), at
	return b.idx, at, nil
}

// QueuesIndex is a QueuesInfo indexed by name: Lookup answers as QueuesInfo.Lookup does, in
// constant time. It is read-only once built.
type QueuesIndex struct {
	info   QueuesInfo
	byName map[string][]int // positions in info.Queues by listed name
}

// Index builds the QueuesIndex of q.
func (q QueuesInfo) Index() *QueuesIndex {
	x := &QueuesIndex{info: q, byName: make(map[string][]int, len(q.Queues))}
	for i, qi := range q.Queues {
		x.byName[qi.Name] = append(x.byName[qi.Name], i)
	}
	return x
}

// Info returns the QueuesInfo the index was built from.
func (x *QueuesIndex) Info() QueuesInfo { return x.info }

// Lookup finds name's entry as QueuesInfo.Lookup does.
func (x *QueuesIndex) Lookup(name string) (QueueInfo, Listing) {
	listed := ListedQueueName(name)
	if listed != name {
		if is := x.byName[name]; len(is) > 0 {
			return x.info.Queues[is[0]], Listed
		}
	}
	switch is := x.byName[listed]; len(is) {
	case 0:
		return QueueInfo{}, NotListed
	case 1:
		return x.info.Queues[is[0]], Listed
	}
	return QueueInfo{}, Ambiguous
}

// Waiting returns the Waiting count of queue name: 0 when the server does not list it (never
// sent to), -1 when the listing is ambiguous.
func (x *QueuesIndex) Waiting(name string) int64 {
	qi, l := x.Lookup(name)
	switch l {
	case Listed:
		return qi.Waiting
	case NotListed:
		return 0
	}
	return -1
}
