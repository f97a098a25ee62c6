package netwatch

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"pgregory.net/rapid"
)

// cmpNet compares netip values, and rules field by field (Rule.Equal
// says no for rules with undecoded attributes, even to themselves).
var cmpNet = cmp.Options{
	cmpopts.EquateComparable(netip.Addr{}, netip.Prefix{}),
	cmp.Comparer(func(a, b Rule) bool { return a == b }),
}

func with[T any](v T, f func(*T)) T {
	f(&v)
	return v
}

// The fixture: table 900 and priority 900 owned in both families.
var (
	own = Own(900, 900)
	tr  = Route{Family: IPv4, Table: 900, Dst: netip.MustParsePrefix("10.0.0.0/16"),
		Gateway: netip.MustParseAddr("10.0.0.1"), Index: 2, PrefSrc: netip.MustParseAddr("10.0.0.5"),
		MTU: 1355, Protocol: 109, Type: RouteUnicast}
	tr24 = with(tr, func(r *Route) { r.Dst = netip.MustParsePrefix("10.0.5.0/24") })
	tr6  = Route{Family: IPv6, Table: 900, Dst: netip.MustParsePrefix("2001:db8::/64"), Metric: 1024,
		Gateway: netip.MustParseAddr("fe80::1"), Index: 2, PrefSrc: netip.MustParseAddr("2001:db8::5"),
		MTU: 1355, Protocol: 109, Type: RouteUnicast}
	mainRoute = with(tr, func(r *Route) { r.Table, r.PrefSrc, r.Protocol = TableMain, netip.Addr{}, ProtoDHCP })
	rule4     = Rule{Family: IPv4, Priority: 900, Table: 900, Action: ActionToTable, Invert: true,
		Mark: 0xe00, Mask: 0xf00, Protocol: 109}
	rule6 = with(rule4, func(r *Rule) { r.Family = IPv6 })
)

func replace(r Route) Op { return Op{Kind: RouteReplace, Route: r} }
func replaceWas(r, was Route) Op {
	return Op{Kind: RouteReplace, Route: r, Was: was, HasWas: true}
}
func routeDel(r Route) Op { return Op{Kind: RouteDelete, Route: r} }
func ruleAdd(r Rule) Op   { return Op{Kind: RuleAdd, Rule: r} }
func ruleDel(r Rule) Op   { return Op{Kind: RuleDelete, Rule: r} }

func TestPlan(t *testing.T) {
	linkdown := with(tr, func(r *Route) { r.Flags = RouteLinkdown | RouteDead | RouteOffload | RouteTrap | RouteUnresolved })
	onlink := with(tr, func(r *Route) { r.Flags = RouteOnlink })
	stale := with(tr, func(r *Route) { r.MTU = 1420 })
	otherGW := with(tr, func(r *Route) { r.Gateway = netip.MustParseAddr("10.0.0.2") })
	noSrc := with(tr, func(r *Route) { r.PrefSrc = netip.Addr{} })
	mark := with(rule4, func(r *Rule) { r.Mark = 0x1e00; r.Mask = 0xff00 })
	noNot := with(rule4, func(r *Rule) { r.Invert = false })
	otherTable := with(rule4, func(r *Rule) { r.Table = 901 })
	bare := Rule{Family: IPv4, Priority: 900, Table: 900, Action: ActionToTable}
	unknown := with(rule4, func(r *Rule) { r.Attrs = Attrs(appendAttr(nil, 25, []byte{0x2e})) }) // FRA_DSCP
	repaired := with(mainRoute, func(r *Route) { r.MTU = 1450 })
	foreign := []Route{
		mainRoute,
		with(tr, func(r *Route) { r.Table = 200 }),
		with(tr6, func(r *Route) { r.Table = TableMain }),
	}
	foreignRules := []Rule{
		{Family: IPv4, Priority: 0, Table: TableLocal, Action: ActionToTable},
		with(rule4, func(r *Rule) { r.Priority = 100 }),
		with(bare, func(r *Rule) { r.Priority = 901 }),
		{Family: IPv4, Priority: 32766, Table: TableMain, Action: ActionToTable},
		with(rule6, func(r *Rule) { r.Priority = 20 }),
	}
	tests := []struct {
		name  string
		state Snapshot
		d     Desired
		want  []Op
	}{
		{name: "nothing owned, nothing wanted", state: Snapshot{Routes: foreign, Rules: foreignRules}, d: Desired{}},
		{name: "owned and empty", state: Snapshot{Routes: foreign, Rules: foreignRules}, d: Desired{Own: own}},
		{
			name:  "fresh: routes, then rules",
			state: Snapshot{Routes: foreign, Rules: foreignRules},
			d:     Desired{Own: own, Routes: []Route{tr6, tr}, Rules: []Rule{rule6, rule4}},
			want:  []Op{replace(tr), replace(tr6), ruleAdd(rule4), ruleAdd(rule6)},
		},
		{
			name:  "converged",
			state: Snapshot{Routes: append(slices.Clone(foreign), tr, tr6), Rules: append(slices.Clone(foreignRules), rule4, rule6)},
			d:     Desired{Own: own, Routes: []Route{tr, tr6}, Rules: []Rule{rule4, rule6}},
		},
		{
			name: "desired duplicates collapse",
			d:    Desired{Own: own, Routes: []Route{tr, tr}, Rules: []Rule{rule4, rule4}},
			want: []Op{replace(tr), ruleAdd(rule4)},
		},
		{
			name:  "flags the kernel sets are no difference",
			state: Snapshot{Routes: []Route{linkdown}, Rules: []Rule{rule4}},
			d:     Desired{Own: own, Routes: []Route{tr}, Rules: []Rule{rule4}},
		},
		{
			name:  "flags the kernel sets are stripped from what is installed",
			state: Snapshot{Rules: []Rule{rule4}},
			d:     Desired{Own: own, Routes: []Route{linkdown}, Rules: []Rule{rule4}},
			want:  []Op{replace(tr)},
		},
		{
			name: "next-hop flags the kernel sets are no difference",
			state: Snapshot{Routes: []Route{with(tr, func(r *Route) {
				r.Gateway, r.Index = netip.Addr{}, 0
				r.NextHops = []NextHop{{Gateway: netip.MustParseAddr("10.0.0.1"), Index: 2, Weight: 1, Flags: RouteLinkdown | RouteDead}, {Gateway: netip.MustParseAddr("10.0.0.2"), Index: 3, Weight: 2}}
			})}},
			d: Desired{Own: own, Routes: []Route{with(tr, func(r *Route) {
				r.Gateway, r.Index = netip.Addr{}, 0
				r.NextHops = []NextHop{{Gateway: netip.MustParseAddr("10.0.0.1"), Index: 2, Weight: 1}, {Gateway: netip.MustParseAddr("10.0.0.2"), Index: 3, Weight: 2}}
			})}},
		},
		{
			name:  "flags a user sets are a difference",
			state: Snapshot{Routes: []Route{onlink}},
			d:     Desired{Own: own, Routes: []Route{tr}},
			want:  []Op{replaceWas(tr, onlink)},
		},
		{
			name:  "stale MTU, gateway and src replaced",
			state: Snapshot{Routes: []Route{stale, with(otherGW, func(r *Route) { r.Dst = tr24.Dst }), with(noSrc, func(r *Route) { r.Family, r.Dst, r.Metric = IPv6, tr6.Dst, 1024 })}},
			d:     Desired{Own: own, Routes: []Route{tr, tr24, tr6}},
			want: []Op{
				replaceWas(tr24, with(otherGW, func(r *Route) { r.Dst = tr24.Dst })),
				replaceWas(tr, stale),
				replaceWas(tr6, with(noSrc, func(r *Route) { r.Family, r.Dst, r.Metric = IPv6, tr6.Dst, 1024 })),
			},
		},
		{
			name:  "undesired routes in owned tables deleted, nothing else",
			state: Snapshot{Routes: append(slices.Clone(foreign), tr, tr24, tr6), Rules: foreignRules},
			d:     Desired{Own: own, Routes: []Route{tr}},
			want:  []Op{routeDel(tr24), routeDel(tr6)},
		},
		{
			name:  "an extra route appended ahead of the desired one",
			state: Snapshot{Routes: []Route{otherGW, tr}},
			d:     Desired{Own: own, Routes: []Route{tr}},
			want:  []Op{routeDel(otherGW)},
		},
		{
			name:  "an extra route appended behind the desired one",
			state: Snapshot{Routes: []Route{tr, otherGW}},
			d:     Desired{Own: own, Routes: []Route{tr}},
			want:  []Op{routeDel(otherGW)},
		},
		{
			name:  "replace the first route of a key, delete the rest",
			state: Snapshot{Routes: []Route{stale, otherGW}},
			d:     Desired{Own: own, Routes: []Route{tr}},
			want:  []Op{replaceWas(tr, stale), routeDel(otherGW)},
		},
		{
			// Deleting the src-less extra would remove the desired route
			// ahead of it (the delete leaves src unset, a wildcard).
			name:  "an extra route that shadows the desired one: key rebuilt",
			state: Snapshot{Routes: []Route{tr, noSrc}},
			d:     Desired{Own: own, Routes: []Route{tr}},
			want:  []Op{routeDel(tr), routeDel(noSrc), replace(tr)},
		},
		{
			name:  "more specific routes first, covering routes deleted first",
			state: Snapshot{Routes: []Route{with(tr, func(r *Route) { r.Dst = netip.MustParsePrefix("10.0.0.0/8") }), with(tr24, func(r *Route) { r.Dst = netip.MustParsePrefix("10.0.0.0/24") })}},
			d:     Desired{Own: own, Routes: []Route{tr, tr24}},
			want: []Op{
				replace(tr24), replace(tr),
				routeDel(with(tr, func(r *Route) { r.Dst = netip.MustParsePrefix("10.0.0.0/8") })),
				routeDel(with(tr24, func(r *Route) { r.Dst = netip.MustParsePrefix("10.0.0.0/24") })),
			},
		},
		{
			name:  "stray rule with another mark: added, then deleted",
			state: Snapshot{Routes: []Route{tr}, Rules: []Rule{mark}},
			d:     Desired{Own: own, Routes: []Route{tr}, Rules: []Rule{rule4}},
			want:  []Op{ruleAdd(rule4), ruleDel(mark)},
		},
		{
			name:  "stray rule with another table: added, then deleted",
			state: Snapshot{Routes: []Route{tr}, Rules: []Rule{otherTable}},
			d:     Desired{Own: own, Routes: []Route{tr}, Rules: []Rule{rule4}},
			want:  []Op{ruleAdd(rule4), ruleDel(otherTable)},
		},
		{
			// The kernel's exclusive add ignores "not": the add would
			// be EEXIST while the stray exists.
			name:  "stray rule without not: deleted before the add",
			state: Snapshot{Routes: []Route{tr}, Rules: []Rule{noNot}},
			d:     Desired{Own: own, Routes: []Route{tr}, Rules: []Rule{rule4}},
			want:  []Op{ruleDel(noNot), ruleAdd(rule4)},
		},
		{
			// Two desired rules: one kept, the other's add would be
			// EEXIST because of a stray; only that stray goes first.
			name:  "two desired rules, one kept, one blocked by a stray",
			state: Snapshot{Rules: []Rule{rule4, with(rule4, func(r *Rule) { r.Mark, r.Invert = 0xd00, false })}},
			d:     Desired{Own: own, Rules: []Rule{rule4, with(rule4, func(r *Rule) { r.Mark = 0xd00 })}},
			want: []Op{
				ruleDel(with(rule4, func(r *Rule) { r.Mark, r.Invert = 0xd00, false })),
				ruleAdd(with(rule4, func(r *Rule) { r.Mark = 0xd00 })),
			},
		},
		{
			// The kernel compares the attribute (here FRA_DSCP) in an add
			// and a delete: make before break.
			name:  "stray rule with undecoded attributes",
			state: Snapshot{Routes: []Route{tr}, Rules: []Rule{unknown}},
			d:     Desired{Own: own, Routes: []Route{tr}, Rules: []Rule{rule4}},
			want:  []Op{ruleAdd(rule4), ruleDel(unknown)},
		},
		{
			name:  "two identical rules: one deleted",
			state: Snapshot{Routes: []Route{tr}, Rules: []Rule{rule4, rule4}},
			d:     Desired{Own: own, Routes: []Route{tr}, Rules: []Rule{rule4}},
			want:  []Op{ruleDel(rule4)},
		},
		{
			name:  "two identical strays: two deletes",
			state: Snapshot{Routes: []Route{tr}, Rules: []Rule{mark, rule4, mark}},
			d:     Desired{Own: own, Routes: []Route{tr}, Rules: []Rule{rule4}},
			want:  []Op{ruleDel(mark), ruleDel(mark)},
		},
		{
			name:  "a stray that names less, ahead of the kept rule",
			state: Snapshot{Routes: []Route{tr}, Rules: []Rule{bare, rule4}},
			d:     Desired{Own: own, Routes: []Route{tr}, Rules: []Rule{rule4}},
			want:  []Op{ruleDel(bare)},
		},
		{
			// Deleting "lookup 900" would remove the kept rule ahead of
			// it: the priority is rebuilt.
			name:  "a stray that names less, behind the kept rule",
			state: Snapshot{Routes: []Route{tr}, Rules: []Rule{rule4, bare}},
			d:     Desired{Own: own, Routes: []Route{tr}, Rules: []Rule{rule4}},
			want:  []Op{ruleDel(rule4), ruleDel(bare), ruleAdd(rule4)},
		},
		{
			name: "opted out: rules, then routes",
			state: Snapshot{Routes: append(slices.Clone(foreign), tr6, tr, tr24),
				Rules: append(slices.Clone(foreignRules), rule4, rule6)},
			d:    Desired{Own: own},
			want: []Op{ruleDel(rule4), ruleDel(rule6), routeDel(tr), routeDel(tr24), routeDel(tr6)},
		},
		{
			name:  "repair: the route differs",
			state: Snapshot{Routes: []Route{mainRoute}},
			d:     Desired{Own: own, Repairs: []Route{repaired}},
			want:  []Op{{Kind: RouteReplace, Route: repaired, Was: mainRoute, HasWas: true, Repair: true}},
		},
		{
			name:  "repair: already so",
			state: Snapshot{Routes: []Route{with(repaired, func(r *Route) { r.Flags = RouteLinkdown })}},
			d:     Desired{Own: own, Repairs: []Route{repaired}},
		},
		{
			name: "repair: the route is gone",
			d:    Desired{Own: own, Repairs: []Route{repaired}},
		},
		{
			name: "everything at once, make before break",
			state: Snapshot{
				Routes: []Route{mainRoute, tr24, stale},
				Rules:  []Rule{mark, rule6},
			},
			d: Desired{Own: own, Routes: []Route{tr, tr6}, Rules: []Rule{rule4}, Repairs: []Route{repaired}},
			want: []Op{
				replaceWas(tr, stale), replace(tr6),
				ruleAdd(rule4),
				{Kind: RouteReplace, Route: repaired, Was: mainRoute, HasWas: true, Repair: true},
				ruleDel(mark), ruleDel(rule6),
				routeDel(tr24),
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Plan(tt.state.View(), tt.d)
			if err != nil {
				t.Fatalf("Plan: %v", err)
			}
			if diff := cmp.Diff(tt.want, got, cmpNet, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("Plan (-want +got):\n%s", diff)
			}
		})
	}
}

func TestPlanNotSynced(t *testing.T) {
	ops, err := Plan(View{}, Desired{Own: own})
	if !errors.Is(err, ErrNotSynced) || ops != nil {
		t.Fatalf("Plan(unsynced) = %v, %v; want nil, ErrNotSynced", ops, err)
	}
	if got, want := err.Error(), "netwatch: plan: view not synced"; got != want {
		t.Errorf("error %q, want %q", got, want)
	}
	v := Snapshot{Routes: []Route{tr}, Rules: []Rule{rule4}}.View()
	v.s.synced = false // a listing that failed half way
	if ops, err := Plan(v, Desired{Own: own}); !errors.Is(err, ErrNotSynced) || ops != nil {
		t.Fatalf("Plan(partial) = %v, %v; want nil, ErrNotSynced", ops, err)
	}
}

func TestPlanInvalid(t *testing.T) {
	own4 := Owned{Tables: []OwnedTable{{IPv4, 900}}, Priorities: []OwnedPriority{{IPv4, 900}}}
	tests := []struct {
		name string
		d    Desired
		want string
	}{
		{"route in a table not owned", Desired{Own: own, Routes: []Route{with(tr, func(r *Route) { r.Table = 901 })}}, "table 901 is not owned"},
		{"route in a table owned in the other family", Desired{Own: own4, Routes: []Route{tr6}}, "table 900 is not owned"},
		{"rule at a priority not owned", Desired{Own: own, Rules: []Rule{with(rule4, func(r *Rule) { r.Priority = 901 })}}, "priority 901 is not owned"},
		{"rule at a priority owned in the other family", Desired{Own: own4, Rules: []Rule{rule6}}, "priority 900 is not owned"},
		{"rule with the kernel's state", Desired{Own: own, Rules: []Rule{with(rule4, func(r *Rule) { r.State = 0x4 })}}, "state flags"},
		{"rules the kernel cannot hold together", Desired{Own: own, Rules: []Rule{rule4, with(rule4, func(r *Rule) { r.Invert = false })}}, "holds only one"},
		{"destination not masked", Desired{Own: own, Routes: []Route{with(tr, func(r *Route) { r.Dst = netip.MustParsePrefix("10.0.0.5/16") })}}, "not a masked"},
		{"destination of the other family", Desired{Own: own, Routes: []Route{with(tr, func(r *Route) { r.Dst = tr6.Dst })}}, "not a masked"},
		{"no family", Desired{Own: own, Routes: []Route{with(tr, func(r *Route) { r.Family = 0 })}}, "family"},
		{"two routes, one key", Desired{Own: own, Routes: []Route{tr, with(tr, func(r *Route) { r.MTU = 1420 })}}, "one key"},
		{"repair in an owned table", Desired{Own: own, Repairs: []Route{tr}}, "is owned"},
		{"two repairs, one key", Desired{Own: own, Repairs: []Route{mainRoute, with(mainRoute, func(r *Route) { r.MTU = 1 })}}, "one key"},
		{"owned table without a family", Desired{Own: Owned{Tables: []OwnedTable{{0, 900}}}}, "family"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			state := Snapshot{Routes: []Route{tr, mainRoute}, Rules: []Rule{rule4}}
			ops, err := Plan(state.View(), tt.d)
			if err == nil || ops != nil {
				t.Fatalf("Plan = %v, %v; want an error", ops, err)
			}
			if !strings.HasPrefix(err.Error(), "netwatch: plan: ") || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q, want \"netwatch: plan: …%s…\"", err, tt.want)
			}
		})
	}
}

// TestPlanRuleModel pins the model to what the kernel was seen to do
// (kernel 6.18, iproute2 6.1, in a network namespace).
func TestPlanRuleModel(t *testing.T) {
	fw := with(rule4, func(r *Rule) { r.Invert = false })
	lookup := Rule{Family: IPv4, Priority: 900, Table: 900, Action: ActionToTable, Protocol: 109}
	// ip rule add fwmark 0xe00/0xf00 lookup 900 pref 900 proto 109
	// ip rule add not fwmark 0xe00/0xf00 lookup 900 pref 900 proto 109
	//   → RTNETLINK answers: File exists
	if !ruleAddCollides(rule4, fw) {
		t.Error("adding the rule with not while the one without exists: want EEXIST")
	}
	// ip rule add pref 900 lookup 900 proto 109 → added
	if ruleAddCollides(lookup, fw) {
		t.Error("adding a rule that names less: want it added")
	}
	// ip rule del pref 900 lookup 900 proto 109 → deleted the fwmark rule,
	// the first one at the priority
	if !ruleDeleteHits(lookup, fw) {
		t.Error("deleting a rule that names less: want it to match the first rule that has more")
	}
	if ruleDeleteHits(fw, lookup) {
		t.Error("deleting a rule with a mark: want it not to match a rule without")
	}
	if !ruleDeleteHits(rule4, fw) || !ruleDeleteHits(fw, rule4) {
		t.Error("deletes ignore not")
	}
}

// TestPlanRouteModel pins the route model: ip route del 10.9.0.0/24
// table 900 proto 109 removed the first of two appended routes.
func TestPlanRouteModel(t *testing.T) {
	first := with(tr, func(r *Route) { r.Dst = netip.MustParsePrefix("10.9.0.0/24"); r.PrefSrc = netip.Addr{} })
	second := with(first, func(r *Route) { r.Gateway, r.MTU = netip.MustParseAddr("10.0.0.2"), 0 })
	del := Route{Family: IPv4, Table: 900, Dst: first.Dst, Protocol: 109}
	got := simulateRoutes([]Route{first, second}, []Op{routeDel(del)})
	if diff := cmp.Diff([]Route{second}, got, cmpNet); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	// The delete of a route removes it even though Apply sends no MTU.
	got = simulateRoutes([]Route{first, second}, []Op{routeDel(second)})
	if diff := cmp.Diff([]Route{first}, got, cmpNet); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

// TestPlanScope checks over random states that Plan touches nothing outside
// the owned scope except the repairs it was given, and that it is
// deterministic.
func TestPlanScope(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		tables := []Table{900, 901, TableMain, 200, 2004}
		prios := []uint32{900, 901, 1, 100, 32766}
		ownT := OwnedTable{rapid.SampledFrom([]Family{IPv4, IPv6}).Draw(t, "ownFamily"), 900}
		ownP := OwnedPriority{rapid.SampledFrom([]Family{IPv4, IPv6}).Draw(t, "ownPrioFamily"), 900}
		d := Desired{Own: Owned{Tables: []OwnedTable{ownT}, Priorities: []OwnedPriority{ownP}}}

		genRoute := func(t *rapid.T, label string, table Table, fam Family) Route {
			r := Route{Family: fam, Table: table, Type: RouteUnicast, Index: rapid.Uint32Range(1, 3).Draw(t, label+"Index")}
			n := rapid.IntRange(0, 3).Draw(t, label+"Net")
			if fam == IPv4 {
				r.Dst = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(n), 0, 0}), rapid.SampledFrom([]int{16, 24}).Draw(t, label+"Bits")).Masked()
			} else {
				r.Dst = netip.PrefixFrom(netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, byte(n)}), 64)
				r.Metric = 1024
			}
			r.MTU = rapid.SampledFrom([]uint32{0, 1355, 1450}).Draw(t, label+"MTU")
			r.Protocol = rapid.SampledFrom([]Protocol{0, 109, ProtoKernel}).Draw(t, label+"Proto")
			r.Flags = rapid.SampledFrom([]RouteFlags{0, RouteLinkdown, RouteOnlink}).Draw(t, label+"Flags")
			return r
		}
		genRule := func(t *rapid.T, label string, prio uint32, fam Family) Rule {
			r := Rule{
				Family: fam, Priority: prio,
				Table:    rapid.SampledFrom([]Table{0, 900, 901}).Draw(t, label+"Table"),
				Action:   rapid.SampledFrom([]RuleAction{ActionToTable, ActionUnspec}).Draw(t, label+"Action"),
				Invert:   rapid.Bool().Draw(t, label+"Invert"),
				Mark:     rapid.SampledFrom([]Mark{0, 0xe00, 0x1e00}).Draw(t, label+"Mark"),
				Mask:     rapid.SampledFrom([]Mark{0, 0xf00}).Draw(t, label+"Mask"),
				Protocol: rapid.SampledFrom([]Protocol{0, 109}).Draw(t, label+"Proto"),
			}
			if rapid.Bool().Draw(t, label+"Attrs") {
				r.Attrs = Attrs(appendAttr(nil, 25, []byte{0x2e})) // FRA_DSCP, which the model does not know
			}
			return r
		}
		var s Snapshot
		for i := range rapid.IntRange(0, 12).Draw(t, "routes") {
			label := "route" + string(rune('a'+i))
			table := rapid.SampledFrom(tables).Draw(t, label+"Table")
			s.Routes = append(s.Routes, genRoute(t, label, table, rapid.SampledFrom([]Family{IPv4, IPv6}).Draw(t, label+"Family")))
		}
		for i := range rapid.IntRange(0, 8).Draw(t, "rules") {
			label := "rule" + string(rune('a'+i))
			s.Rules = append(s.Rules, genRule(t, label, rapid.SampledFrom(prios).Draw(t, label+"Prio"), rapid.SampledFrom([]Family{IPv4, IPv6}).Draw(t, label+"Family")))
		}
		slices.SortStableFunc(s.Rules, func(a, b Rule) int { return int(a.Priority) - int(b.Priority) })
		keys := make(map[RouteKey]bool)
		for i := range rapid.IntRange(0, 4).Draw(t, "desiredRoutes") {
			r := genRoute(t, "want"+string(rune('a'+i)), 900, ownT.Family)
			r.Flags &^= KernelRouteFlags
			if !keys[r.Key()] {
				keys[r.Key()] = true
				d.Routes = append(d.Routes, r)
			}
		}
		if rapid.Bool().Draw(t, "wantRule") {
			w := genRule(t, "wantRule", 900, ownP.Family)
			d.Rules = append(d.Rules, w)
		}
		for _, r := range s.Routes {
			if r.Table == TableMain && rapid.Bool().Draw(t, "repair") && !keys[r.Key()] {
				keys[r.Key()] = true
				d.Repairs = append(d.Repairs, with(r, func(r *Route) { r.MTU = 1450 }))
			}
		}

		ops, err := Plan(s.View(), d)
		if err != nil {
			t.Fatalf("Plan: %v", err)
		}
		for _, op := range ops {
			switch {
			case op.Kind == RuleAdd || op.Kind == RuleDelete:
				if (OwnedPriority{op.Rule.Family, op.Rule.Priority}) != ownP {
					t.Fatalf("%v of rule %v outside the owned priority", op.Kind, op.Rule)
				}
			case op.Repair:
				if op.Kind != RouteReplace || !slices.ContainsFunc(d.Repairs, func(r Route) bool { return r.Key() == op.Route.Key() }) {
					t.Fatalf("repair %v of %v not asked for", op.Kind, op.Route)
				}
			default:
				if (OwnedTable{op.Route.Family, op.Route.Table}) != ownT {
					t.Fatalf("%v of route %v outside the owned table", op.Kind, op.Route)
				}
			}
		}
		again, err := Plan(s.View(), d)
		if err != nil {
			t.Fatalf("Plan again: %v", err)
		}
		if diff := cmp.Diff(ops, again, cmpNet); diff != "" {
			t.Fatalf("Plan is not deterministic (-first +second):\n%s", diff)
		}
	})
}

// TestOwn: Own is table and priority in both families, without the zero
// ones.
func TestOwn(t *testing.T) {
	want := Owned{
		Tables:     []OwnedTable{{IPv4, 900}, {IPv6, 900}},
		Priorities: []OwnedPriority{{IPv4, 900}, {IPv6, 900}},
	}
	if got := Own(900, 900); !cmp.Equal(got, want) {
		t.Errorf("Own(900, 900) = %+v, want %+v", got, want)
	}
	if got := Own(0, 900); got.Tables != nil || len(got.Priorities) != 2 {
		t.Errorf("Own(0, 900) = %+v, want two priorities and no table", got)
	}
	if got := Own(900, 0); got.Priorities != nil || len(got.Tables) != 2 {
		t.Errorf("Own(900, 0) = %+v, want two tables and no priority", got)
	}
}

// TestPlanIPv6MetricZero: a desired IPv6 route with metric 0 is the
// kernel's route with metric 1024: nothing to do when it is there, a
// replace at 1024 when it is not, one route with one at 1024.
func TestPlanIPv6MetricZero(t *testing.T) {
	zero := with(tr6, func(r *Route) { r.Metric = 0 })
	ops, err := Plan(Snapshot{Routes: []Route{tr6}}.View(), Desired{Own: own, Routes: []Route{zero}})
	if err != nil || len(ops) != 0 {
		t.Errorf("Plan with the route at 1024 = %v, %v; want nothing", ops, err)
	}
	ops, err = Plan(Snapshot{}.View(), Desired{Own: own, Routes: []Route{zero}})
	if err != nil || !cmp.Equal(ops, []Op{replace(tr6)}, cmpNet) {
		t.Errorf("Plan on an empty table = %v, %v; want %v", ops, err, []Op{replace(tr6)})
	}
	// IPv4's metric 0 is its own.
	tr0 := with(tr, func(r *Route) { r.Metric = 0 })
	ops, err = Plan(Snapshot{}.View(), Desired{Own: own, Routes: []Route{tr0}})
	if err != nil || !cmp.Equal(ops, []Op{replace(tr0)}, cmpNet) {
		t.Errorf("Plan of an IPv4 route at metric 0 = %v, %v; want it at 0", ops, err)
	}
	// Both in one Desired are one route.
	ops, err = Plan(Snapshot{}.View(), Desired{Own: own, Routes: []Route{zero, tr6}})
	if err != nil || len(ops) != 1 {
		t.Errorf("Plan of metric 0 and 1024 = %v, %v; want one replace", ops, err)
	}
}

// TestPlanErrorNamesLinks: a PlanError names routes by their links'
// names, as the log lines do.
func TestPlanErrorNamesLinks(t *testing.T) {
	s := Snapshot{Links: []Link{{Index: 2, Name: "enp7s0", MTU: 1450, Flags: LinkUp}}}
	_, err := Plan(s.View(), Desired{Own: own, Routes: []Route{with(tr, func(r *Route) { r.Table = 901 })}})
	var pe *PlanError
	if !errors.As(err, &pe) {
		t.Fatalf("Plan: %v, want a *PlanError", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "dev enp7s0") || strings.Contains(msg, "dev#") {
		t.Errorf("error %q, want the link named enp7s0", msg)
	}
}
