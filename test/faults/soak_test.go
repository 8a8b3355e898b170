package faults

import (
	"testing"
	"time"
)

func runSoak(t *testing.T, d time.Duration) { t.Skip("not yet") }
