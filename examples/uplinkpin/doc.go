// Command uplinkpin makes packets that carry a mark leave by a chosen
// uplink, through that uplink's current gateway:
//
//	ip route replace default via GATEWAY dev eth1 table 920 proto 242
//	ip rule add fwmark 0x100/0xff00 lookup 920 pref 920 proto 242
//
// The gateway is learned, per family, from the main table's default route
// out of the uplink (the one a DHCP client or router advertisements
// install; the lowest metric when there are several), so the table follows
// a DHCP renew that changes it. While the uplink is down, has no carrier,
// or has no such default route, the family's route and rule are removed
// and marked packets follow the main table.
//
// uplinkpin owns its table and its rule priority, in both families, and
// nothing else. It leaves its routes in place when it stops; `uplinkpin
// cleanup` removes them, and `uplinkpin plan` shows what it would change.
//
// It is an example of a policy embedding netwatch: main.go is its flags,
// policy.go its policy, and program.Program the rest (the subcommands run,
// once, plan and cleanup, the single-instance lock, the watcher, and on
// each change Read → Config.Desired → reconcile.Plan → Applier.Apply).
//
// Table and priority 920 collide with nothing known: Cilium uses
// priorities 1, 8–10, 20, 100, 109–112 and tables 200–202, 2004, 2005,
// 10+N, 300+N; Tailscale table 52 and priorities 5210–5270; the marksplit
// agent 900 (protocol 109); vpnbypass 910 (241). Protocol 242 is in no
// iproute2 or daemon list.
package main
