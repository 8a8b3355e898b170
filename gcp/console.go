package gcp

import "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

// The accessors the proxy's web console uses for its topic listing and admin actions.

// TopicIDs lists the topics' ids (topics are one namespace whatever the project; a name of any
// project reaches them), sorted.
func (s *Server) TopicIDs() []string { return s.cat.topicIDs() }

// Publisher is the Publisher service's handler for in-process callers. Calls skip the gRPC
// interceptors (the readiness gate, logging and the RPC metrics): the caller checks readiness
// and authorizes.
func (s *Server) Publisher() pubsubpb.PublisherServer { return &publisher{s: s} }

// Subscriber is the Subscriber service's handler for in-process callers, as Publisher.
func (s *Server) Subscriber() pubsubpb.SubscriberServer { return &subscriber{s: s} }
