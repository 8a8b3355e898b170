package keyorder

import "testing"

func TestCheck(t *testing.T) {
	nacked3 := func(v int) bool { return v == 3 }
	for _, c := range []struct {
		seq  []int
		back func(int) bool
		ok   bool
	}{
		{[]int{0, 1, 2, 3}, nacked3, true},
		{[]int{0, 1, 2, 3, 4, 5, 3, 4, 5, 6}, nacked3, true}, // restart at the nacked message
		{[]int{1, 2}, Repeats, false},                        // does not start at 0
		{[]int{0, 2, 1}, Repeats, false},                     // skips 1
		{[]int{0, 1, 2, 1, 2}, nacked3, false},               // back to 1, not allowed
		{[]int{0, 1, 1, 2, 0, 1, 2, 3}, Repeats, true},       // duplicates
		{nil, Repeats, true},
	} {
		if err := Check(c.seq, c.back); (err == nil) != c.ok {
			t.Errorf("Check(%v) = %v, want ok %v", c.seq, err, c.ok)
		}
	}
}
