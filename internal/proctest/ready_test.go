package proctest

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestWaitReady(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/readyz" || calls.Add(1) <= 2 {
			http.Error(w, "backend not ready", 503)
		}
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	if err := WaitReady(addr, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if n := calls.Load(); n != 3 {
		t.Errorf("%d requests, want 3 (two 503s, then 200)", n)
	}
}

func TestWaitReadyTimeout(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "backend not ready", 503)
	}))
	defer srv.Close()
	err := WaitReady(strings.TrimPrefix(srv.URL, "http://"), 200*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "backend not ready") {
		t.Fatalf("err = %v, want the last answer", err)
	}
}
