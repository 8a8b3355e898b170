package main

import (
	"go.uber.org/zap"

	"github.com/kubemq-io/kubemq-proxy/amqp091"
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
				var peers gcp.Peers
				if d.Peers != nil {
					peers = d.Peers
				}
				return gcp.New(gcp.Options{
					Peers:      peers,
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
						RuntimeIdle:                d.Config.GCP.RuntimeIdle,
						PushMaxConcurrency:         d.Config.GCP.PushMaxConcurrency,
						PushMaxPerSubscription:     d.Config.GCP.PushMaxPerSubscription,
						PushConnectTimeout:         d.Config.GCP.PushConnectTimeout,
						PushAllowedHosts:           d.Config.GCP.PushAllowedHosts,
						PushOIDCKeyFile:            d.Config.GCP.PushOIDCKeyFile,
						DisableREST:                !d.Config.GCP.REST,
						MaxPendingPublishBytes:     pendingPublishBytes(d.Config.GCP.MaxPendingPublishBytes),
					},
				})
			},
		},
		{
			Name: "amqp",
			Listen: func(c *proxy.Config) []string {
				tlsAddr := ""
				if c.AMQPTLSEnabled() {
					tlsAddr = c.AMQP.TLSListen
				}
				return []string{c.AMQP.Listen, tlsAddr}
			},
			TLS:      func(c *proxy.Config) []bool { return []bool{false, true} },
			PeerFast: amqp091.PeerFast(), // the link's deliveries
			Management: func(c *proxy.Config) (string, string) {
				return c.AMQP.ManagementListen, "amqp.management_listen"
			},
			New: func(d proxy.Deps) (proxy.Frontend, error) {
				hb := d.Config.AMQP.Heartbeat
				if hb == 0 {
					hb = -1 // amqp091: negative disables heartbeats
				}
				switch {
				case len(d.Config.AMQP.Users) > 0:
					d.Logger.Info("amqp: logins checked against amqp.users", zap.Int("users", len(d.Config.AMQP.Users)))
				case d.Config.AMQP.OpenLoginsFromAnywhere:
					d.Logger.Warn("amqp: no amqp.users configured and open_logins_from_anywhere is on: any user name and password is accepted from any address")
				default:
					d.Logger.Info("amqp: no amqp.users configured: any user name and password is accepted from loopback addresses only")
				}
				var peers amqp091.Peers
				if d.Peers != nil {
					peers = d.Peers
				}
				var fleet amqp091.Fleet
				if d.Fleet != nil {
					fleet = d.Fleet
				}
				return amqp091.New(amqp091.Options{
					Peers:                  peers,
					Fleet:                  fleet,
					Client:                 d.Client,
					Registry:               d.Registry,
					Deliveries:             d.Deliveries,
					Logger:                 d.Logger.Named("amqp"),
					Metrics:                d.Metrics,
					Ready:                  d.Ready,
					Heartbeat:              hb,
					FrameMax:               d.Config.AMQP.FrameMax,
					ChannelMax:             d.Config.AMQP.ChannelMax,
					Users:                  d.Config.AMQP.Users,
					OpenLoginsFromAnywhere: d.Config.AMQP.OpenLoginsFromAnywhere,
					MaxBodySize:            d.Config.AMQP.MaxBodySize,
					MaxConnections:         d.Config.AMQP.MaxConnections,
					// amqp091 reads 0 as "its default" and a negative value
					// as "off"; the config's 0 means off.
					MaxPendingPublishBytes: zeroOff(int64(d.Config.AMQP.MaxPendingPublishBytes)),
					MetricsQueueLabels:     int(zeroOff(int64(d.Config.AMQP.MetricsQueueLabels))),
					// EXTERNAL is checked on the AMQPS listener, which verifies
					// client certificates against amqp.client_ca_file.
					External:        d.Config.AMQP.ClientCAFile != "",
					PasswordAsToken: d.Config.AMQP.PasswordAsKubeMQToken,
				})
			},
		},
	}
}

// zeroOff maps a config value where 0 means "off" to amqp091's convention
// (0 = default, negative = off).
func zeroOff(v int64) int64 {
	if v == 0 {
		return -1
	}
	return v
}

// pendingPublishBytes maps gcp.max_pending_publish_bytes (0: no bound) to
// gcp.Config's (0: the default, negative: no bound).
func pendingPublishBytes(n int) int64 {
	if n == 0 {
		return -1
	}
	return int64(n)
}
