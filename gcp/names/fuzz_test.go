package names

import (
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

var fuzzSeeds = []string{
	"projects/p/topics/abc",
	"projects/p/subscriptions/abc",
	"projects/p/snapshots/abc",
	"projects/p/schemas/abc",
	"projects/p/schemas/abc@1a2b",
	"projects/p",
	"projects/p/topics/sub.x",
	"projects//topics/abc",
	"projects/p/topics/goog",
	DeletedTopic,
	"",
	"projects/p/topics/a%2Fb",
}

// checkParse holds the properties every parser must have: no panic, errors
// are INVALID_ARGUMENT, and an accepted name renders back to itself.
func checkParse[N interface{ String() string }](t *testing.T, in string, parse func(string) (N, error)) {
	n, err := parse(in)
	if err != nil {
		if status.Code(err) != codes.InvalidArgument {
			t.Fatalf("%q: error %v is not INVALID_ARGUMENT", in, err)
		}
		return
	}
	if n.String() != in {
		t.Fatalf("%q: String() = %q", in, n.String())
	}
	again, err := parse(n.String())
	if err != nil || again.String() != in {
		t.Fatalf("%q: reparse = %v, %v", in, again, err)
	}
}

func fuzzParser[N interface{ String() string }](f *testing.F, parse func(string) (N, error)) {
	for _, s := range fuzzSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) { checkParse(t, in, parse) })
}

func FuzzParseProject(f *testing.F)      { fuzzParser(f, ParseProject) }
func FuzzParseTopic(f *testing.F)        { fuzzParser(f, ParseTopicOrDeleted) }
func FuzzParseSubscription(f *testing.F) { fuzzParser(f, ParseSubscription) }
func FuzzParseSnapshot(f *testing.F)     { fuzzParser(f, ParseSnapshot) }
func FuzzParseSchema(f *testing.F)       { fuzzParser(f, ParseSchemaRevision) }
