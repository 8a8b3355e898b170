package delivery

import (
	"context"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"
)

// Sentinels.
//
// A sentinel is an empty lease record (no entries) stored with the records' delay and a
// TagSentinel naming it. The backend's delay machinery hands delayed messages of one delay back
// in the order they were stored (the real server's processor works through them in send order,
// docs/kubemq.md 9.1), so when a sentinel comes back every lease record stored on its queue
// before it (with the same delay) has come back too, and the OnUnsettled hook has been told of
// every entry those records carried for another owner. Ordered Pub/Sub subscriptions use this to
// end their recovery hold at the right time even when the delay machinery is backed up.
//
// A sentinel that reaches a Consumer which did not write it (another replica's, or one of a
// process that died) is stored again with the same delay until its expiry, so that it can still
// reach its writer; then it is dropped. Older Consumers see an empty record and drop it.

// TagSentinel marks a sentinel record; the value is "<expiry, Unix ms>:<id>".
const TagSentinel = "_kmqp_sentinel"

// sentinelLife bounds how long a sentinel that no longer reaches its writer circulates.
var sentinelLife = time.Minute // a variable for tests

// ownSentinel is one of the Consumer's sentinels on its way: the channel to close, and when to
// forget it should it never come back.
type ownSentinel struct {
	ch     chan struct{}
	forget time.Time
}

// sentinelMetadata fills the Metadata of a sentinel: KubeMQ refuses a message with neither
// Metadata nor Body.
const sentinelMetadata = "lease sentinel"

// Sentinel stores a sentinel record on the Consumer's queue and returns a channel that is closed
// when it comes back to this Consumer: every lease record stored on the queue before this call
// with the same delay has then come back (to some Consumer of the queue) and been reported. The
// record is stored in the background, retried until stored or the Consumer closes. The channel
// may never close: when the Consumer closes first, when another replica's Consumer receives
// the sentinel on every return until its expiry, or when the backend loses it. Callers bound
// their wait. Sentinels come back only while the Consumer polls (some Fetch waits).
func (h *Handle) Sentinel() <-chan struct{} { return h.c.sentinel() }

func (c *Consumer) sentinel() <-chan struct{} {
	ch := make(chan struct{})
	id := c.ids.next()
	value := strconv.FormatInt(time.Now().Add(sentinelLife).UnixMilli(), 10) + ":" + id
	c.mu.Lock()
	if c.closing {
		c.mu.Unlock()
		return ch
	}
	if c.sentinels == nil {
		c.sentinels = map[string]ownSentinel{}
	}
	now := time.Now()
	for k, o := range c.sentinels {
		if now.After(o.forget) { // lost, or circulating elsewhere for good
			delete(c.sentinels, k)
		}
	}
	c.sentinels[id] = ownSentinel{ch, now.Add(2 * sentinelLife)}
	c.bg.Add(1)
	c.mu.Unlock()
	go func() {
		defer c.bg.Done()
		if err := c.storeSentinels(c.settleCtx, []string{value}); err != nil && c.settleCtx.Err() == nil {
			c.log.Warn("store lease sentinel", zap.Error(err))
		}
	}()
	return ch
}

// storeSentinels stores one sentinel record per TagSentinel value.
func (c *Consumer) storeSentinels(ctx context.Context, values []string) error {
	if err := c.sendAll(ctx, c.sentinelMessages(values)); err != nil {
		return err
	}
	c.st.sentinelsStored.Add(uint64(len(values)))
	return nil
}

// sentinelMessages builds one sentinel record per TagSentinel value.
func (c *Consumer) sentinelMessages(values []string) []Message {
	msgs := make([]Message, len(values))
	for i, v := range values {
		msgs[i] = Message{
			ID:           c.ids.next(),
			Metadata:     sentinelMetadata,
			Tags:         map[string]string{TagRecord: recordVersion, TagSentinel: v},
			DelaySeconds: int(c.opts.RecordDelay / time.Second),
		}
	}
	return msgs
}

// sentinelsLocked sorts the returned sentinel values: the channels of this Consumer's own ones
// (removed from the table, to be closed by the caller) and the foreign ones still to be
// stored again.
func (c *Consumer) sentinelsLocked(values []string, now time.Time) (own []chan struct{}, again []string) {
	if len(values) == 0 {
		return nil, nil // the usual Get
	}
	for _, v := range values {
		exp, id, ok := strings.Cut(v, ":")
		if o, mine := c.sentinels[id]; ok && mine {
			delete(c.sentinels, id)
			own = append(own, o.ch)
			continue
		}
		// Another Consumer's sentinel goes round again until its expiry, so that it can reach
		// its writer; with Owners its writer no longer consumes the queue.
		if ms, err := strconv.ParseInt(exp, 10, 64); ok && err == nil && now.UnixMilli() < ms && !c.exclusive {
			again = append(again, v)
			continue
		}
		c.st.sentinelsDropped.Add(1)
	}
	c.st.sentinelsReturned.Add(uint64(len(own)))
	c.st.sentinelsBounced.Add(uint64(len(again)))
	return own, again
}
