package amqp091

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/kubemq-io/kubemq-proxy/amqp091/wire"
	"github.com/kubemq-io/kubemq-proxy/delivery"
)

// command is one client method for a channel, with its content.
type command struct {
	m        wire.Method
	props    *wire.Properties
	body     []byte
	tooLarge uint64 // body size of a message refused for exceeding MaxBodySize
	pending  int64  // body bytes counted against MaxPendingPublishBytes until released
	// connClose: the client closed the connection; the channel has handled
	// every method the client sent before, and now shuts down silently.
	connClose bool
}

// channelQueue is how many commands the reader may queue ahead of a
// channel before it waits. Allocated whole when a channel opens (64 bytes
// a command): 64 gave the same publish and consume rates as 512 in the
// benchmarks, at 4 KiB instead of 32 KiB per idle channel.
const channelQueue = 64

// channel is one AMQP channel. Its goroutine (run) handles the client's
// methods in order and owns the fields marked below; consumer goroutines
// deliver concurrently under dmu.
type channel struct {
	c    *conn
	id   uint16
	log  *zap.Logger
	cmds chan command
	// unflushed: links with settlements or credit waiting to go; the
	// channel sends them once it has no command queued, or after
	// flushEvery commands, so that a client's run of acks leaves in one
	// Settle and one Credit per link (the channel's goroutine).
	unflushed  []*fwdLink
	sinceFlush int // commands handled since unflushed was last sent

	done chan struct{} // closed when run has returned
	wake chan struct{} // cap 1: posted work or confirms are waiting

	postMu sync.Mutex // guards posted
	posted []func()

	// Owned by run.
	closing          bool // channel.close sent, waiting for close-ok
	finished         bool
	lastQueue        string
	consumers        map[string]*consumer
	consumerPrefetch uint16 // basic.qos global=false: for consumers created later
	confirm          bool
	tx               *txState
	handles          map[*queue]*delivery.Handle
	getLinks         map[*queue]*fwdLink // basic.get of queues another replica holds
	scratch          []string            // routing buffer
	reply            *replyConsumer      // direct reply-to consumer (replyto.go); written by run under dmu

	// Delivery bookkeeping, shared with consumer goroutines.
	dmu            sync.Mutex // guards the fields below
	nextTag        uint64
	unacked        map[uint64]*unacked
	order          []uint64              // delivery tags in delivery order; settled ones are skipped
	globalPrefetch uint16                // basic.qos global=true: limit for the whole channel
	stopped        bool                  // no more deliveries (closing)
	links          map[*fwdLink]struct{} // open links to other replicas (forward.go)
	fwdInflight    int                   // credit the links granted and the holders have not used
	voided         int                   // void entries of unacked (forward.go)

	confirms confirmTracker

	// Mirrors of run-owned state for the management API (management.go).
	viewConsumers       atomic.Int32
	viewConfirm, viewTx atomic.Bool
	viewPrefetch        atomic.Uint32 // consumerPrefetch

	// Publishes handed to the publisher and not yet stored or refused;
	// flushed (cap 1) is signalled when they reach 0.
	inflight atomic.Int64
	flushed  chan struct{}
}

// unacked is one delivery the client has not settled yet.
type unacked struct {
	d      *delivery.Delivery // nil for a forwarded delivery
	h      *delivery.Handle
	fwd    *fwdLink  // a forwarded delivery's link (forward.go); nil for a local one
	key    uint64    // a forwarded delivery's key on fwd
	void   bool      // fwd broke: the delivery comes again; it no longer counts against prefetch (guarded by dmu)
	cons   *consumer // nil for basic.get
	queue  *queue
	tag    uint64
	settle bool // settled, waiting to be removed from order
}

func newChannel(c *conn, id uint16) *channel {
	ch := &channel{
		c: c, id: id, log: c.log.With(zap.Uint16("channel", id)),
		cmds: make(chan command, channelQueue), done: make(chan struct{}), wake: make(chan struct{}, 1), flushed: make(chan struct{}, 1),
		consumers: map[string]*consumer{}, handles: map[*queue]*delivery.Handle{}, unacked: map[uint64]*unacked{},
		getLinks: map[*queue]*fwdLink{}, links: map[*fwdLink]struct{}{},
	}
	ch.confirms.ch = ch
	return ch
}

// post runs f on the channel's goroutine, after the command in progress.
// It never blocks, so other goroutines (a queue deletion, a confirm) may
// call it while holding their own locks.
func (ch *channel) post(f func()) {
	ch.postMu.Lock()
	ch.posted = append(ch.posted, f)
	ch.postMu.Unlock()
	ch.signal()
}

func (ch *channel) signal() {
	select {
	case ch.wake <- struct{}{}:
	default:
	}
}

func (ch *channel) runPosted() {
	ch.postMu.Lock()
	fs := ch.posted
	ch.posted = nil
	ch.postMu.Unlock()
	for _, f := range fs {
		if ch.finished {
			return
		}
		f()
	}
}

func (ch *channel) run() {
	ch.c.srv.m.channels.Inc()
	defer ch.c.srv.m.channels.Dec()
	ch.c.nChannels.Add(1)
	defer ch.c.nChannels.Add(-1)
	ch.c.viewMu.Lock()
	if ch.c.view == nil {
		ch.c.view = map[*channel]struct{}{}
	}
	ch.c.view[ch] = struct{}{}
	ch.c.viewMu.Unlock()
	defer func() {
		ch.c.viewMu.Lock()
		delete(ch.c.view, ch)
		ch.c.viewMu.Unlock()
	}()
	defer close(ch.done)
	defer ch.shutdown()
	for !ch.finished {
		select {
		case cmd := <-ch.cmds:
			ch.handle(cmd)
			if len(ch.unflushed) > 0 {
				if ch.sinceFlush++; len(ch.cmds) == 0 || ch.finished || ch.sinceFlush >= flushEvery {
					ch.flushLinks()
				}
			}
		case <-ch.wake:
			ch.runPosted()
			ch.confirms.emit()
		case <-ch.c.ctx.Done():
			ch.settleQueued()
			return
		}
	}
}

// settleQueued applies the acks, nacks and rejects still queued when the
// connection ends without its close handshake (a connection error, a
// dropped socket): the client sent them before what ended the connection,
// so they stand, as in RabbitMQ, whose channels handle the methods they
// received before they stop. Other methods are dropped.
func (ch *channel) settleQueued() {
	for {
		select {
		case cmd := <-ch.cmds:
			switch cmd.m.(type) {
			case *wire.BasicAck, *wire.BasicNack, *wire.BasicReject:
				if !ch.finished && !ch.closing && ch.tx == nil {
					ch.handle(cmd)
				}
			}
			ch.c.unpend(cmd.pending)
		default:
			if len(ch.unflushed) > 0 {
				ch.flushLinks()
			}
			return
		}
	}
}

// flushEvery bounds how many commands a busy channel handles before it
// sends what its links have waiting: a client whose commands never pause
// still frees its forwarded consumers' credit.
const flushEvery = 64

// flushSoon marks l to be flushed by flushLinks; grant: its client freed
// slots, so the holder's credit is topped up then too.
func (ch *channel) flushSoon(l *fwdLink, grant bool) {
	if grant {
		l.grantDue = true
	}
	if !slices.Contains(ch.unflushed, l) {
		ch.unflushed = append(ch.unflushed, l)
	}
}

// flushLinks sends the settlements the channel's links have waiting, then
// the credit their clients freed (grant sends it after the settlements, so
// the holder counts the acked deliveries out before it sends more).
func (ch *channel) flushLinks() {
	for i, l := range ch.unflushed {
		if l.grantDue {
			l.grantDue = false
			l.grant()
		}
		l.flush()
		ch.unflushed[i] = nil
	}
	ch.unflushed = ch.unflushed[:0]
	ch.sinceFlush = 0
}

// send queues a method for the client on this channel.
func (ch *channel) send(m wire.Method) { ch.c.w.method(ch.id, m) }

// handle runs one command and turns its error into a channel or
// connection exception.
func (ch *channel) handle(cmd command) {
	if cmd.connClose {
		ch.shutdown()
		ch.finished = true
		return
	}
	if ch.closing {
		switch cmd.m.(type) {
		case *wire.ChannelCloseOk:
			ch.finished = true
		case *wire.ChannelClose:
			ch.send(&wire.ChannelCloseOk{})
			ch.finished = true
		}
		ch.c.unpend(cmd.pending)
		return // everything else is discarded until the close completes
	}
	err := ch.dispatch(cmd)
	if err == nil {
		return
	}
	e := asAMQP(err)
	if e.Class == 0 && e.Method == 0 {
		e.OnMethod(cmd.m.ClassID(), cmd.m.MethodID())
	}
	if e.Hard {
		ch.c.fail(e)
		return
	}
	ch.log.Debug("channel error", zap.Uint16("code", e.Code), zap.String("text", e.Text))
	ch.c.srv.m.closed(e.Code, "channel")
	ch.shutdown()
	ch.closing = true
	ch.send(e.CloseMethod())
}

func (ch *channel) dispatch(cmd command) error {
	switch m := cmd.m.(type) {
	case *wire.ChannelClose:
		ch.shutdown()
		ch.send(&wire.ChannelCloseOk{})
		ch.finished = true
		return nil
	case *wire.ChannelCloseOk:
		return nil
	case *wire.ChannelFlow:
		if !m.Active {
			return wire.NotImplemented("active=false")
		}
		ch.send(&wire.ChannelFlowOk{Active: true})
		return nil
	case *wire.ChannelFlowOk:
		return nil

	case *wire.ExchangeDeclare:
		return ch.exchangeDeclare(m)
	case *wire.ExchangeDelete:
		return ch.exchangeDelete(m)
	case *wire.ExchangeBind:
		return ch.exchangeBind(m)
	case *wire.ExchangeUnbind:
		return ch.exchangeUnbind(m)

	case *wire.QueueDeclare:
		return ch.queueDeclare(m)
	case *wire.QueueBind:
		return ch.queueBind(m)
	case *wire.QueueUnbind:
		return ch.queueUnbind(m)
	case *wire.QueuePurge:
		return ch.queuePurge(m)
	case *wire.QueueDelete:
		return ch.queueDelete(m)

	case *wire.BasicPublish:
		return ch.publish(m, cmd)
	case *wire.BasicQos:
		return ch.qos(m)
	case *wire.BasicConsume:
		return ch.consume(m)
	case *wire.BasicCancel:
		return ch.cancel(m)
	case *wire.BasicGet:
		return ch.get(m)
	case *wire.BasicAck:
		return ch.ack(m.DeliveryTag, m.Multiple)
	case *wire.BasicNack:
		return ch.nack(m.DeliveryTag, m.Multiple, m.Requeue)
	case *wire.BasicReject:
		return ch.nack(m.DeliveryTag, false, m.Requeue)
	case *wire.BasicRecover:
		if err := ch.recover(m.Requeue); err != nil {
			return err
		}
		ch.send(&wire.BasicRecoverOk{})
		return nil
	case *wire.BasicRecoverAsync:
		return ch.recover(m.Requeue)

	case *wire.ConfirmSelect:
		return ch.confirmSelect(m)
	case *wire.TxSelect:
		return ch.txSelect()
	case *wire.TxCommit:
		return ch.txCommit()
	case *wire.TxRollback:
		return ch.txRollback()
	}
	return wire.CommandInvalid("unexpected method %s", cmd.m.Name())
}

// shutdown stops everything the channel does for the client: consumers
// end, unsettled deliveries (those settled in an open transaction too) go
// back to their queues in place, the lease handles close and pending
// confirms are dropped. It is idempotent.
func (ch *channel) shutdown() {
	ch.dropReply()
	for tag, cs := range ch.consumers {
		ch.stopConsumer(cs)
		delete(ch.consumers, tag)
	}
	ch.dmu.Lock()
	ch.stopped = true
	back := make([]*unacked, 0, len(ch.unacked))
	for _, t := range ch.order {
		if u := ch.unacked[t]; u != nil {
			back = append(back, u)
		}
	}
	ch.unacked = map[uint64]*unacked{}
	ch.order = nil
	ch.dmu.Unlock()
	if ch.tx != nil {
		back = append(back, ch.tx.settles...) // rolled back
	}
	if len(back) > 0 {
		// RabbitMQ has requeued them when channel.close-ok goes out; the
		// lease engine puts them back at once, at their places.
		rq := make([]bool, len(back))
		for i := range rq {
			rq[i] = true
		}
		ch.settle(back, rq)
	}
	ch.closeLinks()
	for q, h := range ch.handles {
		h.Close()
		delete(ch.handles, q)
	}
	ch.confirms.close()
	ch.tx = nil
}

// publishDone records that one of the channel's publishes is stored (or
// refused); any goroutine.
func (ch *channel) publishDone() {
	if ch.inflight.Add(-1) == 0 {
		select {
		case ch.flushed <- struct{}{}:
		default:
		}
	}
}

// awaitPublishes waits until every publish the channel received before is
// stored in KubeMQ (or refused): RabbitMQ orders a channel's methods, so a
// get, a declare's count or a purge after a publish sees its message.
func (ch *channel) awaitPublishes() error {
	for ch.inflight.Load() > 0 {
		select {
		case <-ch.flushed:
		case <-ch.c.ctx.Done():
			return errShutdown()
		}
	}
	return nil
}

// ownerWait bounds how long a channel waits for a queue another replica holds when it cannot
// reach that replica (a dead replica's hold lapses after cluster.lease, 8 s by default).
const ownerWait = 15 * time.Second

// queueFor resolves the queue a method names, applying RabbitMQ's
// shortcut (an empty name is the channel's last declared queue) and its
// exclusive-access check.
func (ch *channel) queueFor(name string) (*queue, error) {
	if name == "" {
		if ch.lastQueue == "" {
			return nil, wire.NotFound("no previously declared queue")
		}
		name = ch.lastQueue
	}
	q := ch.c.vh.lookupQueue(name)
	if q == nil && ch.c.srv.catchUp(ch.c.ctx) {
		q = ch.c.vh.lookupQueue(name)
	}
	if q == nil {
		return nil, errNoQueue(name, ch.c.vhostName)
	}
	if !q.accessibleBy(ch.c) {
		return nil, errLocked(name, ch.c.vhostName)
	}
	return q, nil
}
