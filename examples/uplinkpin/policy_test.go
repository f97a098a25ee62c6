package main

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/marksplit/marksplit/netwatch"
	"github.com/marksplit/marksplit/netwatch/reconcile"
)

var testConfig = Config{Uplink: "eth1", Mark: 0x100, Mask: 0xff00, Table: 920, Priority: 920, Protocol: 242}

const (
	up       = netwatch.LinkUp | netwatch.LinkLowerUp
	eth0     = 2
	eth1     = 3
	eth1Next = 5 // eth1 after it was deleted and created again
)

var owned = reconcile.Own(920, 920)

func link(index uint32, name string, flags netwatch.LinkFlags) netwatch.Link {
	return netwatch.Link{Index: index, Name: name, MTU: 1500, Flags: flags, Kind: "veth"}
}

// mainDefault is a default route in the main table, as a DHCP client or
// the kernel (from a router advertisement) installs it.
func mainDefault(f netwatch.Family, gw string, index, metric uint32) netwatch.Route {
	r := netwatch.Route{Family: f, Table: netwatch.TableMain, Dst: netip.MustParsePrefix("0.0.0.0/0"),
		Gateway: netip.MustParseAddr(gw), Index: index, Metric: metric, Protocol: netwatch.ProtoDHCP,
		Type: netwatch.RouteUnicast}
	if f == netwatch.IPv6 {
		r.Dst, r.Protocol = netip.MustParsePrefix("::/0"), netwatch.Protocol(9)
	}
	return r
}

// pinned is the route the policy wants in its table.
func pinned(f netwatch.Family, gw string, index uint32) netwatch.Route {
	r := netwatch.Route{Family: f, Table: 920, Dst: netip.MustParsePrefix("0.0.0.0/0"),
		Gateway: netip.MustParseAddr(gw), Index: index, Protocol: 242, Type: netwatch.RouteUnicast}
	if f == netwatch.IPv6 {
		r.Dst = netip.MustParsePrefix("::/0") // metric 0: Plan's 1024
	}
	return r
}

func rule(f netwatch.Family) netwatch.Rule {
	return netwatch.Rule{Family: f, Priority: 920, Table: 920, Action: netwatch.ActionToTable,
		Mark: 0x100, Mask: 0xff00, Protocol: 242}
}

func TestDesired(t *testing.T) {
	links := []netwatch.Link{link(eth0, "eth0", up), link(eth1, "eth1", up)}
	primary := mainDefault(netwatch.IPv4, "198.51.100.1", eth0, 100)
	v4 := mainDefault(netwatch.IPv4, "192.0.2.1", eth1, 200)
	v6 := mainDefault(netwatch.IPv6, "fe80::1", eth1, 1024)
	tests := []struct {
		name string
		snap netwatch.Snapshot
		want reconcile.Desired
	}{{
		name: "no uplink: nothing, and everything owned goes",
		snap: netwatch.Snapshot{Links: links[:1], Routes: []netwatch.Route{primary}},
		want: reconcile.Desired{Own: owned},
	}, {
		name: "the uplink's gateways of both families",
		snap: netwatch.Snapshot{Links: links, Routes: []netwatch.Route{primary, v4, v6}},
		want: reconcile.Desired{Own: owned,
			Routes: new(netwatch.RouteSet).Add(pinned(netwatch.IPv4, "192.0.2.1", eth1), pinned(netwatch.IPv6, "fe80::1", eth1)),
			Rules:  []netwatch.Rule{rule(netwatch.IPv4), rule(netwatch.IPv6)}},
	}, {
		name: "a family without a default route out of the uplink gets nothing",
		snap: netwatch.Snapshot{Links: links, Routes: []netwatch.Route{primary, v6,
			// Not default routes, or not out of the uplink.
			{Family: netwatch.IPv4, Table: netwatch.TableMain, Dst: netip.MustParsePrefix("192.0.2.0/24"),
				Index: eth1, Scope: netwatch.ScopeLink, Type: netwatch.RouteUnicast},
			{Family: netwatch.IPv4, Table: netwatch.TableMain, Dst: netip.MustParsePrefix("10.0.0.0/8"),
				Gateway: netip.MustParseAddr("192.0.2.1"), Index: eth1, Type: netwatch.RouteUnicast},
			{Family: netwatch.IPv4, Table: 100, Dst: netip.MustParsePrefix("0.0.0.0/0"),
				Gateway: netip.MustParseAddr("192.0.2.1"), Index: eth1, Type: netwatch.RouteUnicast},
		}},
		want: reconcile.Desired{Own: owned,
			Routes: new(netwatch.RouteSet).Add(pinned(netwatch.IPv6, "fe80::1", eth1)),
			Rules:  []netwatch.Rule{rule(netwatch.IPv6)}},
	}, {
		name: "uplink down: nothing",
		snap: netwatch.Snapshot{Links: []netwatch.Link{links[0], link(eth1, "eth1", 0)}, Routes: []netwatch.Route{primary, v6}},
		want: reconcile.Desired{Own: owned},
	}, {
		name: "uplink without carrier: nothing",
		snap: netwatch.Snapshot{Links: []netwatch.Link{links[0], link(eth1, "eth1", 0x1)},
			Routes: []netwatch.Route{primary, func() netwatch.Route { r := v4; r.Flags = netwatch.RouteLinkdown; return r }()}},
		want: reconcile.Desired{Own: owned},
	}, {
		name: "several default routes out of the uplink: the lowest metric",
		snap: netwatch.Snapshot{Links: links, Routes: []netwatch.Route{
			mainDefault(netwatch.IPv4, "192.0.2.9", eth1, 300), v4, mainDefault(netwatch.IPv4, "192.0.2.3", eth1, 250)}},
		want: reconcile.Desired{Own: owned,
			Routes: new(netwatch.RouteSet).Add(pinned(netwatch.IPv4, "192.0.2.1", eth1)),
			Rules:  []netwatch.Rule{rule(netwatch.IPv4)}},
	}, {
		name: "an onlink gateway stays onlink",
		snap: netwatch.Snapshot{Links: links, Routes: []netwatch.Route{
			func() netwatch.Route {
				r := mainDefault(netwatch.IPv4, "172.31.1.1", eth1, 0)
				r.Flags = netwatch.RouteOnlink
				return r
			}()}},
		want: reconcile.Desired{Own: owned,
			Routes: new(netwatch.RouteSet).Add(func() netwatch.Route {
				r := pinned(netwatch.IPv4, "172.31.1.1", eth1)
				r.Flags = netwatch.RouteOnlink
				return r
			}()),
			Rules: []netwatch.Rule{rule(netwatch.IPv4)}},
	}, {
		name: "a multipath default route: the path out of the uplink",
		snap: netwatch.Snapshot{Links: links, Routes: []netwatch.Route{{
			Family: netwatch.IPv4, Table: netwatch.TableMain, Dst: netip.MustParsePrefix("0.0.0.0/0"),
			Type: netwatch.RouteUnicast, NextHops: []netwatch.NextHop{
				{Gateway: netip.MustParseAddr("198.51.100.1"), Index: eth0, Weight: 1},
				{Gateway: netip.MustParseAddr("192.0.2.7"), Index: eth1, Weight: 1, Flags: netwatch.RouteOnlink},
			}}}},
		want: reconcile.Desired{Own: owned,
			Routes: new(netwatch.RouteSet).Add(func() netwatch.Route {
				r := pinned(netwatch.IPv4, "192.0.2.7", eth1)
				r.Flags = netwatch.RouteOnlink
				return r
			}()),
			Rules: []netwatch.Rule{rule(netwatch.IPv4)}},
	}, {
		name: "dead paths, gatewayless and non-unicast default routes are no gateway",
		snap: netwatch.Snapshot{Links: links, Routes: []netwatch.Route{
			func() netwatch.Route { r := v4; r.Flags = netwatch.RouteDead; return r }(),
			{Family: netwatch.IPv4, Table: netwatch.TableMain, Dst: netip.MustParsePrefix("0.0.0.0/0"),
				Index: eth1, Metric: 5, Scope: netwatch.ScopeLink, Type: netwatch.RouteUnicast},
			{Family: netwatch.IPv6, Table: netwatch.TableMain, Dst: netip.MustParsePrefix("::/0"),
				Metric: 5, Type: netwatch.RouteUnreachable},
			{Family: netwatch.IPv6, Table: netwatch.TableMain, Dst: netip.MustParsePrefix("::/0"),
				Metric: 6, NHID: 12, Type: netwatch.RouteUnicast},
		}},
		want: reconcile.Desired{Own: owned},
	}, {
		name: "the uplink came back with another index",
		snap: netwatch.Snapshot{Links: []netwatch.Link{links[0], link(eth1Next, "eth1", up)},
			Routes: []netwatch.Route{primary, mainDefault(netwatch.IPv4, "192.0.2.1", eth1Next, 200)}},
		want: reconcile.Desired{Own: owned,
			Routes: new(netwatch.RouteSet).Add(pinned(netwatch.IPv4, "192.0.2.1", eth1Next)),
			Rules:  []netwatch.Rule{rule(netwatch.IPv4)}},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := testConfig.Desired(tt.snap.View())
			// TestNotes checks the notes.
			if diff := cmp.Diff(tt.want, got, cmpopts.EquateComparable(netip.Prefix{}, netip.Addr{}), cmpopts.IgnoreFields(reconcile.Desired{}, "Notes"),
				cmp.Transformer("Routes", func(s *netwatch.RouteSet) []netwatch.Route { return slices.Collect(s.All()) })); diff != "" {
				t.Errorf("Desired (-want +got):\n%s", diff)
			}
		})
	}
}

// TestDesiredPlans checks that the desired state goes through Plan as
// the follow-up of a DHCP renew: the gateway changes in place.
func TestDesiredPlans(t *testing.T) {
	links := []netwatch.Link{link(eth1, "eth1", up)}
	before := netwatch.Snapshot{Links: links, Routes: []netwatch.Route{
		mainDefault(netwatch.IPv4, "192.0.2.254", eth1, 200), pinned(netwatch.IPv4, "192.0.2.1", eth1)},
		Rules: []netwatch.Rule{rule(netwatch.IPv4)}}
	v := before.View()
	ops, err := reconcile.Plan(v, testConfig.Desired(v))
	if err != nil {
		t.Fatal(err)
	}
	want := []netwatch.Op{{Kind: netwatch.RouteReplace, Route: pinned(netwatch.IPv4, "192.0.2.254", eth1),
		Was: pinned(netwatch.IPv4, "192.0.2.1", eth1), HasWas: true}}
	if diff := cmp.Diff(want, ops, cmpopts.EquateComparable(netip.Prefix{}, netip.Addr{})); diff != "" {
		t.Errorf("Plan (-want +got):\n%s", diff)
	}
}

// TestNotes: the policy says why it routes nothing.
func TestNotes(t *testing.T) {
	for _, tt := range []struct {
		name  string
		links []netwatch.Link
		want  []string
	}{
		{"missing", nil, []string{"uplinkpin: uplink eth1 does not exist: marked packets follow the main table"}},
		{"down", []netwatch.Link{link(eth1, "eth1", 0)}, []string{"uplinkpin: uplink eth1 is down: marked packets follow the main table"}},
		{"up", []netwatch.Link{link(eth1, "eth1", up)}, nil},
	} {
		got := testConfig.Desired(netwatch.Snapshot{Links: tt.links}.View()).Notes
		if diff := cmp.Diff(tt.want, got); diff != "" {
			t.Errorf("%s: notes (-want +got):\n%s", tt.name, diff)
		}
	}
}
