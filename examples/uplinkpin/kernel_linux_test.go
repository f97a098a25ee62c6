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

// TestKernelUplinkPin runs uplinkpin in a fresh network namespace with two
// uplinks, changes the world under it and asks the kernel, after each
// change, where a packet goes without the mark and with it.
func TestKernelUplinkPin(t *testing.T) {
	ns := newNetNS(t)
	ns.LoUp(t)
	// Two uplinks, each a veth whose peer stays unaddressed in the same
	// namespace: taking the peer down takes the uplink's carrier away.
	for _, l := range []struct{ name, v4, v6 string }{
		{"eth0", "198.51.100.2/24", "2001:db8:1::2/64"},
		{"eth1", "192.0.2.2/24", "2001:db8:2::2/64"},
	} {
		ns.AddVeth(t, l.name, nil, l.name+"p")
		ns.IP(t, "link", "set", l.name+"p", "up")
		ns.IP(t, "link", "set", l.name, "up")
		ns.IP(t, "addr", "add", l.v4, "dev", l.name)
		ns.IP(t, "addr", "add", l.v6, "dev", l.name, "nodad")
	}
	// eth0 is the primary uplink; eth1's default routes, as its DHCP
	// client and router advertisements would install them, come second.
	ns.IP(t, "route", "add", "default", "via", "198.51.100.1", "dev", "eth0", "metric", "100")
	ns.IP(t, "-6", "route", "add", "default", "via", "2001:db8:1::1", "dev", "eth0", "metric", "100")
	ns.IP(t, "route", "add", "default", "via", "192.0.2.1", "dev", "eth1", "metric", "200", "proto", "dhcp")
	ns.IP(t, "-6", "route", "add", "default", "via", "2001:db8:2::1", "dev", "eth1", "metric", "200", "proto", "ra")

	logs := start(t, ns.NetNS(), "--uplink", "eth1", "--mark", "0x100/0xff00")

	const v4, v6 = "203.0.113.9", "2001:db8:ff::9"
	primary4 := netwatchtest.Hop{Dev: "eth0", Gateway: netip.MustParseAddr("198.51.100.1")}
	primary6 := netwatchtest.Hop{Dev: "eth0", Gateway: netip.MustParseAddr("2001:db8:1::1")}
	pinned := func(gw string) netwatchtest.Hop {
		return netwatchtest.Hop{Dev: "eth1", Gateway: netip.MustParseAddr(gw), Table: 920}
	}
	both := func(t *testing.T, addr string, unmarked, marked netwatchtest.Hop) {
		t.Helper()
		netwatchtest.WaitRoute(t, ns.NetNS(), logs, lookup(addr, 0), unmarked)
		netwatchtest.WaitRoute(t, ns.NetNS(), logs, lookup(addr, 0x100), marked)
		netwatchtest.WaitRoute(t, ns.NetNS(), logs, lookup(addr, 0x10101), marked) // bits outside the mask do not matter
		netwatchtest.WaitRoute(t, ns.NetNS(), logs, lookup(addr, 0x200), unmarked) // another mark under the mask
	}
	nothingOwned := func(t *testing.T) {
		t.Helper()
		netwatchtest.WaitOwned(t, ns.NetNS(), logs, 920, 920, "")
	}

	t.Log("both uplinks up: marked packets leave by eth1")
	both(t, v4, primary4, pinned("192.0.2.1"))
	both(t, v6, primary6, pinned("2001:db8:2::1"))

	t.Log("a DHCP renew changes eth1's gateway")
	ns.IP(t, "route", "replace", "default", "via", "192.0.2.254", "dev", "eth1", "metric", "200", "proto", "dhcp")
	ns.IP(t, "-6", "route", "replace", "default", "via", "2001:db8:2::fe", "dev", "eth1", "metric", "200", "proto", "ra")
	both(t, v4, primary4, pinned("192.0.2.254"))
	both(t, v6, primary6, pinned("2001:db8:2::fe"))
	netwatchtest.WaitLog(t, logs, "table 920: default via 192.0.2.254 dev eth1 (was default via 192.0.2.1 dev eth1)", 1)

	t.Log("eth1 loses carrier: everything owned is removed")
	ns.IP(t, "link", "set", "eth1p", "down")
	both(t, v4, primary4, primary4)
	nothingOwned(t)

	t.Log("eth1's carrier returns, with its routes")
	ns.IP(t, "link", "set", "eth1p", "up")
	both(t, v4, primary4, pinned("192.0.2.254"))
	both(t, v6, primary6, pinned("2001:db8:2::fe"))

	t.Log("eth1 goes down: the kernel flushes its routes, uplinkpin its own")
	ns.IP(t, "link", "set", "eth1", "down")
	both(t, v4, primary4, primary4)
	both(t, v6, primary6, primary6)
	nothingOwned(t)

	t.Log("eth1 comes up and its DHCP client installs the default route again")
	ns.IP(t, "link", "set", "eth1", "up")
	ns.IP(t, "route", "add", "default", "via", "192.0.2.1", "dev", "eth1", "metric", "200", "proto", "dhcp")
	both(t, v4, primary4, pinned("192.0.2.1"))
	both(t, v6, primary6, primary6) // its IPv6 address went with the down: no IPv6 default route

	t.Log("someone deletes the rule: it comes back")
	n := strings.Count(logs.String(), "rule 920: fwmark 0x100/0xff00 lookup 920")
	ns.IP(t, "rule", "del", "pref", "920")
	netwatchtest.WaitLog(t, logs, "rule 920: fwmark 0x100/0xff00 lookup 920", n+1)
	both(t, v4, primary4, pinned("192.0.2.1"))

	t.Log("someone adds a route to the table: it is removed")
	ns.IP(t, "route", "add", "10.9.0.0/16", "via", "198.51.100.1", "dev", "eth0", "table", "920")
	netwatchtest.WaitRoute(t, ns.NetNS(), logs, lookup("10.9.0.1", 0x100), pinned("192.0.2.1"))
	netwatchtest.WaitOwned(t, ns.NetNS(), logs, 920, 920, "-4 route default via 192.0.2.1 dev eth1 table 920 proto 242\n"+
		"-4 rule 920:\tfrom all fwmark 0x100/0xff00 lookup 920 proto 242")

	t.Log("eth1's lease is lost: its default route goes, and so does the pin")
	ns.IP(t, "route", "del", "default", "via", "192.0.2.1", "dev", "eth1")
	both(t, v4, primary4, primary4)
	nothingOwned(t)

	t.Log("a new lease, then eth1 is deleted")
	ns.IP(t, "route", "add", "default", "via", "192.0.2.1", "dev", "eth1", "metric", "200", "proto", "dhcp")
	both(t, v4, primary4, pinned("192.0.2.1"))
	ns.IP(t, "link", "del", "eth1")
	both(t, v4, primary4, primary4)
	nothingOwned(t)
}

// TestKernelSignal builds uplinkpin, runs it in a namespace and checks that
// SIGINT ends it with status 0, leaving its routes in place.
func TestKernelSignal(t *testing.T) {
	ns := newNetNS(t)
	bin := netwatchtest.BuildProgram(t, "uplinkpin")
	ns.AddVeth(t, "eth1", nil, "eth1p")
	ns.IP(t, "link", "set", "eth1p", "up")
	ns.IP(t, "link", "set", "eth1", "up")
	ns.IP(t, "addr", "add", "192.0.2.2/24", "dev", "eth1")
	ns.IP(t, "route", "add", "default", "via", "192.0.2.1")

	prog, logs := ns.StartBinary(t, bin, "--uplink", "eth1", "--mark", "0x100/0xff00")
	want := netwatchtest.Hop{Dev: "eth1", Gateway: netip.MustParseAddr("192.0.2.1"), Table: 920}
	netwatchtest.WaitRoute(t, ns.NetNS(), logs, lookup("203.0.113.9", 0x100), want)
	prog.Stop(t, syscall.SIGINT)
	netwatchtest.WaitRoute(t, ns.NetNS(), logs, lookup("203.0.113.9", 0x100), want)
}

// TestKernelFight: a program deleting the rule as fast as it can does not
// make uplinkpin spin, and the rule is back once it stops.
func TestKernelFight(t *testing.T) {
	ns := newNetNS(t)
	ns.LoUp(t)
	ns.AddVeth(t, "eth1", nil, "eth1p")
	ns.IP(t, "link", "set", "eth1p", "up")
	ns.IP(t, "link", "set", "eth1", "up")
	ns.IP(t, "addr", "add", "192.0.2.2/24", "dev", "eth1")
	ns.IP(t, "route", "add", "default", "via", "192.0.2.1", "dev", "eth1", "metric", "200", "proto", "dhcp")
	logs := start(t, ns.NetNS(), "--uplink", "eth1", "--mark", "0x100/0xff00")
	hop := netwatchtest.Hop{Dev: "eth1", Gateway: netip.MustParseAddr("192.0.2.1"), Table: 920}
	netwatchtest.WaitRoute(t, ns.NetNS(), logs, lookup("203.0.113.9", 0x100), hop)
	ns.CheckFight(t, logs, "rule del pref 920", "rule 920: fwmark 0x100/0xff00 lookup 920", 1500*time.Millisecond, func() bool {
		got, _ := netwatchtest.RouteGet(ns.NetNS(), netwatchtest.Lookup{Dst: netip.MustParseAddr("203.0.113.9"), Mark: 0x100})
		return hop.Matches(got)
	})
}

// lookup is the route lookup of a packet to addr with mark.
func lookup(addr string, mark netwatch.Mark) netwatchtest.Lookup {
	return netwatchtest.Lookup{Dst: netip.MustParseAddr(addr), Mark: mark}
}
