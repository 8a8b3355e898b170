package embedded_test

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/kubemq-io/kubemq-proxy/kubemqpb"
)

func (e *env) publish(ch string, store bool, bodies ...string) []*pb.Result {
	e.t.Helper()
	var out []*pb.Result
	for _, b := range bodies {
		r, err := e.c.SendEvent(e.ctx, &pb.Event{ClientID: "pub", Channel: ch, Body: []byte(b), Store: store, Tags: map[string]string{"t": b}})
		if err != nil || !r.Sent {
			e.t.Fatalf("publish %q: %v %+v", b, err, r)
		}
		out = append(out, r)
	}
	return out
}

type sub struct {
	t      testing.TB
	s      pb.Kubemq_SubscribeToEventsClient
	cancel context.CancelFunc
}

func (e *env) subscribe(s *pb.Subscribe) (*sub, error) {
	ctx, cancel := context.WithCancel(e.ctx)
	st, err := e.c.SubscribeToEvents(ctx, s)
	if err != nil {
		cancel()
		return nil, err
	}
	e.t.Cleanup(cancel)
	// A subscription is active once the server has answered its headers.
	hdr, err := st.Header()
	if err == nil && len(hdr.Get("kubemq-subscribed")) == 0 {
		_, err = st.Recv()
	}
	if err != nil {
		cancel()
		return nil, err
	}
	return &sub{t: e.t, s: st, cancel: cancel}, nil
}

func (e *env) mustSubscribe(s *pb.Subscribe) *sub {
	e.t.Helper()
	x, err := e.subscribe(s)
	if err != nil {
		e.t.Fatalf("subscribe %+v: %v", s, err)
	}
	return x
}

func (s *sub) next(n int) string {
	s.t.Helper()
	var b []string
	for range n {
		ev, err := s.s.Recv()
		if err != nil {
			s.t.Fatalf("sub recv: %v", err)
		}
		b = append(b, fmt.Sprintf("%s@%d", ev.Body, ev.Sequence))
	}
	return strings.Join(b, ",")
}

func storeSub(client, ch, group string, mode pb.Subscribe_EventsStoreType, v int64) *pb.Subscribe {
	return &pb.Subscribe{SubscribeTypeData: pb.Subscribe_EventsStore, ClientID: client, Channel: ch, Group: group, EventsStoreTypeData: mode, EventsStoreTypeValue: v}
}

func TestEventsStorePublishAndStartModes(t *testing.T) {
	e := strictEnv(t)
	before := time.Now().UnixNano()
	res := e.publish("es", true, "a", "b", "c")
	if res[0].EventID == "" || len(res[0].EventID) != 22 {
		t.Fatalf("generated id %q", res[0].EventID)
	}
	cases := []struct {
		mode pb.Subscribe_EventsStoreType
		v    int64
		want string
	}{
		{pb.Subscribe_StartFromFirst, 0, "a@1,b@2,c@3,d@4"},
		{pb.Subscribe_StartFromLast, 0, "c@3,d@4"},
		{pb.Subscribe_StartAtSequence, 2, "b@2,c@3,d@4"},
		{pb.Subscribe_StartAtSequence, 99, "d@4"},
		{pb.Subscribe_StartAtTime, before, "a@1,b@2,c@3,d@4"},
		{pb.Subscribe_StartAtTime, time.Now().Add(time.Hour).UnixNano(), "d@4"},
		{pb.Subscribe_StartAtTimeDelta, 3600, "a@1,b@2,c@3,d@4"},
		{pb.Subscribe_StartNewOnly, 0, "d@4"},
	}
	var subs []*sub
	for i, c := range cases {
		subs = append(subs, e.mustSubscribe(storeSub(fmt.Sprintf("c%d", i), "es", "", c.mode, c.v)))
	}
	e.publish("es", true, "d")
	for i, c := range cases {
		n := strings.Count(c.want, ",") + 1
		if got := subs[i].next(n); got != c.want {
			t.Errorf("mode %v/%d: got %s want %s", c.mode, c.v, got, c.want)
		}
	}
	// Delivered fields.
	s := e.mustSubscribe(storeSub("fields", "es", "", pb.Subscribe_StartAtSequence, 1))
	ev, err := s.s.Recv()
	if err != nil || ev.EventID != res[0].EventID || ev.Channel != "es" || ev.Tags["t"] != "a" || ev.Timestamp < before || ev.Sequence != 1 {
		t.Fatalf("event %+v %v", ev, err)
	}
}

func TestEventsStoreDurableResumeAndClientIDInUse(t *testing.T) {
	e := strictEnv(t)
	e.publish("es", true, "r1", "r2")
	s := e.mustSubscribe(storeSub("dur", "es", "", pb.Subscribe_StartFromFirst, 0))
	if got := s.next(2); got != "r1@1,r2@2" {
		t.Fatal(got)
	}
	// The same ClientID cannot hold two events-store subscriptions, even on another channel.
	_, err := e.subscribe(storeSub("dur", "other", "", pb.Subscribe_StartFromFirst, 0))
	if status.Code(err) != codes.Internal || !strings.Contains(err.Error(), "stan: clientID already registered") {
		t.Fatalf("second subscription: %v", err)
	}
	s.cancel()
	// Only once the server has closed the old subscription is r3 not handed to it.
	e.waitReleased("dur")
	e.publish("es", true, "r3")
	// Re-subscribing with the same ClientID resumes and ignores the start mode. The probe's end is
	// seen by the server asynchronously, so retry while the id is still registered.
	var s2 *sub
	for {
		s2, err = e.subscribe(storeSub("dur", "es", "", pb.Subscribe_StartFromFirst, 0))
		if err == nil {
			break
		}
		if !strings.Contains(err.Error(), "already registered") {
			t.Fatal(err)
		}
		runtime.Gosched()
	}
	if got := s2.next(1); got != "r3@3" {
		t.Fatalf("resume got %s", got)
	}
}

func TestEventsStoreGroupRoundRobin(t *testing.T) {
	e := strictEnv(t)
	a := e.mustSubscribe(storeSub("m1", "g", "grp", pb.Subscribe_StartNewOnly, 0))
	b := e.mustSubscribe(storeSub("m2", "g", "grp", pb.Subscribe_StartNewOnly, 0))
	e.publish("g", true, "1", "2", "3", "4", "5", "6")
	got := a.next(3) + "," + b.next(3)
	for i := 1; i <= 6; i++ {
		if strings.Count(got, fmt.Sprintf("%d@", i)) != 1 {
			t.Fatalf("group delivery %s", got)
		}
	}
}

func TestEventsValidation(t *testing.T) {
	e := strictEnv(t)
	bad := []struct {
		ev   *pb.Event
		want string
	}{
		{&pb.Event{Channel: "a", Body: []byte("x")}, "Error 101"},
		{&pb.Event{ClientID: "c", Body: []byte("x")}, "Error 102"},
		{&pb.Event{ClientID: "c", Channel: "a.", Body: []byte("x")}, "Error 119"},
		{&pb.Event{ClientID: "c", Channel: "a b", Body: []byte("x")}, "Error 108"},
		{&pb.Event{ClientID: "c", Channel: "a.*", Body: []byte("x")}, "Error 107"},
		{&pb.Event{ClientID: "c", Channel: "a"}, "Error 110"},
		{&pb.Event{ClientID: "c", Channel: "a\tb", Body: []byte("x"), Store: true}, "Error 108"},
		{&pb.Event{ClientID: "c", Channel: "a..b", Body: []byte("x"), Store: true}, "empty token"},
		{&pb.Event{ClientID: "c", Channel: "a/b", Body: []byte("x"), Store: true}, "`/`"},
		{&pb.Event{ClientID: "c", Channel: strings.Repeat("x", 241), Body: []byte("x"), Store: true}, "longer than 240"},
	}
	for _, c := range bad {
		_, err := e.c.SendEvent(e.ctx, c.ev)
		if status.Code(err) != codes.Internal || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v want %s", c.ev, err, c.want)
		}
	}
	subs := []struct {
		s    *pb.Subscribe
		want string
	}{
		{&pb.Subscribe{SubscribeTypeData: pb.Subscribe_Commands, ClientID: "c", Channel: "a"}, "Error 207"},
		{&pb.Subscribe{SubscribeTypeData: pb.Subscribe_Events, Channel: "a"}, "Error 101"},
		{&pb.Subscribe{SubscribeTypeData: pb.Subscribe_Events, ClientID: "c", Channel: "a", EventsStoreTypeData: 1}, "Error 118"},
		{&pb.Subscribe{SubscribeTypeData: pb.Subscribe_EventsStore, ClientID: "c", Channel: "a"}, "Error 111"},
		{storeSub("c", "a.*", "", pb.Subscribe_StartFromFirst, 0), "Error 107"},
		{storeSub("c", "a", "", pb.Subscribe_StartAtSequence, 0), "Error 112"},
		{storeSub("c", "a", "", pb.Subscribe_StartAtTime, -1), "Error 113"},
		{storeSub("c", "a", "", pb.Subscribe_StartAtTimeDelta, 0), "Error 114"},
		{storeSub("c", "a", "g:x", pb.Subscribe_StartFromFirst, 0), "invalid group"},
	}
	for _, c := range subs {
		_, err := e.subscribe(c.s)
		if status.Code(err) != codes.Internal || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v want %s", c.s, err, c.want)
		}
	}
}

func TestPlainEventsWildcardsAndStream(t *testing.T) {
	e := strictEnv(t)
	star := e.mustSubscribe(&pb.Subscribe{SubscribeTypeData: pb.Subscribe_Events, ClientID: "s1", Channel: "a.*"})
	gt := e.mustSubscribe(&pb.Subscribe{SubscribeTypeData: pb.Subscribe_Events, ClientID: "s1", Channel: "a.>"})
	exact := e.mustSubscribe(&pb.Subscribe{SubscribeTypeData: pb.Subscribe_Events, ClientID: "s1", Channel: "a.b.c"})
	st, err := e.c.SendEventsStream(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range []*pb.Event{
		{ClientID: "p", Channel: "a.b", Body: []byte("1")},
		{ClientID: "p", Channel: "a.b.c", Body: []byte("2")},
		{ClientID: "p", Channel: "bad name", Body: []byte("3"), EventID: "bad"},
		{ClientID: "p", Channel: "es", Body: []byte("4"), Store: true, EventID: "st"},
	} {
		if err := st.Send(ev); err != nil {
			t.Fatal(err)
		}
	}
	// Only the error and the store event are answered, in order.
	r1, _ := st.Recv()
	r2, _ := st.Recv()
	if r1.EventID != "bad" || r1.Sent || !strings.Contains(r1.Error, "Error 108") || r2.EventID != "st" || !r2.Sent {
		t.Fatalf("stream results %+v %+v", r1, r2)
	}
	if got := star.next(1); got != "1@0" {
		t.Errorf("a.* got %s", got)
	}
	if got := gt.next(2); got != "1@0,2@0" {
		t.Errorf("a.> got %s", got)
	}
	if got := exact.next(1); got != "2@0" {
		t.Errorf("exact got %s", got)
	}
}

func TestEventOversize(t *testing.T) {
	e := newEnv(t, embeddedOpts(func(o *optsT) { o.MaxMessageBytes = 1 << 10 }))
	_, err := e.c.SendEvent(e.ctx, &pb.Event{ClientID: "c", Channel: "es", Store: true, Body: make([]byte, 2<<10)})
	if status.Code(err) != codes.Internal || !strings.Contains(err.Error(), "Error 110: invalid message, size 2048 bytes exceeds the limit of 1024 bytes") {
		t.Fatalf("oversize event: %v", err)
	}
}
