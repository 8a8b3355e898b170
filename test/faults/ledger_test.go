package faults

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// ledger accounts for one protocol's messages in one run. A message is
// "acknowledged" when its publish was confirmed (Publish returned an id;
// basic.ack arrived) and "delivered" when a healthy consumer received and
// acked it; a delivery to the stalled consumer is "held", not delivered.
type ledger struct {
	proto  string
	prefix string                 // id prefix of this run's messages
	trace  func(id string) string // the client-side history of a message, if known

	mu        sync.Mutex // guards everything below
	seq       int
	sent      map[string]time.Time
	acked     map[string]time.Time
	failed    map[string]error
	delivered map[string][]time.Time // every healthy delivery
	flagged   map[string]bool        // a healthy delivery carried the redelivered flag
	held      map[string]time.Time   // first delivery to the stalled consumer
	heldEnd   time.Time              // when the stalled consumer let go
	unknown   []string               // bodies that are not ours
	corrupt   []string               // ours, but altered
}

func newLedger(proto, prefix string) *ledger {
	return &ledger{proto: proto, prefix: prefix, sent: map[string]time.Time{}, acked: map[string]time.Time{},
		failed: map[string]error{}, delivered: map[string][]time.Time{}, flagged: map[string]bool{}, held: map[string]time.Time{}}
}

// Next mints the next message: its id and body.
func (l *ledger) Next() (id string, body []byte) {
	l.mu.Lock()
	l.seq++
	id = fmt.Sprintf("%s-%07d", l.prefix, l.seq)
	l.sent[id] = time.Now()
	l.mu.Unlock()
	return id, bodyOf(id)
}

// bodyOf is the payload of message id: the id and a digest of it, so a
// delivery proves both identity and integrity.
func bodyOf(id string) []byte {
	sum := sha256.Sum256([]byte(id))
	return []byte(id + "|" + hex.EncodeToString(sum[:16]))
}

// parse returns the id in body and whether body is intact.
func (l *ledger) parse(body []byte) (id string, ours, intact bool) {
	id, _, ok := strings.Cut(string(body), "|")
	if !ok || !strings.HasPrefix(id, l.prefix+"-") {
		return string(body), false, false
	}
	return id, true, string(bodyOf(id)) == string(body)
}

func (l *ledger) Acked(id string) {
	l.mu.Lock()
	l.acked[id] = time.Now()
	l.mu.Unlock()
}

func (l *ledger) Failed(id string, err error) {
	l.mu.Lock()
	l.failed[id] = err
	l.mu.Unlock()
}

// Delivered records a healthy consumer's receipt of body (redelivered: the
// protocol's redelivery flag, AMQP only); it returns the id and false when
// the body is foreign or corrupt (which the run fails).
func (l *ledger) Delivered(body []byte, redelivered bool) (string, bool) {
	id, ours, intact := l.parse(body)
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case !ours:
		l.unknown = append(l.unknown, truncate(id, 80))
		return id, false
	case !intact:
		l.corrupt = append(l.corrupt, truncate(string(body), 80))
		return id, false
	}
	l.delivered[id] = append(l.delivered[id], time.Now())
	if redelivered {
		l.flagged[id] = true
	}
	return id, true
}

// Held records a delivery to the stalled consumer.
func (l *ledger) Held(body []byte) {
	id, ours, intact := l.parse(body)
	if !ours || !intact {
		l.Delivered(body, false) // accounted (and failed) the same way
		return
	}
	l.mu.Lock()
	if _, ok := l.held[id]; !ok {
		l.held[id] = time.Now()
	}
	l.mu.Unlock()
}

// HeldID records that the stalled consumer's client received message id
// (Pub/Sub: also the ones its flow control keeps from the callback).
func (l *ledger) HeldID(id string) {
	if !strings.HasPrefix(id, l.prefix+"-") {
		return
	}
	l.mu.Lock()
	if _, ok := l.held[id]; !ok {
		l.held[id] = time.Now()
	}
	l.mu.Unlock()
}

// ReleasedAt is when the stalled consumer let go (zero: not yet).
func (l *ledger) ReleasedAt() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.heldEnd
}

// Released marks the moment the stalled consumer let go of its messages.
func (l *ledger) Released() {
	l.mu.Lock()
	l.heldEnd = time.Now()
	l.mu.Unlock()
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// summary is the ledger's verdict for the report.
type summary struct {
	Proto                  string
	Sent, Acked, Failed    int
	Pending                int // publishes not resolved yet
	Delivered              int // unique ids delivered (acked or not)
	Lost                   int // acked, never delivered
	Duplicated             int // deliveries beyond the first
	Held                   int // delivered to the stalled consumer
	HeldRedelivered        int // of those, delivered to a healthy consumer
	HeldRedeliveredEarly   int // ... while the stalled consumer still held them
	HeldFlagged            int // ... with the redelivered flag set (AMQP)
	Unknown, Corrupt       int
	LostIDs, UnknownBodies []string
}

func (l *ledger) Summary() summary {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := summary{Proto: l.proto, Sent: len(l.sent), Acked: len(l.acked), Failed: len(l.failed),
		Unknown: len(l.unknown), Corrupt: len(l.corrupt), Held: len(l.held)}
	s.Pending = s.Sent - s.Acked - s.Failed
	for id, ds := range l.delivered {
		if _, ok := l.sent[id]; !ok {
			continue
		}
		s.Delivered++
		s.Duplicated += len(ds) - 1
	}
	for id := range l.acked {
		if len(l.delivered[id]) == 0 {
			s.Lost++
			s.LostIDs = append(s.LostIDs, id)
		}
	}
	for id, heldAt := range l.held {
		ds := l.delivered[id]
		if len(ds) == 0 {
			continue
		}
		s.HeldRedelivered++
		if l.flagged[id] {
			s.HeldFlagged++
		}
		for _, at := range ds {
			// A healthy delivery before the hold is a duplicate that reached
			// the stalled consumer, not a redelivery.
			if at.After(heldAt) && (l.heldEnd.IsZero() || at.Before(l.heldEnd)) {
				s.HeldRedeliveredEarly++
				break
			}
		}
	}
	sort.Strings(s.LostIDs)
	s.UnknownBodies = append(append([]string(nil), l.unknown...), l.corrupt...)
	return s
}

// Since counts publishes acknowledged and deliveries made after t: proof
// that the protocol recovered from a fault by itself.
func (l *ledger) Since(t time.Time) (acked, delivered int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, at := range l.acked {
		if at.After(t) {
			acked++
		}
	}
	for _, ds := range l.delivered {
		for _, at := range ds {
			if at.After(t) {
				delivered++
			}
		}
	}
	return acked, delivered
}

// LostDetail describes up to n lost messages with their timeline, for a
// failure report the owners can act on.
func (l *ledger) LostDetail(n int) string {
	s := l.Summary()
	l.mu.Lock()
	defer l.mu.Unlock()
	var b strings.Builder
	for i, id := range s.LostIDs {
		if i == n {
			fmt.Fprintf(&b, "  ... and %d more\n", len(s.LostIDs)-n)
			break
		}
		held := ""
		if at, ok := l.held[id]; ok {
			held = " held-by-stalled-consumer=" + at.Format("15:04:05.000")
		}
		fmt.Fprintf(&b, "  %s sent=%s acked=%s%s\n", id, l.sent[id].Format("15:04:05.000"), l.acked[id].Format("15:04:05.000"), held)
		if l.trace != nil && i < 5 {
			b.WriteString(l.trace(id) + "\n")
		}
	}
	return b.String()
}

// waitSettled waits until every publish resolved, nothing acknowledged is
// missing and every held message came back (or ctx ends).
func (l *ledger) waitSettled(ctx context.Context, logf func(string, ...any)) error {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	start, lastLog := time.Now(), time.Now()
	for {
		s := l.Summary()
		if s.Pending == 0 && s.Lost == 0 && s.HeldRedelivered == s.Held {
			logf("%s settled in %v", l.proto, time.Since(start).Round(time.Millisecond))
			return nil
		}
		if time.Since(lastLog) > 5*time.Second {
			if l.trace != nil && len(s.LostIDs) > 0 && time.Since(start) > 15*time.Second && lastLog.Sub(start) <= 15*time.Second {
				logf("%s: history of %s:\n%s", l.proto, s.LostIDs[0], l.trace(s.LostIDs[0]))
			}
			lastLog = time.Now()
			logf("%s settling for %v: %d publishes unresolved, %d acknowledged undelivered (first: %v), %d held not back",
				l.proto, time.Since(start).Round(time.Second), s.Pending, s.Lost, s.LostIDs[:min(3, len(s.LostIDs))], s.Held-s.HeldRedelivered)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: not settled: %d publishes unresolved, %d acknowledged messages undelivered, %d of %d held messages not redelivered",
				l.proto, s.Pending, s.Lost, s.Held-s.HeldRedelivered, s.Held)
		case <-tick.C:
		}
	}
}

func TestLedgerAccounting(t *testing.T) {
	l := newLedger("test", "r1")
	var ids []string
	for i := 0; i < 5; i++ {
		id, body := l.Next()
		ids = append(ids, id)
		if i < 4 {
			l.Acked(id)
		} else {
			l.Failed(id, fmt.Errorf("nacked"))
		}
		if i != 1 { // ids[1] is lost
			if _, ok := l.Delivered(body, false); !ok {
				t.Fatalf("own body %q refused", body)
			}
		}
	}
	l.Delivered(bodyOf(ids[2]), false) // a duplicate
	l.Held(bodyOf(ids[3]))
	l.Delivered(bodyOf(ids[3]), true) // the held message comes back
	if _, ok := l.Delivered([]byte("other-1|x"), false); ok {
		t.Fatal("foreign body accepted")
	}
	bad := bodyOf(ids[0])
	bad[len(bad)-1] ^= 1
	if _, ok := l.Delivered(bad, false); ok {
		t.Fatal("corrupt body accepted")
	}
	s := l.Summary()
	want := summary{Proto: "test", Sent: 5, Acked: 4, Failed: 1, Delivered: 4, Lost: 1, Duplicated: 2,
		Held: 1, HeldRedelivered: 1, HeldRedeliveredEarly: 1, HeldFlagged: 1, Unknown: 1, Corrupt: 1}
	got := s
	got.LostIDs, got.UnknownBodies = nil, nil
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("summary\n got %+v\nwant %+v", got, want)
	}
	if len(s.LostIDs) != 1 || s.LostIDs[0] != ids[1] {
		t.Fatalf("lost ids %v, want [%s]", s.LostIDs, ids[1])
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := l.waitSettled(ctx, t.Logf); err == nil {
		t.Fatal("settled with a lost message")
	}
}
