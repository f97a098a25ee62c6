// Package pathmtu keeps each peer's path MTU for the agent: the largest
// packet the underlay path to the peer carries, where it came from
// (declared, learned from ICMP, probed) and how old it is, and the inner
// MTU that path allows the tunnel (InnerMTU), which mtupolicy puts on the
// peer's host route.
//
// # Sources and safety
//
// A declared value (--path-mtu=CIDR=BYTES, the longest prefix wins) is
// the operator's: it is never probed and nothing measured replaces it.
// Otherwise values learned from ICMP and probed ones are measurements,
// and the store keeps to RFC 8899's rules: a lower value takes effect at
// once; a higher one only when two measurements agree at least
// Store.RaiseAfter apart; a peer that stops answering keeps its last
// value (an unreachable result changes nothing); no value goes above the
// tunnel MTU (InnerMTU is capped by the caller's tunnel MTU in State and
// Inner).
//
// # Concurrency
//
// A Store's methods are safe for concurrent use. It reads no clock but
// the one it is given (Store.Now), does no I/O and logs nothing: each
// method that changes a value returns the Change for the caller to log
// and count.
package pathmtu
