// Package console owns the web console served under /console/ on the HTTP side port
// (http.listen): server-rendered pages of the proxy's state (overview with message rates and
// the KubeMQ backend, Pub/Sub topics and subscriptions, AMQP virtual hosts, exchanges,
// queues, bindings, connections, the lease engine per queue) and a few admin actions (purge,
// delete, publish a test message, peek).
//
// Access: every page and action sits behind the side port's admin guard (a loopback peer, or
// the admin token), as GET /state does: the pages show what /state shows. A browser on
// another host presents the token once on /console/login; it is kept in an HttpOnly,
// SameSite=Strict cookie scoped to /console/ and handed to the guard as the Authorization
// header. A request without a token whose Host header is a name other than localhost is
// refused (a DNS-rebinding page would otherwise reach the console through a loopback browser).
//
// Actions are POSTs to /console/action/{name} that must carry the header
// "X-Console-Request: 1" and, when the browser sends Origin or Sec-Fetch-Site, come from the
// console's own origin: an HTML form of another site can set neither, and a cross-origin
// fetch with a custom header needs a CORS preflight the console never grants.
//
// The package reads the front-ends through small interfaces (State, Topology, TopicIDs, the
// Pub/Sub service handlers, PurgeQueue, ...) so it imports neither front-end; their State is
// read through its JSON form, the same document GET /state serves.
package console
