package gcp

import (
	"bytes"
	"context"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/http/httpguts"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
)

// The push request (Google's format, checked against its emulator):
//
//   - wrapped (the default): POST, Content-Type application/json, body
//     {"message":{"attributes":{...},"data":"<base64>","messageId":"..",
//     "message_id":"..","publishTime":"..","publish_time":"..",
//     "orderingKey":".."},"subscription":"projects/p/subscriptions/s",
//     "deliveryAttempt":n}; attributes {} when there are none, orderingKey
//     only when set, deliveryAttempt only with a dead-letter policy. Every x-goog-version
//     gets this v1 body.
//   - no_wrapper: the message data as the body (application/octet-stream);
//     with write_metadata the attributes as headers (those that are valid
//     header names and values, framing headers excluded) and
//     x-goog-pubsub-subscription-name, -message-id, -publish-time,
//     -ordering-key and -delivery-attempt.
//   - oidc_token: with Config.PushOIDCKeyFile an RS256 token signed by that
//     key in Authorization: Bearer (iss https://accounts.google.com, aud the
//     configured audience or else the endpoint, email and sub the service
//     account); without a key no Authorization header is sent.

// pushBodyLimit bounds what is read of an endpoint's answer (discarded).
const pushBodyLimit = 64 << 10

type pushEnvelope struct {
	Message         pushMessage `json:"message"`
	Subscription    string      `json:"subscription"`
	DeliveryAttempt int32       `json:"deliveryAttempt,omitempty"`
}

type pushMessage struct {
	Attributes   map[string]string `json:"attributes"` // {} when none, as the emulator sends
	Data         string            `json:"data"`
	MessageID    string            `json:"messageId"`
	MessageIDOld string            `json:"message_id"`
	PublishTime  string            `json:"publishTime"`
	PublishOld   string            `json:"publish_time"`
	OrderingKey  string            `json:"orderingKey,omitempty"`
}

// jsonTime formats a timestamp as protobuf's JSON does: UTC, with 0, 3, 6
// or 9 fractional digits.
func jsonTime(t time.Time) string {
	t = t.UTC()
	s := t.Format("2006-01-02T15:04:05")
	ns := t.Nanosecond()
	switch {
	case ns == 0:
	case ns%1e6 == 0:
		s += fmt.Sprintf(".%03d", ns/1e6)
	case ns%1e3 == 0:
		s += fmt.Sprintf(".%06d", ns/1e3)
	default:
		s += fmt.Sprintf(".%09d", ns)
	}
	return s + "Z"
}

// framing headers an attribute may not set.
var pushReservedHeaders = map[string]bool{
	"content-length": true, "content-type": true, "transfer-encoding": true, "connection": true,
	"host": true, "authorization": true, "te": true, "trailer": true, "upgrade": true,
	"keep-alive": true, "proxy-connection": true, "expect": true,
}

// pushRequest builds the request for rm to e's endpoint.
func (m *pushManager) pushRequest(ctx context.Context, e *subEntry, rm *pubsubpb.ReceivedMessage) (*http.Request, error) {
	pc := e.proto.GetPushConfig()
	msg := rm.GetMessage()
	pub := ""
	if msg.GetPublishTime() != nil {
		pub = jsonTime(msg.GetPublishTime().AsTime())
	}
	var body []byte
	hdr := http.Header{}
	if nw := pc.GetNoWrapper(); nw != nil {
		body = msg.GetData()
		hdr.Set("Content-Type", "application/octet-stream")
		if nw.GetWriteMetadata() {
			for k, v := range msg.GetAttributes() {
				if httpguts.ValidHeaderFieldName(k) && httpguts.ValidHeaderFieldValue(v) && !pushReservedHeaders[strings.ToLower(k)] {
					hdr.Set(k, v)
				}
			}
			hdr.Set("x-goog-pubsub-subscription-name", e.proto.GetName())
			hdr.Set("x-goog-pubsub-message-id", msg.GetMessageId())
			hdr.Set("x-goog-pubsub-publish-time", pub)
			if k := msg.GetOrderingKey(); k != "" && httpguts.ValidHeaderFieldValue(k) {
				hdr.Set("x-goog-pubsub-ordering-key", k)
			}
			if rm.GetDeliveryAttempt() > 0 {
				hdr.Set("x-goog-pubsub-delivery-attempt", strconv.Itoa(int(rm.GetDeliveryAttempt())))
			}
		}
	} else {
		attrs := msg.GetAttributes()
		if attrs == nil {
			attrs = map[string]string{}
		}
		env := pushEnvelope{
			Message: pushMessage{
				Attributes: attrs,
				Data:       base64.StdEncoding.EncodeToString(msg.GetData()),
				MessageID:  msg.GetMessageId(), MessageIDOld: msg.GetMessageId(),
				PublishTime: pub, PublishOld: pub,
				OrderingKey: msg.GetOrderingKey(),
			},
			Subscription:    e.proto.GetName(),
			DeliveryAttempt: rm.GetDeliveryAttempt(),
		}
		var err error
		if body, err = json.Marshal(env); err != nil {
			return nil, err
		}
		hdr.Set("Content-Type", "application/json")
	}
	if tok := pc.GetOidcToken(); tok != nil && m.signer != nil {
		aud := tok.GetAudience()
		if aud == "" {
			aud = pc.GetPushEndpoint()
		}
		t, err := m.signer.token(tok.GetServiceAccountEmail(), aud)
		if err != nil {
			return nil, err
		}
		hdr.Set("Authorization", "Bearer "+t)
	}
	hdr.Set("User-Agent", "kubemq-proxy-push")
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, pc.GetPushEndpoint(), bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header = hdr
	return req, nil
}

// errPushRefused: the endpoint is not on the allow-list.
var errPushRefused = errors.New("push endpoint not in gcp.push_allowed_hosts")

// send pushes rm once, with timeout as the request's deadline, and returns
// the status code.
func (m *pushManager) send(ctx context.Context, e *subEntry, rm *pubsubpb.ReceivedMessage, timeout time.Duration, label string) (int, error) {
	if err := m.allowed(e.proto.GetPushConfig()); err != nil {
		m.requests.WithLabelValues(label, "refused").Inc()
		return 0, errPushRefused
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := m.pushRequest(ctx, e, rm)
	if err != nil {
		m.requests.WithLabelValues(label, "error").Inc()
		return 0, err
	}
	start := time.Now()
	resp, err := m.client.Do(req)
	if err != nil {
		code := "error"
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			code = "timeout"
		}
		m.requests.WithLabelValues(label, code).Inc()
		return 0, err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, pushBodyLimit))
	resp.Body.Close()
	m.latency.WithLabelValues(label).Observe(time.Since(start).Seconds())
	m.requests.WithLabelValues(label, strconv.Itoa(resp.StatusCode)).Inc()
	return resp.StatusCode, nil
}

// allowed checks a push config's endpoint against the allow-list; nil for
// a pull config.
func (m *pushManager) allowed(pc *pubsubpb.PushConfig) error {
	ep := pc.GetPushEndpoint()
	if ep == "" || len(m.allow) == 0 {
		return nil
	}
	u, err := url.Parse(ep)
	if err != nil {
		return invalidArgf("Invalid push endpoint given (endpoint=%s).", ep)
	}
	port := u.Port()
	if port == "" {
		port = "80"
		if strings.EqualFold(u.Scheme, "https") {
			port = "443"
		}
	}
	if !m.allow.allows(u.Hostname(), port) {
		return invalidArgf("Invalid push endpoint given (endpoint=%s): kubemq-proxy pushes only to the hosts in gcp.push_allowed_hosts.", ep)
	}
	return nil
}

// oidcSigner mints the push tokens of oidc_token configurations with a
// local RSA key.
type oidcSigner struct {
	key *rsa.PrivateKey
	kid string

	mu    sync.Mutex // guards cache
	cache map[[2]string]oidcToken
}

type oidcToken struct {
	tok string
	exp time.Time
}

const oidcLifetime = time.Hour

func loadOIDCSigner(path string) (*oidcSigner, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("gcp: push_oidc_key_file: %w", err)
	}
	block, _ := pem.Decode(raw)
	if block == nil {
		return nil, fmt.Errorf("gcp: push_oidc_key_file %s: no PEM block", path)
	}
	var key *rsa.PrivateKey
	if k, err := x509.ParsePKCS1PrivateKey(block.Bytes); err == nil {
		key = k
	} else if k, err := x509.ParsePKCS8PrivateKey(block.Bytes); err == nil {
		rk, ok := k.(*rsa.PrivateKey)
		if !ok {
			return nil, fmt.Errorf("gcp: push_oidc_key_file %s: not an RSA key", path)
		}
		key = rk
	} else {
		return nil, fmt.Errorf("gcp: push_oidc_key_file %s: not a PKCS#1 or PKCS#8 RSA private key", path)
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(pub)
	return &oidcSigner{key: key, kid: hex.EncodeToString(sum[:8]), cache: map[[2]string]oidcToken{}}, nil
}

// token returns a token for (email, aud), reused until 5 minutes before it
// expires.
func (o *oidcSigner) token(email, aud string) (string, error) {
	now := time.Now()
	k := [2]string{email, aud}
	o.mu.Lock()
	defer o.mu.Unlock()
	if t, ok := o.cache[k]; ok && now.Add(5*time.Minute).Before(t.exp) {
		return t.tok, nil
	}
	exp := now.Add(oidcLifetime)
	tok, err := o.sign(map[string]any{
		"iss": "https://accounts.google.com", "aud": aud, "azp": email, "sub": email,
		"email": email, "email_verified": true, "iat": now.Unix(), "exp": exp.Unix(),
	})
	if err != nil {
		return "", err
	}
	if len(o.cache) > 1000 {
		clear(o.cache)
	}
	o.cache[k] = oidcToken{tok, exp}
	return tok, nil
}

func (o *oidcSigner) sign(claims map[string]any) (string, error) {
	h, err := json.Marshal(map[string]string{"alg": "RS256", "typ": "JWT", "kid": o.kid})
	if err != nil {
		return "", err
	}
	c, err := json.Marshal(claims)
	if err != nil {
		return "", err
	}
	enc := base64.RawURLEncoding
	signing := enc.EncodeToString(h) + "." + enc.EncodeToString(c)
	sum := sha256.Sum256([]byte(signing))
	sig, err := rsa.SignPKCS1v15(rand.Reader, o.key, crypto.SHA256, sum[:])
	if err != nil {
		return "", err
	}
	return signing + "." + enc.EncodeToString(sig), nil
}
