// Package names owns the Pub/Sub v1 resource names: it parses
// "projects/{p}/topics/{t}", ".../subscriptions/{s}", ".../snapshots/{n}",
// ".../schemas/{n}[@{rev}]" and "projects/{p}" into typed values, validates
// them by Google's rules plus kubemq-proxy's own (topic ids may not begin
// with "sub."), and renders them back with String.
//
// Names are parsed once at the gRPC edge; later code works with the typed
// values and never splits strings. Every error is a gRPC status error with
// code INVALID_ARGUMENT and Google's text, so handlers can return it as is.
package names

import (
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// DeletedTopic is what Google reports as a subscription's topic once that
// topic has been deleted. It is not a resource name and never parses as one
// except through ParseTopicOrDeleted.
const DeletedTopic = "_deleted-topic_"

// ReservedTopicPrefix is kubemq-proxy's own restriction: topic t is stored in
// KubeMQ channel "gcp.{t}" and subscription s in "gcp.sub.{s}", so a topic id
// starting with "sub." would land in the subscription namespace.
const ReservedTopicPrefix = "sub."

// Bounds of a resource id (topic, subscription, snapshot, schema), as in the
// v1 proto comments.
const (
	MinIDLen = 3
	MaxIDLen = 255
)

// resourceNamesURL is where Google's own error text points.
const resourceNamesURL = "https://cloud.google.com/pubsub/docs/admin#resource_names"

// Collection segments in a resource name.
const (
	projectsSeg      = "projects"
	topicsSeg        = "topics"
	subscriptionsSeg = "subscriptions"
	snapshotsSeg     = "snapshots"
	schemasSeg       = "schemas"
)

// ProjectName is "projects/{ID}". The project is parsed and validated, then
// ignored by the proxy (single tenant, like Google's emulator).
type ProjectName struct {
	ID string
}

func (p ProjectName) String() string { return projectsSeg + "/" + p.ID }

// TopicName is "projects/{Project}/topics/{ID}", or the deleted-topic marker
// (see DeletedTopicName).
type TopicName struct {
	Project string
	ID      string
}

// DeletedTopicName is the value a subscription's topic takes after the topic
// is deleted; its String is DeletedTopic.
var DeletedTopicName = TopicName{ID: DeletedTopic}

// IsDeleted reports whether t is the deleted-topic marker.
func (t TopicName) IsDeleted() bool { return t.Project == "" && t.ID == DeletedTopic }

func (t TopicName) String() string {
	if t.IsDeleted() {
		return DeletedTopic
	}
	return join(t.Project, topicsSeg, t.ID)
}

// Parent is the topic's project.
func (t TopicName) Parent() ProjectName { return ProjectName{ID: t.Project} }

// SubscriptionName is "projects/{Project}/subscriptions/{ID}".
type SubscriptionName struct {
	Project string
	ID      string
}

func (s SubscriptionName) String() string { return join(s.Project, subscriptionsSeg, s.ID) }

// Parent is the subscription's project.
func (s SubscriptionName) Parent() ProjectName { return ProjectName{ID: s.Project} }

// SnapshotName is "projects/{Project}/snapshots/{ID}".
type SnapshotName struct {
	Project string
	ID      string
}

func (s SnapshotName) String() string { return join(s.Project, snapshotsSeg, s.ID) }

// Parent is the snapshot's project.
func (s SnapshotName) Parent() ProjectName { return ProjectName{ID: s.Project} }

// SchemaName is "projects/{Project}/schemas/{ID}", with "@{Revision}"
// appended when Revision is set (the form the revision RPCs use).
type SchemaName struct {
	Project  string
	ID       string
	Revision string
}

func (s SchemaName) String() string {
	n := join(s.Project, schemasSeg, s.ID)
	if s.Revision != "" {
		n += "@" + s.Revision
	}
	return n
}

// Parent is the schema's project.
func (s SchemaName) Parent() ProjectName { return ProjectName{ID: s.Project} }

// WithoutRevision is the schema itself, without a revision.
func (s SchemaName) WithoutRevision() SchemaName { return SchemaName{Project: s.Project, ID: s.ID} }

func join(project, collection, id string) string {
	return projectsSeg + "/" + project + "/" + collection + "/" + id
}

// ParseProject parses "projects/{p}".
func ParseProject(name string) (ProjectName, error) {
	rest, ok := strings.CutPrefix(name, projectsSeg+"/")
	if !ok || !validProject(rest) {
		return ProjectName{}, invalidName(name)
	}
	return ProjectName{ID: rest}, nil
}

// ParseTopic parses "projects/{p}/topics/{t}". Beyond Google's id rules, a
// topic id may not begin with ReservedTopicPrefix. The deleted-topic marker
// is rejected: it names no topic.
func ParseTopic(name string) (TopicName, error) {
	project, id, err := parse(name, topicsSeg)
	if err != nil {
		return TopicName{}, err
	}
	if strings.HasPrefix(id, ReservedTopicPrefix) {
		return TopicName{}, reservedTopic(name)
	}
	return TopicName{Project: project, ID: id}, nil
}

// ParseTopicOrDeleted is ParseTopic that also accepts DeletedTopic, for
// fields that may carry the marker (a subscription's topic).
func ParseTopicOrDeleted(name string) (TopicName, error) {
	if name == DeletedTopic {
		return DeletedTopicName, nil
	}
	return ParseTopic(name)
}

// ParseSubscription parses "projects/{p}/subscriptions/{s}".
func ParseSubscription(name string) (SubscriptionName, error) {
	project, id, err := parse(name, subscriptionsSeg)
	if err != nil {
		return SubscriptionName{}, err
	}
	return SubscriptionName{Project: project, ID: id}, nil
}

// ParseSnapshot parses "projects/{p}/snapshots/{n}".
func ParseSnapshot(name string) (SnapshotName, error) {
	project, id, err := parse(name, snapshotsSeg)
	if err != nil {
		return SnapshotName{}, err
	}
	return SnapshotName{Project: project, ID: id}, nil
}

// ParseSchema parses "projects/{p}/schemas/{n}" with no revision suffix.
func ParseSchema(name string) (SchemaName, error) {
	project, id, err := parse(name, schemasSeg)
	if err != nil {
		return SchemaName{}, err
	}
	return SchemaName{Project: project, ID: id}, nil
}

// ParseSchemaRevision parses "projects/{p}/schemas/{n}" with an optional
// "@{revision}" suffix, as GetSchema, DeleteSchemaRevision and
// ValidateMessage accept.
func ParseSchemaRevision(name string) (SchemaName, error) {
	base, rev, hasRev := strings.Cut(name, "@")
	if hasRev && !validRevision(rev) {
		return SchemaName{}, invalidName(name)
	}
	project, id, err := parse(base, schemasSeg)
	if err != nil {
		return SchemaName{}, invalidName(name)
	}
	return SchemaName{Project: project, ID: id, Revision: rev}, nil
}

// NewTopic builds a topic name from its parts, with ParseTopic's checks.
func NewTopic(project ProjectName, id string) (TopicName, error) {
	return ParseTopic(join(project.ID, topicsSeg, id))
}

// NewSubscription builds a subscription name from its parts.
func NewSubscription(project ProjectName, id string) (SubscriptionName, error) {
	return ParseSubscription(join(project.ID, subscriptionsSeg, id))
}

// NewSnapshot builds a snapshot name from its parts.
func NewSnapshot(project ProjectName, id string) (SnapshotName, error) {
	return ParseSnapshot(join(project.ID, snapshotsSeg, id))
}

// NewSchema builds a schema name from a parent and an id, as CreateSchema
// receives them (parent + schema_id).
func NewSchema(project ProjectName, id string) (SchemaName, error) {
	return ParseSchema(join(project.ID, schemasSeg, id))
}

// parse splits "projects/{p}/{collection}/{id}" and validates both parts.
func parse(name, collection string) (project, id string, err error) {
	rest, ok := strings.CutPrefix(name, projectsSeg+"/")
	if !ok {
		return "", "", invalidName(name)
	}
	project, rest, ok = strings.Cut(rest, "/")
	if !ok || !validProject(project) {
		return "", "", invalidName(name)
	}
	id, ok = strings.CutPrefix(rest, collection+"/")
	if !ok || !ValidID(id) {
		return "", "", invalidName(name)
	}
	return project, id, nil
}

// validProject is Google's loose project check: any non-empty segment.
func validProject(p string) bool {
	return p != "" && !strings.ContainsRune(p, '/')
}

// validRevision accepts what Google mints (short lowercase hex) and anything
// else that cannot be confused with a path: non-empty, no '/' or '@'.
func validRevision(r string) bool {
	return r != "" && len(r) <= MaxIDLen && !strings.ContainsAny(r, "/@")
}

// ValidID reports whether id satisfies Google's resource id rules: 3..255
// characters, starting with a letter, only [A-Za-z0-9-_.~+%], and not
// starting with "goog". The "goog" check is case-sensitive, as the proto
// comment states it; ids like "GoogleEvents" are legal.
func ValidID(id string) bool {
	if len(id) < MinIDLen || len(id) > MaxIDLen || !isLetter(id[0]) {
		return false
	}
	if strings.HasPrefix(id, "goog") {
		return false
	}
	for i := 1; i < len(id); i++ {
		c := id[i]
		if isLetter(c) || ('0' <= c && c <= '9') {
			continue
		}
		switch c {
		case '-', '_', '.', '~', '+', '%':
		default:
			return false
		}
	}
	return true
}

func isLetter(c byte) bool { return ('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z') }

// invalidName is Google's text for any malformed resource name.
func invalidName(name string) error {
	return status.Error(codes.InvalidArgument, fmt.Sprintf(
		"Invalid resource name given (name=%s). Refer to %s for more information.", name, resourceNamesURL))
}

// reservedTopic keeps Google's prefix so tooling that matches on it still
// does, then says why a name Google would accept is refused here.
func reservedTopic(name string) error {
	return status.Error(codes.InvalidArgument, fmt.Sprintf(
		"Invalid resource name given (name=%s). Topic ids starting with %q are reserved by kubemq-proxy.",
		name, ReservedTopicPrefix))
}
