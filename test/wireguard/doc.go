// Package wireguard tests the marksplit agent for the effect it exists for,
// on a real WireGuard tunnel: WireGuard's own packets are no longer
// fragmented, and nothing sent through the tunnel is lost.
//
// The tests build the agent from ../../agent and wireguard-go from
// ./wireguard-go (a module of its own that pins golang.zx2c4.com/wireguard,
// so that neither this module's nor the library's go.mod depends on it),
// cached in ${MARKSPLIT_CACHE:-/var/cache/marksplit}. Where the kernel has
// the wireguard module, the kernel's WireGuard is used instead. `wg` comes
// from Debian's wireguard-tools (`make test` installs it without
// recommends). Package tunnel holds the traffic and counters they measure
// with, and ./cmd/wgtunnel gives them to `make demo`. Each test logs which
// WireGuard it used ("WireGuard: kernel (module 1.0.0)" or "WireGuard:
// wireguard-go"). MARKSPLIT_AGENT names a prebuilt agent, and
// MARKSPLIT_WIREGUARD=kernel fails the tests where the kernel has no
// WireGuard: `make test-kernels` sets both in its guests, and
// MARKSPLIT_TIME_SCALE=20 there (Go and WireGuard's crypto run 15–30 times
// slower under QEMU's TCG): every time limit of the tests is that many
// times longer and each bulk transfer that many times smaller (at least
// 1 MB), with the same checks.
//
// # Running
//
//	make test-wireguard   # from the repository root, or:
//	cd test/wireguard && MARKSPLIT_KERNEL_TESTS=1 go test -count=1 -v ./...
//	go test -count=1 -v -run TestKernelWireGuardEffect -agent-mark=0xd00/0xf00   # must FAIL
//
// The tests need root, network namespaces, /dev/net/tun (for wireguard-go),
// Go, iproute2, util-linux (unshare, nsenter) and wg. Without them they skip
// with the reason, unless MARKSPLIT_KERNEL_TESTS=1, which turns every skip
// into a failure. -short skips them.
//
// # Network namespaces
//
// Each test builds three: a gateway (a bridge at 10.0.0.1/16), the worker
// (enp7s0 at MTU 1450, 10.0.0.5, its private route lowered to 1355 as the
// old polling loop left it) and a peer node (10.0.0.9). Each node has
// cilium_wg0 at MTU 1355 with fwmark 0xe00, as Cilium configures it, and a
// tunnel address (10.244.5.1, 10.244.9.1) that traffic is sent between.
// Each wireguard-go runs under `unshare -m` with a private tmpfs on /run:
// its control socket /run/wireguard/cilium_wg0.sock is one path for the
// whole host. Nothing is added to the host's own namespace.
//
// TestKernelWireGuardMesh builds a mesh without Cilium instead: the worker
// and three peers (10.0.0.11–13), each with wg0 (MTU 1380), the worker's
// with fwmark 0x1e00, and runs the agent with --wireguard-link=wg0 (under
// wireguard-go, in the worker's wireguard-go mount namespace, where its
// UAPI socket is) while `wg set` adds and removes peers, roams an endpoint
// and changes allowed IPs.
//
// TestKernelWireGuardPathMTU (issue 35) builds a router instead of the
// gateway's bridge and three peers behind it (10.0.1.9–10.0.3.9), each on a
// path of its own: full (1450), a silent black hole (the router's end 1450,
// the peer's 1300: frames up to 1304 bytes pass, larger ones vanish with no
// ICMP) and a hop of 1368 bytes that sends ICMP. The agent runs with
// --peers=auto against internal/apitest's stand-in API server, in the
// worker's namespace, and each peer answers probes with internal/pathprobe's
// responder (the module replaces the library with ../..). Host TCP to the
// peers is redirected into cilium_wg0 as in TestKernelWireGuardHostTraffic.
//
// # Debugging
//
// A failing test logs the agent's output. Namespaces are named
// mswg-<pid>-<n>-{gw,w,p}; they are removed at the end of each test, and a
// killed run's leftovers by the next run.
package wireguard
