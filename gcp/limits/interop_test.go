package limits

import (
	"testing"

	v1pb "cloud.google.com/go/pubsub/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
)

// The server uses one protobuf set, v2's. The v1 module's pubsubpb must stay
// a set of type aliases of it, so a v1-generation caller compiles against
// the same types; this assignment stops compiling if that ever changes.
var _ []*pubsubpb.PubsubMessage = []*v1pb.PubsubMessage{}

func TestV1TypesAreV2Types(t *testing.T) {
	msgs := []*v1pb.PubsubMessage{{Data: []byte("from a v1 caller")}}
	if err := ValidatePublish(topic, msgs); err != nil {
		t.Fatal(err)
	}
	var srv pubsubpb.PublisherServer = v1pb.UnimplementedPublisherServer{}
	_ = srv
}
