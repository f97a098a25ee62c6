// Package metricsserver serves an agent's /metrics and probes over HTTP, or its
// /metrics over HTTPS, within limits that no client can push past: Serve holds
// at most Limits.MaxConns connections, and when they are all taken a new one
// sheds an idle one (ShedListener) instead of waiting behind it.
//
// # Who can block whom
//
// A connection counts as idle until its request reaches the handler, and again
// once its answer is written. When every slot is taken, the next connection
// the kernel hands over makes room by closing one idle connection: of the
// client holding the most connections (a remote address, an IPv6 /64; on
// loopback, the user who owns the other end, from NETLINK_SOCK_DIAG), the one
// that finished an answer longest ago, else the one that has waited longest
// for its first request. So a flood of idle connections, from a local user or
// from the network, costs the server at most MaxConns descriptors and never
// keeps out a probe or a scraper that sends its request at once: each sheds
// one of the flood's connections, never one of its own kind.
//
// # TLS
//
// TLSConfig serves the certificate of a pair of files, read again when one
// changes (a file that is not a regular file, such as a FIFO, is refused at
// once and the last good certificate stays), or a self-signed ECDSA P-256
// certificate made in memory and made again before it ends. HTTPS is HTTP/1.1
// alone: one request at a time per connection, so MaxConns bounds the requests.
//
// # Concurrency
//
// Serve runs until its context ends, then shuts the server down within a
// second. A ShedListener and the TLS configuration are safe for concurrent
// use.
package metricsserver
