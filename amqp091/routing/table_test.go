package routing

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/kubemq-io/kubemq-proxy/amqp091/wire"
)

func route(t *testing.T, tb *Table, x, key string, h wire.Table) []string {
	t.Helper()
	got, err := tb.Route(x, key, h, nil)
	if err != nil {
		t.Fatalf("Route(%q, %q): %v", x, key, err)
	}
	sort.Strings(got)
	return got
}

func sorted(s ...string) []string {
	out := slices.Clone(s)
	sort.Strings(out)
	if out == nil {
		out = []string{}
	}
	return out
}

func eq(a, b []string) bool {
	if len(a) == 0 && len(b) == 0 {
		return true
	}
	return slices.Equal(a, b)
}

// TestTopicMatching uses the binding set and expectations of RabbitMQ's own
// topic exchange test (unit_SUITE topic_matching), where each queue tN is
// bound with the key beside it.
func TestTopicMatching(t *testing.T) {
	tb := NewTable()
	tb.PutExchange(Exchange{Name: "t", Kind: Topic})
	binds := []struct {
		key, q string
		args   wire.Table
	}{
		{"a.b.c", "t1", nil}, {"a.*.c", "t2", nil}, {"a.#.b", "t3", nil}, {"a.b.b.c", "t4", nil},
		{"#", "t5", nil}, {"#.#", "t6", nil}, {"#.b", "t7", nil}, {"*.*", "t8", nil},
		{"a.*", "t9", nil}, {"*.b.c", "t10", nil}, {"a.#", "t11", nil}, {"a.#.#", "t12", nil},
		{"b.b.c", "t13", nil}, {"a.b.b", "t14", nil}, {"a.b", "t15", nil}, {"b.c", "t16", nil},
		{"", "t17", nil}, {"*.*.*", "t18", nil}, {"vodka.martini", "t19", nil}, {"a.b.c", "t20", nil},
		{"*.#", "t21", nil}, {"#.*.#", "t22", nil}, {"*.#.#", "t23", nil}, {"#.#.#", "t24", nil},
		{"*", "t25", nil}, {"#.b.#", "t26", nil},
		{"args-test", "t27", wire.Table{"foo": "bar"}}, {"args-test", "t27", wire.Table{"foo": "baz"}},
	}
	for _, b := range binds {
		tb.PutQueue(b.q)
		if !tb.Bind(Binding{Source: "t", Dest: QueueDest(b.q), Key: b.key, Args: b.args}) {
			t.Fatalf("bind %s %q: not added", b.q, b.key)
		}
	}
	cases := []struct {
		key  string
		want []string
	}{
		{"a.b.c", sorted("t1", "t2", "t5", "t6", "t10", "t11", "t12", "t18", "t20", "t21", "t22", "t23", "t24", "t26")},
		{"a.b", sorted("t3", "t5", "t6", "t7", "t8", "t9", "t11", "t12", "t15", "t21", "t22", "t23", "t24", "t26")},
		{"a.b.b", sorted("t3", "t5", "t6", "t7", "t11", "t12", "t14", "t18", "t21", "t22", "t23", "t24", "t26")},
		{"", sorted("t5", "t6", "t17", "t24")},
		{"b.c.c", sorted("t5", "t6", "t18", "t21", "t22", "t23", "t24", "t26")},
		{"a.a.a.a.a", sorted("t5", "t6", "t11", "t12", "t21", "t22", "t23", "t24")},
		{"vodka.gin", sorted("t5", "t6", "t8", "t21", "t22", "t23", "t24")},
		{"vodka.martini", sorted("t5", "t6", "t8", "t19", "t21", "t22", "t23", "t24")},
		{"b.b.c", sorted("t5", "t6", "t10", "t13", "t18", "t21", "t22", "t23", "t24", "t26")},
		{"nothing.here.at.all", sorted("t5", "t6", "t21", "t22", "t23", "t24")},
		{"oneword", sorted("t5", "t6", "t21", "t22", "t23", "t24", "t25")},
		{"args-test", sorted("t5", "t6", "t21", "t22", "t23", "t24", "t25", "t27")},
	}
	for _, c := range cases {
		if got := route(t, tb, "t", c.key, nil); !eq(got, c.want) {
			t.Errorf("route %q:\n got %v\nwant %v", c.key, got, c.want)
		}
	}

	// Removing bindings (RabbitMQ's test removes these, then checks again).
	for _, b := range []struct{ key, q string }{
		{"a.b.c", "t1"}, {"a.b.b.c", "t4"}, {"#", "t5"}, {"*.*", "t8"}, {"b.b.c", "t13"},
		{"vodka.martini", "t19"}, {"*.#.#", "t23"}, {"#.b.#", "t26"},
	} {
		if _, ok := tb.Unbind(Binding{Source: "t", Dest: QueueDest(b.q), Key: b.key}); !ok {
			t.Fatalf("unbind %s %q: not found", b.q, b.key)
		}
	}
	// One of t27's two bindings goes: the other still routes.
	if _, ok := tb.Unbind(Binding{Source: "t", Dest: QueueDest("t27"), Key: "args-test", Args: wire.Table{"foo": "bar"}}); !ok {
		t.Fatal("unbind t27 foo=bar: not found")
	}
	cases = []struct {
		key  string
		want []string
	}{
		{"a.b.c", sorted("t2", "t6", "t10", "t11", "t12", "t18", "t20", "t21", "t22", "t24")},
		{"a.b", sorted("t3", "t6", "t7", "t9", "t11", "t12", "t15", "t21", "t22", "t24")},
		{"a.b.b", sorted("t3", "t6", "t7", "t11", "t12", "t14", "t18", "t21", "t22", "t24")},
		{"", sorted("t6", "t17", "t24")},
		{"b.c.c", sorted("t6", "t18", "t21", "t22", "t24")},
		{"a.a.a.a.a", sorted("t6", "t11", "t12", "t21", "t22", "t24")},
		{"vodka.gin", sorted("t6", "t21", "t22", "t24")},
		{"vodka.martini", sorted("t6", "t21", "t22", "t24")},
		{"b.b.c", sorted("t6", "t10", "t18", "t21", "t22", "t24")},
		{"nothing.here.at.all", sorted("t6", "t21", "t22", "t24")},
		{"oneword", sorted("t6", "t21", "t22", "t24", "t25")},
		{"args-test", sorted("t6", "t21", "t22", "t24", "t25", "t27")},
	}
	for _, c := range cases {
		if got := route(t, tb, "t", c.key, nil); !eq(got, c.want) {
			t.Errorf("after unbind, route %q:\n got %v\nwant %v", c.key, got, c.want)
		}
	}
}

func TestTopicEdgeWords(t *testing.T) {
	cases := []struct {
		binding, key string
		match        bool
	}{
		{"a..b", "a..b", true},
		{"a.*.b", "a..b", true}, // an empty word is a word
		{"*", "", false},
		{"#", "", true},
		{"", "", true},
		{"", "a", false},
		{"a.#", "a", true},
		{"#.a", "a", true},
		{"#.a.#", "x.a.y.z", true},
		{"#.a.#.b.#", "a.x.b", true},
		{"#.a.#.b.#", "b.a", false},
		{"a.*.#", "a", false},
		{"a.*.#", "a.b", true},
		{"a.", "a.", true},
		{"a.", "a", false},
		{"*.", "x.", true},
		{"#.#.#.#.#.#.#.#.#.#.#.#.#.#.#.#.#.#.#.#.z", strings.Repeat("a.", 100) + "z", true},
	}
	for _, c := range cases {
		tb := NewTable()
		tb.PutExchange(Exchange{Name: "t", Kind: Topic})
		tb.PutQueue("q")
		tb.Bind(Binding{Source: "t", Dest: QueueDest("q"), Key: c.binding})
		got := len(route(t, tb, "t", c.key, nil)) == 1
		if got != c.match {
			t.Errorf("binding %q, key %q: match=%v, want %v", c.binding, c.key, got, c.match)
		}
	}
}

// A hostile mix of "#" and literal words must not take exponential time.
func TestTopicManyHashesStaysFast(t *testing.T) {
	tb := NewTable()
	tb.PutExchange(Exchange{Name: "t", Kind: Topic})
	tb.PutQueue("q")
	tb.Bind(Binding{Source: "t", Dest: QueueDest("q"), Key: strings.Repeat("#.a.", 40) + "b"})
	key := strings.Repeat("a.", 120) + "c"
	done := make(chan []string, 1)
	go func() {
		got, _ := tb.Route("t", key, nil, nil)
		done <- got
	}()
	select {
	case got := <-done:
		if len(got) != 0 {
			t.Fatalf("routed %v, want nothing", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("topic match did not finish: exponential blow-up")
	}
}

func TestDirectFanoutDefault(t *testing.T) {
	tb := NewTable()
	for _, q := range []string{"q1", "q2", "q3"} {
		tb.PutQueue(q)
	}
	tb.Bind(Binding{Source: "amq.direct", Dest: QueueDest("q1"), Key: "k"})
	tb.Bind(Binding{Source: "amq.direct", Dest: QueueDest("q2"), Key: "k"})
	tb.Bind(Binding{Source: "amq.direct", Dest: QueueDest("q3"), Key: "other"})
	if got := route(t, tb, "amq.direct", "k", nil); !eq(got, sorted("q1", "q2")) {
		t.Errorf("direct k: %v", got)
	}
	if got := route(t, tb, "amq.direct", "K", nil); len(got) != 0 {
		t.Errorf("direct keys are case-sensitive: %v", got)
	}
	tb.Bind(Binding{Source: "amq.fanout", Dest: QueueDest("q1"), Key: "ignored"})
	tb.Bind(Binding{Source: "amq.fanout", Dest: QueueDest("q3")})
	if got := route(t, tb, "amq.fanout", "whatever", nil); !eq(got, sorted("q1", "q3")) {
		t.Errorf("fanout: %v", got)
	}
	if got := route(t, tb, "", "q2", nil); !eq(got, sorted("q2")) {
		t.Errorf("default exchange: %v", got)
	}
	if got := route(t, tb, "", "nope", nil); len(got) != 0 {
		t.Errorf("default exchange to a missing queue: %v", got)
	}
	if _, err := tb.Route("missing", "k", nil, nil); err != ErrNoExchange {
		t.Errorf("missing exchange: %v", err)
	}
	if _, err := tb.Route("amq.rabbitmq.trace", "k", nil, nil); err != ErrInternal {
		t.Errorf("internal exchange: %v", err)
	}
}

func TestBindingIdentity(t *testing.T) {
	tb := NewTable()
	tb.PutQueue("q")
	b := Binding{Source: "amq.direct", Dest: QueueDest("q"), Key: "k", Args: wire.Table{"a": int32(1)}}
	if !tb.Bind(b) {
		t.Fatal("first bind not added")
	}
	if tb.Bind(b) {
		t.Fatal("same binding added twice")
	}
	// Different argument type: a different binding, as in RabbitMQ.
	b2 := b
	b2.Args = wire.Table{"a": int64(1)}
	if !tb.Bind(b2) {
		t.Fatal("binding with other args not added")
	}
	if _, ok := tb.Unbind(b); !ok {
		t.Fatal("unbind")
	}
	// q still bound with k through b2.
	if got := route(t, tb, "amq.direct", "k", nil); !eq(got, []string{"q"}) {
		t.Errorf("after removing one of two bindings: %v", got)
	}
	if _, ok := tb.Unbind(b); ok {
		t.Fatal("unbinding twice reported success")
	}
	if _, ok := tb.Unbind(b2); !ok {
		t.Fatal("unbind b2")
	}
	if got := route(t, tb, "amq.direct", "k", nil); len(got) != 0 {
		t.Errorf("after removing both: %v", got)
	}
}

func TestHeadersMatching(t *testing.T) {
	cases := []struct {
		name    string
		binding wire.Table
		headers wire.Table
		match   bool
	}{
		{"all default", wire.Table{"a": "1", "b": "2"}, wire.Table{"a": "1", "b": "2", "c": "3"}, true},
		{"all missing one", wire.Table{"x-match": "all", "a": "1", "b": "2"}, wire.Table{"a": "1"}, false},
		{"all wrong value", wire.Table{"a": "1"}, wire.Table{"a": "2"}, false},
		{"any one", wire.Table{"x-match": "any", "a": "1", "b": "2"}, wire.Table{"b": "2"}, true},
		{"any none", wire.Table{"x-match": "any", "a": "1", "b": "2"}, wire.Table{"c": "2"}, false},
		{"all empty pattern", wire.Table{"x-match": "all"}, nil, true},
		{"all empty pattern headers", wire.Table{}, wire.Table{"a": "1"}, true},
		{"any empty pattern", wire.Table{"x-match": "any"}, wire.Table{"a": "1"}, false},
		{"no headers", wire.Table{"a": "1"}, nil, false},
		{"void is presence", wire.Table{"a": nil}, wire.Table{"a": int32(7)}, true},
		{"void absent", wire.Table{"a": nil}, wire.Table{"b": int32(7)}, false},
		{"numbers across widths", wire.Table{"n": int8(5)}, wire.Table{"n": int64(5)}, true},
		{"unsigned vs signed", wire.Table{"n": uint32(5)}, wire.Table{"n": int16(5)}, true},
		{"int vs float", wire.Table{"n": int32(1)}, wire.Table{"n": float64(1)}, true},
		{"int vs string", wire.Table{"n": int32(1)}, wire.Table{"n": "1"}, false},
		{"string vs bytes", wire.Table{"s": "abc"}, wire.Table{"s": []byte("abc")}, true},
		{"bool", wire.Table{"b": true}, wire.Table{"b": true}, true},
		{"bool vs int", wire.Table{"b": true}, wire.Table{"b": int8(1)}, false},
		{"nested table", wire.Table{"t": wire.Table{"x": int32(1)}}, wire.Table{"t": wire.Table{"x": int64(1)}}, true},
		{"array", wire.Table{"a": []any{"x", int32(2)}}, wire.Table{"a": []any{"x", int8(2)}}, true},
		{"array differs", wire.Table{"a": []any{"x"}}, wire.Table{"a": []any{"x", "y"}}, false},
		// x- keys in the pattern are ignored by all/any ...
		{"all ignores x-", wire.Table{"x-foo": "1", "a": "1"}, wire.Table{"a": "1"}, true},
		{"any ignores x-", wire.Table{"x-match": "any", "x-foo": "1"}, wire.Table{"x-foo": "1"}, false},
		// ... and matched by the -with-x modes (RabbitMQ 3.10).
		{"all-with-x", wire.Table{"x-match": "all-with-x", "x-foo": "1", "a": "1"}, wire.Table{"a": "1"}, false},
		{"all-with-x ok", wire.Table{"x-match": "all-with-x", "x-foo": "1", "a": "1"}, wire.Table{"a": "1", "x-foo": "1"}, true},
		{"any-with-x", wire.Table{"x-match": "any-with-x", "x-foo": "1"}, wire.Table{"x-foo": "1"}, true},
		{"any-with-x never x-match", wire.Table{"x-match": "any-with-x"}, wire.Table{"x-match": "any-with-x"}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tb := NewTable()
			tb.PutQueue("q")
			tb.Bind(Binding{Source: "amq.match", Dest: QueueDest("q"), Args: c.binding})
			got := len(route(t, tb, "amq.match", "ignored", c.headers)) == 1
			if got != c.match {
				t.Fatalf("binding %v, headers %v: match=%v, want %v", c.binding, c.headers, got, c.match)
			}
		})
	}
}

func TestValidateBinding(t *testing.T) {
	if s := ValidateBinding(Headers, wire.Table{"x-match": "bogus"}); s != `Invalid x-match field value <<"bogus">>; expected all, any, all-with-x, or any-with-x` {
		t.Errorf("bad x-match value: %q", s)
	}
	if s := ValidateBinding(Headers, wire.Table{"x-match": int32(1)}); s != "Invalid x-match field type signedint (value 1); expected longstr" {
		t.Errorf("bad x-match type: %q", s)
	}
	for _, ok := range []wire.Table{nil, {"x-match": "all"}, {"x-match": "any-with-x"}, {"a": "b"}} {
		if s := ValidateBinding(Headers, ok); s != "" {
			t.Errorf("%v: %q", ok, s)
		}
	}
	if s := ValidateBinding(Direct, wire.Table{"x-match": "bogus"}); s != "" {
		t.Errorf("direct exchanges ignore arguments: %q", s)
	}
}

func TestExchangeToExchange(t *testing.T) {
	tb := NewTable()
	tb.PutExchange(Exchange{Name: "x1", Kind: Fanout})
	tb.PutExchange(Exchange{Name: "x2", Kind: Topic})
	tb.PutExchange(Exchange{Name: "x3", Kind: Direct, Internal: true})
	for _, q := range []string{"q1", "q2", "q3"} {
		tb.PutQueue(q)
	}
	tb.Bind(Binding{Source: "x1", Dest: ExchangeDest("x2")})
	tb.Bind(Binding{Source: "x1", Dest: QueueDest("q1")})
	tb.Bind(Binding{Source: "x2", Dest: ExchangeDest("x3"), Key: "a.*"})
	tb.Bind(Binding{Source: "x2", Dest: QueueDest("q1"), Key: "#"}) // q1 twice: routed once
	tb.Bind(Binding{Source: "x3", Dest: QueueDest("q3"), Key: "a.b"})
	tb.Bind(Binding{Source: "x3", Dest: ExchangeDest("x1")}) // cycle back to x1
	if got := route(t, tb, "x1", "a.b", nil); !eq(got, sorted("q1", "q3")) {
		t.Errorf("e2e a.b: %v", got)
	}
	if got := route(t, tb, "x1", "z", nil); !eq(got, sorted("q1")) {
		t.Errorf("e2e z: %v", got)
	}
	// Internal exchanges route through e2e bindings but refuse direct publishes.
	if _, err := tb.Route("x3", "a.b", nil, nil); err != ErrInternal {
		t.Errorf("publish to internal: %v", err)
	}
	// Self-binding does not loop.
	tb.Bind(Binding{Source: "x2", Dest: ExchangeDest("x2"), Key: "#"})
	if got := route(t, tb, "x2", "a.b", nil); !eq(got, sorted("q1", "q3")) {
		t.Errorf("self-bound: %v", got)
	}
	// Deleting an exchange removes bindings from and to it.
	r := tb.DeleteExchange("x3")
	if len(r.Exchanges) != 1 || len(r.Bindings) != 3 {
		t.Errorf("delete x3 removed %+v", r)
	}
	if got := route(t, tb, "x1", "a.b", nil); !eq(got, sorted("q1")) {
		t.Errorf("after deleting x3: %v", got)
	}
}

func TestAlternateExchange(t *testing.T) {
	tb := NewTable()
	tb.PutExchange(Exchange{Name: "main", Kind: Direct, Args: wire.Table{"alternate-exchange": "ae"}})
	tb.PutExchange(Exchange{Name: "ae", Kind: Fanout, Args: wire.Table{"alternate-exchange": "main"}})
	tb.PutQueue("routed")
	tb.PutQueue("unrouted")
	tb.Bind(Binding{Source: "main", Dest: QueueDest("routed"), Key: "k"})
	if got := route(t, tb, "main", "k", nil); !eq(got, []string{"routed"}) {
		t.Errorf("routable: %v", got)
	}
	// Nothing bound to ae either: the AE cycle back to main must end.
	if got := route(t, tb, "main", "other", nil); len(got) != 0 {
		t.Errorf("unroutable with empty AE: %v", got)
	}
	tb.Bind(Binding{Source: "ae", Dest: QueueDest("unrouted")})
	if got := route(t, tb, "main", "other", nil); !eq(got, []string{"unrouted"}) {
		t.Errorf("unroutable: %v", got)
	}
	// A missing AE routes nowhere.
	tb.PutExchange(Exchange{Name: "main", Kind: Direct, Args: wire.Table{"alternate-exchange": "gone"}})
	if got := route(t, tb, "main", "other", nil); len(got) != 0 {
		t.Errorf("missing AE: %v", got)
	}
	if got := route(t, tb, "main", "k", nil); !eq(got, []string{"routed"}) {
		t.Errorf("redeclare kept bindings? %v", got)
	}
}

func TestAutoDelete(t *testing.T) {
	tb := NewTable()
	tb.PutExchange(Exchange{Name: "ad", Kind: Fanout, AutoDelete: true})
	tb.PutExchange(Exchange{Name: "ad2", Kind: Fanout, AutoDelete: true})
	tb.PutQueue("q1")
	tb.PutQueue("q2")
	tb.Bind(Binding{Source: "ad", Dest: QueueDest("q1")})
	tb.Bind(Binding{Source: "ad", Dest: QueueDest("q2")})
	tb.Bind(Binding{Source: "ad2", Dest: ExchangeDest("ad")})
	r, ok := tb.Unbind(Binding{Source: "ad", Dest: QueueDest("q1")})
	if !ok || len(r.Exchanges) != 0 {
		t.Fatalf("first unbind: %v %+v", ok, r)
	}
	// Deleting q2 removes ad's last binding: ad goes, and with it the e2e
	// binding from ad2, which was ad2's last: ad2 goes too.
	r = tb.DeleteQueue("q2")
	var names []string
	for _, x := range r.Exchanges {
		names = append(names, x.Name)
	}
	if !eq(names, []string{"ad", "ad2"}) || len(r.Bindings) != 2 {
		t.Fatalf("cascade: exchanges %v bindings %+v", names, r.Bindings)
	}
	if _, ok := tb.Exchange("ad2"); ok {
		t.Fatal("ad2 still there")
	}
	// A fresh auto-delete exchange without bindings stays.
	tb.PutExchange(Exchange{Name: "fresh", Kind: Direct, AutoDelete: true})
	tb.DeleteQueue("q1")
	if _, ok := tb.Exchange("fresh"); !ok {
		t.Fatal("fresh auto-delete exchange deleted without ever having a binding")
	}
}

// Bindings may arrive before their exchange or queue (registry snapshots are
// unordered); they take effect when both ends exist.
func TestOutOfOrderRecords(t *testing.T) {
	tb := NewTable()
	tb.Bind(Binding{Source: "late", Dest: QueueDest("q"), Key: "k"})
	if _, err := tb.Route("late", "k", nil, nil); err != ErrNoExchange {
		t.Fatalf("before the exchange: %v", err)
	}
	tb.PutExchange(Exchange{Name: "late", Kind: Direct})
	if got := route(t, tb, "late", "k", nil); len(got) != 0 {
		t.Fatalf("queue missing, routed %v", got)
	}
	tb.PutQueue("q")
	if got := route(t, tb, "late", "k", nil); !eq(got, []string{"q"}) {
		t.Fatalf("routed %v", got)
	}
	// Redeclaring with another type recompiles the same bindings.
	tb.PutExchange(Exchange{Name: "late", Kind: Fanout})
	if got := route(t, tb, "late", "zzz", nil); !eq(got, []string{"q"}) {
		t.Fatalf("as fanout routed %v", got)
	}
}

func TestLargeFanoutDeduplicated(t *testing.T) {
	tb := NewTable()
	tb.PutExchange(Exchange{Name: "f", Kind: Fanout})
	tb.PutExchange(Exchange{Name: "t", Kind: Topic})
	var want []string
	for i := range 100 {
		q := fmt.Sprintf("q%03d", i)
		want = append(want, q)
		tb.PutQueue(q)
		tb.Bind(Binding{Source: "f", Dest: QueueDest(q)})
		tb.Bind(Binding{Source: "t", Dest: QueueDest(q), Key: "#"})
		tb.Bind(Binding{Source: "t", Dest: QueueDest(q), Key: "a.*"})
	}
	tb.Bind(Binding{Source: "f", Dest: ExchangeDest("t")})
	if got := route(t, tb, "f", "a.b", nil); !eq(got, want) {
		t.Fatalf("got %d queues, want %d: %v", len(got), len(want), got)
	}
}

func TestBindingsListing(t *testing.T) {
	tb := NewTable()
	tb.PutQueue("q")
	b1 := Binding{Source: "amq.topic", Dest: QueueDest("q"), Key: "a"}
	b2 := Binding{Source: "amq.direct", Dest: QueueDest("q"), Key: "b"}
	tb.Bind(b1)
	tb.Bind(b2)
	if got := tb.BindingsTo(QueueDest("q")); len(got) != 2 {
		t.Fatalf("BindingsTo: %+v", got)
	}
	if got := tb.BindingsFrom("amq.topic"); len(got) != 1 || got[0].Key != "a" {
		t.Fatalf("BindingsFrom: %+v", got)
	}
	if !tb.HasBindingsFrom("amq.direct") || tb.HasBindingsFrom("amq.fanout") {
		t.Fatal("HasBindingsFrom")
	}
	if !tb.HasBinding(b1) {
		t.Fatal("HasBinding")
	}
	names := []string{}
	for _, x := range tb.Exchanges() {
		names = append(names, x.Name)
	}
	if !eq(names, []string{"", "amq.direct", "amq.fanout", "amq.headers", "amq.match", "amq.rabbitmq.trace", "amq.topic"}) {
		t.Fatalf("predeclared: %v", names)
	}
}

func TestParseKind(t *testing.T) {
	for _, k := range []Kind{Direct, Fanout, Topic, Headers} {
		got, ok := ParseKind(k.String())
		if !ok || got != k {
			t.Errorf("round trip %v", k)
		}
	}
	if _, ok := ParseKind("x-delayed-message"); ok {
		t.Error("plugin type accepted")
	}
}

func TestConcurrentRouteAndChange(t *testing.T) {
	tb := NewTable()
	tb.PutExchange(Exchange{Name: "t", Kind: Topic})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 200 {
			q := fmt.Sprintf("q%d", i%10)
			tb.PutQueue(q)
			tb.Bind(Binding{Source: "t", Dest: QueueDest(q), Key: "a.#"})
			if i%3 == 0 {
				tb.DeleteQueue(q)
			}
		}
	}()
	for range 500 {
		if _, err := tb.Route("t", "a.b.c", nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	<-done
}
