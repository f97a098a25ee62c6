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

var testConfig = Config{
	Link:     "tailscale0",
	Prefixes: []netip.Prefix{netip.MustParsePrefix("10.8.0.0/16"), netip.MustParsePrefix("fd00:8::/64")},
	Mark:     0x80000,
	Mask:     0xff0000,
	Table:    910,
	Priority: 910,
	Protocol: 241,
}

const (
	up      = netwatch.LinkUp | netwatch.LinkLowerUp
	eth0    = 2
	vpn     = 7
	vpnNext = 9 // the link after it was deleted and created again
)

var owned = reconcile.Own(910, 910)

func link(index uint32, name string, flags netwatch.LinkFlags) netwatch.Link {
	return netwatch.Link{Index: index, Name: name, MTU: 1280, Flags: flags, Kind: "tun"}
}

func addr(index uint32, prefix string, scope netwatch.Scope, flags netwatch.AddrFlags) netwatch.Addr {
	return netwatch.Addr{Index: index, Prefix: netip.MustParsePrefix(prefix), Scope: scope, Flags: flags}
}

func route4(dst string, index uint32, src string) netwatch.Route {
	r := netwatch.Route{Family: netwatch.IPv4, Table: 910, Dst: netip.MustParsePrefix(dst), Index: index,
		Protocol: 241, Scope: netwatch.ScopeLink, Type: netwatch.RouteUnicast}
	if src != "" {
		r.PrefSrc = netip.MustParseAddr(src)
	}
	return r
}

func route6(dst string, index uint32, src string) netwatch.Route {
	r := netwatch.Route{Family: netwatch.IPv6, Table: 910, Dst: netip.MustParsePrefix(dst), Index: index,
		Protocol: 241, Type: netwatch.RouteUnicast} // metric 0: Plan's 1024
	if src != "" {
		r.PrefSrc = netip.MustParseAddr(src)
	}
	return r
}

func rule(f netwatch.Family) netwatch.Rule {
	return netwatch.Rule{Family: f, Priority: 910, Table: 910, Action: netwatch.ActionToTable,
		Invert: true, Mark: 0x80000, Mask: 0xff0000, Protocol: 241}
}

var bothRules = []netwatch.Rule{rule(netwatch.IPv4), rule(netwatch.IPv6)}

func TestDesired(t *testing.T) {
	ethLink := link(eth0, "eth0", up)
	ethAddr := addr(eth0, "192.0.2.2/24", netwatch.ScopeUniverse, 0x80)
	tests := []struct {
		name string
		cfg  Config // testConfig when zero
		snap netwatch.Snapshot
		want reconcile.Desired
	}{{
		name: "no VPN link: nothing, and everything owned goes",
		snap: netwatch.Snapshot{Links: []netwatch.Link{ethLink}, Addrs: []netwatch.Addr{ethAddr}},
		want: reconcile.Desired{Own: owned},
	}, {
		name: "VPN link down: nothing",
		snap: netwatch.Snapshot{
			Links: []netwatch.Link{ethLink, link(vpn, "tailscale0", 0)},
			Addrs: []netwatch.Addr{addr(vpn, "100.64.0.1/32", netwatch.ScopeUniverse, 0x80)},
		},
		want: reconcile.Desired{Own: owned},
	}, {
		name: "VPN link up with an address of each family",
		snap: netwatch.Snapshot{
			Links: []netwatch.Link{ethLink, link(vpn, "tailscale0", up)},
			Addrs: []netwatch.Addr{ethAddr,
				addr(vpn, "100.64.0.1/32", netwatch.ScopeUniverse, 0x80),
				addr(vpn, "fd7a:115c:a1e0::1/128", netwatch.ScopeUniverse, 0x80),
				addr(vpn, "fe80::1/64", netwatch.ScopeLink, 0x80)},
		},
		want: reconcile.Desired{Own: owned,
			Routes: new(netwatch.RouteSet).Add(route4("10.8.0.0/16", vpn, "100.64.0.1"), route6("fd00:8::/64", vpn, "fd7a:115c:a1e0::1")),
			Rules:  bothRules},
	}, {
		name: "up without carrier is up: a tun whose process has not attached yet",
		snap: netwatch.Snapshot{
			Links: []netwatch.Link{link(vpn, "tailscale0", 0x1)},
			Addrs: []netwatch.Addr{addr(vpn, "100.64.0.1/32", netwatch.ScopeUniverse, 0x80)},
		},
		want: reconcile.Desired{Own: owned,
			Routes: new(netwatch.RouteSet).Add(route4("10.8.0.0/16", vpn, "100.64.0.1"), route6("fd00:8::/64", vpn, "")),
			Rules:  bothRules},
	}, {
		name: "no address: routes without a source; another link's address is not used",
		snap: netwatch.Snapshot{
			Links: []netwatch.Link{ethLink, link(vpn, "tailscale0", up)},
			Addrs: []netwatch.Addr{ethAddr},
		},
		want: reconcile.Desired{Own: owned,
			Routes: new(netwatch.RouteSet).Add(route4("10.8.0.0/16", vpn, ""), route6("fd00:8::/64", vpn, "")),
			Rules:  bothRules},
	}, {
		name: "unusable addresses are skipped: tentative, failed, deprecated, link and host scope",
		snap: netwatch.Snapshot{
			Links: []netwatch.Link{link(vpn, "tailscale0", up)},
			Addrs: []netwatch.Addr{
				addr(vpn, "100.64.0.9/32", netwatch.ScopeHost, 0x80),
				addr(vpn, "169.254.0.1/16", netwatch.ScopeLink, 0x80),
				addr(vpn, "fd7a::1/128", netwatch.ScopeUniverse, 0x40),
				addr(vpn, "fd7a::2/128", netwatch.ScopeUniverse, 0x08),
				addr(vpn, "fd7a::3/128", netwatch.ScopeUniverse, 0x20),
				addr(vpn, "fd7a::4/128", netwatch.ScopeUniverse, 0x02|0x80)},
		},
		want: reconcile.Desired{Own: owned,
			Routes: new(netwatch.RouteSet).Add(route4("10.8.0.0/16", vpn, ""), route6("fd00:8::/64", vpn, "fd7a::4")),
			Rules:  bothRules},
	}, {
		name: "a primary address before a secondary one, then the lowest",
		snap: netwatch.Snapshot{
			Links: []netwatch.Link{link(vpn, "tailscale0", up)},
			Addrs: []netwatch.Addr{
				addr(vpn, "100.64.0.1/10", netwatch.ScopeUniverse, 0x01),
				addr(vpn, "100.64.0.5/10", netwatch.ScopeUniverse, 0),
				addr(vpn, "100.64.0.3/10", netwatch.ScopeUniverse, 0),
				addr(vpn, "fd7a::9/64", netwatch.ScopeUniverse, 0x01),
			},
		},
		want: reconcile.Desired{Own: owned,
			Routes: new(netwatch.RouteSet).Add(route4("10.8.0.0/16", vpn, "100.64.0.3"), route6("fd00:8::/64", vpn, "fd7a::9")),
			Rules:  bothRules},
	}, {
		name: "the link came back with another index",
		snap: netwatch.Snapshot{
			Links: []netwatch.Link{link(vpnNext, "tailscale0", up)},
			Addrs: []netwatch.Addr{addr(vpnNext, "100.64.0.1/32", netwatch.ScopeUniverse, 0x80)},
			// What it installed for the old link is gone or stale:
			// the desired state does not depend on it.
			Routes: []netwatch.Route{route4("10.8.0.0/16", vpn, "100.64.0.1")},
			Rules:  []netwatch.Rule{rule(netwatch.IPv4)},
		},
		want: reconcile.Desired{Own: owned,
			Routes: new(netwatch.RouteSet).Add(route4("10.8.0.0/16", vpnNext, "100.64.0.1"), route6("fd00:8::/64", vpnNext, "")),
			Rules:  bothRules},
	}, {
		name: "IPv4 prefixes only: the IPv6 rule is not wanted, but IPv6 stays owned",
		cfg: func() Config {
			c := testConfig
			c.Prefixes = []netip.Prefix{netip.MustParsePrefix("10.8.0.0/16"), netip.MustParsePrefix("0.0.0.0/0")}
			return c
		}(),
		snap: netwatch.Snapshot{
			Links: []netwatch.Link{link(vpn, "tailscale0", up)},
			Addrs: []netwatch.Addr{addr(vpn, "100.64.0.1/32", netwatch.ScopeUniverse, 0x80)},
		},
		want: reconcile.Desired{Own: owned,
			Routes: new(netwatch.RouteSet).Add(route4("10.8.0.0/16", vpn, "100.64.0.1"), route4("0.0.0.0/0", vpn, "100.64.0.1")),
			Rules:  []netwatch.Rule{rule(netwatch.IPv4)}},
	}, {
		name: "a link of another name is not the VPN",
		snap: netwatch.Snapshot{
			Links: []netwatch.Link{link(vpn, "tailscale1", up)},
			Addrs: []netwatch.Addr{addr(vpn, "100.64.0.1/32", netwatch.ScopeUniverse, 0x80)},
		},
		want: reconcile.Desired{Own: owned},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := tt.cfg
			if cfg.Link == "" {
				cfg = testConfig
			}
			got := cfg.Desired(tt.snap.View())
			// TestNotes checks the notes.
			if diff := cmp.Diff(tt.want, got, cmpopts.EquateComparable(netip.Prefix{}, netip.Addr{}), cmpopts.IgnoreFields(reconcile.Desired{}, "Notes"),
				cmp.Transformer("Routes", func(s *netwatch.RouteSet) []netwatch.Route { return slices.Collect(s.All()) })); diff != "" {
				t.Errorf("Desired (-want +got):\n%s", diff)
			}
		})
	}
}

// TestNotes: the policy says why it routes nothing.
func TestNotes(t *testing.T) {
	for _, tt := range []struct {
		name  string
		links []netwatch.Link
		want  []string
	}{
		{"missing", nil, []string{"vpnbypass: link tailscale0 does not exist: nothing is routed through it"}},
		{"down", []netwatch.Link{link(vpn, "tailscale0", 0)}, []string{"vpnbypass: link tailscale0 is down: nothing is routed through it"}},
		{"up", []netwatch.Link{link(vpn, "tailscale0", up)}, nil},
	} {
		got := testConfig.Desired(netwatch.Snapshot{Links: tt.links}.View()).Notes
		if diff := cmp.Diff(tt.want, got); diff != "" {
			t.Errorf("%s: notes (-want +got):\n%s", tt.name, diff)
		}
	}
}
