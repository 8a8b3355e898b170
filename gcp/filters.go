package gcp

import (
	"google.golang.org/grpc/status"

	"github.com/kubemq-io/kubemq-proxy/gcp/filter"
)

// matcher reports whether a message with these attributes passes a
// subscription's filter.
type matcher func(attrs map[string]string) bool

// compileFilter parses a subscription filter; a bad one is
// INVALID_ARGUMENT with the parser's text. The empty filter is a nil
// matcher (everything passes, no call per message).
func compileFilter(expr string) (matcher, error) {
	f, err := filter.Parse(expr)
	if err != nil {
		return nil, status.Convert(err).Err()
	}
	if f.IsEmpty() {
		return nil, nil
	}
	return f.Match, nil
}
