package mtupolicy_test

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"pgregory.net/rapid"

	"github.com/marksplit/marksplit/mtupolicy"
	"github.com/marksplit/marksplit/netwatch"
	"github.com/marksplit/marksplit/netwatch/reconcile"
)

// Cases 14 and 15 as properties over random nodes: random main-table routes
// of every kind, Cilium's tables and rules, random foreign tables and
// priorities, and random junk inside the owned table and priority.

type world struct {
	s    netwatch.Snapshot
	cfg  mtupolicy.Config
	mode mtupolicy.Mode
}

func drawWorld(t *rapid.T) world {
	up := netwatch.LinkUp | netwatch.LinkLowerUp
	enpFlags := up
	if rapid.IntRange(0, 4).Draw(t, "enpNoCarrier") == 0 {
		enpFlags = netwatch.LinkUp // linkdown routes
	}
	tunMTU := rapid.SampledFrom([]uint32{1355, 1420, 1405}).Draw(t, "tunnelMTU")
	s := netwatch.Snapshot{
		Links: []netwatch.Link{
			{Index: idxLo, Name: "lo", MTU: 65536, Flags: up | netwatch.LinkLoopback},
			{Index: idxEnp, Name: "enp7s0", MTU: rapid.SampledFrom([]uint32{1450, 1500, 9000}).Draw(t, "enpMTU"), Flags: enpFlags},
			{Index: idxEth, Name: "eth0", MTU: 1500, Flags: up},
			{Index: idxCHost, Name: "cilium_host", MTU: 1450, Flags: up},
		},
		Addrs: []netwatch.Addr{
			{Index: idxLo, Prefix: pfx("127.0.0.1/8"), Scope: netwatch.ScopeHost},
			{Index: idxEnp, Prefix: pfx("10.0.0.5/16")},
			{Index: idxEnp, Prefix: pfx("2001:db8::5/64")},
			{Index: idxEnp, Prefix: pfx("fe80::5/64"), Scope: netwatch.ScopeLink},
			{Index: idxEth, Prefix: pfx("203.0.113.10/24")},
			{Index: idxCHost, Prefix: pfx("10.244.0.90/32")},
		},
	}
	if rapid.Bool().Draw(t, "secondary") {
		s.Addrs = append(s.Addrs, netwatch.Addr{Index: idxEnp, Prefix: pfx("10.0.0.3/16"), Flags: 0x1})
	}
	if rapid.IntRange(0, 4).Draw(t, "tunnelGone") > 0 {
		s.Links = append(s.Links, netwatch.Link{Index: idxWG, Name: "cilium_wg0", MTU: tunMTU, Flags: up, Kind: "wireguard"})
	}

	// Main-table routes.
	dst4 := []string{"0.0.0.0/0", "10.0.0.0/16", "10.0.0.0/8", "10.0.5.0/24", "10.0.0.1/32", "10.1.0.0/16",
		"169.254.0.0/16", "192.168.1.0/24", "224.0.0.0/4", "203.0.113.0/24", "10.244.0.0/24"}
	dst6 := []string{"::/0", "2001:db8::/64", "2001:db8::/48", "2001:db8:0:5::/64", "fe80::/64", "2001:db8:ffff::/64"}
	for i := range rapid.IntRange(0, 10).Draw(t, "mainRoutes") {
		s.Routes = append(s.Routes, drawRoute(t, fmt.Sprint("main", i), netwatch.TableMain, dst4, dst6, tunMTU))
	}
	mains := slices.Clone(s.Routes)
	// Foreign tables: Cilium's and random ones.
	for i := range rapid.IntRange(0, 6).Draw(t, "foreignRoutes") {
		table := rapid.SampledFrom([]netwatch.Table{200, 201, 202, 2004, 2005, 10, 11, 300, 301, 5000, 899, 901}).Draw(t, fmt.Sprint("foreign", i, "Table"))
		s.Routes = append(s.Routes, drawRoute(t, fmt.Sprint("foreign", i), table, dst4, dst6, tunMTU))
	}
	// Junk in the owned table: random routes, and stale or appended
	// copies of main routes.
	for i := range rapid.IntRange(0, 6).Draw(t, "ownedRoutes") {
		label := fmt.Sprint("owned", i)
		r := drawRoute(t, label, 900, dst4, dst6, tunMTU)
		if len(mains) > 0 && rapid.Bool().Draw(t, label+"Copy") {
			m := rapid.SampledFrom(mains).Draw(t, label+"Main")
			if m.Family == r.Family {
				r.Dst, r.Metric = m.Dst, m.Metric
			}
			if rapid.Bool().Draw(t, label+"Exact") && m.Index != idxWG {
				r = m
				r.Table, r.MTU = 900, tunMTU
				if rapid.Bool().Draw(t, label+"NoSrc") {
					r.PrefSrc = netip.Addr{}
				}
			}
		}
		r.Protocol = rapid.SampledFrom([]netwatch.Protocol{mtupolicy.DefaultProtocol, netwatch.ProtoBoot}).Draw(t, label+"Proto")
		if rapid.IntRange(0, 3).Draw(t, label+"Throw") == 0 {
			r.Type, r.Gateway, r.Index, r.NextHops, r.NHID, r.Scope = netwatch.RouteThrow, netip.Addr{}, 0, nil, 0, 0
			if r.Family == netwatch.IPv6 {
				r.Index = idxLo
			}
		}
		s.Routes = append(s.Routes, r)
		// ip route append: another route with the key, ahead or behind.
		if r.Family == netwatch.IPv4 && rapid.IntRange(0, 2).Draw(t, label+"Append") == 0 {
			r2 := r
			switch rapid.IntRange(0, 2).Draw(t, label+"AppendKind") {
			case 0:
				r2.PrefSrc = netip.Addr{}
			case 1:
				r2.Gateway, r2.Scope = addr("10.0.0.2"), 0
			case 2:
				r2.Protocol = 0
			}
			if rapid.Bool().Draw(t, label+"AppendAhead") {
				s.Routes = slices.Insert(s.Routes, len(s.Routes)-1, r2)
			} else {
				s.Routes = append(s.Routes, r2)
			}
		}
	}
	// IPv6 keeps no appended routes (it makes them multipath).
	seen := make(map[netwatch.RouteKey]bool)
	s.Routes = slices.DeleteFunc(s.Routes, func(r netwatch.Route) bool {
		dup := seen[r.Key()] && r.Family == netwatch.IPv6
		seen[r.Key()] = true
		return dup
	})

	// Rules: the kernel's, Cilium's, random foreign ones and junk at the
	// owned priority, in kernel order.
	var rules []netwatch.Rule
	for _, f := range []netwatch.Family{netwatch.IPv4, netwatch.IPv6} {
		rules = append(rules,
			netwatch.Rule{Family: f, Priority: 1, Table: 200, Action: netwatch.ActionToTable, Mark: 0xd00, Mask: 0xf00, Protocol: netwatch.ProtoKernel},
			netwatch.Rule{Family: f, Priority: 9, Table: 2004, Action: netwatch.ActionToTable, Mark: 0x200, Mask: 0xf00, Protocol: netwatch.ProtoKernel},
			netwatch.Rule{Family: f, Priority: 10, Table: 2005, Action: netwatch.ActionToTable, Mark: 0xa00, Mask: 0xf00, Protocol: netwatch.ProtoKernel},
			netwatch.Rule{Family: f, Priority: 100, Table: netwatch.TableLocal, Action: netwatch.ActionToTable, Protocol: netwatch.ProtoKernel},
			netwatch.Rule{Family: f, Priority: 32766, Table: netwatch.TableMain, Action: netwatch.ActionToTable, Protocol: netwatch.ProtoKernel},
		)
	}
	for i := range rapid.IntRange(0, 5).Draw(t, "foreignRules") {
		r := drawRule(t, fmt.Sprint("foreignRule", i))
		r.Priority = rapid.SampledFrom([]uint32{8, 20, 109, 110, 111, 112, 899, 901, 1000, 32765}).Draw(t, fmt.Sprint("foreignRule", i, "Prio"))
		r.Table = rapid.SampledFrom([]netwatch.Table{200, 201, 202, 2004, 2005, 900, 901}).Draw(t, fmt.Sprint("foreignRule", i, "Table"))
		rules = append(rules, r)
	}
	for i := range rapid.IntRange(0, 5).Draw(t, "ownedRules") {
		r := rule4
		if rapid.IntRange(0, 2).Draw(t, fmt.Sprint("ownedRule", i, "Ours")) > 0 {
			r = drawRule(t, fmt.Sprint("ownedRule", i))
			r.Priority = 900
		}
		r.Family = rapid.SampledFrom([]netwatch.Family{netwatch.IPv4, netwatch.IPv6}).Draw(t, fmt.Sprint("ownedRule", i, "Family"))
		rules = append(rules, r)
	}
	slices.SortStableFunc(rules, func(a, b netwatch.Rule) int { return int(a.Priority) - int(b.Priority) })
	s.Rules = rules

	cfg := mtupolicy.DefaultConfig()
	for _, p := range []string{"10.0.0.0/16", "2001:db8::/48", "10.0.5.0/24", "192.168.0.0/16"} {
		if rapid.Bool().Draw(t, "prefix "+p) {
			cfg.Prefixes = append(cfg.Prefixes, pfx(p))
		}
	}
	if len(cfg.Prefixes) == 0 || rapid.Bool().Draw(t, "underlay") {
		cfg.UnderlayLink = "enp7s0"
	}
	cfg.Repair = rapid.Bool().Draw(t, "repair")
	mode := rapid.SampledFrom([]mtupolicy.Mode{mtupolicy.ModeOn, mtupolicy.ModeOn, mtupolicy.ModeOff}).Draw(t, "mode")
	return world{s: s, cfg: cfg, mode: mode}
}

func drawRoute(t *rapid.T, label string, table netwatch.Table, dst4, dst6 []string, tunMTU uint32) netwatch.Route {
	r := netwatch.Route{Table: table, Type: netwatch.RouteUnicast}
	if rapid.IntRange(0, 2).Draw(t, label+"V6") == 0 {
		r.Family = netwatch.IPv6
		r.Dst = pfx(rapid.SampledFrom(dst6).Draw(t, label+"Dst"))
		r.Metric = rapid.SampledFrom([]uint32{256, 1024}).Draw(t, label+"Metric")
		r.Gateway = rapid.SampledFrom([]netip.Addr{{}, addr("fe80::1"), addr("2001:db8::1")}).Draw(t, label+"GW")
	} else {
		r.Family = netwatch.IPv4
		r.Dst = pfx(rapid.SampledFrom(dst4).Draw(t, label+"Dst"))
		r.Metric = rapid.SampledFrom([]uint32{0, 100, 1024}).Draw(t, label+"Metric")
		r.Gateway = rapid.SampledFrom([]netip.Addr{{}, addr("10.0.0.1"), addr("10.0.0.2"), addr("203.0.113.1"), addr("fe80::1")}).Draw(t, label+"GW")
		if rapid.IntRange(0, 3).Draw(t, label+"HasSrc") == 0 {
			r.PrefSrc = addr("10.0.0.5")
		}
	}
	r.Index = rapid.SampledFrom([]uint32{idxEnp, idxEnp, idxWG, idxEth, idxCHost}).Draw(t, label+"Index")
	if r.Index == idxWG && r.Table == 900 {
		r.Index = idxEnp // the tunnel link may be missing; 900 routes out of it are gone with it
	}
	if !r.Gateway.IsValid() {
		r.Scope = netwatch.ScopeLink
	}
	r.MTU = rapid.SampledFrom([]uint32{0, tunMTU, 1355, 1450, 1400}).Draw(t, label+"MTU")
	r.Protocol = rapid.SampledFrom([]netwatch.Protocol{netwatch.ProtoKernel, netwatch.ProtoDHCP, netwatch.ProtoBoot, netwatch.ProtoStatic, netwatch.Protocol(9)}).Draw(t, label+"Proto")
	if rapid.IntRange(0, 9).Draw(t, label+"Onlink") == 0 {
		r.Flags |= netwatch.RouteOnlink
	}
	switch rapid.IntRange(0, 11).Draw(t, label+"Kind") {
	case 0:
		r.Type, r.Gateway, r.Index, r.Scope = netwatch.RouteBlackhole, netip.Addr{}, 0, 0
		if r.Family == netwatch.IPv6 {
			r.Index = idxLo
		}
	case 1:
		r.Type, r.Gateway, r.Index, r.Scope = netwatch.RouteUnreachable, netip.Addr{}, 0, 0
		if r.Family == netwatch.IPv6 {
			r.Index = idxLo
		}
	case 2:
		r.Gateway, r.Index, r.Scope = netip.Addr{}, 0, 0
		r.NextHops = []netwatch.NextHop{{Gateway: addr("10.0.0.1"), Index: idxEnp, Weight: 1}, {Gateway: addr("203.0.113.1"), Index: idxEth, Weight: 2}}
		if r.Family == netwatch.IPv6 {
			r.NextHops = []netwatch.NextHop{{Gateway: addr("fe80::1"), Index: idxEnp, Weight: 1}, {Gateway: addr("fe80::2"), Index: idxEth, Weight: 1}}
		}
	case 3:
		r.Gateway, r.Index, r.Scope, r.NHID = netip.Addr{}, 0, 0, 7
	}
	if r.Index == idxEnp && r.Type == netwatch.RouteUnicast && rapid.IntRange(0, 4).Draw(t, label+"Linkdown") == 0 {
		r.Flags |= netwatch.RouteLinkdown
	}
	return r
}

func drawRule(t *rapid.T, label string) netwatch.Rule {
	r := netwatch.Rule{
		Family:   rapid.SampledFrom([]netwatch.Family{netwatch.IPv4, netwatch.IPv6}).Draw(t, label+"Family"),
		Table:    rapid.SampledFrom([]netwatch.Table{900, 901, 200}).Draw(t, label+"Table"),
		Action:   netwatch.ActionToTable,
		Invert:   rapid.Bool().Draw(t, label+"Invert"),
		Mark:     rapid.SampledFrom([]netwatch.Mark{0, 0xe00, 0x1e00, 0x200}).Draw(t, label+"Mark"),
		Mask:     rapid.SampledFrom([]netwatch.Mark{0, 0xf00, 0xff00}).Draw(t, label+"Mask"),
		Protocol: rapid.SampledFrom([]netwatch.Protocol{0, mtupolicy.DefaultProtocol, netwatch.ProtoKernel}).Draw(t, label+"Proto"),
	}
	if rapid.IntRange(0, 5).Draw(t, label+"Attrs") == 0 {
		r.Attrs = dscpAttr
	}
	return r
}

// Case 14: nothing outside the owned table and priority is ever touched,
// except repairs of selected main routes lowered to the tunnel MTU, which
// only lose that explicit MTU.
//
// Case 15: a pass converges (the next plans nothing), its order is make
// before break, and the split changes no packet's path.
func TestCase14And15Properties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		w := drawWorld(t)
		v := w.s.View()
		d, ok := mtupolicy.Desired(v, w.cfg, w.mode)
		if !ok {
			t.Fatalf("Desired: not ok")
		}
		ops, err := reconcile.Plan(v, d)
		if err != nil {
			t.Fatalf("Plan: %v", err)
		}
		tun, hasTun := v.LinkByName(w.cfg.TunnelLink)

		// Case 14: the scope of every operation.
		checkScope(t, v, ops, w, tun, hasTun)

		// Case 15: make before break.
		checkOrder(t, ops, d)

		k := kernel{s: clone(w.s)}
		if err := k.apply(ops); err != nil {
			t.Fatalf("apply: %v\n%s", err, opsString(ops))
		}
		after := k.s

		// Case 14: the foreign state after the pass.
		repaired := make(map[netwatch.RouteKey]bool)
		for _, op := range ops {
			if op.Repair {
				repaired[op.Route.Key()] = true
			}
		}
		foreign := func(s netwatch.Snapshot) netwatch.Snapshot {
			s = withoutOwned(s)
			s.Routes = slices.DeleteFunc(s.Routes, func(r netwatch.Route) bool { return repaired[r.Key()] })
			return s
		}
		if diff := cmp.Diff(foreign(w.s), foreign(after), cmpNet); diff != "" {
			t.Fatalf("foreign state changed (-before +after):\n%s\nops:\n%s", diff, opsString(ops))
		}

		// Case 15: converged in one pass.
		d2, ok := mtupolicy.Desired(after.View(), w.cfg, w.mode)
		if !ok {
			t.Fatalf("Desired after the pass: not ok")
		}
		again, err := reconcile.Plan(after.View(), d2)
		if err != nil {
			t.Fatalf("Plan after the pass: %v", err)
		}
		if len(again) != 0 {
			t.Fatalf("the second pass plans:\n%s\nafter the first:\n%s", opsString(again), opsString(ops))
		}

		// The owned scope holds exactly what is desired.
		for _, r := range after.Routes {
			if r.Table == 900 && !slices.ContainsFunc(flat(d).Routes, func(w netwatch.Route) bool { return w.Key() == r.Key() }) {
				t.Fatalf("undesired route left in the table: %v", r)
			}
		}
		if w.mode == mtupolicy.ModeOff || !hasTun {
			if len(flat(d).Routes)+len(d.Rules)+len(d.Repairs) != 0 {
				t.Fatalf("off or no tunnel, yet desired: %+v", d)
			}
		}

		// The split changes no packet's path, marked or not, and
		// unmarked packets that take the table get the tunnel MTU. This
		// holds unless a foreign rule looks our table up, or sits
		// between our priority and the main table's: the rule at 900
		// goes first, by design.
		if !slices.ContainsFunc(w.s.Rules, func(r netwatch.Rule) bool {
			return r.Priority != 900 && (r.Table == 900 || r.Priority > 900 && r.Priority < 32766)
		}) {
			checkSamePaths(t, withoutOwned(w.s), after)
		}
		if hasTun {
			for _, r := range after.Routes {
				if r.Table == 900 && r.Type == netwatch.RouteUnicast && r.MTU != tun.MTU {
					t.Fatalf("table route %v: MTU %d, want the tunnel's %d", r, r.MTU, tun.MTU)
				}
			}
		}

		// A plan is deterministic.
		if again, _ := reconcile.Plan(v, d); !cmp.Equal(ops, again, cmpNet) {
			t.Fatalf("Plan is not deterministic")
		}
	})
}

// checkScope checks that every operation is inside the owned table and
// priority, or a repair.
func checkScope(t *rapid.T, v netwatch.View, ops []netwatch.Op, w world, tun netwatch.Link, hasTun bool) {
	for _, op := range ops {
		switch {
		case op.Kind == netwatch.RuleAdd || op.Kind == netwatch.RuleDelete:
			if op.Rule.Priority != 900 {
				t.Fatalf("%v %v: outside the owned priority", op.Kind, op.Rule)
			}
		case op.Repair:
			checkRepair(t, v, op, w, tun, hasTun)
		case op.Route.Table != 900:
			t.Fatalf("%v %v (table %v): outside the owned table", op.Kind, op.Route, op.Route.Table)
		}
	}
}

// checkRepair checks that a repair takes the explicit MTU off a selected
// main route lowered to the tunnel MTU, and changes nothing else.
func checkRepair(t *rapid.T, v netwatch.View, op netwatch.Op, w world, tun netwatch.Link, hasTun bool) {
	cur := slices.Collect(v.Route(op.Route.Key()))
	switch {
	case op.Kind != netwatch.RouteReplace || w.mode != mtupolicy.ModeOn || !hasTun || !w.cfg.Repair:
		t.Fatalf("repair %v %v: not asked for", op.Kind, op.Route)
	case op.Route.Table != netwatch.TableMain || len(cur) == 0 || !op.HasWas || !op.Was.Equal(cur[0]):
		t.Fatalf("repair %v: not of the first main route with its key (was %v)", op.Route, op.Was)
	case op.Was.MTU != tun.MTU:
		t.Fatalf("repair of %v: its MTU %d is not the tunnel's %d", op.Was, op.Was.MTU, tun.MTU)
	case op.Was.Type != netwatch.RouteUnicast || op.Was.NextHops != nil || op.Was.NHID != 0 || op.Was.Dst.Bits() == 0 || op.Was.Index == tun.Index:
		t.Fatalf("repair of %v: not a route that is split", op.Was)
	}
	want := op.Was
	want.MTU = 0
	want.Metrics.Locks &^= 1 << 2 // the MTU's lock (1<<RTAX_MTU)
	want = want.Clean()
	if !op.Route.Equal(want) {
		t.Fatalf("repair of %v to %v, want %v", op.Was, op.Route, want)
	}
}

// checkOrder checks make before break: every table route is in place
// before a rule is added; repairs come after the rules are added; undesired
// table routes go only after every rule change.
func checkOrder(t *rapid.T, ops []netwatch.Op, d reconcile.Desired) {
	desired := make(map[netwatch.RouteKey]bool)
	for _, r := range flat(d).Routes {
		desired[r.Key()] = true
	}
	lastReplace, firstRuleAdd, lastRuleAdd, firstRepair, lastRuleOp, firstPrune := -1, len(ops), -1, len(ops), -1, len(ops)
	for i, op := range ops {
		switch {
		case op.Kind == netwatch.RouteReplace && !op.Repair:
			lastReplace = i
		case op.Kind == netwatch.RuleAdd:
			firstRuleAdd = min(firstRuleAdd, i)
			lastRuleAdd = i
		case op.Repair:
			firstRepair = min(firstRepair, i)
		case op.Kind == netwatch.RouteDelete && !desired[op.Route.Key()]:
			firstPrune = min(firstPrune, i)
		}
		if op.Kind == netwatch.RuleAdd || op.Kind == netwatch.RuleDelete {
			lastRuleOp = i
		}
	}
	if lastReplace > firstRuleAdd || lastRuleAdd > firstRepair || lastRuleOp > firstPrune || firstRepair < lastReplace {
		t.Fatalf("not make before break:\n%s", opsString(ops))
	}
}

// Case 6 as a property: with the mode unknown, nothing, whatever the node.
func TestCase06ModeUnknownProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		w := drawWorld(t)
		if d, ok := mtupolicy.Desired(w.s.View(), w.cfg, mtupolicy.ModeUnknown); ok || !cmp.Equal(d, reconcile.Desired{}, cmpNet) {
			t.Fatalf("Desired(unknown) = %+v, %v", d, ok)
		}
	})
}
