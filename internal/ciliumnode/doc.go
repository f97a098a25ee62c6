// Package ciliumnode reads CiliumNode objects from the in-cluster Kubernetes API, with
// net/http only: a Source learns whether this node encrypts (.spec.encryption.key of its
// own CiliumNode); a PeerSource keeps, for every node, its name, InternalIPs and whether it
// encrypts, so that the agent can give exactly the encrypting peers the tunnel MTU.
//
// # Protocol of a Source
//
// A Source GETs /apis/cilium.io/v2/ciliumnodes/<node>, then watches the one object with a
// field selector from the resourceVersion of that GET, asking for bookmarks (etcd 3.4 refuses
// bookmarks on a watch without a resourceVersion). A watch that ends is resumed from the last
// resourceVersion seen; an ERROR event with code 410 (or a 410 answer) means the resourceVersion
// is too old, so the object is read again. Every Config.Resync the object is read again in full
// and a fresh watch starts. A watch that delivers no bytes, not even a bookmark, for
// Config.WatchTimeout is restarted. The service-account token is read from its file before
// every request because the kubelet rotates it; the server is verified with the cluster CA.
//
// # Protocol of a PeerSource
//
// A PeerSource LISTs /apis/cilium.io/v2/ciliumnodes in pages of 500 (limit and continue; a
// continue token that expires, 410, starts the list over), then WATCHes every CiliumNode
// from the list's resourceVersion with bookmarks. Token, CA, back-off, resumption and hang
// detection are a Source's. A 410 (answer or ERROR event) lists again; so does an event
// whose object does not decode (a key that is not an integer, a wrong kind, no name), since
// resuming would replay it. Garbage that is not JSON, a dropped connection and other errors
// resume the watch from the last resourceVersion: the server replays what was missed.
//
// A PeerSource never lists again while its watch is healthy: the watch protocol delivers
// every change after a resourceVersion in order, and bookmarks (about once a minute, and
// before the server's own watch timeout) keep the resourceVersion fresh across quiet
// periods, so a resumed watch misses nothing. A periodic full list would cost every node a
// read of every CiliumNode (5,000 objects, tens of MiB) for no information; client-go's
// informers do not relist periodically either (their resync replays their cache). In steady
// state a node costs the API server one watch request each time the server ends a watch
// (--min-request-timeout, 30–60 min), about 1.3 requests an hour.
//
// Objects are decoded as they stream in, one at a time, into the few fields kept (name,
// InternalIPs, encryption key); no whole object is kept. An object or event larger than
// 4 MiB fails the request. Invalid InternalIPs (not an address, a zone, unspecified,
// loopback, multicast) are left out of the Peer and logged once, when the node appears or
// changes.
//
// # Modes
//
// The node encrypts when .spec.encryption.key is a non-zero integer; a node opted out of node
// encryption has no key. The network.cilium.io/wg-pub-key annotation is present on both and is
// ignored. 404 means Cilium has not registered the node yet; it is not a good read, so nothing
// is reported. Failures (unreachable server, 5xx, 401/403, garbage, an object of the wrong kind)
// are logged in one line, retried with back-off, and never change the reported mode: after a good
// read the last mode stands. A DELETED event is logged and the last mode stands too.
//
// A PeerSource reports nothing before its first complete list, and no failure changes what
// it reported: when the API goes away, the last peer set stands. A list or an event that
// changes a node's name, addresses or mode reports a new snapshot (Peers); one that changes
// only other fields (status updates) reports nothing.
//
// # Concurrency
//
// Run owns all protocol state and calls its report function from its own goroutine only; at
// most one Run may be active on a Source or PeerSource at a time. Stats may be called from
// any goroutine. Config.Backoff is used by Run's goroutine only, since back-off policies are
// not safe for concurrent use: give each source its own. A Peers is immutable and may be
// shared freely.
//
// # Debugging
//
// Stats counts requests by outcome. At debug level the logger shows every good read, list,
// resync and watch resumption; failures are logged at warn level with the server's status and
// message, so RBAC problems (403) name the missing permission. The stand-in API server in
// package apitest serves both protocols for tests, with faults on demand.
package ciliumnode
