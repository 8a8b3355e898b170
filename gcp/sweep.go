package gcp

import (
	"container/heap"
	"time"
)

// sweep expires ack deadlines and ends ordered backoffs.
func (r *subRuntime) sweep() {
	defer r.wg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		r.mu.Lock()
		sentinel := r.sentinel
		var expired []failure
		now := time.Now()
		for len(r.heap) > 0 && !r.heap[0].deadline.After(now) {
			l := heap.Pop(&r.heap).(*lease)
			switch l.state {
			case leaseOut:
				expired = append(expired, failure{l, l.gen})
			case leaseBackoff:
				l.state = leaseReady
				r.ready = append(r.ready, l)
				if ks := r.keys[l.key]; ks != nil {
					r.advanceKeyLocked(l.key, ks, now) // its key's later messages follow it
				}
				r.notifyLocked()
			}
		}
		next := time.Hour
		if len(r.heap) > 0 {
			next = time.Until(r.heap[0].deadline)
		}
		if r.recoveringLocked(now) {
			r.releaseKeysLocked(now)
			next = min(next, recoveryTick)
		}
		idle := len(r.leases) == 0
		r.mu.Unlock()
		if idle {
			r.s.retireIdle(r, now)
			next = min(next, r.s.cfg.RuntimeIdle/4)
		}
		// Expired leases were popped; fail wants them out, so they go
		// through it with a fresh look under the lock.
		if len(expired) > 0 {
			r.expired.Add(float64(len(expired)))
			r.fail(expired, true)
		}
		timer.Reset(next)
		select {
		case <-r.done:
			return
		case <-r.wake:
			if !timer.Stop() {
				<-timer.C
			}
		case <-sentinel:
			if !timer.Stop() {
				<-timer.C
			}
			r.mu.Lock()
			r.sentinelBackLocked(sentinel, time.Now())
			r.mu.Unlock()
		case <-timer.C:
		}
	}
}

// leaseHeap orders leases by deadline.
type leaseHeap []*lease

func (h leaseHeap) Len() int { return len(h) }

func (h leaseHeap) Less(i, j int) bool { return h[i].deadline.Before(h[j].deadline) }

func (h leaseHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].hidx = i
	h[j].hidx = j
}

func (h *leaseHeap) Push(x any) {
	l := x.(*lease)
	l.hidx = len(*h)
	*h = append(*h, l)
}

func (h *leaseHeap) Pop() any {
	old := *h
	l := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	l.hidx = -1
	return l
}
