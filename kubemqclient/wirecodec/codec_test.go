package wirecodec

import (
	"bytes"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func TestRoundTripReusesDirtyBuffers(t *testing.T) {
	c := Codec()
	for _, n := range []int{0, 10, 1 << 10, 5000, 100 << 10, 1<<20 + 1} {
		// Dirty a buffer of the class first: the codec must not depend on zeroes.
		b := pool.Get(n + 16)
		for i := range *b {
			(*b)[i] = 0xAB
		}
		pool.Put(b)
		in := wrapperspb.Bytes(bytes.Repeat([]byte{7}, n))
		data, err := c.Marshal(in)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := proto.Marshal(in)
		if got := data.Materialize(); !bytes.Equal(got, want) {
			t.Fatalf("size %d: marshal differs from proto.Marshal", n)
		}
		var out wrapperspb.BytesValue
		if err := c.Unmarshal(data, &out); err != nil {
			t.Fatal(err)
		}
		data.Free()
		if !bytes.Equal(out.Value, in.Value) {
			t.Fatalf("size %d: round trip differs", n)
		}
	}
	if _, err := c.Marshal("not a message"); err == nil {
		t.Fatal("marshal of a non-message succeeded")
	}
	if err := c.Unmarshal(mem.BufferSlice{}, 3); err == nil {
		t.Fatal("unmarshal into a non-message succeeded")
	}
}

func TestClasses(t *testing.T) {
	for _, tc := range []struct{ n, class int }{{1, 0}, {256, 0}, {257, 1}, {512, 1}, {1 << 20, 12}, {1 << 26, 18}, {1<<26 + 1, -1}} {
		if got := class(tc.n); got != tc.class {
			t.Errorf("class(%d) = %d, want %d", tc.n, got, tc.class)
		}
	}
	b := pool.Get(1<<26 + 1)
	if len(*b) != 1<<26+1 {
		t.Fatal("unpooled size")
	}
	pool.Put(b) // ignored
	odd := make([]byte, 300)
	pool.Put(&odd) // not a class size: ignored
	if g := pool.Get(300); cap(*g) != 512 {
		t.Fatalf("class 300 gave cap %d", cap(*g))
	}
}

func TestCodecWithFastPaths(t *testing.T) {
	var marshals, unmarshals int
	c := CodecWith(Fast{
		Marshal: func(b []byte, v any) ([]byte, bool) {
			if m, ok := v.(*wrapperspb.StringValue); ok && m.Value == "fast" {
				marshals++
				return append(b, 0x0a, 4, 'f', 'a', 's', 't'), true
			}
			return b, false
		},
		SizeHint: func(v any) int {
			if _, ok := v.(*wrapperspb.StringValue); ok {
				return 16
			}
			return 0
		},
		Unmarshal: func(b []byte, v any) bool {
			if m, ok := v.(*wrapperspb.StringValue); ok && len(b) == 6 {
				unmarshals++
				m.Value = "decoded fast"
				return true
			}
			return false
		},
	})
	for _, in := range []string{"fast", "slow path"} {
		data, err := c.Marshal(wrapperspb.String(in))
		if err != nil {
			t.Fatal(err)
		}
		var out wrapperspb.StringValue
		if err := c.Unmarshal(data, &out); err != nil {
			t.Fatal(err)
		}
		want := in
		if in == "fast" {
			want = "decoded fast"
		}
		if out.Value != want {
			t.Fatalf("%q came back %q", in, out.Value)
		}
	}
	if marshals != 1 || unmarshals != 1 {
		t.Fatalf("fast paths used %d/%d times, want 1/1", marshals, unmarshals)
	}
}
