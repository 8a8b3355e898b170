package embedded

import (
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/kubemq-io/kubemq-proxy/kubemqpb"
)

// The real store's refusals (its store layer's texts, passed through verbatim: a queue send
// gets it in the result, an events-store subscription as gRPC Internal).
const (
	errTooManyChannels = "too many channels"
	errTooManySubs     = "too many subscriptions per channel"
)

// errMemoryLimit is the refusal of a send beyond Options.MaxMemory. It has no KubeMQ error
// number: the real server has no such limit.
func errMemoryLimit(used, limit int64) string {
	return fmt.Sprintf("memory limit reached: the embedded server holds %d bytes of messages and its limit (max_memory) is %d bytes; retry once consumers have drained some", used, limit)
}

// internalChannels is how many channels the real store always holds besides the clients' (its
// delayed-message channel), which STORE_MAX_QUEUES counts too.
const internalChannels = 1

// channelsFullLocked reports whether one more queue or events-store channel would exceed
// MaxChannels. s.mu must be held.
func (s *Server) channelsFullLocked() bool {
	return s.opts.MaxChannels > 0 && len(s.queues)+len(s.channels)+internalChannels >= s.opts.MaxChannels
}

// openQueue returns the named queue, creating it unless that would exceed MaxChannels (what a
// client's send, receive or Get does; internal moves use getQueue and are never refused).
func (s *Server) openQueue(name string) (*queue, string) {
	if q := s.getQueue(name, false); q != nil {
		return q, ""
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if q := s.queues[name]; q != nil {
		return q, ""
	}
	if s.channelsFullLocked() {
		return nil, errTooManyChannels
	}
	return s.newQueueLocked(name), ""
}

// lockQueue returns the named queue locked, skipping one that a purge has just removed. With
// client set, creating it counts against MaxChannels.
func (s *Server) lockQueue(name string, client bool) (*queue, string) {
	for {
		var q *queue
		if client {
			var e string
			if q, e = s.openQueue(name); e != "" {
				return nil, e
			}
		} else {
			q = s.getQueue(name, true)
		}
		q.mu.Lock()
		if !q.purged {
			return q, ""
		}
		q.mu.Unlock()
	}
}

// canCreateQueue reports why a send to name (a delayed one, which creates the queue only when
// due) would be refused.
func (s *Server) canCreateQueue(name string) string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.queues[name] == nil && s.channelsFullLocked() {
		return errTooManyChannels
	}
	return ""
}

// lockChannel is lockQueue for events-store channels (always a client's).
func (s *Server) lockChannel(name string) (*eventChannel, string) {
	for {
		c := s.getChannel(name, false)
		if c == nil {
			s.mu.Lock()
			if c = s.channels[name]; c == nil {
				if s.channelsFullLocked() {
					s.mu.Unlock()
					return nil, errTooManyChannels
				}
				c = s.newChannelLocked(name)
			}
			s.mu.Unlock()
		}
		c.mu.Lock()
		if !c.purged {
			return c, ""
		}
		c.mu.Unlock()
	}
}

// memFull reports the refusal of a client's send of n more bytes beyond MaxMemory (plus
// reserve, a share of it kept for events-store writes), or "".
func (s *Server) memFull(n int64, reserve int64) string {
	limit := s.opts.MaxMemory
	if limit <= 0 {
		return ""
	}
	if used := s.mem.Load(); used+n > limit+reserve {
		return errMemoryLimit(used, limit)
	}
	return ""
}

// eventReserve is how far beyond MaxMemory events-store publishes may still go once queue sends
// are refused: the proxy's own logs (registry, cluster ownership and acknowledgements) and a
// Pub/Sub topic's log are events, and refusing them with the queues would stop replicas from
// holding the queues whose consumption frees memory.
func (s *Server) eventReserve() int64 { return s.opts.MaxMemory / 8 }

// MemoryUsed is the bytes of messages the server holds (queue messages, delayed messages and
// events: what Options.MaxMemory bounds).
func (s *Server) MemoryUsed() int64 { return s.mem.Load() }

// trimLocked drops a queue's oldest visible messages while it holds more than
// MaxChannelMessages or MaxChannelBytes, as the real store does (it never refuses a send for
// them). The newest message is always kept. Held messages are not dropped.
func (q *queue) trimLocked() {
	o := &q.s.opts
	over := func() bool {
		return (o.MaxChannelMessages > 0 && q.count > int64(o.MaxChannelMessages)) ||
			(o.MaxChannelBytes > 0 && q.bytes > o.MaxChannelBytes && q.count > 1)
	}
	if !over() {
		return
	}
	var gone []uint64
	for over() {
		qm := q.popLocked()
		if qm == nil {
			break
		}
		gone = append(gone, qm.seq())
		q.forgetLocked(qm)
	}
	if len(gone) > 0 {
		q.s.logQueueDel(q.name, gone)
	}
}

// trimLocked drops a channel's oldest events while it holds more than MaxChannelMessages or
// MaxChannelBytes (the newest one is always kept). Replay applies the same rule, so no record
// is needed.
func (c *eventChannel) trimLocked(s *Server, release func(seg uint32)) {
	o := &s.opts
	n := 0
	bytes := c.bytes
	for len(c.events)-n > 1 {
		if !((o.MaxChannelMessages > 0 && len(c.events)-n > o.MaxChannelMessages) ||
			(o.MaxChannelBytes > 0 && bytes > o.MaxChannelBytes)) {
			break
		}
		bytes -= c.events[n].size
		n++
	}
	c.dropOldest(s, n, release)
}

// dropHead forgets the first n events (already released). The array is copied once more of it
// lies before the events than in them, so that a channel trimmed at its head does not keep what
// it dropped.
func (c *eventChannel) dropHead(n int) {
	if n == 0 {
		return
	}
	clear(c.events[:n])
	c.events = c.events[n:]
	c.first += uint64(n)
	c.hot = max(c.hot, c.first)
	c.dropped += n
	switch {
	case len(c.events) == 0:
		c.events, c.dropped = nil, 0
	case c.dropped > len(c.events) && c.dropped > 64:
		c.events, c.dropped = append(make([]storedEvent, 0, len(c.events)+len(c.events)/4), c.events...), 0
	}
}

func eventSize(e *kubemqpb.EventReceive) int64 {
	n := int64(len(e.Body) + len(e.Metadata) + len(e.EventID) + len(e.Channel))
	for k, v := range e.Tags {
		n += int64(len(k) + len(v))
	}
	return n
}

// purgeEvery is how often housekeeping looks for inactive channels.
const purgeEvery = 10 * time.Second

// purgeInactive deletes every queue and events-store channel that has had no new message and no
// connected consumer for MaxPurgeInactive, with its messages and (channels) durable cursors, as
// the real store does. A purge is logged, so a restart does not bring the channel back.
func (s *Server) purgeInactive() {
	if s.opts.MaxPurgeInactive < 0 {
		return
	}
	cutoff := s.now().Add(-s.opts.MaxPurgeInactive).UnixNano()
	s.mu.RLock()
	var qs []*queue
	for _, q := range s.queues {
		qs = append(qs, q)
	}
	var cs []*eventChannel
	for _, c := range s.channels {
		cs = append(cs, c)
	}
	live := map[string]bool{} // channels with a connected durable member
	for _, d := range s.durables {
		d.mu.Lock()
		if len(d.members) > 0 || d.running {
			live[d.channel] = true
		}
		d.mu.Unlock()
	}
	s.mu.RUnlock()
	// Locks are taken in the server's order: s.mu before a queue's or channel's.
	for _, q := range qs {
		s.mu.Lock()
		q.mu.Lock()
		if q.purged || q.lastActive >= cutoff || q.consumers != 0 || q.held != 0 || q.txOwner != nil || len(q.waiters) != 0 {
			q.mu.Unlock()
			s.mu.Unlock()
			continue
		}
		s.removeQueueLocked(q)
		q.purged = true
		s.mu.Unlock()
		n := 0
		for q.head < len(q.ready) {
			q.forgetLocked(q.popLocked())
			n++
		}
		s.logPurge(recPurgeQueue, q.name)
		q.mu.Unlock()
		s.log.Info("queue purged after inactivity", zap.String("queue", q.name), zap.Int("messages", n))
	}
	for _, c := range cs {
		if live[c.name] {
			continue
		}
		s.mu.Lock()
		c.mu.Lock()
		if c.purged || c.lastActive >= cutoff || c.waiting {
			c.mu.Unlock()
			s.mu.Unlock()
			continue
		}
		if s.channels[c.name] == c {
			delete(s.channels, c.name)
		}
		for k, d := range s.durables {
			if d.ch == c {
				delete(s.durables, k)
			}
		}
		c.purged = true
		s.mu.Unlock()
		n := len(c.events)
		c.dropOldest(s, n, s.releaseSeg)
		c.bytes = 0
		s.logPurge(recPurgeChannel, c.name)
		c.mu.Unlock()
		s.log.Info("events-store channel purged after inactivity", zap.String("channel", c.name), zap.Int("events", n))
	}
}

// removeQueueLocked takes q out of the name maps. s.mu must be held.
func (s *Server) removeQueueLocked(q *queue) {
	if s.queues[q.name] == q {
		delete(s.queues, q.name)
	}
	ln := listedName(q.name)
	l := s.listed[ln]
	for i, x := range l {
		if x == q {
			l = append(l[:i], l[i+1:]...)
			break
		}
	}
	if len(l) == 0 {
		delete(s.listed, ln)
	} else {
		s.listed[ln] = l
	}
}
