package mtupolicy_test

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/marksplit/marksplit/mtupolicy"
	"github.com/marksplit/marksplit/netwatch"
	"github.com/marksplit/marksplit/netwatch/reconcile"
)

// DesiredMesh on the fixture node, with cilium_wg0 standing for any
// WireGuard device: its address 10.244.5.1/16 gives the main table
// 10.244.0.0/16 dev cilium_wg0, as wg-quick's routes or a mesh's own would.

func meshConfig() mtupolicy.Config {
	c := mtupolicy.DefaultConfig()
	c.Mesh = true
	return c
}

// meshNode is the fixture node with a mesh route through the device.
func meshNode() netwatch.Snapshot {
	s := node()
	s.Addrs = append(s.Addrs, netwatch.Addr{Index: idxWG, Prefix: pfx("10.244.5.1/16")})
	s.Routes = append(s.Routes, meshNet)
	return s
}

var (
	meshNet = netwatch.Route{Family: netwatch.IPv4, Table: netwatch.TableMain, Dst: pfx("10.244.0.0/16"), Index: idxWG,
		PrefSrc: addr("10.244.5.1"), Protocol: netwatch.ProtoKernel, Scope: netwatch.ScopeLink, Type: netwatch.RouteUnicast}
	meshRule = netwatch.Rule{Family: netwatch.IPv4, Priority: 900, Table: 900, Action: netwatch.ActionToTable,
		Invert: true, Mark: 0x1e00, Mask: 0xffffffff, Protocol: mtupolicy.DefaultProtocol}
)

// meshRoute is a table route through the device.
func meshRoute(dst string, mtu uint32) netwatch.Route {
	return netwatch.Route{Family: netwatch.IPv4, Table: 900, Dst: pfx(dst), Index: idxWG, PrefSrc: addr("10.244.5.1"),
		MTU: mtu, Protocol: mtupolicy.DefaultProtocol, Scope: netwatch.ScopeLink, Type: netwatch.RouteUnicast}
}

func prefixes(ss ...string) []netip.Prefix {
	var ps []netip.Prefix
	for _, s := range ss {
		ps = append(ps, pfx(s))
	}
	return ps
}

func TestDesiredMesh(t *testing.T) {
	b := mtupolicy.MeshPeer{Endpoint: addr("10.0.0.9"), AllowedIPs: prefixes("10.244.9.0/24", "10.244.19.0/24")}
	c := mtupolicy.MeshPeer{Endpoint: addr("192.0.2.7"), AllowedIPs: prefixes("10.244.7.0/24")}
	tests := []struct {
		name   string
		change func(*netwatch.Snapshot)
		mesh   mtupolicy.Mesh
		inner  mtupolicy.InnerMTUs
		mode   mtupolicy.Mode
		want   reconcile.Desired
	}{
		{
			name: "each peer's allowed IPs at the link's MTU, the rule without the device's fwmark",
			mesh: mtupolicy.Mesh{FirewallMark: 0x1e00, Peers: []mtupolicy.MeshPeer{b, c}},
			want: reconcile.Desired{Own: ownedEverywhere, Rules: []netwatch.Rule{meshRule}, Routes: new(netwatch.RouteSet).Add(
				meshRoute("10.244.9.0/24", 1355), meshRoute("10.244.19.0/24", 1355), meshRoute("10.244.7.0/24", 1355))},
		},
		{
			name:  "each peer's inner MTU, by its endpoint, where smaller",
			mesh:  mtupolicy.Mesh{FirewallMark: 0x1e00, Peers: []mtupolicy.MeshPeer{b, c}},
			inner: mtupolicy.InnerMTUs{addr("192.0.2.7"): 1296, addr("10.0.0.9"): 1420},
			want: reconcile.Desired{Own: ownedEverywhere, Rules: []netwatch.Rule{meshRule}, Routes: new(netwatch.RouteSet).Add(
				meshRoute("10.244.9.0/24", 1355), meshRoute("10.244.19.0/24", 1355), meshRoute("10.244.7.0/24", 1296))},
		},
		{
			name: "no fwmark: a rule for every packet",
			mesh: mtupolicy.Mesh{Peers: []mtupolicy.MeshPeer{c}},
			want: reconcile.Desired{Own: ownedEverywhere,
				Rules:  []netwatch.Rule{with(meshRule, func(r *netwatch.Rule) { r.Invert, r.Mark, r.Mask = false, 0, 0 })},
				Routes: new(netwatch.RouteSet).Add(meshRoute("10.244.7.0/24", 1355))},
		},
		{
			name: "only where the main table sends them through the link; never the default route",
			mesh: mtupolicy.Mesh{FirewallMark: 0x1e00, Peers: []mtupolicy.MeshPeer{{Endpoint: addr("10.0.0.9"),
				AllowedIPs: prefixes("0.0.0.0/0", "10.0.0.9/32", "10.245.0.0/24", "10.244.0.0/15", "10.244.9.0/24", "169.254.0.0/16")}}},
			want: reconcile.Desired{Own: ownedEverywhere, Rules: []netwatch.Rule{meshRule}, Routes: new(netwatch.RouteSet).Add(
				meshRoute("10.244.9.0/24", 1355))},
		},
		{
			name: "a main route inside an allowed IP out of another link gets a throw",
			change: func(s *netwatch.Snapshot) {
				s.Routes = append(s.Routes, netwatch.Route{Family: netwatch.IPv4, Table: netwatch.TableMain, Dst: pfx("10.244.9.128/25"),
					Gateway: addr("10.0.0.1"), Index: idxEnp, Protocol: netwatch.ProtoStatic, Type: netwatch.RouteUnicast})
			},
			mesh: mtupolicy.Mesh{FirewallMark: 0x1e00, Peers: []mtupolicy.MeshPeer{b}},
			want: reconcile.Desired{Own: ownedEverywhere, Rules: []netwatch.Rule{meshRule}, Routes: new(netwatch.RouteSet).Add(
				meshRoute("10.244.9.0/24", 1355), meshRoute("10.244.19.0/24", 1355),
				netwatch.Route{Family: netwatch.IPv4, Table: 900, Dst: pfx("10.244.9.128/25"), Protocol: mtupolicy.DefaultProtocol, Type: netwatch.RouteThrow})},
		},
		{
			name: "overlapping allowed IPs of two peers each get their route",
			mesh: mtupolicy.Mesh{FirewallMark: 0x1e00, Peers: []mtupolicy.MeshPeer{
				{Endpoint: addr("10.0.0.9"), AllowedIPs: prefixes("10.244.9.0/24")},
				{Endpoint: addr("192.0.2.7"), AllowedIPs: prefixes("10.244.9.128/25", "10.244.9.0/24")}}},
			inner: mtupolicy.InnerMTUs{addr("192.0.2.7"): 1296},
			want: reconcile.Desired{Own: ownedEverywhere, Rules: []netwatch.Rule{meshRule}, Routes: new(netwatch.RouteSet).Add(
				meshRoute("10.244.9.0/24", 1355), meshRoute("10.244.9.128/25", 1296))},
		},
		{
			name: "no peers: the owned scope only",
			mesh: mtupolicy.Mesh{FirewallMark: 0x1e00},
			want: reconcile.Desired{Own: ownedEverywhere},
		},
		{
			name: "the device missing: the owned scope only",
			change: func(s *netwatch.Snapshot) {
				s.Links = slices.DeleteFunc(s.Links, func(l netwatch.Link) bool { return l.Index == idxWG })
				s.Routes = slices.DeleteFunc(s.Routes, func(r netwatch.Route) bool { return r.Index == idxWG })
			},
			mesh: mtupolicy.Mesh{FirewallMark: 0x1e00, Peers: []mtupolicy.MeshPeer{b}},
			want: reconcile.Desired{Own: ownedEverywhere},
		},
		{
			name: "off: the owned scope only",
			mode: mtupolicy.ModeOff,
			mesh: mtupolicy.Mesh{FirewallMark: 0x1e00, Peers: []mtupolicy.MeshPeer{b}},
			want: reconcile.Desired{Own: ownedEverywhere},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := meshNode()
			if tt.change != nil {
				tt.change(&s)
			}
			mode := tt.mode
			if mode == mtupolicy.ModeUnknown {
				mode = mtupolicy.ModeOn
			}
			d, ok := mtupolicy.DesiredMesh(s.View(), meshConfig(), mode, tt.mesh, tt.inner)
			if !ok {
				t.Fatal("DesiredMesh: not ok")
			}
			if diff := cmp.Diff(flat(tt.want), flat(d), cmpNet, cmpopts.IgnoreFields(flatDesired{}, "Notes")); diff != "" {
				t.Errorf("DesiredMesh (-want +got):\n%s", diff)
			}
			ops, err := reconcile.Plan(s.View(), d)
			if err != nil {
				t.Fatalf("Plan: %v", err)
			}
			k := kernel{s: clone(s)}
			if err := k.apply(ops); err != nil {
				t.Fatalf("apply: %v\n%s", err, opsString(ops))
			}
			d2, _ := mtupolicy.DesiredMesh(k.s.View(), meshConfig(), mode, tt.mesh, tt.inner)
			if again, err := reconcile.Plan(k.s.View(), d2); err != nil || len(again) != 0 {
				t.Errorf("the next pass plans %v:\n%s", err, opsString(again))
			}
		})
	}
}

// Nothing may be edited without a mesh config or a known mode; Desired
// answers only Off for a mesh config; a mesh goes alone.
func TestDesiredMeshNotOK(t *testing.T) {
	v := meshNode().View()
	m := mtupolicy.Mesh{Peers: []mtupolicy.MeshPeer{{AllowedIPs: prefixes("10.244.9.0/24")}}}
	if _, ok := mtupolicy.DesiredMesh(v, config(), mtupolicy.ModeOn, m, nil); ok {
		t.Error("DesiredMesh without cfg.Mesh: ok")
	}
	if _, ok := mtupolicy.DesiredMesh(v, meshConfig(), mtupolicy.ModeUnknown, m, nil); ok {
		t.Error("DesiredMesh with the mode unknown: ok")
	}
	if _, ok := mtupolicy.Desired(v, meshConfig(), mtupolicy.ModeOn); ok {
		t.Error("Desired on with a mesh config: ok")
	}
	if _, ok := mtupolicy.Desired(v, meshConfig(), mtupolicy.ModeOff); !ok {
		t.Error("Desired off with a mesh config (cleanup): not ok")
	}
	for _, f := range []func(*mtupolicy.Config){
		func(c *mtupolicy.Config) { c.Peers = true },
		func(c *mtupolicy.Config) { c.Prefixes = prefixes("10.0.0.0/16") },
		func(c *mtupolicy.Config) { c.UnderlayLink = "enp7s0" },
	} {
		c := meshConfig()
		f(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("Validate of a mesh config with another selection: %+v: no error", c)
		}
	}
	if err := meshConfig().Validate(); err != nil {
		t.Errorf("Validate of a mesh config: %v", err)
	}
}
