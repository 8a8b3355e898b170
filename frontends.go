package main

import "github.com/kubemq-io/kubemq-proxy/proxy"

// frontends lists the protocol front-ends compiled into the binary.
func frontends() []proxy.FrontendFactory {
	return nil
}
