//go:build linux

package main

import (
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/marksplit/marksplit/netwatch"
	"github.com/marksplit/marksplit/netwatch/netwatchtest"
)

// TestKernelVPNBypass runs vpnbypass in a fresh network namespace, changes
// the world under it and asks the kernel, after each change, where a
// packet to the chosen prefixes goes without the VPN's mark and with it.
func TestKernelVPNBypass(t *testing.T) {
	ns := newNetNS(t)
	ns.LoUp(t)
	// The underlay: a veth whose peer stays unaddressed in the same
	// namespace (both ends up, so it has carrier), and default routes.
	ns.AddVeth(t, "eth0", nil, "eth0p")
	ns.IP(t, "link", "set", "eth0p", "up")
	ns.IP(t, "link", "set", "eth0", "up")
	ns.IP(t, "addr", "add", "192.0.2.2/24", "dev", "eth0")
	ns.IP(t, "addr", "add", "2001:db8:1::2/64", "dev", "eth0", "nodad")
	ns.IP(t, "route", "add", "default", "via", "192.0.2.1")
	ns.IP(t, "-6", "route", "add", "default", "via", "2001:db8:1::1")

	logs := start(t, ns.NetNS(), "--link", "vpn0", "--prefix", "198.51.100.0/24", "--prefix", "2001:db8:100::/48")

	const v4, v6 = "198.51.100.7", "2001:db8:100::7"
	underlay4 := netwatchtest.Hop{Dev: "eth0", Gateway: netip.MustParseAddr("192.0.2.1")}
	underlay6 := netwatchtest.Hop{Dev: "eth0", Gateway: netip.MustParseAddr("2001:db8:1::1")}
	both := func(t *testing.T, addr string, unmarked, marked netwatchtest.Hop) {
		t.Helper()
		netwatchtest.WaitRoute(t, ns.NetNS(), logs, lookup(addr, 0), unmarked)
		netwatchtest.WaitRoute(t, ns.NetNS(), logs, lookup(addr, 0x80000), marked)
		// Another mark in the same byte is not the VPN's.
		netwatchtest.WaitRoute(t, ns.NetNS(), logs, lookup(addr, 0x40000), unmarked)
	}
	nothingOwned := func(t *testing.T) {
		t.Helper()
		netwatchtest.WaitOwned(t, ns.NetNS(), logs, 910, 910, "")
	}

	t.Log("no VPN link: nothing changes")
	netwatchtest.WaitLog(t, logs, "vpnbypass: started", 1)
	both(t, v4, underlay4, underlay4)
	nothingOwned(t)

	t.Log("the VPN link appears, up, with an address of each family")
	ns.AddTun(t, "vpn0")
	ns.IP(t, "link", "set", "vpn0", "up")
	ns.IP(t, "addr", "add", "100.64.0.1/32", "dev", "vpn0")
	ns.IP(t, "addr", "add", "fd7a::1/128", "dev", "vpn0", "nodad")
	both(t, v4, netwatchtest.Hop{Dev: "vpn0", Table: 910, PrefSrc: netip.MustParseAddr("100.64.0.1")}, underlay4)
	both(t, v6, netwatchtest.Hop{Dev: "vpn0", Table: 910, PrefSrc: netip.MustParseAddr("fd7a::1")}, underlay6)
	netwatchtest.WaitRoute(t, ns.NetNS(), logs, lookup("192.0.2.77", 0), netwatchtest.Hop{Dev: "eth0"}) // outside the prefixes

	t.Log("the VPN link changes address")
	ns.IP(t, "addr", "add", "100.64.0.2/32", "dev", "vpn0")
	ns.IP(t, "addr", "del", "100.64.0.1/32", "dev", "vpn0")
	ns.IP(t, "addr", "add", "fd7a::2/128", "dev", "vpn0", "nodad")
	ns.IP(t, "addr", "del", "fd7a::1/128", "dev", "vpn0")
	both(t, v4, netwatchtest.Hop{Dev: "vpn0", Table: 910, PrefSrc: netip.MustParseAddr("100.64.0.2")}, underlay4)
	both(t, v6, netwatchtest.Hop{Dev: "vpn0", Table: 910, PrefSrc: netip.MustParseAddr("fd7a::2")}, underlay6)

	t.Log("the VPN link goes down: everything owned is removed")
	ns.IP(t, "link", "set", "vpn0", "down")
	both(t, v4, underlay4, underlay4)
	both(t, v6, underlay6, underlay6)
	nothingOwned(t)

	t.Log("the VPN link comes up again (its IPv6 address went with the down)")
	ns.IP(t, "link", "set", "vpn0", "up")
	both(t, v4, netwatchtest.Hop{Dev: "vpn0", Table: 910, PrefSrc: netip.MustParseAddr("100.64.0.2")}, underlay4)
	both(t, v6, netwatchtest.Hop{Dev: "vpn0", Table: 910}, underlay6)

	t.Log("someone deletes the rule: it comes back")
	n := strings.Count(logs.String(), "rule 910: not fwmark 0x80000/0xff0000 lookup 910")
	ns.IP(t, "rule", "del", "pref", "910")
	netwatchtest.WaitLog(t, logs, "rule 910: not fwmark 0x80000/0xff0000 lookup 910", n+1)
	both(t, v4, netwatchtest.Hop{Dev: "vpn0", Table: 910, PrefSrc: netip.MustParseAddr("100.64.0.2")}, underlay4)

	t.Log("someone adds a route to the table and changes one: the table is put back")
	ns.IP(t, "route", "add", "203.0.113.0/24", "dev", "eth0", "table", "910")
	ns.IP(t, "route", "replace", "198.51.100.0/24", "dev", "eth0", "table", "910")
	netwatchtest.WaitRoute(t, ns.NetNS(), logs, lookup("203.0.113.9", 0), underlay4)
	both(t, v4, netwatchtest.Hop{Dev: "vpn0", Table: 910, PrefSrc: netip.MustParseAddr("100.64.0.2")}, underlay4)

	t.Log("the VPN link is deleted: everything owned is removed")
	ns.IP(t, "link", "del", "vpn0")
	both(t, v4, underlay4, underlay4)
	both(t, v6, underlay6, underlay6)
	nothingOwned(t)

	t.Log("the VPN link is created again, with another index and address")
	ns.AddTun(t, "vpn0")
	ns.IP(t, "addr", "add", "100.64.0.3/32", "dev", "vpn0")
	ns.IP(t, "link", "set", "vpn0", "up")
	both(t, v4, netwatchtest.Hop{Dev: "vpn0", Table: 910, PrefSrc: netip.MustParseAddr("100.64.0.3")}, underlay4)
	both(t, v6, netwatchtest.Hop{Dev: "vpn0", Table: 910}, underlay6)
}

// TestKernelSignal builds vpnbypass, runs it in a namespace and checks that
// SIGTERM ends it with status 0, leaving its routes in place.
func TestKernelSignal(t *testing.T) {
	ns := newNetNS(t)
	bin := netwatchtest.BuildProgram(t, "vpnbypass")
	ns.AddTun(t, "vpn0")
	ns.IP(t, "link", "set", "vpn0", "up")

	prog, logs := ns.StartBinary(t, bin, "--link", "vpn0", "--prefix", "198.51.100.0/24")
	netwatchtest.WaitRoute(t, ns.NetNS(), logs, lookup("198.51.100.7", 0), netwatchtest.Hop{Dev: "vpn0", Table: 910})
	prog.Stop(t, syscall.SIGTERM)
	netwatchtest.WaitRoute(t, ns.NetNS(), logs, lookup("198.51.100.7", 0), netwatchtest.Hop{Dev: "vpn0", Table: 910})
}

// TestKernelFight: a program deleting the rule as fast as it can does not
// make vpnbypass spin, and the rule is back once it stops.
func TestKernelFight(t *testing.T) {
	ns := newNetNS(t)
	ns.AddTun(t, "vpn0")
	ns.IP(t, "link", "set", "vpn0", "up")
	logs := start(t, ns.NetNS(), "--link", "vpn0", "--prefix", "198.51.100.0/24")
	hop := netwatchtest.Hop{Dev: "vpn0", Table: 910}
	netwatchtest.WaitRoute(t, ns.NetNS(), logs, lookup("198.51.100.7", 0), hop)
	ns.CheckFight(t, logs, "rule del pref 910", "rule 910: not fwmark 0x80000/0xff0000 lookup 910", 1500*time.Millisecond, func() bool {
		got, _ := netwatchtest.RouteGet(ns.NetNS(), netwatchtest.Lookup{Dst: netip.MustParseAddr("198.51.100.7")})
		return hop.Matches(got)
	})
}

// lookup is the route lookup of a packet to addr with mark.
func lookup(addr string, mark netwatch.Mark) netwatchtest.Lookup {
	return netwatchtest.Lookup{Dst: netip.MustParseAddr(addr), Mark: mark}
}
