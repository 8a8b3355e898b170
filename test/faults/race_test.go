//go:build race

package faults

// raceEnabled builds the proxy under test with -race too.
const raceEnabled = true
