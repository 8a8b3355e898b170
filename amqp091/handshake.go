package amqp091

import (
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/kubemq-io/kubemq-proxy/amqp091/wire"
	"github.com/kubemq-io/kubemq-proxy/kubemqclient"
)

// readMethod reads the next method frame on channel 0 during the
// handshake, skipping heartbeats.
func (c *conn) readMethod() (wire.Method, error) {
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			return nil, err
		}
		switch {
		case f.Type == wire.FrameHeartbeat:
			continue
		case f.Type != wire.FrameMethod || f.Channel != 0:
			return nil, wire.CommandInvalid("%s before the connection was open", f)
		}
		return wire.DecodeMethod(f.Payload)
	}
}

func (c *conn) serverProperties() wire.Table {
	o := &c.srv.opts
	caps := wire.Table{
		"publisher_confirms":           true,
		"exchange_exchange_bindings":   true,
		"basic.nack":                   true,
		"consumer_cancel_notify":       true,
		"authentication_failure_close": true,
		"per_consumer_qos":             true,
		"consumer_priorities":          true,
		"direct_reply_to":              true,
	}
	if o.MaxPendingPublishBytes > 0 {
		caps["connection.blocked"] = true
	}
	return wire.Table{
		"product":      o.Product,
		"version":      o.Version,
		"platform":     "Go",
		"cluster_name": o.ClusterName,
		"copyright":    "kubemq-proxy contributors",
		"information":  "kubemq-proxy: AMQP 0-9-1 front-end storing every message in KubeMQ",
		// Only what the proxy honours: connection.blocked only while a
		// pending publish bound can make it block.
		"capabilities": caps,
	}
}

func (c *conn) handshake(hw *wire.FrameWriter) error {
	o := &c.srv.opts
	write := func(m wire.Method) error {
		if err := hw.WriteMethod(0, m); err != nil {
			return err
		}
		return hw.Flush()
	}
	if err := write(&wire.ConnectionStart{VersionMajor: 0, VersionMinor: 9, ServerProperties: c.serverProperties(),
		Mechanisms: c.mechanismsFor(), Locales: "en_US"}); err != nil {
		return err
	}
	m, err := c.readMethod()
	if err != nil {
		return err
	}
	so, ok := m.(*wire.ConnectionStartOk)
	if !ok {
		return wire.CommandInvalid("expected 'connection.start_ok', got '%s'", m.Name())
	}
	caps, _ := so.ClientProperties["capabilities"].(wire.Table)
	c.cancelNotify, _ = caps["consumer_cancel_notify"].(bool)
	c.blockNotify, _ = caps["connection.blocked"].(bool)
	authFailureClose, _ := caps["authentication_failure_close"].(bool)
	c.clientName, _ = so.ClientProperties["connection_name"].(string)
	if c.clientName == "" {
		c.clientName, _ = so.ClientProperties["product"].(string)
	}
	l, err := c.parseStartOk(so.Mechanism, so.Response)
	if err != nil {
		return err
	}
	user := l.user
	allowed, why := c.srv.users.allow(l), "wrong user name or password"
	if allowed && len(c.srv.users) == 0 && !l.external && !o.OpenLoginsFromAnywhere && !loopbackPeer(c.nc.RemoteAddr()) {
		allowed, why = false, "no amqp.users are configured: open logins are accepted from loopback addresses only (set amqp.users, or amqp.open_logins_from_anywhere)"
	}
	if !allowed {
		c.log.Warn("login refused", zap.String("user", user), zap.String("mechanism", so.Mechanism), zap.String("reason", why))
		e := wire.AccessRefused("Login was refused using authentication mechanism %s. For details see the broker logfile.", so.Mechanism)
		e.Hard = true
		if !authFailureClose {
			// Clients without the capability expect the socket to drop.
			return fmt.Errorf("login refused for user %q", user)
		}
		return e
	}
	c.user = user
	if o.PasswordAsToken && !l.external {
		// Every KubeMQ call made for this connection carries its password
		// as the token (see Options.PasswordAsToken).
		c.ctx = kubemqclient.WithToken(c.ctx, l.password)
	}
	if err := write(&wire.ConnectionTune{ChannelMax: uint16(o.ChannelMax), FrameMax: uint32(o.FrameMax),
		Heartbeat: uint16(o.Heartbeat / time.Second)}); err != nil {
		return err
	}
	m, err = c.readMethod()
	if err != nil {
		return err
	}
	to, ok := m.(*wire.ConnectionTuneOk)
	if !ok {
		return wire.CommandInvalid("expected 'connection.tune_ok', got '%s'", m.Name())
	}
	if err := c.negotiate(to); err != nil {
		return err
	}
	m, err = c.readMethod()
	if err != nil {
		return err
	}
	op, ok := m.(*wire.ConnectionOpen)
	if !ok {
		return wire.CommandInvalid("expected 'connection.open', got '%s'", m.Name())
	}
	if !c.srv.vhostAllowed(op.VirtualHost) {
		return wire.NotAllowed("vhost %s not found", op.VirtualHost)
	}
	// KubeMQ unreachable: the connection opens and is then closed with 320
	// CONNECTION_FORCED at the client's first method (see refuseLater).
	// Every client reports that close as 320, while a close before tune
	// reads as a failed login (amqp091-go's 403, pika's
	// ProbableAuthenticationError) and one instead of open-ok as a vhost
	// refusal (streadway's 403, pika's ProbableAccessDeniedError, amqplib's
	// "Expected ConnectionOpenOk"): reconnect loops give up on those.
	if err := c.srv.ready(); err != nil {
		c.log.Warn("refusing connection: KubeMQ unavailable", zap.Error(err))
		c.refuse = errBackendDown(err.Error())
	}
	c.vhostName = op.VirtualHost
	c.vh = c.srv.top.vhost(vhostKey(op.VirtualHost))
	return write(&wire.ConnectionOpenOk{})
}

// negotiate applies tune-ok as RabbitMQ does: 0 from the client means the
// server's value; more than the server offered, or a frame_max below the
// spec minimum, is refused.
func (c *conn) negotiate(to *wire.ConnectionTuneOk) error {
	o := &c.srv.opts
	fm := to.FrameMax
	switch {
	case fm == 0:
		fm = uint32(o.FrameMax)
	case fm < wire.FrameMinSize:
		return wire.NotAllowed("frame_max=%d < %d min size", fm, wire.FrameMinSize)
	case fm > uint32(o.FrameMax):
		return wire.NotAllowed("negotiated frame_max = %d is higher than the maximum allowed value (%d)", fm, o.FrameMax)
	}
	cm := to.ChannelMax
	switch {
	case cm == 0:
		cm = uint16(o.ChannelMax)
	case int(cm) > o.ChannelMax:
		return wire.NotAllowed("negotiated channel_max = %d is higher than the maximum allowed value (%d)", cm, o.ChannelMax)
	}
	c.frameMax, c.channelMax = fm, cm
	c.heartbeat = time.Duration(to.Heartbeat) * time.Second
	return nil
}

// closeDuringHandshake sends connection.close and waits briefly for close-ok.
func (c *conn) closeDuringHandshake(hw *wire.FrameWriter, e *wire.Error) {
	c.srv.m.closed(e.Code, "connection")
	c.nc.SetDeadline(time.Now().Add(closeOkTimeout))
	if hw.WriteMethod(0, e.CloseMethod()) != nil || hw.Flush() != nil {
		return
	}
	for {
		m, err := c.readMethod()
		if err != nil {
			return
		}
		if _, ok := m.(*wire.ConnectionCloseOk); ok {
			return
		}
	}
}
