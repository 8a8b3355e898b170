package embedded

import (
	"errors"
	"fmt"
)

// Error texts of the real server (kubemq-community pkg/entities): clients match on them, so they
// are kept byte for byte.
const (
	errClientID        = "Error 101: invalid clientID value, cannot be empty"
	errChannelEmpty    = "Error 102: invalid channel value, cannot be empty"
	errWildcards       = "Error 107: invalid channel value, no wildcards are allowed"
	errWhitespace      = "Error 108: invalid channel value, no white spaces are allowed"
	errMessageEmpty    = "Error 110: invalid message, cannot be empty"
	errSubType         = "Error 111: invalid subscription type, cannot be undefined or 0"
	errStartSeq        = "Error 112: invalid subscription type start at sequence value, cannot by 0 or negative"
	errStartTime       = "Error 113: invalid subscription type start at time value, cannot by 0 or negative"
	errStartDelta      = "Error 114: invalid subscription type start at time delta value, cannot by 0 or negative"
	errStoreParams     = "Error 118: event store parameters were set but subscribe type is not event store"
	errEndDot          = "Error 119: invalid channel value, cannot end with `.`"
	errQueueName       = "Error 120: invalid queue name value, cannot be empty, contains wildcards ,white spaces and end with dot"
	errQueueSubscribe  = "Error 121: cannot subscribe to a queue"
	errMaxMessages     = "Error 122: max messages should be between 1 and max message setting in kubemq config  "
	errNoMsgToAck      = "Error 124: no active message to ack"
	errAckSeq          = "Error 125: ack sequence cannot be 0 or negative"
	errNoMsgToSend     = "Error 126: no active message to send"
	errVisibility      = "Error 127: invalid visibility time, cannot be negative or exceed setting in kubemq config"
	errSubActive       = "Error 128: subscription to queue is already active"
	errVisExpired      = "Error 129: current visibility timer expired"
	errInvalidQueueMsg = "Error 131: invalid queue message"
	errStreamReqType   = "Error 132: invalid stream queue messages request type"
	errExpiration      = "Error 133: invalid expiration seconds, exceed max expiration seconds setting in kubemq config"
	errMaxReceiveCount = "Error 134: invalid max received count, cannot be negative or exceed max receive count setting in kubemq config"
	errDelay           = "Error 135: invalid delay seconds, exceed max delay seconds setting in kubemq config"
	errWaitTimeout     = "Error 136: invalid wait timeout, value cannot be negative or exceed max wait timeout seconds setting in kubemq config"
	errNoMsgToReject   = "Error 137: no active message to reject"
	errNoNewMessage    = "Error 138: no new message in queue, wait time expired"
	errSubscribeType   = "Error 207: invalid subscribe type"

	// Downstream texts (docs/kubemq.md 5.4.3, 8.1, 8.5).
	errTxNotFound      = "transaction is completed or transaction id not found"
	errTxClosedAck     = "cannot ack messages with closed response"
	errTxClosedOffsets = "cannot get active offsets with closed response "
	errRequestUnknown  = "request unknown"
	errEmptyBatch      = "empty messages batch"
	errClientIDInUse   = "stan: clientID already registered"
)

// strictPrefix starts every refusal that only strict mode makes.
const strictPrefix = "strict mode: "

// errTooLarge reports a queue message bigger than Options.MaxMessageBytes.
func errTooLarge(size, limit int) string {
	return fmt.Sprintf("Error 131: invalid queue message, size %d bytes exceeds the limit of %d bytes", size, limit)
}

// errEventTooLarge reports an event or request bigger than Options.MaxMessageBytes.
func errEventTooLarge(size, limit int) string {
	return fmt.Sprintf("Error 110: invalid message, size %d bytes exceeds the limit of %d bytes", size, limit)
}

// errServerClosed is returned by operations on a stopped server.
var errServerClosed = errors.New("embedded kubemq server is stopped")
