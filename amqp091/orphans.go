package amqp091

import (
	"go.uber.org/zap"
)

// Auto-delete queues whose consumers died with a replica.
//
// The holder of an auto-delete queue deletes it when its last consumer goes
// (consume.go, peer.go): it sees every consumer of the fleet, its own
// clients' and the ones other replicas forward to it. A holder that dies
// (kill -9, node loss) takes its own clients' consumers with it, and nobody
// sees them end: the replica that holds the queue next only meets the
// consumers that are still there. So every replica reports, with its
// heartbeats, the auto-delete queues its clients consume (localUses), and
// the fleet's sweeper (the replica with the lowest id, transient.go) deletes
// a queue that a dead replica's clients consumed and no live replica's
// clients do (Fleet.Orphaned), as RabbitMQ deletes it when the connections of
// its last consumers drop.

// fleetUses is implemented by a Fleet that carries each replica's uses
// (proxy.Fleet, through the ownership log's heartbeats).
type fleetUses interface {
	// ReportUses sets the function each heartbeat calls for the queues
	// (KubeMQ channels) this replica's clients consume.
	ReportUses(func() []string)
	// UsesChanged asks for a heartbeat now: a consumer of an auto-delete
	// queue started here.
	UsesChanged()
	// Orphaned returns the queues a dead replica's clients consumed and
	// no live replica's clients consume.
	Orphaned() []string
}

// usesChanged reports at once that this replica's clients consume a new
// auto-delete queue, so that a crash within the heartbeat interval does
// not leave it unreported.
func (s *Server) usesChanged() {
	if fu, ok := s.opts.Fleet.(fleetUses); ok {
		fu.UsesChanged()
	}
}

// localUses returns the channels of the auto-delete queues that this
// replica's clients consume, served here or forwarded.
func (s *Server) localUses() []string {
	var out []string
	for _, v := range s.top.snapshot() {
		v.mu.Lock()
		for _, q := range v.queues {
			if !q.autoDelete || q.deleted {
				continue
			}
			for cs := range q.consumers {
				if cs.ch != nil {
					out = append(out, q.channel)
					break
				}
			}
		}
		v.mu.Unlock()
	}
	return out
}

// sweepOrphans deletes the auto-delete queues whose consumers ended with a
// replica that died: named by Orphaned in this sweep and the one before
// (every live replica heartbeated in between, so a consumer that was
// starting on one of them shows), without a consumer here. The sweeper
// (the fleet's lowest replica) calls it.
func (t *topology) sweepOrphans(fu fleetUses) {
	orphaned := map[string]bool{}
	for _, ch := range fu.Orphaned() {
		orphaned[ch] = true
	}
	sw := &t.sweeper
	sw.mu.Lock()
	prev := sw.orphans
	sw.orphans = orphaned
	sw.mu.Unlock()
	for ch := range orphaned {
		if !prev[ch] {
			t.log.Info("an auto-delete queue's consumers ended with a replica that died; deleted at the next sweep if still so", zap.String("channel", ch))
		}
	}
	if len(orphaned) == 0 {
		return
	}
	t.log.Debug("orphaned auto-delete queues", zap.Int("now", len(orphaned)), zap.Int("before", len(prev)))
	var drop []*queue
	for _, v := range t.snapshot() {
		v.mu.Lock()
		for _, q := range v.queues {
			if orphaned[q.channel] && prev[q.channel] && q.autoDelete && !q.deleted && len(q.consumers) == 0 {
				drop = append(drop, q)
			}
		}
		v.mu.Unlock()
	}
	for _, q := range drop {
		t.log.Info("deleting an auto-delete queue whose consumers ended with a replica that died",
			zap.String("vhost", q.vh.displayName()), zap.String("queue", q.name))
		t.srv.dropQueue(q, "auto-delete queue lost its last consumer (its replica died)", t.log)
	}
}
