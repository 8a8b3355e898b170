package embedded

import (
	"sync/atomic"

	"go.uber.org/zap"
)

// StrictStats counts uses of patterns measured as hazardous on the real server (docs/kubemq.md
// sections 8 and 9). They are counted in both modes; Strict mode also refuses them.
type StrictStats struct {
	SecondTransaction    int64 // a Get on a queue that already has an open transaction or waiting Get
	ForeignSettlement    int64 // settlement of a transaction that belongs to another stream
	RepeatedSequence     int64 // a sequence listed twice in one AckRange/NAckRange/ReQueueRange
	StreamEndedDuringGet int64 // a downstream stream ended (cancel or EOF) while a Get was waiting
	RepeatedDelayedID    int64 // a delayed message sent with the MessageID of one still delayed
}

// Total is the sum of all counters.
func (st StrictStats) Total() int64 {
	return st.SecondTransaction + st.ForeignSettlement + st.RepeatedSequence + st.StreamEndedDuringGet +
		st.RepeatedDelayedID
}

type strictCounters struct {
	secondTx, foreign, repeated, endedDuringGet, delayedID atomic.Int64
}

// StrictStats returns the counters of hazardous usage seen so far.
func (s *Server) StrictStats() StrictStats {
	return StrictStats{
		SecondTransaction:    s.strict.secondTx.Load(),
		ForeignSettlement:    s.strict.foreign.Load(),
		RepeatedSequence:     s.strict.repeated.Load(),
		StreamEndedDuringGet: s.strict.endedDuringGet.Load(),
		RepeatedDelayedID:    s.strict.delayedID.Load(),
	}
}

// violation counts and logs one hazardous use; it reports whether to refuse it.
func (s *Server) violation(c *atomic.Int64, what string, fields ...zap.Field) bool {
	c.Add(1)
	if s.opts.Strict {
		s.log.Warn("strict mode refused: "+what, fields...)
	} else {
		s.log.Debug("hazardous pattern (real server misbehaves here): "+what, fields...)
	}
	return s.opts.Strict
}
