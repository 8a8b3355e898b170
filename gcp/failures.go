package gcp

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/kubemq-io/kubemq-proxy/gcp/limits"
	"github.com/kubemq-io/kubemq-proxy/gcp/names"
)

// backoff is the retry policy's delay after a failed attempt: exponential
// from minimum_backoff, clamped to maximum_backoff; 0 without a policy
// (redeliver at once).
func backoff(e *subEntry, attempt int) time.Duration {
	b, ok, err := limits.RetryPolicy(e.proto.GetRetryPolicy())
	if !ok || err != nil {
		return 0
	}
	d := b.Min
	for i := 1; i < attempt && d < b.Max; i++ {
		d *= 2
		if d <= 0 {
			d = b.Max
		}
	}
	return min(d, b.Max)
}

// failure names one hand-out of a lease (its generation) whose attempt
// failed.
type failure struct {
	l   *lease
	gen uint32
}

// fail handles hand-outs whose attempt failed (nack or expiry): dead-letter
// after the last attempt, otherwise redeliver after the retry backoff.
// Each is re-checked under the lock, since an ack, a modack or a newer
// hand-out of the same lease (after its key was rewound) may have raced
// in. An ordered key's failures are taken in its order: the earliest
// rewinds the later ones, which then go out again rather than fail.
func (r *subRuntime) fail(fs []failure, expired bool) {
	if len(fs) == 0 {
		return
	}
	e := r.entry()
	if e == nil {
		return // gone: its queue is purged, nothing to redeliver
	}
	var dead []*lease
	type nack struct {
		id    string
		delay time.Duration
	}
	var nacks []nack
	var holds []nack     // ordered messages waiting out a backoff in place
	var settled []string // acked messages that waited only for a dead-lettered one
	now := time.Now()
	r.mu.Lock()
	r.sortFailuresLocked(fs)
	for _, fl := range fs {
		l := fl.l
		if r.leases[l.d.LeaseID] != l || l.state != leaseOut || l.gen != fl.gen || (expired && l.deadline.After(now)) {
			continue
		}
		var ks *keyState
		if l.key != "" {
			ks = r.keys[l.key]
		}
		r.leaveOutLocked(l)
		if max := maxAttempts(e); max > 0 && l.attempt >= max {
			// Taken out of circulation, and out of its key's window: the
			// key's later messages go on as they are, since it will not
			// come again. Forgotten once the dead-letter copy is stored.
			r.unheapLocked(l)
			l.state = leaseDeadLetter
			l.flow.release(l, !expired)
			l.flow = nil
			if ks != nil {
				if i := ks.index(l); i >= 0 {
					ks.window = slices.Delete(ks.window, i, i+1)
				}
				settled = append(settled, r.settleAckedHeadLocked(ks)...)
				r.advanceKeyLocked(l.key, ks, now)
				r.notifyLocked()
			}
			dead = append(dead, l)
			continue
		}
		delay := backoff(e, l.attempt)
		if ks != nil {
			// Ordered: redeliver in place; its key's later messages that
			// went out go out again after it.
			r.rewindKeyLocked(ks, l)
			l.flow.release(l, !expired)
			l.flow = nil
			l.attempt++
			l.gen++ // the failed hand-out's ack id is now stale
			if delay <= 0 {
				r.unheapLocked(l)
				l.state = leaseReady
				r.ready = append([]*lease{l}, r.ready...)
				r.advanceKeyLocked(l.key, ks, now)
				r.notifyLocked()
			} else {
				l.state = leaseBackoff
				r.setDeadlineLocked(l, now.Add(delay))
				holds = append(holds, nack{l.d.LeaseID, delay})
			}
			continue
		}
		r.forgetLocked(l, !expired)
		nacks = append(nacks, nack{l.d.LeaseID, delay})
	}
	r.mu.Unlock()
	if len(settled) > 0 {
		r.h.Ack(settled...)
	}
	for _, n := range nacks {
		r.h.Nack(n.id, n.delay)
	}
	for _, h := range holds {
		r.h.Hold(now.Add(h.delay), h.id)
	}
	if len(dead) > 0 {
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			r.deadLetter(e, dead, 0)
		}()
	}
}

// sortFailuresLocked puts the failures of each ordering key in the order
// of its window (publish order): dead-lettered messages of a key reach the
// dead-letter topic in order, and when the earliest failure is redelivered
// the later ones of its key are rewound behind it rather than failed.
func (r *subRuntime) sortFailuresLocked(fs []failure) {
	if len(fs) < 2 || !r.ordered {
		return
	}
	// Window positions, one pass per key (a whole window may expire at once).
	pos := map[*lease]int{}
	for _, f := range fs {
		if ks := r.keys[f.l.key]; ks != nil && f.l.key != "" && len(ks.window) > 0 {
			if _, done := pos[ks.window[0]]; !done {
				for i, w := range ks.window {
					pos[w] = i
				}
			}
		}
	}
	at := func(l *lease) int {
		if i, ok := pos[l]; ok {
			return i
		}
		return -1
	}
	slices.SortStableFunc(fs, func(a, b failure) int {
		if c := strings.Compare(a.l.key, b.l.key); c != 0 {
			return c
		}
		return at(a.l) - at(b.l)
	})
}

// maxAttempts is the dead-letter policy's limit, 0 without a policy.
func maxAttempts(e *subEntry) int {
	n, ok, err := limits.DeadLetterAttempts(e.proto.GetDeadLetterPolicy())
	if !ok || err != nil {
		return 0
	}
	return int(n)
}

// deadLetter republishes each message to the dead-letter topic through the
// normal publish path, then acks the original. When that is impossible
// (topic gone, backend down) the message is never dropped:
//   - on an ordered subscription it stays out of circulation and
//     dead-lettering is tried again after a backoff (tries counts the
//     failures so far), as its key's later messages have gone on without
//     it: delivering it again would put it behind them. Its lease record
//     keeps it durable meanwhile. Should the subscription lose its
//     dead-letter policy, it is delivered again;
//   - otherwise it is delivered again, and dead-lettered when that fails.
func (r *subRuntime) deadLetter(e *subEntry, ls []*lease, tries int) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sn, _ := names.ParseSubscription(e.proto.GetName())
	var err error
	var t *topicEntry
	if tn, perr := names.ParseTopic(e.proto.GetDeadLetterPolicy().GetDeadLetterTopic()); perr != nil {
		err = perr
	} else if te, ok := r.s.cat.topic(tn.ID); !ok {
		err = notFound(tn.ID)
	} else {
		t = te
	}
	if err == nil {
		msgs := make([]*pubsubpb.PubsubMessage, len(ls))
		for i, l := range ls {
			m := decodeMessage(l.d.Body, l.d.Tags, l.d.MessageID, l.d.StoredAt, time.Now())
			attrs := make(map[string]string, len(m.Attributes)+4)
			for k, v := range m.Attributes {
				attrs[k] = v
			}
			attrs[attrDLSourceSubscription] = sn.String()
			attrs[attrDLSourceSubscriptionProject] = sn.Project
			attrs[attrDLSourceDeliveryCount] = strconv.Itoa(l.attempt)
			if m.PublishTime != nil {
				attrs[attrDLSourceTopicPublishTime] = m.PublishTime.AsTime().UTC().Format(time.RFC3339Nano)
			}
			msgs[i] = &pubsubpb.PubsubMessage{Data: m.Data, Attributes: attrs, OrderingKey: m.OrderingKey}
		}
		_, err = r.s.publish(ctx, t, msgs)
	}
	if err != nil {
		r.dlFailed.Add(float64(len(ls)))
	}
	r.mu.Lock()
	if err != nil && r.ordered && !r.closed && e.proto.GetDeadLetterPolicy() != nil {
		var keep []*lease // those a reset (backend outage) has not dropped
		for _, l := range ls {
			if r.leases[l.d.LeaseID] == l {
				keep = append(keep, l)
			}
		}
		r.mu.Unlock()
		if len(keep) > 0 {
			r.deadLetterLater(keep, tries, err)
		}
		return
	}
	ids := make([]string, 0, len(ls))
	for _, l := range ls {
		ids = append(ids, l.d.LeaseID)
		if r.leases[l.d.LeaseID] == l {
			r.forgetLocked(l, false)
		}
	}
	r.mu.Unlock()
	if err != nil {
		r.s.log.Warn("dead-lettering failed; the messages are redelivered", zap.String("subscription", r.id), zap.Error(err))
		for _, id := range ids {
			r.h.Nack(id, 0)
		}
		return
	}
	r.deadLettered.Add(float64(len(ls)))
	r.h.Ack(ids...)
}

// deadLetterLater tries dead-lettering ls again after a backoff that
// grows with tries (1 s doubling to 1 min), unless the runtime closes
// first (its leases were then released or settled). Called from a
// deadLetter call, whose own count holds r.wg open for the Add.
func (r *subRuntime) deadLetterLater(ls []*lease, tries int, cause error) {
	delay := min(time.Second<<min(tries, 6), time.Minute)
	r.s.log.Warn("dead-lettering failed; tried again later", zap.String("subscription", r.id),
		zap.Int("messages", len(ls)), zap.Duration("in", delay), zap.Error(cause))
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		t := time.NewTimer(delay)
		defer t.Stop()
		select {
		case <-r.done:
			return
		case <-t.C:
		}
		if e := r.entry(); e != nil {
			r.deadLetter(e, ls, tries+1)
		}
	}()
}
