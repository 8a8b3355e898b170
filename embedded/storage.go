package embedded

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/kubemq-io/kubemq-proxy/kubemqclient/fastpb"
	"github.com/kubemq-io/kubemq-proxy/kubemqpb"
)

// logStore is the persistence of a Server with a DataDir: an append-only log cut into segment
// files, with group commit.
//
// Write path: a mutation appends its framed record to an in-memory batch while holding the lock
// that orders it (queue or channel), and gets back its log position. One writer goroutine writes
// whole batches to the current segment with one write(2) each and publishes the committed
// position; senders wait for their position before acknowledging, so every acknowledged send is
// in the OS (it survives a process kill). fsync runs every FsyncInterval, or before each
// acknowledgement with FsyncEveryWrite (power-loss safe).
//
// Space: records that hold data (queue copies, events, delayed messages) are counted live per
// segment; settling, dropping or retention releases them. A segment is deleted once it and every
// older one hold nothing live and a newer segment holds a full snapshot of the small state
// (sequences, counters, durable cursors).
type logStore struct {
	s   *Server
	dir string
	log *zap.Logger

	mu      sync.Mutex // guards the fields down to rotated
	cur     uint32     // segment receiving appends
	curSize int64
	lsn     uint64   // log position after the last append
	pending []chunk  // appended, not yet written
	spare   [][]byte // written buffers for reuse
	segIDs  []uint32
	segs    map[uint32]*segInfo
	metaSeg uint32 // segment where the newest complete snapshot starts

	rotated atomic.Bool // a new segment began: maintain writes a snapshot

	cmu       sync.Mutex // guards committed, failed, closed
	cond      *sync.Cond
	committed uint64
	failed    error
	closed    bool

	kick     chan struct{}
	stop     chan struct{}
	finished chan struct{}

	rmu    sync.Mutex          // guards rfiles
	rfiles map[uint32]*os.File // read-only descriptors of segments records are read back from
	reads  atomic.Int64        // reads of records back from segments (for tests)
}

type chunk struct {
	seg  uint32
	data []byte
}

type segInfo struct {
	live atomic.Int64
}

func segPath(dir string, id uint32) string {
	return filepath.Join(dir, fmt.Sprintf("seg-%010d.log", id))
}

// openLogStore recovers the state in dir into s and starts the writer on a fresh segment.
func openLogStore(dir string, s *Server) (*logStore, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("embedded: data dir: %w", err)
	}
	st := &logStore{
		s: s, dir: dir, log: s.log, segs: map[uint32]*segInfo{},
		kick: make(chan struct{}, 1), stop: make(chan struct{}), finished: make(chan struct{}),
	}
	st.cond = sync.NewCond(&st.cmu)
	ids, err := listSegments(dir)
	if err != nil {
		return nil, err
	}
	rc := newRecovery(s, st)
	for i, id := range ids {
		if err := rc.replaySegment(id); err != nil {
			return nil, err
		}
		if i < len(ids)-1 {
			// Each segment is read whole and leaves its records' decoding behind: collect it
			// before the next, so that the peak stays near the index being built rather than
			// the garbage collector's doubling of it (1,000,000 messages: 550 MiB without).
			runtime.GC()
		}
	}
	rc.finish()
	var last uint32
	if len(ids) > 0 {
		last = ids[len(ids)-1]
	}
	st.cur = last + 1
	st.addSeg(st.cur)
	st.rotated.Store(true) // snapshot the recovered state into the new segment
	go st.writer()
	return st, nil
}

func listSegments(dir string) ([]uint32, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var ids []uint32
	for _, e := range ents {
		var id uint32
		if _, err := fmt.Sscanf(e.Name(), "seg-%010d.log", &id); err == nil && strings.HasSuffix(e.Name(), ".log") {
			ids = append(ids, id)
		}
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	return ids, nil
}

func (st *logStore) addSeg(id uint32) *segInfo {
	si := &segInfo{}
	st.segs[id] = si
	st.segIDs = append(st.segIDs, id)
	return si
}

// append adds one record; live records count against the segment. It returns the log position
// to wait for and the segment.
func (st *logStore) append(typ byte, payload []byte, live bool) (uint64, uint32) {
	lsn, seg, _, _ := st.appendFrame(int64(frameHeader+len(payload)), live, func(dst []byte) []byte {
		return frame(dst, typ, payload)
	})
	return lsn, seg
}

// appendMessage is append with m's encoding as the payload, marshalled straight into the batch.
// It also returns where the record starts in the segment and its framed length.
func (st *logStore) appendMessage(typ byte, m proto.Message, live bool) (lsn uint64, seg uint32, off int64, n int) {
	size := fastpb.SizeHint(m)
	if size == 0 {
		size = proto.Size(m)
	}
	return st.appendFrame(int64(frameHeader+size), live, func(dst []byte) []byte {
		return frameMessage(dst, typ, m)
	})
}

// Pending records are batched in chunks of chunkBytes (a larger record
// gets a chunk of its own); up to maxSpareChunks written chunks are kept
// for reuse.
const (
	chunkBytes     = 1 << 20
	maxSpareChunks = 16
)

// appendFrame adds one record of at most n bytes written by put. It returns the log position to
// wait for, the segment, the record's offset in it and its length.
func (st *logStore) appendFrame(n int64, live bool, put func(dst []byte) []byte) (uint64, uint32, int64, int) {
	st.mu.Lock()
	if st.curSize > 0 && st.curSize+n > st.s.opts.SegmentBytes {
		st.cur++
		st.curSize = 0
		st.addSeg(st.cur)
		st.rotated.Store(true)
	}
	seg := st.cur
	if live {
		st.segs[seg].live.Add(1)
	}
	// A record goes to the last chunk while it has room (n is an upper
	// bound), else to a new one: a chunk never grows (no copying of
	// megabytes while the writer is busy).
	k := len(st.pending)
	if k == 0 || st.pending[k-1].seg != seg || int64(cap(st.pending[k-1].data)-len(st.pending[k-1].data)) < n {
		var buf []byte
		if j := len(st.spare); j > 0 && int64(cap(st.spare[j-1])) >= n {
			buf, st.spare = st.spare[j-1][:0], st.spare[:j-1]
		} else {
			buf = make([]byte, 0, max(chunkBytes, n))
		}
		st.pending = append(st.pending, chunk{seg: seg, data: buf})
		k++
	}
	c := &st.pending[k-1]
	before := len(c.data)
	c.data = put(c.data)
	written := int64(len(c.data) - before)
	off := st.curSize
	st.curSize += written
	st.lsn += uint64(written)
	lsn := st.lsn
	st.mu.Unlock()
	select {
	case st.kick <- struct{}{}:
	default:
	}
	return lsn, seg, off, int(written)
}

// readRecord reads back the record of n bytes at off in segment seg, once the log holds position
// lsn (0: already on disk), and returns its payload. Reads go through one read-only descriptor
// per segment, opened at the first read and closed when the segment is deleted.
func (st *logStore) readRecord(seg uint32, off int64, n int, lsn uint64, typ byte) ([]byte, error) {
	buf, err := st.readAt(seg, off, n, lsn)
	if err != nil {
		return nil, err
	}
	t, payload, m, err := unframe(buf)
	if err != nil || m != n || t != typ {
		return nil, fmt.Errorf("embedded: record of segment %d at %d is damaged", seg, off)
	}
	return payload, nil
}

// readAt reads n bytes at off in segment seg once the log holds position lsn (0: already on
// disk).
func (st *logStore) readAt(seg uint32, off int64, n int, lsn uint64) ([]byte, error) {
	if lsn != 0 {
		st.cmu.Lock()
		done := st.committed >= lsn
		st.cmu.Unlock()
		if !done {
			if err := st.wait(lsn); err != nil {
				return nil, err
			}
		}
	}
	st.rmu.Lock()
	f := st.rfiles[seg]
	if f == nil {
		var err error
		if f, err = os.Open(segPath(st.dir, seg)); err != nil {
			st.rmu.Unlock()
			return nil, fmt.Errorf("embedded: read back a record: %w", err)
		}
		if st.rfiles == nil {
			st.rfiles = map[uint32]*os.File{}
		}
		st.rfiles[seg] = f
	}
	st.rmu.Unlock()
	st.reads.Add(1)
	buf := make([]byte, n)
	if _, err := f.ReadAt(buf, off); err != nil {
		return nil, fmt.Errorf("embedded: read back records of segment %d at %d: %w", seg, off, err)
	}
	return buf, nil
}

// closeReader closes the read descriptor of a deleted segment.
func (st *logStore) closeReader(seg uint32) {
	st.rmu.Lock()
	if f := st.rfiles[seg]; f != nil {
		f.Close()
		delete(st.rfiles, seg)
	}
	st.rmu.Unlock()
}

func (st *logStore) release(seg uint32) {
	st.mu.Lock()
	si := st.segs[seg]
	st.mu.Unlock()
	if si != nil {
		si.live.Add(-1)
	}
}

// wait blocks until the log holds position lsn.
func (st *logStore) wait(lsn uint64) error {
	st.cmu.Lock()
	defer st.cmu.Unlock()
	for st.committed < lsn && st.failed == nil && !st.closed {
		st.cond.Wait()
	}
	if st.committed >= lsn {
		return nil
	}
	if st.failed != nil {
		return st.failed
	}
	return errServerClosed
}

// writer is the only goroutine touching segment files (besides deletion of closed ones).
func (st *logStore) writer() {
	defer close(st.finished)
	var f *os.File
	var fseg uint32
	dirty := false
	tick := time.NewTicker(st.syncEvery())
	defer tick.Stop()
	fail := func(err error) {
		st.log.Error("log write failed; sends now fail", zap.Error(err))
		st.cmu.Lock()
		st.failed = err
		st.cond.Broadcast()
		st.cmu.Unlock()
	}
	flush := func() bool {
		st.mu.Lock()
		chunks := st.pending
		st.pending = nil
		upto := st.lsn
		st.mu.Unlock()
		for _, c := range chunks {
			if f == nil || c.seg != fseg {
				if f != nil {
					// A finished segment is made durable before the next one takes writes.
					if err := f.Sync(); err != nil {
						fail(err)
						return false
					}
					f.Close()
				}
				var err error
				f, err = os.OpenFile(segPath(st.dir, c.seg), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
				if err != nil {
					fail(err)
					return false
				}
				fseg = c.seg
				syncDir(st.dir)
			}
			if _, err := f.Write(c.data); err != nil {
				fail(err)
				return false
			}
			dirty = true
		}
		if f != nil && dirty && st.s.opts.FsyncEveryWrite {
			if err := f.Sync(); err != nil {
				fail(err)
				return false
			}
			dirty = false
		}
		st.mu.Lock()
		for _, c := range chunks {
			if len(st.spare) < maxSpareChunks && cap(c.data) == chunkBytes {
				st.spare = append(st.spare, c.data)
			}
		}
		st.mu.Unlock()
		st.cmu.Lock()
		if upto > st.committed {
			st.committed = upto
		}
		st.cond.Broadcast()
		st.cmu.Unlock()
		return true
	}
	for {
		select {
		case <-st.kick:
			if !flush() {
				return
			}
		case <-tick.C:
			if f != nil && dirty && st.s.opts.FsyncInterval > 0 {
				_ = f.Sync()
				dirty = false
			}
		case <-st.stop:
			if flush() && f != nil {
				_ = f.Sync()
			}
			if f != nil {
				f.Close()
			}
			return
		}
	}
}

func (st *logStore) syncEvery() time.Duration {
	if st.s.opts.FsyncInterval > 0 {
		return st.s.opts.FsyncInterval
	}
	return time.Hour
}

func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
}

func (st *logStore) close() error {
	close(st.stop)
	<-st.finished
	st.rmu.Lock()
	for id, f := range st.rfiles {
		f.Close()
		delete(st.rfiles, id)
	}
	st.rmu.Unlock()
	st.cmu.Lock()
	st.closed = true
	err := st.failed
	st.cond.Broadcast()
	st.cmu.Unlock()
	return err
}

// maintain writes a snapshot after a segment change and deletes segments that hold nothing live.
// Called by the server's housekeeping goroutine only.
func (st *logStore) maintain() {
	if st.rotated.Swap(false) {
		st.mu.Lock()
		start := st.cur
		st.mu.Unlock()
		lsn := st.s.snapshot()
		if st.wait(lsn) == nil {
			st.mu.Lock()
			st.metaSeg = start
			st.mu.Unlock()
		}
	}
	for {
		st.mu.Lock()
		if len(st.segIDs) == 0 {
			st.mu.Unlock()
			return
		}
		id := st.segIDs[0]
		if id >= st.metaSeg || id >= st.cur || st.segs[id].live.Load() > 0 {
			st.mu.Unlock()
			return
		}
		st.segIDs = st.segIDs[1:]
		delete(st.segs, id)
		st.mu.Unlock()
		st.closeReader(id)
		if err := os.Remove(segPath(st.dir, id)); err != nil && !errors.Is(err, os.ErrNotExist) {
			st.log.Warn("cannot delete log segment", zap.Uint32("segment", id), zap.Error(err))
		}
	}
}

// snapshot logs the small state that must outlive the records it was derived from.
func (s *Server) snapshot() uint64 {
	st := s.store
	var lsn uint64
	s.mu.RLock()
	qs := make([]*queue, 0, len(s.queues))
	for _, q := range s.queues {
		qs = append(qs, q)
	}
	cs := make([]*eventChannel, 0, len(s.channels))
	for _, c := range s.channels {
		cs = append(cs, c)
	}
	ds := make([]*durable, 0, len(s.durables))
	for _, d := range s.durables {
		ds = append(ds, d)
	}
	s.mu.RUnlock()
	for _, q := range qs {
		q.mu.Lock()
		if q.purged {
			q.mu.Unlock()
			continue
		}
		b := putStr(nil, q.name)
		b = binary.AppendUvarint(b, q.lastSeq)
		b = binary.AppendUvarint(b, uint64(q.sent))
		b = binary.AppendUvarint(b, uint64(q.delivered))
		lsn, _ = st.append(recQueueMeta, b, false)
		q.mu.Unlock()
	}
	for _, c := range cs {
		c.mu.Lock()
		if c.purged {
			c.mu.Unlock()
			continue
		}
		b := binary.AppendUvarint(putStr(nil, c.name), c.last)
		lsn, _ = st.append(recChannelMeta, b, false)
		c.mu.Unlock()
	}
	for _, d := range ds {
		d.mu.Lock()
		cur := d.cursor
		d.mu.Unlock()
		lsn, _ = st.append(recCursor, cursorPayload(d.key, d.channel, cur), false)
	}
	return lsn
}

func cursorPayload(key, channel string, cur uint64) []byte {
	return binary.AppendUvarint(putStr(putStr(nil, key), channel), cur)
}

// Server-side hooks: no-ops in memory.

func (s *Server) logQueueMsg(m *kubemqpb.QueueMessage) (lsn uint64, seg uint32, off int64, n int) {
	if s.store == nil {
		return 0, 0, 0, 0
	}
	return s.store.appendMessage(recQueueMsg, m, true)
}

func (s *Server) logQueueDel(name string, seqs []uint64) {
	if s.store == nil {
		return
	}
	b := putStr(make([]byte, 0, len(name)+8+len(seqs)*4), name)
	b = binary.AppendUvarint(b, uint64(len(seqs)))
	for _, v := range seqs {
		b = binary.AppendUvarint(b, v)
	}
	s.store.append(recQueueDel, b, false)
}

func (s *Server) logDelayAdd(id uint64, m *kubemqpb.QueueMessage) (lsn uint64, seg uint32, off int64, n int) {
	if s.store == nil {
		return 0, 0, 0, 0
	}
	b := binary.AppendUvarint(nil, id)
	b, _ = proto.MarshalOptions{}.MarshalAppend(b, m)
	return s.store.appendFrame(int64(frameHeader+len(b)), true, func(dst []byte) []byte {
		return frame(dst, recDelayAdd, b)
	})
}

func (s *Server) logDelayDone(ids []uint64) {
	if s.store == nil {
		return
	}
	b := binary.AppendUvarint(nil, uint64(len(ids)))
	for _, v := range ids {
		b = binary.AppendUvarint(b, v)
	}
	s.store.append(recDelayDone, b, false)
}

func (s *Server) logEvent(e *kubemqpb.EventReceive) (lsn uint64, seg uint32, off int64, n int) {
	if s.store == nil {
		return 0, 0, 0, 0
	}
	return s.store.appendMessage(recEvent, e, true)
}

func (s *Server) logCursor(key, channel string, cur uint64) {
	if s.store == nil {
		return
	}
	s.store.append(recCursor, cursorPayload(key, channel, cur), false)
}

// retentionCutoff is the Unix ns before which messages are dropped; 0 when they are kept forever.
func (s *Server) retentionCutoff() int64 {
	if s.opts.MaxRetention < 0 {
		return 0
	}
	return s.now().Add(-s.opts.MaxRetention).UnixNano()
}

// logPurge records that a queue or channel was deleted for inactivity (not awaited: a crash
// before it is written only delays the purge).
func (s *Server) logPurge(kind byte, name string) {
	if s.store == nil {
		return
	}
	s.store.append(recPurge, putStr(binary.AppendUvarint(nil, uint64(kind)), name), false)
}

func (s *Server) releaseSeg(seg uint32) {
	if s.store != nil && seg != 0 {
		s.store.release(seg)
	}
}

func (s *Server) waitLog(lsn uint64) error {
	if s.store == nil || lsn == 0 {
		return nil
	}
	return s.store.wait(lsn)
}

// applyRetention removes events and visible queue messages older than MaxRetention. Both lists
// are in time order, so only their heads are examined. The log needs no record for it: replay
// applies the same age rule.
func (s *Server) applyRetention() {
	cutoff := s.retentionCutoff()
	if cutoff == 0 {
		return
	}
	s.mu.RLock()
	qs := make([]*queue, 0, len(s.queues))
	for _, q := range s.queues {
		qs = append(qs, q)
	}
	cs := make([]*eventChannel, 0, len(s.channels))
	for _, c := range s.channels {
		cs = append(cs, c)
	}
	s.mu.RUnlock()
	for _, c := range cs {
		c.mu.Lock()
		n := 0
		for n < len(c.events) && c.events[n].ts < cutoff {
			n++
		}
		c.dropOldest(s, n, s.releaseSeg)
		c.mu.Unlock()
	}
	for _, q := range qs {
		q.mu.Lock()
		for q.head < len(q.ready) && q.ready[q.head].ts < cutoff {
			q.forgetLocked(q.popLocked())
		}
		q.mu.Unlock()
	}
}
