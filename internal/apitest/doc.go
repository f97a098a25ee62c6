// Package apitest is a stand-in Kubernetes API server, over TLS, for the tests of any
// package in this module: it serves the CiliumNodes marksplit's readers use and the token
// reviews its secure metrics listener asks for, and lets a test change the objects and
// break the protocol on purpose.
//
// # What it serves
//
// Under /apis/cilium.io/v2/ciliumnodes, for GET requests with the right bearer token:
//
//   - LIST, paginated with limit and continue. Every page of one list is cut from one
//     snapshot taken at its first page, so it is consistent, as the real server's; a
//     continue token dies with Compact, Restart or when newer lists push it out (410 Expired).
//     Options.MaxPageSize caps a page whatever the limit, as servers may.
//   - WATCH (watch=1) from a resourceVersion: newline-delimited JSON events ADDED, MODIFIED,
//     DELETED, BOOKMARK (with allowWatchBookmarks=true: every Options.BookmarkInterval, on
//     Bookmark, and before a watch's deadline) and ERROR. A watch from a resourceVersion older
//     than the kept history (Options.History events, or since Compact) gets an ERROR event 410,
//     as from kube-apiserver; from "" or "0" it starts with an ADDED event per object. It lasts
//     timeoutSeconds, or Options.MinRequestTimeout × [1, 2) as kube-apiserver's do.
//   - GET of one object by name, and the fieldSelector metadata.name=NAME on lists and
//     watches (the single-object reader's watch).
//
// And, for POST requests with the right bearer token, TokenReviews (a token of
// Options.Users is that user) and SubjectAccessReviews of non-resource URLs (allowed for
// "get" on the paths Options.Allowed gives the user).
//
// Objects are rendered like a Cilium 1.19 cluster's CiliumNodes (labels, the WireGuard
// public-key annotation on every node, InternalIP and CiliumInternalIP addresses, IPAM and
// health fields), so a reader has to pick its few fields out of a realistic object.
// spec.encryption.key is present only when non-zero, as on an opted-out node.
//
// # Faults
//
// Inject queues faults for the next requests of a kind (a status answer, garbage, a dropped
// connection, no answer at all, a redirect); SetEndlessList makes every list endless.
// ExpireWatches, DropWatches, EndWatches, HangWatches and SendRaw act on the open watches;
// Compact forgets the history; Restart does to the
// clients what an API server that restarted and lost its state does (every connection cut,
// every older resourceVersion and continue token gone: clients must list again); SetDown
// cuts every request while set.
//
// # Credentials
//
// The server has its own CA (ECDSA, made at Start) and a serving certificate for
// 127.0.0.1, ::1, localhost, kubernetes.default.svc and the listener's address.
// WriteServiceAccount writes a token and ca.crt into a directory the way the kubelet
// mounts them (MARKSPLIT_SERVICEACCOUNT_DIR-style); SetToken changes the token the server
// accepts and RotateToken both. Env returns KUBERNETES_SERVICE_HOST and _PORT for a child
// process.
//
// # Concurrency
//
// Every method is safe for concurrent use. Changes are numbered by one resourceVersion
// counter; each Put, Delete or Update returns the resourceVersion of its event, and the
// event reaches every open watch in order.
//
// # Counting
//
// Count and Counts count requests by Kind, faults included; a request refused for its
// token counts as KindUnauthorized only.
package apitest
