package gcp

import (
	"context"

	"cloud.google.com/go/iam/apiv1/iampb"
)

// iamPolicy serves google.iam.v1.IAMPolicy permissively: there is no
// authentication in emulator mode, so every permission is granted and a
// set policy is echoed, not enforced (nor stored).
type iamPolicy struct {
	iampb.UnimplementedIAMPolicyServer
}

func (iamPolicy) GetIamPolicy(ctx context.Context, req *iampb.GetIamPolicyRequest) (*iampb.Policy, error) {
	return &iampb.Policy{Version: 3}, nil
}

func (iamPolicy) SetIamPolicy(ctx context.Context, req *iampb.SetIamPolicyRequest) (*iampb.Policy, error) {
	if req.GetPolicy() == nil {
		return &iampb.Policy{Version: 3}, nil
	}
	return req.GetPolicy(), nil
}

func (iamPolicy) TestIamPermissions(ctx context.Context, req *iampb.TestIamPermissionsRequest) (*iampb.TestIamPermissionsResponse, error) {
	return &iampb.TestIamPermissionsResponse{Permissions: req.GetPermissions()}, nil
}
