package gcp

import (
	"sync"
	"time"
)

// Ordering keys on a KubeMQ that hands a queue out in another order than it
// stored it (docs/kubemq.md 10.6: an answered send may become visible to a
// Get after a later send's messages).
//
// Each copy of a keyed message that this process stores in an ordered
// subscription carries the id of the previous message of its key that this
// process stored there (TagPrevID), when that one was stored within
// chainSpan before it. The subscription's holder, when a message arrives
// whose previous one it has not seen, holds the key back until that message
// arrives, at most chainWait (ordering.go awaitPrevLocked), where it can
// tell that it should have seen it: it has seen earlier ones of the same
// process and key, or it has seen every message stored since before the
// previous one was (the message was published more than chainSpan, plus
// clockSkew, after the runtime began). The chain is per process (ids of one
// process share a prefix) and per subscription (a filter leaves messages
// out of some), and it is kept for at most maxChains keys at once: past
// that it starts over, and the next copy of a key carries no link.

// maxChains bounds the keys keyChains remembers.
const maxChains = 10_000

// chainSpan is how recent the previous message of a key must be for a copy
// to name it: an answered send that KubeMQ makes visible late is late by
// much less (chainWait bounds the wait for it anyway), and the bound lets
// a holder that started lately know which named messages it must have seen.
const chainSpan = 10 * time.Second

// keyChains is the last message id this process stored per subscription
// queue and ordering key, and when.
type keyChains struct {
	mu   sync.Mutex
	last map[chainKey]chained
}

type chainKey struct{ queue, key string }

// chained is a message in its key's chain: its id and when it was stored.
type chained struct {
	id string
	at time.Time
}

// chainLink is one copy's place in its key's chain: before is what the
// chain held before id, prev the id the copy names (before's, when it is
// recent enough, else "").
type chainLink struct {
	k        chainKey
	before   chained
	prev, id string
}

// link records id, stored at now, as the latest message of key stored in
// queue and returns the link.
func (c *keyChains) link(queue, key, id string, now time.Time) chainLink {
	k := chainKey{queue, key}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.last == nil || len(c.last) >= maxChains {
		c.last = make(map[chainKey]chained)
	}
	l := chainLink{k: k, before: c.last[k], id: id}
	if l.before.id != "" && now.Sub(l.before.at) <= chainSpan {
		l.prev = l.before.id
	}
	c.last[k] = chained{id, now}
	return l
}

// unlink undoes links whose messages were not stored, newest first, where
// no later message of the key was linked meanwhile.
func (c *keyChains) unlink(ls []chainLink) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := len(ls) - 1; i >= 0; i-- {
		l := ls[i]
		if c.last[l.k].id != l.id {
			continue
		}
		if l.before.id == "" {
			delete(c.last, l.k)
		} else {
			c.last[l.k] = l.before
		}
	}
}

// withTag is a copy of tags with k set to v (the stored tags are shared
// by the topic log's event and every subscription's copy).
func withTag(tags map[string]string, k, v string) map[string]string {
	out := make(map[string]string, len(tags)+1)
	for tk, tv := range tags {
		out[tk] = tv
	}
	out[k] = v
	return out
}
