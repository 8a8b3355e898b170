package embedded

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	pb "github.com/kubemq-io/kubemq-proxy/kubemqpb"
)

// fill sets every field of m (recursively, two elements per list and map)
// to a value derived from seed, so that no field is left at its zero value.
func fill(m protoreflect.Message, seed int) {
	fds := m.Descriptor().Fields()
	for i := range fds.Len() {
		fd := fds.Get(i)
		n := seed*31 + i + 1
		switch {
		case fd.IsMap():
			mp := m.Mutable(fd).Map()
			for j := range 2 {
				mp.Set(scalar(fd.MapKey(), n+j).MapKey(), scalar(fd.MapValue(), n+j))
			}
		case fd.IsList():
			l := m.Mutable(fd).List()
			for j := range 2 {
				if fd.Kind() == protoreflect.MessageKind {
					e := l.NewElement()
					fill(e.Message(), n+j)
					l.Append(e)
				} else {
					l.Append(scalar(fd, n+j))
				}
			}
		case fd.Kind() == protoreflect.MessageKind:
			fill(m.Mutable(fd).Message(), n)
		default:
			m.Set(fd, scalar(fd, n))
		}
	}
}

func scalar(fd protoreflect.FieldDescriptor, n int) protoreflect.Value {
	switch fd.Kind() {
	case protoreflect.StringKind:
		return protoreflect.ValueOfString(fmt.Sprintf("s%d", n))
	case protoreflect.BytesKind:
		return protoreflect.ValueOfBytes([]byte(fmt.Sprintf("b%d", n)))
	case protoreflect.BoolKind:
		return protoreflect.ValueOfBool(true)
	case protoreflect.EnumKind:
		vs := fd.Enum().Values()
		return protoreflect.ValueOfEnum(vs.Get(1 + n%(vs.Len()-1)).Number())
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return protoreflect.ValueOfInt32(int32(n))
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return protoreflect.ValueOfInt64(int64(n))
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return protoreflect.ValueOfUint32(uint32(n))
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return protoreflect.ValueOfUint64(uint64(n))
	}
	panic(fmt.Sprintf("fill: kind %v", fd.Kind()))
}

// Which fields scramble changes.
type part int

const (
	everything part = iota
	allButPayload
	payloadOnly
)

// isPayload: the fields a SharePayloads channel hands over.
func isPayload(fd protoreflect.FieldDescriptor) bool {
	switch fd.ContainingMessage().FullName() {
	case "kubemq.Event", "kubemq.QueueMessage":
		return fd.Name() == "Body" || fd.Name() == "Tags"
	}
	return false
}

// scramble changes the byte slices and maps of m in place (those of part p)
// and says whether there was any.
func scramble(m protoreflect.Message, p part) bool {
	changed := false
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if fd.Kind() == protoreflect.MessageKind && !fd.IsMap() {
			if fd.IsList() {
				for i := range v.List().Len() {
					changed = scramble(v.List().Get(i).Message(), p) || changed
				}
			} else {
				changed = scramble(v.Message(), p) || changed
			}
			return true
		}
		if (p == allButPayload && isPayload(fd)) || (p == payloadOnly && !isPayload(fd)) {
			return true
		}
		switch {
		case fd.IsMap():
			v.Map().Range(func(k protoreflect.MapKey, _ protoreflect.Value) bool {
				v.Map().Set(k, scalar(fd.MapValue(), 999))
				return true
			})
			v.Map().Set(scalar(fd.MapKey(), 998).MapKey(), scalar(fd.MapValue(), 998))
			changed = true
		case fd.IsList():
			if fd.Kind() == protoreflect.BytesKind {
				for i := range v.List().Len() {
					copy(v.List().Get(i).Bytes(), "zz")
				}
			}
			v.List().Set(0, scalar(fd, 997))
			changed = true
		case fd.Kind() == protoreflect.BytesKind:
			copy(v.Bytes(), "zz")
			changed = true
		}
		return true
	})
	return changed
}

// TestCopyMessageEveryType: for every message of the service, a deep copy,
// a copy that shares only the payload and a shallow copy equal a message
// with every field set. Changing a deep copy's bytes, maps, lists and nested
// messages leaves the original as it was; so does changing anything but the
// payload (Body and Tags of Event and QueueMessage, also nested) of the
// payload-sharing copy, whose payload is the original's. A field added to
// the proto and missed by a hand-written copy fails here.
func TestCopyMessageEveryType(t *testing.T) {
	msgs := pb.File_kubemq_proto.Messages()
	var all []protoreflect.MessageDescriptor
	var walk func(protoreflect.MessageDescriptors)
	walk = func(ds protoreflect.MessageDescriptors) {
		for i := range ds.Len() {
			d := ds.Get(i)
			if d.IsMapEntry() {
				continue
			}
			all = append(all, d)
			walk(d.Messages())
		}
	}
	walk(msgs)
	if len(all) < 28 {
		t.Fatalf("only %d message types found", len(all))
	}
	for _, d := range all {
		t.Run(string(d.Name()), func(t *testing.T) {
			mt, err := protoregistry.GlobalTypes.FindMessageByName(d.FullName())
			if err != nil {
				t.Fatal(err)
			}
			orig := mt.New().Interface()
			fill(orig.ProtoReflect(), 1)
			want := proto.Clone(orig)

			dc := cloneMessage(orig, deep)
			if !proto.Equal(dc, want) {
				t.Fatalf("deep copy differs:\n got %v\nwant %v", dc, want)
			}
			pc := cloneMessage(orig, deepButPayload)
			if !proto.Equal(pc, want) {
				t.Fatalf("payload-sharing copy differs:\n got %v\nwant %v", pc, want)
			}
			sc := mt.New().Interface()
			fill(sc.ProtoReflect(), 7) // copying overwrites what was there
			copyMessage(sc, orig, shallow)
			if !proto.Equal(sc, want) {
				t.Fatalf("shallow copy differs:\n got %v\nwant %v", sc, want)
			}
			if !scramble(dc.ProtoReflect(), everything) {
				return // nothing that could be shared
			}
			if !proto.Equal(orig, want) {
				t.Fatalf("changing the deep copy changed the original:\n got %v\nwant %v", orig, want)
			}
			scramble(pc.ProtoReflect(), allButPayload)
			if !proto.Equal(orig, want) {
				t.Fatalf("changing the payload-sharing copy's other fields changed the original:\n got %v\nwant %v", orig, want)
			}
			// The requests that store messages must share their payload;
			// the rest may still copy it whole (proto.Merge).
			switch d.Name() {
			case "Event", "QueueMessage", "QueueMessagesBatchRequest", "QueuesUpstreamRequest":
				if !scramble(pc.ProtoReflect(), payloadOnly) || proto.Equal(orig, want) {
					t.Fatal("the payload-sharing copy has its own payload")
				}
			}
		})
	}
}

// TestCheckSize: a message over the server's limit is refused as gRPC
// refuses it, measured exactly; the cheap bound never lets one through.
func TestCheckSize(t *testing.T) {
	mib := bytes.Repeat([]byte("x"), 1<<20)
	batch := func(n int) *pb.QueueMessagesBatchRequest {
		b := &pb.QueueMessagesBatchRequest{BatchID: "b"}
		for range n {
			b.Messages = append(b.Messages, &pb.QueueMessage{Channel: "q", Body: mib}) // shared: no real memory
		}
		return b
	}
	if err := checkSize(batch(99), maxGRPCMessage); err != nil {
		t.Fatalf("99 MiB: %v", err)
	}
	err := checkSize(batch(101), maxGRPCMessage)
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("101 MiB: %v, want ResourceExhausted", err)
	}
	for _, m := range []proto.Message{batch(3), &pb.Event{Body: mib, Tags: map[string]string{"k": "v"}},
		&pb.QueuesDownstreamResponse{Messages: batch(2).Messages, ActiveOffsets: []int64{1, 2}}} {
		if h, n := sizeHint(m), proto.Size(m); h < n {
			t.Errorf("%T: hint %d below size %d", m, h, n)
		}
	}
}

// TestServerContext: the handler sees the caller's outgoing metadata as
// incoming, not as its own outgoing, and the caller's cancellation.
func TestServerContext(t *testing.T) {
	ctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(context.Background(), "authorization", "tok"))
	sctx, scancel := serverContext(ctx)
	defer scancel()
	if md, _ := metadata.FromIncomingContext(sctx); len(md.Get("authorization")) != 1 || md.Get("authorization")[0] != "tok" {
		t.Fatalf("incoming metadata %v", md)
	}
	if md, _ := metadata.FromOutgoingContext(sctx); len(md) != 0 {
		t.Fatalf("outgoing metadata leaked to the handler: %v", md)
	}
	cancel()
	<-sctx.Done()
}
