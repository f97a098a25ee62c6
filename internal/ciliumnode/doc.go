// Package ciliumnode reads CiliumNode objects from the in-cluster Kubernetes API, with
// net/http only: a Source learns whether this node encrypts (.spec.encryption.key of its
// own CiliumNode); a PeerSource keeps, for every node, its name, InternalIPs and whether it
// encrypts, so that the agent can give exactly the encrypting peers the tunnel MTU.
//
// # The list-watch loop
//
// A Source and a PeerSource run one loop (listwatch.go, around kubeapi.ListWatch, which
// package kubewatch shares) and differ only in what they read and keep. The loop reads the
// whole state, then watches from its resourceVersion asking for
// bookmarks (etcd 3.4 refuses bookmarks on a watch without a resourceVersion). A watch that
// ends is resumed from the last resourceVersion seen; an ERROR event with code 410 (or a 410
// answer) means the resourceVersion is too old, so the state is read again; so does an event
// whose object cannot be skipped (a wrong kind, no name), since resuming would replay it.
// Garbage that is not JSON, a dropped connection and other errors resume the watch: the
// server replays what was missed. A watch that completes no event, not even a bookmark, for
// Config.WatchTimeout is restarted: the timer counts events, not bytes, so a server that
// trickles bytes does not keep a dead watch open. Failures back off (Config.Backoff), and a
// watch that keeps failing right after a read is not retried hot.
//
// The service-account token is read from its file before every request because the
// kubelet rotates it. It goes only to Config.Server, which must be https://, over TLS
// verified with the cluster CA: no redirect is ever followed (kube-apiserver never
// redirects these requests); a 3xx answer fails the request.
//
// A Source GETs /apis/cilium.io/v2/ciliumnodes/<node> and watches the one object with a
// field selector; every Config.Resync it reads the object again and starts a fresh watch.
//
// A PeerSource LISTs /apis/cilium.io/v2/ciliumnodes in pages of 500 (limit and continue; a
// continue token that expires, 410, starts the list over) and watches every CiliumNode. It
// never lists again while its watch is healthy: the watch protocol delivers every change
// after a resourceVersion in order, and bookmarks (about once a minute, and before the
// server's own watch timeout) keep the resourceVersion fresh across quiet periods, so a
// resumed watch misses nothing. A periodic full list would cost every node a read of every
// CiliumNode (5,000 objects, tens of MiB) for no information; client-go's informers do not
// relist periodically either. In steady state a node costs the API server one watch request
// each time the server ends a watch (--min-request-timeout, 30–60 min).
//
// # Bounds
//
// Objects are decoded as they stream in, one at a time, into the few fields kept (name,
// InternalIPs, encryption key), and spec.addresses element by element; no whole object is
// kept. Whatever the server sends, a reader stays within tens of MiB (TestHostileMemory
// measures it):
//
//   - A list of more than MaxListPages pages, of items beyond MaxPeerBytes (some 80,000
//     nodes of a real cluster), or of more than ten empty pages in a row fails: the last
//     nodes stand. Each empty page is followed by a wait of the back-off, which grows.
//     A server's remainingItemCount sizes nothing.
//   - Of a node, at most MaxNodeAddrs InternalIPs are kept (the node's Peer.Problem says so);
//     Peers.Encrypting returns at most MaxPeerAddrs addresses and counts the others.
//   - An object or event larger than 4 MiB that was read whole is skipped like an object
//     with a field of the wrong type: the rest of the list or watch is used, the node's last
//     good entry stands, marked with a Problem (or the node is listed by Peers.Problems
//     alone). One that does not end fails the request after 16 MiB.
//   - An InternalIP that is no other host's unicast address (not an address, with a zone,
//     unspecified, loopback, multicast, link-local, 255.255.255.255) is left out and logged
//     once per change of its node, quoted as sent, with the reason.
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
// changes a node's name, addresses, mode or problem reports a new snapshot (Peers); one that
// changes only other fields (status updates) reports nothing. A Source that reads an object
// of its node that does not decode (a key that is a string) reads it again with back-off;
// the last mode stands meanwhile.
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
