package amqp091

import (
	"context"
	"encoding/json"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/kubemq-io/kubemq-proxy/registry"
)

// Non-durable topology across replicas. RabbitMQ's transient exchanges,
// non-durable and exclusive queues, and the bindings that involve them are
// seen by every node of a cluster: a publisher on one node routes to an
// exclusive queue declared on another (the publish/subscribe pattern: each
// subscriber binds a server-named exclusive queue to a fanout exchange).
// With replicas (Options.Fleet), this process writes them as registry
// records of their own kinds, tagged with the replica that declared them,
// so every replica routes to them and refuses a second exclusive owner;
// they are not durable in RabbitMQ's sense:
//
//   - a queue lives until deleted, until its exclusive connection closes,
//     or until the replica that declared it is gone (it stopped or died, as
//     a RabbitMQ node that stops takes its transient queues with it): after
//     that replica has been out of the fleet for sweepGrace, the replica
//     with the lowest id deletes the queue and purges it;
//   - an exchange lives while the fleet does: when its replica is gone, the
//     lowest replica takes it over (writes it again under its own id) if it
//     saw that replica alive, and deletes it if not (every replica of the
//     fleet stopped, as a RabbitMQ cluster restart drops transient
//     exchanges);
//   - a binding lives while both its ends do;
//   - a replica that restarts with the same id (cluster.replica_id, or an
//     embedded server's data dir) deletes the queues of its earlier life,
//     and its exchanges too when it is alone.
//
// Without Options.Fleet (one process on its own) they stay in memory.

// Registry record kinds of non-durable topology (see above). Kinds of their
// own: a replica of an earlier version ignores them rather than take them
// for durable ones.
const (
	kindTExchange = "amqp.transient-exchange"
	kindTQueue    = "amqp.transient-queue"
	kindTBinding  = "amqp.transient-binding"
)

// Fleet tells the server which replicas share its KubeMQ, for the lifetime
// of non-durable topology.
type Fleet interface {
	// ID is this replica's id.
	ID() string
	// Alive returns the ids of the replicas heard from recently, this one
	// included; nil while that is not known yet.
	Alive() []string
	// Lease is how long a replica stays in Alive after its last sign of life.
	Lease() time.Duration
}

// sweepEvery is how often the non-durable topology of gone replicas is
// looked for.
const sweepEvery = 2 * time.Second

// sweeper tracks the replicas this one saw, for sweep.
type sweeper struct {
	mu      sync.Mutex
	since   time.Time            // when Alive was first known
	seen    map[string]time.Time // replica id -> last time it was alive
	exOwned map[string]bool      // record keys of exchanges declared (or taken over) by this process
	orphans map[string]bool      // the channels Fleet.Orphaned named at the last sweep (orphans.go)
	leading bool                 // this replica swept as the fleet's lowest at the last sweep
}

// sharesTransient reports whether non-durable topology is written to the
// registry.
func (t *topology) sharesTransient() bool {
	return t.reg != nil && t.srv != nil && t.srv.opts.Fleet != nil
}

// replicaID is this replica's id, "" without a fleet.
func (t *topology) replicaID() string {
	if t.srv == nil || t.srv.opts.Fleet == nil {
		return ""
	}
	return t.srv.opts.Fleet.ID()
}

// sweepLoop runs sweep until the server stops.
func (s *Server) sweepLoop() {
	defer s.wg.Done()
	tick := time.NewTicker(sweepEvery)
	defer tick.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-tick.C:
		}
		s.top.sweep(time.Now())
	}
}

// sweep deletes (or takes over) the non-durable topology of replicas that
// are gone, and of this replica's earlier life.
func (t *topology) sweep(now time.Time) {
	f := t.srv.opts.Fleet
	alive := f.Alive()
	if alive == nil || !t.reg.Replayed() || t.srv.ctx.Err() != nil {
		return
	}
	self := f.ID()
	grace := 2 * f.Lease()
	sw := &t.sweeper
	sw.mu.Lock()
	if sw.seen == nil {
		sw.seen = map[string]time.Time{}
	}
	if sw.since.IsZero() {
		sw.since = now
	}
	for _, id := range alive {
		sw.seen[id] = now
	}
	slices.Sort(alive)
	leader := len(alive) > 0 && alive[0] == self
	alone := len(alive) == 1 && alive[0] == self
	if leader != sw.leading {
		sw.leading = leader
		if leader {
			t.log.Info("this replica sweeps the fleet's gone topology now (the lowest live replica id)", zap.Strings("alive", alive))
		} else {
			t.log.Info("another replica sweeps the fleet's gone topology now", zap.Strings("alive", alive))
		}
	}
	// gone: the replica has been out of the fleet for grace; saw: it was
	// alive while this one watched.
	state := func(id string) (gone, saw bool) {
		if last, ok := sw.seen[id]; ok {
			return now.Sub(last) >= grace, !last.Before(sw.since)
		}
		return now.Sub(sw.since) >= grace, false
	}
	sw.mu.Unlock()
	ctx, cancel := context.WithTimeout(t.srv.ctx, 30*time.Second)
	defer cancel()

	for _, rec := range t.reg.List(kindTQueue) {
		var r queueRecord
		if json.Unmarshal(rec.Value, &r) != nil {
			continue
		}
		v := t.vhost(vhostKey(r.Vhost))
		if r.Replica == self {
			// Not declared by this process: an earlier life's. Under
			// declMu: a declare writes the record before it adds the queue.
			v.declMu.Lock()
			if v.lookupQueue(r.Name) == nil {
				if err := t.reg.Delete(ctx, kindTQueue, rec.Key); err != nil {
					t.log.Debug("deleting an earlier life's queue record failed", zap.Error(err))
				}
			}
			v.declMu.Unlock()
			continue
		}
		if !leader {
			continue
		}
		if gone, _ := state(r.Replica); !gone {
			continue
		}
		q := v.lookupQueue(r.Name)
		if q != nil && (!q.remote || q.replica != r.Replica) {
			continue // declared again meanwhile: its own record follows
		}
		if q == nil {
			if err := t.reg.Delete(ctx, kindTQueue, rec.Key); err != nil {
				t.log.Debug("deleting a gone replica's queue record failed", zap.Error(err))
			}
			continue
		}
		t.log.Info("deleting a non-durable queue whose replica is gone", zap.String("vhost", v.displayName()), zap.String("queue", q.name), zap.String("replica", r.Replica))
		t.srv.dropQueue(q, "the replica that declared it is gone", t.log)
	}

	for _, rec := range t.reg.List(kindTExchange) {
		var r exchangeRecord
		if json.Unmarshal(rec.Value, &r) != nil {
			continue
		}
		sw.mu.Lock()
		mine := sw.exOwned[rec.Key]
		sw.mu.Unlock()
		var drop, adopt bool
		switch {
		case r.Replica == self:
			if !mine {
				// An earlier life's: dropped when no other replica kept
				// it, else this life keeps it.
				if drop = alone; !drop {
					t.markExchangeOwned(rec.Key)
				}
			}
		case leader:
			gone, saw := state(r.Replica)
			drop, adopt = gone && !saw, gone && saw
		}
		v := t.vhost(vhostKey(r.Vhost))
		switch {
		case adopt:
			r.Replica = self
			if err := t.reg.Put(ctx, kindTExchange, rec.Key, r); err != nil {
				t.log.Debug("taking over a gone replica's exchange failed", zap.Error(err))
				continue
			}
			t.markExchangeOwned(rec.Key)
		case drop:
			v.declMu.Lock()
			x, ok := v.routes.Exchange(r.Name)
			if ok && x.Durable {
				ok = false
			}
			err := t.reg.Delete(ctx, kindTExchange, rec.Key)
			if err == nil && ok {
				rm := v.routes.DeleteExchange(r.Name)
				if len(rm.Exchanges) > 0 {
					rm.Exchanges = rm.Exchanges[1:]
				}
				err = v.persistRemoval(ctx, rm, nil)
			}
			v.declMu.Unlock()
			if err != nil {
				t.log.Debug("deleting a gone replica's exchange failed", zap.Error(err))
			}
		}
	}

	if !leader {
		return
	}
	if fu, ok := f.(fleetUses); ok {
		t.sweepOrphans(fu)
	}
	// Bindings whose ends are gone (a replica died between deleting an end
	// and the binding's tombstone).
	for _, rec := range t.reg.List(kindTBinding) {
		var r bindingRecord
		if json.Unmarshal(rec.Value, &r) != nil {
			continue
		}
		v := t.vhost(vhostKey(r.Vhost))
		_, src := v.routes.Exchange(r.Source)
		dst := false
		if r.DestExchange {
			_, dst = v.routes.Exchange(r.Dest)
		} else {
			dst = v.lookupQueue(r.Dest) != nil
		}
		if src && dst {
			continue
		}
		if err := t.reg.Delete(ctx, kindTBinding, rec.Key); err != nil {
			t.log.Debug("deleting a binding of gone ends failed", zap.Error(err))
		}
	}
}

// markExchangeOwned notes that this process declared (or took over) the
// exchange of record key.
func (t *topology) markExchangeOwned(key string) {
	t.sweeper.mu.Lock()
	if t.sweeper.exOwned == nil {
		t.sweeper.exOwned = map[string]bool{}
	}
	t.sweeper.exOwned[key] = true
	t.sweeper.mu.Unlock()
}

// applyTransient merges a record of a kind above written by another
// replica (or by this one's earlier life, at load).
func (t *topology) applyTransient(v *vhost, parts []string, rec registry.Record) {
	switch rec.Kind {
	case kindTExchange:
		t.applyExchange(v, parts[1], rec, false)
	case kindTBinding:
		rec.Kind = kindBinding
		t.apply(rec)
	case kindTQueue:
		if rec.Deleted {
			if q := v.lookupQueue(parts[1]); q != nil && !q.persistent() {
				v.removeQueue(q, "deleted by another replica")
				if q.owner != nil {
					q.owner.disown(q)
				}
			}
			return
		}
		var r queueRecord
		if json.Unmarshal(rec.Value, &r) != nil || r.Replica == t.replicaID() {
			return // an earlier life's of this replica: sweep deletes it
		}
		if q := v.lookupQueue(r.Name); q != nil {
			if q.persistent() || !q.remote || q.incarnation == r.Incarnation {
				return // this replica's own, or known already
			}
			v.removeQueue(q, "deleted by another replica")
		}
		v.mu.Lock()
		var added *queue
		if _, ok := v.queues[r.Name]; !ok {
			added = newQueue(v, r.Name, r.Durable, r.Exclusive, r.AutoDelete, decodeArgs(r.Args), nil, r.Incarnation)
			added.remote, added.replica = true, r.Replica
			v.queues[r.Name] = added
		}
		v.noteIncarnationLocked(r.Name, r.Incarnation)
		v.mu.Unlock()
		v.routes.PutQueue(r.Name)
		if added != nil && t.srv != nil {
			t.srv.startReaper(added) // x-expires: whichever replica holds it judges
		}
	}
}
