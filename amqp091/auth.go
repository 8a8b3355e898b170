package amqp091

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/kubemq-io/kubemq-proxy/amqp091/wire"
)

// mechanisms is what connection.start offers, in RabbitMQ's order.
const mechanisms = "AMQPLAIN PLAIN"

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
