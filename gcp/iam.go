package gcp

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"regexp"
	"strings"
	"time"

	"cloud.google.com/go/iam/apiv1/iampb"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/kubemq-io/kubemq-proxy/gcp/names"
	"github.com/kubemq-io/kubemq-proxy/registry"
)

// iamPolicy serves google.iam.v1.IAMPolicy for topics, subscriptions, snapshots and schemas as
// Google's service answers it, without enforcing anything: emulator mode has no
// authentication, so TestIamPermissions grants every permission asked about. Policies are
// registry records (kindIAM), shared by replicas and kept across restarts; a policy belongs to
// one incarnation of its resource (a topic deleted and created again starts with an empty
// policy, as on Google). A SetIamPolicy with an etag is a compare-and-set of the registry
// record (registry.PutIf): of two replicas setting one policy with the same etag at once, one
// succeeds and the other answers ABORTED.
type iamPolicy struct {
	iampb.UnimplementedIAMPolicyServer
	s *Server
}

// kindIAM is the registry kind of IAM policies; the key is the resource's collection and id
// ("topics/t", "subscriptions/s", "schemas/x").
const kindIAM = "gcp.iam"

// iamRecord is the stored form of a policy: the incarnation of the resource it belongs to and
// the policy (protojson), etag included.
type iamRecord struct {
	UID    string          `json:"uid"`
	Policy json.RawMessage `json:"policy"`
}

type iamEntry struct {
	uid    string
	policy *iampb.Policy
}

// emptyEtag is the etag Google gives a resource's policy that was never set ("ACAB").
var emptyEtag = []byte{0x00, 0x20, 0x01}

func (c *catalog) applyIAMLocked(r record) {
	if r.Deleted {
		delete(c.iam, r.Key)
		return
	}
	var rec iamRecord
	p := &iampb.Policy{}
	if err := json.Unmarshal(r.Value, &rec); err == nil {
		err = protojson.Unmarshal(rec.Policy, p)
		if err == nil {
			c.iam[r.Key] = &iamEntry{uid: rec.UID, policy: p}
			return
		}
	}
	c.log.Error("undecodable IAM policy record; ignored", zap.String("resource", r.Key))
}

// iamPolicyOf returns the stored policy of the resource incarnation (key, uid), or nil.
func (c *catalog) iamPolicyOf(key, uid string) *iampb.Policy {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if e, ok := c.iam[key]; ok && e.uid == uid {
		return proto.Clone(e.policy).(*iampb.Policy)
	}
	return nil
}

// iamResource resolves a resource name to its registry key and current incarnation.
func (p iamPolicy) iamResource(name string) (key, uid string, err error) {
	switch {
	case name == "":
		return "", "", status.Error(codes.InvalidArgument, "resource is required")
	case strings.Contains(name, "/topics/"):
		tn, err := names.ParseTopic(name)
		if err != nil {
			return "", "", status.Error(codes.InvalidArgument, err.Error())
		}
		e, ok := p.s.cat.topic(tn.ID)
		if !ok {
			return "", "", notFound(tn.ID)
		}
		return "topics/" + tn.ID, e.uid, nil
	case strings.Contains(name, "/subscriptions/"):
		sn, err := names.ParseSubscription(name)
		if err != nil {
			return "", "", status.Error(codes.InvalidArgument, err.Error())
		}
		e, ok := p.s.cat.sub(sn.ID)
		if !ok {
			return "", "", notFound(sn.ID)
		}
		return "subscriptions/" + sn.ID, e.uid, nil
	case strings.Contains(name, "/schemas/"):
		sn, err := names.ParseSchema(name)
		if err != nil {
			return "", "", status.Error(codes.InvalidArgument, err.Error())
		}
		e, ok := p.s.cat.schema(sn.ID)
		if !ok {
			return "", "", notFound(sn.ID)
		}
		return "schemas/" + sn.ID, e.uid, nil
	case strings.Contains(name, "/snapshots/"):
		sn, err := names.ParseSnapshot(name)
		if err != nil {
			return "", "", status.Error(codes.InvalidArgument, err.Error())
		}
		e, ok := p.s.cat.snapshot(sn.ID, time.Now())
		if !ok {
			return "", "", notFound(sn.ID)
		}
		return "snapshots/" + sn.ID, e.rec.UID, nil
	}
	return "", "", status.Errorf(codes.InvalidArgument, "Invalid resource name given (name=%s).", name)
}

func (p iamPolicy) current(key, uid string) *iampb.Policy {
	if pol := p.s.cat.iamPolicyOf(key, uid); pol != nil {
		return pol
	}
	return &iampb.Policy{Etag: emptyEtag}
}

func (p iamPolicy) GetIamPolicy(ctx context.Context, req *iampb.GetIamPolicyRequest) (*iampb.Policy, error) {
	key, uid, err := p.iamResource(req.GetResource())
	if err != nil {
		return nil, err
	}
	v := req.GetOptions().GetRequestedPolicyVersion()
	if v != 0 && v != 1 && v != 3 {
		return nil, status.Errorf(codes.InvalidArgument, "Invalid requested policy version %d: valid versions are 0, 1 and 3.", v)
	}
	pol := p.current(key, uid)
	if hasConditions(pol) && v < 3 {
		return nil, status.Error(codes.InvalidArgument, "The policy has conditional role bindings: request policy version 3.")
	}
	return pol, nil
}

func (p iamPolicy) SetIamPolicy(ctx context.Context, req *iampb.SetIamPolicyRequest) (*iampb.Policy, error) {
	key, uid, err := p.iamResource(req.GetResource())
	if err != nil {
		return nil, err
	}
	if req.GetPolicy() == nil {
		return nil, status.Error(codes.InvalidArgument, "policy is required")
	}
	// The record's version is read before the policy: a write landing in
	// between makes the compare-and-set below fail, never pass wrongly.
	base := p.s.topo.baseOf(kindIAM, key)
	cur := p.current(key, uid)
	next := proto.Clone(req.GetPolicy()).(*iampb.Policy)
	if paths := req.GetUpdateMask().GetPaths(); len(paths) > 0 {
		// Only the named fields of the policy change; the rest stay as stored.
		merged := proto.Clone(cur).(*iampb.Policy)
		for _, path := range paths {
			switch path {
			case "bindings":
				merged.Bindings = next.Bindings
			case "etag":
				merged.Etag = next.Etag
			case "audit_configs":
				merged.AuditConfigs = next.AuditConfigs
			case "version":
				merged.Version = next.Version
			default:
				return nil, status.Errorf(codes.InvalidArgument, "Invalid update_mask path %q: allowed are bindings, etag, audit_configs and version.", path)
			}
		}
		next = merged
	}
	if err := validPolicy(next); err != nil {
		return nil, err
	}
	conditional := len(req.GetPolicy().GetEtag()) > 0
	if conditional && string(req.GetPolicy().GetEtag()) != string(cur.GetEtag()) {
		return nil, errConcurrentPolicy
	}
	next.Version = 1
	if hasConditions(next) {
		next.Version = 3
	}
	next.Etag = make([]byte, 8)
	_, _ = rand.Read(next.Etag)
	raw, err := protojson.Marshal(next)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	rec := iamRecord{UID: uid, Policy: raw}
	if conditional {
		err = p.s.topo.putIf(ctx, kindIAM, key, rec, base)
		if errors.Is(err, registry.ErrConflict) {
			return nil, errConcurrentPolicy
		}
	} else {
		err = p.s.topo.Put(ctx, kindIAM, key, rec)
	}
	if err != nil {
		return nil, toStatus(err)
	}
	return next, nil
}

// errConcurrentPolicy is Google's answer to a SetIamPolicy whose etag is not the policy's.
var errConcurrentPolicy = status.Error(codes.Aborted, "There were concurrent policy changes. Please retry the whole read-modify-write with exponential backoff.")

func (p iamPolicy) TestIamPermissions(ctx context.Context, req *iampb.TestIamPermissionsRequest) (*iampb.TestIamPermissionsResponse, error) {
	if _, _, err := p.iamResource(req.GetResource()); err != nil {
		return nil, err
	}
	for _, perm := range req.GetPermissions() {
		if strings.Contains(perm, "*") {
			return nil, status.Errorf(codes.InvalidArgument, "Permissions with wildcards (*) are not allowed in TestIamPermissions (permission=%s).", perm)
		}
		if !permissionRE.MatchString(perm) {
			return nil, status.Errorf(codes.InvalidArgument, "Invalid permission %q: expected service.resource.verb.", perm)
		}
	}
	// Nothing is enforced in emulator mode: every permission asked about is held.
	return &iampb.TestIamPermissionsResponse{Permissions: req.GetPermissions()}, nil
}

var (
	permissionRE = regexp.MustCompile(`^[a-z][a-zA-Z0-9]*\.[a-zA-Z0-9]+\.[a-zA-Z0-9]+$`)
	roleRE       = regexp.MustCompile(`^(roles/[a-zA-Z0-9_.]+|(projects|organizations)/[^/]+/roles/[a-zA-Z0-9_.]+)$`)
	memberKinds  = []string{"user:", "serviceAccount:", "group:", "domain:", "principal:", "principalSet:",
		"deleted:user:", "deleted:serviceAccount:", "deleted:group:", "projectOwner:", "projectEditor:", "projectViewer:"}
)

func hasConditions(p *iampb.Policy) bool {
	for _, b := range p.GetBindings() {
		if b.GetCondition() != nil {
			return true
		}
	}
	return false
}

// validPolicy checks what Google's IAM refuses with INVALID_ARGUMENT: an unknown policy
// version, conditions below version 3, roles and members that are not names of their kind.
func validPolicy(p *iampb.Policy) error {
	switch v := p.GetVersion(); {
	case v != 0 && v != 1 && v != 3:
		return status.Errorf(codes.InvalidArgument, "Invalid policy version %d: valid versions are 0, 1 and 3.", v)
	case hasConditions(p) && v != 3:
		return status.Error(codes.InvalidArgument, "Policies with conditional role bindings must set version 3.")
	}
	for _, b := range p.GetBindings() {
		if !roleRE.MatchString(b.GetRole()) {
			return status.Errorf(codes.InvalidArgument, "Role (%s) does not exist in the resource's hierarchy.", b.GetRole())
		}
		if len(b.GetMembers()) == 0 {
			return status.Errorf(codes.InvalidArgument, "The binding of role %s has no members.", b.GetRole())
		}
		for _, m := range b.GetMembers() {
			if !validMember(m) {
				return status.Errorf(codes.InvalidArgument, "Invalid member: %s.", m)
			}
		}
	}
	return nil
}

func validMember(m string) bool {
	if m == "allUsers" || m == "allAuthenticatedUsers" {
		return true
	}
	for _, k := range memberKinds {
		if rest, ok := strings.CutPrefix(m, k); ok {
			return rest != ""
		}
	}
	return false
}
