package routing

import "strings"

// topicNode is one level of a topic exchange's binding trie. A binding key
// is split into dot-separated words; each word walks one edge: a literal
// word, "*" (exactly one word) or "#" (zero or more words). Bindings end at
// the node their last word reaches.
type topicNode struct {
	words map[string]*topicNode
	star  *topicNode
	hash  *topicNode
	dests destSet
}

func (n *topicNode) empty() bool {
	return len(n.words) == 0 && n.star == nil && n.hash == nil && len(n.dests) == 0
}

// splitWords splits a routing or binding key into words the way RabbitMQ's
// topic exchange does: "" has no words, and empty words between dots count
// ("a..b" is "a", "", "b").
func splitWords(key string, buf []string) []string {
	if key == "" {
		return buf
	}
	for {
		i := strings.IndexByte(key, '.')
		if i < 0 {
			return append(buf, key)
		}
		buf = append(buf, key[:i])
		key = key[i+1:]
	}
}

// normalizeTopicKey collapses runs of "#" words: "#.#" matches exactly what
// "#" matches, and collapsing keeps a hostile key from multiplying the work
// of every match.
func normalizeTopicKey(words []string) []string {
	out := words[:0]
	for _, w := range words {
		if w == "#" && len(out) > 0 && out[len(out)-1] == "#" {
			continue
		}
		out = append(out, w)
	}
	return out
}

// add inserts one binding of d with key.
func (n *topicNode) add(key string, d Dest) {
	var buf [16]string
	words := normalizeTopicKey(splitWords(key, buf[:0]))
	for _, w := range words {
		var next **topicNode
		switch w {
		case "*":
			next = &n.star
		case "#":
			next = &n.hash
		default:
			if n.words == nil {
				n.words = map[string]*topicNode{}
			}
			c := n.words[w]
			if c == nil {
				c = &topicNode{}
				n.words[w] = c
			}
			n = c
			continue
		}
		if *next == nil {
			*next = &topicNode{}
		}
		n = *next
	}
	n.dests.add(d)
}

// remove deletes one binding of d with key and prunes nodes left empty.
func (n *topicNode) remove(key string, d Dest) {
	var buf [16]string
	words := normalizeTopicKey(splitWords(key, buf[:0]))
	n.removeWords(words, d)
}

func (n *topicNode) removeWords(words []string, d Dest) {
	if len(words) == 0 {
		n.dests.remove(d)
		return
	}
	w := words[0]
	switch w {
	case "*":
		if n.star != nil {
			n.star.removeWords(words[1:], d)
			if n.star.empty() {
				n.star = nil
			}
		}
	case "#":
		if n.hash != nil {
			n.hash.removeWords(words[1:], d)
			if n.hash.empty() {
				n.hash = nil
			}
		}
	default:
		if c := n.words[w]; c != nil {
			c.removeWords(words[1:], d)
			if c.empty() {
				delete(n.words, w)
			}
		}
	}
}

// topicVisit records one (hash node, word index) state already explored, so
// patterns with several "#" stay polynomial on long keys.
type topicVisit struct {
	node *topicNode
	at   int
}

type topicMatcher struct {
	words   []string
	out     []Dest
	visited []topicVisit            // while few states were explored
	seen    map[topicVisit]struct{} // once many were
}

// topicScanMax is how many explored states a linear scan checks before the
// matcher switches to a map.
const topicScanMax = 32

// match appends the destinations of every binding whose key matches words;
// m's buffers are reused between calls.
func (n *topicNode) match(m *topicMatcher, words []string, out []Dest) []Dest {
	m.words, m.out, m.visited, m.seen = words, out, m.visited[:0], nil
	m.walk(n, 0)
	out = m.out
	m.words, m.out = nil, nil
	return out
}

func (m *topicMatcher) walk(n *topicNode, i int) {
	if i == len(m.words) {
		m.out = n.dests.appendTo(m.out)
		if n.hash != nil {
			m.walkHash(n.hash, i)
		}
		return
	}
	if c := n.words[m.words[i]]; c != nil {
		m.walk(c, i+1)
	}
	if n.star != nil {
		m.walk(n.star, i+1)
	}
	if n.hash != nil {
		// "#" consumes zero or more words.
		for j := i; j <= len(m.words); j++ {
			m.walkHash(n.hash, j)
		}
	}
}

func (m *topicMatcher) walkHash(h *topicNode, j int) {
	v := topicVisit{h, j}
	if m.seen != nil {
		if _, ok := m.seen[v]; ok {
			return
		}
		m.seen[v] = struct{}{}
	} else {
		for _, w := range m.visited {
			if w == v {
				return
			}
		}
		m.visited = append(m.visited, v)
		if len(m.visited) > topicScanMax {
			m.seen = make(map[topicVisit]struct{}, 4*topicScanMax)
			for _, w := range m.visited {
				m.seen[w] = struct{}{}
			}
		}
	}
	m.walk(h, j)
}

// destSet is a small multiset of destinations: the same destination may be
// bound several times with the same key and different arguments, and it
// stays routed until the last of those bindings goes.
type destSet []destCount

type destCount struct {
	d Dest
	n int
}

func (s *destSet) add(d Dest) {
	for i := range *s {
		if (*s)[i].d == d {
			(*s)[i].n++
			return
		}
	}
	*s = append(*s, destCount{d, 1})
}

func (s *destSet) remove(d Dest) {
	for i := range *s {
		if (*s)[i].d == d {
			(*s)[i].n--
			if (*s)[i].n == 0 {
				last := len(*s) - 1
				(*s)[i] = (*s)[last]
				(*s)[last] = destCount{}
				*s = (*s)[:last]
			}
			return
		}
	}
}

func (s destSet) appendTo(out []Dest) []Dest {
	for _, dc := range s {
		out = append(out, dc.d)
	}
	return out
}
