package names

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// wantInvalid fails unless err is INVALID_ARGUMENT carrying Google's text for name.
func wantInvalid(t *testing.T, name string, err error) {
	t.Helper()
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.InvalidArgument {
		t.Fatalf("%q: got %v, want INVALID_ARGUMENT", name, err)
	}
	want := "Invalid resource name given (name=" + name + ")."
	if !strings.HasPrefix(st.Message(), want) {
		t.Fatalf("%q: message %q, want prefix %q", name, st.Message(), want)
	}
}

func TestValidID(t *testing.T) {
	long := "a" + strings.Repeat("b", MaxIDLen-1)
	cases := map[string]bool{
		"abc":            true,
		"ab":             false, // too short
		long:             true,
		long + "c":       false, // 256
		"A-_.~+%9":       true,
		"1abc":           false, // must start with a letter
		"_abc":           false,
		"-abc":           false,
		"goog":           false,
		"googly":         false,
		"Google-events":  true, // the goog rule is case-sensitive
		"gooG":           true,
		"go-og":          true,
		"abc/def":        false,
		"abc def":        false,
		"abc@def":        false,
		"ab\x00":         false,
		"héllo":          false,
		"my-topic.v1~x+": true,
		"":               false,
		"sub.reserved":   true, // ValidID is Google's rule only; ParseTopic adds ours
	}
	for id, want := range cases {
		if got := ValidID(id); got != want {
			t.Errorf("ValidID(%q) = %v, want %v", id, got, want)
		}
	}
}

func TestParseTopic(t *testing.T) {
	good := map[string]TopicName{
		"projects/p/topics/abc":                {Project: "p", ID: "abc"},
		"projects/my-proj-123/topics/t.1~x":    {Project: "my-proj-123", ID: "t.1~x"},
		"projects/example.com:proj/topics/t12": {Project: "example.com:proj", ID: "t12"},
		"projects/p/topics/subscriptions":      {Project: "p", ID: "subscriptions"},
		"projects/p/topics/sub-not-reserved":   {Project: "p", ID: "sub-not-reserved"},
		"projects/p/topics/Sub.caseMatters":    {Project: "p", ID: "Sub.caseMatters"},
	}
	for in, want := range good {
		got, err := ParseTopic(in)
		if err != nil {
			t.Fatalf("ParseTopic(%q): %v", in, err)
		}
		if got != want {
			t.Fatalf("ParseTopic(%q) = %+v, want %+v", in, got, want)
		}
		if got.String() != in {
			t.Fatalf("String() = %q, want %q", got.String(), in)
		}
		if got.Parent().String() != "projects/"+want.Project {
			t.Fatalf("Parent() = %q", got.Parent())
		}
	}
	bad := []string{
		"",
		"abc",
		"projects/p/topics/",
		"projects/p/topics/ab",
		"projects//topics/abc",
		"projects/p/topic/abc",
		"projects/p/subscriptions/abc",
		"projects/p/topics/abc/",
		"projects/p/topics/abc/extra",
		"/projects/p/topics/abc",
		"projects/p/topics/goog-x",
		"projects/p/topics/1abc",
		"projects/p/topics/a b c",
		"Projects/p/topics/abc",
		"projects/p",
		DeletedTopic,
	}
	for _, in := range bad {
		_, err := ParseTopic(in)
		wantInvalid(t, in, err)
	}
}

func TestParseTopicReservedPrefix(t *testing.T) {
	name := "projects/p/topics/sub.orders"
	_, err := ParseTopic(name)
	wantInvalid(t, name, err)
	if !strings.Contains(status.Convert(err).Message(), `"sub."`) {
		t.Fatalf("message does not say why: %q", status.Convert(err).Message())
	}
	// The same id is a legal subscription, snapshot and schema id.
	if _, err := ParseSubscription("projects/p/subscriptions/sub.orders"); err != nil {
		t.Fatal(err)
	}
	if _, err := NewTopic(ProjectName{ID: "p"}, "sub.x"); err == nil {
		t.Fatal("NewTopic accepted a reserved id")
	}
}

func TestDeletedTopic(t *testing.T) {
	got, err := ParseTopicOrDeleted(DeletedTopic)
	if err != nil {
		t.Fatal(err)
	}
	if !got.IsDeleted() || got.String() != DeletedTopic || got != DeletedTopicName {
		t.Fatalf("got %+v (%q)", got, got.String())
	}
	normal, err := ParseTopicOrDeleted("projects/p/topics/abc")
	if err != nil || normal.IsDeleted() {
		t.Fatalf("got %+v, %v", normal, err)
	}
	// A real topic that merely looks like the marker cannot exist: '_' is not a letter.
	_, err = ParseTopicOrDeleted("projects/p/topics/" + DeletedTopic)
	wantInvalid(t, "projects/p/topics/"+DeletedTopic, err)
}

func TestParseSubscriptionSnapshotSchema(t *testing.T) {
	sub, err := ParseSubscription("projects/p/subscriptions/s-1")
	if err != nil || sub != (SubscriptionName{Project: "p", ID: "s-1"}) || sub.String() != "projects/p/subscriptions/s-1" {
		t.Fatalf("%+v %v", sub, err)
	}
	snap, err := ParseSnapshot("projects/p/snapshots/snap")
	if err != nil || snap != (SnapshotName{Project: "p", ID: "snap"}) || snap.String() != "projects/p/snapshots/snap" {
		t.Fatalf("%+v %v", snap, err)
	}
	sch, err := ParseSchema("projects/p/schemas/avro1")
	if err != nil || sch != (SchemaName{Project: "p", ID: "avro1"}) || sch.String() != "projects/p/schemas/avro1" {
		t.Fatalf("%+v %v", sch, err)
	}
	for _, in := range []string{
		"projects/p/subscriptions/x",
		"projects/p/topics/abc", // wrong collection
		"projects/p/subscriptions/goog",
	} {
		_, err := ParseSubscription(in)
		wantInvalid(t, in, err)
	}
	for _, in := range []string{"projects/p/snapshots/", "projects/p/schemas/abc"} {
		_, err := ParseSnapshot(in)
		wantInvalid(t, in, err)
	}
	for _, in := range []string{"projects/p/schemas/abc@1a2b", "projects/p/snapshots/abc"} {
		_, err := ParseSchema(in)
		wantInvalid(t, in, err)
	}
}

func TestParseSchemaRevision(t *testing.T) {
	got, err := ParseSchemaRevision("projects/p/schemas/abc@1a2b3c4d")
	if err != nil {
		t.Fatal(err)
	}
	if got != (SchemaName{Project: "p", ID: "abc", Revision: "1a2b3c4d"}) || got.String() != "projects/p/schemas/abc@1a2b3c4d" {
		t.Fatalf("%+v %q", got, got.String())
	}
	if got.WithoutRevision().String() != "projects/p/schemas/abc" {
		t.Fatal(got.WithoutRevision())
	}
	plain, err := ParseSchemaRevision("projects/p/schemas/abc")
	if err != nil || plain.Revision != "" {
		t.Fatalf("%+v %v", plain, err)
	}
	for _, in := range []string{
		"projects/p/schemas/abc@",
		"projects/p/schemas/abc@a@b",
		"projects/p/schemas/abc@a/b",
		"projects/p/schemas/ab@1234",
	} {
		_, err := ParseSchemaRevision(in)
		wantInvalid(t, in, err)
	}
}

func TestParseProject(t *testing.T) {
	p, err := ParseProject("projects/my-project")
	if err != nil || p.ID != "my-project" || p.String() != "projects/my-project" {
		t.Fatalf("%+v %v", p, err)
	}
	for _, in := range []string{"", "projects/", "projects", "projects/a/b", "project/a", "projects/p/topics/abc"} {
		_, err := ParseProject(in)
		wantInvalid(t, in, err)
	}
}

func TestNewFromParts(t *testing.T) {
	p := ProjectName{ID: "p"}
	if s, err := NewSchema(p, "abc"); err != nil || s.String() != "projects/p/schemas/abc" {
		t.Fatalf("%v %v", s, err)
	}
	if s, err := NewSubscription(p, "abc"); err != nil || s.String() != "projects/p/subscriptions/abc" {
		t.Fatalf("%v %v", s, err)
	}
	if s, err := NewSnapshot(p, "abc"); err != nil || s.String() != "projects/p/snapshots/abc" {
		t.Fatalf("%v %v", s, err)
	}
	if _, err := NewSchema(p, "a/b/c"); err == nil {
		t.Fatal("NewSchema accepted a slash")
	}
	if _, err := NewTopic(ProjectName{ID: "a/b"}, "abc"); err == nil {
		t.Fatal("NewTopic accepted a bad project")
	}
}

// The exact text is Google's (seen in client issue reports); keep it stable.
func TestErrorText(t *testing.T) {
	_, err := ParseTopic("projects/p/topics/x")
	want := "Invalid resource name given (name=projects/p/topics/x). " +
		"Refer to https://cloud.google.com/pubsub/docs/admin#resource_names for more information."
	if got := status.Convert(err).Message(); got != want {
		t.Fatalf("got %q\nwant %q", got, want)
	}
}

func BenchmarkParseTopic(b *testing.B) {
	for b.Loop() {
		if _, err := ParseTopic("projects/my-project/topics/orders.v1"); err != nil {
			b.Fatal(err)
		}
	}
}
