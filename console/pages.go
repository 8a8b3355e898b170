package console

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"html/template"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/kubemq-io/kubemq-proxy/delivery"
)

// view is what every page's template gets: the layout's fields and the page's Data.
type view struct {
	Title string
	Nav   string
	Data  any
	// Now is when the page was rendered.
	Now time.Time
}

var funcs = template.FuncMap{
	"opt": func(p any) string { // an optional figure: "—" when absent
		switch v := p.(type) {
		case *int64:
			if v != nil {
				return strconv.FormatInt(*v, 10)
			}
		case *int:
			if v != nil {
				return strconv.Itoa(*v)
			}
		case *float64:
			if v != nil {
				return strconv.FormatFloat(*v, 'f', 1, 64)
			}
		}
		return "—"
	},
	"vhostOrDefault": func(s string) string {
		if s == "" {
			return "(AMQP default)"
		}
		return s
	},
	"since": func(t time.Time) string { return time.Since(t).Round(time.Second).String() },
}

func (c *Console) render(w http.ResponseWriter, page string, v view) {
	v.Now = time.Now().UTC()
	var buf bytes.Buffer
	if err := c.pages[page].Execute(&buf, v); err != nil {
		http.Error(w, "console: rendering "+page+": "+err.Error(), http.StatusInternalServerError)
		return
	}
	if w.Header().Get("Content-Type") == "" {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
	}
	w.Write(buf.Bytes())
}

// page serves one page from the data load returns.
func (c *Console) page(name string, load func(ctx context.Context) (string, any)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), requestTimeout)
		defer cancel()
		title, data := load(ctx)
		c.render(w, name, view{Title: title, Nav: name, Data: data})
	})
}

// fromJSON reads a front-end's view (State, Topology) through its JSON form, the document
// GET /state serves, into the console's own types: fields a front-end does not report stay
// absent.
func fromJSON(v any, into any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, into)
}

// pubsubState is the Pub/Sub front-end's State as the console reads it.
type pubsubState struct {
	Topics         int        `json:"topics"`
	StreamingPulls int        `json:"streaming_pulls"`
	Subscriptions  []subState `json:"subscriptions"`
}

type subState struct {
	ID            string `json:"id"`
	Topic         string `json:"topic"`
	Queue         string `json:"queue"`
	Ordered       bool   `json:"ordered"`
	Detached      bool   `json:"detached"`
	Filter        string `json:"filter"`
	Active        bool   `json:"active"`
	Out           int    `json:"out"`
	Waiting       int    `json:"waiting"`
	Acked         int    `json:"acked_held"`
	DeadLettering int    `json:"dead_lettering"`
	// Backlog figures, when the front-end reports them.
	MessagesReady   *int64   `json:"messages_ready"`
	MessagesUnacked *int     `json:"messages_unacked"`
	OldestUnacked   *float64 `json:"oldest_unacked_message_age_seconds"`
	Consumers       *int     `json:"consumers"`
}

// amqpState is the AMQP front-end's State as the console reads it.
type amqpState struct {
	Connections []connState  `json:"connections"`
	Vhosts      []vhostState `json:"vhosts"`
}

type connState struct {
	ID                  uint64    `json:"id"`
	Remote              string    `json:"remote"`
	User                string    `json:"user"`
	Vhost               string    `json:"vhost"`
	Client              string    `json:"client"`
	Since               time.Time `json:"since"`
	Channels            int       `json:"channels"`
	Consumers           int       `json:"consumers"`
	PendingPublishBytes int64     `json:"pending_publish_bytes"`
	Blocked             bool      `json:"blocked"`
}

type vhostState struct {
	Name      string       `json:"name"`
	Exchanges int          `json:"exchanges"`
	Queues    []queueState `json:"queues"`
}

type queueState struct {
	Name       string `json:"name"`
	Channel    string `json:"kubemq_channel"`
	Durable    bool   `json:"durable"`
	Exclusive  bool   `json:"exclusive"`
	AutoDelete bool   `json:"auto_delete"`
	Consumers  int    `json:"consumers"`
	// Backlog figures, when the front-end reports them.
	MessagesReady   *int64   `json:"messages_ready"`
	MessagesUnacked *int     `json:"messages_unacknowledged"`
	OldestUnacked   *float64 `json:"oldest_unacked_age_seconds"`
	// Vhost is filled by the console (the queue table spans virtual hosts).
	Vhost string `json:"-"`
}

// topologyView is the AMQP front-end's Topology as the console reads it.
type topologyView struct {
	Vhost     string `json:"vhost"`
	Exchanges []struct {
		Name       string `json:"name"`
		Type       string `json:"type"`
		Durable    bool   `json:"durable"`
		AutoDelete bool   `json:"auto_delete"`
		Internal   bool   `json:"internal"`
		Alternate  string `json:"alternate_exchange"`
	} `json:"exchanges"`
	Bindings []struct {
		Source          string `json:"source"`
		Destination     string `json:"destination"`
		DestinationType string `json:"destination_type"`
		RoutingKey      string `json:"routing_key"`
		Arguments       int    `json:"arguments"`
	} `json:"bindings"`
}

func (c *Console) pubsubState() (pubsubState, []string, bool, error) {
	ps, _ := c.frontends()
	if ps == nil {
		return pubsubState{}, nil, false, nil
	}
	var st pubsubState
	err := fromJSON(ps.State(), &st)
	return st, ps.TopicIDs(), true, err
}

func (c *Console) amqpState() (amqpState, []topologyView, bool, error) {
	_, aq := c.frontends()
	if aq == nil {
		return amqpState{}, nil, false, nil
	}
	var st amqpState
	var top []topologyView
	err := fromJSON(aq.State(), &st)
	if err == nil {
		err = fromJSON(aq.Topology(), &top)
	}
	return st, top, true, err
}

// overviewView is the overview page's data.
type overviewView struct {
	Backend             Backend
	Ready               string
	Version, Host       string
	Uptime              string
	PingError           string
	Rates               []rateRow
	HasPubSub, HasAMQP  bool
	Topics, Subs        int
	StreamingPulls      int
	Vhosts, Queues      int
	Connections         int
	LeaseQueues, Leases int
	Errors              []string
}

func (c *Console) overview(ctx context.Context) (string, any) {
	var v overviewView
	if c.o.Backend != nil {
		v.Backend = c.o.Backend()
	}
	v.Ready = "ok"
	if c.o.Ready != nil {
		if err := c.o.Ready(); err != nil {
			v.Ready = err.Error()
		}
	}
	if c.o.Client != nil && c.o.Client.Ready() {
		pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		info, err := c.o.Client.Ping(pctx)
		cancel()
		if err != nil {
			v.PingError = err.Error()
		} else {
			v.Version, v.Host, v.Uptime = info.Version, info.Host, info.Uptime.Round(time.Second).String()
		}
	}
	v.Rates = c.rateRows()
	if st, _, ok, err := c.pubsubState(); ok {
		v.HasPubSub = true
		v.Topics, v.Subs, v.StreamingPulls = st.Topics, len(st.Subscriptions), st.StreamingPulls
		if err != nil {
			v.Errors = append(v.Errors, err.Error())
		}
	}
	if st, _, ok, err := c.amqpState(); ok {
		v.HasAMQP = true
		v.Vhosts, v.Connections = len(st.Vhosts), len(st.Connections)
		for _, vh := range st.Vhosts {
			v.Queues += len(vh.Queues)
		}
		if err != nil {
			v.Errors = append(v.Errors, err.Error())
		}
	}
	if c.o.Leases != nil {
		ls := c.o.Leases()
		v.LeaseQueues = len(ls)
		for _, l := range ls {
			v.Leases += l.Leases
		}
	}
	return "Overview", v
}

// pubsubView is the Pub/Sub page's data.
type pubsubView struct {
	Enabled        bool
	Topics         []topicRow
	Subscriptions  []subState
	StreamingPulls int
	Error          string
}

type topicRow struct {
	ID            string
	Subscriptions int
}

func (c *Console) pubsub(ctx context.Context) (string, any) {
	st, topics, ok, err := c.pubsubState()
	v := pubsubView{Enabled: ok, Subscriptions: st.Subscriptions, StreamingPulls: st.StreamingPulls}
	if err != nil {
		v.Error = err.Error()
	}
	count := map[string]int{}
	for _, s := range st.Subscriptions {
		count[s.Topic]++
	}
	for _, t := range topics {
		v.Topics = append(v.Topics, topicRow{ID: t, Subscriptions: count[t]})
	}
	return "Pub/Sub", v
}

// amqpView is the AMQP page's data.
type amqpView struct {
	Enabled     bool
	Vhosts      []vhostRow
	Queues      []queueState
	Topology    []topologyView
	Connections []connState
	Error       string
}

type vhostRow struct {
	Name                        string
	Exchanges, Queues, Bindings int
	Connections                 int
}

func (c *Console) amqp(ctx context.Context) (string, any) {
	st, top, ok, err := c.amqpState()
	v := amqpView{Enabled: ok, Topology: top, Connections: st.Connections}
	if err != nil {
		v.Error = err.Error()
	}
	bindings := map[string]int{}
	for _, t := range top {
		bindings[t.Vhost] = len(t.Bindings)
	}
	conns := map[string]int{}
	for _, cs := range st.Connections {
		conns[cs.Vhost]++
	}
	for _, vh := range st.Vhosts {
		v.Vhosts = append(v.Vhosts, vhostRow{Name: vh.Name, Exchanges: vh.Exchanges, Queues: len(vh.Queues),
			Bindings: bindings[vh.Name], Connections: conns[vh.Name]})
		for _, q := range vh.Queues {
			q.Vhost = vh.Name
			v.Queues = append(v.Queues, q)
		}
	}
	return "AMQP 0-9-1", v
}

// leasesView is the lease engine page's data.
type leasesView struct {
	Queues []delivery.Stats
}

func (c *Console) leases(ctx context.Context) (string, any) {
	var v leasesView
	if c.o.Leases != nil {
		v.Queues = c.o.Leases()
		slices.SortFunc(v.Queues, func(a, b delivery.Stats) int { return cmp.Compare(a.Queue, b.Queue) })
	}
	return "Lease engine", v
}

// queueChannel finds the KubeMQ queue behind an AMQP queue or a Pub/Sub subscription (for
// peeking), from the front-end's State.
func (c *Console) queueChannel(kind, vhost, name string) (string, error) {
	switch kind {
	case "amqp":
		st, _, ok, err := c.amqpState()
		if !ok || err != nil {
			return "", fmt.Errorf("AMQP front-end not running or unreadable: %v", err)
		}
		for _, vh := range st.Vhosts {
			if vh.Name != vhost {
				continue
			}
			for _, q := range vh.Queues {
				if q.Name == name {
					return q.Channel, nil
				}
			}
		}
	case "pubsub":
		st, _, ok, err := c.pubsubState()
		if !ok || err != nil {
			return "", fmt.Errorf("Pub/Sub front-end not running or unreadable: %v", err)
		}
		for _, s := range st.Subscriptions {
			if s.ID == name {
				return s.Queue, nil
			}
		}
	}
	return "", errNotFound
}
