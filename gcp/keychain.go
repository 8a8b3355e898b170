package gcp

import "sync"

// Ordering keys on a KubeMQ that hands a queue out in another order than it
// stored it (docs/kubemq.md 10.6: an answered send may become visible to a
// Get after a later send's messages).
//
// Each copy of a keyed message that this process stores in an ordered
// subscription carries the id of the previous message of its key that this
// process stored there (TagPrevID). The subscription's holder, when a
// message arrives whose previous one it has not seen although it has seen
// earlier ones of the same process and key, holds the key back until that
// message arrives, at most chainWait (ordering.go awaitPrevLocked). The
// chain is per process (ids of one process share a prefix) and per
// subscription (a filter leaves messages out of some), and it is kept for
// at most maxChains keys at once: past that it starts over, and the next
// copy of a key carries no link.

// maxChains bounds the keys keyChains remembers.
const maxChains = 10_000

// keyChains is the last message id this process stored per subscription
// queue and ordering key.
type keyChains struct {
	mu   sync.Mutex
	last map[chainKey]string
}

type chainKey struct{ queue, key string }

// chainLink is one copy's place in its key's chain: prev is what the
// chain held before id.
type chainLink struct {
	k        chainKey
	prev, id string
}

// link records id as the latest message of key stored in queue and
// returns the link (prev: the one before, "" when unknown).
func (c *keyChains) link(queue, key, id string) chainLink {
	k := chainKey{queue, key}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.last == nil || len(c.last) >= maxChains {
		c.last = make(map[chainKey]string)
	}
	l := chainLink{k: k, prev: c.last[k], id: id}
	c.last[k] = id
	return l
}

// unlink undoes links whose messages were not stored, newest first, where
// no later message of the key was linked meanwhile.
func (c *keyChains) unlink(ls []chainLink) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := len(ls) - 1; i >= 0; i-- {
		l := ls[i]
		if c.last[l.k] != l.id {
			continue
		}
		if l.prev == "" {
			delete(c.last, l.k)
		} else {
			c.last[l.k] = l.prev
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
