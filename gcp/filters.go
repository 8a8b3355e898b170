package gcp

// matcher reports whether a message with these attributes passes a
// subscription's filter.
type matcher func(attrs map[string]string) bool

// compileFilter parses a subscription filter; a bad one is
// INVALID_ARGUMENT with the parser's text.
func compileFilter(expr string) (matcher, error) {
	return nil, invalidArgf("Subscription filters are not supported by this build of kubemq-proxy yet (filter=%q).", expr)
}
