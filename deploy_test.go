package main

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// The packaging files are checked against the code they configure: every
// KUBEMQ_PROXY_* variable must name a real key with a valid value, probes
// must hit the side port's real paths, and the image must expose the
// default ports.

func readYAML(t *testing.T, path string) []map[string]any {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dec := yaml.NewDecoder(f)
	var docs []map[string]any
	for {
		var d map[string]any
		if err := dec.Decode(&d); err != nil {
			if err.Error() == "EOF" {
				break
			}
			t.Fatalf("%s: %v", path, err)
		}
		docs = append(docs, d)
	}
	if len(docs) == 0 {
		t.Fatalf("%s: no YAML documents", path)
	}
	return docs
}

func dig(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, _ := v.(map[string]any)
			v = m[k]
		case int:
			s, _ := v.([]any)
			if k >= len(s) {
				return nil
			}
			v = s[k]
		}
	}
	return v
}

func checkEnv(t *testing.T, where string, env map[string]string) {
	t.Helper()
	var environ []string
	for k, v := range env {
		if strings.HasPrefix(k, "KUBEMQ_PROXY_") {
			environ = append(environ, k+"="+v)
		}
	}
	if len(environ) == 0 {
		t.Errorf("%s: sets no KUBEMQ_PROXY_ variable", where)
	}
	if _, err := loadConfig(nil, environ); err != nil {
		t.Errorf("%s: environment rejected by the proxy: %v", where, err)
	}
}

func TestDockerCompose(t *testing.T) {
	doc := readYAML(t, "docker-compose.yml")[0]
	services, _ := doc["services"].(map[string]any)
	for _, name := range []string{"kubemq", "proxy", "proxy-embedded"} {
		if services[name] == nil {
			t.Fatalf("service %s missing", name)
		}
	}
	for _, name := range []string{"proxy", "proxy-embedded"} {
		svc := services[name].(map[string]any)
		env := map[string]string{}
		for k, v := range svc["environment"].(map[string]any) {
			env[k], _ = v.(string)
		}
		checkEnv(t, name, env)
		hc := dig(svc, "healthcheck", "test")
		if s, _ := dig(hc, 1).(string); s != "/kubemq-proxy" || dig(hc, 2) != "healthcheck" {
			t.Errorf("%s: healthcheck %v does not run the binary's healthcheck mode", name, hc)
		}
		var ports []string
		for _, p := range svc["ports"].([]any) {
			ports = append(ports, fmt.Sprint(p))
		}
		// Published on the host's loopback only: the proxy's ports have no authentication
		// (Pub/Sub emulator mode, open AMQP logins in the compose file).
		for _, want := range []string{"127.0.0.1:8085:8085", "127.0.0.1:5672:5672", "127.0.0.1:9102:9102"} {
			if !contains(ports, want) {
				t.Errorf("%s: port %s not published (have %v)", name, want, ports)
			}
		}
		for _, p := range ports {
			if !strings.HasPrefix(p, "127.0.0.1:") {
				t.Errorf("%s: port %s published on every host interface", name, p)
			}
		}
	}
	if env := dig(services, "proxy", "environment", "KUBEMQ_PROXY_KUBEMQ_ADDRESS"); env != "kubemq:50000" {
		t.Errorf("proxy does not point at the kubemq service: %v", env)
	}
}

func TestKubernetesSidecar(t *testing.T) {
	docs := readYAML(t, "deploy/kubernetes/sidecar.yaml")
	spec := dig(docs[0], "spec", "template", "spec")
	containers, _ := dig(spec, "containers").([]any)
	var app, side map[string]any
	for _, c := range containers {
		m := c.(map[string]any)
		switch m["name"] {
		case "kubemq-proxy":
			side = m
		case "app":
			app = m
		}
	}
	if app == nil || side == nil {
		t.Fatal("want an app container and a kubemq-proxy sidecar")
	}
	appEnv := map[string]string{}
	for _, e := range app["env"].([]any) {
		m := e.(map[string]any)
		appEnv[m["name"].(string)], _ = m["value"].(string)
	}
	if appEnv["PUBSUB_EMULATOR_HOST"] != "localhost:8085" {
		t.Errorf("app PUBSUB_EMULATOR_HOST = %q", appEnv["PUBSUB_EMULATOR_HOST"])
	}
	env := map[string]string{}
	for _, e := range side["env"].([]any) {
		m := e.(map[string]any)
		env[m["name"].(string)], _ = m["value"].(string)
		if m["valueFrom"] != nil {
			env[m["name"].(string)] = "set-by-kubernetes" // a field or Secret, filled in at run time
		}
	}
	checkEnv(t, "sidecar", env)
	if n, _ := dig(docs[0], "spec", "replicas").(int); n < 2 {
		t.Errorf("the sidecar example runs %d replica: it must show several", n)
	}
	if env["KUBEMQ_PROXY_CLUSTER_LISTEN"] == "" || env["KUBEMQ_PROXY_CLUSTER_ADVERTISE"] == "" || env["KUBEMQ_PROXY_CLUSTER_SECRET"] == "" {
		t.Error("the sidecar does not set cluster.listen, cluster.advertise and cluster.secret")
	}
	def := proxyDefaultsHTTPPort(t)
	if p := dig(side, "ports", 0, "containerPort"); fmt.Sprint(p) != def {
		t.Errorf("sidecar port %v, proxy serves HTTP on %s", p, def)
	}
	for probe, path := range map[string]string{"readinessProbe": "/readyz", "livenessProbe": "/healthz"} {
		if got := dig(side, probe, "httpGet", "path"); got != path {
			t.Errorf("%s path %v, want %s", probe, got, path)
		}
	}
}

func TestDockerfileExposesDefaults(t *testing.T) {
	b, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	expose := regexp.MustCompile(`(?m)^EXPOSE (.*)$`).FindStringSubmatch(string(b))
	if expose == nil {
		t.Fatal("no EXPOSE line")
	}
	for _, p := range []string{"8085", "5672", "5671", proxyDefaultsHTTPPort(t), "50000"} {
		if !contains(strings.Fields(expose[1]), p) {
			t.Errorf("Dockerfile does not expose %s", p)
		}
	}
	if !strings.Contains(string(b), "CGO_ENABLED=0") || !strings.Contains(string(b), "nonroot") {
		t.Error("Dockerfile must build a static binary and run as non-root")
	}
}

func proxyDefaultsHTTPPort(t *testing.T) string {
	cfg, err := loadConfig(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return cfg.HTTP.Listen[strings.LastIndex(cfg.HTTP.Listen, ":")+1:]
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
