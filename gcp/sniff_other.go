//go:build !linux

package gcp

import "net"

// setGRPCSocketOptions: grpc-go sets TCP_USER_TIMEOUT on Linux only.
func setGRPCSocketOptions(net.Conn) {}
