package gcp_test

import (
	"context"
	"slices"
	"sort"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc/codes"
)

// TestExactlyOnceStreamConfirmations: on an exactly-once subscription,
// acks and modacks sent on a StreamingPull stream are answered on it with
// Google's confirmations (valid and invalid ack ids apart); on another
// subscription they are applied without an answer.
func TestExactlyOnceStreamConfirmations(t *testing.T) {
	e := startEnv(t)
	ctx := ctxT(t, 3*time.Minute)
	tid, sid, plain := e.id("t"), e.id("eod"), e.id("plain")
	e.createTopic(ctx, tid)
	e.createSub(ctx, &pubsubpb.Subscription{Name: e.subName(sid), Topic: e.topicName(tid), AckDeadlineSeconds: 30, EnableExactlyOnceDelivery: true})
	e.createSub(ctx, &pubsubpb.Subscription{Name: e.subName(plain), Topic: e.topicName(tid), AckDeadlineSeconds: 30})
	s := newSnapTarget(t, e.addr, e.project, e.suffix)
	s.publish("t", "m0", "m1", "m2", "m3", "m4", "m5")

	open := func(sub string) (pubsubpb.Subscriber_StreamingPullClient, map[string]string, *pubsubpb.StreamingPullResponse_SubscriptionProperties) {
		t.Helper()
		stream, err := s.sc.StreamingPull(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := stream.Send(&pubsubpb.StreamingPullRequest{Subscription: e.subName(sub), StreamAckDeadlineSeconds: 30}); err != nil {
			t.Fatal(err)
		}
		ack := map[string]string{} // data -> ack id
		var props *pubsubpb.StreamingPullResponse_SubscriptionProperties
		for len(ack) < 6 {
			resp, err := stream.Recv()
			if err != nil {
				t.Fatal(err)
			}
			props = resp.SubscriptionProperties
			for _, m := range resp.ReceivedMessages {
				ack[string(m.Message.Data)] = m.AckId
			}
		}
		return stream, ack, props
	}

	stream, ack, props := open(sid)
	if !props.GetExactlyOnceDeliveryEnabled() || props.GetMessageOrderingEnabled() {
		t.Errorf("subscription properties %v", props)
	}
	bogus := "AAAAAAAAAAAAAAAAAAAAAA"
	if err := stream.Send(&pubsubpb.StreamingPullRequest{
		AckIds:                []string{ack["m0"], ack["m1"], bogus},
		ModifyDeadlineAckIds:  []string{ack["m2"], ack["m3"], "no-such-id", ack["m4"]},
		ModifyDeadlineSeconds: []int32{60, 60, 60, 0},
	}); err != nil {
		t.Fatal(err)
	}
	var ackConf *pubsubpb.StreamingPullResponse_AcknowledgeConfirmation
	var modConf *pubsubpb.StreamingPullResponse_ModifyAckDeadlineConfirmation
	redelivered := map[string]string{}
	for ackConf == nil || modConf == nil {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if c := resp.AcknowledgeConfirmation; c != nil {
			ackConf = c
		}
		if c := resp.ModifyAckDeadlineConfirmation; c != nil {
			modConf = c
		}
		if (resp.AcknowledgeConfirmation != nil || resp.ModifyAckDeadlineConfirmation != nil) && !resp.GetSubscriptionProperties().GetExactlyOnceDeliveryEnabled() {
			t.Errorf("confirmation without the subscription's properties: %v", resp)
		}
		for _, m := range resp.ReceivedMessages {
			redelivered[string(m.Message.Data)] = m.AckId
		}
	}
	same := func(what string, got, want []string) {
		t.Helper()
		got, want = slices.Clone(got), slices.Clone(want)
		sort.Strings(got)
		sort.Strings(want)
		if !slices.Equal(got, want) {
			t.Errorf("%s: %v, want %v", what, got, want)
		}
	}
	same("acknowledge_confirmation.ack_ids", ackConf.AckIds, []string{ack["m0"], ack["m1"]})
	same("acknowledge_confirmation.invalid_ack_ids", ackConf.InvalidAckIds, []string{bogus})
	same("acknowledge_confirmation.temporary_failed_ack_ids", ackConf.TemporaryFailedAckIds, nil)
	same("acknowledge_confirmation.unordered_ack_ids", ackConf.UnorderedAckIds, nil)
	same("modify_ack_deadline_confirmation.ack_ids", modConf.AckIds, []string{ack["m2"], ack["m3"], ack["m4"]})
	same("modify_ack_deadline_confirmation.invalid_ack_ids", modConf.InvalidAckIds, []string{"no-such-id"})

	// An ack already applied, and one of a nacked delivery, are invalid;
	// the redelivery's own ack id is good.
	for redelivered["m4"] == "" {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range resp.ReceivedMessages {
			redelivered[string(m.Message.Data)] = m.AckId
		}
	}
	if err := stream.Send(&pubsubpb.StreamingPullRequest{AckIds: []string{ack["m0"], ack["m4"], redelivered["m4"]}}); err != nil {
		t.Fatal(err)
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if c := resp.AcknowledgeConfirmation; c != nil {
			same("second ack_ids", c.AckIds, []string{redelivered["m4"]})
			same("second invalid_ack_ids", c.InvalidAckIds, []string{ack["m0"], ack["m4"]})
			break
		}
		if len(resp.ReceivedMessages) > 0 {
			t.Errorf("unexpected delivery %v", resp.ReceivedMessages)
		}
	}
	// The acks were applied: a unary ack of them now is refused.
	_, err := s.sc.Acknowledge(ctx, &pubsubpb.AcknowledgeRequest{Subscription: e.subName(sid), AckIds: []string{ack["m1"]}})
	wantCode(t, err, codes.FailedPrecondition, "")
	_ = stream.CloseSend()

	// At-least-once: acks on the stream get no answer.
	stream2, ack2, props2 := open(plain)
	if props2.GetExactlyOnceDeliveryEnabled() {
		t.Errorf("plain subscription properties %v", props2)
	}
	if err := stream2.Send(&pubsubpb.StreamingPullRequest{AckIds: []string{ack2["m0"], bogus}}); err != nil {
		t.Fatal(err)
	}
	got := make(chan *pubsubpb.StreamingPullResponse, 1)
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	go func() {
		for rctx.Err() == nil {
			resp, err := stream2.Recv()
			if err != nil {
				return
			}
			if resp.AcknowledgeConfirmation != nil || resp.ModifyAckDeadlineConfirmation != nil {
				got <- resp
				return
			}
		}
	}()
	select {
	case resp := <-got:
		t.Errorf("confirmation on an at-least-once subscription: %v", resp)
	case <-rctx.Done():
	}
}
