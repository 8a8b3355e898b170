package gcp_test

import "testing"

// TestNodeClientREST runs test/node-pubsub/rest.test.mjs: the official
// Node client with its REST transport (fallback: 'rest') against the REST
// API on the proxy's gRPC port. Same needs as TestNodeClient.
func TestNodeClientREST(t *testing.T) { runNodeTest(t, "rest.test.mjs", "PUBSUB_REST_ENDPOINT") }
