package main

import (
	"fmt"
	"os"
	"path/filepath"
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
	byKind := map[string]map[string]any{}
	for _, d := range docs {
		byKind[fmt.Sprint(d["kind"])] = d
	}
	deploy, cm := byKind["Deployment"], byKind["ConfigMap"]
	if deploy == nil || cm == nil || byKind["NetworkPolicy"] == nil {
		t.Fatalf("want a ConfigMap, a Deployment and a NetworkPolicy, have %v", keys(byKind))
	}
	spec := dig(deploy, "spec", "template", "spec")
	var app, side map[string]any
	for _, c := range dig(spec, "containers").([]any) {
		if m := c.(map[string]any); m["name"] == "app" {
			app = m
		}
	}
	for _, c := range dig(spec, "initContainers").([]any) {
		if m := c.(map[string]any); m["name"] == "kubemq-proxy" {
			side = m
		}
	}
	if app == nil || side == nil {
		t.Fatal("want an app container and a kubemq-proxy init container (native sidecar)")
	}
	// A native sidecar: started before the app (once its startup probe passes), stopped after.
	if side["restartPolicy"] != "Always" {
		t.Errorf("the sidecar's restartPolicy is %v: a native sidecar needs Always", side["restartPolicy"])
	}
	appEnv := map[string]string{}
	for _, e := range app["env"].([]any) {
		m := e.(map[string]any)
		appEnv[m["name"].(string)], _ = m["value"].(string)
	}
	if appEnv["PUBSUB_EMULATOR_HOST"] != "localhost:8085" || !strings.Contains(appEnv["AMQP_URL"], "@localhost:5672/") {
		t.Errorf("app env %v does not point at the sidecar", appEnv)
	}
	if n, _ := dig(deploy, "spec", "replicas").(int); n < 2 {
		t.Errorf("the sidecar example runs %d replica: it must show several", n)
	}

	// The image tag is pinned.
	img, _ := side["image"].(string)
	if i := strings.LastIndex(img, ":"); i < 0 || strings.HasSuffix(img, ":latest") || strings.Contains(img[i:], "/") {
		t.Errorf("image %q: pin a tag (not latest)", img)
	}

	// Pod Security "restricted".
	sc := dig(side, "securityContext")
	for _, c := range []struct {
		path []any
		want any
	}{
		{[]any{"runAsNonRoot"}, true}, {[]any{"allowPrivilegeEscalation"}, false}, {[]any{"readOnlyRootFilesystem"}, true},
		{[]any{"capabilities", "drop", 0}, "ALL"}, {[]any{"seccompProfile", "type"}, "RuntimeDefault"},
	} {
		if got := dig(sc, c.path...); got != c.want {
			t.Errorf("sidecar securityContext %v = %v, want %v", c.path, got, c.want)
		}
	}
	if dig(spec, "securityContext", "seccompProfile", "type") != "RuntimeDefault" {
		t.Error("the Pod sets no RuntimeDefault seccomp profile")
	}
	if dig(side, "resources", "limits", "memory") == nil || dig(side, "resources", "requests", "memory") == nil {
		t.Error("the sidecar sets no memory request and limit")
	}

	def := proxyDefaultsHTTPPort(t)
	if p := dig(side, "ports", 0, "containerPort"); fmt.Sprint(p) != def {
		t.Errorf("sidecar port %v, proxy serves HTTP on %s", p, def)
	}
	for probe, path := range map[string]string{"startupProbe": "/readyz", "readinessProbe": "/readyz", "livenessProbe": "/healthz"} {
		if got := dig(side, probe, "httpGet", "path"); got != path {
			t.Errorf("%s path %v, want %s", probe, got, path)
		}
	}

	// The ConfigMap's config.yaml, with the Secret files it names, is accepted by the proxy as
	// the sidecar runs it (its environment included).
	cfgText, _ := dig(cm, "data", "config.yaml").(string)
	dir := t.TempDir()
	cfgText = strings.ReplaceAll(cfgText, "/etc/kubemq-proxy/", dir+"/")
	for _, f := range []string{"cluster/secret", "secrets/users.json"} {
		if !strings.Contains(cfgText, dir+"/"+f) {
			t.Errorf("the ConfigMap does not name %s", f)
		}
		os.MkdirAll(filepath.Dir(filepath.Join(dir, f)), 0o755)
		os.WriteFile(filepath.Join(dir, f), []byte(`{"orders":"pw"}`), 0o600)
	}
	cfgFile := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfgFile, []byte(cfgText), 0o600); err != nil {
		t.Fatal(err)
	}
	var environ []string
	for _, e := range side["env"].([]any) {
		m := e.(map[string]any)
		v, _ := m["value"].(string)
		if m["valueFrom"] != nil {
			v = "set-by-kubernetes"
		}
		if strings.HasPrefix(m["name"].(string), "KUBEMQ_PROXY_") {
			environ = append(environ, m["name"].(string)+"="+strings.ReplaceAll(v, "$(POD_IP)", "10.0.0.7"))
		}
	}
	cfg, err := loadConfig([]string{"--config", cfgFile}, environ)
	if err != nil {
		t.Fatalf("the sidecar's configuration is rejected: %v", err)
	}
	if cfg.Cluster.Listen == "" || cfg.Cluster.Advertise == "" || cfg.Cluster.SecretFile == "" || cfg.AMQP.UsersFile == "" {
		t.Errorf("the sidecar does not set cluster.listen, cluster.advertise, cluster.secret_file and amqp.users_file: %+v", cfg.Cluster)
	}
	if cfg.GCP.Listen != "127.0.0.1:8085" {
		t.Errorf("the sidecar's Pub/Sub listener %q is not on loopback", cfg.GCP.Listen)
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
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
