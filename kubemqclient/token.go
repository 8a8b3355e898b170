package kubemqclient

import (
	"context"

	"google.golang.org/grpc/metadata"
)

type tokenKey struct{}

// WithToken returns a context whose KubeMQ calls carry token as their
// "authorization" metadata instead of Options.AuthToken. The AMQP front-end
// uses it to pass a connection's password through as its KubeMQ token. A
// stream opened with such a context keeps the token for its lifetime; calls
// batched by the client on its own (PublishEvents) carry Options.AuthToken.
func WithToken(ctx context.Context, token string) context.Context {
	return context.WithValue(ctx, tokenKey{}, token)
}

// TokenFrom returns the token WithToken put in ctx.
func TokenFrom(ctx context.Context) (string, bool) {
	tok, ok := ctx.Value(tokenKey{}).(string)
	return tok, ok
}

// withAuthorization sets the call's "authorization" metadata: ctx's token
// if it has one, else def; the empty token sends none.
func withAuthorization(ctx context.Context, def string) context.Context {
	tok, ok := TokenFrom(ctx)
	if !ok {
		tok = def
	}
	if tok == "" {
		return ctx
	}
	md, _ := metadata.FromOutgoingContext(ctx)
	md = md.Copy()
	md.Set("authorization", tok)
	return metadata.NewOutgoingContext(ctx, md)
}
