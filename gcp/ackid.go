package gcp

import (
	"strconv"
	"strings"
)

// Ack ids are "<engine lease id>.<generation>". The engine mints a lease
// per delivery copy; the generation counts this package's own re-deliveries
// of the same lease (ordered keys redeliver in place), so an ack or modack
// that names an earlier generation, a settled lease or a lease of a dead
// process matches nothing and is a no-op (so a nack followed by a late
// receipt modack cannot re-lease the message).
func ackID(leaseID string, gen uint32) string {
	return leaseID + "." + strconv.FormatUint(uint64(gen), 10)
}

func parseAckID(id string) (leaseID string, gen uint32, ok bool) {
	i := strings.LastIndexByte(id, '.')
	if i <= 0 {
		return "", 0, false
	}
	g, err := strconv.ParseUint(id[i+1:], 10, 32)
	if err != nil {
		return "", 0, false
	}
	return id[:i], uint32(g), true
}
