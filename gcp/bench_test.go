package gcp_test

// Side-by-side benchmarks: the proxy on the embedded KubeMQ (or
// $KUBEMQ_ADDRESS) against pstest in-process, both driven by the official
// Go client at default settings with 1 KiB messages. Run them with
//
//	go test -run '^$' -bench . -benchtime 1x ./gcp/
//
// Each benchmark does a fixed amount of work per target (b.N is ignored
// beyond 1) and reports msgs/s or latency percentiles as metrics, and the
// process's CPU time per message (client, server and embedded KubeMQ
// together), which varies less than wall time on a shared machine.
// The proxy reaches the embedded KubeMQ as the binary does: in process
// (embedded.Server.Channel) and in memory; $BENCH_PERSIST=1 gives the
// embedded server a data directory, $KUBEMQ_LINK=tcp puts loopback TCP in
// between. $BENCH_CPUPROFILE or $BENCH_TRACE name a file for a CPU profile
// or an execution trace of the measured phase of a proxy benchmark
// ($BENCH_PROFILE_ALL=1: of pstest's too; name one size with
// $BENCH_PUBLISH_N or -bench, as each run rewrites the file).

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os/exec"
	"runtime/debug"

	"os"
	"runtime"
	"runtime/pprof"
	"runtime/trace"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/timestamppb"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"

	"github.com/kubemq-io/kubemq-proxy/embedded"
	"github.com/kubemq-io/kubemq-proxy/gcp"
)

type benchTarget struct {
	name    string
	backlog int // receive benchmark size: pstest drains slowly
	hotKey  int // ordered hot-key benchmark size: pstest takes 0.1 s a message
	start   func(b *testing.B) (addr, project string)
}

var benchTargets = []benchTarget{
	{"proxy", 100_000, 2_000, func(b *testing.B) (string, string) {
		e := startEnv(b, withGCP(func(o *gcp.Options) { o.Config.MaxInflightPerSubscription = 200_000 }))
		return e.addr, e.project
	}},
	{"pstest", 5_000, 200, func(b *testing.B) (string, string) {
		srv := pstest.NewServer()
		b.Cleanup(func() { srv.Close() })
		return srv.Addr, "bench"
	}},
}

func benchClient(b *testing.B, addr, project string, extra ...option.ClientOption) *pubsub.Client {
	opts := append([]option.ClientOption{option.WithEndpoint(addr), option.WithoutAuthentication(),
		option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials()))}, extra...)
	c, err := pubsub.NewClient(context.Background(), project, opts...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	return c
}

func benchTopology(b *testing.B, c *pubsub.Client, project string) (topicID, subID string) {
	ctx := context.Background()
	topicID, subID = "bench-"+randSuffix(), "bench-sub-"+randSuffix()
	if _, err := c.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: "projects/" + project + "/topics/" + topicID}); err != nil {
		b.Fatal(err)
	}
	if _, err := c.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{
		Name: "projects/" + project + "/subscriptions/" + subID, Topic: "projects/" + project + "/topics/" + topicID,
	}); err != nil {
		b.Fatal(err)
	}
	return topicID, subID
}

var kib = []byte(strings.Repeat("x", 1024))

func publishAll(b *testing.B, c *pubsub.Client, topicID string, n int) time.Duration {
	return publishData(b, c, topicID, n, kib)
}

// publishData publishes n messages of data through the Go client's
// publisher at its default settings and waits for every result.
func publishData(b *testing.B, c *pubsub.Client, topicID string, n int, data []byte) time.Duration {
	ctx := context.Background()
	p := c.Publisher(topicID)
	defer p.Stop()
	start := time.Now()
	rs := make([]*pubsub.PublishResult, n)
	for i := range n {
		rs[i] = p.Publish(ctx, &pubsub.Message{Data: data})
	}
	for _, r := range rs {
		if _, err := r.Get(ctx); err != nil {
			b.Fatal(err)
		}
	}
	return time.Since(start)
}

// BenchmarkPublish: publish throughput into a topic with one subscription
// that nobody consumes, at three sizes (each after a warm-up of a fifth of
// it), since pstest's cost grows with the backlog it holds: it scans every
// stored message of a subscription each 10 ms. $BENCH_PUBLISH_N (a comma
// list) changes the sizes.
func BenchmarkPublish(b *testing.B) {
	sizes := []int{10_000, 50_000, 200_000}
	if v := os.Getenv("BENCH_PUBLISH_N"); v != "" {
		sizes = nil
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n <= 0 {
				b.Fatalf("BENCH_PUBLISH_N: %q is not a positive count", f)
			}
			sizes = append(sizes, n)
		}
	}
	for _, n := range sizes {
		for _, tg := range benchTargets {
			b.Run(fmt.Sprintf("n=%d/%s", n, tg.name), func(b *testing.B) {
				addr, project := tg.start(b)
				c := benchClient(b, addr, project)
				topicID, _ := benchTopology(b, c, project)
				// The same warm-up for each target, so that neither is
				// measured on a cold process (the first target would be).
				publishAll(b, c, topicID, n/5)
				b.ResetTimer()
				var d time.Duration
				cpu := cpuTime()
				stop := profileProxy(b, tg.name)
				for range b.N {
					d = publishAll(b, c, topicID, n)
				}
				stop()
				b.ReportMetric(float64(n)/d.Seconds(), "msgs/s")
				b.ReportMetric(float64((cpuTime()-cpu).Microseconds())/float64(n*b.N), "cpu-us/msg")
			})
		}
	}
}

// BenchmarkPublishSchema: what validating every message costs on
// publish. For each schema type and encoding, one proxy gets two topics,
// one with the schema and one without, each with a subscription nobody
// consumes, and the same record (about 1 KiB) is published to them in
// turns (plain, schema, schema, plain; a quarter of n each, after a
// warm-up of a fifth of n on each), so that both halves of the ratio come
// from the same process at the same time. n is 50,000 ($BENCH_PUBLISH_N
// sets another). Memory after the run: the process's RSS and Go heap
// (client, proxy and KubeMQ together).
func BenchmarkPublishSchema(b *testing.B) {
	n := 50_000
	if v, err := strconv.Atoi(os.Getenv("BENCH_PUBLISH_N")); err == nil && v > 0 {
		n = v
	}
	long := strings.Repeat("x", 1000)
	avroDef := `{"type":"record","name":"State","fields":[{"name":"name","type":"string"},{"name":"post_abbr","type":"string"}]}`
	protoDef := "syntax = \"proto3\";\nmessage State {\n  string name = 1;\n  string post_abbr = 2;\n}\n"
	jsonData := []byte(`{"name":"` + long + `","post_abbr":"AK"}`)
	avroBin := append(append(binary.AppendVarint(nil, int64(len(long))), long...), 4, 'A', 'K')
	protoBin := protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), long)
	protoBin = protowire.AppendString(protowire.AppendTag(protoBin, 2, protowire.BytesType), "AK")
	for _, tc := range []struct {
		name string
		typ  pubsubpb.Schema_Type
		def  string
		enc  pubsubpb.Encoding
		data []byte
	}{
		// Control: two topics without a schema, to see the noise of a ratio.
		{"none", 0, "", 0, jsonData},
		{"avro-json", pubsubpb.Schema_AVRO, avroDef, pubsubpb.Encoding_JSON, jsonData},
		{"avro-binary", pubsubpb.Schema_AVRO, avroDef, pubsubpb.Encoding_BINARY, avroBin},
		{"proto-json", pubsubpb.Schema_PROTOCOL_BUFFER, protoDef, pubsubpb.Encoding_JSON, jsonData},
		{"proto-binary", pubsubpb.Schema_PROTOCOL_BUFFER, protoDef, pubsubpb.Encoding_BINARY, protoBin},
	} {
		b.Run(fmt.Sprintf("n=%d/%s", n, tc.name), func(b *testing.B) {
			e := startEnv(b, withGCP(func(o *gcp.Options) { o.Config.MaxInflightPerSubscription = 200_000 }))
			c := benchClient(b, e.addr, e.project)
			ctx := context.Background()
			var s *pubsubpb.Schema
			if tc.typ != 0 {
				var err error
				s, err = e.schemaClient().CreateSchema(ctx, &pubsubpb.CreateSchemaRequest{Parent: "projects/" + e.project, SchemaId: "bench-" + randSuffix(),
					Schema: &pubsubpb.Schema{Type: tc.typ, Definition: tc.def}})
				if err != nil {
					b.Fatal(err)
				}
			}
			var topics [2]string // plain, with the schema
			for i := range topics {
				topics[i] = "bench-" + randSuffix()
				topic := &pubsubpb.Topic{Name: "projects/" + e.project + "/topics/" + topics[i]}
				if i == 1 && s != nil {
					topic.SchemaSettings = &pubsubpb.SchemaSettings{Schema: s.Name, Encoding: tc.enc}
				}
				if _, err := c.TopicAdminClient.CreateTopic(ctx, topic); err != nil {
					b.Fatal(err)
				}
				if _, err := c.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{
					Name: "projects/" + e.project + "/subscriptions/bench-sub-" + randSuffix(), Topic: topic.Name}); err != nil {
					b.Fatal(err)
				}
				publishData(b, c, topics[i], n/5, tc.data)
			}
			b.ResetTimer()
			var d [2]time.Duration
			var cpu [2]time.Duration
			stop := profileProxy(b, "proxy")
			for range b.N {
				for _, i := range []int{0, 1, 1, 0} {
					c0 := cpuTime()
					d[i] += publishData(b, c, topics[i], n/4, tc.data)
					cpu[i] += cpuTime() - c0
				}
			}
			stop()
			per := float64(n / 2 * b.N)
			b.ReportMetric(per/d[0].Seconds(), "plain-msgs/s")
			b.ReportMetric(per/d[1].Seconds(), "schema-msgs/s")
			b.ReportMetric(d[0].Seconds()/d[1].Seconds(), "ratio")
			b.ReportMetric(float64(cpu[0].Microseconds())/per, "plain-cpu-us/msg")
			b.ReportMetric(float64(cpu[1].Microseconds())/per, "schema-cpu-us/msg")
			runtime.GC()
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			b.ReportMetric(float64(rssBytes())/(1<<20), "RSS-MiB")
			b.ReportMetric(float64(ms.HeapInuse)/(1<<20), "heap-MiB")
		})
	}
}

// BenchmarkBacklogReceive: receive+ack of a stored backlog through
// StreamingPull (Receive at default settings).
func BenchmarkBacklogReceive(b *testing.B) {
	for _, tg := range benchTargets {
		b.Run(tg.name, func(b *testing.B) {
			addr, project := tg.start(b)
			c := benchClient(b, addr, project)
			topicID, subID := benchTopology(b, c, project)
			n := tg.backlog
			publishAll(b, c, topicID, n)
			b.ResetTimer()
			stopProfile := profileProxy(b, tg.name)
			var d time.Duration
			cpu := cpuTime()
			for range b.N {
				var got atomic.Int64
				ctx, cancel := context.WithCancel(context.Background())
				start := time.Now()
				sub := c.Subscriber(subID)
				if v, _ := strconv.Atoi(os.Getenv("BENCH_MAX_OUTSTANDING")); v > 0 {
					// Default 1000 with the client's 100 ms ack flush caps a
					// stream at 10k msgs/s on any server that honours it.
					sub.ReceiveSettings.MaxOutstandingMessages = v
				}
				err := sub.Receive(ctx, func(_ context.Context, m *pubsub.Message) {
					m.Ack()
					if got.Add(1) == int64(n) {
						cancel()
					}
				})
				d = time.Since(start)
				cancel()
				if err != nil {
					b.Fatal(err)
				}
			}
			stopProfile()
			b.ReportMetric(float64(n)/d.Seconds(), "msgs/s")
			b.ReportMetric(float64((cpuTime()-cpu).Microseconds())/float64(n*b.N), "cpu-us/msg")
			b.ReportMetric(float64(n), "backlog")
		})
	}
}

// BenchmarkLatency: publish->receive latency at a paced 5,000 msg/s
// ($BENCH_RATE overrides it) for 4 s; each message carries its send time.
// p50/p99 are end to end, from Publish() to the receive callback,
// including the publisher's batching delay: the Go client holds a message
// up to DelayThreshold (10 ms by default) waiting for a fuller batch, so at
// a steady rate the median message waits about 5 ms before any server sees
// it (held-p50). rpc-p50/rpc-p99 start when the Publish RPC carrying the
// message starts (a client interceptor stamps it): the server's whole share,
// network included. srv-p50/srv-p99 start at the publish_time the server
// assigned.
func BenchmarkLatency(b *testing.B) {
	rate, secs := 5000, 4
	if v, _ := strconv.Atoi(os.Getenv("BENCH_RATE")); v >= 100 {
		rate = v // diagnosis: the latency a lighter load sees
	}
	for _, tg := range benchTargets {
		b.Run(tg.name, func(b *testing.B) {
			addr, project := tg.start(b)
			// Stamps each message with the time its Publish RPC starts, so
			// the time the publisher held it for batching can be told apart
			// from the time the server took.
			stamp := grpc.WithUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				if pr, ok := req.(*pubsubpb.PublishRequest); ok {
					now := strconv.FormatInt(time.Now().UnixNano(), 10)
					for _, m := range pr.Messages {
						if m.Attributes != nil {
							m.Attributes["rpc"] = now
						}
					}
				}
				return invoker(ctx, method, req, reply, cc, opts...)
			})
			c := benchClient(b, addr, project, option.WithGRPCDialOption(stamp))
			topicID, subID := benchTopology(b, c, project)
			b.ResetTimer()
			for range b.N {
				n := rate * secs
				var mu sync.Mutex
				lat := make([]time.Duration, 0, n)
				srv := make([]time.Duration, 0, n)
				rpc := make([]time.Duration, 0, n)
				held := make([]time.Duration, 0, n)
				ctx, cancel := context.WithCancel(context.Background())
				recvDone := make(chan error, 1)
				go func() {
					recvDone <- c.Subscriber(subID).Receive(ctx, func(_ context.Context, m *pubsub.Message) {
						now := time.Now()
						sent, _ := strconv.ParseInt(m.Attributes["t"], 10, 64)
						rpcStart, _ := strconv.ParseInt(m.Attributes["rpc"], 10, 64)
						d := now.Sub(time.Unix(0, sent))
						ds := now.Sub(m.PublishTime)
						m.Ack()
						mu.Lock()
						lat = append(lat, d)
						srv = append(srv, ds)
						rpc = append(rpc, now.Sub(time.Unix(0, rpcStart)))
						held = append(held, time.Unix(0, rpcStart).Sub(time.Unix(0, sent)))
						if len(lat) == n {
							cancel()
						}
						mu.Unlock()
					})
				}()
				p := c.Publisher(topicID)
				// 1,000 ticks/s, rate/1000 messages each (below 1,000/s one
				// message a tick, slower): a steady stream rather than bursts
				// aligned with the publisher's batching timer, which would
				// make every message wait its full delay.
				tick := time.NewTicker(max(time.Millisecond, time.Second/time.Duration(rate)))
				var rs []*pubsub.PublishResult
				for i := 0; i < n; {
					<-tick.C
					for j := 0; j < max(rate/1000, 1) && i < n; j++ {
						rs = append(rs, p.Publish(ctx, &pubsub.Message{Data: kib, Attributes: map[string]string{"t": strconv.FormatInt(time.Now().UnixNano(), 10)}}))
						i++
					}
				}
				tick.Stop()
				for _, r := range rs {
					if _, err := r.Get(context.Background()); err != nil {
						b.Fatal(err)
					}
				}
				p.Stop()
				select {
				case <-recvDone:
				case <-time.After(20 * time.Second):
					cancel()
					<-recvDone
				}
				mu.Lock()
				if len(lat) == 0 {
					b.Fatal("nothing received")
				}
				// pstest cannot keep up with 5k msgs/s: report what arrived.
				b.ReportMetric(float64(len(lat)), "received")
				pct := func(ds []time.Duration, p int) float64 {
					slices.Sort(ds)
					return float64(ds[len(ds)*p/100].Microseconds()) / 1000
				}
				b.ReportMetric(pct(lat, 50), "p50-ms")
				b.ReportMetric(pct(lat, 99), "p99-ms")
				b.ReportMetric(pct(srv, 50), "srv-p50-ms")
				b.ReportMetric(pct(srv, 99), "srv-p99-ms")
				b.ReportMetric(pct(rpc, 50), "rpc-p50-ms")
				b.ReportMetric(pct(rpc, 99), "rpc-p99-ms")
				b.ReportMetric(pct(held, 50), "held-p50-ms")
				mu.Unlock()
			}
		})
	}
}

// BenchmarkLeasedRSS: the proxy's resident memory with 100k messages
// leased by one stream. The embedded KubeMQ runs in a child process (this
// test binary, TestHelperKubeMQ), so the figure is the proxy's plus a raw
// client's that keeps nothing; base-RSS is the same process before the
// stream, leased-MiB the difference.
func BenchmarkLeasedRSS(b *testing.B) {
	const n = 100_000
	addr := startKubeMQChild(b)
	e := startEnv(b, withKubeMQ(addr), withGCP(func(o *gcp.Options) { o.Config.MaxInflightPerSubscription = 2 * n }))
	c := benchClient(b, e.addr, e.project)
	topicID, subID := benchTopology(b, c, e.project)
	publishAll(b, c, topicID, n)
	b.ResetTimer()
	for range b.N {
		runtime.GC()
		debug.FreeOSMemory()
		base := rssBytes()
		ctx, cancel := context.WithCancel(context.Background())
		stream, err := rawSubscriber(b, e).StreamingPull(ctx)
		if err != nil {
			b.Fatal(err)
		}
		stream.Send(&pubsubpb.StreamingPullRequest{Subscription: "projects/" + e.project + "/subscriptions/" + subID,
			StreamAckDeadlineSeconds: 600, MaxOutstandingMessages: 2 * n})
		got := 0
		for got < n {
			resp, err := stream.Recv()
			if err != nil {
				b.Fatal(err)
			}
			got += len(resp.ReceivedMessages)
		}
		runtime.GC()
		rss := rssBytes()
		// What the runtime's scavenger leaves resident once it has returned the freed pages
		// (it does so in the background within minutes; FreeOSMemory at once).
		debug.FreeOSMemory()
		settled := rssBytes()
		if fn := os.Getenv("BENCH_HEAPPROFILE"); fn != "" {
			if f, err := os.Create(fn); err == nil {
				pprof.WriteHeapProfile(f)
				f.Close()
			}
		}
		b.ReportMetric(float64(rss)/(1<<20), "RSS-MiB")
		b.ReportMetric(float64(base)/(1<<20), "base-RSS-MiB")
		b.ReportMetric(float64(rss-base)/(1<<20), "leased-MiB")
		b.ReportMetric(float64(settled)/(1<<20), "settled-RSS-MiB")
		b.ReportMetric(float64(settled-base)/float64(n), "settled-bytes/msg")
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		b.ReportMetric(float64(ms.HeapInuse)/(1<<20), "heap-MiB")
		cancel()
	}
}

// TestHelperKubeMQ is the child process of BenchmarkLeasedRSS: an embedded
// KubeMQ on a data dir, serving until its stdin closes.
func TestHelperKubeMQ(t *testing.T) {
	dir := os.Getenv("GCP_HELPER_KUBEMQ_DIR")
	if dir == "" {
		t.Skip("helper process for BenchmarkLeasedRSS")
	}
	srv, err := embedded.New(embedded.Options{DataDir: dir, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	fmt.Println("ADDR", lis.Addr().String())
	io.Copy(io.Discard, os.Stdin)
	srv.Close()
}

func startKubeMQChild(b *testing.B) string {
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperKubeMQ$", "-test.count=1")
	cmd.Env = append(os.Environ(), "GCP_HELPER_KUBEMQ_DIR="+b.TempDir())
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { stdin.Close(); cmd.Wait() })
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if addr, ok := strings.CutPrefix(sc.Text(), "ADDR "); ok {
			go io.Copy(io.Discard, out)
			return addr
		}
	}
	b.Fatal("the KubeMQ child process did not start")
	return ""
}

// profileProxy writes a CPU profile ($BENCH_CPUPROFILE) or an execution
// trace ($BENCH_TRACE) of the measured phase of a proxy benchmark only
// (go test's own -cpuprofile also covers the setup, e.g. filling a
// backlog). The returned function stops it.
func profileProxy(b *testing.B, target string) (stop func()) {
	if target != "proxy" && os.Getenv("BENCH_PROFILE_ALL") == "" {
		return func() {}
	}
	if fn := os.Getenv("BENCH_CPUPROFILE"); fn != "" {
		f, err := os.Create(fn)
		if err != nil {
			b.Fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			b.Fatal(err)
		}
		return func() { pprof.StopCPUProfile(); f.Close() }
	}
	if fn := os.Getenv("BENCH_TRACE"); fn != "" {
		f, err := os.Create(fn)
		if err != nil {
			b.Fatal(err)
		}
		if err := trace.Start(f); err != nil {
			b.Fatal(err)
		}
		return func() { trace.Stop(); f.Close() }
	}
	return func() {}
}

// cpuTime is the process's user plus system CPU time: the whole test
// process (client, server and, for the proxy, the embedded KubeMQ) is
// measured, which on a shared machine varies less than wall time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func rssBytes() int64 {
	raw, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

// BenchmarkOrderedHotKey: receive+ack of a stored backlog whose messages
// all share one ordering key, through Receive with ordering enabled: the
// throughput one hot key gets. Delivery order is checked. $BENCH_KEYS=k
// spreads k times the backlog over k keys.
func BenchmarkOrderedHotKey(b *testing.B) {
	keys := 1
	if v, _ := strconv.Atoi(os.Getenv("BENCH_KEYS")); v > 0 {
		keys = v // the same backlog spread over that many keys
	}
	for _, tg := range benchTargets {
		b.Run(tg.name, func(b *testing.B) {
			n := tg.hotKey * keys
			addr, project := tg.start(b)
			c := benchClient(b, addr, project)
			ctx := context.Background()
			topicID, subID := "bench-"+randSuffix(), "bench-sub-"+randSuffix()
			if _, err := c.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: "projects/" + project + "/topics/" + topicID}); err != nil {
				b.Fatal(err)
			}
			if _, err := c.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{
				Name: "projects/" + project + "/subscriptions/" + subID, Topic: "projects/" + project + "/topics/" + topicID,
				EnableMessageOrdering: true,
			}); err != nil {
				b.Fatal(err)
			}
			p := c.Publisher(topicID)
			p.EnableMessageOrdering = true
			rs := make([]*pubsub.PublishResult, n)
			for i := range n {
				rs[i] = p.Publish(ctx, &pubsub.Message{Data: kib, OrderingKey: "hot" + strconv.Itoa(i%keys), Attributes: map[string]string{"i": strconv.Itoa(i / keys)}})
			}
			for _, r := range rs {
				if _, err := r.Get(ctx); err != nil {
					b.Fatal(err)
				}
			}
			p.Stop()
			b.ResetTimer()
			var d time.Duration
			cpu := cpuTime()
			for range b.N {
				var mu sync.Mutex
				next := map[string]int{}
				outOfOrder, done := 0, 0
				rctx, cancel := context.WithCancel(ctx)
				start := time.Now()
				err := c.Subscriber(subID).Receive(rctx, func(_ context.Context, m *pubsub.Message) {
					i, _ := strconv.Atoi(m.Attributes["i"])
					m.Ack()
					mu.Lock()
					defer mu.Unlock()
					switch k := m.OrderingKey; {
					case i == next[k]:
						if next[k]++; next[k] == n/keys {
							if done++; done == keys {
								cancel()
							}
						}
					case i > next[k]:
						outOfOrder++
					}
				})
				d = time.Since(start)
				cancel()
				if err != nil {
					b.Fatal(err)
				}
				if outOfOrder > 0 {
					b.Fatalf("%d messages ahead of their turn", outOfOrder)
				}
			}
			b.ReportMetric(float64(n)/d.Seconds(), "msgs/s")
			b.ReportMetric(float64((cpuTime()-cpu).Microseconds())/float64(n*b.N), "cpu-us/msg")
			b.ReportMetric(float64(n), "messages")
		})
	}
}

// BenchmarkSeekReplay: Seek of a subscription to a time before its whole
// backlog (50k messages published, none consumed): the proxy empties the
// queue and enqueues the backlog again from the topic log. Reports the
// messages made deliverable again per second of the Seek call.
// $BENCH_SEEK_N changes the size. The proxy only: pstest (v2.9.0) re-adds
// the messages of a Seek to a past time without their content, and its
// next maintenance pass dereferences the missing message and crashes the
// process.
func BenchmarkSeekReplay(b *testing.B) {
	n := 50_000
	if v, _ := strconv.Atoi(os.Getenv("BENCH_SEEK_N")); v > 0 {
		n = v
	}
	for _, tg := range benchTargets[:1] {
		b.Run(tg.name, func(b *testing.B) {
			addr, project := tg.start(b)
			c := benchClient(b, addr, project)
			topicID, subID := benchTopology(b, c, project)
			before := time.Now()
			publishAll(b, c, topicID, n)
			b.ResetTimer()
			var d time.Duration
			for range b.N {
				start := time.Now()
				if _, err := c.SubscriptionAdminClient.Seek(context.Background(), &pubsubpb.SeekRequest{
					Subscription: "projects/" + project + "/subscriptions/" + subID,
					Target:       &pubsubpb.SeekRequest_Time{Time: timestamppb.New(before)},
				}); err != nil {
					b.Fatal(err)
				}
				d = time.Since(start)
			}
			b.ReportMetric(float64(n)/d.Seconds(), "msgs/s")
			b.ReportMetric(float64(d.Milliseconds()), "seek-ms")
		})
	}
}
