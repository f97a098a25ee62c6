package mtupolicy_test

import (
	"errors"
	"net/netip"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/marksplit/marksplit/mtupolicy"
	"github.com/marksplit/marksplit/netwatch"
	"github.com/marksplit/marksplit/netwatch/reconcile"
)

// The cases of issue 3, at the pure level: Desired and reconcile.Plan on
// snapshot views, with sim_test.go's kernel model executing the plans and
// answering `ip route get`.

var (
	pfx  = netip.MustParsePrefix
	addr = netip.MustParseAddr
	// cmpNet compares netip values, and rules field by field.
	cmpNet = cmp.Options{
		cmpopts.EquateComparable(netip.Addr{}, netip.Prefix{}),
		cmp.Comparer(func(a, b netwatch.Rule) bool { return a == b }),
		cmpopts.EquateEmpty(),
	}
)

func with[T any](v T, f func(*T)) T {
	f(&v)
	return v
}

// Link indexes of the fixture node.
const (
	idxLo    = 1
	idxEnp   = 2 // enp7s0: the private node network, MTU 1450
	idxWG    = 3 // cilium_wg0: MTU 1355
	idxEth   = 4 // eth0: the public uplink
	idxCHost = 5 // cilium_host
)

// Main-table routes of the fixture node.
var (
	defaultV4 = netwatch.Route{Family: netwatch.IPv4, Table: netwatch.TableMain, Dst: pfx("0.0.0.0/0"),
		Gateway: addr("203.0.113.1"), Index: idxEth, Metric: 100, Protocol: netwatch.ProtoDHCP, Type: netwatch.RouteUnicast}
	publicNet = netwatch.Route{Family: netwatch.IPv4, Table: netwatch.TableMain, Dst: pfx("203.0.113.0/24"),
		Index: idxEth, PrefSrc: addr("203.0.113.10"), Metric: 100, Protocol: netwatch.ProtoKernel,
		Scope: netwatch.ScopeLink, Type: netwatch.RouteUnicast}
	// nodeNet was lowered to the tunnel MTU by the old shell loop.
	nodeNet = netwatch.Route{Family: netwatch.IPv4, Table: netwatch.TableMain, Dst: pfx("10.0.0.0/16"),
		Gateway: addr("10.0.0.1"), Index: idxEnp, MTU: 1355, Protocol: netwatch.ProtoDHCP, Type: netwatch.RouteUnicast}
	nodeGW = netwatch.Route{Family: netwatch.IPv4, Table: netwatch.TableMain, Dst: pfx("10.0.0.1/32"),
		Index: idxEnp, Protocol: netwatch.ProtoDHCP, Scope: netwatch.ScopeLink, Type: netwatch.RouteUnicast}
	podNet = netwatch.Route{Family: netwatch.IPv4, Table: netwatch.TableMain, Dst: pfx("10.244.0.0/24"),
		Gateway: addr("10.244.0.90"), Index: idxCHost, PrefSrc: addr("10.244.0.90"), Protocol: netwatch.ProtoKernel,
		Type: netwatch.RouteUnicast}
	nodeNet6 = netwatch.Route{Family: netwatch.IPv6, Table: netwatch.TableMain, Dst: pfx("2001:db8::/64"),
		Index: idxEnp, Metric: 256, Protocol: netwatch.ProtoKernel, Type: netwatch.RouteUnicast}
	linkLocal6 = with(nodeNet6, func(r *netwatch.Route) { r.Dst = pfx("fe80::/64") })
	default6   = netwatch.Route{Family: netwatch.IPv6, Table: netwatch.TableMain, Dst: pfx("::/0"),
		Gateway: addr("fe80::1"), Index: idxEth, Metric: 1024, Protocol: netwatch.Protocol(9), Type: netwatch.RouteUnicast}
)

// What the policy installs for the fixture node.
var (
	tNodeNet = netwatch.Route{Family: netwatch.IPv4, Table: 900, Dst: pfx("10.0.0.0/16"), Gateway: addr("10.0.0.1"),
		Index: idxEnp, PrefSrc: addr("10.0.0.5"), MTU: 1355, Protocol: mtupolicy.DefaultProtocol, Type: netwatch.RouteUnicast}
	tNodeGW = netwatch.Route{Family: netwatch.IPv4, Table: 900, Dst: pfx("10.0.0.1/32"), Index: idxEnp,
		PrefSrc: addr("10.0.0.5"), MTU: 1355, Protocol: mtupolicy.DefaultProtocol, Scope: netwatch.ScopeLink,
		Type: netwatch.RouteUnicast}
	tNodeNet6 = netwatch.Route{Family: netwatch.IPv6, Table: 900, Dst: pfx("2001:db8::/64"), Metric: 256,
		Index: idxEnp, PrefSrc: addr("2001:db8::5"), MTU: 1355, Protocol: mtupolicy.DefaultProtocol,
		Type: netwatch.RouteUnicast}
	rule4 = netwatch.Rule{Family: netwatch.IPv4, Priority: 900, Table: 900, Action: netwatch.ActionToTable,
		Invert: true, Mark: 0xe00, Mask: 0xf00, Protocol: mtupolicy.DefaultProtocol}
	rule6           = with(rule4, func(r *netwatch.Rule) { r.Family = netwatch.IPv6 })
	nodeNetRepair   = with(nodeNet, func(r *netwatch.Route) { r.MTU = 0 }) // follows the link's again
	ownedEverywhere = reconcile.Own(900, 900)
)

// node is an encrypting Cilium node whose main route to the node network
// was lowered to the tunnel MTU by the old approach. Nothing is split yet.
func node() netwatch.Snapshot {
	up := netwatch.LinkUp | netwatch.LinkLowerUp
	s := netwatch.Snapshot{
		Links: []netwatch.Link{
			{Index: idxLo, Name: "lo", MTU: 65536, Flags: up | netwatch.LinkLoopback},
			{Index: idxEnp, Name: "enp7s0", MTU: 1450, Flags: up},
			{Index: idxWG, Name: "cilium_wg0", MTU: 1355, Flags: up, Kind: "wireguard"},
			{Index: idxEth, Name: "eth0", MTU: 1500, Flags: up},
			{Index: idxCHost, Name: "cilium_host", MTU: 1450, Flags: up, Kind: "veth"},
		},
		Addrs: []netwatch.Addr{
			{Index: idxLo, Prefix: pfx("127.0.0.1/8"), Scope: netwatch.ScopeHost},
			{Index: idxEnp, Prefix: pfx("10.0.0.3/16"), Flags: 0x1}, // secondary: lower, but never the source
			{Index: idxEnp, Prefix: pfx("10.0.0.5/16")},
			{Index: idxEnp, Prefix: pfx("2001:db8::5/64")},
			{Index: idxEnp, Prefix: pfx("fe80::5/64"), Scope: netwatch.ScopeLink},
			{Index: idxEth, Prefix: pfx("203.0.113.10/24")},
			{Index: idxCHost, Prefix: pfx("10.244.0.90/32")},
		},
		Routes: []netwatch.Route{defaultV4, publicNet, nodeNet, nodeGW, podNet, nodeNet6, linkLocal6, default6,
			// Cilium's tables.
			{Family: netwatch.IPv4, Table: 2004, Dst: pfx("0.0.0.0/0"), Index: idxLo, Protocol: netwatch.ProtoKernel, Type: netwatch.RouteLocal, Scope: netwatch.ScopeHost},
			{Family: netwatch.IPv4, Table: 2005, Dst: pfx("0.0.0.0/0"), Gateway: addr("10.244.0.90"), Index: idxCHost, Protocol: netwatch.ProtoKernel, Type: netwatch.RouteUnicast},
			{Family: netwatch.IPv4, Table: 2005, Dst: pfx("10.244.0.90/32"), Index: idxCHost, Protocol: netwatch.ProtoKernel, Scope: netwatch.ScopeLink, Type: netwatch.RouteUnicast},
		},
	}
	for _, f := range []netwatch.Family{netwatch.IPv4, netwatch.IPv6} {
		s.Rules = append(s.Rules,
			netwatch.Rule{Family: f, Priority: 9, Table: 2004, Action: netwatch.ActionToTable, Mark: 0x200, Mask: 0xf00, Protocol: netwatch.ProtoKernel},
			netwatch.Rule{Family: f, Priority: 10, Table: 2005, Action: netwatch.ActionToTable, Mark: 0xa00, Mask: 0xf00, Protocol: netwatch.ProtoKernel},
			netwatch.Rule{Family: f, Priority: 100, Table: netwatch.TableLocal, Action: netwatch.ActionToTable, Protocol: netwatch.ProtoKernel},
			netwatch.Rule{Family: f, Priority: 32766, Table: netwatch.TableMain, Action: netwatch.ActionToTable, Protocol: netwatch.ProtoKernel},
		)
	}
	s.Rules = append(s.Rules, netwatch.Rule{Family: netwatch.IPv4, Priority: 32767, Table: netwatch.Table(253), Action: netwatch.ActionToTable, Protocol: netwatch.ProtoKernel})
	return s
}

func config() mtupolicy.Config {
	c := mtupolicy.DefaultConfig()
	c.Prefixes = []netip.Prefix{pfx("10.0.0.0/16"), pfx("2001:db8::/64")}
	return c
}

// converged is the node after a pass: the table, the rules, the repair.
func converged(t *testing.T) netwatch.Snapshot {
	t.Helper()
	_, s := pass(t, node(), config(), mtupolicy.ModeOn)
	return s
}

// index is slices.IndexFunc that fails the test rather than return -1.
func index[T any](t testing.TB, s []T, f func(T) bool) int {
	t.Helper()
	i := slices.IndexFunc(s, f)
	if i < 0 {
		t.Fatalf("no %T found", *new(T))
	}
	return i
}

func clone(s netwatch.Snapshot) netwatch.Snapshot {
	return netwatch.Snapshot{Links: slices.Clone(s.Links), Addrs: slices.Clone(s.Addrs),
		Routes: slices.Clone(s.Routes), Rules: slices.Clone(s.Rules)}
}

// plan is one pass without the kernel: Desired, then Plan.
func plan(t *testing.T, s netwatch.Snapshot, cfg mtupolicy.Config, mode mtupolicy.Mode) []netwatch.Op {
	t.Helper()
	d, ok := mtupolicy.Desired(s.View(), cfg, mode)
	if !ok {
		t.Fatalf("Desired(%v): not ok", mode)
	}
	ops, err := reconcile.Plan(s.View(), d)
	if err != nil {
		t.Fatalf("Plan: %v", err)
	}
	return ops
}

// pass is one reconcile pass: Desired, Plan, and the kernel applying it.
func pass(t *testing.T, s netwatch.Snapshot, cfg mtupolicy.Config, mode mtupolicy.Mode) ([]netwatch.Op, netwatch.Snapshot) {
	t.Helper()
	ops := plan(t, s, cfg, mode)
	k := kernel{s: clone(s)}
	if err := k.apply(ops); err != nil {
		t.Fatalf("apply: %v", err)
	}
	return ops, k.s
}

// settled runs a pass on s and fails unless it plans nothing.
func settled(t *testing.T, s netwatch.Snapshot, cfg mtupolicy.Config, mode mtupolicy.Mode) {
	t.Helper()
	if ops := plan(t, s, cfg, mode); len(ops) != 0 {
		t.Errorf("the next pass plans %d operations, want none:\n%s", len(ops), opsString(ops))
	}
}

func opsString(ops []netwatch.Op) string {
	var b []byte
	for _, op := range ops {
		b = append(b, "  "...)
		b = append(b, op.Kind.String()...)
		b = append(b, ' ')
		if op.Kind == netwatch.RuleAdd || op.Kind == netwatch.RuleDelete {
			b = append(b, op.Rule.String()...)
		} else {
			b = append(b, op.Route.String()...)
		}
		b = append(b, '\n')
	}
	return string(b)
}

func replace(r netwatch.Route) netwatch.Op { return netwatch.Op{Kind: netwatch.RouteReplace, Route: r} }
func replaceWas(r, was netwatch.Route) netwatch.Op {
	return netwatch.Op{Kind: netwatch.RouteReplace, Route: r, Was: was, HasWas: true}
}
func repair(r, was netwatch.Route) netwatch.Op {
	return netwatch.Op{Kind: netwatch.RouteReplace, Route: r, Was: was, HasWas: true, Repair: true}
}
func routeDel(r netwatch.Route) netwatch.Op { return netwatch.Op{Kind: netwatch.RouteDelete, Route: r} }
func ruleAdd(r netwatch.Rule) netwatch.Op   { return netwatch.Op{Kind: netwatch.RuleAdd, Rule: r} }
func ruleDel(r netwatch.Rule) netwatch.Op   { return netwatch.Op{Kind: netwatch.RuleDelete, Rule: r} }

// routeGet is one `ip route get`: the table and MTU the kernel picks.
type routeGet struct {
	dst   string
	mark  netwatch.Mark
	table netwatch.Table
	mtu   uint32
}

func checkRouteGets(t *testing.T, s netwatch.Snapshot, gets []routeGet) {
	t.Helper()
	for _, g := range gets {
		r, mtu, ok := lookup(s, addr(g.dst), g.mark)
		if !ok || r.Table != g.table || mtu != g.mtu {
			t.Errorf("ip route get %s mark %v: table %v mtu %d (found %v), want table %v mtu %d",
				g.dst, g.mark, r.Table, mtu, ok, g.table, g.mtu)
		}
	}
}

// Case 1: a fresh encrypting node gets the table routes and the rules, and
// the lowered main route is repaired; unmarked packets to a peer take the
// table at the tunnel MTU, WireGuard's marked ones the main route at the
// interface MTU.
func TestCase01FreshNode(t *testing.T) {
	s := node()
	d, ok := mtupolicy.Desired(s.View(), config(), mtupolicy.ModeOn)
	if !ok {
		t.Fatal("Desired: not ok")
	}
	want := reconcile.Desired{
		Own:     ownedEverywhere,
		Routes:  new(netwatch.RouteSet).Add(tNodeNet, tNodeGW, tNodeNet6),
		Rules:   []netwatch.Rule{rule4, rule6},
		Repairs: []netwatch.Route{nodeNetRepair},
	}
	if diff := cmp.Diff(flat(want), flat(d), cmpNet); diff != "" {
		t.Errorf("Desired (-want +got):\n%s", diff)
	}

	ops, after := pass(t, s, config(), mtupolicy.ModeOn)
	wantOps := []netwatch.Op{
		replace(tNodeGW), replace(tNodeNet), replace(tNodeNet6),
		ruleAdd(rule4), ruleAdd(rule6),
		repair(nodeNetRepair, nodeNet),
	}
	if diff := cmp.Diff(wantOps, ops, cmpNet); diff != "" {
		t.Errorf("Plan (-want +got):\n%s", diff)
	}
	checkRouteGets(t, after, []routeGet{
		{dst: "10.0.0.9", table: 900, mtu: 1355},
		{dst: "10.0.0.9", mark: 0xe00, table: netwatch.TableMain, mtu: 1450},
		{dst: "10.0.0.9", mark: 0x1e00, table: netwatch.TableMain, mtu: 1450}, // WireGuard's own fwmark
		{dst: "10.0.0.1", table: 900, mtu: 1355},
		{dst: "10.0.0.1", mark: 0xe00, table: netwatch.TableMain, mtu: 1450},
		{dst: "2001:db8::9", table: 900, mtu: 1355},
		{dst: "2001:db8::9", mark: 0xe00, table: netwatch.TableMain, mtu: 1450},
		// Not selected: untouched.
		{dst: "203.0.113.7", table: netwatch.TableMain, mtu: 1500},
		{dst: "192.0.2.1", table: netwatch.TableMain, mtu: 1500},
		{dst: "10.244.0.7", table: netwatch.TableMain, mtu: 1450},
		{dst: "2001:db8:1::1", table: netwatch.TableMain, mtu: 1500},
		// Cilium's marks keep their tables.
		{dst: "10.0.0.9", mark: 0xa00, table: 2005, mtu: 1450},
	})
	// Before: the lowered main route gave WireGuard the tunnel MTU.
	checkRouteGets(t, s, []routeGet{{dst: "10.0.0.9", mark: 0xe00, table: netwatch.TableMain, mtu: 1355}})
}

// Case 2: converged, a pass plans nothing.
func TestCase02Converged(t *testing.T) {
	settled(t, converged(t), config(), mtupolicy.ModeOn)
	// Also with the underlay link selecting instead of prefixes.
	cfg := config()
	cfg.Prefixes, cfg.UnderlayLink = nil, "enp7s0"
	_, s := pass(t, node(), cfg, mtupolicy.ModeOn)
	settled(t, s, cfg, mtupolicy.ModeOn)
}

// Case 3: a main route lowered to the tunnel MTU loses that explicit MTU,
// once, and so follows its link's again; a route with any other MTU, or
// none, is left alone, and so is a lowered `proto kernel` route: Cilium's
// route reconciler sets that MTU and re-asserts it.
func TestCase03Repair(t *testing.T) {
	tests := []struct {
		name   string
		mtu    uint32 // of the main route to 10.0.0.0/16
		repair bool   // Config.Repair
		kernel bool   // the route is proto kernel
		want   []netwatch.Op
	}{
		{name: "lowered", mtu: 1355, repair: true, want: []netwatch.Op{repair(nodeNetRepair, nodeNet)}},
		{name: "lowered, proto kernel (Cilium's)", mtu: 1355, repair: true, kernel: true},
		{name: "lowered, repair off", mtu: 1355},
		{name: "at the interface MTU", mtu: 1450, repair: true},
		{name: "no MTU attribute", mtu: 0, repair: true},
		{name: "another MTU", mtu: 1400, repair: true},
		{name: "above the interface MTU", mtu: 9000, repair: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := node()
			i := index(t, s.Routes, func(r netwatch.Route) bool { return r.Key() == nodeNet.Key() })
			s.Routes[i].MTU = tt.mtu
			if tt.kernel {
				s.Routes[i].Protocol = netwatch.ProtoKernel
			}
			cfg := config()
			cfg.Repair = tt.repair
			ops, after := pass(t, s, cfg, mtupolicy.ModeOn)
			got := slices.DeleteFunc(ops, func(op netwatch.Op) bool { return !op.Repair })
			if diff := cmp.Diff(tt.want, got, cmpNet); diff != "" {
				t.Errorf("repairs (-want +got):\n%s", diff)
			}
			settled(t, after, cfg, mtupolicy.ModeOn) // and never again
			if got := slices.Collect(after.View().Route(nodeNet.Key())); tt.want != nil && (len(got) != 1 || got[0].MTU != 0) {
				t.Errorf("main route after the pass: %v, want it without an MTU of its own", got)
			}
		})
	}
}

// Case 4: opted out with the table and the rules present: the rules go
// first, then the routes; the repaired main route stays as it is.
func TestCase04OptedOut(t *testing.T) {
	s := converged(t)
	ops, after := pass(t, s, config(), mtupolicy.ModeOff)
	want := []netwatch.Op{
		ruleDel(rule4), ruleDel(rule6),
		routeDel(tNodeNet), routeDel(tNodeGW), routeDel(tNodeNet6),
	}
	if diff := cmp.Diff(want, ops, cmpNet); diff != "" {
		t.Errorf("Plan (-want +got):\n%s", diff)
	}
	settled(t, after, config(), mtupolicy.ModeOff)
	checkRouteGets(t, after, []routeGet{
		{dst: "10.0.0.9", table: netwatch.TableMain, mtu: 1450},
		{dst: "2001:db8::9", table: netwatch.TableMain, mtu: 1450},
	})
	if diff := cmp.Diff(withoutOwned(s), after, cmpNet); diff != "" {
		t.Errorf("anything but the owned scope changed (-before +after):\n%s", diff)
	}
}

func withoutOwned(s netwatch.Snapshot) netwatch.Snapshot {
	s = clone(s)
	s.Routes = slices.DeleteFunc(s.Routes, func(r netwatch.Route) bool { return r.Table == 900 })
	s.Rules = slices.DeleteFunc(s.Rules, func(r netwatch.Rule) bool { return r.Priority == 900 })
	return s
}

// Case 5: opted out with no table: nothing planned.
func TestCase05OptedOutClean(t *testing.T) {
	d, ok := mtupolicy.Desired(node().View(), config(), mtupolicy.ModeOff)
	if !ok {
		t.Fatal("Desired: not ok")
	}
	if diff := cmp.Diff(flatDesired{Own: ownedEverywhere}, flat(d), cmpNet); diff != "" {
		t.Errorf("Desired (-want +got):\n%s", diff)
	}
	settled(t, node(), config(), mtupolicy.ModeOff)
}

// Case 6: mode unknown: nothing may be planned, whatever the state.
func TestCase06ModeUnknown(t *testing.T) {
	states := map[string]netwatch.Snapshot{
		"fresh":     node(),
		"converged": converged(t),
		"empty":     {},
	}
	for name, s := range states {
		for _, mode := range []mtupolicy.Mode{mtupolicy.ModeUnknown, mtupolicy.Mode(-1), mtupolicy.Mode(3)} {
			if d, ok := mtupolicy.Desired(s.View(), config(), mode); ok || !cmp.Equal(d, reconcile.Desired{}, cmpNet) {
				t.Errorf("%s, mode %v: Desired = %+v, %v; want nothing, false", name, mode, d, ok)
			}
		}
	}
}

// Case 7: the mode stands while the read turns unknown (the agent keeps the
// last good mode; here it stays on), and the table is rebuilt after an
// interface bounce, which takes the IPv4 routes of the link away without
// events and the IPv6 ones with them.
func TestCase07InterfaceBounce(t *testing.T) {
	s := converged(t)
	down := clone(s)
	link := index(t, down.Links, func(l netwatch.Link) bool { return l.Index == idxEnp })
	down.Links[link].Flags = 0
	down.Routes = slices.DeleteFunc(down.Routes, func(r netwatch.Route) bool { return r.Index == idxEnp })
	ops, down := pass(t, down, config(), mtupolicy.ModeOn)
	// Nothing left to split: the rules have nothing to send traffic to.
	if diff := cmp.Diff([]netwatch.Op{ruleDel(rule4), ruleDel(rule6)}, ops, cmpNet); diff != "" {
		t.Errorf("link down (-want +got):\n%s", diff)
	}
	settled(t, down, config(), mtupolicy.ModeOn)

	up := clone(down)
	up.Links[link].Flags = netwatch.LinkUp | netwatch.LinkLowerUp
	up.Routes = append(up.Routes, with(nodeNet, func(r *netwatch.Route) { r.MTU = 0 }), nodeGW, nodeNet6, linkLocal6)
	ops, up = pass(t, up, config(), mtupolicy.ModeOn)
	want := []netwatch.Op{replace(tNodeGW), replace(tNodeNet), replace(tNodeNet6), ruleAdd(rule4), ruleAdd(rule6)}
	if diff := cmp.Diff(want, ops, cmpNet); diff != "" {
		t.Errorf("link up (-want +got):\n%s", diff)
	}
	settled(t, up, config(), mtupolicy.ModeOn)
	checkRouteGets(t, up, []routeGet{
		{dst: "10.0.0.9", table: 900, mtu: 1355},
		{dst: "10.0.0.9", mark: 0xe00, table: netwatch.TableMain, mtu: 1450},
	})
}

// Case 8: the tunnel link is deleted: the table routes and the rules go,
// rules first.
func TestCase08TunnelGone(t *testing.T) {
	for _, name := range []string{"deleted", "renamed"} {
		t.Run(name, func(t *testing.T) {
			s := converged(t)
			i := index(t, s.Links, func(l netwatch.Link) bool { return l.Index == idxWG })
			if name == "deleted" {
				s.Links = slices.Delete(s.Links, i, i+1)
			} else {
				s.Links[i].Name = "wg0"
			}
			ops, after := pass(t, s, config(), mtupolicy.ModeOn)
			want := []netwatch.Op{
				ruleDel(rule4), ruleDel(rule6),
				routeDel(tNodeNet), routeDel(tNodeGW), routeDel(tNodeNet6),
			}
			if diff := cmp.Diff(want, ops, cmpNet); diff != "" {
				t.Errorf("Plan (-want +got):\n%s", diff)
			}
			settled(t, after, config(), mtupolicy.ModeOn)
		})
	}
}

// Case 9: stray rules at the owned priority are replaced; of two identical
// rules, one is removed. The kernel ignores "not" when it looks a rule up
// for an exclusive add or a delete, and a delete matches whatever the
// request leaves unset: the plans below are the orders that converge.
// dscpAttr is FRA_DSCP 0x2e, an attribute netwatch keeps undecoded: length
// 5, type 25, the value, padding.
const dscpAttr = netwatch.Attrs("\x05\x00\x19\x00\x2e\x00\x00\x00")

func TestCase09StrayRules(t *testing.T) {
	oldLoop := with(rule4, func(r *netwatch.Rule) { r.Protocol = 0 }) // the shell loop's rule: no proto
	otherMark := with(rule4, func(r *netwatch.Rule) { r.Mark, r.Mask, r.Protocol = 0x1e00, 0xff00, 0 })
	noNot := with(rule4, func(r *netwatch.Rule) { r.Invert = false; r.Protocol = 0 })
	otherTable := with(rule4, func(r *netwatch.Rule) { r.Table = 901; r.Protocol = 0 })
	bare := netwatch.Rule{Family: netwatch.IPv4, Priority: 900, Table: 900, Action: netwatch.ActionToTable}
	undecoded := with(rule4, func(r *netwatch.Rule) { r.Attrs = dscpAttr }) // a selector the policy does not set
	tests := []struct {
		name   string
		before []netwatch.Rule // at priority 900 in IPv4, ahead of rule4 (when present, it is listed)
		want   []netwatch.Op
	}{
		{name: "the shell loop's rule, no rule of ours", before: []netwatch.Rule{oldLoop},
			want: []netwatch.Op{ruleAdd(rule4), ruleDel(oldLoop)}},
		{name: "another mark, no rule of ours", before: []netwatch.Rule{otherMark},
			want: []netwatch.Op{ruleAdd(rule4), ruleDel(otherMark)}},
		{name: "another mark, behind ours", before: []netwatch.Rule{rule4, otherMark},
			want: []netwatch.Op{ruleDel(otherMark)}},
		{name: "no not, no rule of ours", before: []netwatch.Rule{noNot},
			want: []netwatch.Op{ruleAdd(rule4), ruleDel(noNot)}},
		// Deleting it would delete ours, ahead of it.
		{name: "no not, behind ours", before: []netwatch.Rule{rule4, noNot},
			want: []netwatch.Op{ruleDel(rule4), ruleDel(noNot), ruleAdd(rule4)}},
		// With our proto it collides with ours for an exclusive add.
		{name: "no not with our proto, no rule of ours", before: []netwatch.Rule{with(noNot, func(r *netwatch.Rule) { r.Protocol = 109 })},
			want: []netwatch.Op{ruleDel(with(noNot, func(r *netwatch.Rule) { r.Protocol = 109 })), ruleAdd(rule4)}},
		{name: "another table, behind ours", before: []netwatch.Rule{rule4, otherTable},
			want: []netwatch.Op{ruleDel(otherTable)}},
		{name: "a bare lookup ahead of ours", before: []netwatch.Rule{bare, rule4},
			want: []netwatch.Op{ruleDel(bare)}},
		// The delete names the attribute: it cannot hit ours.
		{name: "undecoded attributes, behind ours", before: []netwatch.Rule{rule4, undecoded},
			want: []netwatch.Op{ruleDel(undecoded)}},
		{name: "two identical rules", before: []netwatch.Rule{rule4, rule4},
			want: []netwatch.Op{ruleDel(rule4)}},
		{name: "three identical rules", before: []netwatch.Rule{rule4, rule4, rule4},
			want: []netwatch.Op{ruleDel(rule4), ruleDel(rule4)}},
		{name: "two identical strays", before: []netwatch.Rule{rule4, otherMark, otherMark},
			want: []netwatch.Op{ruleDel(otherMark), ruleDel(otherMark)}},
		{name: "all of them", before: []netwatch.Rule{otherMark, rule4, noNot, otherTable, rule4, bare, undecoded},
			want: []netwatch.Op{ruleDel(otherMark), ruleDel(rule4), ruleDel(noNot), ruleDel(otherTable), ruleDel(rule4), ruleDel(bare), ruleDel(undecoded), ruleAdd(rule4)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := converged(t)
			i := index(t, s.Rules, func(r netwatch.Rule) bool { return r.Equal(rule4) })
			s.Rules = slices.Delete(s.Rules, i, i+1)
			s.Rules = slices.Insert(s.Rules, i, tt.before...)
			ops, after := pass(t, s, config(), mtupolicy.ModeOn)
			if diff := cmp.Diff(tt.want, ops, cmpNet); diff != "" {
				t.Errorf("Plan (-want +got):\n%s", diff)
			}
			settled(t, after, config(), mtupolicy.ModeOn)
			var at900 []netwatch.Rule
			for _, r := range after.Rules {
				if r.Priority == 900 && r.Family == netwatch.IPv4 {
					at900 = append(at900, r)
				}
			}
			if diff := cmp.Diff([]netwatch.Rule{rule4}, at900, cmpNet); diff != "" {
				t.Errorf("IPv4 rules at 900 after one pass (-want +got):\n%s", diff)
			}
		})
	}
}

// Case 10: stale table routes are replaced or dropped.
func TestCase10StaleTableRoutes(t *testing.T) {
	mtu1420 := func(r netwatch.Route) netwatch.Route { return with(r, func(r *netwatch.Route) { r.MTU = 1420 }) }
	tests := []struct {
		name   string
		change func(*testing.T, *netwatch.Snapshot, *mtupolicy.Config)
		want   []netwatch.Op
	}{
		{
			name: "tunnel MTU 1355 → 1420",
			change: func(t *testing.T, s *netwatch.Snapshot, _ *mtupolicy.Config) {
				s.Links[index(t, s.Links, func(l netwatch.Link) bool { return l.Index == idxWG })].MTU = 1420
			},
			want: []netwatch.Op{
				replaceWas(mtu1420(tNodeGW), tNodeGW), replaceWas(mtu1420(tNodeNet), tNodeNet),
				replaceWas(mtu1420(tNodeNet6), tNodeNet6),
			},
		},
		{
			name:   "prefix no longer selected",
			change: func(_ *testing.T, _ *netwatch.Snapshot, c *mtupolicy.Config) { c.Prefixes = c.Prefixes[:1] },
			want:   []netwatch.Op{ruleDel(rule6), routeDel(tNodeNet6)},
		},
		{
			name: "main route gone",
			change: func(t *testing.T, s *netwatch.Snapshot, _ *mtupolicy.Config) {
				s.Routes = slices.DeleteFunc(s.Routes, func(r netwatch.Route) bool { return r.Key() == nodeGW.Key() })
			},
			want: []netwatch.Op{routeDel(tNodeGW)},
		},
		{
			name: "gateway changed",
			change: func(t *testing.T, s *netwatch.Snapshot, _ *mtupolicy.Config) {
				i := index(t, s.Routes, func(r netwatch.Route) bool { return r.Key() == nodeNet.Key() })
				s.Routes[i].Gateway = addr("10.0.0.2")
			},
			want: []netwatch.Op{replaceWas(with(tNodeNet, func(r *netwatch.Route) { r.Gateway = addr("10.0.0.2") }), tNodeNet)},
		},
		{
			name: "table route edited by hand",
			change: func(t *testing.T, s *netwatch.Snapshot, _ *mtupolicy.Config) {
				i := index(t, s.Routes, func(r netwatch.Route) bool { return r.Key() == tNodeNet.Key() })
				s.Routes[i].MTU, s.Routes[i].PrefSrc = 1450, netip.Addr{}
			},
			want: []netwatch.Op{replaceWas(tNodeNet, with(tNodeNet, func(r *netwatch.Route) { r.MTU, r.PrefSrc = 1450, netip.Addr{} }))},
		},
		{
			name: "a foreign route in the table",
			change: func(t *testing.T, s *netwatch.Snapshot, _ *mtupolicy.Config) {
				s.Routes = append(s.Routes, with(tNodeNet, func(r *netwatch.Route) { r.Dst, r.Protocol = pfx("192.168.0.0/16"), netwatch.ProtoBoot }))
			},
			want: []netwatch.Op{routeDel(with(tNodeNet, func(r *netwatch.Route) { r.Dst, r.Protocol = pfx("192.168.0.0/16"), netwatch.ProtoBoot }))},
		},
		{
			name: "the shell loop's table route (proto boot)",
			change: func(t *testing.T, s *netwatch.Snapshot, _ *mtupolicy.Config) {
				i := index(t, s.Routes, func(r netwatch.Route) bool { return r.Key() == tNodeNet.Key() })
				s.Routes[i].Protocol = netwatch.ProtoBoot
			},
			want: []netwatch.Op{replaceWas(tNodeNet, with(tNodeNet, func(r *netwatch.Route) { r.Protocol = netwatch.ProtoBoot }))},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, cfg := converged(t), config()
			tt.change(t, &s, &cfg)
			ops, after := pass(t, s, cfg, mtupolicy.ModeOn)
			if diff := cmp.Diff(tt.want, ops, cmpNet); diff != "" {
				t.Errorf("Plan (-want +got):\n%s", diff)
			}
			settled(t, after, cfg, mtupolicy.ModeOn)
		})
	}
}

// Case 11: a failed listing (an unsynced view) edits nothing.
func TestCase11NotSynced(t *testing.T) {
	var v netwatch.View // what a failed listing leaves
	for _, mode := range []mtupolicy.Mode{mtupolicy.ModeOn, mtupolicy.ModeOff} {
		if d, ok := mtupolicy.Desired(v, config(), mode); ok {
			t.Errorf("Desired(unsynced, %v) = %+v, true; want false", mode, d)
		}
	}
	// And should a caller plan anyway, with what it wanted before:
	d, _ := mtupolicy.Desired(node().View(), config(), mtupolicy.ModeOff)
	ops, err := reconcile.Plan(v, d)
	if !errors.Is(err, reconcile.ErrNotSynced) || ops != nil {
		t.Errorf("Plan(unsynced) = %v, %v; want nil, ErrNotSynced", ops, err)
	}
}

// Case 12: a main route without an MTU attribute, and routes the kernel
// flags linkdown or dead, are compared correctly.
func TestCase12KernelFlags(t *testing.T) {
	t.Run("no MTU attribute", func(t *testing.T) {
		s := node()
		i := index(t, s.Routes, func(r netwatch.Route) bool { return r.Key() == nodeNet.Key() })
		s.Routes[i].MTU = 0
		ops, after := pass(t, s, config(), mtupolicy.ModeOn)
		want := []netwatch.Op{replace(tNodeGW), replace(tNodeNet), replace(tNodeNet6), ruleAdd(rule4), ruleAdd(rule6)}
		if diff := cmp.Diff(want, ops, cmpNet); diff != "" {
			t.Errorf("Plan (-want +got):\n%s", diff)
		}
		settled(t, after, config(), mtupolicy.ModeOn)
		checkRouteGets(t, after, []routeGet{
			{dst: "10.0.0.9", table: 900, mtu: 1355},
			{dst: "10.0.0.9", mark: 0xe00, table: netwatch.TableMain, mtu: 1450},
		})
	})
	for _, flags := range []netwatch.RouteFlags{netwatch.RouteLinkdown, netwatch.RouteDead | netwatch.RouteLinkdown} {
		t.Run("flags "+flagNames(flags), func(t *testing.T) {
			// enp7s0 lost carrier: the kernel flags every route out of it.
			s := node()
			s.Links[index(t, s.Links, func(l netwatch.Link) bool { return l.Index == idxEnp })].Flags = netwatch.LinkUp
			for i, r := range s.Routes {
				if r.Index == idxEnp {
					s.Routes[i].Flags |= flags
				}
			}
			ops, after := pass(t, s, config(), mtupolicy.ModeOn)
			want := []netwatch.Op{
				replace(tNodeGW), replace(tNodeNet), replace(tNodeNet6), ruleAdd(rule4), ruleAdd(rule6),
				repair(nodeNetRepair, with(nodeNet, func(r *netwatch.Route) { r.Flags = flags })),
			}
			if diff := cmp.Diff(want, ops, cmpNet); diff != "" {
				t.Errorf("Plan (-want +got):\n%s", diff)
			}
			for _, r := range after.Routes {
				if r.Table == 900 && r.Flags&netwatch.RouteLinkdown == 0 {
					t.Errorf("the model kernel should flag %v linkdown", r)
				}
			}
			settled(t, after, config(), mtupolicy.ModeOn)
		})
	}
}

func flagNames(f netwatch.RouteFlags) string {
	s := ""
	if f&netwatch.RouteDead != 0 {
		s += "dead,"
	}
	if f&netwatch.RouteLinkdown != 0 {
		s += "linkdown"
	}
	return s
}

// Case 13: IPv6 alongside IPv4, each with its own rule, and each only when
// it has table routes.
func TestCase13Families(t *testing.T) {
	tests := []struct {
		name     string
		prefixes []netip.Prefix
		want     []netwatch.Op
	}{
		{name: "both", prefixes: []netip.Prefix{pfx("10.0.0.0/16"), pfx("2001:db8::/64")},
			want: []netwatch.Op{replace(tNodeGW), replace(tNodeNet), replace(tNodeNet6), ruleAdd(rule4), ruleAdd(rule6), repair(nodeNetRepair, nodeNet)}},
		{name: "IPv6 only", prefixes: []netip.Prefix{pfx("2001:db8::/32")},
			want: []netwatch.Op{replace(tNodeNet6), ruleAdd(rule6)}},
		{name: "IPv4 only", prefixes: []netip.Prefix{pfx("10.0.0.0/12")},
			want: []netwatch.Op{replace(tNodeGW), replace(tNodeNet), ruleAdd(rule4), repair(nodeNetRepair, nodeNet)}},
		{name: "nothing matches", prefixes: []netip.Prefix{pfx("192.168.0.0/16")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := config()
			cfg.Prefixes = tt.prefixes
			ops, after := pass(t, node(), cfg, mtupolicy.ModeOn)
			if diff := cmp.Diff(tt.want, ops, cmpNet); diff != "" {
				t.Errorf("Plan (-want +got):\n%s", diff)
			}
			settled(t, after, cfg, mtupolicy.ModeOn)
		})
	}
}

// Which main routes are split, and how: a golden table over the kinds of
// route a node has.
func TestSelection(t *testing.T) {
	main4 := func(dst string, f func(*netwatch.Route)) netwatch.Route {
		r := netwatch.Route{Family: netwatch.IPv4, Table: netwatch.TableMain, Dst: pfx(dst), Gateway: addr("10.0.0.1"),
			Index: idxEnp, Protocol: netwatch.ProtoStatic, Type: netwatch.RouteUnicast}
		if f != nil {
			f(&r)
		}
		return r
	}
	table := func(r netwatch.Route, f func(*netwatch.Route)) netwatch.Route {
		t := netwatch.Route{Family: r.Family, Table: 900, Dst: r.Dst, Metric: r.Metric, Gateway: r.Gateway, Index: r.Index,
			PrefSrc: addr("10.0.0.5"), MTU: 1355, Protocol: 109, Scope: r.Scope, Type: netwatch.RouteUnicast}
		if f != nil {
			f(&t)
		}
		return t
	}
	throw := func(r netwatch.Route) netwatch.Route {
		return netwatch.Route{Family: r.Family, Table: 900, Dst: r.Dst, Metric: r.Metric, Protocol: 109, Type: netwatch.RouteThrow}
	}
	covering := main4("10.0.0.0/8", nil)
	tests := []struct {
		name     string
		main     []netwatch.Route
		underlay string
		want     []netwatch.Route // table routes
	}{
		{name: "inside a prefix", main: []netwatch.Route{main4("10.0.5.0/24", nil)},
			want: []netwatch.Route{table(main4("10.0.5.0/24", nil), nil)}},
		{name: "equal to a prefix", main: []netwatch.Route{main4("10.0.0.0/16", nil)},
			want: []netwatch.Route{table(main4("10.0.0.0/16", nil), nil)}},
		{name: "covering a prefix", main: []netwatch.Route{covering}},
		{name: "outside", main: []netwatch.Route{main4("192.168.0.0/16", nil)}},
		{name: "out of the underlay link", underlay: "enp7s0", main: []netwatch.Route{main4("192.168.0.0/16", nil)},
			want: []netwatch.Route{table(main4("192.168.0.0/16", nil), nil)}},
		{name: "the default route, even out of the underlay link", underlay: "enp7s0", main: []netwatch.Route{main4("0.0.0.0/0", nil)}},
		{name: "link-local out of the underlay link", underlay: "enp7s0",
			main: []netwatch.Route{main4("169.254.0.0/16", func(r *netwatch.Route) { r.Gateway = netip.Addr{}; r.Scope = netwatch.ScopeLink })}},
		{name: "multicast", underlay: "enp7s0", main: []netwatch.Route{main4("224.0.0.0/4", func(r *netwatch.Route) { r.Gateway = netip.Addr{} })}},
		{name: "blackhole", main: []netwatch.Route{main4("10.0.5.0/24", func(r *netwatch.Route) { r.Type, r.Gateway, r.Index = netwatch.RouteBlackhole, netip.Addr{}, 0 })}},
		{name: "multipath", main: []netwatch.Route{main4("10.0.5.0/24", func(r *netwatch.Route) {
			r.Gateway, r.Index = netip.Addr{}, 0
			r.NextHops = []netwatch.NextHop{{Gateway: addr("10.0.0.1"), Index: idxEnp, Weight: 1}, {Gateway: addr("10.0.0.2"), Index: idxEnp, Weight: 1}}
		})}},
		{name: "nexthop object", main: []netwatch.Route{main4("10.0.5.0/24", func(r *netwatch.Route) { r.Gateway, r.Index, r.NHID = netip.Addr{}, 0, 7 })}},
		{name: "an IPv6 gateway (RTA_VIA)", main: []netwatch.Route{main4("10.0.5.0/24", func(r *netwatch.Route) { r.Gateway = addr("fe80::1") })}},
		{name: "out of the tunnel link", main: []netwatch.Route{main4("10.0.5.0/24", func(r *netwatch.Route) { r.Gateway, r.Index = netip.Addr{}, idxWG })}},
		{name: "a device route keeps its scope", main: []netwatch.Route{main4("10.0.0.0/16", func(r *netwatch.Route) { r.Gateway, r.Scope = netip.Addr{}, netwatch.ScopeLink })},
			want: []netwatch.Route{table(main4("10.0.0.0/16", func(r *netwatch.Route) { r.Gateway, r.Scope = netip.Addr{}, netwatch.ScopeLink }), nil)}},
		{name: "metric and onlink kept, kernel flags dropped", main: []netwatch.Route{main4("10.0.0.0/16", func(r *netwatch.Route) {
			r.Metric, r.Flags = 100, netwatch.RouteOnlink|netwatch.RouteLinkdown
		})}, want: []netwatch.Route{table(main4("10.0.0.0/16", func(r *netwatch.Route) { r.Metric = 100 }), func(r *netwatch.Route) { r.Flags = netwatch.RouteOnlink })}},
		{name: "own prefsrc kept", main: []netwatch.Route{main4("10.0.0.0/16", func(r *netwatch.Route) { r.PrefSrc = addr("10.0.0.3") })},
			want: []netwatch.Route{table(main4("10.0.0.0/16", nil), func(r *netwatch.Route) { r.PrefSrc = addr("10.0.0.3") })}},
		{name: "only the first of appended routes", main: []netwatch.Route{main4("10.0.0.0/16", nil), main4("10.0.0.0/16", func(r *netwatch.Route) { r.Gateway = addr("10.0.0.2") })},
			want: []netwatch.Route{table(main4("10.0.0.0/16", nil), nil)}},
		{name: "primary and backup by metric", main: []netwatch.Route{main4("10.0.0.0/16", func(r *netwatch.Route) { r.Metric = 100 }), main4("10.0.0.0/16", func(r *netwatch.Route) { r.Metric, r.Gateway = 200, addr("10.0.0.2") })},
			want: []netwatch.Route{table(main4("10.0.0.0/16", func(r *netwatch.Route) { r.Metric = 100 }), nil), table(main4("10.0.0.0/16", func(r *netwatch.Route) { r.Metric, r.Gateway = 200, addr("10.0.0.2") }), nil)}},
		// A more specific route the split must not shadow: its packets
		// fall through the table to the main table.
		{name: "a more specific route out of another link gets a throw", underlay: "enp7s0",
			main: []netwatch.Route{covering, main4("10.7.0.0/16", func(r *netwatch.Route) { r.Gateway, r.Index = addr("203.0.113.1"), idxEth })},
			want: []netwatch.Route{table(covering, nil), throw(main4("10.7.0.0/16", nil))}},
		{name: "a more specific route out of the tunnel link gets a throw",
			main: []netwatch.Route{main4("10.0.0.0/16", nil), main4("10.0.7.0/24", func(r *netwatch.Route) { r.Gateway, r.Index = netip.Addr{}, idxWG })},
			want: []netwatch.Route{table(main4("10.0.0.0/16", nil), nil), throw(main4("10.0.7.0/24", nil))}},
		{name: "a more specific blackhole gets a throw",
			main: []netwatch.Route{main4("10.0.0.0/16", nil), main4("10.0.7.0/24", func(r *netwatch.Route) { r.Type, r.Gateway, r.Index = netwatch.RouteBlackhole, netip.Addr{}, 0 })},
			want: []netwatch.Route{table(main4("10.0.0.0/16", nil), nil), throw(main4("10.0.7.0/24", nil))}},
		{name: "a preferred multipath route to the same destination gets a throw",
			main: []netwatch.Route{main4("10.0.0.0/16", func(r *netwatch.Route) { r.Metric = 200 }), main4("10.0.0.0/16", func(r *netwatch.Route) {
				r.Metric, r.Gateway, r.Index = 100, netip.Addr{}, 0
				r.NextHops = []netwatch.NextHop{{Gateway: addr("10.0.0.1"), Index: idxEnp, Weight: 1}, {Gateway: addr("10.0.0.2"), Index: idxEnp, Weight: 1}}
			})},
			want: []netwatch.Route{table(main4("10.0.0.0/16", func(r *netwatch.Route) { r.Metric = 200 }), nil), throw(main4("10.0.0.0/16", func(r *netwatch.Route) { r.Metric = 100 }))}},
		{name: "IPv6 throws hang on lo",
			main: []netwatch.Route{with(nodeNet6, func(r *netwatch.Route) { r.Dst = pfx("2001:db8::/48") }), with(nodeNet6, func(r *netwatch.Route) { r.Dst, r.Index = pfx("2001:db8:0:7::/64"), idxWG })},
			want: []netwatch.Route{
				{Family: netwatch.IPv6, Table: 900, Dst: pfx("2001:db8::/48"), Metric: 256, Index: idxEnp, PrefSrc: addr("2001:db8::5"), MTU: 1355, Protocol: 109, Type: netwatch.RouteUnicast},
				{Family: netwatch.IPv6, Table: 900, Dst: pfx("2001:db8:0:7::/64"), Metric: 256, Index: idxLo, Protocol: 109, Type: netwatch.RouteThrow},
			}},
		{name: "an IPv6 metric 0 is copied as the kernel's 1024", main: []netwatch.Route{with(nodeNet6, func(r *netwatch.Route) { r.Metric = 0 })},
			want: []netwatch.Route{with(tNodeNet6, func(r *netwatch.Route) { r.Metric = 1024 })}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := node()
			s.Routes = tt.main
			cfg := config()
			cfg.Prefixes = []netip.Prefix{pfx("10.0.0.0/16"), pfx("2001:db8::/48")}
			cfg.UnderlayLink = tt.underlay
			d, ok := mtupolicy.Desired(s.View(), cfg, mtupolicy.ModeOn)
			if !ok {
				t.Fatal("Desired: not ok")
			}
			if diff := cmp.Diff(sortedRoutes(tt.want), flat(d).Routes, cmpNet); diff != "" {
				t.Errorf("table routes (-want +got):\n%s", diff)
			}
			// Every pass converges, and the split changes no packet's
			// path: only the MTU of unmarked ones.
			_, after := pass(t, s, cfg, mtupolicy.ModeOn)
			settled(t, after, cfg, mtupolicy.ModeOn)
			checkSamePaths(t, s, after)
		})
	}
}

// checkSamePaths checks that, for a probe address at each end of every
// main-table route, the packet leaves the same way before and after: the
// same gateway and link (or no route), marked or not.
func checkSamePaths(t interface {
	Helper()
	Errorf(string, ...any)
}, before, after netwatch.Snapshot) {
	t.Helper()
	for _, m := range before.Routes {
		if m.Table != netwatch.TableMain {
			continue
		}
		for _, dst := range []netip.Addr{m.Dst.Addr(), lastAddr(m.Dst)} {
			for _, mark := range []netwatch.Mark{0, 0x1e00} {
				b, _, bok := lookup(before, dst, mark)
				a, _, aok := lookup(after, dst, mark)
				if aok != bok || a.Gateway != b.Gateway || a.Index != b.Index || a.Type != b.Type || !slices.Equal(a.NextHops, b.NextHops) {
					t.Errorf("ip route get %v mark %v: %v (table %v) after, %v (table %v) before", dst, mark, a, a.Table, b, b.Table)
				}
			}
		}
	}
}

func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// The source address of a table route.
func TestPrefSrc(t *testing.T) {
	tests := []struct {
		name  string
		addrs []netwatch.Addr
		route netwatch.Route
		want  netip.Addr
	}{
		{name: "the route's own", route: with(nodeNet, func(r *netwatch.Route) { r.PrefSrc = addr("10.0.0.7") }),
			addrs: []netwatch.Addr{{Index: idxEnp, Prefix: pfx("10.0.0.5/16")}}, want: addr("10.0.0.7")},
		{name: "the primary inside the destination, not the secondary", route: nodeNet,
			addrs: []netwatch.Addr{{Index: idxEnp, Prefix: pfx("10.0.0.2/16"), Flags: 0x1}, {Index: idxEnp, Prefix: pfx("10.0.0.5/16")}},
			want:  addr("10.0.0.5")},
		{name: "the lowest of several primaries", route: nodeNet,
			addrs: []netwatch.Addr{{Index: idxEnp, Prefix: pfx("10.0.9.9/24")}, {Index: idxEnp, Prefix: pfx("10.0.0.5/16")}},
			want:  addr("10.0.0.5")},
		{name: "inside the destination before the gateway's subnet", route: nodeNet,
			addrs: []netwatch.Addr{{Index: idxEnp, Prefix: pfx("10.0.0.5/16")}, {Index: idxEnp, Prefix: pfx("9.9.9.9/8")}},
			want:  addr("10.0.0.5")},
		{name: "the gateway's subnet when none is inside", route: with(nodeNet, func(r *netwatch.Route) { r.Dst = pfx("10.9.0.0/16") }),
			addrs: []netwatch.Addr{{Index: idxEnp, Prefix: pfx("10.0.0.5/24")}, {Index: idxEnp, Prefix: pfx("10.1.0.1/24")}},
			want:  addr("10.0.0.5")},
		{name: "the first global one otherwise", route: with(nodeNet, func(r *netwatch.Route) { r.Dst = pfx("10.9.0.0/16"); r.Gateway = netip.Addr{} }),
			addrs: []netwatch.Addr{{Index: idxEnp, Prefix: pfx("10.1.0.1/24")}, {Index: idxEnp, Prefix: pfx("10.2.0.1/24")}},
			want:  addr("10.1.0.1")},
		{name: "another link's address never", route: nodeNet,
			addrs: []netwatch.Addr{{Index: idxEth, Prefix: pfx("10.0.0.5/16")}}},
		{name: "IPv6: not temporary, tentative or link-local", route: with(nodeNet6, func(r *netwatch.Route) { r.Dst = pfx("2001:db8:5::/48"); r.Gateway = addr("fe80::1") }),
			addrs: []netwatch.Addr{
				{Index: idxEnp, Prefix: pfx("fe80::5/64"), Scope: netwatch.ScopeLink},
				{Index: idxEnp, Prefix: pfx("2001:db8:5::1/64"), Flags: 0x01},
				{Index: idxEnp, Prefix: pfx("2001:db8:5::2/64"), Flags: 0x40},
				{Index: idxEnp, Prefix: pfx("2001:db8:5::3/64")},
			},
			want: addr("2001:db8:5::3")},
		{name: "IPv6: the family's own", route: nodeNet6,
			addrs: []netwatch.Addr{{Index: idxEnp, Prefix: pfx("10.0.0.5/16")}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := node()
			s.Addrs, s.Routes = tt.addrs, []netwatch.Route{tt.route}
			cfg := config()
			cfg.Prefixes, cfg.UnderlayLink = nil, "enp7s0"
			got, _ := mtupolicy.Desired(s.View(), cfg, mtupolicy.ModeOn)
			d := flat(got)
			if len(d.Routes) != 1 {
				t.Fatalf("table routes: %v", d.Routes)
			}
			if got := d.Routes[0].PrefSrc; got != tt.want {
				t.Errorf("src %v, want %v", got, tt.want)
			}
		})
	}
}

// The migration from the shell loop: its rule (no proto) and table route
// (proto boot) are replaced by the agent's in one pass, without a moment
// where unmarked packets miss the table.
func TestMigrationFromShellLoop(t *testing.T) {
	s := node()
	loopRoute := with(tNodeNet, func(r *netwatch.Route) { r.Protocol = netwatch.ProtoBoot })
	loopRule := with(rule4, func(r *netwatch.Rule) { r.Protocol = 0 })
	s.Routes = append(s.Routes, loopRoute)
	s.Rules = append(s.Rules, loopRule)
	ops := plan(t, s, config(), mtupolicy.ModeOn)
	want := []netwatch.Op{
		replace(tNodeGW), replaceWas(tNodeNet, loopRoute), replace(tNodeNet6),
		ruleAdd(rule4), ruleAdd(rule6),
		repair(nodeNetRepair, nodeNet),
		ruleDel(loopRule),
	}
	if diff := cmp.Diff(want, ops, cmpNet); diff != "" {
		t.Errorf("Plan (-want +got):\n%s", diff)
	}
	// After each step, unmarked packets to the node network take the
	// table at the tunnel MTU.
	k := kernel{s: clone(s)}
	for _, op := range ops {
		if err := k.apply([]netwatch.Op{op}); err != nil {
			t.Fatal(err)
		}
		if r, mtu, _ := lookup(k.s, addr("10.0.0.9"), 0); r.Table != 900 || mtu != 1355 {
			t.Errorf("after %v %v: table %v mtu %d", op.Kind, op.Route, r.Table, mtu)
		}
	}
	settled(t, k.s, config(), mtupolicy.ModeOn)
}

func TestModeString(t *testing.T) {
	for m, want := range map[mtupolicy.Mode]string{
		mtupolicy.ModeUnknown: "unknown", mtupolicy.ModeOn: "on", mtupolicy.ModeOff: "off", mtupolicy.Mode(7): "unknown(7)",
	} {
		if got := m.String(); got != want {
			t.Errorf("Mode(%d).String() = %q, want %q", int(m), got, want)
		}
	}
}

// flatDesired is a Desired with its routes in a slice, as the tests
// compare them.
type flatDesired struct {
	Own     reconcile.Owned
	Routes  []netwatch.Route
	Rules   []netwatch.Rule
	Repairs []netwatch.Route
	Notes   []string
}

// flat returns d with its routes sorted by key, nil if none (Plan depends
// on neither their order nor how the set holds them).
func flat(d reconcile.Desired) flatDesired {
	return flatDesired{Own: d.Own, Routes: sortedRoutes(slices.Collect(d.Routes.All())), Rules: d.Rules, Repairs: d.Repairs, Notes: d.Notes}
}

// sortedRoutes returns rs sorted by key, nil if empty.
func sortedRoutes(rs []netwatch.Route) []netwatch.Route {
	if len(rs) == 0 {
		return nil
	}
	rs = slices.Clone(rs)
	slices.SortStableFunc(rs, func(a, b netwatch.Route) int { return a.Key().Compare(b.Key()) })
	return rs
}
