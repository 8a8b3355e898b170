package gcp

import (
	"context"
	"slices"
	"time"

	"github.com/kubemq-io/kubemq-proxy/gcp/names"
)

// State is the front-end's live view for the proxy's GET /state.
type State struct {
	Topics         int        `json:"topics"`
	StreamingPulls int        `json:"streaming_pulls"`
	Subscriptions  []SubState `json:"subscriptions"`
}

// SubState is one subscription as this replica sees it.
type SubState struct {
	ID       string `json:"id"`
	Topic    string `json:"topic"` // "_deleted-topic_" once its topic is gone
	Queue    string `json:"queue"` // the KubeMQ queue holding its backlog
	Ordered  bool   `json:"ordered,omitempty"`
	Detached bool   `json:"detached,omitempty"`
	Filter   string `json:"filter,omitempty"`
	// Active: a delivery runtime runs here (some client pulled since start).
	Active bool `json:"active"`
	// Leases held here: out to clients, (ordered) waiting behind their key
	// or in a retry backoff, and (ordered) acked but held until every
	// earlier message of their key is settled.
	Out     int `json:"out"`
	Waiting int `json:"waiting,omitempty"`
	Acked   int `json:"acked_held,omitempty"`
	// DeadLettering: out of their last attempt, being forwarded to the
	// dead-letter topic (on an ordered subscription, also while that
	// fails and is tried again).
	DeadLettering int `json:"dead_lettering,omitempty"`
	// Ordering recovery after a restart or an outage (while keys are held
	// back): the hold's least end; while its sentinel record is out, the
	// latest end (it ends a second after the sentinel's return); and
	// messages known to be on their way back from lease records.
	RecoveringUntil *time.Time `json:"recovering_until,omitempty"`
	SentinelOut     *time.Time `json:"recovery_sentinel_out_until,omitempty"`
	Awaited         int        `json:"awaited,omitempty"`
	// The figures of SubscriptionStats: ready (absent when KubeMQ's count is unknown),
	// unacked (leased by this replica's lease engine), the oldest unacked message's age
	// since publish, and Pull calls and streams using it here.
	MessagesReady        *int64  `json:"messages_ready,omitempty"`
	MessagesUnacked      int     `json:"messages_unacked"`
	OldestUnackedSeconds float64 `json:"oldest_unacked_message_age_seconds"`
	Consumers            int     `json:"consumers"`
}

// State describes topics, subscriptions and open streams (proxy.Stater).
func (s *Server) State() any {
	st := State{Topics: len(s.cat.topicIDs()), StreamingPulls: int(s.m.openStreams.Load()), Subscriptions: []SubState{}}
	ids := s.cat.subIDs()
	slices.Sort(ids)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	stats, _ := s.SubscriptionStats(ctx)
	cancel()
	byID := make(map[string]SubscriptionStats, len(stats))
	for _, st := range stats {
		byID[st.ID] = st
	}
	now := time.Now()
	for _, id := range ids {
		e, ok := s.cat.sub(id)
		if !ok {
			continue
		}
		ss := SubState{ID: id, Topic: e.topicID, Queue: e.queue, Ordered: e.proto.GetEnableMessageOrdering(),
			Detached: e.proto.GetDetached(), Filter: e.proto.GetFilter()}
		if !s.cat.attached(e) {
			ss.Topic = names.DeletedTopic
		}
		if st, ok := byID[id]; ok {
			if st.Ready >= 0 {
				ss.MessagesReady = &st.Ready
			}
			ss.MessagesUnacked, ss.OldestUnackedSeconds, ss.Consumers = st.Unacked, st.OldestUnacked.Seconds(), st.Consumers
		}
		if r := s.lookupRuntime(e); r != nil {
			ss.Active = true
			r.mu.Lock()
			for _, l := range r.leases {
				switch l.state {
				case leaseOut:
					ss.Out++
				case leaseAcked:
					ss.Acked++
				case leaseDeadLetter:
					ss.DeadLettering++
				default:
					ss.Waiting++
				}
			}
			if now.Before(r.recoveryEndLocked()) {
				least := r.recoverUntil
				ss.RecoveringUntil = &least
				if r.sentinel != nil {
					latest := r.recoverCap
					ss.SentinelOut = &latest
				}
			}
			for _, w := range r.awaiting {
				ss.Awaited += len(w)
			}
			r.mu.Unlock()
		}
		st.Subscriptions = append(st.Subscriptions, ss)
	}
	return st
}
