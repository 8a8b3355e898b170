package limits

import (
	"strings"
	"testing"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// FuzzValidatePublish builds a batch from the input and checks that the
// verdict agrees with the rules stated plainly (small limits keep the
// inputs small), and that every refusal is a status with the right code.
func FuzzValidatePublish(f *testing.F) {
	f.Add([]byte("data"), "key", "value", "", uint8(1), false)
	f.Add([]byte{}, "", "", "k", uint8(2), true)
	f.Add([]byte("x"), "goog-k", "v", "", uint8(1), false)
	f.Add([]byte("x"), "googclient_k", "v", "ok", uint8(3), false)
	f.Add([]byte(strings.Repeat("d", 40)), strings.Repeat("k", 9), "vvvvvvvvv", "ooooooooo", uint8(5), true)
	p := Publish{MaxMessages: 4, MaxRequestBytes: 200, MaxMessageBytes: 48, MaxAttributes: 1,
		MaxAttributeKeyBytes: 8, MaxAttributeValueBytes: 8, MaxOrderingKeyBytes: 8}
	f.Fuzz(func(t *testing.T, data []byte, key, val, okey string, n uint8, mixKeys bool) {
		n %= 6
		msgs := make([]*pubsubpb.PubsubMessage, n)
		for i := range msgs {
			m := &pubsubpb.PubsubMessage{Data: data, OrderingKey: okey}
			if key != "" || val != "" {
				m.Attributes = map[string]string{key: val}
			}
			if mixKeys && i == 1 {
				m.OrderingKey = okey + "x"
			}
			msgs[i] = m
		}
		err := p.Validate("projects/p/topics/t", msgs)

		wantOK := n >= 1 && int(n) <= p.MaxMessages
		if wantOK {
			size := 0
			for _, m := range msgs {
				size += len(m.Data) + len(m.OrderingKey) + len(key) + len(val)
			}
			msgBytes := len(data) + len(okey) + len(key) + len(val)
			attrs := key != "" || val != ""
			wantOK = (len(data) > 0 || attrs) &&
				(!attrs || (key != "" && len(key) <= 8 && len(val) <= 8 &&
					(!strings.HasPrefix(key, "goog") || strings.HasPrefix(key, "googclient_")))) &&
				len(okey) <= 8 && msgBytes <= 48 && !(mixKeys && n > 1) && size < 200
		}
		if err == nil && !wantOK {
			t.Fatalf("accepted a batch the rules refuse: n=%d data=%d key=%q val=%q okey=%q mix=%v", n, len(data), key, val, okey, mixKeys)
		}
		if err != nil {
			if c := status.Code(err); c != codes.InvalidArgument && c != codes.FailedPrecondition {
				t.Fatalf("code %v: %v", c, err)
			}
		}
	})
}
