package embedded

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"

	"go.uber.org/zap"

	"github.com/kubemq-io/kubemq-proxy/kubemqpb"
)

// recovery rebuilds a server's state from its log, segment by segment in order.
type recovery struct {
	s      *Server
	st     *logStore
	msgs   map[string]map[uint64]*qmsg // queue -> sequence -> stored copy
	delays map[uint64]*delayed
	cutoff int64
	qm     kubemqpb.QueueMessage // every queue record is indexed into this one (apply keeps none of it but its Channel)
}

func newRecovery(s *Server, st *logStore) *recovery {
	return &recovery{
		s: s, st: st, msgs: map[string]map[uint64]*qmsg{}, delays: map[uint64]*delayed{},
		cutoff: s.retentionCutoff(),
	}
}

// replaySegment applies one segment. A torn or damaged tail (a crash mid-write) is cut off.
// The segment is read through a buffer, one record at a time (decoding copies what it keeps), so
// that recovery does not hold a whole segment.
func (rc *recovery) replaySegment(id uint32) error {
	path := segPath(rc.st.dir, id)
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("embedded: read %s: %w", path, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("embedded: read %s: %w", path, err)
	}
	size := int(fi.Size())
	br := bufio.NewReaderSize(f, 1<<20)
	var buf []byte
	si := rc.st.addSeg(id)
	off := 0
	for off < size {
		// One frame: its header says how long it is; a short or damaged one is cut below.
		var typ byte
		var payload []byte
		var n int
		hdr, err := br.Peek(8)
		if err == nil {
			flen := int(binary.LittleEndian.Uint32(hdr[0:4]))
			if flen < 1 || flen > maxRecord || off+8+flen > size {
				err = errCorrupt
			} else {
				if cap(buf) < 8+flen {
					buf = make([]byte, 8+flen)
				}
				buf = buf[:8+flen]
				if _, err = io.ReadFull(br, buf); err == nil {
					typ, payload, n, err = unframe(buf)
				}
			}
		}
		if err == nil {
			var r record
			switch typ {
			case recQueueMsg:
				r, err = indexQueueRecordInto(payload, &rc.qm, false) // the index only: the body stays on disk
			case recEvent:
				r, err = indexEventRecord(payload) // likewise
			case recDelayAdd:
				r, err = indexDelayRecord(payload) // likewise
			default:
				r, err = decodeRecord(typ, payload)
			}
			if err == nil {
				rc.apply(r, id, si, int64(off), n)
			}
		}
		if err != nil {
			rc.s.log.Warn("log cut at a damaged record", zap.String("segment", path), zap.Int("offset", off), zap.Int("dropped_bytes", size-off))
			if terr := os.Truncate(path, int64(off)); terr != nil {
				return fmt.Errorf("embedded: truncate %s: %w", path, errors.Join(err, terr))
			}
			break
		}
		off += n
	}
	return nil
}

// apply applies one record, found at off (n bytes) in segment seg.
func (rc *recovery) apply(r record, seg uint32, si *segInfo, off int64, n int) {
	s := rc.s
	switch r.typ {
	case recQueueMsg:
		m := r.qm
		q := s.getQueue(m.Channel, true)
		seq := m.Attributes.Sequence
		if seq > q.lastSeq {
			q.lastSeq = seq
		}
		byQ := rc.msgs[m.Channel]
		if byQ == nil {
			byQ = map[uint64]*qmsg{}
			rc.msgs[m.Channel] = byQ
		}
		if old := byQ[seq]; old != nil {
			rc.st.release(old.seg)
		}
		qm := newQmsg(m)
		qm.size = r.size
		qm.spill(seg, off, n, 0)
		byQ[seq] = qm
		si.live.Add(1)
	case recQueueDel:
		byQ := rc.msgs[r.name]
		for _, seq := range r.nums {
			if old := byQ[seq]; old != nil {
				rc.st.release(old.seg)
				delete(byQ, seq)
			}
		}
	case recEvent:
		e := r.ev
		c := s.getChannel(e.Channel, true)
		si.live.Add(1)
		if e.Sequence <= c.last {
			si.live.Add(-1) // already known: nothing to keep
			return
		}
		if len(c.events) == 0 {
			c.first = e.Sequence
		}
		c.last = e.Sequence
		c.hot = c.last + 1 // held in the log only
		c.events = append(c.events, storedEvent{ts: e.Timestamp, off: off, size: r.size, seg: seg, n: uint32(n)})
		c.bytes += r.size
		c.trimLocked(s, rc.st.release) // the same rule as at publish
	case recDelayAdd:
		rc.delays[r.id] = newDelayed(r.id, r.qm, seg, off, n, 0)
		rc.delays[r.id].m = nil // read back when due
		si.live.Add(1)
	case recDelayDone:
		for _, id := range r.nums {
			if d := rc.delays[id]; d != nil {
				rc.st.release(d.seg)
				delete(rc.delays, id)
			}
		}
	case recCursor:
		d := s.durables[r.name]
		if d == nil {
			d = &durable{key: r.name, channel: r.channel, ch: s.getChannel(r.channel, true)}
			s.durables[r.name] = d
		}
		d.cursor, d.saved = r.nums[0], r.nums[0]
	case recQueueMeta:
		q := s.getQueue(r.name, true)
		q.lastSeq = max(q.lastSeq, r.nums[0])
		q.sent = max(q.sent, int64(r.nums[1]))
		q.delivered = max(q.delivered, int64(r.nums[2]))
	case recPurge:
		if r.nums[0] == uint64(recPurgeQueue) {
			for _, qm := range rc.msgs[r.name] {
				rc.st.release(qm.seg)
			}
			delete(rc.msgs, r.name)
			if q := s.queues[r.name]; q != nil {
				s.removeQueueLocked(q)
			}
			return
		}
		if c := s.channels[r.name]; c != nil {
			c.dropOldest(s, len(c.events), rc.st.release)
			delete(s.channels, r.name)
			for k, d := range s.durables {
				if d.ch == c {
					delete(s.durables, k)
				}
			}
		}
	case recChannelMeta:
		c := s.getChannel(r.name, true)
		if r.nums[0] > c.last {
			c.last = r.nums[0]
			if len(c.events) == 0 {
				c.first = c.last + 1
			}
		}
	}
}

// finish moves the recovered copies into their queues in sequence order. Messages that were held
// by a consumer when the server stopped are visible again (the real server strands them after a
// crash, docs/kubemq.md 8.6).
func (rc *recovery) finish() {
	s := rc.s
	for name, byQ := range rc.msgs {
		q := s.getQueue(name, true)
		list := make([]*qmsg, 0, len(byQ))
		for _, qm := range byQ {
			if qm.ts < rc.cutoff {
				rc.st.release(qm.seg)
				continue
			}
			list = append(list, qm)
		}
		sort.Slice(list, func(i, j int) bool { return list[i].seq() < list[j].seq() })
		// Limits lowered since the copies were stored: the oldest go, as at a send (not
		// logged; the next start applies the same rule).
		o := &s.opts
		var bytes int64
		for _, qm := range list {
			bytes += qm.size
		}
		for len(list) > 1 && ((o.MaxChannelMessages > 0 && len(list) > o.MaxChannelMessages) || (o.MaxChannelBytes > 0 && bytes > o.MaxChannelBytes)) {
			bytes -= list[0].size
			rc.st.release(list[0].seg)
			list = list[1:]
		}
		q.ready = list
		q.count = int64(len(list))
		for _, qm := range list {
			q.bytes += qm.size
		}
		if q.sent < q.count {
			q.sent = q.count
		}
	}
	for _, c := range s.channels {
		if len(c.events) == 0 && c.first <= c.last {
			c.first = c.last + 1
		}
		c.hot = c.last + 1
	}
	for _, d := range rc.delays {
		s.delays.restore(d)
	}
	for _, d := range s.durables {
		if d.ch != nil {
			d.ch.mu.Lock()
			if d.cursor > d.ch.last {
				d.cursor = d.ch.last
			}
			d.ch.mu.Unlock()
		}
	}
}
