package main

import (
	_ "embed"
	"fmt"
	"io"
	"runtime/debug"
	"strings"

	"github.com/spf13/pflag"
)

// configYAML is the documented configuration: the comment above each key is that key's flag
// help, so the two cannot drift apart.
//
//go:embed config.yaml
var configYAML string

// keyHelp maps every key of config.yaml ("gcp.listen") to the comment lines right above it,
// joined into one sentence or paragraph.
func keyHelp(doc string) map[string]string {
	help := map[string]string{}
	type level struct {
		indent int
		key    string
	}
	var stack []level
	var comment []string
	group := "" // the comment of the keys since the last blank line
	for _, line := range strings.Split(doc, "\n") {
		trimmed := strings.TrimSpace(line)
		switch {
		case trimmed == "":
			comment, group = nil, ""
			continue
		case strings.HasPrefix(trimmed, "#"):
			comment = append(comment, strings.TrimSpace(strings.TrimPrefix(trimmed, "#")))
			continue
		}
		indent := len(line) - len(strings.TrimLeft(line, " "))
		name, value, ok := strings.Cut(trimmed, ":")
		if !ok || strings.HasPrefix(trimmed, "-") {
			comment = nil
			continue // a list item or a continuation: not a key
		}
		for len(stack) > 0 && stack[len(stack)-1].indent >= indent {
			stack = stack[:len(stack)-1]
		}
		key := name
		if len(stack) > 0 {
			key = stack[len(stack)-1].key + "." + name
		}
		if v := strings.TrimSpace(value); v == "" || strings.HasPrefix(v, "#") {
			stack = append(stack, level{indent, key}) // a section (or a map shown empty)
			if len(comment) == 0 {
				group = ""
			}
		}
		if len(comment) > 0 {
			group = strings.Join(comment, " ")
		}
		if group != "" {
			// Keys listed together under one comment (cert_file, key_file) share it.
			help[key] = group
		}
		comment = nil
	}
	return help
}

// describeFlags gives every flag named after a config key the help text of that key.
func describeFlags(fs *pflag.FlagSet) {
	help := keyHelp(configYAML)
	fs.VisitAll(func(f *pflag.Flag) {
		if h, ok := help[f.Name]; ok && f.Usage == "" {
			f.Usage = h
		}
	})
}

const usageHead = `kubemq-proxy serves Google Cloud Pub/Sub v1 (gRPC) and AMQP 0-9-1 clients and stores every
message in KubeMQ: the server at --kubemq.address, or an embedded KubeMQ-compatible one.

Usage:
  kubemq-proxy [flags]               run the proxy
  kubemq-proxy embedded [flags]      run only the embedded KubeMQ-compatible server
  kubemq-proxy healthcheck [flags]   exit 0 when the local proxy's /readyz answers 200
  kubemq-proxy --version             print the version and exit

Every flag is also a config file key (--config FILE, or ./config.yaml) and an environment
variable KUBEMQ_PROXY_<KEY> (upper case, "." -> "_"); flags win over the environment, which wins
over the file. A bad value is reported on one line with exit code 2.

Flags:
`

func printUsage(w io.Writer, fs *pflag.FlagSet) {
	fmt.Fprint(w, usageHead)
	fmt.Fprint(w, fs.FlagUsagesWrapped(100))
}

// version is the module version and VCS revision the binary was built from.
func version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "kubemq-proxy (no build information)"
	}
	v := bi.Main.Version
	if v == "" {
		v = "(devel)"
	}
	var rev, modified string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				modified = " (modified)"
			}
		}
	}
	out := "kubemq-proxy " + v
	if rev != "" {
		out += " commit " + rev + modified
	}
	return out + " " + bi.GoVersion
}
