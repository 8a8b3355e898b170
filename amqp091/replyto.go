package amqp091

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kubemq-io/kubemq-proxy/amqp091/peerpb"
	"github.com/kubemq-io/kubemq-proxy/amqp091/wire"
)

// Direct reply-to (RabbitMQ's amq.rabbitmq.reply-to), as RabbitMQ 3.10
// does it: a channel consumes the pseudo queue amq.rabbitmq.reply-to in
// no-ack mode; a message it publishes with reply_to amq.rabbitmq.reply-to
// leaves with reply_to rewritten to amq.rabbitmq.reply-to.<node>.<key>, a
// name only that channel answers to; a message published to the default
// exchange with that name as routing key is handed straight to the
// channel's reply consumer, never stored (RabbitMQ keeps it in no queue
// either, so a mandatory one also comes back unroutable, and a reply to a
// channel that is gone is dropped). <node> names the replica that serves
// the channel, so a reply published through another replica of the fleet
// is passed to it over the peer port (replyRemote).

const replyToPrefix = replyToQueue + "."

// replyConsumer is a channel's direct reply-to consumer.
type replyConsumer struct {
	ch   *channel
	tag  string
	name string // amq.rabbitmq.reply-to.<node>.<key>: the rewritten reply_to
	key  string
}

// replies maps the keys of live reply consumers to them; server-wide
// because, as in RabbitMQ, a reply reaches its channel from any vhost.
type replies struct {
	mu sync.Mutex // guards m
	m  map[string]*replyConsumer
}

func (r *replies) add(rc *replyConsumer) {
	r.mu.Lock()
	if r.m == nil {
		r.m = map[string]*replyConsumer{}
	}
	r.m[rc.key] = rc
	r.mu.Unlock()
}

func (r *replies) remove(rc *replyConsumer) {
	r.mu.Lock()
	if r.m[rc.key] == rc {
		delete(r.m, rc.key)
	}
	r.mu.Unlock()
}

func (r *replies) lookup(key string) *replyConsumer {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.m[key]
}

// replyNode is the <node> part of this replica's reply names: its peer
// address, so other replicas can reach it, or "-" when it has none.
func (s *Server) replyNode() string {
	if s.peers != nil {
		if a := s.peers.Self(); a != "" {
			return base64.RawURLEncoding.EncodeToString([]byte(a))
		}
	}
	return "-"
}

// parseReplyName splits the part of a reply name after the prefix into
// the peer address it names ("" for a replica without one) and its key.
func parseReplyName(rest string) (addr, key string, ok bool) {
	node, key, found := strings.Cut(rest, ".")
	if !found || key == "" || node == "" {
		return "", "", false
	}
	if node == "-" {
		return "", key, true
	}
	a, err := base64.RawURLEncoding.DecodeString(node)
	// Canonical only (the decoder skips newlines and loose trailing bits),
	// so a name has one reading and this replica recognises its own.
	if err != nil || len(a) == 0 || base64.RawURLEncoding.EncodeToString(a) != node {
		return "", "", false
	}
	return string(a), key, true
}

// consumeReplyTo is basic.consume of amq.rabbitmq.reply-to.
func (ch *channel) consumeReplyTo(m *wire.BasicConsume) error {
	switch {
	case !m.NoAck:
		return wire.PreconditionFailed("reply consumer cannot acknowledge")
	case ch.reply != nil:
		return wire.PreconditionFailed("reply consumer already set")
	}
	tag := m.ConsumerTag
	if tag == "" {
		tag = genName("amq.ctag")
	}
	var k [18]byte
	rand.Read(k[:])
	key := base64.RawURLEncoding.EncodeToString(k[:])
	rc := &replyConsumer{ch: ch, tag: tag, key: key, name: replyToPrefix + ch.c.srv.replyNode() + "." + key}
	ch.dmu.Lock()
	ch.reply = rc
	ch.dmu.Unlock()
	ch.c.srv.replies.add(rc)
	if !m.NoWait {
		ch.send(&wire.BasicConsumeOk{ConsumerTag: tag})
	}
	return nil
}

// cancelReplyTo ends the channel's reply consumer if tag is its tag.
func (ch *channel) cancelReplyTo(tag string) bool {
	rc := ch.reply
	if rc == nil || rc.tag != tag {
		return false
	}
	ch.dropReply()
	return true
}

// dropReply ends the channel's reply consumer, if any: replies to it are
// dropped from now on.
func (ch *channel) dropReply() {
	ch.dmu.Lock()
	rc := ch.reply
	ch.reply = nil
	ch.dmu.Unlock()
	if rc != nil {
		ch.c.srv.replies.remove(rc)
	}
}

// rewriteReplyTo gives a message published with reply_to
// amq.rabbitmq.reply-to the channel's reply name; RabbitMQ refuses it
// while the channel has no reply consumer.
func (ch *channel) rewriteReplyTo(props *wire.Properties) (*wire.Properties, error) {
	if props.Flags&wire.FlagReplyTo == 0 || props.ReplyTo != replyToQueue {
		return props, nil
	}
	rc := ch.reply
	if rc == nil {
		return nil, wire.PreconditionFailed("fast reply consumer does not exist")
	}
	p := *props
	p.ReplyTo = rc.name
	return &p, nil
}

// deliverReply hands a message published to the default exchange with a
// reply name as routing key to the channel that owns the name, here or on
// the replica the name points to. Nothing is stored; a reply to a name no
// live channel owns is dropped, as in RabbitMQ.
func (s *Server) deliverReply(ctx context.Context, key string, props *wire.Properties, body []byte) {
	addr, k, ok := parseReplyName(strings.TrimPrefix(key, replyToPrefix))
	if !ok {
		return
	}
	if addr != "" && s.replyNode() != base64.RawURLEncoding.EncodeToString([]byte(addr)) {
		s.replyRemote(ctx, addr, key, props, body)
		return
	}
	s.replyLocal(k, key, props, body)
}

// replyLocal delivers a reply to this replica's reply consumer key.
func (s *Server) replyLocal(k, routingKey string, props *wire.Properties, body []byte) bool {
	rc := s.replies.lookup(k)
	if rc == nil {
		return false
	}
	ch := rc.ch
	ch.dmu.Lock()
	defer ch.dmu.Unlock()
	if ch.reply != rc || ch.stopped {
		return false
	}
	s.m.delivered.Inc()
	// RabbitMQ gives a reply the channel's next delivery tag without using
	// it up (the consumer is no-ack, so the tag is never settled).
	ch.c.w.send(outFrame{channel: ch.id, m: &wire.BasicDeliver{ConsumerTag: rc.tag, DeliveryTag: ch.nextTag + 1,
		Exchange: "", RoutingKey: routingKey}, props: props, body: body})
	return true
}

// declareReplyTo is queue.declare of a name under amq.rabbitmq.reply-to:
// RabbitMQ answers declare-ok (0 messages, 1 consumer) for the pseudo
// queue itself and for a reply name whose channel still consumes, so a
// responder can check that its requester is still there; 404 otherwise.
func (ch *channel) declareReplyTo(m *wire.QueueDeclare) error {
	ok := m.Queue == replyToQueue
	if !ok {
		if addr, k, valid := parseReplyName(strings.TrimPrefix(m.Queue, replyToPrefix)); valid {
			s := ch.c.srv
			if addr == "" || s.replyNode() == base64.RawURLEncoding.EncodeToString([]byte(addr)) {
				ok = s.replyAlive(k)
			} else {
				ok = s.replyAliveRemote(ch.c.ctx, addr, k)
			}
		}
	}
	if !ok {
		return errNoQueue(m.Queue, ch.c.vhostName)
	}
	if !m.NoWait {
		ch.send(&wire.QueueDeclareOk{Queue: m.Queue, MessageCount: 0, ConsumerCount: 1})
	}
	return nil
}

// replyAlive reports whether this replica has a live reply consumer key.
func (s *Server) replyAlive(k string) bool {
	rc := s.replies.lookup(k)
	if rc == nil {
		return false
	}
	rc.ch.dmu.Lock()
	defer rc.ch.dmu.Unlock()
	return rc.ch.reply == rc && !rc.ch.stopped
}

// Replies to another replica's channels go through one lane per replica:
// one goroutine sends them in publish order (RabbitMQ keeps a channel's
// replies to one requester in order), and ends after a minute idle.

// replyLaneDepth bounds the replies waiting for one replica; a publisher
// that finds the lane full waits (as for any store).
const replyLaneDepth = 1024

type replyLane struct {
	q chan *peerpb.ReplyRequest
}

// replyRemote queues a reply for the replica at addr; it waits while that
// replica's lane is full, until ctx (the publisher's connection) ends.
func (s *Server) replyRemote(ctx context.Context, addr, key string, props *wire.Properties, body []byte) {
	_, k, _ := parseReplyName(strings.TrimPrefix(key, replyToPrefix))
	meta, tags, err := encodeMessage("", key, props)
	if err != nil || s.peers == nil {
		return // cannot be passed on: dropped, as a reply nobody consumes
	}
	r := &peerpb.ReplyRequest{Key: k, RoutingKey: key, Metadata: meta, Tags: tags, Body: body}
	s.replyMu.Lock()
	l := s.replyLanes[addr]
	if l == nil {
		if s.replyLanes == nil {
			s.replyLanes = map[string]*replyLane{}
		}
		l = &replyLane{q: make(chan *peerpb.ReplyRequest, replyLaneDepth)}
		s.replyLanes[addr] = l
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.runReplyLane(addr, l)
		}()
	}
	// Queued under replyMu: the lane only ends under it, when empty.
	select {
	case l.q <- r:
		s.replyMu.Unlock()
		return
	default:
	}
	s.replyMu.Unlock()
	select {
	case l.q <- r:
	case <-ctx.Done():
	}
}

func (s *Server) runReplyLane(addr string, l *replyLane) {
	idle := time.NewTimer(time.Minute)
	defer idle.Stop()
	for {
		select {
		case r := <-l.q:
			s.sendReply(addr, r)
			idle.Reset(time.Minute)
		case <-idle.C:
			s.replyMu.Lock()
			if len(l.q) == 0 {
				delete(s.replyLanes, addr)
				s.replyMu.Unlock()
				return
			}
			s.replyMu.Unlock()
			idle.Reset(time.Minute)
		case <-s.ctx.Done():
			return
		}
	}
}

// replyTimeout bounds passing one reply to another replica.
const replyTimeout = 10 * time.Second

func (s *Server) sendReply(addr string, r *peerpb.ReplyRequest) {
	conn, err := s.peers.Conn(addr)
	if err != nil {
		s.log.Debug("direct reply-to: replica unreachable; reply dropped", zap.String("replica", addr), zap.Error(err))
		return
	}
	ctx, cancel := context.WithTimeout(s.ctx, replyTimeout)
	defer cancel()
	if _, err := peerpb.NewAMQPPeerClient(conn).Reply(ctx, r); err != nil {
		s.log.Debug("direct reply-to: passing the reply failed; dropped", zap.String("replica", addr), zap.Error(err))
	}
}

// replyAliveRemote asks the replica at addr whether reply consumer k lives.
func (s *Server) replyAliveRemote(ctx context.Context, addr, k string) bool {
	if s.peers == nil {
		return false
	}
	conn, err := s.peers.Conn(addr)
	if err != nil {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, replyTimeout)
	defer cancel()
	resp, err := peerpb.NewAMQPPeerClient(conn).Reply(ctx, &peerpb.ReplyRequest{Key: k, Probe: true})
	return err == nil && resp.Alive
}

// Reply is the peer service's side of replyRemote and replyAliveRemote.
func (p *peerService) Reply(ctx context.Context, r *peerpb.ReplyRequest) (*peerpb.ReplyResponse, error) {
	if r.Key == "" || len(r.Key) > 255 || len(r.RoutingKey) > 255 {
		return nil, status.Error(codes.InvalidArgument, "kubemq-proxy: a reply needs a key and a routing key within bounds")
	}
	if r.Probe {
		return &peerpb.ReplyResponse{Alive: p.s.replyAlive(r.Key)}, nil
	}
	_, _, props := decodeMessage(replyToQueue, r.Metadata, r.Tags)
	return &peerpb.ReplyResponse{Alive: p.s.replyLocal(r.Key, r.RoutingKey, &props, r.Body)}, nil
}
