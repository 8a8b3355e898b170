package amqp091

import (
	"sync"
	"time"

	"go.uber.org/zap"
)

// teardown ends a connection once its reader has stopped: it stops the
// channels (their unacked deliveries go back), deletes the exclusive queues
// the connection owned, lets the writer finish and closes the socket.
func (c *conn) teardown() {
	c.cancel()
	if !waitTimeout(&c.chWG, channelStopTimeout) {
		c.log.Warn("channels did not stop in time")
	}
	c.ownedMu.Lock()
	owned := make([]*queue, 0, len(c.owned))
	for q := range c.owned {
		owned = append(owned, q)
	}
	c.owned = nil
	c.ownedMu.Unlock()
	for _, q := range owned {
		c.srv.dropQueue(q, "exclusive owner closed", c.log)
	}
	if c.w != nil {
		c.w.finish(closeOkTimeout)
	}
	c.closeMu.Lock()
	handshook := c.handshook
	c.closeMu.Unlock()
	if handshook {
		c.lingerClose()
	}
	c.nc.Close()
	c.closeMu.Lock()
	reason := c.reason
	c.closeMu.Unlock()
	if c.w != nil {
		c.log.Info("connection closed", zap.String("reason", reason))
	} else {
		c.log.Debug("connection closed before it opened", zap.String("reason", reason))
	}
	c.srv.forget(c)
}

// lingerClose lets the peer close first after it closed the connection
// and was sent close-ok, as RabbitMQ does: it reads and discards what the
// peer still sends (frames written before it saw close-ok: publishes a
// client's writer queued behind its connection.close, the connection.close
// of a concurrent Close call) until the peer closes or closeOkTimeout
// passes. Closing a socket with unread data in it makes the kernel reset
// the connection, and the peer then loses the close-ok it had not read;
// ending our side first (a FIN) makes clients fail the close calls still
// waiting instead of ending them as closed.
func (c *conn) lingerClose() {
	c.nc.SetReadDeadline(time.Now().Add(closeOkTimeout))
	buf := make([]byte, 4096)
	for {
		if _, err := c.nc.Read(buf); err != nil {
			return
		}
	}
}

// waitTimeout waits for wg at most d; it reports whether wg finished.
func waitTimeout(wg *sync.WaitGroup, d time.Duration) bool {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}
