package embedded

import (
	"crypto/rand"
	"encoding/hex"
	"sync"
)

const nuidDigits = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

// nuidGen makes 22-character ids like the NUIDs of the real server: a random 12-character prefix
// and a 10-character counter, re-randomised when the counter wraps.
type nuidGen struct {
	mu     sync.Mutex
	prefix [12]byte
	seq    uint64
}

var nuids = newNUIDGen()

func newNUIDGen() *nuidGen {
	g := &nuidGen{}
	g.reseed()
	return g
}

func (g *nuidGen) reseed() {
	var b [20]byte
	_, _ = rand.Read(b[:])
	for i := range g.prefix {
		g.prefix[i] = nuidDigits[int(b[i])%len(nuidDigits)]
	}
	g.seq = uint64(b[12])<<40 | uint64(b[13])<<32 | uint64(b[14])<<24 | uint64(b[15])<<16
}

func (g *nuidGen) next() string {
	g.mu.Lock()
	g.seq++
	const maxSeq = 839299365868340224 // 62^10
	if g.seq >= maxSeq {
		g.reseed()
	}
	var out [22]byte
	copy(out[:], g.prefix[:])
	n := g.seq
	for i := 21; i >= 12; i-- {
		out[i] = nuidDigits[n%62]
		n /= 62
	}
	g.mu.Unlock()
	return string(out[:])
}

// newUUID returns a random (version 4) UUID, the shape of the real server's transaction ids.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	var out [36]byte
	hex.Encode(out[0:8], b[0:4])
	out[8] = '-'
	hex.Encode(out[9:13], b[4:6])
	out[13] = '-'
	hex.Encode(out[14:18], b[6:8])
	out[18] = '-'
	hex.Encode(out[19:23], b[8:10])
	out[23] = '-'
	hex.Encode(out[24:], b[10:])
	return string(out[:])
}
