// Package ciliumnode learns whether this node encrypts by reading and watching the node's
// CiliumNode object (.spec.encryption.key) in the in-cluster Kubernetes API, with net/http only.
//
// # Protocol
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
// # Modes
//
// The node encrypts when .spec.encryption.key is a non-zero integer; a node opted out of node
// encryption has no key. The network.cilium.io/wg-pub-key annotation is present on both and is
// ignored. 404 means Cilium has not registered the node yet; it is not a good read, so nothing
// is reported. Failures (unreachable server, 5xx, 401/403, garbage, an object of the wrong kind)
// are logged in one line, retried with back-off, and never change the reported mode: after a good
// read the last mode stands. A DELETED event is logged and the last mode stands too.
//
// # Concurrency
//
// Run owns all protocol state and calls its report function from its own goroutine only; at
// most one Run may be active on a Source at a time. Stats may be called from any goroutine.
// Config.Backoff is used by Run's goroutine only, since back-off policies are not safe for
// concurrent use.
//
// # Debugging
//
// Stats counts requests by outcome. At debug level the logger shows every good read, resync and
// watch resumption; failures are logged at warn level with the server's status and message, so
// RBAC problems (403) name the missing permission.
package ciliumnode
