package amqp091

import (
	"cmp"
	"context"
	"slices"
	"time"
)

// State is the front-end's live view for the proxy's GET /state.
type State struct {
	Connections []ConnState  `json:"connections"`
	Vhosts      []VhostState `json:"vhosts"`
}

// ConnState is one open AMQP connection.
type ConnState struct {
	ID       uint64    `json:"id"` // the "conn" field of its log lines
	Remote   string    `json:"remote"`
	User     string    `json:"user"`
	Vhost    string    `json:"vhost"`
	Client   string    `json:"client,omitempty"` // client-properties "connection_name" or product
	Since    time.Time `json:"since"`
	Channels int       `json:"channels"`
	// Consumers are basic.consume consumers on the connection's channels.
	Consumers int `json:"consumers"`
	// PendingPublishBytes: published bodies not yet stored in KubeMQ;
	// Blocked while reading is paused for them (back-pressure).
	PendingPublishBytes int64 `json:"pending_publish_bytes"`
	Blocked             bool  `json:"blocked,omitempty"`
}

// VhostState is one virtual host's topology as this replica holds it.
type VhostState struct {
	Name      string       `json:"name"` // as clients name it ("/" for the default)
	Exchanges int          `json:"exchanges"`
	Queues    []QueueState `json:"queues"`
}

// QueueState is one queue.
type QueueState struct {
	Name       string `json:"name"`
	Channel    string `json:"kubemq_channel"`
	Durable    bool   `json:"durable,omitempty"`
	Exclusive  bool   `json:"exclusive,omitempty"`
	AutoDelete bool   `json:"auto_delete,omitempty"`
	Consumers  int    `json:"consumers"`
	// The figures of QueueStats: ready (absent when KubeMQ's count is unknown), unacked and the
	// oldest unacked message's age on this replica, and its counts since it started.
	MessagesReady        *int64  `json:"messages_ready,omitempty"`
	MessagesUnacked      int     `json:"messages_unacknowledged"`
	OldestUnackedSeconds float64 `json:"oldest_unacked_age_seconds"`
	Published            uint64  `json:"published"`
	Delivered            uint64  `json:"delivered"`
	Acked                uint64  `json:"acked"`
}

// State describes connections, vhosts and queues (proxy.Stater).
func (s *Server) State() any {
	st := State{Connections: []ConnState{}, Vhosts: []VhostState{}} // [] rather than null in JSON
	s.mu.Lock()
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		if !c.opened.Load() {
			continue // still in the handshake: nothing settled to show
		}
		st.Connections = append(st.Connections, ConnState{
			ID: c.id, Remote: c.nc.RemoteAddr().String(), User: c.user, Vhost: c.vhostName, Client: c.clientName,
			Since: c.since, Channels: int(c.nChannels.Load()), Consumers: int(c.nConsumers.Load()),
			PendingPublishBytes: c.pending.Load(), Blocked: c.blocked.Load(),
		})
	}
	slices.SortFunc(st.Connections, func(a, b ConnState) int { return cmp.Compare(a.ID, b.ID) })

	s.top.mu.Lock()
	vhosts := make([]*vhost, 0, len(s.top.vhosts))
	for _, v := range s.top.vhosts {
		vhosts = append(vhosts, v)
	}
	s.top.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	stats, _ := s.QueueStats(ctx)
	cancel()
	byQueue := make(map[queueLabel]QueueStats, len(stats))
	for _, qs := range stats {
		byQueue[queueLabel{qs.Vhost, qs.Name}] = qs
	}
	for _, v := range vhosts {
		vs := VhostState{Name: v.displayName(), Exchanges: len(v.routes.Exchanges()), Queues: []QueueState{}}
		v.mu.Lock()
		for _, q := range v.queues {
			if q.deleted {
				continue
			}
			qs := QueueState{Name: q.name, Channel: q.channel, Durable: q.durable,
				Exclusive: q.exclusive, AutoDelete: q.autoDelete, Consumers: len(q.consumers)}
			if st, ok := byQueue[queueLabel{v.displayName(), q.name}]; ok {
				if st.Ready >= 0 {
					qs.MessagesReady = &st.Ready
				}
				qs.MessagesUnacked, qs.OldestUnackedSeconds = st.Unacked, st.OldestUnacked.Seconds()
				qs.Published, qs.Delivered, qs.Acked = st.Published, st.Delivered, st.Acked
			}
			vs.Queues = append(vs.Queues, qs)
		}
		v.mu.Unlock()
		slices.SortFunc(vs.Queues, func(a, b QueueState) int { return cmp.Compare(a.Name, b.Name) })
		st.Vhosts = append(st.Vhosts, vs)
	}
	slices.SortFunc(st.Vhosts, func(a, b VhostState) int { return cmp.Compare(a.Name, b.Name) })
	return st
}
