package delivery

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"
)

// fakeKubeMQ is an in-memory queue server with the KubeMQ semantics the engine relies on
// (docs/kubemq.md 5.4): sequences, delayed messages, Gets that return only when full or after
// their wait (at least 1 s), transactions held until settled or the stream ends. It counts the
// hazardous patterns strict mode refuses (violations) and lets tests inject failures.
type fakeKubeMQ struct {
	t *testing.T

	mu         sync.Mutex
	queues     map[string]*fakeQueue
	changed    chan struct{} // closed and replaced on every change
	violations []string
	sendFail   func(queue string, msgs []Message) ([]error, error) // nil = store everything
	sendHang   func(queue string, msgs []Message) bool             // true: the send is never answered (until ctx ends)
	ambiguous  func(queue string, msgs []Message) bool             // true: store, then report failure
	getFail    func(queue string) error                            // non-nil: the Get is refused, the stream goes on
	uncounted  bool                                                // Waiting answers -1 (kubemqclient.Ambiguous)
	// ackEcho, when set, is asked at each AckAll how many of the transaction's first messages
	// go back to the head of the queue, acknowledged and still delivered again under the same
	// sequences: the real server's race between the settlement and the next Get
	// (docs/kubemq.md 10.4).
	ackEcho func(queue string, msgs []Message) int
	sends   int
}

type fakeQueue struct {
	seq     uint64
	ready   []Message // visible, in sequence order
	delayed []fakeDelayed
	ids     map[string]bool // MessageIDs of pending delayed messages
	holder  *fakeStream     // stream with an open transaction or waiting Get
	held    int             // messages in open transactions (counted as waiting, as KubeMQ does)
}

type fakeDelayed struct {
	at time.Time
	m  Message
}

var errFakeDown = errors.New("fake kubemq: connection lost")
var errFakeBad = errors.New("fake kubemq: invalid argument")
var errFakeBusy = errors.New("fake kubemq: Error 302: connection not available, please retry")

func newFakeKubeMQ(t *testing.T) *fakeKubeMQ {
	return &fakeKubeMQ{t: t, queues: map[string]*fakeQueue{}, changed: make(chan struct{})}
}

func (f *fakeKubeMQ) violate(format string, args ...any) {
	f.violations = append(f.violations, fmt.Sprintf(format, args...))
}

func (f *fakeKubeMQ) Violations() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.violations)
}

func (f *fakeKubeMQ) queue(name string) *fakeQueue {
	q := f.queues[name]
	if q == nil {
		q = &fakeQueue{ids: map[string]bool{}}
		f.queues[name] = q
	}
	return q
}

func (f *fakeKubeMQ) notifyLocked() {
	close(f.changed)
	f.changed = make(chan struct{})
}

// promoteLocked makes due delayed messages visible; it returns the next due time.
func (f *fakeKubeMQ) promoteLocked(q *fakeQueue, now time.Time) time.Time {
	var next time.Time
	keep := q.delayed[:0]
	moved := false
	for _, d := range q.delayed {
		if !d.at.After(now) {
			delete(q.ids, d.m.ID)
			q.seq++
			d.m.Sequence = q.seq
			d.m.Stored = now.UnixNano() // like KubeMQ: a delayed message becomes a new copy
			q.ready = append(q.ready, d.m)
			moved = true
			continue
		}
		if next.IsZero() || d.at.Before(next) {
			next = d.at
		}
		keep = append(keep, d)
	}
	q.delayed = keep
	if moved {
		f.notifyLocked()
	}
	return next
}

// client is one connection; kill makes it fail like a killed process's connection.
func (f *fakeKubeMQ) client() *fakeClient { return &fakeClient{f: f} }

type fakeClient struct {
	f       *fakeKubeMQ
	mu      sync.Mutex
	dead    bool
	streams []*fakeStream
}

// kill drops the connection: every later call fails and the streams' transactions go back.
func (c *fakeClient) kill() {
	c.mu.Lock()
	c.dead = true
	ss := c.streams
	c.mu.Unlock()
	for _, s := range ss {
		s.abort()
	}
}

// breakStreams ends every open stream of the client (a backend blip) without killing it.
func (c *fakeClient) breakStreams() {
	c.mu.Lock()
	ss := c.streams
	c.streams = nil
	c.mu.Unlock()
	for _, s := range ss {
		s.abort()
	}
}

func (c *fakeClient) isDead() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.dead
}

func (c *fakeClient) Retryable(err error) bool { return !errors.Is(err, errFakeBad) }

func (c *fakeClient) Waiting(ctx context.Context, queue string) (int64, error) {
	if c.isDead() {
		return 0, errFakeDown
	}
	f := c.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.uncounted {
		return -1, nil
	}
	q := f.queue(queue)
	f.promoteLocked(q, time.Now())
	return int64(len(q.ready) + q.held), nil
}

func (c *fakeClient) Send(ctx context.Context, queue string, msgs []Message) ([]error, error) {
	if c.isDead() {
		return nil, errFakeDown
	}
	if len(msgs) == 0 {
		return nil, errFakeBad
	}
	f := c.f
	f.mu.Lock()
	hang := f.sendHang
	f.mu.Unlock()
	if hang != nil && hang(queue, msgs) {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sends++
	res := make([]error, len(msgs))
	if f.sendFail != nil {
		var err error
		res, err = f.sendFail(queue, msgs)
		if err != nil {
			return nil, err
		}
		if res == nil {
			res = make([]error, len(msgs))
		}
	}
	q := f.queue(queue)
	now := time.Now()
	for i, m := range msgs {
		if res[i] != nil {
			continue
		}
		if m.ID == "" {
			res[i] = errFakeBad
			continue
		}
		m.Tags = cloneTags(m.Tags)
		m.Body = slices.Clone(m.Body)
		if m.DelaySeconds > 0 {
			if q.ids[m.ID] {
				f.violate("delayed MessageID %q repeated", m.ID)
			}
			q.ids[m.ID] = true
			q.delayed = append(q.delayed, fakeDelayed{at: now.Add(time.Duration(m.DelaySeconds) * time.Second), m: m})
			continue
		}
		q.seq++
		m.Sequence = q.seq
		m.Stored = now.UnixNano() // each stored copy has its own time
		q.ready = append(q.ready, m)
	}
	f.notifyLocked()
	if f.ambiguous != nil && f.ambiguous(queue, msgs) {
		for i := range res {
			res[i] = errFakeDown
		}
	}
	return res, nil
}

func cloneTags(t map[string]string) map[string]string {
	if t == nil {
		return nil
	}
	out := make(map[string]string, len(t))
	for k, v := range t {
		out[k] = v
	}
	return out
}

func (c *fakeClient) OpenDownstream(ctx context.Context) (Downstream, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dead {
		return nil, errFakeDown
	}
	s := &fakeStream{c: c, txs: map[string]*fakeTx{}}
	c.streams = append(c.streams, s)
	return s, nil
}

type fakeStream struct {
	c *fakeClient

	// Guarded by c.f.mu.
	txs    map[string]*fakeTx
	nextTx int
	broken bool
	inGet  bool
	closed bool
}

type fakeTx struct {
	queue string
	msgs  []Message
}

func (s *fakeStream) abort() {
	f := s.c.f
	f.mu.Lock()
	defer f.mu.Unlock()
	s.broken = true
	s.releaseLocked()
}

// releaseLocked gives every open transaction's messages back (stream ended).
func (s *fakeStream) releaseLocked() {
	f := s.c.f
	for id, tx := range s.txs {
		q := f.queue(tx.queue)
		q.held -= len(tx.msgs)
		q.ready = append(slices.Clone(tx.msgs), q.ready...)
		slices.SortFunc(q.ready, func(a, b Message) int { return int(a.Sequence) - int(b.Sequence) })
		if q.holder == s {
			q.holder = nil
		}
		delete(s.txs, id)
	}
	for _, q := range f.queues {
		if q.holder == s {
			q.holder = nil
		}
	}
	f.notifyLocked()
}

func (s *fakeStream) usable() error {
	if s.broken || s.c.isDead() {
		return errFakeDown
	}
	if s.closed {
		return errors.New("fake kubemq: stream closed")
	}
	return nil
}

func (s *fakeStream) Get(ctx context.Context, queue string, maxItems int, wait time.Duration) (string, []Message, error) {
	f := s.c.f
	f.mu.Lock()
	if err := s.usable(); err != nil {
		f.mu.Unlock()
		return "", nil, err
	}
	if maxItems < 1 || maxItems > 1024 {
		f.mu.Unlock()
		return "", nil, errFakeBad
	}
	if f.getFail != nil {
		if err := f.getFail(queue); err != nil {
			f.mu.Unlock()
			return "", nil, err
		}
	}
	q := f.queue(queue)
	if q.holder != nil {
		f.violate("second open transaction on %s", queue)
		f.mu.Unlock()
		return "", nil, errors.New("strict mode: second open transaction")
	}
	q.holder = s
	s.inGet = true
	wait = max(wait, time.Second)
	deadline := time.Now().Add(wait)
	var got []Message
	for {
		if err := s.usable(); err != nil {
			s.inGet = false
			f.mu.Unlock()
			return "", nil, err
		}
		now := time.Now()
		next := f.promoteLocked(q, now)
		k := min(maxItems-len(got), len(q.ready))
		got = append(got, q.ready[:k]...)
		q.ready = slices.Clone(q.ready[k:])
		if len(got) == maxItems || !now.Before(deadline) {
			break
		}
		wake := deadline
		if !next.IsZero() && next.Before(wake) {
			wake = next
		}
		ch := f.changed
		f.mu.Unlock()
		t := time.NewTimer(wake.Sub(now))
		select {
		case <-ch:
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
		f.mu.Lock()
		if ctx.Err() != nil {
			f.violate("Get abandoned by its caller on %s", queue)
		}
	}
	s.inGet = false
	if len(got) == 0 {
		q.holder = nil
		f.mu.Unlock()
		return "", nil, nil
	}
	s.nextTx++
	id := "tx" + strconv.Itoa(s.nextTx)
	s.txs[id] = &fakeTx{queue: queue, msgs: got}
	q.held += len(got)
	f.mu.Unlock()
	return id, got, nil
}

func (s *fakeStream) settle(tx string, giveBack bool) error {
	f := s.c.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := s.usable(); err != nil {
		return err
	}
	t := s.txs[tx]
	if t == nil {
		f.violate("settlement of unknown transaction %q", tx)
		return errors.New("transaction is completed or transaction id not found")
	}
	delete(s.txs, tx)
	q := f.queue(t.queue)
	q.held -= len(t.msgs)
	if q.holder == s {
		q.holder = nil
	}
	if giveBack {
		q.ready = append(slices.Clone(t.msgs), q.ready...)
	} else if f.ackEcho != nil {
		if n := min(f.ackEcho(t.queue, t.msgs), len(t.msgs)); n > 0 {
			q.ready = append(slices.Clone(t.msgs[:n]), q.ready...)
		}
	}
	f.notifyLocked()
	return nil
}

func (s *fakeStream) AckAll(ctx context.Context, tx string) error        { return s.settle(tx, false) }
func (s *fakeStream) CloseByClient(ctx context.Context, tx string) error { return s.settle(tx, true) }

func (s *fakeStream) Sync(ctx context.Context, tx string) error {
	f := s.c.f
	f.mu.Lock()
	defer f.mu.Unlock()
	return s.usable()
}

func (s *fakeStream) Err() error {
	f := s.c.f
	f.mu.Lock()
	defer f.mu.Unlock()
	return s.usable()
}

func (s *fakeStream) Close() error {
	f := s.c.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if s.inGet {
		f.violate("stream closed with a Get outstanding")
	}
	s.closed = true
	s.releaseLocked()
	return nil
}

// send stores n messages with bodies "prefix-i" in queue (test producer).
func (f *fakeKubeMQ) send(t *testing.T, queue string, ids ...string) {
	t.Helper()
	msgs := make([]Message, len(ids))
	for i, id := range ids {
		msgs[i] = Message{ID: id, Body: []byte("body-" + id), Tags: map[string]string{"k": id}}
	}
	if _, err := f.client().Send(context.Background(), queue, msgs); err != nil {
		t.Fatalf("send: %v", err)
	}
}

// visible counts the messages a Get could take now (due delayed ones included).
func (f *fakeKubeMQ) visible(queue string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	q := f.queue(queue)
	f.promoteLocked(q, time.Now())
	return len(q.ready)
}

// stored counts visible plus delayed messages in queue.
func (f *fakeKubeMQ) stored(queue string) (ready, delayed int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	q := f.queue(queue)
	return len(q.ready), len(q.delayed)
}
