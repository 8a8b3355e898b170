package fastpb

import (
	"google.golang.org/grpc/encoding"

	"github.com/kubemq-io/kubemq-proxy/kubemqclient/wirecodec"
)

// Codec is the gRPC codec of both ends of a KubeMQ connection (the client
// and the embedded server): wirecodec with this package's encoders and
// decoders tried first.
func Codec() encoding.CodecV2 {
	return wirecodec.CodecWith(wirecodec.Fast{Marshal: Marshal, SizeHint: SizeHint, Unmarshal: Unmarshal})
}
