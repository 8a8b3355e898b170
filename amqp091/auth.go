package amqp091

import (
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net"
	"strings"

	"github.com/kubemq-io/kubemq-proxy/amqp091/wire"
)

// mechanisms is what connection.start offers, in RabbitMQ's order;
// EXTERNAL is added in front for a TLS peer with a verified certificate
// when Options.External is on (see mechanismsFor).
const mechanisms = "AMQPLAIN PLAIN"

// login is a parsed connection.start-ok response.
type login struct {
	user, password string
	external       bool // EXTERNAL: user is the certificate's CN, no password
}

// peerCN is the common name of the peer's verified TLS certificate.
func (c *conn) peerCN() (string, bool) {
	tc, ok := c.nc.(*tls.Conn)
	if !ok {
		return "", false
	}
	// The handshake ran on the first read (the protocol header); the
	// listener's ClientCAs verified the chain when a certificate was sent.
	st := tc.ConnectionState()
	if len(st.VerifiedChains) == 0 || len(st.VerifiedChains[0]) == 0 {
		return "", false
	}
	return st.VerifiedChains[0][0].Subject.CommonName, true
}

// mechanismsFor is connection.start's list for c. Like RabbitMQ's
// rabbitmq_auth_mechanism_ssl, EXTERNAL is offered only to a peer that
// presented a verified certificate.
func (c *conn) mechanismsFor() string {
	if c.srv.opts.External {
		if _, ok := c.peerCN(); ok {
			return "EXTERNAL " + mechanisms
		}
	}
	return mechanisms
}

// parseStartOk reads the client's choice of mechanism and its response.
// A mechanism that was not offered is a connection error, with RabbitMQ's
// texts: "unknown" when EXTERNAL is not configured at all, "invalid" when
// it is but this peer has no verified certificate.
func (c *conn) parseStartOk(mechanism, response string) (login, error) {
	if mechanism == "EXTERNAL" && c.srv.opts.External {
		cn, ok := c.peerCN()
		if !ok {
			return login{}, wire.CommandInvalid("invalid authentication mechanism '%s'", mechanism)
		}
		// The response (an authorization identity) is ignored, as RabbitMQ does.
		return login{user: cn, external: true}, nil
	}
	user, password, ok := parseLogin(mechanism, response)
	if !ok {
		return login{}, wire.CommandInvalid("unknown authentication mechanism '%s'", mechanism)
	}
	return login{user: user, password: password}, nil
}

// allow reports whether l may log in: a password login is checked against
// the users; an EXTERNAL login needs a non-empty CN that names a
// configured user (any CN when no users are configured).
func (u users) allow(l login) bool {
	if !l.external {
		return u.check(l.user, l.password)
	}
	if l.user == "" {
		return false
	}
	if len(u) == 0 {
		return true
	}
	_, ok := u[l.user]
	return ok
}

// users checks logins against the configured users. An empty set accepts
// any credentials (the user name still names the connection).
type users map[string]string

// hashPrefix marks a hashed password: "sha256:" and 64 hex digits of
// sha256(password).
const hashPrefix = "sha256:"

func (u users) validate() error {
	for name, p := range u {
		if h, ok := strings.CutPrefix(p, hashPrefix); ok {
			if b, err := hex.DecodeString(h); err != nil || len(b) != sha256.Size {
				return fmt.Errorf("amqp091: user %q: %q must be followed by 64 hex digits", name, hashPrefix)
			}
		}
	}
	return nil
}

// check reports whether user may log in with password, in constant time
// with respect to the password.
func (u users) check(user, password string) bool {
	if len(u) == 0 {
		return true
	}
	want, ok := u[user]
	if !ok {
		// Spend the same work as a wrong password, so timing does not
		// reveal which names exist.
		sum := sha256.Sum256([]byte(password))
		subtle.ConstantTimeCompare(sum[:], sum[:])
		return false
	}
	if h, ok := strings.CutPrefix(want, hashPrefix); ok {
		wantSum, err := hex.DecodeString(h)
		if err != nil {
			return false
		}
		sum := sha256.Sum256([]byte(password))
		return subtle.ConstantTimeCompare(sum[:], wantSum) == 1
	}
	a := sha256.Sum256([]byte(password))
	b := sha256.Sum256([]byte(want))
	return subtle.ConstantTimeCompare(a[:], b[:]) == 1
}

// parseLogin extracts user and password from a connection.start-ok
// response. ok is false when the mechanism is unknown (a connection
// error); a malformed response yields empty credentials, which fail the
// login like a wrong password.
func parseLogin(mechanism, response string) (user, password string, ok bool) {
	switch mechanism {
	case "PLAIN":
		// [authzid] NUL authcid NUL passwd (RFC 4616); authzid is ignored.
		parts := strings.SplitN(response, "\x00", 3)
		if len(parts) != 3 {
			return "", "", true
		}
		return parts[1], parts[2], true
	case "AMQPLAIN":
		// A field table without its length prefix, with LOGIN and PASSWORD.
		buf := make([]byte, 4, 4+len(response))
		binary.BigEndian.PutUint32(buf, uint32(len(response)))
		t, err := wire.DecodeTable(append(buf, response...))
		if err != nil {
			return "", "", true
		}
		user, _ = t["LOGIN"].(string)
		password, _ = t["PASSWORD"].(string)
		return user, password, true
	}
	return "", "", false
}

// loopbackPeer reports whether a is a loopback address (127.0.0.0/8, ::1).
func loopbackPeer(a net.Addr) bool {
	if a == nil {
		return false
	}
	host, _, err := net.SplitHostPort(a.String())
	if err != nil {
		host = a.String()
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
