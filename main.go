// Command kubemq-proxy serves Google Cloud Pub/Sub v1 (gRPC) and AMQP 0-9-1
// clients and stores every message in KubeMQ: an external server, or an
// embedded KubeMQ-compatible one when kubemq.address is empty.
package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/signal"
	"reflect"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"github.com/go-viper/mapstructure/v2"
	"github.com/spf13/pflag"
	"github.com/spf13/viper"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/kubemq-io/kubemq-proxy/embedded"
	"github.com/kubemq-io/kubemq-proxy/internal/memreclaim"
	"github.com/kubemq-io/kubemq-proxy/proxy"
)

// exitConfig is the exit code for a bad configuration.
const exitConfig = 2

// errVersion: --version was given.
var errVersion = errors.New("version asked for")

func main() {
	args := os.Args[1:]
	mode := "proxy"
	if len(args) > 0 && (args[0] == "embedded" || args[0] == "healthcheck") {
		// "kubemq-proxy embedded": only the embedded KubeMQ-compatible
		// server, so the proxy and its backend can run (and fail) apart.
		// "kubemq-proxy healthcheck": exit 0 when the local proxy's /readyz
		// answers 200 (for container health checks without curl).
		mode, args = args[0], args[1:]
	}
	cfg, err := loadConfig(args, os.Environ())
	if err == nil && mode == "proxy" && cfg.Embedded.TLSCertFile != "" {
		err = errors.New("embedded.tls_cert_file and embedded.tls_key_file apply to `kubemq-proxy embedded` only (the proxy reaches an in-process embedded server through memory)")
	}
	if err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			os.Exit(0)
		}
		if errors.Is(err, errVersion) {
			fmt.Println(version())
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "kubemq-proxy: config:", err)
		os.Exit(exitConfig)
	}
	log, level, err := newLogger(cfg.Log)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kubemq-proxy: config:", err)
		os.Exit(exitConfig)
	}
	defer log.Sync()
	setMemoryLimit(log, memlimit.FromCgroup)
	if mode != "healthcheck" {
		// A burst's garbage is collected once the process is quiet, not two minutes later.
		go memreclaim.Run(context.Background(), 10*time.Second, 32<<20)
	}
	runMode := func(cfg proxy.Config, log *zap.Logger) error { return run(cfg, log, level, args) }
	switch mode {
	case "embedded":
		runMode = runEmbedded
	case "healthcheck":
		runMode = runHealthcheck
	}
	if err := runMode(cfg, log); err != nil {
		var ce *proxy.ConfigError
		if errors.As(err, &ce) {
			log.Sync()
			fmt.Fprintln(os.Stderr, "kubemq-proxy: config:", ce)
			os.Exit(exitConfig)
		}
		log.Error("exiting", zap.Error(err))
		log.Sync()
		os.Exit(1)
	}
}

// setMemoryLimit sets the Go runtime's soft memory limit (GOMEMLIMIT) to 90% of the container's
// memory limit (cgroup v1 or v2) unless GOMEMLIMIT is set, so that the garbage collector works
// harder before the kernel kills the process rather than after; AUTOMEMLIMIT=off or a ratio
// (0,1] changes it. It logs the limit in force either way.
func setMemoryLimit(log *zap.Logger, provider memlimit.Provider) {
	limit, err := memlimit.Set(memlimit.WithProvider(provider))
	source := "cgroup"
	switch {
	case os.Getenv("GOMEMLIMIT") != "":
		source = "GOMEMLIMIT"
	case os.Getenv("AUTOMEMLIMIT") == "off":
		source = "AUTOMEMLIMIT=off"
	case err != nil:
		source = "none"
		log.Info("no container memory limit found; GOMEMLIMIT left unset", zap.String("reason", err.Error()))
		limit = debug.SetMemoryLimit(-1)
	}
	if limit == math.MaxInt64 {
		log.Info("go memory limit", zap.String("gomemlimit", "none"), zap.String("source", source))
		return
	}
	log.Info("go memory limit", zap.Int64("gomemlimit_bytes", limit), zap.String("gomemlimit", fmt.Sprintf("%.0f MiB", float64(limit)/(1<<20))), zap.String("source", source))
}

func run(cfg proxy.Config, log *zap.Logger, level zap.AtomicLevel, args []string) error {
	p, err := proxy.New(cfg, log)
	if err != nil {
		return err
	}
	p.SetLogLevel(level)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	if err := p.Start(ctx, frontends()); err != nil {
		return err
	}
	var runErr error
loop:
	for {
		select {
		case <-ctx.Done():
			log.Info("signal received; shutting down")
			break loop
		case runErr = <-p.Errors():
			log.Error("listener failed; shutting down", zap.Error(runErr))
			break loop
		case <-hup:
			reloadLogLevel(log, level, args)
		}
	}
	sctx, cancel := context.WithTimeout(context.Background(), cfg.Shutdown.Timeout)
	defer cancel()
	if err := p.Shutdown(sctx); err != nil {
		log.Warn("shutdown incomplete", zap.Error(err))
	}
	log.Info("stopped")
	return runErr
}

// reloadLogLevel re-reads the configuration on SIGHUP and applies
// log.level; every other key needs a restart.
func reloadLogLevel(log *zap.Logger, level zap.AtomicLevel, args []string) {
	cfg, err := loadConfig(args, os.Environ())
	if err != nil {
		log.Warn("SIGHUP: configuration not reloaded", zap.Error(err))
		return
	}
	var l zapcore.Level
	if err := l.UnmarshalText([]byte(cfg.Log.Level)); err != nil {
		log.Warn("SIGHUP: bad log.level", zap.Error(err))
		return
	}
	if l != level.Level() {
		log.Info("SIGHUP: log level changed", zap.Stringer("from", level.Level()), zap.Stringer("to", l))
		level.SetLevel(l)
	}
}

// runEmbedded serves the embedded KubeMQ-compatible server alone on
// embedded.listen, with the side port (/healthz, /readyz, /metrics) on
// http.listen, until SIGINT/SIGTERM.
func runEmbedded(cfg proxy.Config, log *zap.Logger) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	opts, err := cfg.EmbeddedOptions(log.Named("embedded"))
	if err != nil {
		return err
	}
	if cfg.Embedded.TLSCertFile != "" {
		cert, err := tls.LoadX509KeyPair(cfg.Embedded.TLSCertFile, cfg.Embedded.TLSKeyFile)
		if err != nil {
			return fmt.Errorf("embedded.tls_cert_file: %w", err)
		}
		opts.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	srv, err := embedded.New(opts)
	if err != nil {
		return err
	}
	lis, err := proxy.Listen("embedded.listen", cfg.Embedded.Listen)
	if err != nil {
		srv.Close()
		return err
	}
	log.Info("listening", zap.String("listener", "embedded-kubemq"), zap.String("address", lis.Addr().String()), zap.String("data_dir", cfg.Embedded.DataDir), zap.Bool("tls", opts.TLS != nil),
		zap.Int64("max_memory_bytes", opts.MaxMemory))
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lis) }()
	side, err := proxy.StartEmbeddedSidePort(cfg, srv, log)
	if err != nil {
		srv.Stop()
		<-errc
		return err
	}
	var runErr error
	select {
	case <-ctx.Done():
		log.Info("signal received; shutting down")
	case runErr = <-errc:
		errc <- runErr // for the wait below
	case runErr = <-side.Errors():
		runErr = fmt.Errorf("http: %w", runErr)
	}
	// Readiness off first, then the server; the side port answers until the end,
	// which shutdown.timeout bounds.
	side.BeginShutdown()
	sctx, cancel := context.WithTimeout(context.Background(), cfg.Shutdown.Timeout)
	defer cancel()
	stopped := make(chan struct{})
	go func() { srv.Stop(); <-errc; close(stopped) }()
	select {
	case <-stopped:
	case <-sctx.Done():
		log.Warn("shutdown deadline passed; giving up on the rest", zap.String("waiting_on", "embedded server (closing streams, flushing the store)"))
	}
	side.Close(sctx)
	log.Info("stopped")
	return runErr
}

// runHealthcheck asks the proxy on this host (http.listen) for /readyz.
func runHealthcheck(cfg proxy.Config, _ *zap.Logger) error {
	_, port, err := net.SplitHostPort(cfg.HTTP.Listen)
	if err != nil {
		return fmt.Errorf("http.listen: %w", err)
	}
	hc := http.Client{Timeout: 3 * time.Second}
	resp, err := hc.Get("http://" + net.JoinHostPort("127.0.0.1", port) + "/readyz")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("not ready: %s", strings.TrimSpace(string(body)))
	}
	return nil
}

// loadConfig merges, lowest first: defaults, the config file (--config, or
// ./config.yaml when present), KUBEMQ_PROXY_<KEY> environment variables
// (dots become underscores), and flags named after the keys.
func loadConfig(args, environ []string) (proxy.Config, error) {
	def := proxy.Defaults()
	v := viper.New()
	fs := pflag.NewFlagSet("kubemq-proxy", pflag.ContinueOnError)
	configFile := fs.String("config", "", "config file (default ./config.yaml when it exists)")
	showVersion := fs.Bool("version", false, "print the version and exit")
	if err := addFlags(fs, v, "", reflect.ValueOf(def)); err != nil {
		return def, err
	}
	describeFlags(fs)
	fs.Usage = func() { printUsage(os.Stdout, fs) }
	if err := fs.Parse(args); err != nil {
		return def, err
	}
	if *showVersion {
		return def, errVersion
	}
	if fs.NArg() > 0 {
		return def, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	switch {
	case *configFile != "":
		v.SetConfigFile(*configFile)
		if err := v.ReadInConfig(); err != nil {
			return def, fmt.Errorf("reading %s: %w", *configFile, err)
		}
	default:
		if _, err := os.Stat("config.yaml"); err == nil {
			v.SetConfigFile("config.yaml")
			if err := v.ReadInConfig(); err != nil {
				return def, fmt.Errorf("reading config.yaml: %w", err)
			}
		}
	}
	for _, kv := range environ {
		k, val, ok := strings.Cut(kv, "=")
		if !ok || !strings.HasPrefix(k, "KUBEMQ_PROXY_") {
			continue
		}
		key := envKey(v, strings.TrimPrefix(k, "KUBEMQ_PROXY_"))
		if key == "" {
			return def, fmt.Errorf("environment variable %s names no config key", k)
		}
		if !fs.Changed(key) {
			v.Set(key, val)
		}
	}
	cfg := def
	err := v.UnmarshalExact(&cfg, func(dc *mapstructure.DecoderConfig) {
		dc.DecodeHook = mapstructure.ComposeDecodeHookFunc(
			jsonStringToMap,
			mapstructure.StringToTimeDurationHookFunc(),
			mapstructure.StringToSliceHookFunc(","),
		)
	})
	if err != nil {
		return def, err
	}
	return cfg, cfg.Validate()
}

// jsonStringToMap decodes a map-valued key given as a string (an environment variable such as
// KUBEMQ_PROXY_AMQP_USERS='{"alice":"pw"}') as a JSON object.
func jsonStringToMap(from, to reflect.Type, data any) (any, error) {
	if from.Kind() != reflect.String || to.Kind() != reflect.Map {
		return data, nil
	}
	s := strings.TrimSpace(data.(string))
	if s == "" {
		return map[string]string{}, nil
	}
	m := map[string]string{}
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		return nil, fmt.Errorf("expected a JSON object of strings, e.g. {\"alice\":\"secret\"}: %v", err)
	}
	return m, nil
}

// envKey maps an environment suffix such as GCP_LISTEN or AMQP_TLS_LISTEN
// to the known key it names (keys themselves contain underscores).
func envKey(v *viper.Viper, suffix string) string {
	want := strings.ToLower(suffix)
	for _, k := range v.AllKeys() {
		if strings.ReplaceAll(k, ".", "_") == want {
			return k
		}
	}
	return ""
}

// addFlags registers one flag per config leaf (gcp.listen, amqp.heartbeat,
// ...) with the default as its value, and binds it into viper.
func addFlags(fs *pflag.FlagSet, v *viper.Viper, prefix string, val reflect.Value) error {
	t := val.Type()
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		key := f.Tag.Get("mapstructure")
		if prefix != "" {
			key = prefix + "." + key
		}
		fv := val.Field(i)
		switch {
		case f.Type == reflect.TypeOf(time.Duration(0)):
			fs.Duration(key, time.Duration(fv.Int()), "")
		case f.Type.Kind() == reflect.Struct:
			if err := addFlags(fs, v, key, fv); err != nil {
				return err
			}
			continue
		case f.Type.Kind() == reflect.String:
			fs.String(key, fv.String(), "")
		case f.Type.Kind() == reflect.Bool:
			fs.Bool(key, fv.Bool(), "")
		case f.Type.Kind() == reflect.Int:
			fs.Int(key, int(fv.Int()), "")
		case f.Type.Kind() == reflect.Map:
			v.SetDefault(key, map[string]string{}) // file or environment only
			continue
		default:
			return fmt.Errorf("config field %s: unsupported type %s", key, f.Type)
		}
		if err := v.BindPFlag(key, fs.Lookup(key)); err != nil {
			return err
		}
	}
	return nil
}

func newLogger(c proxy.LogConfig) (*zap.Logger, zap.AtomicLevel, error) {
	level, err := zap.ParseAtomicLevel(c.Level)
	if err != nil {
		return nil, level, err
	}
	zc := zap.NewProductionConfig()
	if c.Format == "console" {
		zc = zap.NewDevelopmentConfig()
	}
	zc.Level = level
	zc.EncoderConfig.EncodeTime = zapcore.ISO8601TimeEncoder
	zc.DisableStacktrace = true
	if !c.Sampling {
		zc.Sampling = nil
	}
	log, err := zc.Build()
	return log, level, err
}
