// Package archtest asserts the import rules of docs/ARCHITECTURE.md so they cannot
// erode: only kubemqclient and the embedded server know KubeMQ's wire
// types, the front-ends never import each other, and only main touches
// viper.
package archtest

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/kubemq-io/kubemq-proxy"

type pkg struct {
	ImportPath  string
	Imports     []string
	TestImports []string
}

func listPackages(t *testing.T) []pkg {
	t.Helper()
	out, err := exec.Command("go", "list", "-json", module+"/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var pkgs []pkg
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for dec.More() {
		var p pkg
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

func within(path, root string) bool {
	return path == root || strings.HasPrefix(path, root+"/")
}

func TestImportRules(t *testing.T) {
	pkgs := listPackages(t)
	if len(pkgs) < 5 {
		t.Fatalf("only %d packages listed", len(pkgs))
	}
	for _, p := range pkgs {
		for _, imp := range p.Imports {
			switch {
			case within(imp, module+"/kubemqpb"):
				if !within(p.ImportPath, module+"/kubemqclient") && !within(p.ImportPath, module+"/embedded") && !within(p.ImportPath, module+"/kubemqpb") {
					t.Errorf("%s imports the KubeMQ wire types (%s); only kubemqclient and embedded may", p.ImportPath, imp)
				}
			case within(imp, module+"/gcp") && within(p.ImportPath, module+"/amqp091"),
				within(imp, module+"/amqp091") && within(p.ImportPath, module+"/gcp"):
				t.Errorf("front-end %s imports the other front-end %s", p.ImportPath, imp)
			case within(imp, "github.com/spf13/viper"):
				if p.ImportPath != module {
					t.Errorf("%s imports viper; only main reads configuration sources", p.ImportPath)
				}
			case within(imp, module+"/proxy"):
				if within(p.ImportPath, module+"/gcp") || within(p.ImportPath, module+"/amqp091") || within(p.ImportPath, module+"/kubemqclient") || within(p.ImportPath, module+"/embedded") {
					t.Errorf("%s imports the lifecycle package proxy; dependencies point the other way", p.ImportPath)
				}
			}
		}
	}
}
