// Package proctest runs the kubemq-proxy binary as a separate process for
// the suites that test it from outside (test/faults, test/load,
// test/security and the root package's end-to-end tests). It owns building
// the binary once per test binary, starting it with stderr captured to a
// log file, reading the bound addresses from its JSON "listening" log
// lines, collecting race reports and panics from that log, stopping it, and
// reading its /metrics. It uses the standard library only, so any test
// package may import it without taking on the proxy's dependencies.
package proctest
