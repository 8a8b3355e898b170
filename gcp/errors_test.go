package gcp

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kubemq-io/kubemq-proxy/kubemqclient"
)

func TestToStatus(t *testing.T) {
	cases := []struct {
		name string
		err  error
		want codes.Code
	}{
		{"nil", nil, codes.OK},
		{"own status", status.Error(codes.InvalidArgument, "bad"), codes.InvalidArgument},
		{"not found", notFound("t"), codes.NotFound},
		{"canceled", context.Canceled, codes.Canceled},
		{"deadline", fmt.Errorf("send: %w", context.DeadlineExceeded), codes.DeadlineExceeded},
		{"unavailable", &kubemqclient.Error{Op: "SendQueueMessages", GRPC: codes.Unavailable, Msg: "down", Retryable: true}, codes.Unavailable},
		{"retryable", &kubemqclient.Error{Op: "PublishEvents", Msg: "Error 130: send failed", Retryable: true}, codes.Unavailable},
		{"wrapped retryable", fmt.Errorf("registry: write: %w", &kubemqclient.Error{Op: "PublishEvents", Msg: "x", Retryable: true}), codes.Unavailable},
		// A backend status must not leak as is: KubeMQ's InvalidArgument
		// about our own request is our fault, not the client's.
		{"backend invalid", &kubemqclient.Error{Op: "SendQueueMessages", GRPC: codes.InvalidArgument, Msg: "Error 120: invalid queue name"}, codes.Internal},
		{"backend status wrapped", fmt.Errorf("x: %w", status.Error(codes.InvalidArgument, "kubemq text")), codes.InvalidArgument},
		{"plain", errors.New("boom"), codes.Internal},
		{"store full", fmt.Errorf("fan-out: %w", kubemqclient.ErrResourceExhausted), codes.ResourceExhausted},
	}
	for _, tc := range cases {
		if got := status.Code(toStatus(tc.err)); got != tc.want {
			t.Errorf("%s: %v -> %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}

func TestPage(t *testing.T) {
	ids := []string{"a", "b", "c", "d", "e"}
	var got []string
	tok := ""
	for range 10 {
		p, next, err := page(ids, 2, tok)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, p...)
		if next == "" {
			break
		}
		tok = next
	}
	if fmt.Sprint(got) != fmt.Sprint(ids) {
		t.Fatalf("paged %v", got)
	}
	// A token stays valid when its id is deleted meanwhile.
	_, next, _ := page(ids, 2, "")
	p, _, err := page([]string{"a", "c", "d"}, 2, next)
	if err != nil || fmt.Sprint(p) != "[c d]" {
		t.Fatalf("after delete: %v %v", p, err)
	}
	for _, bad := range []string{"%%%", "YWJj"} {
		if _, _, err := page(ids, 2, bad); status.Code(err) != codes.InvalidArgument {
			t.Errorf("token %q: %v", bad, err)
		}
	}
}
