package console

import (
	"net/http/httptest"
	"testing"
)

func TestAddressHost(t *testing.T) {
	for host, want := range map[string]bool{
		"127.0.0.1:9102": true, "localhost:9102": true, "LOCALHOST": true, "[::1]:9102": true, "10.1.2.3": true,
		"evil.example:9102": false, "localhost.evil.example": false, "": false, "127.0.0.1.nip.io:9102": false,
	} {
		if got := addressHost(host); got != want {
			t.Errorf("addressHost(%q) = %v, want %v", host, got, want)
		}
	}
}

func TestSameOrigin(t *testing.T) {
	for _, c := range []struct {
		origin, site string
		want         bool
	}{
		{"", "", true},
		{"http://127.0.0.1:9102", "", true},
		{"https://127.0.0.1:9102", "same-origin", true},
		{"", "none", true},
		{"http://127.0.0.1:9103", "", false},
		{"http://evil.example", "", false},
		{"null", "", false},
		{"", "same-site", false},
		{"", "cross-site", false},
		{"http://127.0.0.1:9102", "cross-site", false},
	} {
		r := httptest.NewRequest("POST", "http://127.0.0.1:9102/console/action/x", nil)
		if c.origin != "" {
			r.Header.Set("Origin", c.origin)
		}
		if c.site != "" {
			r.Header.Set("Sec-Fetch-Site", c.site)
		}
		if got := sameOrigin(r); got != c.want {
			t.Errorf("Origin %q, Sec-Fetch-Site %q: sameOrigin = %v, want %v", c.origin, c.site, got, c.want)
		}
	}
}
