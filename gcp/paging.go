package gcp

import (
	"encoding/base64"
	"sort"
)

// Page sizes of the List RPCs: Google's default is 100 and it caps at 1000.
const (
	defaultPageSize = 100
	maxPageSize     = 1000
)

// pageTokenPrefix makes a token from another list (or a forged one)
// recognisable; the rest is the last id of the previous page, so paging
// stays correct while resources are created and deleted in between.
const pageTokenPrefix = "kp1:"

func encodePageToken(lastID string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(pageTokenPrefix + lastID))
}

func decodePageToken(tok string) (string, error) {
	raw, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil || len(raw) < len(pageTokenPrefix) || string(raw[:len(pageTokenPrefix)]) != pageTokenPrefix {
		return "", invalidArgf("Invalid page token: %q.", tok)
	}
	return string(raw[len(pageTokenPrefix):]), nil
}

// page cuts one page out of sorted ids: the ids after the token's, at most
// size of them, and the token for the next page ("" on the last).
func page(ids []string, size int32, token string) ([]string, string, error) {
	n := int(size)
	if n <= 0 {
		n = defaultPageSize
	}
	n = min(n, maxPageSize)
	start := 0
	if token != "" {
		after, err := decodePageToken(token)
		if err != nil {
			return nil, "", err
		}
		start = sort.Search(len(ids), func(i int) bool { return ids[i] > after })
	}
	end := min(start+n, len(ids))
	out := ids[start:end]
	next := ""
	if end < len(ids) {
		next = encodePageToken(out[len(out)-1])
	}
	return out, next, nil
}
