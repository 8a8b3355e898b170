// Package wirecodec is the gRPC proto codec of the proxy's own connections
// (the Pub/Sub front-end, the KubeMQ client, the embedded server). It
// behaves like grpc's default proto codec except for its buffer pool:
// grpc's default pool zeroes a whole pooled buffer on every Get, and its
// size classes jump from 32 KiB to 1 MiB, so a 100 KiB publish batch
// cleared 1 MiB on each of its marshal and unmarshal steps (16% of the
// CPU of a publish benchmark). Here buffers come from power-of-two classes
// and are never zeroed: a marshal overwrites what it uses, and an
// unmarshal copies out every byte it keeps.
package wirecodec

import (
	"fmt"
	"math/bits"
	"sync"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"
)

// Codec returns the codec; it is safe for concurrent use and shared.
func Codec() encoding.CodecV2 { return codec{} }

// Fast is an encoder and decoder for some message types that are tried
// before protobuf's own (kubemqclient/fastpb).
type Fast struct {
	// Marshal appends the encoding of v to b when it can (ok false, b
	// unchanged, otherwise); SizeHint returns at least the size it needs,
	// 0 for a message Marshal does not encode.
	Marshal  func(b []byte, v any) ([]byte, bool)
	SizeHint func(v any) int
	// Unmarshal decodes b into v when it can; false leaves it to protobuf.
	// It must not keep references to b.
	Unmarshal func(b []byte, v any) bool
}

// Chain is a Fast that tries each of fs in turn: nil for none, the one
// itself for one.
func Chain(fs ...*Fast) *Fast {
	switch len(fs) {
	case 0:
		return nil
	case 1:
		return fs[0]
	}
	return &Fast{
		Marshal: func(b []byte, v any) ([]byte, bool) {
			for _, f := range fs {
				if out, ok := f.Marshal(b, v); ok {
					return out, true
				}
			}
			return b, false
		},
		SizeHint: func(v any) int {
			for _, f := range fs {
				if n := f.SizeHint(v); n > 0 {
					return n
				}
			}
			return 0
		},
		Unmarshal: func(b []byte, v any) bool {
			for _, f := range fs {
				if f.Unmarshal(b, v) {
					return true
				}
			}
			return false
		},
	}
}

// CodecWith returns the codec with fast paths.
func CodecWith(f Fast) encoding.CodecV2 { return codec{fast: &f} }

// Pool returns the buffer pool the codec uses, for grpc's transport
// options (experimental.BufferPool, experimental.WithBufferPool).
func Pool() mem.BufferPool { return pool }

type codec struct{ fast *Fast }

func (codec) Name() string { return "proto" }

func (c codec) Marshal(v any) (mem.BufferSlice, error) {
	if c.fast != nil {
		if n := c.fast.SizeHint(v); n > 0 {
			buf := pool.Get(n)
			if out, ok := c.fast.Marshal((*buf)[:0], v); ok {
				*buf = out
				return mem.BufferSlice{mem.NewBuffer(buf, pool)}, nil
			}
			pool.Put(buf)
		}
	}
	m := messageOf(v)
	if m == nil {
		return nil, fmt.Errorf("proto: failed to marshal, message is %T, want proto.Message", v)
	}
	size := proto.Size(m)
	// UseCachedSize reuses the sizes just computed (the message is not
	// mutated concurrently, as with grpc's own codec).
	opts := proto.MarshalOptions{UseCachedSize: true}
	if mem.IsBelowBufferPoolingThreshold(size) {
		b, err := opts.Marshal(m)
		if err != nil {
			return nil, err
		}
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	buf := pool.Get(size)
	out, err := opts.MarshalAppend((*buf)[:0], m)
	if err != nil {
		pool.Put(buf)
		return nil, err
	}
	*buf = out
	return mem.BufferSlice{mem.NewBuffer(buf, pool)}, nil
}

func (c codec) Unmarshal(data mem.BufferSlice, v any) error {
	m := messageOf(v)
	if m == nil {
		return fmt.Errorf("proto: failed to unmarshal, message is %T, want proto.Message", v)
	}
	buf := data.MaterializeToBuffer(pool)
	defer buf.Free()
	if c.fast != nil && c.fast.Unmarshal(buf.ReadOnlyData(), v) {
		return nil
	}
	return proto.Unmarshal(buf.ReadOnlyData(), m)
}

func messageOf(v any) proto.Message {
	switch v := v.(type) {
	case protoadapt.MessageV1:
		return protoadapt.MessageV2Of(v)
	case protoadapt.MessageV2:
		return v
	}
	return nil
}

// Size classes: 2^minShift .. 2^maxShift bytes; larger buffers are not
// pooled.
const (
	minShift = 8
	maxShift = 26 // 64 MiB
)

type classPool struct {
	classes [maxShift - minShift + 1]sync.Pool
}

var pool = &classPool{}

// class returns the index of the smallest class holding n bytes, or -1.
func class(n int) int {
	if n <= 1<<minShift {
		return 0
	}
	s := bits.Len(uint(n - 1)) // 2^s >= n
	if s > maxShift {
		return -1
	}
	return s - minShift
}

func (p *classPool) Get(n int) *[]byte {
	c := class(n)
	if c < 0 {
		b := make([]byte, n)
		return &b
	}
	if b, ok := p.classes[c].Get().(*[]byte); ok {
		*b = (*b)[:n]
		return b
	}
	b := make([]byte, n, 1<<(c+minShift))
	return &b
}

func (p *classPool) Put(b *[]byte) {
	c := cap(*b)
	if c < 1<<minShift || c&(c-1) != 0 {
		return // not one of ours (or not a class size)
	}
	if i := bits.Len(uint(c)) - 1 - minShift; i < len(p.classes) {
		p.classes[i].Put(b)
	}
}
