// Command vpnbypass sends chosen prefixes through a VPN link for every
// packet except the VPN's own, the shape Tailscale uses:
//
//	ip route replace PREFIX dev tailscale0 src 100.64.0.1 table 910 proto 241
//	ip rule add not fwmark 0x80000/0xff0000 lookup 910 pref 910 proto 241
//
// The VPN's encapsulated packets carry its mark and fall through to the
// main table, so they still leave by the underlay; everything else to
// PREFIX enters the tunnel. The table follows the VPN link: it is filled
// when the link appears and is up, its routes take the link's new address
// as source, and everything vpnbypass owns is removed while the link is
// down or absent.
//
// vpnbypass owns its table and its rule priority, in both families, and
// nothing else. It leaves its routes in place when it stops; `vpnbypass
// cleanup` removes them, and `vpnbypass plan` shows what it would change.
//
// It is an example of a policy embedding netwatch: main.go is its flags,
// policy.go its policy, and program.Program the rest (the subcommands run,
// once, plan and cleanup, the single-instance lock, the watcher, and on
// each change Read → Config.Desired → reconcile.Plan → Applier.Apply).
//
// Table and priority 910 collide with nothing known: Cilium uses
// priorities 1, 8–10, 20, 100, 109–112 and tables 200–202, 2004, 2005,
// 10+N, 300+N; Tailscale table 52 and priorities 5210–5270; the marksplit
// agent 900 (protocol 109); uplinkpin 920 (242). Protocol 241 is in no
// iproute2 or daemon list. The default mark is Tailscale's "this packet is
// mine" bit.
package main
