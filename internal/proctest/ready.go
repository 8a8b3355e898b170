package proctest

import (
	"bytes"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// WaitReady polls http://httpAddr/readyz until it answers 200; after d it
// returns an error with the last answer or request error.
func WaitReady(httpAddr string, d time.Duration) error {
	deadline := time.Now().Add(d)
	hc := http.Client{Timeout: time.Second}
	var last string
	for {
		resp, err := hc.Get("http://" + httpAddr + "/readyz")
		if err == nil {
			var buf bytes.Buffer
			buf.ReadFrom(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = strings.TrimSpace(buf.String())
		} else {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("/readyz not 200 within %v (last: %s)", d, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
