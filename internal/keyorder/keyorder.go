// Package keyorder checks, for tests, the order in which a subscriber saw
// the messages of one Pub/Sub ordering key: seq lists their numbers (their
// places in the key's publish order, from 0) in delivery order.
package keyorder

import "fmt"

// Check returns the first violation in seq, or nil. A key never skips
// ahead: a message is delivered only after every earlier one was (so seq
// starts at 0). It goes back, to a number not above the previous
// delivery, only where back allows that number: a redelivery after a
// failure, or any duplicate when the test allows at-least-once repeats.
func Check(seq []int, back func(v int) bool) error {
	highest := -1
	for j, v := range seq {
		if v > highest+1 {
			return fmt.Errorf("skipped ahead to %d: %v", v, seq)
		}
		if j > 0 && v <= seq[j-1] && !back(v) {
			return fmt.Errorf("went back to %d: %v", v, seq)
		}
		highest = max(highest, v)
	}
	return nil
}

// Repeats allows going back anywhere (at-least-once redelivery).
func Repeats(int) bool { return true }
