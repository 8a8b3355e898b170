package amqp091

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/kubemq-io/kubemq-proxy/internal/proctest"
)

// Benchmarks of the issue, proxy (embedded KubeMQ) next to RabbitMQ when
// Debian's rabbitmq-server is installed, same client, same run, 1 KiB
// bodies. One command:
//
//	go test -run '^$' -bench . -benchtime 20000x ./amqp091/
//
// KUBEMQ_ADDRESS puts the proxy on that KubeMQ; BENCH_DURABLE=1 makes queues durable and
// messages persistent on both brokers. BenchmarkCelery runs tasks, not messages: give it its
// own -benchtime (200x). Each reports msg/s (deliveries/s for the topic row as well).

const benchBody = 1024

// benchDurable (BENCH_DURABLE=1): durable queues and persistent messages on both brokers
// (RabbitMQ then writes every message to disk before confirming it).
var benchDurable = os.Getenv("BENCH_DURABLE") == "1"

func benchPublishing(body []byte) amqp.Publishing {
	p := amqp.Publishing{Body: body}
	if benchDurable {
		p.DeliveryMode = amqp.Persistent
	}
	return p
}

type benchTarget struct {
	name string
	url  string
}

func benchTargets(b *testing.B) []benchTarget {
	e := newEnv(b)
	ts := []benchTarget{{"proxy", e.url()}}
	if u, err := rabbitURL(); err != nil {
		b.Logf("RabbitMQ not benchmarked: %v", err)
	} else {
		ts = append(ts, benchTarget{"rabbitmq", u})
	}
	return ts
}

func benchDial(b *testing.B, url string) (*amqp.Connection, *amqp.Channel) {
	b.Helper()
	c, err := amqp.Dial(url)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	ch, err := c.Channel()
	if err != nil {
		b.Fatal(err)
	}
	return c, ch
}

func benchQueue(b *testing.B, ch *amqp.Channel, name string) string {
	b.Helper()
	name = name + "-" + randHex(3)
	if _, err := ch.QueueDeclare(name, benchDurable, false, false, false, nil); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ch.QueueDelete(name, false, false, false) })
	return name
}

// waitDepth waits until q holds n messages.
func waitDepth(b *testing.B, ch *amqp.Channel, q string, n int) {
	b.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		st, err := ch.QueueDeclarePassive(q, false, false, false, false, nil)
		if err != nil {
			b.Fatal(err)
		}
		if st.Messages >= n {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("queue %s holds %d of %d messages", q, st.Messages, n)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func report(b *testing.B, start time.Time, n int, unit string) {
	b.ReportMetric(float64(n)/time.Since(start).Seconds(), unit)
}

// reportMemory reports the memory after a run against target: for the proxy the test process's
// Go heap in use and RSS (the proxy, the embedded KubeMQ and the clients together), for RabbitMQ
// its node's RSS.
func reportMemory(b *testing.B, target string) {
	if target == "proxy" {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		b.ReportMetric(float64(ms.HeapInuse)/(1<<20), "heap-MiB")
		b.ReportMetric(rssMiB(os.Getpid()), "rss-MiB")
	} else if rabbitPID != 0 {
		b.ReportMetric(groupRSSMiB(rabbitPID), "rss-MiB")
	}
}

// fill publishes n messages to q with confirms (untimed setup).
func fill(b *testing.B, ch *amqp.Channel, q string, n int) {
	b.Helper()
	if err := ch.Confirm(false); err != nil {
		b.Fatal(err)
	}
	body := make([]byte, benchBody)
	var last *amqp.DeferredConfirmation
	for i := range n {
		dc, err := ch.PublishWithDeferredConfirm("", q, false, false, benchPublishing(body))
		if err != nil {
			b.Fatal(err)
		}
		last = dc
		if i%1000 == 999 {
			last.Wait()
		}
	}
	if last != nil {
		last.Wait()
	}
}

// BenchmarkPublish: publish without confirms, until every message is stored.
func BenchmarkPublish(b *testing.B) {
	for _, tg := range benchTargets(b) {
		b.Run(tg.name, func(b *testing.B) {
			_, ch := benchDial(b, tg.url)
			_, admin := benchDial(b, tg.url)
			q := benchQueue(b, admin, "bench-pub")
			body := make([]byte, benchBody)
			b.ResetTimer()
			start := time.Now()
			for range b.N {
				if err := ch.Publish("", q, false, false, benchPublishing(body)); err != nil {
					b.Fatal(err)
				}
			}
			waitDepth(b, admin, q, b.N)
			b.StopTimer()
			report(b, start, b.N, "msg/s")
		})
	}
}

// BenchmarkPublishConfirms: publisher confirms with a window of 1000.
func BenchmarkPublishConfirms(b *testing.B) {
	for _, tg := range benchTargets(b) {
		b.Run(tg.name, func(b *testing.B) {
			_, ch := benchDial(b, tg.url)
			benchPublishConfirmed(b, ch, benchQueue(b, ch, "bench-conf"))
		})
	}
}

// benchPublishConfirmed publishes b.N messages of benchBody bytes to q
// with confirms, 1000 in flight, and reports msg/s; a nack fails b.
func benchPublishConfirmed(b *testing.B, ch *amqp.Channel, q string) {
	if err := ch.Confirm(false); err != nil {
		b.Fatal(err)
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 1000))
	body := make([]byte, benchBody)
	b.ResetTimer()
	start := time.Now()
	out, confirmed := 0, 0
	wait := func() {
		c := mustRecv(b, confirms, "confirm")
		if !c.Ack {
			b.Fatal("nack")
		}
		out--
		confirmed++
	}
	for range b.N {
		for out >= 1000 {
			wait()
		}
		if err := ch.Publish("", q, false, false, benchPublishing(body)); err != nil {
			b.Fatal(err)
		}
		out++
	}
	for confirmed < b.N {
		wait()
	}
	b.StopTimer()
	report(b, start, b.N, "msg/s")
}

// BenchmarkConsume: consume a filled queue with prefetch 100 (the issue's
// row; prefetch 1 for information), acking each.
func BenchmarkConsume(b *testing.B) {
	for _, prefetch := range []int{100, 1} {
		for _, tg := range benchTargets(b) {
			b.Run(fmt.Sprintf("%s/prefetch=%d", tg.name, prefetch), func(b *testing.B) { benchConsume(b, tg, prefetch) })
		}
	}
}

func benchConsume(b *testing.B, tg benchTarget, prefetch int) {
	_, pch := benchDial(b, tg.url)
	q := benchQueue(b, pch, "bench-cons")
	fill(b, pch, q, b.N)
	_, ch := benchDial(b, tg.url)
	if err := ch.Qos(prefetch, 0, false); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	start := time.Now()
	msgs, err := ch.Consume(q, "", false, false, false, false, nil)
	if err != nil {
		b.Fatal(err)
	}
	for range b.N {
		d := mustRecv(b, msgs, "delivery")
		if err := d.Ack(false); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	report(b, start, b.N, "msg/s")
}

// BenchmarkTopicFanout: one topic exchange routing every publish to 10
// queues, each with its own consumer (prefetch 100, acking each).
func BenchmarkTopicFanout(b *testing.B) {
	const queues = 10
	for _, tg := range benchTargets(b) {
		b.Run(tg.name, func(b *testing.B) {
			_, pch := benchDial(b, tg.url)
			x := "bench-topic-" + randHex(3)
			if err := pch.ExchangeDeclare(x, "topic", false, true, false, false, nil); err != nil {
				b.Fatal(err)
			}
			var wg sync.WaitGroup
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			for range queues {
				conn, ch := benchDial(b, tg.url)
				_ = conn
				q := benchQueue(b, ch, "bench-topic-q")
				if err := ch.QueueBind(q, "bench.#", x, false, nil); err != nil {
					b.Fatal(err)
				}
				if err := ch.Qos(100, 0, false); err != nil {
					b.Fatal(err)
				}
				msgs, err := ch.Consume(q, "", false, false, false, false, nil)
				if err != nil {
					b.Fatal(err)
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range b.N {
						select {
						case d := <-msgs:
							d.Ack(false)
						case <-ctx.Done():
							return
						}
					}
				}()
			}
			body := make([]byte, benchBody)
			b.ResetTimer()
			start := time.Now()
			for i := range b.N {
				if err := pch.Publish(x, "bench.key."+strconv.Itoa(i%7), false, false, benchPublishing(body)); err != nil {
					b.Fatal(err)
				}
			}
			wg.Wait()
			b.StopTimer()
			if ctx.Err() != nil {
				b.Fatal("deliveries timed out")
			}
			report(b, start, b.N, "publish/s")
			report(b, start, b.N*queues, "deliveries/s")
		})
	}
}

// BenchmarkCelery: a Celery 5 worker (Debian's python3-celery; acks_late,
// prefetch multiplier 1, solo pool) runs b.N tasks sent before it starts,
// without a result backend and with rpc:// results (the client then waits
// for each result through the broker), and without a result backend with
// kombu's event-loop sleep patched out (celery_roundtrip.py --patch-kombu:
// the unpatched worker sleeps up to its next 2 s timer on some tasks, more
// often the faster the broker answers an ack; the proxy's post-delivery
// heartbeat wakes it). tasks/s is the steady state, from
// the first task run to the last; run-s is the whole run with the worker's
// start-up. Memory after the run: the proxy's Go heap in use and this
// process's RSS (proxy, embedded KubeMQ and the test together), RabbitMQ's
// node RSS. One short run is enough:
//
//	go test -run '^$' -bench Celery -benchtime 400x ./amqp091/
func BenchmarkCelery(b *testing.B) {
	py := pythonWithCelery(b)
	for _, mode := range []string{"no-backend", "rpc", "patched-kombu"} {
		for _, tg := range benchTargets(b) {
			b.Run(tg.name+"/"+mode, func(b *testing.B) {
				args := []string{"celery_roundtrip.py", "-n", strconv.Itoa(b.N), "-t", "600"}
				switch mode {
				case "rpc":
					args = append(args, "--rpc")
				case "patched-kombu":
					args = append(args, "--patch-kombu")
				}
				cmd := exec.Command(py, append(args, tg.url)...)
				dir, err := filepath.Abs(filepath.Join("..", "test", "amqp-clients"))
				if err != nil {
					b.Fatal(err)
				}
				cmd.Dir = dir
				b.ResetTimer()
				out, err := cmd.CombinedOutput()
				b.StopTimer()
				var n int
				var total, first, last float64
				for _, line := range strings.Split(string(out), "\n") {
					if _, perr := fmt.Sscanf(line, "OK tasks=%d total=%g first=%g last=%g", &n, &total, &first, &last); perr == nil {
						break
					}
				}
				if err != nil || n == 0 {
					b.Fatalf("%v\n%s", err, out)
				}
				if last > first {
					b.ReportMetric(float64(n-1)/(last-first), "tasks/s")
				}
				b.ReportMetric(total, "run-s")
				reportMemory(b, tg.name)
			})
		}
	}
}

// groupRSSMiB is the largest RSS among the processes of process group pgid
// (RabbitMQ's node runs under the script the test starts as a group).
func groupRSSMiB(pgid int) float64 {
	ents, _ := os.ReadDir("/proc")
	best := 0.0
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if g, err := syscall.Getpgid(pid); err == nil && g == pgid {
			best = max(best, rssMiB(pid))
		}
	}
	return best
}

// rssMiB reads a process's resident set size from /proc (0 when unknown).
func rssMiB(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			var kb float64
			fmt.Sscanf(strings.TrimSpace(rest), "%g", &kb)
			return kb / 1024
		}
	}
	return 0
}

// --- RabbitMQ for comparison ---

var (
	rabbitOnce sync.Once
	rabbitAddr string
	rabbitErr  error
	rabbitStop func()
	rabbitEnvs []string // environment of the node, for rabbitmqctl
	rabbitNode string
	rabbitPID  int // the node's process (the script execs the Erlang VM)
	// rabbitMgmt is the node's management API (host:port): the management plugin is enabled
	// with statistics collected every 500 ms.
	rabbitMgmt string
)

// rabbitctl runs rabbitmqctl against the test node.
func rabbitctl(args ...string) error {
	cmd := exec.Command("/usr/lib/rabbitmq/bin/rabbitmqctl", append([]string{"-n", rabbitNode}, args...)...)
	cmd.Env = rabbitEnvs
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("rabbitmqctl %v: %v\n%s", args, err, out)
	}
	return nil
}

// rabbitURL starts Debian's rabbitmq-server once per test binary on free
// loopback ports, in a temporary directory of its own (node name, mnesia,
// logs, cookie, epmd port), and returns its URL.
func rabbitURL() (string, error) {
	rabbitOnce.Do(func() { rabbitAddr, rabbitErr = startRabbit() })
	if rabbitErr != nil {
		return "", rabbitErr
	}
	return "amqp://guest:guest@" + rabbitAddr + "/", nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func startRabbit() (string, error) {
	const server = "/usr/sbin/rabbitmq-server"
	if _, err := os.Stat(server); err != nil {
		return "", fmt.Errorf("%s not installed", server)
	}
	dir, err := os.MkdirTemp("", "amqp091-rabbit-")
	if err != nil {
		return "", err
	}
	// Debian's script drops to the rabbitmq user when run as root: it must
	// be able to write here.
	os.Chmod(dir, 0o777)
	for _, sub := range []string{"mnesia", "log"} {
		os.Mkdir(filepath.Join(dir, sub), 0o777)
		os.Chmod(filepath.Join(dir, sub), 0o777)
	}
	var ports [4]int
	for i := range ports {
		if ports[i], err = freePort(); err != nil {
			return "", err
		}
	}
	name := "bench" + randHex(3)
	conf := filepath.Join(dir, "rabbitmq.conf")
	os.WriteFile(conf, []byte("listeners.tcp.1 = 127.0.0.1:"+strconv.Itoa(ports[0])+"\nloopback_users = none\n"+
		"management.tcp.ip = 127.0.0.1\nmanagement.tcp.port = "+strconv.Itoa(ports[3])+"\ncollect_statistics_interval = 500\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "enabled_plugins"), []byte("[rabbitmq_management].\n"), 0o644)
	rabbitMgmt = "127.0.0.1:" + strconv.Itoa(ports[3])
	// epmd runs as our own child on its own port, so stopping is exact.
	epmd := exec.Command("epmd", "-port", strconv.Itoa(ports[2]))
	epmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := epmd.Start(); err != nil {
		return "", fmt.Errorf("epmd: %w", err)
	}
	// The script behind /usr/sbin/rabbitmq-server, run directly (not through
	// su) in a process group of its own.
	cmd := exec.Command("/usr/lib/rabbitmq/bin/rabbitmq-server")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"HOME="+dir,
		"RABBITMQ_NODENAME="+name+"@localhost",
		"RABBITMQ_NODE_IP_ADDRESS=127.0.0.1",
		"RABBITMQ_NODE_PORT="+strconv.Itoa(ports[0]),
		"RABBITMQ_DIST_PORT="+strconv.Itoa(ports[1]),
		"ERL_EPMD_PORT="+strconv.Itoa(ports[2]),
		"RABBITMQ_MNESIA_BASE="+filepath.Join(dir, "mnesia"),
		"RABBITMQ_LOG_BASE="+filepath.Join(dir, "log"),
		"RABBITMQ_CONFIG_FILE="+strings.TrimSuffix(conf, ".conf"),
		"RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(dir, "enabled_plugins"),
		"RABBITMQ_PID_FILE="+filepath.Join(dir, "pid"),
	)
	rabbitEnvs, rabbitNode = cmd.Env, name+"@localhost"
	logf, _ := os.Create(filepath.Join(dir, "stdout.log"))
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		epmd.Process.Kill()
		epmd.Wait()
		return "", err
	}
	rabbitPID = cmd.Process.Pid
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	rabbitStop = func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
		syscall.Kill(-epmd.Process.Pid, syscall.SIGKILL)
		epmd.Wait()
		os.RemoveAll(dir)
	}
	addr := "127.0.0.1:" + strconv.Itoa(ports[0])
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			out, _ := os.ReadFile(filepath.Join(dir, "stdout.log"))
			exited <- err
			return "", fmt.Errorf("rabbitmq-server exited: %v\n%s", err, out)
		default:
		}
		if c, err := amqp.Dial("amqp://guest:guest@" + addr + "/"); err == nil {
			c.Close()
			return addr, nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	rabbitStop()
	return "", fmt.Errorf("rabbitmq-server did not start within 90s")
}

func TestMain(m *testing.M) {
	disarm := proctest.Watchdog()
	code := m.Run()
	disarm()
	if rabbitStop != nil {
		rabbitStop()
	}
	os.Exit(code)
}
