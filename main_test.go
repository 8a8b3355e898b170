package main

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"github.com/spf13/pflag"
	"github.com/spf13/viper"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kubemq-io/kubemq-proxy/proxy"
)

func TestConfigYAMLMatchesDefaults(t *testing.T) {
	// config.yaml documents every key with its default: loading it must give
	// exactly Defaults(), and every leaf key must appear in it.
	cfg, err := loadConfig([]string{"--config", "config.yaml"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	def := proxy.Defaults()
	def.AMQP.Users = map[string]string{}
	if cfg.AMQP.Users == nil {
		cfg.AMQP.Users = map[string]string{}
	}
	if !equalConfig(cfg, def) {
		t.Fatalf("config.yaml differs from Defaults():\n%+v\n%+v", cfg, def)
	}
}

func equalConfig(a, b proxy.Config) bool {
	return reflect.DeepEqual(a, b)
}

func TestPrecedence(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "c.yaml")
	os.WriteFile(file, []byte("gcp:\n  listen: \":1111\"\nkubemq:\n  address: \"file:1\"\nlog:\n  level: warn\n"), 0o644)
	cfg, err := loadConfig(
		[]string{"--config", file, "--kubemq.address", "flag:3"},
		[]string{"KUBEMQ_PROXY_KUBEMQ_ADDRESS=env:2", "KUBEMQ_PROXY_AMQP_TLS_LISTEN=:7777", "KUBEMQ_PROXY_AMQP_HEARTBEAT=5s", "OTHER=x"},
	)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.GCP.Listen != ":1111" || cfg.KubeMQ.Address != "flag:3" || cfg.AMQP.TLSListen != ":7777" ||
		cfg.AMQP.Heartbeat != 5*time.Second || cfg.Log.Level != "warn" || cfg.HTTP.Listen != ":9102" {
		t.Fatalf("unexpected config %+v", cfg)
	}
	cfg, err = loadConfig([]string{"--config", file}, []string{"KUBEMQ_PROXY_KUBEMQ_ADDRESS=env:2"})
	if err != nil || cfg.KubeMQ.Address != "env:2" {
		t.Fatalf("env did not override file: %v %+v", err, cfg.KubeMQ)
	}
}

func TestBadConfigIsOneLine(t *testing.T) {
	dir := t.TempDir()
	typo := filepath.Join(dir, "typo.yaml")
	os.WriteFile(typo, []byte("gcp:\n  lisen: \":1\"\n"), 0o644)
	cases := map[string]struct {
		args []string
		env  []string
	}{
		"bad flag value":   {args: []string{"--amqp.frame_max", "12"}},
		"unknown flag":     {args: []string{"--nope"}},
		"bad duration":     {env: []string{"KUBEMQ_PROXY_AMQP_HEARTBEAT=soon"}},
		"unknown env key":  {env: []string{"KUBEMQ_PROXY_GCP_LISTN=:1"}},
		"unknown file key": {args: []string{"--config", typo}},
		"bad address":      {args: []string{"--kubemq.address", "nohost"}},
	}
	for name, c := range cases {
		if _, err := loadConfig(c.args, c.env); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestExitCode2 runs the real binary's main with bad settings: one error
// line naming the key, exit code 2.
func TestExitCode2(t *testing.T) {
	cases := map[string]struct {
		args []string
		key  string
	}{
		"bad value": {[]string{"--log.level", "loud"}, "log.level"},
		// The embedded server's TLS is for the backend-only mode.
		"embedded tls in proxy mode": {[]string{"--embedded.tls_cert_file", "main_test.go", "--embedded.tls_key_file", "main_test.go"}, "embedded.tls_cert_file"},
		"embedded tls half set":      {[]string{"embedded", "--embedded.tls_cert_file", "main_test.go"}, "embedded.tls_cert_file"},
		// Found only when the process starts: a data dir it cannot create, an address in use.
		"unusable data dir, embedded mode": {[]string{"embedded", "--log.level", "error", "--embedded.listen", "127.0.0.1:0", "--http.listen", "127.0.0.1:0",
			"--embedded.data_dir", "main_test.go/data"}, "embedded.data_dir"},
		"unusable data dir": {[]string{"--log.level", "error", "--embedded.listen", "127.0.0.1:0", "--http.listen", "127.0.0.1:0", "--gcp.listen", "127.0.0.1:0",
			"--amqp.listen", "127.0.0.1:0", "--amqp.tls_listen", "", "--amqp.management_listen", "127.0.0.1:0", "--embedded.data_dir", "main_test.go/data"}, "embedded.data_dir"},
		"listen address in use": {[]string{"--log.level", "error", "--embedded.listen", "127.0.0.1:0", "--http.listen", "127.0.0.1:0",
			"--amqp.listen", "127.0.0.1:0", "--amqp.tls_listen", "", "--amqp.management_listen", "127.0.0.1:0", "--gcp.listen", "BUSY"}, "gcp.listen"},
	}
	if name := os.Getenv("KMQP_TEST_MAIN"); name != "" {
		args := cases[name].args
		for i, a := range args {
			if a == "BUSY" {
				args[i] = os.Getenv("KMQP_TEST_BUSY")
			}
		}
		os.Args = append([]string{"kubemq-proxy"}, args...)
		main()
		return
	}
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	for name, c := range cases {
		cmd := exec.Command(os.Args[0], "-test.run=^TestExitCode2$")
		cmd.Env = append(os.Environ(), "KMQP_TEST_MAIN="+name, "KMQP_TEST_BUSY="+busy.Addr().String())
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 {
			t.Fatalf("%s: exit: %v, output %q", name, err, out)
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		if len(lines) != 1 || !strings.Contains(lines[0], c.key) {
			t.Fatalf("%s: want one error line naming %s, got %q", name, c.key, out)
		}
	}
}

func TestSetMemoryLimitFromContainer(t *testing.T) {
	if os.Getenv("GOMEMLIMIT") != "" || os.Getenv("AUTOMEMLIMIT") != "" {
		t.Skip("GOMEMLIMIT or AUTOMEMLIMIT set in the environment")
	}
	prev := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(prev) })
	core, logs := observer.New(zap.InfoLevel)
	setMemoryLimit(zap.New(core), memlimit.Limit(1<<30))
	if got, want := debug.SetMemoryLimit(-1), int64(966367641); got != want {
		t.Fatalf("GOMEMLIMIT %d, want 90%% of a 1 GiB container limit (%d)", got, want)
	}
	e := logs.FilterMessage("go memory limit").All()
	if len(e) != 1 || e[0].ContextMap()["gomemlimit_bytes"] != int64(966367641) || e[0].ContextMap()["source"] != "cgroup" {
		t.Fatalf("log %+v", e)
	}

	// No container limit: the runtime's limit is left as it was, and the log says so.
	debug.SetMemoryLimit(prev)
	core, logs = observer.New(zap.InfoLevel)
	setMemoryLimit(zap.New(core), func() (uint64, error) { return 0, errors.New("no cgroup here") })
	if got := debug.SetMemoryLimit(-1); got != prev {
		t.Fatalf("GOMEMLIMIT changed to %d without a container limit", got)
	}
	if logs.FilterMessage("go memory limit").Len() != 1 {
		t.Fatalf("no log of the limit: %+v", logs.All())
	}

	// GOMEMLIMIT set: kept.
	t.Setenv("GOMEMLIMIT", "123MiB")
	core, logs = observer.New(zap.InfoLevel)
	setMemoryLimit(zap.New(core), memlimit.Limit(1<<30))
	if got := debug.SetMemoryLimit(-1); got != prev {
		t.Fatalf("GOMEMLIMIT overridden although set: %d", got)
	}
	if e := logs.FilterMessage("go memory limit").All(); len(e) != 1 || e[0].ContextMap()["source"] != "GOMEMLIMIT" {
		t.Fatalf("log %+v", e)
	}
}

// Every flag has a description (taken from the comment above its key in config.yaml), and
// --version and --help are answered without starting anything.
func TestFlagHelp(t *testing.T) {
	def := proxy.Defaults()
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	if err := addFlags(fs, viper.New(), "", reflect.ValueOf(def)); err != nil {
		t.Fatal(err)
	}
	describeFlags(fs)
	n := 0
	fs.VisitAll(func(f *pflag.Flag) {
		n++
		if strings.TrimSpace(f.Usage) == "" {
			t.Errorf("flag --%s has no description: document its key in config.yaml", f.Name)
		}
	})
	if n < 40 {
		t.Fatalf("only %d flags", n)
	}
	if h := keyHelp(configYAML)["gcp.listen"]; !strings.Contains(h, "Pub/Sub") {
		t.Errorf("gcp.listen help = %q", h)
	}
	if _, err := loadConfig([]string{"--version"}, nil); !errors.Is(err, errVersion) {
		t.Errorf("--version: %v", err)
	}
	if _, err := loadConfig([]string{"--gcp.listen", "nothost:abc"}, nil); err == nil || !strings.Contains(err.Error(), "gcp.listen") {
		t.Errorf("a listen address with a named port: %v", err)
	}
	if v := version(); !strings.HasPrefix(v, "kubemq-proxy ") {
		t.Errorf("version() = %q", v)
	}
}
