// Package kubeapi is the agent's small client of the Kubernetes API server: the
// in-cluster address, an HTTPS client that trusts only the cluster's CA and never
// follows a redirect, a bearer token read again for every request (the kubelet
// rotates it), and one-line errors from the server's Status answers.
//
// It is what the CiliumNode sources (package ciliumnode), the metrics server's
// authentication and the Node's Events share, so that every request the agent
// sends is made one way: over verified TLS, with bounded bodies, and with the
// token never leaving for another host or in clear text.
//
// It also holds the one list-watch loop (ListWatch, with StartWatch for a watch's resync
// and silence timers) that the CiliumNode sources and package kubewatch run through their
// hooks: read, watch from the resourceVersion with bookmarks, resume, read again on 410,
// on an event that cannot be skipped and every resync, and back off after failures.
package kubeapi
