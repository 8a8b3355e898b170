// Package kubemqpb holds the Go bindings of KubeMQ's public gRPC API,
// generated from kubemq.proto. Only kubemqclient and the embedded server
// import it.
package kubemqpb

//go:generate sh gen.sh
