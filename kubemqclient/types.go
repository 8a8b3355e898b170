package kubemqclient

import (
	"math"
	"strings"
	"time"

	"github.com/kubemq-io/kubemq-proxy/kubemqpb"
)

// Event is one events-store event to publish.
type Event struct {
	EventID  string // optional; the client mints a unique id when empty
	Channel  string
	Metadata string // Metadata or Body must be non-empty
	Body     []byte
	Tags     map[string]string
}

// PublishResult is the outcome of one published event. A nil Err means the
// server accepted the event; for the events store that is not a store
// acknowledgement (docs/kubemq.md 3.2).
type PublishResult struct {
	EventID string
	Err     error
}

// EventReceive is one event delivered by an events-store subscription.
type EventReceive struct {
	EventID   string
	Channel   string
	Metadata  string
	Body      []byte
	Timestamp time.Time // when the store received it
	Sequence  uint64    // per channel, from 1
	Tags      map[string]string
}

// QueueMessage is a queue message, to send or as delivered.
type QueueMessage struct {
	MessageID string // optional on send (server-generated when empty); not unique per delivery
	Channel   string
	Metadata  string // Metadata or Body must be non-empty
	Body      []byte
	Tags      map[string]string
	Policy    QueuePolicy
	// Attributes are filled by the server on delivery and ignored on send.
	Attributes QueueAttributes
}

// QueuePolicy is chosen by the sender, per message. Durations are sent in
// whole seconds, rounded up.
type QueuePolicy struct {
	Expiration      time.Duration // 0 = never; counted from send time plus Delay
	Delay           time.Duration // invisible until then
	MaxReceiveCount int           // 0 = server default (1024)
	MaxReceiveQueue string        // dead-letter queue; empty = drop after MaxReceiveCount
}

// QueueAttributes describe one stored copy of a delivered message.
type QueueAttributes struct {
	Timestamp         time.Time // when this copy was stored
	Sequence          uint64    // per queue, of this copy
	ReceiveCount      int       // deliveries including this one
	ReRouted          bool      // arrived through a dead-letter move (a ReQueue leaves it unset)
	ReRoutedFromQueue string
	ExpirationAt      time.Time // zero = none
	DelayedTo         time.Time // zero once the delay was served
}

// SendResult is the outcome of sending one queue message; Err is nil when
// the server stored it.
type SendResult struct {
	MessageID    string
	SentAt       time.Time
	ExpirationAt time.Time
	DelayedTo    time.Time
	Err          error
}

// QueuesInfo is the server's queue statistics.
type QueuesInfo struct {
	TotalQueue int
	Sent       int64
	Delivered  int64
	Waiting    int64
	Queues     []QueueInfo
}

// QueueInfo is one queue's statistics.
type QueueInfo struct {
	Name          string // as the server lists it (see ListedQueueName)
	Messages      int64
	Bytes         int64
	FirstSequence int64
	LastSequence  int64
	Sent          int64
	Delivered     int64
	Waiting       int64
	Subscribers   int64
}

// Listing says what QueuesInfo tells of one queue.
type Listing int

const (
	// NotListed: the server lists no queue under the name (never sent to).
	NotListed Listing = iota
	// Listed: the entry is the queue's.
	Listed
	// Ambiguous: several queues share the name the server lists this one under
	// (ListedQueueName), so its statistics are unknown.
	Ambiguous
)

// ListedQueueName is the name the real KubeMQ (v2.4.0) lists a queue under in QueuesInfo, and
// matches a QueuesInfo filter against: leading and trailing '_', 'Q', 'U', 'E', 'S' and '.'
// trimmed (it takes the name out of its internal subject "_QUEUES_.<name>" by trimming those
// characters; docs/kubemq.md 5.9). So "ORDERS" is listed as "ORDER", "orderS" and "order" share
// one entry name, and a filter with the queue's own name does not find it.
func ListedQueueName(name string) string { return strings.Trim(name, "_QUES.") }

// Lookup finds name's entry in a QueuesInfo answer that asked for it. An entry under the exact
// name is the queue's (a server that lists names as they are); otherwise the one entry under
// ListedQueueName(name) is taken as the queue's, and several are Ambiguous. A listed name shared
// with a queue that exists while this one does not is taken for this one: the server gives no
// way to tell them apart.
func (q QueuesInfo) Lookup(name string) (QueueInfo, Listing) {
	listed := ListedQueueName(name)
	var found QueueInfo
	n := 0
	for _, qi := range q.Queues {
		if qi.Name == name && listed != name {
			return qi, Listed
		}
		if qi.Name == listed {
			found = qi
			n++
		}
	}
	switch n {
	case 0:
		return QueueInfo{}, NotListed
	case 1:
		return found, Listed
	}
	return QueueInfo{}, Ambiguous
}

// Queue returns name's entry, and false when it is not listed or the listing is Ambiguous.
func (q QueuesInfo) Queue(name string) (QueueInfo, bool) {
	qi, l := q.Lookup(name)
	return qi, l == Listed
}

type failer interface{ failure() error }

func (r PublishResult) failure() error { return r.Err }
func (r SendResult) failure() error    { return r.Err }

// FirstError returns the first per-item failure in results, or nil.
func FirstError[R PublishResult | SendResult](results []R) error {
	for i := range results {
		if err := any(&results[i]).(failer).failure(); err != nil { // a pointer: no copy boxed per result
			return err
		}
	}
	return nil
}

// --- conversions ---

func nsTime(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// ceilSeconds converts a policy duration to whole seconds, rounding up.
func ceilSeconds(op, what string, d time.Duration) (int32, error) {
	if d < 0 {
		return 0, invalidArg(op, what+" must not be negative", nil)
	}
	s := (d + time.Second - 1) / time.Second
	if s > math.MaxInt32 {
		return 0, invalidArg(op, what+" too large", nil)
	}
	return int32(s), nil
}

func validMessageContent(op, channel, metadata string, body []byte) error {
	if err := ValidChannel(channel); err != nil {
		return err
	}
	if metadata == "" && len(body) == 0 {
		return invalidArg(op, "message has neither metadata nor body", nil)
	}
	return nil
}

func (c *Client) queueMessageToPB(op string, m *QueueMessage) (*kubemqpb.QueueMessage, error) {
	if err := validMessageContent(op, m.Channel, m.Metadata, m.Body); err != nil {
		return nil, err
	}
	pm := &kubemqpb.QueueMessage{
		MessageID: m.MessageID,
		ClientID:  c.clientID,
		Channel:   m.Channel,
		Metadata:  m.Metadata,
		Body:      m.Body,
		Tags:      m.Tags,
	}
	p := m.Policy
	if p != (QueuePolicy{}) {
		exp, err := ceilSeconds(op, "Expiration", p.Expiration)
		if err != nil {
			return nil, err
		}
		delay, err := ceilSeconds(op, "Delay", p.Delay)
		if err != nil {
			return nil, err
		}
		if p.MaxReceiveCount < 0 || p.MaxReceiveCount > math.MaxInt32 {
			return nil, invalidArg(op, "MaxReceiveCount out of range", nil)
		}
		if p.MaxReceiveQueue != "" {
			if err := ValidChannel(p.MaxReceiveQueue); err != nil {
				return nil, err
			}
		}
		pm.Policy = &kubemqpb.QueueMessagePolicy{
			ExpirationSeconds: exp,
			DelaySeconds:      delay,
			MaxReceiveCount:   int32(p.MaxReceiveCount),
			MaxReceiveQueue:   p.MaxReceiveQueue,
		}
	}
	return pm, nil
}

func queueMessageFromPB(pm *kubemqpb.QueueMessage) QueueMessage {
	m := QueueMessage{
		MessageID: pm.GetMessageID(),
		Channel:   pm.GetChannel(),
		Metadata:  pm.GetMetadata(),
		Body:      pm.GetBody(),
		Tags:      pm.GetTags(),
	}
	if p := pm.GetPolicy(); p != nil {
		m.Policy = QueuePolicy{
			Expiration:      time.Duration(p.GetExpirationSeconds()) * time.Second,
			Delay:           time.Duration(p.GetDelaySeconds()) * time.Second,
			MaxReceiveCount: int(p.GetMaxReceiveCount()),
			MaxReceiveQueue: p.GetMaxReceiveQueue(),
		}
	}
	if a := pm.GetAttributes(); a != nil {
		m.Attributes = QueueAttributes{
			Timestamp:         nsTime(a.GetTimestamp()),
			Sequence:          a.GetSequence(),
			ReceiveCount:      int(a.GetReceiveCount()),
			ReRouted:          a.GetReRouted(),
			ReRoutedFromQueue: a.GetReRoutedFromQueue(),
			ExpirationAt:      nsTime(a.GetExpirationAt()),
			DelayedTo:         nsTime(a.GetDelayedTo()),
		}
	}
	return m
}

func sendResultFromPB(op string, r *kubemqpb.SendQueueMessageResult) SendResult {
	sr := SendResult{
		MessageID:    r.GetMessageID(),
		SentAt:       nsTime(r.GetSentAt()),
		ExpirationAt: nsTime(r.GetExpirationAt()),
		DelayedTo:    nsTime(r.GetDelayedTo()),
	}
	if r.GetIsError() {
		msg := r.GetError()
		if msg == "" {
			msg = "send failed without an error text"
		}
		sr.Err = inBand(op, msg)
	}
	return sr
}

func eventReceiveFromPB(e *kubemqpb.EventReceive) EventReceive {
	return EventReceive{
		EventID:   e.GetEventID(),
		Channel:   e.GetChannel(),
		Metadata:  e.GetMetadata(),
		Body:      e.GetBody(),
		Timestamp: nsTime(e.GetTimestamp()),
		Sequence:  e.GetSequence(),
		Tags:      e.GetTags(),
	}
}

func queuesInfoFromPB(r *kubemqpb.QueuesInfo) QueuesInfo {
	qi := QueuesInfo{
		TotalQueue: int(r.GetTotalQueue()),
		Sent:       r.GetSent(),
		Delivered:  r.GetDelivered(),
		Waiting:    r.GetWaiting(),
	}
	for _, q := range r.GetQueues() {
		qi.Queues = append(qi.Queues, QueueInfo{
			Name: q.GetName(), Messages: q.GetMessages(), Bytes: q.GetBytes(),
			FirstSequence: q.GetFirstSequence(), LastSequence: q.GetLastSequence(),
			Sent: q.GetSent(), Delivered: q.GetDelivered(), Waiting: q.GetWaiting(),
			Subscribers: q.GetSubscribers(),
		})
	}
	return qi
}
