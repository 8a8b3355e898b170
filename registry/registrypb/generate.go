// Package registrypb holds the Go bindings of the registry's peer service
// (registry.proto): how a replica that changed the topology waits until the
// other replicas have read the change. Only the registry package imports it.
package registrypb

//go:generate sh gen.sh
