package gcp

import (
	"net"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// grpcUserTimeout is what grpc-go sets as TCP_USER_TIMEOUT on each server
// connection it accepts as a *net.TCPConn (its keepalive timeout, 20 s by
// default). A connection handed over by the splitter is wrapped, so grpc-go
// does not see the TCP connection and the splitter sets it instead.
const grpcUserTimeout = 20 * time.Second

func setGRPCSocketOptions(c net.Conn) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return
	}
	_ = raw.Control(func(fd uintptr) {
		_ = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(grpcUserTimeout/time.Millisecond))
	})
}
