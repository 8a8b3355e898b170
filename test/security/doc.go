// Package security holds the proxy's security tests, run against the built
// binary: AMQPS with a configured certificate, client certificates as SASL
// EXTERNAL, TLS towards KubeMQ, and the KubeMQ auth token (from config, and
// the AMQP password passed through). Certificates are generated per test.
package security
