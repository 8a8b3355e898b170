package embedded

import (
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Channel-name limits of the real store: each channel is a directory named prefix+name and a
// file name holds at most 255 bytes (docs/kubemq.md 5.1).
const (
	maxEventsChannelLen = 240
	maxQueueNameLen     = 246
)

// channelKind selects the rules for a name.
type channelKind int

const (
	kindEvents      channelKind = iota // plain events publish
	kindEventsSub                      // plain events subscription: wildcards allowed
	kindEventsStore                    // events store publish or subscribe
	kindQueue
)

// checkChannel applies the real server's checks and then the ones its store layer would fail on
// later (often silently). It returns "" for a good name, else the full error text.
func checkChannel(name string, kind channelKind) string {
	if kind == kindQueue {
		if name == "" || strings.HasSuffix(name, ".") || strings.Contains(name, " ") ||
			strings.ContainsAny(name, "*>") {
			return errQueueName
		}
		if why := unsafeName(name, maxQueueNameLen, false); why != "" {
			return errQueueName + "; " + why
		}
		return ""
	}
	switch {
	case name == "":
		return errChannelEmpty
	case strings.HasSuffix(name, "."):
		return errEndDot
	case strings.Contains(name, " "):
		return errWhitespace
	case kind != kindEventsSub && strings.ContainsAny(name, "*>"):
		return errWildcards
	}
	why := unsafeName(name, maxEventsChannelLen, kind == kindEventsSub)
	switch {
	case why == "":
		return ""
	case why == whyWhitespace:
		return errWhitespace
	default:
		return "Error 102: invalid channel value, " + why
	}
}

const whyWhitespace = "cannot contain white space or control characters"

// unsafeName reports what the real store would reject or break on: a leading dot, an empty
// token, '/', ':', white space or control characters, invalid UTF-8, and over-long names. With
// wildcards, '*' and '>' must be whole tokens and '>' the last one (NATS rules).
func unsafeName(name string, maxLen int, wildcards bool) string {
	if len(name) > maxLen {
		return "longer than " + strconv.Itoa(maxLen) + " bytes"
	}
	if !utf8.ValidString(name) {
		return "not valid UTF-8"
	}
	for _, r := range name {
		if unicode.IsSpace(r) || unicode.IsControl(r) || r == utf8.RuneError {
			return whyWhitespace
		}
		if r == '/' || r == ':' {
			return "cannot contain `/` or `:`"
		}
	}
	if strings.HasPrefix(name, ".") {
		return "cannot start with `.`"
	}
	for rest := name; ; { // token by token, without allocating (every message's channel is checked)
		tok, after, more := strings.Cut(rest, ".")
		if tok == "" {
			return "cannot contain an empty token `..`"
		}
		if wildcards && strings.ContainsAny(tok, "*>") {
			if tok != "*" && tok != ">" {
				return "wildcards `*` and `>` must be whole tokens"
			}
			if tok == ">" && more {
				return "wildcard `>` must be the last token"
			}
		}
		if !more {
			return ""
		}
		rest = after
	}
}

// subjectMatch reports whether a plain-events subscription pattern (tokens, '*' one token, '>'
// the rest) matches a published channel name.
func subjectMatch(pattern, subject string) bool {
	if !strings.ContainsAny(pattern, "*>") {
		return pattern == subject
	}
	for {
		pi := strings.IndexByte(pattern, '.')
		si := strings.IndexByte(subject, '.')
		var ptok, stok string
		if pi < 0 {
			ptok = pattern
		} else {
			ptok = pattern[:pi]
		}
		if si < 0 {
			stok = subject
		} else {
			stok = subject[:si]
		}
		if ptok == ">" {
			return subject != ""
		}
		if ptok != "*" && ptok != stok {
			return false
		}
		if pi < 0 || si < 0 {
			return pi < 0 && si < 0
		}
		pattern, subject = pattern[pi+1:], subject[si+1:]
	}
}
