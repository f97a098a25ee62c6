package mtupolicy_test

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"pgregory.net/rapid"

	"github.com/marksplit/marksplit/mtupolicy"
	"github.com/marksplit/marksplit/netwatch"
	"github.com/marksplit/marksplit/netwatch/reconcile"
)

// DesiredPeers on the fixture node of policy_test.go: peers on the node
// network (10.0.0.0/16 via 10.0.0.1, lowered to the tunnel MTU), on the
// public subnet (connected), beyond the default routes, and IPv6 on link.

func peerConfig() mtupolicy.Config {
	c := mtupolicy.DefaultConfig()
	c.Peers = true
	return c
}

// host is a host route the peer policy installs, for a test to adjust.
func host(dst string, f func(*netwatch.Route)) netwatch.Route {
	a := addr(dst)
	r := netwatch.Route{Family: netwatch.FamilyOf(a), Table: 900, Dst: netip.PrefixFrom(a, a.BitLen()), MTU: 1355,
		Protocol: mtupolicy.DefaultProtocol, Type: netwatch.RouteUnicast}
	f(&r)
	return r.Clean() // an IPv6 metric 0 is the kernel's 1024, as the policy says
}

var (
	// Through 10.0.0.0/16 via 10.0.0.1: src is the primary address in the
	// peer's subnet (10.0.0.3 is secondary).
	hPeer9 = host("10.0.0.9", func(r *netwatch.Route) { r.Gateway, r.Index, r.PrefSrc = addr("10.0.0.1"), idxEnp, addr("10.0.0.5") })
	// Through the default route via 203.0.113.1 dev eth0 (MTU 1500): src
	// the address whose subnet holds the gateway; the tunnel's MTU.
	hFar = host("192.0.2.7", func(r *netwatch.Route) {
		r.Gateway, r.Index, r.PrefSrc = addr("203.0.113.1"), idxEth, addr("203.0.113.10")
	})
	// On the public subnet, connected: no gateway, scope link, the
	// route's own prefsrc.
	hPublic = host("203.0.113.7", func(r *netwatch.Route) {
		r.Index, r.PrefSrc, r.Scope = idxEth, addr("203.0.113.10"), netwatch.ScopeLink
	})
	// IPv6 on link: metric 1024 (the kernel's for none), the link's
	// global address.
	hPeer6 = host("2001:db8::9", func(r *netwatch.Route) { r.Index, r.PrefSrc = idxEnp, addr("2001:db8::5") })
	// IPv6 beyond the default route via fe80::1 dev eth0, which has no
	// IPv6 address: the kernel chooses the source.
	hFar6 = host("2001:db8:77::9", func(r *netwatch.Route) { r.Gateway, r.Index = addr("fe80::1"), idxEth })
)

func peerAddrs(ss ...string) []netip.Addr {
	var as []netip.Addr
	for _, s := range ss {
		as = append(as, addr(s))
	}
	return as
}

func TestDesiredPeers(t *testing.T) {
	mainRoute := func(dst string, f func(*netwatch.Route)) netwatch.Route {
		r := netwatch.Route{Family: netwatch.FamilyOf(pfx(dst).Addr()), Table: netwatch.TableMain, Dst: pfx(dst),
			Protocol: netwatch.ProtoStatic, Type: netwatch.RouteUnicast}
		f(&r)
		return r
	}
	tests := []struct {
		name   string
		change func(*netwatch.Snapshot)
		cfg    func(*mtupolicy.Config)
		mode   mtupolicy.Mode
		peers  []netip.Addr
		inner  mtupolicy.InnerMTUs
		want   reconcile.Desired
	}{
		{
			name:  "each peer's inner MTU where it is smaller than the tunnel's, never below the family's minimum",
			peers: peerAddrs("10.0.0.9", "192.0.2.7", "203.0.113.7", "2001:db8::9", "2001:db8:77::9"),
			inner: mtupolicy.InnerMTUs{
				addr("10.0.0.9"):       1296, // a path of 1368 bytes
				addr("192.0.2.7"):      1420, // larger than the tunnel's: the tunnel's
				addr("2001:db8::9"):    1216, // a path of 1296: below 1280, not installed
				addr("2001:db8:77::9"): 1280, // a path of 1368: exactly the minimum
				addr("10.9.9.9"):       1000, // no peer's: ignored
			},
			want: reconcile.Desired{
				Own: ownedEverywhere,
				Routes: new(netwatch.RouteSet).Add(with(hPeer9, func(r *netwatch.Route) { r.MTU = 1296 }), hFar, hPublic, hPeer6,
					with(hFar6, func(r *netwatch.Route) { r.MTU = 1280 })),
				Rules:   []netwatch.Rule{rule4, rule6},
				Repairs: []netwatch.Route{nodeNetRepair},
			},
		},
		{
			name:  "every kind of path, and the lowered route repaired once",
			peers: peerAddrs("10.0.0.9", "10.0.0.10", "192.0.2.7", "203.0.113.7", "2001:db8::9", "2001:db8:77::9"),
			want: reconcile.Desired{
				Own: ownedEverywhere,
				Routes: new(netwatch.RouteSet).Add(hPeer9,
					with(hPeer9, func(r *netwatch.Route) { r.Dst = pfx("10.0.0.10/32") }),
					hFar, hPublic, hPeer6, hFar6),
				Rules:   []netwatch.Rule{rule4, rule6},
				Repairs: []netwatch.Route{nodeNetRepair},
			},
		},
		{
			name:  "repair off",
			cfg:   func(c *mtupolicy.Config) { c.Repair = false },
			peers: peerAddrs("10.0.0.9"),
			want:  reconcile.Desired{Own: ownedEverywhere, Routes: new(netwatch.RouteSet).Add(hPeer9), Rules: []netwatch.Rule{rule4}},
		},
		{
			name: "the default route is never repaired",
			change: func(s *netwatch.Snapshot) {
				i := slices.IndexFunc(s.Routes, func(r netwatch.Route) bool { return r.Key() == defaultV4.Key() })
				s.Routes[i].MTU = 1355
			},
			peers: peerAddrs("192.0.2.7"),
			want:  reconcile.Desired{Own: ownedEverywhere, Routes: new(netwatch.RouteSet).Add(hFar), Rules: []netwatch.Rule{rule4}},
		},
		{
			name: "a lowered proto kernel route (Cilium's) is never repaired",
			change: func(s *netwatch.Snapshot) {
				i := slices.IndexFunc(s.Routes, func(r netwatch.Route) bool { return r.Key() == nodeNet.Key() })
				s.Routes[i].Protocol = netwatch.ProtoKernel
			},
			peers: peerAddrs("10.0.0.9"),
			want:  reconcile.Desired{Own: ownedEverywhere, Routes: new(netwatch.RouteSet).Add(hPeer9), Rules: []netwatch.Rule{rule4}},
		},
		{
			name:  "no peers: the owned scope only",
			peers: nil,
			want:  reconcile.Desired{Own: ownedEverywhere},
		},
		{
			name:  "this host, link-local and multicast addresses are no peers",
			peers: peerAddrs("10.0.0.5", "10.0.0.3", "127.0.0.1", "169.254.1.1", "fe80::9", "224.0.0.5", "2001:db8::5"),
			want:  reconcile.Desired{Own: ownedEverywhere},
		},
		{
			name: "no path without a default route",
			change: func(s *netwatch.Snapshot) {
				s.Routes = slices.DeleteFunc(s.Routes, func(r netwatch.Route) bool { return r.Dst.Bits() == 0 })
			},
			peers: peerAddrs("192.0.2.7", "2001:db8:77::9", "10.0.0.9"),
			want: reconcile.Desired{Own: ownedEverywhere, Routes: new(netwatch.RouteSet).Add(hPeer9), Rules: []netwatch.Rule{rule4},
				Repairs: []netwatch.Route{nodeNetRepair}},
		},
		{
			name: "paths that no host route can copy",
			change: func(s *netwatch.Snapshot) {
				s.Routes = append(s.Routes,
					mainRoute("10.9.0.0/16", func(r *netwatch.Route) { r.Index, r.Scope = idxWG, netwatch.ScopeLink }),
					mainRoute("10.8.0.0/16", func(r *netwatch.Route) {
						r.NextHops = []netwatch.NextHop{{Gateway: addr("10.0.0.1"), Index: idxEnp, Weight: 1}, {Gateway: addr("10.0.0.2"), Index: idxEnp, Weight: 1}}
					}),
					mainRoute("10.7.0.0/16", func(r *netwatch.Route) { r.NHID = 7 }),
					mainRoute("10.6.0.0/16", func(r *netwatch.Route) { r.Type = netwatch.RouteBlackhole }),
					mainRoute("10.5.0.0/16", func(r *netwatch.Route) { r.Type = netwatch.RouteUnreachable }),
					mainRoute("10.4.0.0/16", func(r *netwatch.Route) { r.Type = netwatch.RouteThrow }),
					mainRoute("10.3.0.0/16", func(r *netwatch.Route) { r.Gateway, r.Index = addr("fe80::1"), idxEnp }),
				)
			},
			peers: peerAddrs("10.9.0.1", "10.8.0.1", "10.7.0.1", "10.6.0.1", "10.5.0.1", "10.4.0.1", "10.3.0.1"),
			want:  reconcile.Desired{Own: ownedEverywhere},
		},
		{
			name: "the longest prefix, then the lowest metric; a dead route is passed over",
			change: func(s *netwatch.Snapshot) {
				s.Routes = append(s.Routes,
					mainRoute("10.0.9.0/24", func(r *netwatch.Route) { r.Gateway, r.Index, r.Metric = addr("10.0.0.2"), idxEnp, 200 }),
					mainRoute("10.0.9.0/24", func(r *netwatch.Route) { r.Gateway, r.Index, r.Metric = addr("10.0.0.3"), idxEnp, 100 }),
					mainRoute("10.0.9.0/24", func(r *netwatch.Route) {
						r.Gateway, r.Index, r.Metric, r.Flags = addr("10.0.0.4"), idxEnp, 50, netwatch.RouteDead
					}),
				)
			},
			peers: peerAddrs("10.0.9.1"),
			want: reconcile.Desired{Own: ownedEverywhere, Rules: []netwatch.Rule{rule4}, Routes: new(netwatch.RouteSet).Add(
				host("10.0.9.1", func(r *netwatch.Route) { r.Gateway, r.Index, r.PrefSrc = addr("10.0.0.3"), idxEnp, addr("10.0.0.5") }),
			)},
		},
		{
			name: "a main route that matches some packets only gets a throw",
			change: func(s *netwatch.Snapshot) {
				s.Routes = append(s.Routes,
					mainRoute("10.0.0.0/16", func(r *netwatch.Route) { r.TOS, r.Gateway, r.Index = 0x10, addr("203.0.113.1"), idxEth }),
					mainRoute("10.0.0.0/8", func(r *netwatch.Route) { r.TOS, r.Gateway, r.Index = 0x08, addr("203.0.113.1"), idxEth }), // less specific: the path wins
					mainRoute("2001:db8::/64", func(r *netwatch.Route) { r.Src, r.Index, r.Metric = pfx("2001:db8:1::/64"), idxEth, 1024 }),
				)
			},
			cfg:   func(c *mtupolicy.Config) { c.Repair = false },
			peers: peerAddrs("10.0.0.9", "2001:db8::9"),
			want: reconcile.Desired{Own: ownedEverywhere, Rules: []netwatch.Rule{rule4, rule6}, Routes: new(netwatch.RouteSet).Add(
				hPeer9,
				netwatch.Route{Family: netwatch.IPv4, Table: 900, Dst: pfx("10.0.0.9/32"), TOS: 0x10, Protocol: mtupolicy.DefaultProtocol, Type: netwatch.RouteThrow},
				hPeer6,
				netwatch.Route{Family: netwatch.IPv6, Table: 900, Dst: pfx("2001:db8::9/128"), Src: pfx("2001:db8:1::/64"), Index: idxLo,
					Metric: 1024, Protocol: mtupolicy.DefaultProtocol, Type: netwatch.RouteThrow},
			)},
		},
		{
			name: "the output link's MTU clamps the tunnel's",
			change: func(s *netwatch.Snapshot) {
				i := slices.IndexFunc(s.Links, func(l netwatch.Link) bool { return l.Index == idxEth })
				s.Links[i].MTU = 1300
			},
			peers: peerAddrs("192.0.2.7"),
			want: reconcile.Desired{Own: ownedEverywhere, Rules: []netwatch.Rule{rule4},
				Routes: new(netwatch.RouteSet).Add(with(hFar, func(r *netwatch.Route) { r.MTU = 1300 }))},
		},
		{
			name: "a tunnel below IPv6's minimum splits IPv4 only",
			change: func(s *netwatch.Snapshot) {
				i := slices.IndexFunc(s.Links, func(l netwatch.Link) bool { return l.Index == idxWG })
				s.Links[i].MTU = 1200
			},
			peers: peerAddrs("192.0.2.7", "2001:db8::9"),
			want: reconcile.Desired{Own: ownedEverywhere, Rules: []netwatch.Rule{rule4},
				Routes: new(netwatch.RouteSet).Add(with(hFar, func(r *netwatch.Route) { r.MTU = 1200 }))},
		},
		{
			name: "the tunnel link down: the owned scope only",
			change: func(s *netwatch.Snapshot) {
				i := slices.IndexFunc(s.Links, func(l netwatch.Link) bool { return l.Index == idxWG })
				s.Links[i].Flags = 0
			},
			peers: peerAddrs("10.0.0.9"),
			want:  reconcile.Desired{Own: ownedEverywhere},
		},
		{
			name: "the tunnel link missing: the owned scope only",
			change: func(s *netwatch.Snapshot) {
				s.Links = slices.DeleteFunc(s.Links, func(l netwatch.Link) bool { return l.Index == idxWG })
			},
			peers: peerAddrs("10.0.0.9"),
			want:  reconcile.Desired{Own: ownedEverywhere},
		},
		{
			name:  "off: the owned scope only",
			mode:  mtupolicy.ModeOff,
			peers: peerAddrs("10.0.0.9"),
			want:  reconcile.Desired{Own: ownedEverywhere},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := node()
			if tt.change != nil {
				tt.change(&s)
			}
			cfg := peerConfig()
			if tt.cfg != nil {
				tt.cfg(&cfg)
			}
			mode := tt.mode
			if mode == mtupolicy.ModeUnknown {
				mode = mtupolicy.ModeOn
			}
			d, ok := mtupolicy.DesiredPeers(s.View(), cfg, mode, tt.peers, tt.inner)
			if !ok {
				t.Fatal("DesiredPeers: not ok")
			}
			// Notes have a test of their own (TestPeerNotes).
			if diff := cmp.Diff(flat(tt.want), flat(d), cmpNet, cmpopts.IgnoreFields(flatDesired{}, "Notes")); diff != "" {
				t.Errorf("DesiredPeers (-want +got):\n%s", diff)
			}
			// Plan accepts it, and one pass converges.
			ops, err := reconcile.Plan(s.View(), d)
			if err != nil {
				t.Fatalf("Plan: %v", err)
			}
			k := kernel{s: clone(s)}
			if err := k.apply(ops); err != nil {
				t.Fatalf("apply: %v\n%s", err, opsString(ops))
			}
			d2, _ := mtupolicy.DesiredPeers(k.s.View(), cfg, mode, tt.peers, tt.inner)
			if again, err := reconcile.Plan(k.s.View(), d2); err != nil || len(again) != 0 {
				t.Errorf("the next pass plans %v:\n%s", err, opsString(again))
			}
		})
	}
}

// Nothing may be edited without the peers' mode, a synced view, a valid
// config that asks for peers; and Desired, which has no peers, answers
// only Off for a peers config.
func TestDesiredPeersNotOK(t *testing.T) {
	peers := peerAddrs("10.0.0.9")
	for _, tt := range []struct {
		name string
		v    netwatch.View
		cfg  mtupolicy.Config
		mode mtupolicy.Mode
	}{
		{"mode unknown", node().View(), peerConfig(), mtupolicy.ModeUnknown},
		{"not synced", netwatch.View{}, peerConfig(), mtupolicy.ModeOn},
		{"not a peers config", node().View(), config(), mtupolicy.ModeOn},
		{"invalid", node().View(), with(peerConfig(), func(c *mtupolicy.Config) { c.Table = 254 }), mtupolicy.ModeOn},
		{"peers with prefixes", node().View(), with(config(), func(c *mtupolicy.Config) { c.Peers = true }), mtupolicy.ModeOn},
	} {
		if d, ok := mtupolicy.DesiredPeers(tt.v, tt.cfg, tt.mode, peers, nil); ok || !cmp.Equal(flat(d), flatDesired{}, cmpNet) {
			t.Errorf("%s: DesiredPeers = %+v, %v; want nothing, false", tt.name, d, ok)
		}
	}
	if d, ok := mtupolicy.Desired(node().View(), peerConfig(), mtupolicy.ModeOn); ok || !cmp.Equal(d, reconcile.Desired{}, cmpNet) {
		t.Errorf("Desired(peers config, on) = %+v, %v; want nothing, false", d, ok)
	}
	d, ok := mtupolicy.Desired(converged(t).View(), peerConfig(), mtupolicy.ModeOff)
	if diff := cmp.Diff(flatDesired{Own: ownedEverywhere}, flat(d), cmpNet); !ok || diff != "" {
		t.Errorf("Desired(peers config, off): ok %v (-want +got):\n%s", ok, diff)
	}
}

// Unmarked packets to an encrypting peer take its host route at the tunnel
// MTU; WireGuard's marked ones, and every packet to anything else, go on
// as before through the main table, whose lowered route is repaired.
func TestPeersRouteGets(t *testing.T) {
	peers := peerAddrs("10.0.0.9", "192.0.2.7", "2001:db8::9")
	s := node()
	d, _ := mtupolicy.DesiredPeers(s.View(), peerConfig(), mtupolicy.ModeOn, peers, nil)
	ops, err := reconcile.Plan(s.View(), d)
	if err != nil {
		t.Fatal(err)
	}
	k := kernel{s: clone(s)}
	if err := k.apply(ops); err != nil {
		t.Fatal(err)
	}
	checkRouteGets(t, k.s, []routeGet{
		{dst: "10.0.0.9", table: 900, mtu: 1355},
		{dst: "10.0.0.9", mark: 0xe00, table: netwatch.TableMain, mtu: 1450},
		{dst: "10.0.0.9", mark: 0x1e00, table: netwatch.TableMain, mtu: 1450},
		{dst: "192.0.2.7", table: 900, mtu: 1355},
		{dst: "192.0.2.7", mark: 0xe00, table: netwatch.TableMain, mtu: 1500},
		{dst: "2001:db8::9", table: 900, mtu: 1355},
		{dst: "2001:db8::9", mark: 0xe00, table: netwatch.TableMain, mtu: 1450},
		// Not peers (an opted-out node, a host on the node network).
		{dst: "10.0.0.7", table: netwatch.TableMain, mtu: 1450},
		{dst: "192.0.2.8", table: netwatch.TableMain, mtu: 1500},
		{dst: "2001:db8::7", table: netwatch.TableMain, mtu: 1450},
	})
	checkSamePaths(t, s, k.s)

	// A peer leaves (or opts out): its route goes, the rule and the
	// others stay.
	d, _ = mtupolicy.DesiredPeers(k.s.View(), peerConfig(), mtupolicy.ModeOn, peerAddrs("10.0.0.9", "2001:db8::9"), nil)
	ops, err = reconcile.Plan(k.s.View(), d)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]netwatch.Op{routeDel(hFar)}, ops, cmpNet); diff != "" {
		t.Errorf("a peer leaves (-want +got):\n%s", diff)
	}
}

// A node moved from --prefix to --peers: the prefix routes go, the host
// routes come, and the rule stays put.
func TestPeersAfterPrefixMode(t *testing.T) {
	s := converged(t)
	d, _ := mtupolicy.DesiredPeers(s.View(), peerConfig(), mtupolicy.ModeOn, peerAddrs("10.0.0.9", "2001:db8::9"), nil)
	ops, err := reconcile.Plan(s.View(), d)
	if err != nil {
		t.Fatal(err)
	}
	// Plan installs the IPv6 route at the metric the kernel gives it.
	peer6 := hPeer6
	peer6.Metric = 1024 // the kernel's metric for an IPv6 route given none
	want := []netwatch.Op{replace(hPeer9), replace(peer6), routeDel(tNodeNet), routeDel(tNodeGW), routeDel(tNodeNet6)}
	if diff := cmp.Diff(want, ops, cmpNet); diff != "" {
		t.Errorf("Plan (-want +got):\n%s", diff)
	}
}

// The path follows the main table: a new, more specific main route takes
// the peer's host route with it.
func TestPeersFollowTheMainTable(t *testing.T) {
	peers := peerAddrs("10.0.0.9")
	s := node()
	d, _ := mtupolicy.DesiredPeers(s.View(), peerConfig(), mtupolicy.ModeOn, peers, nil)
	ops, _ := reconcile.Plan(s.View(), d)
	k := kernel{s: clone(s)}
	if err := k.apply(ops); err != nil {
		t.Fatal(err)
	}
	k.s.Routes = append(k.s.Routes, netwatch.Route{Family: netwatch.IPv4, Table: netwatch.TableMain, Dst: pfx("10.0.0.8/29"),
		Gateway: addr("203.0.113.1"), Index: idxEth, Protocol: netwatch.ProtoStatic, Type: netwatch.RouteUnicast})
	d, _ = mtupolicy.DesiredPeers(k.s.View(), peerConfig(), mtupolicy.ModeOn, peers, nil)
	ops, err := reconcile.Plan(k.s.View(), d)
	if err != nil {
		t.Fatal(err)
	}
	moved := host("10.0.0.9", func(r *netwatch.Route) {
		r.Gateway, r.Index, r.PrefSrc = addr("203.0.113.1"), idxEth, addr("203.0.113.10")
	})
	if diff := cmp.Diff([]netwatch.Op{replaceWas(moved, hPeer9)}, ops, cmpNet); diff != "" {
		t.Errorf("Plan (-want +got):\n%s", diff)
	}
}

func TestPeerNotes(t *testing.T) {
	s := node()
	s.Routes = append(s.Routes, netwatch.Route{Family: netwatch.IPv4, Table: netwatch.TableMain, Dst: pfx("10.8.0.0/16"),
		Protocol: netwatch.ProtoStatic, Type: netwatch.RouteUnicast,
		NextHops: []netwatch.NextHop{{Gateway: addr("10.0.0.1"), Index: idxEnp, Weight: 1}, {Gateway: addr("10.0.0.2"), Index: idxEnp, Weight: 1}}})
	notes := func(s netwatch.Snapshot, peers []netip.Addr) []string {
		d, _ := mtupolicy.DesiredPeers(s.View(), peerConfig(), mtupolicy.ModeOn, peers, nil)
		return d.Notes
	}
	got := notes(s, peerAddrs("10.8.0.1", "10.8.0.2", "10.0.0.9"))
	want := []string{"inet: peers reached through main route 10.8.0.0/16 keep the interface MTU: it has no single path to copy (multipath or a nexthop object)"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("notes (-want +got):\n%s", diff)
	}
	d, _ := mtupolicy.DesiredPeers(s.View(), peerConfig(), mtupolicy.ModeOn, peerAddrs("10.0.0.9", "2001:db8::9"),
		mtupolicy.InnerMTUs{addr("10.0.0.9"): 1296, addr("2001:db8::9"): 1216})
	want = []string{"inet6: the path to peer 2001:db8::9 carries inner packets of at most 1216 bytes, below the family's minimum 1280: its route keeps the tunnel MTU (clamp TCP MSS, or lower Cilium's MTU)"}
	if diff := cmp.Diff(want, d.Notes); diff != "" {
		t.Errorf("notes below the minimum (-want +got):\n%s", diff)
	}
	i := slices.IndexFunc(s.Links, func(l netwatch.Link) bool { return l.Index == idxWG })
	s.Links[i].Flags = 0
	got = notes(s, peerAddrs("10.8.0.1"))
	if len(got) != 1 || !strings.Contains(got[0], "is down") {
		t.Errorf("notes with the tunnel down: %q", got)
	}
}

// peerMTU is the MTU the host route to a should have: the smaller of
// table and a's inner MTU, unless that is below the family's minimum.
func peerMTU(a netip.Addr, table uint32, inner mtupolicy.InnerMTUs) uint32 {
	if in := inner[a]; in != 0 && in < table && in >= mtupolicy.MinMTU(netwatch.FamilyOf(a)) {
		return in
	}
	return table
}

// PeerMTU: the smaller of the table's MTU and the peer's, never a value
// below the family's minimum, never above the table's.
func TestPeerMTU(t *testing.T) {
	for _, tt := range []struct {
		f            netwatch.Family
		table, inner uint32
		want         uint32
		below        bool
	}{
		{netwatch.IPv4, 1420, 0, 1420, false},
		{netwatch.IPv4, 1420, 1296, 1296, false},
		{netwatch.IPv4, 1420, 1232, 1232, false},
		{netwatch.IPv4, 1420, 1440, 1420, false},
		{netwatch.IPv4, 1300, 1296, 1296, false}, // out link smaller than the tunnel
		{netwatch.IPv4, 1420, 64, 1420, true},
		{netwatch.IPv4, 1420, 68, 68, false},
		{netwatch.IPv6, 1420, 1280, 1280, false},
		{netwatch.IPv6, 1420, 1216, 1420, true},
		{netwatch.IPv6, 1420, 1420, 1420, false},
	} {
		got, below := mtupolicy.PeerMTU(tt.f, tt.table, tt.inner)
		if got != tt.want || below != tt.below {
			t.Errorf("PeerMTU(%v, %d, %d) = %d, %v; want %d, %v", tt.f, tt.table, tt.inner, got, below, tt.want, tt.below)
		}
	}
}

// Properties over random nodes (drawWorld's, with random peers): one pass
// converges, make before break, nothing but the owned scope and repairs
// changes; a peer with a path a host route can copy gets it, through the
// same gateway and link at TableMTU, or at its inner MTU where that is
// smaller and not below the family's minimum; every other packet, and every marked
// one, leaves as before.
func TestPeersProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		w := drawWorld(t)
		w.cfg.Prefixes, w.cfg.UnderlayLink, w.cfg.Peers = nil, "", true
		probes := []string{"10.0.0.1", "10.0.0.5", "10.0.0.9", "10.0.5.7", "10.1.2.3", "10.244.0.7", "192.168.1.9",
			"203.0.113.7", "192.0.2.1", "169.254.1.1", "2001:db8::9", "2001:db8:0:5::9", "2001:db8:ffff::9", "2001:db8:1::9", "fe80::9"}
		for _, r := range w.s.Routes {
			if r.Table == netwatch.TableMain {
				probes = append(probes, lastAddr(r.Dst).String())
			}
		}
		var peers, others []netip.Addr
		for i, p := range probes {
			if rapid.Bool().Draw(t, fmt.Sprint("peer", i)) {
				peers = append(peers, addr(p))
			} else {
				others = append(others, addr(p))
			}
		}
		inner := make(mtupolicy.InnerMTUs)
		for i, a := range peers {
			if rapid.Bool().Draw(t, fmt.Sprint("measured", i)) {
				inner[a] = uint32(rapid.IntRange(1100, 1500).Draw(t, fmt.Sprint("inner", i))) &^ 15
			}
		}
		v := w.s.View()
		d, ok := mtupolicy.DesiredPeers(v, w.cfg, w.mode, peers, inner)
		if !ok {
			t.Fatalf("DesiredPeers: not ok")
		}
		ops, err := reconcile.Plan(v, d)
		if err != nil {
			t.Fatalf("Plan: %v", err)
		}
		tun, hasTun := v.LinkByName(w.cfg.TunnelLink)
		checkScope(t, v, ops, w, tun, hasTun)
		checkOrder(t, ops, d)
		k := kernel{s: clone(w.s)}
		if err := k.apply(ops); err != nil {
			t.Fatalf("apply: %v\n%s", err, opsString(ops))
		}
		after := k.s
		d2, _ := mtupolicy.DesiredPeers(after.View(), w.cfg, w.mode, peers, inner)
		if again, err := reconcile.Plan(after.View(), d2); err != nil || len(again) != 0 {
			t.Fatalf("the second pass plans (%v):\n%s\nafter the first:\n%s", err, opsString(again), opsString(ops))
		}
		for _, r := range flat(d).Routes {
			if r.Dst.Bits() != r.Dst.Addr().BitLen() || !slices.Contains(peers, r.Dst.Addr()) {
				t.Fatalf("table route %v: not a host route to a peer", r)
			}
		}

		// Paths, unless a foreign rule looks our table up or sits between
		// our priority and the main table's (the rule at 900 goes first,
		// by design).
		if slices.ContainsFunc(w.s.Rules, func(r netwatch.Rule) bool {
			return r.Priority != 900 && (r.Table == 900 || r.Priority > 900 && r.Priority < 32766)
		}) {
			return
		}
		before := withoutOwned(w.s)
		checkSamePaths(t, before, after)
		local := make(map[netip.Addr]bool)
		for _, a := range w.s.Addrs {
			local[a.Prefix.Addr()] = true
		}
		for _, a := range append(slices.Clone(peers), others...) {
			b, _, bok := lookup(before, a, 0)
			u, umtu, uok := lookup(after, a, 0)
			out, hasOut := k.link(b.Index)
			split := slices.Contains(peers, a) && w.mode == mtupolicy.ModeOn && hasTun && tun.MTU >= mtupolicy.MinMTU(netwatch.FamilyOf(a)) &&
				bok && b.Table == netwatch.TableMain && b.Type == netwatch.RouteUnicast && b.NextHops == nil && b.NHID == 0 &&
				hasOut && b.Index != idxWG && (!b.Gateway.IsValid() || b.Gateway.Is4() == a.Is4()) &&
				!local[a] && !a.IsLinkLocalUnicast() && !a.IsMulticast()
			switch {
			case split && (!uok || u.Table != 900 || u.Gateway != b.Gateway || u.Index != b.Index || umtu != peerMTU(a, mtupolicy.TableMTU(tun, out), inner)):
				t.Fatalf("peer %v: unmarked %v table %v mtu %d; want table 900 through %v at %d", a, u, u.Table, umtu, b, peerMTU(a, mtupolicy.TableMTU(tun, out), inner))
			case !split && (uok != bok || uok && (u.Table != b.Table || u.Key() != b.Key())):
				t.Fatalf("%v (peer %v): unmarked %v table %v after, %v table %v before", a, slices.Contains(peers, a), u, u.Table, b, b.Table)
			}
			bm, _, bmok := lookup(before, a, 0x1e00)
			if m, _, mok := lookup(after, a, 0x1e00); mok != bmok || mok && (m.Key() != bm.Key() || m.Gateway != bm.Gateway || m.Index != bm.Index) {
				t.Fatalf("%v marked: %v table %v after, %v table %v before", a, m, m.Table, bm, bm.Table)
			}
		}
	})
}
