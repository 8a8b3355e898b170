package amqp091

import (
	"os/exec"
	"strings"
	"testing"
)

// The front-end reaches KubeMQ only through kubemqclient (and the lease
// engine and registry built on it): it imports no KubeMQ wire types, and
// depends on neither the other front-end, the lifecycle package, the
// embedded server nor the configuration library (docs/ARCHITECTURE.md, "Import rules").
func TestImportGraph(t *testing.T) {
	const mod = "github.com/kubemq-io/kubemq-proxy/"
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", mod+"amqp091/...").CombinedOutput()
	if err != nil {
		t.Skipf("go list unavailable: %v\n%s", err, out)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		for _, imp := range f[1:] {
			if imp == mod+"kubemqpb" {
				t.Errorf("%s imports %s", f[0], imp)
			}
		}
	}
	out, err = exec.Command("go", "list", "-deps", mod+"amqp091/...").CombinedOutput()
	if err != nil {
		t.Skipf("go list unavailable: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, banned := range []string{mod + "gcp", mod + "proxy", mod + "embedded", "github.com/spf13/viper"} {
			if dep == banned || strings.HasPrefix(dep, banned+"/") {
				t.Errorf("amqp091 depends on %s", dep)
			}
		}
	}
}
