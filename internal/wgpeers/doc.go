// Package wgpeers reads the peers of a WireGuard device: each peer's public
// key, endpoint and allowed IPs, and the device's own fwmark, for the
// kernel's WireGuard and for userspace implementations (wireguard-go)
// alike, through golang.zx2c4.com/wireguard/wgctrl. It is the agent's peer
// source for a WireGuard mesh that is not Cilium's (--wireguard-link).
//
// # Following changes
//
// Nothing tells a reader that a device changed: the kernel's WireGuard
// generic netlink family has no multicast group (drivers/net/wireguard/
// netlink.c registers its family without mcgrps; a roaming endpoint, a peer
// that `wg set` adds or removes, changed allowed IPs: none of them is
// announced), and wireguard-go's UAPI socket answers requests only. A
// Source therefore polls: it reads the device every Interval and reports a
// Device only when it differs from the one reported before. The agent's
// floor for the interval is MinInterval.
//
// # What is kept
//
// Read converts at the edge: wgtypes values stop here. A Device keeps the
// fwmark and, per peer, the public key, endpoint and allowed IPs (masked,
// sorted), and nothing else: no private or preshared key, no counters or
// handshake times (they change on every read and say nothing about
// routes).
//
// # Network namespaces
//
// The kernel's devices are read over a generic netlink socket in the
// network namespace of the process; wireguard-go's through its UAPI socket,
// /var/run/wireguard/<dev>.sock, in the process's mount namespace (a
// wireguard-go run under `unshare -m` is seen only from that namespace).
//
// # Debugging
//
// `wg show <dev>` prints what a Source reads. Diff names each change in
// the words the agent logs.
package wgpeers
