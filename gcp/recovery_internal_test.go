package gcp

import (
	"context"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/kubemq-io/kubemq-proxy/delivery"
)

// elsewhereOwners grants every claim; a holding says another replica held its queue since any
// time when the queue's name contains elsewhere.
type elsewhereOwners struct{ elsewhere string }

type elsewhereOwned struct {
	queue, elsewhere string
	lost             chan struct{}
}

func (o elsewhereOwners) Claim(ctx context.Context, queue string) (delivery.Owned, error) {
	return &elsewhereOwned{queue: queue, elsewhere: o.elsewhere, lost: make(chan struct{})}, nil
}

func (h *elsewhereOwned) Lost() <-chan struct{}             { return h.lost }
func (h *elsewhereOwned) Release(ctx context.Context) error { return nil }
func (h *elsewhereOwned) HeldElsewhereSince(time.Time) bool {
	return strings.Contains(h.queue, h.elsewhere)
}

// An ordered subscription this process created starts without a recovery hold, unless another
// replica consumed it since: that replica's lease records may still be on their way back, behind
// later messages of their keys.
func TestRecoveryHoldWhenAnotherReplicaConsumedSince(t *testing.T) {
	e := newRTEnv(t, Config{}, func(o *Options) {
		dm, err := delivery.NewManager(delivery.NewKubeMQBackend(o.Client), delivery.Options{Owners: elsewhereOwners{elsewhere: "sub-moved"}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			dm.Close(ctx)
		})
		o.Deliveries = dm
	})
	e.createTopic("t")
	for _, c := range []struct {
		sub  string
		hold bool
	}{{"stayed", false}, {"moved", true}} {
		rt := e.createSub(&pubsubpb.Subscription{Name: e.sub(c.sub), Topic: e.topic("t")})
		rt.mu.Lock()
		hold := rt.recoveringLocked(time.Now())
		rt.mu.Unlock()
		if hold != c.hold {
			t.Errorf("subscription %s: recovery hold %v, want %v", c.sub, hold, c.hold)
		}
	}
}
