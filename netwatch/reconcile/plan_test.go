package reconcile

import (
	"github.com/marksplit/marksplit/netwatch"

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
	cmp.Comparer(func(a, b netwatch.Rule) bool { return a == b }),
}

func with[T any](v T, f func(*T)) T {
	f(&v)
	return v
}

// The fixture: table 900 and priority 900 owned in both families.
var (
	own = Own(900, 900)
	tr  = netwatch.Route{Family: netwatch.IPv4, Table: 900, Dst: netip.MustParsePrefix("10.0.0.0/16"),
		Gateway: netip.MustParseAddr("10.0.0.1"), Index: 2, PrefSrc: netip.MustParseAddr("10.0.0.5"),
		MTU: 1355, Protocol: 109, Type: netwatch.RouteUnicast}
	tr24 = with(tr, func(r *netwatch.Route) { r.Dst = netip.MustParsePrefix("10.0.5.0/24") })
	tr6  = netwatch.Route{Family: netwatch.IPv6, Table: 900, Dst: netip.MustParsePrefix("2001:db8::/64"), Metric: 1024,
		Gateway: netip.MustParseAddr("fe80::1"), Index: 2, PrefSrc: netip.MustParseAddr("2001:db8::5"),
		MTU: 1355, Protocol: 109, Type: netwatch.RouteUnicast}
	mainRoute = with(tr, func(r *netwatch.Route) {
		r.Table, r.PrefSrc, r.Protocol = netwatch.TableMain, netip.Addr{}, netwatch.ProtoDHCP
	})
	rule4 = netwatch.Rule{Family: netwatch.IPv4, Priority: 900, Table: 900, Action: netwatch.ActionToTable, Invert: true,
		Mark: 0xe00, Mask: 0xf00, Protocol: 109}
	rule6 = with(rule4, func(r *netwatch.Rule) { r.Family = netwatch.IPv6 })
)

func replace(r netwatch.Route) netwatch.Op { return netwatch.Op{Kind: netwatch.RouteReplace, Route: r} }
func replaceWas(r, was netwatch.Route) netwatch.Op {
	return netwatch.Op{Kind: netwatch.RouteReplace, Route: r, Was: was, HasWas: true}
}
func routeDel(r netwatch.Route) netwatch.Op { return netwatch.Op{Kind: netwatch.RouteDelete, Route: r} }
func ruleAdd(r netwatch.Rule) netwatch.Op   { return netwatch.Op{Kind: netwatch.RuleAdd, Rule: r} }
func ruleDel(r netwatch.Rule) netwatch.Op   { return netwatch.Op{Kind: netwatch.RuleDelete, Rule: r} }

func TestPlan(t *testing.T) {
	linkdown := with(tr, func(r *netwatch.Route) {
		r.Flags = netwatch.RouteLinkdown | netwatch.RouteDead
	})
	onlink := with(tr, func(r *netwatch.Route) { r.Flags = netwatch.RouteOnlink })
	stale := with(tr, func(r *netwatch.Route) { r.MTU = 1420 })
	otherGW := with(tr, func(r *netwatch.Route) { r.Gateway = netip.MustParseAddr("10.0.0.2") })
	noSrc := with(tr, func(r *netwatch.Route) { r.PrefSrc = netip.Addr{} })
	mark := with(rule4, func(r *netwatch.Rule) { r.Mark = 0x1e00; r.Mask = 0xff00 })
	noNot := with(rule4, func(r *netwatch.Rule) { r.Invert = false })
	otherTable := with(rule4, func(r *netwatch.Rule) { r.Table = 901 })
	bare := netwatch.Rule{Family: netwatch.IPv4, Priority: 900, Table: 900, Action: netwatch.ActionToTable}
	unknown := with(rule4, func(r *netwatch.Rule) { r.Attrs = fraDSCP }) // FRA_DSCP
	repaired := with(mainRoute, func(r *netwatch.Route) { r.MTU = 1450 })
	foreign := []netwatch.Route{
		mainRoute,
		with(tr, func(r *netwatch.Route) { r.Table = 200 }),
		with(tr6, func(r *netwatch.Route) { r.Table = netwatch.TableMain }),
	}
	foreignRules := []netwatch.Rule{
		{Family: netwatch.IPv4, Priority: 0, Table: netwatch.TableLocal, Action: netwatch.ActionToTable},
		with(rule4, func(r *netwatch.Rule) { r.Priority = 100 }),
		with(bare, func(r *netwatch.Rule) { r.Priority = 901 }),
		{Family: netwatch.IPv4, Priority: 32766, Table: netwatch.TableMain, Action: netwatch.ActionToTable},
		with(rule6, func(r *netwatch.Rule) { r.Priority = 20 }),
	}
	tests := []struct {
		name  string
		state netwatch.Snapshot
		d     Desired
		want  []netwatch.Op
	}{
		{name: "nothing owned, nothing wanted", state: netwatch.Snapshot{Routes: foreign, Rules: foreignRules}, d: Desired{}},
		{name: "owned and empty", state: netwatch.Snapshot{Routes: foreign, Rules: foreignRules}, d: Desired{Own: own}},
		{
			name:  "fresh: routes, then rules",
			state: netwatch.Snapshot{Routes: foreign, Rules: foreignRules},
			d:     Desired{Own: own, Routes: new(netwatch.RouteSet).Add(tr6, tr), Rules: []netwatch.Rule{rule6, rule4}},
			want:  []netwatch.Op{replace(tr), replace(tr6), ruleAdd(rule4), ruleAdd(rule6)},
		},
		{
			name:  "converged",
			state: netwatch.Snapshot{Routes: append(slices.Clone(foreign), tr, tr6), Rules: append(slices.Clone(foreignRules), rule4, rule6)},
			d:     Desired{Own: own, Routes: new(netwatch.RouteSet).Add(tr, tr6), Rules: []netwatch.Rule{rule4, rule6}},
		},
		{
			name: "desired duplicates collapse",
			d:    Desired{Own: own, Routes: new(netwatch.RouteSet).Add(tr, tr), Rules: []netwatch.Rule{rule4, rule4}},
			want: []netwatch.Op{replace(tr), ruleAdd(rule4)},
		},
		{
			name:  "flags the kernel sets are no difference",
			state: netwatch.Snapshot{Routes: []netwatch.Route{linkdown}, Rules: []netwatch.Rule{rule4}},
			d:     Desired{Own: own, Routes: new(netwatch.RouteSet).Add(tr), Rules: []netwatch.Rule{rule4}},
		},
		{
			name:  "flags the kernel sets are stripped from what is installed",
			state: netwatch.Snapshot{Rules: []netwatch.Rule{rule4}},
			d:     Desired{Own: own, Routes: new(netwatch.RouteSet).Add(linkdown), Rules: []netwatch.Rule{rule4}},
			want:  []netwatch.Op{replace(tr)},
		},
		{
			name: "next-hop flags the kernel sets are no difference",
			state: netwatch.Snapshot{Routes: []netwatch.Route{with(tr, func(r *netwatch.Route) {
				r.Gateway, r.Index = netip.Addr{}, 0
				r.NextHops = []netwatch.NextHop{{Gateway: netip.MustParseAddr("10.0.0.1"), Index: 2, Weight: 1, Flags: netwatch.RouteLinkdown | netwatch.RouteDead}, {Gateway: netip.MustParseAddr("10.0.0.2"), Index: 3, Weight: 2}}
			})}},
			d: Desired{Own: own, Routes: new(netwatch.RouteSet).Add(with(tr, func(r *netwatch.Route) {
				r.Gateway, r.Index = netip.Addr{}, 0
				r.NextHops = []netwatch.NextHop{{Gateway: netip.MustParseAddr("10.0.0.1"), Index: 2, Weight: 1}, {Gateway: netip.MustParseAddr("10.0.0.2"), Index: 3, Weight: 2}}
			}))},
		},
		{
			name:  "flags a user sets are a difference",
			state: netwatch.Snapshot{Routes: []netwatch.Route{onlink}},
			d:     Desired{Own: own, Routes: new(netwatch.RouteSet).Add(tr)},
			want:  []netwatch.Op{replaceWas(tr, onlink)},
		},
		{
			name:  "stale MTU, gateway and src replaced",
			state: netwatch.Snapshot{Routes: []netwatch.Route{stale, with(otherGW, func(r *netwatch.Route) { r.Dst = tr24.Dst }), with(noSrc, func(r *netwatch.Route) { r.Family, r.Dst, r.Metric = netwatch.IPv6, tr6.Dst, 1024 })}},
			d:     Desired{Own: own, Routes: new(netwatch.RouteSet).Add(tr, tr24, tr6)},
			want: []netwatch.Op{
				replaceWas(tr24, with(otherGW, func(r *netwatch.Route) { r.Dst = tr24.Dst })),
				replaceWas(tr, stale),
				replaceWas(tr6, with(noSrc, func(r *netwatch.Route) { r.Family, r.Dst, r.Metric = netwatch.IPv6, tr6.Dst, 1024 })),
			},
		},
		{
			name:  "undesired routes in owned tables deleted, nothing else",
			state: netwatch.Snapshot{Routes: append(slices.Clone(foreign), tr, tr24, tr6), Rules: foreignRules},
			d:     Desired{Own: own, Routes: new(netwatch.RouteSet).Add(tr)},
			want:  []netwatch.Op{routeDel(tr24), routeDel(tr6)},
		},
		{
			name:  "an extra route appended ahead of the desired one",
			state: netwatch.Snapshot{Routes: []netwatch.Route{otherGW, tr}},
			d:     Desired{Own: own, Routes: new(netwatch.RouteSet).Add(tr)},
			want:  []netwatch.Op{routeDel(otherGW)},
		},
		{
			name:  "an extra route appended behind the desired one",
			state: netwatch.Snapshot{Routes: []netwatch.Route{tr, otherGW}},
			d:     Desired{Own: own, Routes: new(netwatch.RouteSet).Add(tr)},
			want:  []netwatch.Op{routeDel(otherGW)},
		},
		{
			name:  "replace the first route of a key, delete the rest",
			state: netwatch.Snapshot{Routes: []netwatch.Route{stale, otherGW}},
			d:     Desired{Own: own, Routes: new(netwatch.RouteSet).Add(tr)},
			want:  []netwatch.Op{replaceWas(tr, stale), routeDel(otherGW)},
		},
		{
			// Deleting the src-less extra would remove the desired route
			// ahead of it (the delete leaves src unset, a wildcard).
			name:  "an extra route that shadows the desired one: key rebuilt",
			state: netwatch.Snapshot{Routes: []netwatch.Route{tr, noSrc}},
			d:     Desired{Own: own, Routes: new(netwatch.RouteSet).Add(tr)},
			want:  []netwatch.Op{routeDel(tr), routeDel(noSrc), replace(tr)},
		},
		{
			name:  "more specific routes first, covering routes deleted first",
			state: netwatch.Snapshot{Routes: []netwatch.Route{with(tr, func(r *netwatch.Route) { r.Dst = netip.MustParsePrefix("10.0.0.0/8") }), with(tr24, func(r *netwatch.Route) { r.Dst = netip.MustParsePrefix("10.0.0.0/24") })}},
			d:     Desired{Own: own, Routes: new(netwatch.RouteSet).Add(tr, tr24)},
			want: []netwatch.Op{
				replace(tr24), replace(tr),
				routeDel(with(tr, func(r *netwatch.Route) { r.Dst = netip.MustParsePrefix("10.0.0.0/8") })),
				routeDel(with(tr24, func(r *netwatch.Route) { r.Dst = netip.MustParsePrefix("10.0.0.0/24") })),
			},
		},
		{
			name:  "stray rule with another mark: added, then deleted",
			state: netwatch.Snapshot{Routes: []netwatch.Route{tr}, Rules: []netwatch.Rule{mark}},
			d:     Desired{Own: own, Routes: new(netwatch.RouteSet).Add(tr), Rules: []netwatch.Rule{rule4}},
			want:  []netwatch.Op{ruleAdd(rule4), ruleDel(mark)},
		},
		{
			name:  "stray rule with another table: added, then deleted",
			state: netwatch.Snapshot{Routes: []netwatch.Route{tr}, Rules: []netwatch.Rule{otherTable}},
			d:     Desired{Own: own, Routes: new(netwatch.RouteSet).Add(tr), Rules: []netwatch.Rule{rule4}},
			want:  []netwatch.Op{ruleAdd(rule4), ruleDel(otherTable)},
		},
		{
			// The kernel's exclusive add ignores "not": the add would
			// be EEXIST while the stray exists.
			name:  "stray rule without not: deleted before the add",
			state: netwatch.Snapshot{Routes: []netwatch.Route{tr}, Rules: []netwatch.Rule{noNot}},
			d:     Desired{Own: own, Routes: new(netwatch.RouteSet).Add(tr), Rules: []netwatch.Rule{rule4}},
			want:  []netwatch.Op{ruleDel(noNot), ruleAdd(rule4)},
		},
		{
			// Two desired rules: one kept, the other's add would be
			// EEXIST because of a stray; only that stray goes first.
			name:  "two desired rules, one kept, one blocked by a stray",
			state: netwatch.Snapshot{Rules: []netwatch.Rule{rule4, with(rule4, func(r *netwatch.Rule) { r.Mark, r.Invert = 0xd00, false })}},
			d:     Desired{Own: own, Rules: []netwatch.Rule{rule4, with(rule4, func(r *netwatch.Rule) { r.Mark = 0xd00 })}},
			want: []netwatch.Op{
				ruleDel(with(rule4, func(r *netwatch.Rule) { r.Mark, r.Invert = 0xd00, false })),
				ruleAdd(with(rule4, func(r *netwatch.Rule) { r.Mark = 0xd00 })),
			},
		},
		{
			// The kernel compares the attribute (here FRA_DSCP) in an add
			// and a delete: make before break.
			name:  "stray rule with undecoded attributes",
			state: netwatch.Snapshot{Routes: []netwatch.Route{tr}, Rules: []netwatch.Rule{unknown}},
			d:     Desired{Own: own, Routes: new(netwatch.RouteSet).Add(tr), Rules: []netwatch.Rule{rule4}},
			want:  []netwatch.Op{ruleAdd(rule4), ruleDel(unknown)},
		},
		{
			name:  "two identical rules: one deleted",
			state: netwatch.Snapshot{Routes: []netwatch.Route{tr}, Rules: []netwatch.Rule{rule4, rule4}},
			d:     Desired{Own: own, Routes: new(netwatch.RouteSet).Add(tr), Rules: []netwatch.Rule{rule4}},
			want:  []netwatch.Op{ruleDel(rule4)},
		},
		{
			name:  "two identical strays: two deletes",
			state: netwatch.Snapshot{Routes: []netwatch.Route{tr}, Rules: []netwatch.Rule{mark, rule4, mark}},
			d:     Desired{Own: own, Routes: new(netwatch.RouteSet).Add(tr), Rules: []netwatch.Rule{rule4}},
			want:  []netwatch.Op{ruleDel(mark), ruleDel(mark)},
		},
		{
			name:  "a stray that names less, ahead of the kept rule",
			state: netwatch.Snapshot{Routes: []netwatch.Route{tr}, Rules: []netwatch.Rule{bare, rule4}},
			d:     Desired{Own: own, Routes: new(netwatch.RouteSet).Add(tr), Rules: []netwatch.Rule{rule4}},
			want:  []netwatch.Op{ruleDel(bare)},
		},
		{
			// Deleting "lookup 900" would remove the kept rule ahead of
			// it: the priority is rebuilt.
			name:  "a stray that names less, behind the kept rule",
			state: netwatch.Snapshot{Routes: []netwatch.Route{tr}, Rules: []netwatch.Rule{rule4, bare}},
			d:     Desired{Own: own, Routes: new(netwatch.RouteSet).Add(tr), Rules: []netwatch.Rule{rule4}},
			want:  []netwatch.Op{ruleDel(rule4), ruleDel(bare), ruleAdd(rule4)},
		},
		{
			name: "opted out: rules, then routes",
			state: netwatch.Snapshot{Routes: append(slices.Clone(foreign), tr6, tr, tr24),
				Rules: append(slices.Clone(foreignRules), rule4, rule6)},
			d:    Desired{Own: own},
			want: []netwatch.Op{ruleDel(rule4), ruleDel(rule6), routeDel(tr), routeDel(tr24), routeDel(tr6)},
		},
		{
			name:  "repair: the route differs",
			state: netwatch.Snapshot{Routes: []netwatch.Route{mainRoute}},
			d:     Desired{Own: own, Repairs: []netwatch.Route{repaired}},
			want:  []netwatch.Op{{Kind: netwatch.RouteReplace, Route: repaired, Was: mainRoute, HasWas: true, Repair: true}},
		},
		{
			name:  "repair: already so",
			state: netwatch.Snapshot{Routes: []netwatch.Route{with(repaired, func(r *netwatch.Route) { r.Flags = netwatch.RouteLinkdown })}},
			d:     Desired{Own: own, Repairs: []netwatch.Route{repaired}},
		},
		{
			name: "repair: the route is gone",
			d:    Desired{Own: own, Repairs: []netwatch.Route{repaired}},
		},
		{
			name: "everything at once, make before break",
			state: netwatch.Snapshot{
				Routes: []netwatch.Route{mainRoute, tr24, stale},
				Rules:  []netwatch.Rule{mark, rule6},
			},
			d: Desired{Own: own, Routes: new(netwatch.RouteSet).Add(tr, tr6), Rules: []netwatch.Rule{rule4}, Repairs: []netwatch.Route{repaired}},
			want: []netwatch.Op{
				replaceWas(tr, stale), replace(tr6),
				ruleAdd(rule4),
				{Kind: netwatch.RouteReplace, Route: repaired, Was: mainRoute, HasWas: true, Repair: true},
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
			// In chunks, from the same view: the same operations in the
			// same order, each chunk within its limit unless one group
			// (a key's or a priority's operations) is longer.
			for limit := 1; limit <= 3; limit++ {
				p, err := newPlan(tt.state.View(), tt.d)
				if err != nil {
					t.Fatal(err)
				}
				var all []netwatch.Op
				for chunks := 0; !p.done(); chunks++ {
					if chunks > len(tt.want)+5 {
						t.Fatalf("limit %d: still not done after %d chunks", limit, chunks)
					}
					c := p.next(tt.state.View(), limit)
					if len(c) > limit && !oneGroup(c, limit) {
						t.Errorf("limit %d: a chunk of %d operations: %v", limit, len(c), c)
					}
					all = append(all, c...)
				}
				if diff := cmp.Diff(tt.want, all, cmpNet, cmpopts.EquateEmpty()); diff != "" {
					t.Errorf("limit %d: chunks (-want +got):\n%s", limit, diff)
				}
			}
		})
	}
}

// oneGroup reports whether a chunk over its limit was below it before
// its last step: a route key's group (never split), or a rule phase (the
// adds, or the deletes, of every owned priority, which run whole).
func oneGroup(ops []netwatch.Op, limit int) bool {
	last := ops[len(ops)-1]
	n := len(ops)
	for n > 0 {
		op := ops[n-1]
		rule := op.Kind == netwatch.RuleAdd || op.Kind == netwatch.RuleDelete
		lastRule := last.Kind == netwatch.RuleAdd || last.Kind == netwatch.RuleDelete
		if rule != lastRule || !rule && op.Route.Key() != last.Route.Key() {
			break
		}
		n--
	}
	return n < limit
}

func TestPlanNotSynced(t *testing.T) {
	ops, err := Plan(netwatch.View{}, Desired{Own: own})
	if !errors.Is(err, ErrNotSynced) || ops != nil {
		t.Fatalf("Plan(unsynced) = %v, %v; want nil, ErrNotSynced", ops, err)
	}
	if got, want := err.Error(), "reconcile: plan: view not synced"; got != want {
		t.Errorf("error %q, want %q", got, want)
	}
}

func TestPlanInvalid(t *testing.T) {
	own4 := Own(900, 900).Only(netwatch.IPv4)
	tests := []struct {
		name string
		d    Desired
		want string
	}{
		{"route in a table not owned", Desired{Own: own, Routes: new(netwatch.RouteSet).Add(with(tr, func(r *netwatch.Route) { r.Table = 901 }))}, "table 901 is not owned"},
		{"route in a table owned in the other family", Desired{Own: own4, Routes: new(netwatch.RouteSet).Add(tr6)}, "table 900 is not owned"},
		{"rule at a priority not owned", Desired{Own: own, Rules: []netwatch.Rule{with(rule4, func(r *netwatch.Rule) { r.Priority = 901 })}}, "priority 901 is not owned"},
		{"rule at a priority owned in the other family", Desired{Own: own4, Rules: []netwatch.Rule{rule6}}, "priority 900 is not owned"},
		{"rule with the kernel's state", Desired{Own: own, Rules: []netwatch.Rule{with(rule4, func(r *netwatch.Rule) { r.State = 0x4 })}}, "state flags"},
		{"rules the kernel cannot hold together", Desired{Own: own, Rules: []netwatch.Rule{rule4, with(rule4, func(r *netwatch.Rule) { r.Invert = false })}}, "holds only one"},
		{"destination not masked", Desired{Own: own, Routes: new(netwatch.RouteSet).Add(with(tr, func(r *netwatch.Route) { r.Dst = netip.MustParsePrefix("10.0.0.5/16") }))}, "not a masked"},
		{"destination of the other family", Desired{Own: own, Routes: new(netwatch.RouteSet).Add(with(tr, func(r *netwatch.Route) { r.Dst = tr6.Dst }))}, "not a masked"},
		{"no family", Desired{Own: own, Routes: new(netwatch.RouteSet).Add(with(tr, func(r *netwatch.Route) { r.Family = 0 }))}, "family"},
		{"two routes, one key", Desired{Own: own, Routes: new(netwatch.RouteSet).Add(tr, with(tr, func(r *netwatch.Route) { r.MTU = 1420 }))}, "one key"},
		{"two routes, one key, the second IPv6's metric 0", Desired{Own: own, Routes: new(netwatch.RouteSet).Add(with(tr6, func(r *netwatch.Route) { r.Metric = 1024 }), with(tr6, func(r *netwatch.Route) { r.Metric, r.MTU = 0, 1420 }))}, "one key"},
		{"two routes, one key, added apart", Desired{Own: own, Routes: new(netwatch.RouteSet).Add(tr, tr6, with(tr, func(r *netwatch.Route) { r.MTU = 1420 }), tr6)}, "one key"},
		{"IPv4 routes that differ in their source", Desired{Own: own, Routes: new(netwatch.RouteSet).Add(tr, with(tr, func(r *netwatch.Route) { r.Src = netip.MustParsePrefix("10.9.0.0/16") }))}, "no source prefix (from 10.9.0.0/16)"},
		{"IPv6 routes that differ in their TOS", Desired{Own: own, Routes: new(netwatch.RouteSet).Add(tr6, with(tr6, func(r *netwatch.Route) { r.TOS = 4 }))}, "no TOS (tos 0x4)"},
		{"repair in an owned table", Desired{Own: own, Repairs: []netwatch.Route{tr}}, "is owned"},
		{"two repairs, one key", Desired{Own: own, Repairs: []netwatch.Route{mainRoute, with(mainRoute, func(r *netwatch.Route) { r.MTU = 1 })}}, "one key"},
		{"owned table without a family", Desired{Own: Owned{tables: []ownedTable{{0, 900}}}}, "family"},
		{"route without a type", Desired{Own: own, Routes: new(netwatch.RouteSet).Add(with(tr, func(r *netwatch.Route) { r.Type = 0 }))}, "Type is not set (netwatch.RouteUnicast"},
		{"unicast route without a next hop", Desired{Own: own, Routes: new(netwatch.RouteSet).Add(with(tr, func(r *netwatch.Route) { r.Index, r.Gateway = 0, netip.Addr{} }))}, "needs a next hop: set Index"},
		{"repair without a type", Desired{Own: own, Repairs: []netwatch.Route{with(mainRoute, func(r *netwatch.Route) { r.Type = 0 })}}, "Type is not set"},
		{"rule without an action", Desired{Own: own, Rules: []netwatch.Rule{with(rule4, func(r *netwatch.Rule) { r.Action = 0 })}}, "Action is not set"},
		{"lookup rule without a table", Desired{Own: own, Rules: []netwatch.Rule{with(rule4, func(r *netwatch.Rule) { r.Table = 0 })}}, "Table is not set"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			state := netwatch.Snapshot{Routes: []netwatch.Route{tr, mainRoute}, Rules: []netwatch.Rule{rule4}}
			ops, err := Plan(state.View(), tt.d)
			if err == nil || ops != nil {
				t.Fatalf("Plan = %v, %v; want an error", ops, err)
			}
			if !strings.HasPrefix(err.Error(), "reconcile: plan: ") || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q, want \"reconcile: plan: …%s…\"", err, tt.want)
			}
		})
	}
}

// TestPlanRuleModel pins the model to what the kernel was seen to do
// (kernel 6.18, iproute2 6.1, in a network namespace).
func TestPlanRuleModel(t *testing.T) {
	fw := with(rule4, func(r *netwatch.Rule) { r.Invert = false })
	lookup := netwatch.Rule{Family: netwatch.IPv4, Priority: 900, Table: 900, Action: netwatch.ActionToTable, Protocol: 109}
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
	first := with(tr, func(r *netwatch.Route) { r.Dst = netip.MustParsePrefix("10.9.0.0/24"); r.PrefSrc = netip.Addr{} })
	second := with(first, func(r *netwatch.Route) { r.Gateway, r.MTU = netip.MustParseAddr("10.0.0.2"), 0 })
	del := netwatch.Route{Family: netwatch.IPv4, Table: 900, Dst: first.Dst, Protocol: 109}
	got := simulateRoutes([]netwatch.Route{first, second}, []netwatch.Op{routeDel(del)})
	if diff := cmp.Diff([]netwatch.Route{second}, got, cmpNet); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	// The delete of a route removes it even though Apply sends no MTU.
	got = simulateRoutes([]netwatch.Route{first, second}, []netwatch.Op{routeDel(second)})
	if diff := cmp.Diff([]netwatch.Route{first}, got, cmpNet); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

// TestPlanScope checks over random states that Plan touches nothing outside
// the owned scope except the repairs it was given, and that it is
// deterministic.
func TestPlanScope(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		tables := []netwatch.Table{900, 901, netwatch.TableMain, 200, 2004}
		prios := []uint32{900, 901, 1, 100, 32766}
		ownT := ownedTable{rapid.SampledFrom([]netwatch.Family{netwatch.IPv4, netwatch.IPv6}).Draw(t, "ownFamily"), 900}
		ownP := ownedPriority{rapid.SampledFrom([]netwatch.Family{netwatch.IPv4, netwatch.IPv6}).Draw(t, "ownPrioFamily"), 900}
		d := Desired{Own: Owned{tables: []ownedTable{ownT}, prios: []ownedPriority{ownP}}, Routes: new(netwatch.RouteSet)}

		genRoute := func(t *rapid.T, label string, table netwatch.Table, fam netwatch.Family) netwatch.Route {
			r := netwatch.Route{Family: fam, Table: table, Type: netwatch.RouteUnicast, Index: rapid.Uint32Range(1, 3).Draw(t, label+"Index")}
			n := rapid.IntRange(0, 3).Draw(t, label+"Net")
			if fam == netwatch.IPv4 {
				r.Dst = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(n), 0, 0}), rapid.SampledFrom([]int{16, 24}).Draw(t, label+"Bits")).Masked()
			} else {
				r.Dst = netip.PrefixFrom(netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, byte(n)}), 64)
				r.Metric = 1024
			}
			r.MTU = rapid.SampledFrom([]uint32{0, 1355, 1450}).Draw(t, label+"MTU")
			r.Protocol = rapid.SampledFrom([]netwatch.Protocol{0, 109, netwatch.ProtoKernel}).Draw(t, label+"Proto")
			r.Flags = rapid.SampledFrom([]netwatch.RouteFlags{0, netwatch.RouteLinkdown, netwatch.RouteOnlink}).Draw(t, label+"Flags")
			return r
		}
		genRule := func(t *rapid.T, label string, prio uint32, fam netwatch.Family) netwatch.Rule {
			r := netwatch.Rule{
				Family: fam, Priority: prio,
				Table:    rapid.SampledFrom([]netwatch.Table{0, 900, 901}).Draw(t, label+"Table"),
				Action:   rapid.SampledFrom([]netwatch.RuleAction{netwatch.ActionToTable, 0}).Draw(t, label+"Action"),
				Invert:   rapid.Bool().Draw(t, label+"Invert"),
				Mark:     rapid.SampledFrom([]netwatch.Mark{0, 0xe00, 0x1e00}).Draw(t, label+"Mark"),
				Mask:     rapid.SampledFrom([]netwatch.Mark{0, 0xf00}).Draw(t, label+"Mask"),
				Protocol: rapid.SampledFrom([]netwatch.Protocol{0, 109}).Draw(t, label+"Proto"),
			}
			if rapid.Bool().Draw(t, label+"Attrs") {
				r.Attrs = fraDSCP // FRA_DSCP, which the model does not know
			}
			return r
		}
		var s netwatch.Snapshot
		for i := range rapid.IntRange(0, 12).Draw(t, "routes") {
			label := "route" + string(rune('a'+i))
			table := rapid.SampledFrom(tables).Draw(t, label+"Table")
			s.Routes = append(s.Routes, genRoute(t, label, table, rapid.SampledFrom([]netwatch.Family{netwatch.IPv4, netwatch.IPv6}).Draw(t, label+"Family")))
		}
		for i := range rapid.IntRange(0, 8).Draw(t, "rules") {
			label := "rule" + string(rune('a'+i))
			s.Rules = append(s.Rules, genRule(t, label, rapid.SampledFrom(prios).Draw(t, label+"Prio"), rapid.SampledFrom([]netwatch.Family{netwatch.IPv4, netwatch.IPv6}).Draw(t, label+"Family")))
		}
		slices.SortStableFunc(s.Rules, func(a, b netwatch.Rule) int { return int(a.Priority) - int(b.Priority) })
		keys := make(map[netwatch.RouteKey]bool)
		for i := range rapid.IntRange(0, 4).Draw(t, "desiredRoutes") {
			r := genRoute(t, "want"+string(rune('a'+i)), 900, ownT.Family)
			r = r.Clean()
			if !keys[r.Key()] {
				keys[r.Key()] = true
				d.Routes.Add(r)
			}
		}
		if rapid.Bool().Draw(t, "wantRule") {
			w := genRule(t, "wantRule", 900, ownP.Family)
			// A desired rule names its action and table: Plan refuses
			// one the kernel would refuse (TestPlanInvalid).
			w.Action = netwatch.ActionToTable
			if w.Table == 0 {
				w.Table = 900
			}
			d.Rules = append(d.Rules, w)
		}
		for _, r := range s.Routes {
			if r.Table == netwatch.TableMain && rapid.Bool().Draw(t, "repair") && !keys[r.Key()] {
				keys[r.Key()] = true
				d.Repairs = append(d.Repairs, with(r, func(r *netwatch.Route) { r.MTU = 1450 }))
			}
		}

		ops, err := Plan(s.View(), d)
		if err != nil {
			t.Fatalf("Plan: %v", err)
		}
		for _, op := range ops {
			switch {
			case op.Kind == netwatch.RuleAdd || op.Kind == netwatch.RuleDelete:
				if (ownedPriority{op.Rule.Family, op.Rule.Priority}) != ownP {
					t.Fatalf("%v of rule %v outside the owned priority", op.Kind, op.Rule)
				}
			case op.Repair:
				if op.Kind != netwatch.RouteReplace || !slices.ContainsFunc(d.Repairs, func(r netwatch.Route) bool { return r.Key() == op.Route.Key() }) {
					t.Fatalf("repair %v of %v not asked for", op.Kind, op.Route)
				}
			default:
				if (ownedTable{op.Route.Family, op.Route.Table}) != ownT {
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
		tables: []ownedTable{{netwatch.IPv4, 900}, {netwatch.IPv6, 900}},
		prios:  []ownedPriority{{netwatch.IPv4, 900}, {netwatch.IPv6, 900}},
	}
	if got := Own(900, 900); !cmp.Equal(got, want) {
		t.Errorf("Own(900, 900) = %+v, want %+v", got, want)
	}
	if got := Own(0, 900); got.tables != nil || len(got.prios) != 2 {
		t.Errorf("Own(0, 900) = %+v, want two priorities and no table", got)
	}
	if got := Own(900, 0); got.prios != nil || len(got.tables) != 2 {
		t.Errorf("Own(900, 0) = %+v, want two tables and no priority", got)
	}
	want6 := Owned{tables: []ownedTable{{netwatch.IPv6, 900}}, prios: []ownedPriority{{netwatch.IPv6, 900}}}
	if got := Own(900, 900).Only(netwatch.IPv6); !got.Equal(want6) || got.Equal(want) {
		t.Errorf("Own(900, 900).Only(IPv6) = %+v, want %+v", got, want6)
	}
}

// TestPlanIPv6MetricZero: a desired IPv6 route with metric 0 is the
// kernel's route with metric 1024: nothing to do when it is there, a
// replace at 1024 when it is not, one route with one at 1024.
func TestPlanIPv6MetricZero(t *testing.T) {
	zero := with(tr6, func(r *netwatch.Route) { r.Metric = 0 })
	ops, err := Plan(netwatch.Snapshot{Routes: []netwatch.Route{tr6}}.View(), Desired{Own: own, Routes: new(netwatch.RouteSet).Add(zero)})
	if err != nil || len(ops) != 0 {
		t.Errorf("Plan with the route at 1024 = %v, %v; want nothing", ops, err)
	}
	ops, err = Plan(netwatch.Snapshot{}.View(), Desired{Own: own, Routes: new(netwatch.RouteSet).Add(zero)})
	if err != nil || !cmp.Equal(ops, []netwatch.Op{replace(tr6)}, cmpNet) {
		t.Errorf("Plan on an empty table = %v, %v; want %v", ops, err, []netwatch.Op{replace(tr6)})
	}
	// IPv4's metric 0 is its own.
	tr0 := with(tr, func(r *netwatch.Route) { r.Metric = 0 })
	ops, err = Plan(netwatch.Snapshot{}.View(), Desired{Own: own, Routes: new(netwatch.RouteSet).Add(tr0)})
	if err != nil || !cmp.Equal(ops, []netwatch.Op{replace(tr0)}, cmpNet) {
		t.Errorf("Plan of an IPv4 route at metric 0 = %v, %v; want it at 0", ops, err)
	}
	// Both in one Desired are one route.
	ops, err = Plan(netwatch.Snapshot{}.View(), Desired{Own: own, Routes: new(netwatch.RouteSet).Add(zero, tr6)})
	if err != nil || len(ops) != 1 {
		t.Errorf("Plan of metric 0 and 1024 = %v, %v; want one replace", ops, err)
	}
}

// TestPlanErrorNamesLinks: a PlanError names routes by their links'
// names, as the log lines do.
func TestPlanErrorNamesLinks(t *testing.T) {
	s := netwatch.Snapshot{Links: []netwatch.Link{{Index: 2, Name: "enp7s0", MTU: 1450, Flags: netwatch.LinkUp}}}
	_, err := Plan(s.View(), Desired{Own: own, Routes: new(netwatch.RouteSet).Add(with(tr, func(r *netwatch.Route) { r.Table = 901 }))})
	var pe *PlanError
	if !errors.As(err, &pe) {
		t.Fatalf("Plan: %v, want a *PlanError", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "dev enp7s0") || strings.Contains(msg, "dev#") {
		t.Errorf("error %q, want the link named enp7s0", msg)
	}
}

// fraDSCP is an FRA_DSCP attribute (25), which the model does not know, as
// the kernel encodes it.
const fraDSCP = netwatch.Attrs("\x05\x00\x19\x00\x2e\x00\x00\x00")
