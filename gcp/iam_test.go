package gcp_test

import (
	"fmt"
	"testing"
	"time"

	"cloud.google.com/go/iam"
	"cloud.google.com/go/iam/apiv1/iampb"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/genproto/googleapis/type/expr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
)

func iamClient(t *testing.T, addr string) iampb.IAMPolicyClient {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return iampb.NewIAMPolicyClient(cc)
}

// IAM answers as Google's service does (the Google emulator leaves IAM unimplemented): a
// policy set is returned by later Gets, on any replica and after a restart, with a fresh etag;
// a stale etag is refused with ABORTED; a missing resource is NOT_FOUND; a topic deleted and
// created again starts with an empty policy; TestIamPermissions grants every valid permission.
func TestIAMPolicies(t *testing.T) {
	e := startEnv(t)
	ctx := ctxT(t, time.Minute)
	c := e.v2()
	topic := e.topicName(e.id("iam"))
	sub := e.subName(e.id("iam"))
	if _, err := c.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: topic}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{Name: sub, Topic: topic}); err != nil {
		t.Fatal(err)
	}
	ic := iamClient(t, e.addr)

	empty, err := c.TopicAdminClient.GetIamPolicy(ctx, &iampb.GetIamPolicyRequest{Resource: topic})
	if err != nil {
		t.Fatal(err)
	}
	if len(empty.Bindings) != 0 || string(empty.Etag) != "\x00\x20\x01" {
		t.Fatalf("policy never set = %v, want no bindings and etag ACAB", empty)
	}

	// The v1 client's IAM handle: read-modify-write with the etag.
	h := e.v1().Topic(e.id("iam")).IAM()
	pol, err := h.Policy(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pol.Add("user:alice@example.com", iam.RoleName("roles/pubsub.publisher"))
	if err := h.SetPolicy(ctx, pol); err != nil {
		t.Fatal(err)
	}
	got, err := h.Policy(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !got.HasRole("user:alice@example.com", "roles/pubsub.publisher") {
		t.Fatalf("policy after SetPolicy: %v", got.InternalProto)
	}
	// The etag of the policy read before the change is stale now.
	_, err = ic.SetIamPolicy(ctx, &iampb.SetIamPolicyRequest{Resource: topic, Policy: &iampb.Policy{Etag: empty.Etag,
		Bindings: []*iampb.Binding{{Role: "roles/pubsub.viewer", Members: []string{"user:bob@example.com"}}}}})
	wantCode(t, err, codes.Aborted, "concurrent policy changes")
	// Without an etag the policy is overwritten blindly; an update mask changes only its paths.
	set, err := ic.SetIamPolicy(ctx, &iampb.SetIamPolicyRequest{Resource: sub, Policy: &iampb.Policy{
		Bindings: []*iampb.Binding{{Role: "roles/pubsub.subscriber", Members: []string{"serviceAccount:w@p.iam.gserviceaccount.com"}}}}})
	if err != nil || len(set.Etag) == 0 || set.Version != 1 {
		t.Fatalf("SetIamPolicy on the subscription = %v, %v", set, err)
	}
	masked, err := ic.SetIamPolicy(ctx, &iampb.SetIamPolicyRequest{Resource: sub, Policy: &iampb.Policy{Bindings: nil},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"etag"}}})
	if err != nil || len(masked.Bindings) != 1 {
		t.Fatalf("SetIamPolicy with mask [etag] = %v, %v; want the bindings kept", masked, err)
	}

	// Another replica (or this one after a restart) reads the same policies from the registry.
	addr2, _, stop2 := e.startReplica()
	defer stop2()
	got2, err := iamClient(t, addr2).GetIamPolicy(ctx, &iampb.GetIamPolicyRequest{Resource: topic})
	if err != nil || len(got2.Bindings) != 1 || got2.Bindings[0].Role != "roles/pubsub.publisher" {
		t.Fatalf("policy on another replica = %v, %v", got2, err)
	}

	// Conditions need version 3, both to set and to read.
	cond := &iampb.Policy{Bindings: []*iampb.Binding{{Role: "roles/pubsub.viewer", Members: []string{"group:g@example.com"},
		Condition: &expr.Expr{Expression: `request.time < timestamp("2030-01-01T00:00:00Z")`, Title: "until 2030"}}}}
	_, err = ic.SetIamPolicy(ctx, &iampb.SetIamPolicyRequest{Resource: topic, Policy: cond})
	wantCode(t, err, codes.InvalidArgument, "version 3")
	cond3 := proto.Clone(cond).(*iampb.Policy)
	cond3.Version = 3
	if _, err := ic.SetIamPolicy(ctx, &iampb.SetIamPolicyRequest{Resource: topic, Policy: cond3}); err != nil {
		t.Fatal(err)
	}
	_, err = ic.GetIamPolicy(ctx, &iampb.GetIamPolicyRequest{Resource: topic})
	wantCode(t, err, codes.InvalidArgument, "version 3")
	if p, err := ic.GetIamPolicy(ctx, &iampb.GetIamPolicyRequest{Resource: topic, Options: &iampb.GetPolicyOptions{RequestedPolicyVersion: 3}}); err != nil || p.Version != 3 {
		t.Fatalf("GetIamPolicy version 3 = %v, %v", p, err)
	}

	// Bad input.
	for _, bad := range []*iampb.Binding{
		{Role: "pubsub.publisher", Members: []string{"user:a@example.com"}},
		{Role: "roles/pubsub.publisher", Members: []string{"alice"}},
		{Role: "roles/pubsub.publisher"},
	} {
		_, err = ic.SetIamPolicy(ctx, &iampb.SetIamPolicyRequest{Resource: topic, Policy: &iampb.Policy{Bindings: []*iampb.Binding{bad}}})
		wantCode(t, err, codes.InvalidArgument, "")
	}
	_, err = ic.SetIamPolicy(ctx, &iampb.SetIamPolicyRequest{Resource: topic})
	wantCode(t, err, codes.InvalidArgument, "policy")

	// Missing resources, of every kind.
	for _, r := range []string{e.topicName("no-such"), e.subName("no-such"), "projects/" + e.project + "/snapshots/no-such",
		"projects/" + e.project + "/schemas/no-such"} {
		_, err = ic.GetIamPolicy(ctx, &iampb.GetIamPolicyRequest{Resource: r})
		wantCode(t, err, codes.NotFound, "Resource not found")
		_, err = ic.TestIamPermissions(ctx, &iampb.TestIamPermissionsRequest{Resource: r, Permissions: []string{"pubsub.topics.get"}})
		wantCode(t, err, codes.NotFound, "")
	}
	_, err = ic.GetIamPolicy(ctx, &iampb.GetIamPolicyRequest{Resource: "not-a-name"})
	wantCode(t, err, codes.InvalidArgument, "")

	// TestIamPermissions: every valid permission is held; wildcards are refused.
	perms := []string{"pubsub.topics.publish", "pubsub.topics.get"}
	tp, err := ic.TestIamPermissions(ctx, &iampb.TestIamPermissionsRequest{Resource: topic, Permissions: perms})
	if err != nil || len(tp.Permissions) != 2 {
		t.Fatalf("TestIamPermissions = %v, %v", tp, err)
	}
	_, err = ic.TestIamPermissions(ctx, &iampb.TestIamPermissionsRequest{Resource: topic, Permissions: []string{"pubsub.*"}})
	wantCode(t, err, codes.InvalidArgument, "wildcards")

	// A topic deleted and created again has an empty policy.
	if err := c.TopicAdminClient.DeleteTopic(ctx, &pubsubpb.DeleteTopicRequest{Topic: topic}); err != nil {
		t.Fatal(err)
	}
	_, err = ic.GetIamPolicy(ctx, &iampb.GetIamPolicyRequest{Resource: topic})
	wantCode(t, err, codes.NotFound, "")
	if _, err := c.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: topic}); err != nil {
		t.Fatal(err)
	}
	if p, err := ic.GetIamPolicy(ctx, &iampb.GetIamPolicyRequest{Resource: topic}); err != nil || len(p.Bindings) != 0 {
		t.Fatalf("policy of the new topic = %v, %v; want empty", p, err)
	}
}

// TestIAMEtagAcrossReplicas: two replicas setting one policy with the same etag at once: one
// succeeds, the other answers ABORTED, and both then return the winner's policy.
func TestIAMEtagAcrossReplicas(t *testing.T) {
	e := startEnv(t)
	ctx := ctxT(t, 3*time.Minute)
	tid := e.id("t")
	e.createTopic(ctx, tid)
	res := e.topicName(tid)
	addr2, _, stop2 := e.startReplica()
	defer stop2()
	ics := []iampb.IAMPolicyClient{iamClient(t, e.addr), iamClient(t, addr2)}
	for round := range 5 {
		cur, err := ics[0].GetIamPolicy(ctx, &iampb.GetIamPolicyRequest{Resource: res})
		if err != nil {
			t.Fatal(err)
		}
		// The second replica has seen the same policy (it reads the registry live).
		for deadline := time.Now().Add(10 * time.Second); ; {
			p2, err := ics[1].GetIamPolicy(ctx, &iampb.GetIamPolicyRequest{Resource: res})
			if err != nil {
				t.Fatal(err)
			}
			if string(p2.Etag) == string(cur.Etag) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: the replicas disagree on the etag", round)
			}
			time.Sleep(10 * time.Millisecond)
		}
		type answer struct {
			who int
			pol *iampb.Policy
			err error
		}
		answers := make(chan answer, 2)
		for i, ic := range ics {
			go func() {
				pol := &iampb.Policy{Etag: cur.Etag, Bindings: []*iampb.Binding{{Role: "roles/pubsub.viewer", Members: []string{fmt.Sprintf("user:r%d-%d@example.com", round, i)}}}}
				got, err := ic.SetIamPolicy(ctx, &iampb.SetIamPolicyRequest{Resource: res, Policy: pol})
				answers <- answer{i, got, err}
			}()
		}
		var won *iampb.Policy
		for range 2 {
			a := <-answers
			switch status.Code(a.err) {
			case codes.OK:
				if won != nil {
					t.Fatalf("round %d: both replicas accepted etag %x", round, cur.Etag)
				}
				won = a.pol
			case codes.Aborted:
			default:
				t.Fatalf("round %d: replica %d: %v", round, a.who, a.err)
			}
		}
		if won == nil {
			t.Fatalf("round %d: neither replica accepted the current etag", round)
		}
		for i, ic := range ics {
			got, err := ic.GetIamPolicy(ctx, &iampb.GetIamPolicyRequest{Resource: res})
			if err != nil || string(got.Etag) != string(won.Etag) || got.Bindings[0].Members[0] != won.Bindings[0].Members[0] {
				t.Fatalf("round %d: replica %d returns %v %v, want the winner's %v", round, i, got, err, won)
			}
		}
	}
}
