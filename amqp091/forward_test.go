package amqp091

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	streadway "github.com/streadway/amqp"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kubemq-io/kubemq-proxy/amqp091/peerpb"
	"github.com/kubemq-io/kubemq-proxy/cluster"
	"github.com/kubemq-io/kubemq-proxy/delivery"
	"github.com/kubemq-io/kubemq-proxy/kubemqclient"
	"github.com/kubemq-io/kubemq-proxy/registry"
)

// Replicas of the proxy on one KubeMQ, in one process: each with its own
// KubeMQ clients, ownership and acknowledgement logs, lease engine, AMQP
// front-end and peer port, as proxy.Proxy wires them.

type testOwners struct {
	c *cluster.Cluster
	k *ownerKnobs
}

// ownerKnobs let a test take a queue from a replica as a lapsed ownership lease would: lose
// tells the replica's lease engine that its holding is lost and keeps it from claiming the queue
// again; release then gives the holding up in the ownership log, for another replica to claim.
type ownerKnobs struct {
	mu     sync.Mutex
	refuse map[string]bool
	held   map[string]*knobOwned
}

type knobOwned struct {
	*cluster.Ownership
	lost chan struct{}
	once sync.Once
}

func (o *knobOwned) Lost() <-chan struct{} { return o.lost }

func (o *knobOwned) lose() { o.once.Do(func() { close(o.lost) }) }

func (o testOwners) Claim(ctx context.Context, queue string) (delivery.Owned, error) {
	o.k.mu.Lock()
	refused := o.k.refuse[queue]
	o.k.mu.Unlock()
	if refused {
		return nil, fmt.Errorf("%w: refused by the test", delivery.ErrNotOwner)
	}
	h, err := o.c.Claim(ctx, queue)
	var oe *cluster.OwnedError
	switch {
	case err == nil:
		ko := &knobOwned{Ownership: h, lost: make(chan struct{})}
		go func() {
			select {
			case <-h.Lost():
				ko.lose()
			case <-ko.lost:
			}
		}()
		o.k.mu.Lock()
		o.k.held[queue] = ko
		o.k.mu.Unlock()
		return ko, nil
	case errors.As(err, &oe), errors.Is(err, cluster.ErrUnsettled), errors.Is(err, cluster.ErrNotReady):
		return nil, fmt.Errorf("%w: %w", delivery.ErrNotOwner, err)
	}
	return nil, err
}

// lose makes the replica lose its holding of queue (a KubeMQ channel) and refuse to claim it
// until allow; it returns the holding, to release once the replica stopped consuming.
func (k *ownerKnobs) lose(t *testing.T, queue string) *knobOwned {
	t.Helper()
	k.mu.Lock()
	k.refuse[queue] = true
	o := k.held[queue]
	k.mu.Unlock()
	if o == nil {
		t.Fatalf("%s not held", queue)
	}
	o.lose()
	return o
}

// takeFrom makes r lose its holding of KubeMQ channel ch, waits until r no longer consumes it,
// and only then releases the holding in the ownership log, for another replica to claim; it
// returns when the loss began.
func takeFrom(t *testing.T, r *replica, ch string) time.Time {
	t.Helper()
	o := r.owners.lose(t, ch)
	at := time.Now()
	for r.m.Lookup(ch) != nil {
		if time.Since(at) > 20*time.Second {
			t.Fatalf("%s still consumes %s 20 s after losing it", r.id, ch)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := o.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	return at
}

func (k *ownerKnobs) allow(queue string) {
	k.mu.Lock()
	delete(k.refuse, queue)
	k.mu.Unlock()
}

type testPeers struct {
	c    *cluster.Cluster
	p    *cluster.Peers
	self string
	env  *env // its registry, once started
}

// Propagate is proxy.Peers.Propagate on the test's replicas.
func (p testPeers) Propagate(ctx context.Context) {
	conns, err := p.p.Others(p.c)
	if err := errors.Join(err, p.env.reg.Propagate(ctx, conns)); err != nil {
		p.env.log.Warn("topology change not confirmed by every replica", zap.Error(err))
	}
}

func (p testPeers) Owner(queue string) (string, bool) {
	m, ok := p.c.Owner(queue)
	if !ok || m.ID == p.c.ID() {
		return "", false
	}
	return m.Addr, true
}

func (p testPeers) Conn(addr string) (grpc.ClientConnInterface, error) { return p.p.Conn(addr) }

func (p testPeers) Self() string { return p.self }

type replica struct {
	*env
	id       string
	secret   string
	peerAddr string
	cluster  *cluster.Cluster
	peers    *cluster.Peers
	m        *delivery.Manager
	owners   *ownerKnobs
	stop     func() // stops the front-end, then the lease engine, the peer port and the logs
}

// newReplicas starts n replicas on one KubeMQ, registry and cluster channel.
func newReplicas(t *testing.T, n int) []*replica {
	first := newEnv(t) // only for the backend, the vhost and the registry channel
	first.stopFn()
	clusterChan := "amqptest.cluster." + randHex(4)
	secret := "s-" + randHex(8)
	rs := make([]*replica, n)
	for i := range rs {
		rs[i] = startReplica(t, first, "r"+strconv.Itoa(i), clusterChan, secret)
	}
	return rs
}

func startReplica(t *testing.T, base *env, id, clusterChan, secret string, opts ...func(*Options)) *replica {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	dial := func() *kubemqclient.Client {
		kc, err := kubemqclient.Dial(ctx, kubemqclient.Options{Address: base.kubemq, Logger: base.log.Named("kubemq"), Conn: base.conn})
		if err != nil {
			t.Fatal(err)
		}
		if err := kc.WaitReady(ctx); err != nil {
			t.Fatal(err)
		}
		return kc
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ck := dial()
	c, err := cluster.Open(cluster.Options{Client: ck, Channel: clusterChan, ReplicaID: id, Advertise: lis.Addr().String(),
		Lease: 3 * time.Second, Heartbeat: 300 * time.Millisecond, StopSlack: time.Second, Logger: base.log.Named(id + ".cluster")})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	acks, err := cluster.OpenAckLog(cluster.AckLogOptions{Client: ck, Channel: clusterChan + ".acks", Logger: base.log.Named(id + ".acks")})
	if err != nil {
		t.Fatal(err)
	}
	dk := dial()
	knobs := &ownerKnobs{refuse: map[string]bool{}, held: map[string]*knobOwned{}}
	m, err := delivery.NewManager(delivery.NewKubeMQBackend(dk), delivery.Options{Logger: base.log.Named(id + ".delivery"),
		Owners: testOwners{c: c, k: knobs}, Settlements: acks}, nil)
	if err != nil {
		t.Fatal(err)
	}
	po := cluster.PeerOptions{Secret: secret, Fast: PeerFast()} // as the proxy runs it
	peerSrv, err := cluster.NewPeerServer(po, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	peers, err := cluster.NewPeers(po)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, kubemq: base.kubemq, conn: base.conn, vhost: base.vhost, regChan: base.regChan, log: base.log.Named(id),
		followDelay: base.followDelay}
	r := &replica{env: e, id: id, secret: secret, peerAddr: lis.Addr().String(), cluster: c, peers: peers, m: m, owners: knobs}
	e.start(append([]func(*Options){func(o *Options) {
		o.Deliveries = m
		o.Peers = testPeers{c: c, p: peers, self: lis.Addr().String(), env: e}
	}}, opts...)...)
	e.srv.RegisterPeer(peerSrv)
	registry.RegisterPeer(peerSrv, e.reg)
	go peerSrv.Serve(lis)
	var once sync.Once
	r.stop = func() {
		once.Do(func() {
			e.stopFn()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_ = m.Close(ctx)
			peerSrv.Stop()
			peers.Close()
			_ = acks.Close(ctx)
			_ = c.Close(ctx)
			ck.Close()
			dk.Close()
		})
	}
	t.Cleanup(r.stop)
	return r
}

// owner waits until a replica holds the KubeMQ queue of AMQP queue name, and returns it.
func owner(t *testing.T, rs []*replica, name string) *replica {
	t.Helper()
	ch := queueChannel(vhostKey(rs[0].vhost), name, 0)
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		for _, r := range rs {
			if r.m.Lookup(ch) != nil {
				if m, ok := r.cluster.Owner(ch); ok && m.ID == r.id {
					return r
				}
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("nobody holds %s", name)
	return nil
}

func publishN(t *testing.T, ch *amqp.Channel, queue string, from, n int) {
	t.Helper()
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var ds []*amqp.DeferredConfirmation
	for i := from; i < from+n; i++ {
		d, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, false, false, amqp.Publishing{
			MessageId: strconv.Itoa(i), Body: []byte("m" + strconv.Itoa(i)), Headers: amqp.Table{"n": int32(i)}, ContentType: "text/plain"})
		if err != nil {
			t.Fatal(err)
		}
		ds = append(ds, d)
	}
	for _, d := range ds {
		if ok, err := d.WaitContext(ctx); !ok || err != nil {
			t.Fatalf("publish not confirmed: %v", err)
		}
	}
}

// Consumers of one queue on two replicas share its messages round-robin:
// the replica that does not hold the queue forwards its consumer to the
// one that does; every message arrives once, with its properties.
func TestForwardedConsumerSharesQueue(t *testing.T) {
	rs := newReplicas(t, 2)
	a, b := rs[0], rs[1]
	cha := a.channel(a.dial())
	if _, err := cha.QueueDeclare("fwd.q", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(cha.Qos(50, 0, false))
	da, err := cha.Consume("fwd.q", "ca", false, false, false, false, nil)
	must(err)
	if owner(t, rs, "fwd.q") != a {
		t.Fatal("a should hold the queue")
	}
	chb := b.channel(b.dial())
	must(chb.Qos(50, 0, false))
	db, err := chb.Consume("fwd.q", "cb", false, false, false, false, nil)
	must(err)
	// b forwards: it does not consume the KubeMQ queue itself.
	if b.m.Lookup(queueChannel(vhostKey(b.vhost), "fwd.q", 0)) != nil {
		t.Fatal("b consumes the queue itself")
	}
	const n = 400
	publishN(t, a.channel(a.dial()), "fwd.q", 0, n)
	var mu sync.Mutex
	seen := map[string]int{}
	per := map[string]int{}
	got := make(chan struct{}, n*2)
	recv := func(name string, ds <-chan amqp.Delivery) {
		for d := range ds {
			if d.Redelivered || d.RoutingKey != "fwd.q" || d.ContentType != "text/plain" || d.Headers["n"] == nil || string(d.Body) != "m"+d.MessageId {
				t.Errorf("%s: unexpected delivery %+v", name, d)
			}
			mu.Lock()
			seen[d.MessageId]++
			per[name]++
			mu.Unlock()
			_ = d.Ack(false)
			got <- struct{}{}
		}
	}
	go recv("a", da)
	go recv("b", db)
	for range n {
		mustRecv(t, got, "delivery")
	}
	time.Sleep(300 * time.Millisecond) // any duplicate would show now
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != n {
		t.Fatalf("%d distinct messages of %d", len(seen), n)
	}
	for id, c := range seen {
		if c != 1 {
			t.Fatalf("message %s delivered %d times", id, c)
		}
	}
	t.Logf("split: a %d, b %d", per["a"], per["b"])
	if per["a"] < n*3/10 || per["b"] < n*3/10 {
		t.Fatalf("uneven split: %v", per)
	}
}

// A forwarded consumer is one more consumer of the holder's queue: an
// exclusive consumer on either replica excludes the other's; basic.get,
// message counts and purges through the other replica answer for the
// whole queue; a channel closing on the other replica puts what its
// client held back, redelivered.
func TestForwardedQueueSemantics(t *testing.T) {
	rs := newReplicas(t, 2)
	a, b := rs[0], rs[1]
	ca := a.dial()
	cha := a.channel(ca)
	if _, err := cha.QueueDeclare("sem.q", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	// a holds the queue through an exclusive consumer.
	if _, err := cha.Consume("sem.q", "xa", false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	owner(t, rs, "sem.q")
	chb := b.channel(b.dial())
	_, err := chb.Consume("sem.q", "cb", false, false, false, false, nil)
	if amqpCode(err) != amqp.AccessRefused {
		t.Fatalf("consume beside another replica's exclusive consumer: %v, want 403", err)
	}
	if err := cha.Cancel("xa", false); err != nil {
		t.Fatal(err)
	}
	// Now b's exclusive consumer excludes a's.
	chb = b.channel(b.dial())
	if _, err := chb.Consume("sem.q", "xb", false, true, false, false, nil); err != nil {
		t.Fatalf("exclusive consume through b: %v", err)
	}
	cha2 := a.channel(ca)
	if _, err := cha2.Consume("sem.q", "ca", false, false, false, false, nil); amqpCode(err) != amqp.AccessRefused {
		t.Fatalf("consume beside b's exclusive consumer: %v, want 403", err)
	}
	if err := chb.Cancel("xb", false); err != nil {
		t.Fatal(err)
	}
	// a keeps the queue held with an idle consumer of prefetch 0 credit... none: hold it by a consumer
	// on a channel that never acks and has prefetch 1 and one message out.
	hold := a.channel(ca)
	if err := hold.Qos(1, 0, false); err != nil {
		t.Fatal(err)
	}
	hd, err := hold.Consume("sem.q", "hold", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	publishN(t, b.channel(b.dial()), "sem.q", 0, 11)
	first := mustRecv(t, hd, "hold delivery")
	if first.MessageId != "0" {
		t.Fatalf("hold got %s first", first.MessageId)
	}
	if owner(t, rs, "sem.q") != a {
		t.Fatal("a should hold the queue")
	}
	// Counts through b include what a read ahead: 10 ready.
	chb = b.channel(b.dial())
	q, err := chb.QueueDeclarePassive("sem.q", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if q.Messages != 10 {
		t.Fatalf("passive declare through b counts %d, want 10", q.Messages)
	}
	// basic.get through b, requeued, comes again redelivered; the count left is the holder's.
	m, ok, err := chb.Get("sem.q", false)
	if err != nil || !ok {
		t.Fatalf("get through b: %v %v", ok, err)
	}
	if m.MessageId != "1" || m.Redelivered || m.MessageCount != 9 {
		t.Fatalf("get through b: id %s redelivered %v count %d", m.MessageId, m.Redelivered, m.MessageCount)
	}
	if err := m.Nack(false, true); err != nil {
		t.Fatal(err)
	}
	m, ok, err = chb.Get("sem.q", false)
	if err != nil || !ok || m.MessageId != "1" || !m.Redelivered {
		t.Fatalf("get after requeue through b: %v %v %s %v", ok, err, m.MessageId, m.Redelivered)
	}
	if err := m.Ack(false); err != nil {
		t.Fatal(err)
	}
	// A consumer through b takes 3 and its channel closes: they come back, redelivered.
	chc := b.channel(b.dial())
	if err := chc.Qos(3, 0, false); err != nil {
		t.Fatal(err)
	}
	dc, err := chc.Consume("sem.q", "cc", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	var held []string
	for range 3 {
		held = append(held, mustRecv(t, dc, "forwarded delivery").MessageId)
	}
	if err := chc.Close(); err != nil {
		t.Fatal(err)
	}
	if held[0] != "2" {
		t.Fatalf("forwarded consumer got %v first", held)
	}
	for _, want := range held {
		m, ok, err := chb.Get("sem.q", true)
		if err != nil || !ok || m.MessageId != want || !m.Redelivered {
			t.Fatalf("after the channel closed: got %v %v %s redelivered %v, want %s redelivered", ok, err, m.MessageId, m.Redelivered, want)
		}
	}
	// Purge through b: what is ready goes (6), the delivery a's client holds stays.
	n, err := chb.QueuePurge("sem.q", false)
	if err != nil || n != 6 {
		t.Fatalf("purge through b: %d %v, want 6", n, err)
	}
	if _, ok, err := chb.Get("sem.q", false); ok || err != nil {
		t.Fatalf("get after purge: %v %v", ok, err)
	}
	if err := first.Ack(false); err != nil {
		t.Fatal(err)
	}
}

// When the replica that holds a queue stops, the consumer another replica
// forwarded goes on there: nothing is lost, and only what the client had
// not acknowledged comes again.
func TestForwardedConsumerSurvivesHolderStop(t *testing.T) {
	rs := newReplicas(t, 2)
	a, b := rs[0], rs[1]
	cha := a.channel(a.dial())
	if _, err := cha.QueueDeclare("stop.q", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := cha.Consume("stop.q", "ca", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if owner(t, rs, "stop.q") != a {
		t.Fatal("a should hold the queue")
	}
	if err := cha.Cancel("ca", false); err != nil {
		t.Fatal(err)
	}
	// a keeps holding the queue while b's consumer is forwarded to it.
	chb := b.channel(b.dial())
	if err := chb.Qos(10, 0, false); err != nil {
		t.Fatal(err)
	}
	db, err := chb.Consume("stop.q", "cb", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	pub := b.channel(b.dial())
	publishN(t, pub, "stop.q", 0, 100)
	acked := map[string]bool{}
	for len(acked) < 50 {
		d := mustRecv(t, db, "before the stop")
		if acked[d.MessageId] {
			t.Fatalf("acked message %s again", d.MessageId)
		}
		acked[d.MessageId] = true
		if err := d.Ack(false); err != nil {
			t.Fatal(err)
		}
	}
	stopped := time.Now()
	stopDone := make(chan struct{})
	go func() { // it drains: the client's acks still reach it meanwhile
		defer close(stopDone)
		a.stop()
	}()
	publishN(t, pub, "stop.q", 100, 100)
	var handover time.Duration
	for len(acked) < 200 {
		d := mustRecv(t, db, "after the stop")
		if handover == 0 {
			handover = time.Since(stopped)
		}
		if acked[d.MessageId] {
			t.Fatalf("acked message %s again after the holder stopped", d.MessageId)
		}
		acked[d.MessageId] = true
		if err := d.Ack(false); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("first delivery %v after the holder stopped", handover)
	<-stopDone
	if owner(t, rs[1:], "stop.q") != b {
		t.Fatal("b should hold the queue now")
	}
}

// A replica that loses a queue it holds (its ownership lease lapsed; another replica claims it)
// keeps its clients: their consumers go on through the new holder, the connection stays open,
// what a consumer held unacknowledged comes again (redelivered, its late ack void), and nothing
// is lost. A consume and a basic.get on the old holder's channels after the loss go through the
// new holder too.
func TestHolderLosingQueueMovesConsumers(t *testing.T) {
	rs := newReplicas(t, 2)
	a, b := rs[0], rs[1]
	const name = "lose.q"
	conna := a.dial()
	closed := conna.NotifyClose(make(chan *amqp.Error, 1))
	cha := a.channel(conna)
	if _, err := cha.QueueDeclare(name, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := cha.Qos(20, 0, false); err != nil {
		t.Fatal(err)
	}
	da, err := cha.Consume(name, "ca", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if owner(t, rs, name) != a {
		t.Fatal("a should hold the queue")
	}
	connb := b.dial()
	closedB := connb.NotifyClose(make(chan *amqp.Error, 1))
	chb := b.channel(connb)
	if err := chb.Qos(20, 0, false); err != nil {
		t.Fatal(err)
	}
	db, err := chb.Consume(name, "cb", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	pub := b.channel(b.dial())
	publishN(t, pub, name, 0, 200)

	var mu sync.Mutex
	got := map[string]int{}             // deliveries per message
	onA, newOnA, redelivered := 0, 0, 0 // newOnA: a's deliveries of messages published after the first loss
	var held []amqp.Delivery            // a's deliveries kept unacknowledged until after the loss
	take := func(d amqp.Delivery, fromA bool) {
		mu.Lock()
		defer mu.Unlock()
		got[d.MessageId]++
		if fromA {
			onA++
			if i, _ := strconv.Atoi(d.MessageId); i >= 200 && i < 400 {
				newOnA++
			}
		}
		if d.Redelivered {
			redelivered++
		}
	}
	ack := func(d amqp.Delivery) {
		if err := d.Ack(false); err != nil {
			t.Error(err)
		}
	}
	// Until the loss, a's client keeps its first 5 deliveries and acks the rest; b's acks all.
	for len(held) < 5 {
		d := mustRecv(t, da, "a before the loss")
		take(d, true)
		held = append(held, d)
	}
	stopB := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case d, ok := <-db:
				if !ok {
					return
				}
				take(d, false)
				ack(d)
			case <-stopB:
				return
			}
		}
	}()
	ch := queueChannel(vhostKey(a.vhost), name, 0)
	lostAt := takeFrom(t, a, ch)
	// a's consumer counts on the new holder once its link is open.
	for {
		q, err := pub.QueueDeclarePassive(name, true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		if q.Consumers == 2 {
			break
		}
		if time.Since(lostAt) > 20*time.Second {
			t.Fatalf("%d consumers of the queue 20 s after a lost it, want 2", q.Consumers)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("a's consumer is forwarded to the new holder %v after the loss", time.Since(lostAt).Round(time.Millisecond))
	for _, d := range held { // acks of deliveries made through the lost holding change nothing
		ack(d)
	}
	publishN(t, pub, name, 200, 200)
	// A consume and a get through a channel of a's that used the queue before the loss.
	da2, err := cha.Consume(name, "ca2", false, false, false, false, nil)
	if err != nil {
		t.Fatalf("consume on a after the loss: %v", err)
	}
	if err := cha.Cancel("ca2", false); err != nil {
		t.Fatal(err)
	}
	for d := range da2 { // what it got before the cancel
		take(d, true)
		ack(d)
	}
	var firstAfter time.Duration
	waitAll := func(want int, phase string) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for {
			mu.Lock()
			n := len(got)
			mu.Unlock()
			if n == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d of %d messages delivered", phase, n, want)
			}
			select {
			case d, ok := <-da:
				if !ok {
					t.Fatalf("%s: a's consumer ended", phase)
				}
				if firstAfter == 0 {
					firstAfter = time.Since(lostAt)
				}
				take(d, true)
				ack(d)
			case err := <-closed:
				t.Fatalf("%s: a's connection closed: %v", phase, err)
			case err := <-closedB:
				t.Fatalf("%s: b's connection closed: %v", phase, err)
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	waitAll(400, "after a lost the queue")
	if owner(t, rs, name) != b {
		t.Fatal("b should hold the queue after a lost it")
	}
	if _, ok, err := cha.Get(name, false); err != nil || ok {
		t.Fatalf("basic.get on a after the loss: ok %v, %v", ok, err)
	}
	mu.Lock()
	for _, d := range held {
		if got[d.MessageId] < 2 {
			t.Errorf("message %s, held by a's client when a lost the queue, did not come again", d.MessageId)
		}
	}
	if newOnA == 0 {
		t.Error("a's consumer got none of the messages published after a lost the queue")
	}
	t.Logf("a lost the queue: a's consumer %d deliveries (%d of the messages published since), the first %v after the loss; %d redelivered", onA, newOnA, firstAfter, redelivered)
	mu.Unlock()

	// Now b loses it: its consumer, served there since it took the queue over, moves too, and a
	// (whose consumer is forwarded to b) takes the queue back.
	a.owners.allow(ch)
	publishN(t, pub, name, 400, 100) // some of them still out when b loses the queue
	lostAt, firstAfter = takeFrom(t, b, ch), 0
	publishN(t, pub, name, 500, 100)
	waitAll(600, "after b lost the queue")
	close(stopB)
	wg.Wait()
	if owner(t, rs, name) != a {
		t.Fatal("a should hold the queue after b lost it")
	}
	mu.Lock()
	defer mu.Unlock()
	for id, n := range got {
		if n > 3 { // once, and again at most once for each loss
			t.Errorf("message %s delivered %d times", id, n)
		}
	}
	t.Logf("b lost the queue: first delivery on a %v after the loss; %d deliveries on a, %d redelivered in all", firstAfter, onA, redelivered)
	b.owners.allow(ch)
}

// The peer service refuses malformed links and calls with a clear status, and ignores
// settlements of keys it never handed out.
func TestPeerLinkBadInput(t *testing.T) {
	rs := newReplicas(t, 1)
	r := rs[0]
	peers, err := cluster.NewPeers(cluster.PeerOptions{Secret: r.secret})
	if err != nil {
		t.Fatal(err)
	}
	defer peers.Close()
	conn, err := peers.Conn(r.peerAddr)
	if err != nil {
		t.Fatal(err)
	}
	pc := peerpb.NewAMQPPeerClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	link := func(first *peerpb.LinkRequest) (peerpb.AMQPPeer_LinkClient, error) {
		st, err := pc.Link(ctx)
		if err != nil {
			return nil, err
		}
		if err := st.Send(first); err != nil {
			return nil, err
		}
		_, err = st.Recv()
		return st, err
	}
	if _, err := link(&peerpb.LinkRequest{Kind: &peerpb.LinkRequest_Credit{Credit: &peerpb.Credit{Add: 1}}}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a link without Open: %v, want InvalidArgument", err)
	}
	if _, err := link(&peerpb.LinkRequest{Kind: &peerpb.LinkRequest_Open{Open: &peerpb.Open{Queue: &peerpb.QueueRef{Name: "x"}}}}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("an Open without vhost and channel: %v, want InvalidArgument", err)
	}
	if _, err := pc.Queue(ctx, &peerpb.QueueRequest{}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a Queue call without a queue: %v, want InvalidArgument", err)
	}
	ref := &peerpb.QueueRef{Vhost: vhostKey(r.vhost), Name: "bad.q", Channel: queueChannel(vhostKey(r.vhost), "bad.q", 0)}
	if _, err := pc.Queue(ctx, &peerpb.QueueRequest{Queue: ref, Op: 7}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("an unknown queue operation: %v, want InvalidArgument", err)
	}
	st, err := link(&peerpb.LinkRequest{Kind: &peerpb.LinkRequest_Open{Open: &peerpb.Open{Queue: ref}}})
	if err != nil {
		t.Fatalf("a get link: %v", err)
	}
	// Unknown keys are ignored; a second Open ends the link.
	if err := st.Send(&peerpb.LinkRequest{Kind: &peerpb.LinkRequest_Settle{Settle: &peerpb.Settle{Keys: []uint64{1, 99}}}}); err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&peerpb.LinkRequest{Kind: &peerpb.LinkRequest_Get{Get: &peerpb.Get{}}}); err != nil {
		t.Fatal(err)
	}
	if resp, err := st.Recv(); err != nil || resp.GetGetEmpty() == nil {
		t.Fatalf("get of an empty queue: %v %v", resp, err)
	}
	if err := st.Send(&peerpb.LinkRequest{Kind: &peerpb.LinkRequest_Open{Open: &peerpb.Open{Queue: ref}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a second Open: %v, want InvalidArgument", err)
	}
	// Without the secret, nothing.
	other, err := cluster.NewPeers(cluster.PeerOptions{Secret: "wrong"})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	oc, err := other.Conn(r.peerAddr)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := peerpb.NewAMQPPeerClient(oc).Queue(ctx, &peerpb.QueueRequest{Queue: ref}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("a call without the secret: %v, want Unauthenticated", err)
	}
}

// Consumer priorities hold across replicas; a forwarded consumer's client settles what it holds
// after basic.cancel (ack, reject without requeue, recover), and a queue deleted through the
// holder cancels the forwarded consumer with basic.cancel.
func TestForwardedPrioritiesCancelDelete(t *testing.T) {
	rs := newReplicas(t, 2)
	a, b := rs[0], rs[1]
	cha := a.channel(a.dial())
	if _, err := cha.QueueDeclare("prio.q", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := cha.Qos(50, 0, false); err != nil {
		t.Fatal(err)
	}
	da, err := cha.Consume("prio.q", "low", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if owner(t, rs, "prio.q") != a {
		t.Fatal("a should hold the queue")
	}
	chb := b.channel(b.dial())
	if err := chb.Qos(50, 0, false); err != nil {
		t.Fatal(err)
	}
	db, err := chb.Consume("prio.q", "high", false, false, false, false, amqp.Table{"x-priority": int32(10)})
	if err != nil {
		t.Fatal(err)
	}
	publishN(t, a.channel(a.dial()), "prio.q", 0, 20)
	var held []amqp.Delivery
	for range 20 {
		held = append(held, mustRecv(t, db, "delivery to the higher priority"))
	}
	select {
	case d := <-da:
		t.Fatalf("the lower-priority consumer got %s while the higher one had credit", d.MessageId)
	case <-time.After(300 * time.Millisecond):
	}
	if err := chb.Cancel("high", false); err != nil {
		t.Fatal(err)
	}
	if err := held[9].Ack(true); err != nil { // 0..9
		t.Fatal(err)
	}
	if err := held[10].Reject(false); err != nil { // gone
		t.Fatal(err)
	}
	if err := chb.Recover(true); err != nil { // 11..19 back, to a's consumer
		t.Fatal(err)
	}
	got := map[string]bool{}
	for range 9 {
		d := mustRecv(t, da, "recovered delivery")
		if !d.Redelivered {
			t.Fatalf("recovered %s not marked redelivered", d.MessageId)
		}
		got[d.MessageId] = true
		if err := d.Ack(false); err != nil {
			t.Fatal(err)
		}
	}
	for i := 11; i < 20; i++ {
		if !got[strconv.Itoa(i)] {
			t.Fatalf("recovered %v, want 11..19", got)
		}
	}
	select {
	case d := <-da:
		t.Fatalf("%s came again after it was acked or rejected", d.MessageId)
	case <-time.After(500 * time.Millisecond):
	}
	// A new forwarded consumer is cancelled when the queue is deleted through the holder.
	chb2 := b.channel(b.dial())
	cancels := chb2.NotifyCancel(make(chan string, 1))
	if _, err := chb2.Consume("prio.q", "doomed", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := cha.QueueDelete("prio.q", false, false, false); err != nil {
		t.Fatal(err)
	}
	if tag := mustRecv(t, cancels, "basic.cancel of the forwarded consumer"); tag != "doomed" {
		t.Fatalf("cancelled %q", tag)
	}
}

// A channel-wide prefetch (global qos) bounds all of a channel's forwarded consumers together;
// consumer counts through either replica include the other's consumers.
func TestForwardedGlobalPrefetchAndCounts(t *testing.T) {
	rs := newReplicas(t, 2)
	a, b := rs[0], rs[1]
	ca := a.dial()
	cha := a.channel(ca)
	if _, err := cha.QueueDeclare("glob.q", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	// a holds the queue through a basic.get (its channel keeps the hold).
	if _, ok, err := cha.Get("glob.q", false); ok || err != nil {
		t.Fatalf("get of the empty queue: %v %v", ok, err)
	}
	if owner(t, rs, "glob.q") != a {
		t.Fatal("a should hold the queue")
	}
	chb := b.channel(b.dial())
	if err := chb.Qos(3, 0, true); err != nil {
		t.Fatal(err)
	}
	d1, err := chb.Consume("glob.q", "c1", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	d2, err := chb.Consume("glob.q", "c2", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	publishN(t, a.channel(ca), "glob.q", 0, 10)
	var held []amqp.Delivery
	timeout := time.After(time.Second)
collect:
	for {
		select {
		case d := <-d1:
			held = append(held, d)
		case d := <-d2:
			held = append(held, d)
		case <-timeout:
			break collect
		}
	}
	if len(held) != 3 {
		t.Fatalf("a channel with global prefetch 3 holds %d deliveries of two forwarded consumers", len(held))
	}
	for _, r := range []*replica{a, b} {
		q, err := r.channel(r.dial()).QueueDeclarePassive("glob.q", true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		if q.Consumers != 2 || q.Messages != 7 {
			t.Fatalf("passive declare through %s: %d consumers, %d messages; want 2 and 7", r.id, q.Consumers, q.Messages)
		}
	}
	if _, err := a.channel(ca).QueueDelete("glob.q", true, false, false); amqpCode(err) != amqp.PreconditionFailed {
		t.Fatalf("delete if-unused through the holder while b consumes: %v, want 406", err)
	}
	for _, d := range held {
		if err := d.Ack(false); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		select {
		case d := <-d1:
			_ = d.Ack(false)
		case d := <-d2:
			_ = d.Ack(false)
		case <-time.After(15 * time.Second):
			t.Fatal("no delivery after the acks freed the channel's prefetch")
		}
	}
}

// A link that breaks (the forwarding replica died, or lost its connection to the holder) gives
// what it had out back to the queue, redelivered; the forwarding replica's consumer links again.
func TestBrokenLinkRequeues(t *testing.T) {
	rs := newReplicas(t, 2)
	a, b := rs[0], rs[1]
	cha := a.channel(a.dial())
	if _, err := cha.QueueDeclare("broken.q", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := cha.Get("broken.q", false); ok || err != nil { // a holds the queue
		t.Fatalf("get of the empty queue: %v %v", ok, err)
	}
	if owner(t, rs, "broken.q") != a {
		t.Fatal("a should hold the queue")
	}
	chb := b.channel(b.dial())
	if err := chb.Qos(3, 0, false); err != nil {
		t.Fatal(err)
	}
	db, err := chb.Consume("broken.q", "cb", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	publishN(t, a.channel(a.dial()), "broken.q", 0, 3)
	for range 3 {
		if d := mustRecv(t, db, "before the break"); d.Redelivered {
			t.Fatalf("%s redelivered before the break", d.MessageId)
		}
	}
	b.peers.Close() // every stream to a breaks
	// The client's acks of those deliveries are void now; the holder requeued them and the
	// consumer, linked again, gets them once more.
	got := map[string]bool{}
	for len(got) < 3 {
		d := mustRecv(t, db, "after the break")
		if !d.Redelivered {
			t.Fatalf("%s not marked redelivered after the break", d.MessageId)
		}
		got[d.MessageId] = true
		if err := d.Ack(false); err != nil {
			t.Fatal(err)
		}
	}
	q, err := cha.QueueDeclarePassive("broken.q", true, false, false, false, nil)
	if err != nil || q.Messages != 0 || q.Consumers != 1 {
		t.Fatalf("after the acks: %+v %v, want 0 messages and 1 consumer", q, err)
	}
}

// streadway/amqp, the older Go client, consumes through a forwarding replica the same way.
func TestForwardedStreadway(t *testing.T) {
	rs := newReplicas(t, 2)
	a, b := rs[0], rs[1]
	cha := a.channel(a.dial())
	if _, err := cha.QueueDeclare("sw.q", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := cha.Get("sw.q", false); ok || err != nil { // a holds the queue
		t.Fatalf("get of the empty queue: %v %v", ok, err)
	}
	if owner(t, rs, "sw.q") != a {
		t.Fatal("a should hold the queue")
	}
	c, err := streadway.Dial(b.url())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ch, err := c.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Qos(10, 0, false); err != nil {
		t.Fatal(err)
	}
	ds, err := ch.Consume("sw.q", "sw", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	publishN(t, a.channel(a.dial()), "sw.q", 0, 30)
	seen := map[string]int{}
	requeued := false
	for len(seen) < 30 {
		d := mustRecv(t, ds, "streadway delivery")
		seen[d.MessageId]++
		if d.MessageId == "5" && !requeued {
			requeued = true
			if err := d.Nack(false, true); err != nil {
				t.Fatal(err)
			}
			delete(seen, "5")
			continue
		}
		if d.MessageId == "5" && !d.Redelivered {
			t.Fatal("requeued message 5 not marked redelivered")
		}
		if err := d.Ack(false); err != nil {
			t.Fatal(err)
		}
	}
	for id, n := range seen {
		if n != 1 {
			t.Fatalf("message %s acked %d times", id, n)
		}
	}
}

// holdOn declares durable queue name through r, which then holds it
// through a consumer with prefetch 1 on connection c; it publishes n
// messages 0..n-1 there and returns message 0, which that consumer keeps
// (the other n-1 wait in the queue), and the consumer's channel.
func holdOn(t *testing.T, rs []*replica, r *replica, c *amqp.Connection, name string, n int) (*amqp.Delivery, *amqp.Channel) {
	t.Helper()
	if _, err := r.channel(c).QueueDeclare(name, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	waitKnown(t, rs, name)
	hold := r.channel(c)
	if err := hold.Qos(1, 0, false); err != nil {
		t.Fatal(err)
	}
	hd, err := hold.Consume(name, "hold."+name, false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if owner(t, rs, name) != r {
		t.Fatalf("%s should hold %s", r.id, name)
	}
	publishN(t, r.channel(c), name, 0, n)
	d := mustRecv(t, hd, "hold")
	if d.MessageId != "0" {
		t.Fatalf("hold got %s", d.MessageId)
	}
	return &d, hold
}

// holderLink returns r's one link for queue name.
func holderLink(t *testing.T, r *replica, name string) *peerLink {
	t.Helper()
	r.srv.mu.Lock()
	var links []*peerLink
	for l := range r.srv.links {
		if l.q.name == name {
			links = append(links, l)
		}
	}
	r.srv.mu.Unlock()
	if len(links) != 1 {
		t.Fatalf("%s has %d links for %s, want 1", r.id, len(links), name)
	}
	return links[0]
}

// A forwarded consumer of a queue with messages waiting gets them as
// first deliveries, over the link it opened: the holder answers Opened
// before its dispatcher may send the consumer anything (otherwise the
// link was taken for a failed one, and what it had out came again,
// redelivered, over a second link).
func TestForwardedFirstDeliveries(t *testing.T) {
	// The dispatcher has time to send before the handler goes on.
	linkRegistered = func() { time.Sleep(20 * time.Millisecond) }
	t.Cleanup(func() { linkRegistered = nil })
	rs := newReplicas(t, 2)
	a, b := rs[0], rs[1]
	ca, cb := a.dial(), b.dial()
	for i := range 5 {
		name := "first." + strconv.Itoa(i)
		holdOn(t, rs, a, ca, name, 20)
		chb := b.channel(cb)
		if err := chb.Qos(10, 0, false); err != nil {
			t.Fatal(err)
		}
		db, err := chb.Consume(name, "fwd", false, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		for range 10 {
			if d := mustRecv(t, db, "forwarded delivery"); d.Redelivered {
				t.Fatalf("queue %d: first delivery of %s redelivered", i, d.MessageId)
			}
		}
		if err := chb.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// A forwarded no-ack consumer is at-most-once, as RabbitMQ's no-ack: the
// holder settles each delivery as it sends it and keeps nothing out for
// it, so nothing it sent comes again when the consumer goes.
func TestForwardedNoAckSettledOnSend(t *testing.T) {
	rs := newReplicas(t, 2)
	a, b := rs[0], rs[1]
	const name, n = "noack.fwd", 20
	h0, _ := holdOn(t, rs, a, a.dial(), name, n)
	chb := b.channel(b.dial())
	db, err := chb.Consume(name, "fwd", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	for range n - 1 {
		if d := mustRecv(t, db, "forwarded no-ack delivery"); d.Redelivered {
			t.Fatalf("%s redelivered", d.MessageId)
		}
	}
	l := holderLink(t, a, name)
	if !l.noAck {
		t.Fatal("the holder does not know the link's consumer is no-ack")
	}
	if out := l.outstanding(); out != 0 {
		t.Fatalf("holder keeps %d no-ack deliveries out", out)
	}
	if err := chb.Close(); err != nil {
		t.Fatal(err)
	}
	if err := h0.Ack(false); err != nil {
		t.Fatal(err)
	}
	readyThrough(t, a, name, 0)
	// Nothing the no-ack consumer was sent comes again.
	c := a.channel(a.dial())
	if _, ok, err := c.Get(name, true); ok || err != nil {
		t.Fatalf("get after the no-ack consumer went: %v %v", ok, err)
	}
}
