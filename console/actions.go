package console

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/kubemq-io/kubemq-proxy/delivery"
)

// maxActionBody bounds an action request (a test message's body is part of it).
const maxActionBody = 1 << 20

// peekMax is the most messages one peek shows; peekBodyMax the most body bytes per message.
const (
	peekMax     = 50
	peekBodyMax = 4096
)

// consoleProject is the project in the Pub/Sub names the console's actions use: topics and
// subscriptions are one namespace whatever the project (gcp.Server.TopicIDs).
const consoleProject = "kubemq-proxy-console"

var errNotFound = errors.New("not found")

// actionResult is an action's JSON answer.
type actionResult struct {
	OK       bool      `json:"ok"`
	Message  string    `json:"message"`
	Messages []peeked  `json:"messages,omitempty"`
	Error    string    `json:"error,omitempty"`
	Time     time.Time `json:"time"`
}

// peeked is one message a peek saw.
type peeked struct {
	ID           string            `json:"id"`
	Sequence     uint64            `json:"sequence"`
	Timestamp    time.Time         `json:"timestamp"`
	ReceiveCount int               `json:"receive_count"`
	Tags         map[string]string `json:"tags"`
	Size         int               `json:"size"`
	Body         string            `json:"body"`
	// Binary: the body is not UTF-8 and is shown as Go-quoted bytes.
	Binary    bool `json:"binary,omitempty"`
	Truncated bool `json:"truncated,omitempty"`
}

func jsonError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(actionResult{Error: msg, Time: time.Now().UTC()})
}

// httpCode maps an action's failure to an HTTP status once: gRPC statuses of the Pub/Sub
// handlers, "not found" errors of the AMQP front-end, and the rest as a bad gateway to KubeMQ.
func httpCode(err error) int {
	var nf interface{ NotFound() bool }
	if errors.Is(err, errNotFound) || errors.As(err, &nf) && nf.NotFound() {
		return http.StatusNotFound
	}
	if st, ok := status.FromError(err); ok {
		switch st.Code() {
		case codes.NotFound:
			return http.StatusNotFound
		case codes.InvalidArgument, codes.OutOfRange:
			return http.StatusBadRequest
		case codes.FailedPrecondition, codes.AlreadyExists:
			return http.StatusConflict
		case codes.Unavailable, codes.DeadlineExceeded, codes.Aborted:
			return http.StatusServiceUnavailable
		}
	}
	var bad badRequest
	if errors.As(err, &bad) {
		return http.StatusBadRequest
	}
	return http.StatusBadGateway
}

type badRequest string

func (b badRequest) Error() string { return string(b) }

// action serves POST /console/action/{name}; the guard and the CSRF check ran before.
func (c *Console) action(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxActionBody)
	if err := r.ParseForm(); err != nil {
		jsonError(w, http.StatusBadRequest, "unreadable form: "+err.Error())
		return
	}
	if c.o.Ready != nil {
		if err := c.o.Ready(); err != nil {
			jsonError(w, http.StatusServiceUnavailable, "not ready: "+err.Error())
			return
		}
	}
	ctx, cancel := context.WithTimeout(r.Context(), requestTimeout)
	defer cancel()
	res, err := c.run(ctx, r.PathValue("name"), r)
	if err != nil {
		jsonError(w, httpCode(err), err.Error())
		return
	}
	res.OK, res.Time = true, time.Now().UTC()
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(res)
}

func (c *Console) run(ctx context.Context, name string, r *http.Request) (actionResult, error) {
	f := func(k string) string { return r.PostForm.Get(k) }
	required := func(keys ...string) error {
		for _, k := range keys {
			if _, ok := r.PostForm[k]; !ok {
				return badRequest("missing field " + k)
			}
		}
		return nil
	}
	ps, aq := c.frontends()
	switch name {
	case "amqp-purge", "amqp-delete", "amqp-publish", "amqp-peek":
		if aq == nil {
			return actionResult{}, fmt.Errorf("%w: the AMQP front-end is not running", errNotFound)
		}
	case "pubsub-purge", "pubsub-delete", "pubsub-publish", "pubsub-peek":
		if ps == nil {
			return actionResult{}, fmt.Errorf("%w: the Pub/Sub front-end is not running", errNotFound)
		}
	default:
		return actionResult{}, fmt.Errorf("%w: no action %q", errNotFound, name)
	}
	switch name {
	case "amqp-purge":
		if err := required("vhost", "queue"); err != nil {
			return actionResult{}, err
		}
		n, err := aq.PurgeQueue(ctx, f("vhost"), f("queue"))
		if err != nil {
			return actionResult{}, err
		}
		return actionResult{Message: fmt.Sprintf("purged %d messages from queue %q", n, f("queue"))}, nil
	case "amqp-delete":
		if err := required("vhost", "queue"); err != nil {
			return actionResult{}, err
		}
		n, err := aq.DeleteQueue(ctx, f("vhost"), f("queue"), "queue deleted through the web console")
		if err != nil {
			return actionResult{}, err
		}
		return actionResult{Message: fmt.Sprintf("deleted queue %q (%d ready messages)", f("queue"), n)}, nil
	case "amqp-publish":
		if err := required("vhost", "exchange", "routing_key"); err != nil {
			return actionResult{}, err
		}
		stored, refused, err := aq.PublishMessage(ctx, f("vhost"), f("exchange"), f("routing_key"), []byte(f("body")))
		if err != nil {
			return actionResult{}, err
		}
		msg := fmt.Sprintf("published to exchange %q with routing key %q: stored in %d queues", f("exchange"), f("routing_key"), stored)
		if refused > 0 {
			msg += fmt.Sprintf(", refused by %d full queues", refused)
		}
		return actionResult{Message: msg}, nil
	case "pubsub-purge":
		if err := required("subscription"); err != nil {
			return actionResult{}, err
		}
		// Pub/Sub's purge: a seek to now marks everything published before as acknowledged.
		_, err := ps.Subscriber().Seek(ctx, &pubsubpb.SeekRequest{Subscription: subName(f("subscription")),
			Target: &pubsubpb.SeekRequest_Time{Time: timestamppb.Now()}})
		if err != nil {
			return actionResult{}, err
		}
		return actionResult{Message: fmt.Sprintf("purged subscription %q (seek to now)", f("subscription"))}, nil
	case "pubsub-delete":
		if err := required("subscription"); err != nil {
			return actionResult{}, err
		}
		_, err := ps.Subscriber().DeleteSubscription(ctx, &pubsubpb.DeleteSubscriptionRequest{Subscription: subName(f("subscription"))})
		if err != nil {
			return actionResult{}, err
		}
		return actionResult{Message: fmt.Sprintf("deleted subscription %q", f("subscription"))}, nil
	case "pubsub-publish":
		if err := required("topic"); err != nil {
			return actionResult{}, err
		}
		m := &pubsubpb.PubsubMessage{Data: []byte(f("data"))}
		if attrs := strings.TrimSpace(f("attributes")); attrs != "" {
			m.Attributes = map[string]string{}
			for _, line := range strings.Split(attrs, "\n") {
				k, v, ok := strings.Cut(strings.TrimSpace(line), "=")
				if !ok || k == "" {
					return actionResult{}, badRequest(fmt.Sprintf("attribute line %q is not key=value", line))
				}
				m.Attributes[k] = v
			}
		}
		resp, err := ps.Publisher().Publish(ctx, &pubsubpb.PublishRequest{Topic: "projects/" + consoleProject + "/topics/" + f("topic"),
			Messages: []*pubsubpb.PubsubMessage{m}})
		if err != nil {
			return actionResult{}, err
		}
		return actionResult{Message: fmt.Sprintf("published message %s to topic %q", strings.Join(resp.GetMessageIds(), ","), f("topic"))}, nil
	case "amqp-peek", "pubsub-peek":
		kind, vhost, queue := "amqp", f("vhost"), f("queue")
		if name == "pubsub-peek" {
			if err := required("subscription"); err != nil {
				return actionResult{}, err
			}
			kind, queue = "pubsub", f("subscription")
		} else if err := required("vhost", "queue"); err != nil {
			return actionResult{}, err
		}
		n := 10
		if s := f("count"); s != "" {
			v, err := strconv.Atoi(s)
			if err != nil || v < 1 || v > peekMax {
				return actionResult{}, badRequest(fmt.Sprintf("count must be 1 to %d", peekMax))
			}
			n = v
		}
		return c.peek(ctx, kind, vhost, queue, n)
	}
	return actionResult{}, errNotFound
}

func subName(id string) string { return "projects/" + consoleProject + "/subscriptions/" + id }

// peek looks at the first ready messages of the KubeMQ queue behind an AMQP queue or a
// subscription without consuming them. Messages the lease engine took (buffered, or leased to
// consumers) are not in KubeMQ's ready set and not shown; its lease records are left out. The call takes about a second when fewer than n messages wait (KubeMQ answers a
// pull when it has n or its wait is over).
func (c *Console) peek(ctx context.Context, kind, vhost, name string, n int) (actionResult, error) {
	if c.o.Client == nil {
		return actionResult{}, fmt.Errorf("%w: peeking needs the KubeMQ client", errNotFound)
	}
	ch, err := c.queueChannel(kind, vhost, name)
	if err != nil {
		return actionResult{}, fmt.Errorf("%s %q: %w", kind, name, err)
	}
	res, err := c.o.Client.ReceiveQueueMessages(ctx, ch, n, time.Second, true)
	if err != nil {
		return actionResult{}, err
	}
	out := actionResult{Messages: []peeked{}}
	internal := 0
	for _, m := range res.Messages {
		if leaseEngineMessage(m.Tags) {
			internal++
			continue
		}
		p := peeked{ID: m.MessageID, Sequence: m.Attributes.Sequence, Timestamp: m.Attributes.Timestamp,
			ReceiveCount: m.Attributes.ReceiveCount, Tags: m.Tags, Size: len(m.Body)}
		body := m.Body
		if len(body) > peekBodyMax {
			body, p.Truncated = body[:peekBodyMax], true
		}
		if utf8.Valid(body) {
			p.Body = string(body)
		} else {
			p.Body, p.Binary = strconv.Quote(string(body)), true
		}
		out.Messages = append(out.Messages, p)
	}
	slices.SortStableFunc(out.Messages, func(a, b peeked) int {
		switch {
		case a.Sequence < b.Sequence:
			return -1
		case a.Sequence > b.Sequence:
			return 1
		}
		return 0
	})
	out.Message = fmt.Sprintf("%d ready messages seen in KubeMQ queue %s (not consumed)", len(out.Messages), ch)
	if internal > 0 {
		out.Message += fmt.Sprintf("; %d lease records of the lease engine not shown", internal)
	}
	return out, nil
}

// leaseEngineMessage reports whether a KubeMQ message is one of the lease engine's own (a
// lease record or sentinel), not a client's; a client's message the engine re-enqueued keeps
// its _kmqp_ attempt tags and is shown.
func leaseEngineMessage(tags map[string]string) bool {
	_, record := tags[delivery.TagRecord]
	_, sentinel := tags[delivery.TagSentinel]
	return record || sentinel
}
