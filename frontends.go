package main

import (
	"github.com/kubemq-io/kubemq-proxy/gcp"
	"github.com/kubemq-io/kubemq-proxy/proxy"
)

// frontends lists the protocol front-ends compiled into the binary.
func frontends() []proxy.FrontendFactory {
	return []proxy.FrontendFactory{
		{
			Name:   "gcp",
			Listen: func(c *proxy.Config) []string { return []string{c.GCP.Listen} },
			New: func(d proxy.Deps) (proxy.Frontend, error) {
				return gcp.New(gcp.Options{
					Client:     d.Client,
					Registry:   d.Registry,
					Deliveries: d.Deliveries,
					Logger:     d.Logger.Named("gcp"),
					Metrics:    d.Metrics,
					Ready:      d.Ready,
					Config: gcp.Config{
						MaxMessageBytes:            d.Config.GCP.MaxMessageBytes,
						MaxInflightPerSubscription: d.Config.GCP.MaxInflightPerSubscription,
						MaxOutstandingMessages:     d.Config.GCP.MaxOutstandingMessages,
						StreamCloseAfter:           d.Config.GCP.StreamCloseAfter,
					},
				})
			},
		},
	}
}
