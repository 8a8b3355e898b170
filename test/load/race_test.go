//go:build race

package load

// raceEnabled builds the proxy under test with -race too.
const raceEnabled = true
