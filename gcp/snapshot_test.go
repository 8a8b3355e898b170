package gcp_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"cloud.google.com/go/iam/apiv1/iampb"
	pubsubv1 "cloud.google.com/go/pubsub"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/kubemq-io/kubemq-proxy/gcp"
	"github.com/kubemq-io/kubemq-proxy/kubemqclient"
)

// snapTarget is one server the snapshot script runs against: the proxy or
// Google's emulator.
type snapTarget struct {
	t       *testing.T
	ctx     context.Context
	project string
	suffix  string
	pc      pubsubpb.PublisherClient
	sc      pubsubpb.SubscriberClient
	v1      *pubsubv1.Client
	obs     []string // what the script saw, step by step
}

func newSnapTarget(t *testing.T, addr, project, suffix string) *snapTarget {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx := ctxT(t, 4*time.Minute)
	v1, err := pubsubv1.NewClient(ctx, project, option.WithEndpoint(addr), option.WithoutAuthentication(),
		option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { v1.Close() })
	return &snapTarget{t: t, ctx: ctx, project: project, suffix: suffix,
		pc: pubsubpb.NewPublisherClient(conn), sc: pubsubpb.NewSubscriberClient(conn), v1: v1}
}

func (s *snapTarget) id(base string) string { return base + "-" + s.suffix }
func (s *snapTarget) topic(id string) string {
	return "projects/" + s.project + "/topics/" + s.id(id)
}
func (s *snapTarget) sub(id string) string {
	return "projects/" + s.project + "/subscriptions/" + s.id(id)
}
func (s *snapTarget) snap(id string) string {
	return "projects/" + s.project + "/snapshots/" + s.id(id)
}

// note records an observation; an error is recorded as its code.
func (s *snapTarget) note(step string, got string, err error) {
	if err != nil {
		got = "error " + status.Code(err).String()
	}
	s.obs = append(s.obs, step+": "+got)
}

func (s *snapTarget) must(err error) {
	s.t.Helper()
	if err != nil {
		s.t.Fatal(err)
	}
}

func (s *snapTarget) publish(topic string, data ...string) {
	s.t.Helper()
	var msgs []*pubsubpb.PubsubMessage
	for _, d := range data {
		m := &pubsubpb.PubsubMessage{Data: []byte(d)}
		if strings.HasSuffix(d, "k") {
			m.Attributes = map[string]string{"keep": "y"}
		}
		msgs = append(msgs, m)
	}
	_, err := s.pc.Publish(s.ctx, &pubsubpb.PublishRequest{Topic: s.topic(topic), Messages: msgs})
	s.must(err)
}

// pullN pulls until n messages are out (not acked), and returns them.
func (s *snapTarget) pullN(sub string, n int) []*pubsubpb.ReceivedMessage {
	s.t.Helper()
	var out []*pubsubpb.ReceivedMessage
	for deadline := time.Now().Add(30 * time.Second); len(out) < n; {
		if time.Now().After(deadline) {
			s.t.Fatalf("%s: %d of %d messages pulled", sub, len(out), n)
		}
		resp, err := s.sc.Pull(s.ctx, &pubsubpb.PullRequest{Subscription: s.sub(sub), MaxMessages: int32(n - len(out))})
		s.must(err)
		out = append(out, resp.ReceivedMessages...)
	}
	return out
}

// drain pulls and acks until nothing came for quiet; it returns the data
// received, in order of first arrival.
func (s *snapTarget) drain(sub string, quiet time.Duration) []string {
	s.t.Helper()
	return s.drainAtLeast(sub, 1, quiet)
}

// drainAtLeast is drain that waits up to 10 s for each of the first least
// messages rather than quiet: a delivery may wait on a lease record store
// the real KubeMQ left unanswered (sent again after 3 s; docs/kubemq.md
// 10.2), so a pause in a long replay does not mean it is over.
func (s *snapTarget) drainAtLeast(sub string, least int, quiet time.Duration) []string {
	s.t.Helper()
	var got []string
	last := time.Now()
	longWait := max(quiet, 10*time.Second)
	for deadline := time.Now().Add(60 * time.Second); time.Since(last) < quiet || len(got) < least && time.Since(last) < longWait; {
		if time.Now().After(deadline) {
			s.t.Fatalf("%s never went quiet: %v", sub, got)
		}
		pctx, cancel := context.WithTimeout(s.ctx, time.Second)
		resp, err := s.sc.Pull(pctx, &pubsubpb.PullRequest{Subscription: s.sub(sub), MaxMessages: 100})
		cancel()
		if err != nil {
			if s.ctx.Err() == nil && status.Code(err) == codes.DeadlineExceeded || errors.Is(err, context.DeadlineExceeded) {
				continue
			}
			s.t.Fatal(err)
		}
		var ids []string
		for _, m := range resp.ReceivedMessages {
			if !slices.Contains(got, string(m.Message.Data)) {
				got = append(got, string(m.Message.Data))
			}
			ids = append(ids, m.AckId)
		}
		if len(ids) > 0 {
			last = time.Now()
			_, err := s.sc.Acknowledge(s.ctx, &pubsubpb.AcknowledgeRequest{Subscription: s.sub(sub), AckIds: ids})
			s.must(err)
		}
	}
	return got
}

func sortedStr(xs []string) string {
	ys := slices.Clone(xs)
	sort.Strings(ys)
	return strings.Join(ys, ",")
}

func (s *snapTarget) seek(sub, snap string) error {
	_, err := s.sc.Seek(s.ctx, &pubsubpb.SeekRequest{Subscription: s.sub(sub), Target: &pubsubpb.SeekRequest_Snapshot{Snapshot: s.snap(snap)}})
	return err
}

func snapStr(sn *pubsubpb.Snapshot) string {
	if sn == nil {
		return ""
	}
	keys := make([]string, 0, len(sn.Labels))
	for k, v := range sn.Labels {
		keys = append(keys, k+"="+v)
	}
	sort.Strings(keys)
	return fmt.Sprintf("topic=%s labels=%v", sn.Topic, keys)
}

// run is the script; both servers must see the same.
func (s *snapTarget) run() {
	ctx, pc, sc := s.ctx, s.pc, s.sc
	for _, tp := range []string{"t", "t2"} {
		_, err := pc.CreateTopic(ctx, &pubsubpb.Topic{Name: s.topic(tp)})
		s.must(err)
	}
	for _, sub := range []*pubsubpb.Subscription{
		{Name: s.sub("a"), Topic: s.topic("t"), AckDeadlineSeconds: 60},
		{Name: s.sub("b"), Topic: s.topic("t")},
		{Name: s.sub("f"), Topic: s.topic("t"), Filter: "attributes:keep"},
		{Name: s.sub("x"), Topic: s.topic("t2")},
	} {
		_, err := sc.CreateSubscription(ctx, sub)
		s.must(err)
	}
	s.publish("t", "m0", "m1k", "m2", "m3k", "m4")
	// On a: m0 and m1k acked, m3k nacked (waiting again), m2 and m4 leased.
	out := s.pullN("a", 5)
	byData := map[string]string{}
	for _, m := range out {
		byData[string(m.Message.Data)] = m.AckId
	}
	_, err := sc.Acknowledge(ctx, &pubsubpb.AcknowledgeRequest{Subscription: s.sub("a"), AckIds: []string{byData["m0"], byData["m1k"]}})
	s.must(err)
	_, err = sc.ModifyAckDeadline(ctx, &pubsubpb.ModifyAckDeadlineRequest{Subscription: s.sub("a"), AckIds: []string{byData["m3k"]}})
	s.must(err)
	// b has nothing left.
	s.note("b before", sortedStr(s.drain("b", 2*time.Second)), nil)

	before := time.Now()
	sn, err := sc.CreateSnapshot(ctx, &pubsubpb.CreateSnapshotRequest{Name: s.snap("s1"), Subscription: s.sub("a"), Labels: map[string]string{"team": "x"}})
	s.note("create s1", snapStr(sn), err)
	if err == nil {
		exp := sn.ExpireTime.AsTime()
		ok := exp.After(before.Add(7*24*time.Hour-2*time.Minute)) && exp.Before(time.Now().Add(7*24*time.Hour+time.Minute))
		s.note("s1 expires in about 7 days", fmt.Sprint(ok), nil)
	}
	s.publish("t", "m5k", "m6")
	// a acknowledges everything it gets (the old leases too).
	_, _ = sc.Acknowledge(ctx, &pubsubpb.AcknowledgeRequest{Subscription: s.sub("a"), AckIds: []string{byData["m2"], byData["m4"]}})
	s.drain("a", 2*time.Second)

	s.note("seek a", "", s.seek("a", "s1"))
	s.note("a after seek", sortedStr(s.drain("a", 2*time.Second)), nil)
	s.note("seek b (snapshot of a)", "", s.seek("b", "s1"))
	s.note("b after seek", sortedStr(s.drain("b", 2*time.Second)), nil)
	s.note("seek f (filter)", "", s.seek("f", "s1"))
	s.note("f after seek", sortedStr(s.drain("f", 2*time.Second)), nil)
	// The v1 client's API for the same RPC.
	s.note("v1 seek a", "", s.v1.Subscription(s.id("a")).SeekToSnapshot(ctx, s.v1.Snapshot(s.id("s1"))))
	s.note("a after v1 seek", sortedStr(s.drain("a", 2*time.Second)), nil)

	s.note("seek x (other topic)", "", s.seek("x", "s1"))
	s.note("seek a to missing", "", s.seek("a", "nope"))
	_, err = sc.CreateSnapshot(ctx, &pubsubpb.CreateSnapshotRequest{Name: s.snap("s1"), Subscription: s.sub("b")})
	s.note("create s1 again", "", err)
	_, err = sc.CreateSnapshot(ctx, &pubsubpb.CreateSnapshotRequest{Name: s.snap("s9"), Subscription: s.sub("nope")})
	s.note("create of missing subscription", "", err)

	// A server-named snapshot (the v1 client's empty name).
	cfg, err := s.v1.Subscription(s.id("b")).CreateSnapshot(ctx, "")
	s.note("create server-named", "", err)
	_, err = sc.CreateSnapshot(ctx, &pubsubpb.CreateSnapshotRequest{Name: s.snap("s3"), Subscription: s.sub("x")})
	s.must(err)
	gs, err := sc.GetSnapshot(ctx, &pubsubpb.GetSnapshotRequest{Snapshot: s.snap("s1")})
	s.note("get s1", snapStr(gs), err)

	var listed []string
	pages := 0
	for tok := ""; ; {
		resp, err := sc.ListSnapshots(ctx, &pubsubpb.ListSnapshotsRequest{Project: "projects/" + s.project, PageSize: 1, PageToken: tok})
		s.must(err)
		pages++
		for _, sn := range resp.Snapshots {
			listed = append(listed, sn.Name)
		}
		if tok = resp.NextPageToken; tok == "" {
			break
		}
	}
	rename := func(n string) string {
		if cfg != nil && strings.HasSuffix(n, "/snapshots/"+cfg.ID()) {
			return "server-named"
		}
		return n
	}
	names := []string{}
	for _, n := range listed {
		names = append(names, rename(n))
	}
	s.note("list snapshots", fmt.Sprintf("%d %s", len(listed), sortedStr(names)), nil)
	var topicSnaps []string
	for tok := ""; ; {
		resp, err := pc.ListTopicSnapshots(ctx, &pubsubpb.ListTopicSnapshotsRequest{Topic: s.topic("t"), PageSize: 1, PageToken: tok})
		s.must(err)
		for _, n := range resp.Snapshots {
			topicSnaps = append(topicSnaps, rename(n))
		}
		if tok = resp.NextPageToken; tok == "" {
			break
		}
	}
	s.note("list topic snapshots", sortedStr(topicSnaps), nil)
	s.note("list pages of one", fmt.Sprint(pages >= 3), nil)
	_, err = pc.ListTopicSnapshots(ctx, &pubsubpb.ListTopicSnapshotsRequest{Topic: s.topic("nope")})
	s.note("list snapshots of a missing topic", "", err)

	up, err := sc.UpdateSnapshot(ctx, &pubsubpb.UpdateSnapshotRequest{
		Snapshot:   &pubsubpb.Snapshot{Name: s.snap("s1"), Labels: map[string]string{"team": "y", "env": "t"}},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"labels"}}})
	s.note("update labels", snapStr(up), err)
	want := time.Now().Add(24 * time.Hour).Truncate(time.Second)
	up, err = sc.UpdateSnapshot(ctx, &pubsubpb.UpdateSnapshotRequest{
		Snapshot:   &pubsubpb.Snapshot{Name: s.snap("s1"), ExpireTime: timestamppb.New(want)},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"expire_time"}}})
	s.note("update expire_time", fmt.Sprint(up.GetExpireTime().AsTime().Equal(want)), err)
	_, err = sc.UpdateSnapshot(ctx, &pubsubpb.UpdateSnapshotRequest{
		Snapshot:   &pubsubpb.Snapshot{Name: s.snap("s1"), Topic: s.topic("t2")},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"topic"}}})
	s.note("update topic", "", err)
	_, err = sc.UpdateSnapshot(ctx, &pubsubpb.UpdateSnapshotRequest{Snapshot: &pubsubpb.Snapshot{Name: s.snap("s1")}})
	s.note("update without mask", "", err)
	_, err = sc.UpdateSnapshot(ctx, &pubsubpb.UpdateSnapshotRequest{
		Snapshot:   &pubsubpb.Snapshot{Name: s.snap("nope"), Labels: map[string]string{"a": "b"}},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"labels"}}})
	s.note("update missing", "", err)

	del := func() error {
		_, err := sc.DeleteSnapshot(ctx, &pubsubpb.DeleteSnapshotRequest{Snapshot: s.snap("s1")})
		return err
	}
	s.note("delete s1", "", del())
	_, err = sc.GetSnapshot(ctx, &pubsubpb.GetSnapshotRequest{Snapshot: s.snap("s1")})
	s.note("get deleted", "", err)
	s.note("delete again", "", del())
	s.note("seek to deleted", "", s.seek("a", "s1"))
}

// snapshotScriptWant is what Google's documented semantics give for the
// script; the proxy must show exactly this, the emulator too except where
// emulatorDiffers says.
func snapshotScriptWant(s *snapTarget, emulator bool) []string {
	want := []string{
		"b before: m0,m1k,m2,m3k,m4",
		"create s1: topic=" + s.topic("t") + " labels=[team=x]",
		"s1 expires in about 7 days: true",
		"seek a: ",
		"a after seek: m2,m3k,m4,m5k,m6",
		"seek b (snapshot of a): ",
		"b after seek: m2,m3k,m4,m5k,m6",
		"seek f (filter): ",
		"f after seek: m3k,m5k",
		"v1 seek a: ",
		"a after v1 seek: m2,m3k,m4,m5k,m6",
		"seek x (other topic): error InvalidArgument",
		"seek a to missing: error NotFound",
		"create s1 again: error AlreadyExists",
		"create of missing subscription: error NotFound",
		"create server-named: ",
		"get s1: topic=" + s.topic("t") + " labels=[team=x]",
		"list snapshots: 3 " + sortedStr([]string{s.snap("s1"), s.snap("s3"), "server-named"}),
		"list topic snapshots: " + sortedStr([]string{s.snap("s1"), "server-named"}),
		"list pages of one: true",
		"list snapshots of a missing topic: error NotFound",
		"update labels: topic=" + s.topic("t") + " labels=[env=t team=y]",
		"update expire_time: true",
		"update topic: error InvalidArgument",
		"update without mask: error InvalidArgument",
		"update missing: error NotFound",
		"delete s1: ",
		"get deleted: error NotFound",
		"delete again: error NotFound",
		"seek to deleted: error NotFound",
	}
	if emulator {
		for i, w := range want {
			step, _, _ := strings.Cut(w, ": ")
			if got, ok := emulatorDiffers(s)[step]; ok {
				want[i] = step + ": " + got
			}
		}
	}
	return want
}

// emulatorDiffers is where Google's emulator departs from the service's
// documented behaviour (the proxy follows the documentation): it drops
// snapshot labels, ignores the subscription's filter when seeking,
// answers FAILED_PRECONDITION where the API documents INVALID_ARGUMENT for
// a snapshot of another topic, requires a snapshot name (the API lets the
// server pick one), lists the snapshots of a missing topic as none, and
// does not implement UpdateSnapshot.
func emulatorDiffers(s *snapTarget) map[string]string {
	return map[string]string{
		"create s1":                         "topic=" + s.topic("t") + " labels=[]",
		"f after seek":                      "m2,m3k,m4,m5k,m6",
		"seek x (other topic)":              "error FailedPrecondition",
		"create server-named":               "error InvalidArgument",
		"get s1":                            "topic=" + s.topic("t") + " labels=[]",
		"list snapshots":                    "2 " + sortedStr([]string{s.snap("s1"), s.snap("s3")}),
		"list topic snapshots":              s.snap("s1"),
		"list pages of one":                 "false",
		"list snapshots of a missing topic": "",
		"update labels":                     "error Unimplemented",
		"update expire_time":                "error Unimplemented",
		"update topic":                      "error Unimplemented",
		"update without mask":               "error Unimplemented",
		"update missing":                    "error Unimplemented",
	}
}

func checkSnapshotScript(t *testing.T, who string, s *snapTarget) {
	t.Helper()
	want := snapshotScriptWant(s, who == "emulator")
	if strings.Join(s.obs, "\n") != strings.Join(want, "\n") {
		t.Errorf("%s:\n got: %s\nwant: %s", who, strings.Join(s.obs, "\n      "), strings.Join(want, "\n      "))
	}
}

// TestSnapshotScript runs the snapshot script on the proxy.
func TestSnapshotScript(t *testing.T) {
	e := startEnv(t)
	s := newSnapTarget(t, e.addr, e.project, e.suffix)
	s.run()
	checkSnapshotScript(t, "proxy", s)
}

// TestSnapshotScriptEmulator runs the same script on Google's emulator,
// which implements snapshots: the expectations are checked against it.
func TestSnapshotScriptEmulator(t *testing.T) {
	addr := startPubSubEmulator(t)
	suffix := randSuffix()
	s := newSnapTarget(t, addr, "proj-"+suffix, suffix)
	s.run()
	checkSnapshotScript(t, "emulator", s)
}

// TestSnapshotOrderReplicasRestart: a seek to a snapshot delivers in
// publish order; messages published while a seek runs all arrive; the
// snapshot is seen by another replica and survives a restart; a backlog
// too old for a snapshot is refused and left as it was.
func TestSnapshotOrderReplicasRestart(t *testing.T) {
	e := startEnv(t)
	ctx := ctxT(t, 3*time.Minute)
	tid, sid := e.id("t"), e.id("s")
	e.createTopic(ctx, tid)
	e.createSub(ctx, &pubsubpb.Subscription{Name: e.subName(sid), Topic: e.topicName(tid)})
	s := newSnapTarget(t, e.addr, e.project, e.suffix)
	var first []string
	for i := range 40 {
		first = append(first, fmt.Sprintf("a%02d", i))
	}
	s.publish("t", first...)
	snap := s.snap("s")
	if _, err := s.sc.CreateSnapshot(ctx, &pubsubpb.CreateSnapshotRequest{Name: snap, Subscription: s.sub("s")}); err != nil {
		t.Fatal(err)
	}
	// The capture left the backlog as it was, in order.
	if got := s.drain("s", time.Second); strings.Join(got, ",") != strings.Join(first, ",") {
		t.Fatalf("after the snapshot: %v, want %v", got, first)
	}
	s.publish("t", "b0", "b1")
	s.drain("s", time.Second)

	// Seek while publishing: everything published after the snapshot
	// arrives, the seek's replay and the new copies alike.
	published := make(chan []string, 1)
	go func() {
		var names []string
		for i := range 30 {
			n := fmt.Sprintf("p%02d", i)
			if _, err := s.pc.Publish(ctx, &pubsubpb.PublishRequest{Topic: s.topic("t"), Messages: []*pubsubpb.PubsubMessage{{Data: []byte(n)}}}); err != nil {
				t.Error(err)
				break
			}
			names = append(names, n)
			time.Sleep(10 * time.Millisecond)
		}
		published <- names
	}()
	time.Sleep(50 * time.Millisecond)
	if err := s.seek("s", "s"); err != nil {
		t.Fatal(err)
	}
	ps := <-published
	got := s.drain("s", 2*time.Second)
	want := append(append(slices.Clone(first), "b0", "b1"), ps...)
	if sortedStr(got) != sortedStr(want) {
		t.Fatalf("after a seek while publishing: %v, want %v", got, want)
	}
	// The replay is in publish order: the snapshot's messages first.
	if strings.Join(got[:len(first)], ",") != strings.Join(first, ",") {
		t.Fatalf("replay out of order: %v", got)
	}

	// IAM on the snapshot: the policy set is the policy read, on another
	// replica too; a deleted snapshot's is NOT_FOUND (below).
	ic := iamClient(t, e.addr)
	pol := &iampb.Policy{Bindings: []*iampb.Binding{{Role: "roles/pubsub.viewer", Members: []string{"user:a@example.com"}}}}
	if _, err := ic.SetIamPolicy(ctx, &iampb.SetIamPolicyRequest{Resource: snap, Policy: pol}); err != nil {
		t.Fatal(err)
	}

	// Another replica sees it, and so does a restarted process.
	addr2, _, stop2 := e.startReplica()
	defer stop2()
	s2 := newSnapTarget(t, addr2, e.project, e.suffix)
	if _, err := s2.sc.GetSnapshot(ctx, &pubsubpb.GetSnapshotRequest{Snapshot: snap}); err != nil {
		t.Fatalf("replica: %v", err)
	}
	got2, err := iamClient(t, addr2).GetIamPolicy(ctx, &iampb.GetIamPolicyRequest{Resource: snap})
	if err != nil || len(got2.GetBindings()) != 1 || got2.Bindings[0].Role != "roles/pubsub.viewer" {
		t.Fatalf("snapshot policy on another replica: %v %v", got2, err)
	}
	stop2()
	e.stop()
	e.addr, e.srv, e.stop = e.startReplica()
	s = newSnapTarget(t, e.addr, e.project, e.suffix)
	if err := s.seek("s", "s"); err != nil {
		t.Fatal(err)
	}
	if got := s.drain("s", 2*time.Second); sortedStr(got) != sortedStr(want) {
		t.Fatalf("after a restart: %v, want %v", got, want)
	}

	if _, err := s.sc.DeleteSnapshot(ctx, &pubsubpb.DeleteSnapshotRequest{Snapshot: snap}); err != nil {
		t.Fatal(err)
	}
	_, err = iamClient(t, e.addr).GetIamPolicy(ctx, &iampb.GetIamPolicyRequest{Resource: snap})
	wantCode(t, err, codes.NotFound, "")

	// A message published 7 days ago (written natively with that publish
	// time) makes the snapshot expire within the hour: refused, and the
	// backlog is kept.
	e2 := e.id("old")
	e.createSub(ctx, &pubsubpb.Subscription{Name: e.subName(e2), Topic: e.topicName(tid)})
	old := time.Now().Add(-7*24*time.Hour + 30*time.Minute).UTC().Format(time.RFC3339Nano)
	if _, err := e.kc.SendQueueMessage(ctx, kubemqclient.QueueMessage{Channel: kubemqclient.Channel("gcp.sub", e2), Metadata: "pubsub",
		Body: []byte("old"), Tags: map[string]string{gcp.TagMessageID: "1", gcp.TagPublishTime: old, gcp.TagOrderingKey: ""}}); err != nil {
		t.Fatal(err)
	}
	_, err = s.sc.CreateSnapshot(ctx, &pubsubpb.CreateSnapshotRequest{Name: s.snap("old"), Subscription: s.sub("old")})
	wantCode(t, err, codes.FailedPrecondition, "too old")
	if got := s.drain("old", time.Second); strings.Join(got, ",") != "old" {
		t.Fatalf("backlog after a refused snapshot: %v", got)
	}
}
