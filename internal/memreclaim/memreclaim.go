// Package memreclaim gives a burst's memory back once the process is quiet.
//
// The Go runtime collects garbage when the heap has grown by GOGC percent since the last
// collection, and otherwise only every two minutes. After a burst (a backlog drained, a
// flood of publishes) the burst's garbage and the pages it sits on therefore stay for up to
// two minutes once allocation slows, and the process's RSS with them: a sidecar with a
// memory limit looks, for that time, as big as its busiest moment. Run checks the runtime's
// own figures every interval and, when no collection has run since the last check while the
// heap holds well more than the last collection found live, collects and returns the freed
// pages to the operating system at once.
package memreclaim

import (
	"context"
	"runtime/debug"
	"runtime/metrics"
	"time"
)

// Figures the check reads (runtime/metrics).
const (
	mCycles  = "/gc/cycles/total:gc-cycles"
	mLive    = "/gc/heap/live:bytes"                // live heap found by the last collection
	mObjects = "/memory/classes/heap/objects:bytes" // heap objects now, garbage not yet collected included
	mFree    = "/memory/classes/heap/free:bytes"    // free heap pages not yet returned to the OS
)

// Run checks every interval until ctx ends, and collects when the last interval saw no
// collection while the heap's objects and free pages exceed the live heap by more than
// slack bytes (or a quarter of the live heap, when that is more: a big live heap is not
// collected again and again for a little garbage). It returns when ctx ends.
func Run(ctx context.Context, interval time.Duration, slack uint64) {
	t := time.NewTicker(interval)
	defer t.Stop()
	s := []metrics.Sample{{Name: mCycles}, {Name: mLive}, {Name: mObjects}, {Name: mFree}}
	var lastCycles uint64
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		metrics.Read(s)
		if Due(s[0].Value.Uint64(), lastCycles, s[1].Value.Uint64(), s[2].Value.Uint64()+s[3].Value.Uint64(), slack) {
			debug.FreeOSMemory() // a collection, then the free pages returned
			metrics.Read(s)
		}
		lastCycles = s[0].Value.Uint64()
	}
}

// Due reports whether a quiet process holds enough reclaimable memory to collect now: no
// collection ran since the last check (cycles == last), and the heap (objects and free
// pages) exceeds the live heap by more than slack or a quarter of the live heap.
func Due(cycles, last, live, heap, slack uint64) bool {
	return cycles == last && heap > live+max(slack, live/4)
}
