//go:build race

package proctest

// Race reports whether this test binary runs with the race detector; a
// suite passes it to Binary to build the proxy the same way.
const Race = true
