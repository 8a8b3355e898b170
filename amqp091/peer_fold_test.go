package amqp091

import (
	"bytes"
	"testing"

	"github.com/kubemq-io/kubemq-proxy/amqp091/peerpb"
)

// foldDeliveries keeps every response and its order, folds runs of deliveries within the
// bounds, and leaves lone deliveries and other responses alone.
func TestFoldDeliveries(t *testing.T) {
	del := func(key uint64, size int) *peerpb.LinkResponse {
		return &peerpb.LinkResponse{Kind: &peerpb.LinkResponse_Delivery{Delivery: &peerpb.Delivery{Key: key, Body: bytes.Repeat([]byte{'x'}, size)}}}
	}
	opened := &peerpb.LinkResponse{Kind: &peerpb.LinkResponse_Opened{Opened: &peerpb.Opened{}}}
	cancelled := &peerpb.LinkResponse{Kind: &peerpb.LinkResponse_Cancelled{Cancelled: &peerpb.Cancelled{Reason: "gone"}}}
	var in []*peerpb.LinkResponse
	in = append(in, opened, del(1, 10))
	for k := uint64(2); k < 2+peerBatchMax+3; k++ {
		in = append(in, del(k, 10))
	}
	next := uint64(2 + peerBatchMax + 3)
	in = append(in, cancelled, del(next, 10))
	// Big bodies: two fit in one response, the third starts the next.
	for k := next + 1; k < next+4; k++ {
		in = append(in, del(k, peerBatchBytes/2-100))
	}
	want := make([]uint64, 0, len(in))
	for _, r := range in {
		if d := r.GetDelivery(); d != nil {
			want = append(want, d.Key)
		}
	}
	out := foldDeliveries(append([]*peerpb.LinkResponse(nil), in...))
	var got []uint64
	var shapes []int // -1 other, else deliveries per response
	for _, r := range out {
		switch {
		case r.GetDelivery() != nil:
			got = append(got, r.GetDelivery().Key)
			shapes = append(shapes, 1)
		case r.GetDeliveries() != nil:
			items := r.GetDeliveries().Items
			if len(items) < 2 || len(items) > peerBatchMax {
				t.Errorf("a Deliveries response of %d", len(items))
			}
			for _, d := range items {
				got = append(got, d.Key)
			}
			shapes = append(shapes, len(items))
		default:
			shapes = append(shapes, -1)
		}
	}
	if len(got) != len(want) {
		t.Fatalf("%d deliveries out, %d in", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("delivery %d is key %d, want %d", i, got[i], want[i])
		}
	}
	// opened; 260 deliveries: 256 (the count bound) and the 4 left; cancelled; a small one
	// and two big ones (just under the byte bound), then the third big one alone.
	wantShapes := []int{-1, peerBatchMax, 4, -1, 3, 1}
	if len(shapes) != len(wantShapes) {
		t.Fatalf("responses %v, want %v", shapes, wantShapes)
	}
	for i := range shapes {
		if shapes[i] != wantShapes[i] {
			t.Fatalf("responses %v, want %v", shapes, wantShapes)
		}
	}
}
