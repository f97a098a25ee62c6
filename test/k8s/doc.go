// Package k8s tests the marksplit agent against a real Kubernetes API server.
//
// It holds tests, and package depbuild (with ./cmd/k8sdeps) that builds what
// they run: etcd from ./etcd, kube-apiserver from ./kube-apiserver and the
// helm client from ./helm (for docs_test.go, which runs every command block
// of docs/operations.md), each a throwaway module of its own that pins the
// upstream module (go.etcd.io/etcd v3.7.3, k8s.io/kubernetes v1.37.2,
// helm.sh/helm/v4 v4.3.2), so the library's go.mod stays small. Each
// is built once per version and go.sum into
// ${MARKSPLIT_CACHE:-/var/cache/marksplit}. The tests start etcd and the API server in
// a private network namespace, installs the CiliumNode CRD and
// ../../deploy/rbac.yaml exactly as shipped, issues service-account tokens with
// TokenRequests, and runs the agent built from ../../agent the way a pod
// would: service-account token and CA in a kubelet-style directory,
// KUBERNETES_SERVICE_HOST/PORT and NODE_NAME in its environment.
//
// # Running
//
//	make test-k8s      # from the repository root, or:
//	cd test/k8s && go run ./cmd/k8sdeps && MARKSPLIT_KERNEL_TESTS=1 go test -count=1 -v ./...
//
// The tests need root, network namespaces, Go and iproute2, nothing else.
// Without root or namespaces they skip with the reason, unless
// MARKSPLIT_KERNEL_TESTS=1, which turns every skip into a failure. -short
// skips them. The first run builds etcd (about a minute) and kube-apiserver
// (about 8 minutes on an idle 2-core machine); k8sdeps prints their progress,
// and later runs reuse the cached binaries. Building etcd rather than taking
// Debian's etcd-server (3.4) pins the version kube-apiserver 1.37 is built
// against (its client is etcd 3.7) and needs no package manager.
//
// # Network namespaces
//
// etcd and the API server run in a namespace of their own ("apihost"), the
// API server on 192.0.2.1:6443 on a bridge there, etcd on its loopback. Each
// test gets two fresh namespaces: the node (the seed topology: enp7s0 MTU 1450
// at 10.0.0.5, cilium_wg0 MTU 1355, the old approach's lowered route) and its
// gateway at 10.0.0.1. A veth from the node namespace into the apihost bridge
// (192.0.2.N/24 on k8s0) lets the agent reach the API server as a pod on the
// host network would. The test process reaches it by opening its sockets in
// the apihost namespace. Nothing is added to the host's own namespace.
//
// # Debugging
//
// A failing test logs the agent's output and the tail of the API server's log.
// Namespaces are named msk8s-<pid>-<n>; the working directory is
// $TMPDIR/marksplit-k8s-<pid> and holds every log and the audit log. Both are
// removed at the end, and leftovers of a killed run are removed by the next.
package k8s
