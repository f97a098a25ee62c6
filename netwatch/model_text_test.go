package netwatch

import (
	"net/netip"
	"testing"
)

// testLinks resolves the links of the describe tests, as View.Link does;
// index 5 and 42 are gone.
func testLinks(i uint32) (Link, bool) {
	switch i {
	case 2:
		return Link{Index: 2, Name: "enp7s0", MTU: 1450}, true
	case 3:
		return Link{Index: 3, Name: "eth1", MTU: 1500}, true
	case 7:
		return Link{Index: 7, Name: "tailscale0", MTU: 1280}, true
	}
	return Link{}, false
}

func TestOpDescribe(t *testing.T) {
	pfx, addr := netip.MustParsePrefix, netip.MustParseAddr
	table := Route{
		Family: IPv4, Table: 900, Dst: pfx("10.0.0.0/16"), Gateway: addr("10.0.0.1"), Index: 2,
		PrefSrc: addr("10.0.0.5"), MTU: 1355, Protocol: 109, Type: RouteUnicast,
	}
	mtu := func(r Route, m uint32) Route { r.MTU = m; return r }
	mainRt := Route{
		Family: IPv4, Table: TableMain, Dst: pfx("10.0.0.0/16"), Gateway: addr("10.0.0.1"), Index: 2,
		PrefSrc: addr("10.0.0.5"), MTU: 1355, Protocol: ProtoDHCP, Type: RouteUnicast,
	}
	rule := Rule{Family: IPv4, Priority: 900, Table: 900, Action: ActionToTable,
		Invert: true, Mark: 0xe00, Mask: 0xf00, Protocol: 109}
	rule6 := rule
	rule6.Family = IPv6
	other := table
	other.Gateway, other.Index, other.PrefSrc = netip.Addr{}, 3, netip.Addr{}
	throw := Route{Family: IPv4, Table: 900, Dst: pfx("10.0.7.0/24"), Type: RouteThrow, Protocol: 109}
	gone := table
	gone.Index = 42
	v6 := Route{Family: IPv6, Table: 900, Dst: pfx("fd00::/64"), Gateway: addr("fe80::1"), Index: 2,
		Metric: 1024, MTU: 1355, Type: RouteUnicast}

	tests := []struct {
		op   Op
		want string
	}{
		{Op{Kind: RouteReplace, Route: table},
			"table 900: 10.0.0.0/16 via 10.0.0.1 dev enp7s0 src 10.0.0.5 mtu 1355"},
		{Op{Kind: RuleAdd, Rule: rule},
			"rule 900: not fwmark 0xe00/0xf00 lookup 900"},
		{Op{Kind: RouteReplace, Route: mtu(mainRt, 1450), Was: mainRt, HasWas: true, Repair: true},
			"dhcp route 10.0.0.0/16 mtu 1450 (was 1355)"},
		{Op{Kind: RouteReplace, Route: mtu(mainRt, 0), Was: mainRt, HasWas: true, Repair: true},
			"dhcp route 10.0.0.0/16 mtu 1450 (was 1355)"},
		{Op{Kind: RouteReplace, Route: mtu(table, 1420), Was: table, HasWas: true},
			"table 900: 10.0.0.0/16 via 10.0.0.1 dev enp7s0 src 10.0.0.5 mtu 1420 (was 1355)"},
		{Op{Kind: RouteReplace, Route: other, Was: table, HasWas: true},
			"table 900: 10.0.0.0/16 dev eth1 mtu 1355 (was 10.0.0.0/16 via 10.0.0.1 dev enp7s0 src 10.0.0.5 mtu 1355)"},
		{Op{Kind: RouteReplace, Route: table, Was: mtu(table, 0), HasWas: true},
			"table 900: 10.0.0.0/16 via 10.0.0.1 dev enp7s0 src 10.0.0.5 mtu 1355 (was unset)"},
		{Op{Kind: RouteDelete, Route: table},
			"table 900: removed 10.0.0.0/16 via 10.0.0.1 dev enp7s0 proto 109 src 10.0.0.5 mtu 1355"},
		{Op{Kind: RouteDelete, Route: gone},
			"table 900: removed 10.0.0.0/16 via 10.0.0.1 dev if42 proto 109 src 10.0.0.5 mtu 1355"},
		{Op{Kind: RouteReplace, Route: throw},
			"table 900: throw 10.0.7.0/24"},
		{Op{Kind: RouteReplace, Route: v6},
			"table 900: fd00::/64 via fe80::1 dev enp7s0 metric 1024 mtu 1355"},
		{Op{Kind: RuleDelete, Rule: rule},
			"rule 900: removed not fwmark 0xe00/0xf00 lookup 900 proto 109"},
		{Op{Kind: RuleAdd, Rule: rule6},
			"rule 900 (inet6): not fwmark 0xe00/0xf00 lookup 900"},
	}
	for _, tt := range tests {
		if got := tt.op.Describe(testLinks); got != tt.want {
			t.Errorf("Describe(%v %v)\n got %q\nwant %q", tt.op.Kind, tt.op.Route, got, tt.want)
		}
	}
}

// TestOpDescribePath: a replaced owned route whose path changed is
// written out whole before and after; the rest as Describe always writes
// them.
func TestOpDescribePath(t *testing.T) {
	pfx, addr := netip.MustParsePrefix, netip.MustParseAddr
	was := Route{Family: IPv4, Table: 920, Dst: pfx("0.0.0.0/0"), Gateway: addr("192.0.2.1"), Index: 3, Protocol: 242, Type: RouteUnicast}
	now := was
	now.Gateway = addr("192.0.2.254")
	repaired := Route{Family: IPv4, Table: TableMain, Dst: pfx("10.0.0.0/16"), Index: 3, MTU: 1355, Protocol: ProtoDHCP}
	fixed := repaired
	fixed.MTU = 1500
	rule := Rule{Family: IPv4, Priority: 920, Table: 920, Action: ActionToTable, Mark: 0x100, Mask: 0xff00}
	vpn := Route{Family: IPv4, Table: 910, Dst: pfx("10.8.0.0/16"), Index: 7, PrefSrc: addr("100.64.0.1"),
		Protocol: 241, Scope: ScopeLink, Type: RouteUnicast}
	vpnWas := vpn
	vpnWas.PrefSrc = addr("100.64.0.7")
	gone := Route{Family: IPv6, Table: 910, Dst: pfx("fd00:8::/64"), Index: 5, Metric: 1024, Type: RouteUnicast}

	tests := []struct {
		op   Op
		want string
	}{
		{Op{Kind: RouteReplace, Route: now, Was: was, HasWas: true},
			"table 920: default via 192.0.2.254 dev eth1 (was default via 192.0.2.1 dev eth1)"},
		{Op{Kind: RouteReplace, Route: now},
			"table 920: default via 192.0.2.254 dev eth1"},
		{Op{Kind: RouteDelete, Route: now},
			"table 920: removed default via 192.0.2.254 dev eth1 proto 242"},
		{Op{Kind: RuleAdd, Rule: rule},
			"rule 920: fwmark 0x100/0xff00 lookup 920"},
		{Op{Kind: RouteReplace, Route: vpn, Was: vpnWas, HasWas: true},
			"table 910: 10.8.0.0/16 dev tailscale0 scope link src 100.64.0.1 (was 10.8.0.0/16 dev tailscale0 scope link src 100.64.0.7)"},
		{Op{Kind: RouteDelete, Route: gone},
			"table 910: removed fd00:8::/64 dev if5 metric 1024"},
		{Op{Kind: RuleDelete, Rule: Rule{Family: IPv6, Priority: 910, Table: 910, Action: ActionToTable, Invert: true, Mark: 0x80000, Mask: 0xff0000}},
			"rule 910 (inet6): removed not fwmark 0x80000/0xff0000 lookup 910"},
		{Op{Kind: RouteReplace, Route: fixed, Was: repaired, HasWas: true, Repair: true},
			"dhcp route 10.0.0.0/16 mtu 1500 (was 1355)"},
	}
	for _, tt := range tests {
		if got := tt.op.Describe(testLinks); got != tt.want {
			t.Errorf("Describe(%v %v)\n got %q\nwant %q", tt.op.Kind, tt.op.Route, got, tt.want)
		}
	}
}
