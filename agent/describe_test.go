package main

import (
	"net/netip"
	"testing"

	"github.com/marksplit/marksplit/netwatch"
)

func TestDescribe(t *testing.T) {
	links := func(i uint32) (netwatch.Link, bool) {
		switch i {
		case 2:
			return netwatch.Link{Index: 2, Name: "enp7s0", MTU: 1450}, true
		case 3:
			return netwatch.Link{Index: 3, Name: "eth1", MTU: 1500}, true
		}
		return netwatch.Link{}, false
	}
	pfx, addr := netip.MustParsePrefix, netip.MustParseAddr
	table := netwatch.Route{
		Family: netwatch.IPv4, Table: 900, Dst: pfx("10.0.0.0/16"), Gateway: addr("10.0.0.1"), Index: 2,
		PrefSrc: addr("10.0.0.5"), MTU: 1355, Protocol: 109, Type: netwatch.RouteUnicast,
	}
	mtu := func(r netwatch.Route, m uint32) netwatch.Route { r.MTU = m; return r }
	main := netwatch.Route{
		Family: netwatch.IPv4, Table: netwatch.TableMain, Dst: pfx("10.0.0.0/16"), Gateway: addr("10.0.0.1"), Index: 2,
		PrefSrc: addr("10.0.0.5"), MTU: 1355, Protocol: netwatch.ProtoDHCP, Type: netwatch.RouteUnicast,
	}
	rule := netwatch.Rule{Family: netwatch.IPv4, Priority: 900, Table: 900, Action: netwatch.ActionToTable,
		Invert: true, Mark: 0xe00, Mask: 0xf00, Protocol: 109}
	rule6 := rule
	rule6.Family = netwatch.IPv6
	other := table
	other.Gateway, other.Index, other.PrefSrc = netip.Addr{}, 3, netip.Addr{}
	throw := netwatch.Route{Family: netwatch.IPv4, Table: 900, Dst: pfx("10.0.7.0/24"), Type: netwatch.RouteThrow, Protocol: 109}
	gone := table
	gone.Index = 42
	v6 := netwatch.Route{Family: netwatch.IPv6, Table: 900, Dst: pfx("fd00::/64"), Gateway: addr("fe80::1"), Index: 2,
		Metric: 1024, MTU: 1355, Type: netwatch.RouteUnicast}

	tests := []struct {
		op   netwatch.Op
		want string
	}{
		{netwatch.Op{Kind: netwatch.RouteReplace, Route: table},
			"table 900: 10.0.0.0/16 via 10.0.0.1 dev enp7s0 src 10.0.0.5 mtu 1355"},
		{netwatch.Op{Kind: netwatch.RuleAdd, Rule: rule},
			"rule 900: not fwmark 0xe00/0xf00 lookup 900"},
		{netwatch.Op{Kind: netwatch.RouteReplace, Route: mtu(main, 1450), Was: main, HasWas: true, Repair: true},
			"dhcp route 10.0.0.0/16 mtu 1450 (was 1355)"},
		{netwatch.Op{Kind: netwatch.RouteReplace, Route: mtu(main, 0), Was: main, HasWas: true, Repair: true},
			"dhcp route 10.0.0.0/16 mtu 1450 (was 1355)"},
		{netwatch.Op{Kind: netwatch.RouteReplace, Route: mtu(table, 1420), Was: table, HasWas: true},
			"table 900: 10.0.0.0/16 via 10.0.0.1 dev enp7s0 src 10.0.0.5 mtu 1420 (was 1355)"},
		{netwatch.Op{Kind: netwatch.RouteReplace, Route: other, Was: table, HasWas: true},
			"table 900: 10.0.0.0/16 dev eth1 (was enp7s0) mtu 1355 (was via 10.0.0.1) (was src 10.0.0.5)"},
		{netwatch.Op{Kind: netwatch.RouteReplace, Route: table, Was: mtu(table, 0), HasWas: true},
			"table 900: 10.0.0.0/16 via 10.0.0.1 dev enp7s0 src 10.0.0.5 mtu 1355 (was unset)"},
		{netwatch.Op{Kind: netwatch.RouteDelete, Route: table},
			"table 900: removed 10.0.0.0/16 via 10.0.0.1 dev enp7s0 src 10.0.0.5 mtu 1355"},
		{netwatch.Op{Kind: netwatch.RouteDelete, Route: gone},
			"table 900: removed 10.0.0.0/16 via 10.0.0.1 dev #42 src 10.0.0.5 mtu 1355"},
		{netwatch.Op{Kind: netwatch.RouteReplace, Route: throw},
			"table 900: throw 10.0.7.0/24"},
		{netwatch.Op{Kind: netwatch.RouteReplace, Route: v6},
			"table 900: fd00::/64 via fe80::1 dev enp7s0 metric 1024 mtu 1355"},
		{netwatch.Op{Kind: netwatch.RuleDelete, Rule: rule},
			"rule 900: removed not fwmark 0xe00/0xf00 lookup 900"},
		{netwatch.Op{Kind: netwatch.RuleAdd, Rule: rule6},
			"rule 900 (inet6): not fwmark 0xe00/0xf00 lookup 900"},
	}
	for _, tt := range tests {
		if got := describe(tt.op, links); got != tt.want {
			t.Errorf("describe(%v %v)\n got %q\nwant %q", tt.op.Kind, tt.op.Route, got, tt.want)
		}
	}
}
