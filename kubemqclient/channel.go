package kubemqclient

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
)

// MaxChannelLen is the longest channel name the proxy sends. KubeMQ stores
// each channel as a directory named prefix+name (255 bytes at most), which
// leaves 240 bytes for events-store names (docs/kubemq.md 5.1).
const MaxChannelLen = 240

// hashedLen is the length of a hashed part token: "_H" + 40 hex digits.
const hashedLen = 2 + 40

const upperHex = "0123456789ABCDEF"

// Channel joins a trusted prefix (constant, dot-separated safe tokens such as
// "gcp", "gcp.sub" or "amqp"; "" for none) with external parts, each encoded
// as exactly one token, so the result is a KubeMQ-safe channel name.
//
// A part that already looks like a readable token (`^[A-Za-z0-9-][A-Za-z0-9_-]*$`)
// is kept verbatim. Any other part is written as "_" followed by the part with
// every byte outside [A-Za-z0-9-] escaped as "_XX" (upper-case hex). Encoded
// tokens therefore always start with "_" and verbatim ones never do, which
// keeps the mapping injective. If the name is longer than MaxChannelLen, the
// longest part token (the last among equals) is replaced by "_H" + 40 hex
// digits of sha256(part), repeatedly, until it fits; if hashing every part is
// not enough, all parts together become one "_M" + 40 hex digit token.
//
// An invalid prefix is not repaired: the result then fails ValidChannel and
// the client refuses to send it.
func Channel(prefix string, parts ...string) string {
	if len(parts) == 0 {
		return prefix
	}
	toks := make([]string, len(parts))
	hashed := make([]bool, len(parts))
	total := len(prefix)
	if prefix != "" {
		total++ // the dot after the prefix
	}
	for i, p := range parts {
		toks[i] = encodePart(p)
		total += len(toks[i])
	}
	total += len(parts) - 1 // dots between parts
	for total > MaxChannelLen {
		best := -1
		for i, t := range toks {
			// Hashing a token of hashedLen bytes or fewer gains nothing.
			if !hashed[i] && len(t) > hashedLen && (best < 0 || len(t) >= len(toks[best])) {
				best = i
			}
		}
		if best < 0 {
			toks = []string{multiHash(parts)}
			break
		}
		total -= len(toks[best]) - hashedLen
		toks[best] = hashPart(parts[best])
		hashed[best] = true
	}
	var b strings.Builder
	b.Grow(total)
	if prefix != "" {
		b.WriteString(prefix)
		b.WriteByte('.')
	}
	for i, t := range toks {
		if i > 0 {
			b.WriteByte('.')
		}
		b.WriteString(t)
	}
	return b.String()
}

// encodePart turns one external part into one token (verbatim or escaped).
func encodePart(p string) string {
	if isVerbatim(p) {
		return p
	}
	n := 1
	for i := 0; i < len(p); i++ {
		if isPlain(p[i]) {
			n++
		} else {
			n += 3
		}
	}
	b := make([]byte, 0, n)
	b = append(b, '_')
	for i := 0; i < len(p); i++ {
		c := p[i]
		if isPlain(c) {
			b = append(b, c)
		} else {
			b = append(b, '_', upperHex[c>>4], upperHex[c&0xf])
		}
	}
	return string(b)
}

func hashPart(p string) string {
	sum := sha256.Sum256([]byte(p))
	return "_H" + hex.EncodeToString(sum[:20])
}

// multiHash hashes a whole part list into one token. Parts are length-prefixed
// so that different lists cannot feed the same bytes to the hash; the "_M"
// marker keeps it apart from single-part hashes.
func multiHash(parts []string) string {
	h := sha256.New()
	var lenBuf [8]byte
	for _, p := range parts {
		n := uint64(len(p))
		for i := range lenBuf {
			lenBuf[i] = byte(n >> (8 * i))
		}
		h.Write(lenBuf[:])
		h.Write([]byte(p))
	}
	sum := h.Sum(nil)
	return "_M" + hex.EncodeToString(sum[:20])
}

// isPlain reports whether c may appear unescaped inside an encoded token.
func isPlain(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-'
}

// isTokenByte reports whether c may appear in a channel token at all.
func isTokenByte(c byte) bool { return isPlain(c) || c == '_' }

func isVerbatim(p string) bool {
	if p == "" || !isPlain(p[0]) {
		return false
	}
	for i := 1; i < len(p); i++ {
		if !isTokenByte(p[i]) {
			return false
		}
	}
	return true
}

// DecodePart reverses the encoding of one part token, for readable logs and
// debugging. It returns false for hashed tokens ("_H...", "_M...") and for
// anything Channel would never produce.
func DecodePart(token string) (string, bool) {
	if isVerbatim(token) {
		return token, true
	}
	if token == "" || token[0] != '_' {
		return "", false
	}
	b := make([]byte, 0, len(token))
	for i := 1; i < len(token); i++ {
		c := token[i]
		switch {
		case isPlain(c):
			b = append(b, c)
		case c == '_' && i+2 < len(token):
			hi, ok1 := unhex(token[i+1])
			lo, ok2 := unhex(token[i+2])
			if !ok1 || !ok2 {
				return "", false
			}
			b = append(b, hi<<4|lo)
			i += 2
		default:
			return "", false
		}
	}
	part := string(b)
	// Only the canonical encoding decodes; this rejects hashed tokens, whose
	// body would decode to a part that is kept verbatim.
	if encodePart(part) != token {
		return "", false
	}
	return part, true
}

func unhex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// ValidChannel is the safety rule for every channel name the client sends:
// dot-separated, non-empty tokens of [A-Za-z0-9_-], at most MaxChannelLen
// bytes. Names that break it can lose data silently or break the server
// (docs/kubemq.md 5.1), so the client refuses them before sending anything.
func ValidChannel(name string) error {
	if name == "" {
		return invalidArg("channel", "empty channel name", ErrInvalidChannel)
	}
	if len(name) > MaxChannelLen {
		return invalidArg("channel", "channel name longer than 240 bytes", ErrInvalidChannel)
	}
	tokStart := 0
	for i := 0; i <= len(name); i++ {
		if i == len(name) || name[i] == '.' {
			if i == tokStart {
				return invalidArg("channel", "empty token in channel name "+quoteName(name), ErrInvalidChannel)
			}
			tokStart = i + 1
			continue
		}
		if !isTokenByte(name[i]) {
			return invalidArg("channel", "invalid byte in channel name "+quoteName(name), ErrInvalidChannel)
		}
	}
	return nil
}

// quoteName quotes a (possibly hostile) name for an error message, bounded.
func quoteName(s string) string {
	const maxShown = 64
	if len(s) > maxShown {
		s = s[:maxShown] + "..."
	}
	return strconv.Quote(s)
}
