package netwatch_test

import (
	"fmt"
	"net/netip"

	"github.com/marksplit/marksplit/netwatch"
)

// bypass is a policy: while tun0 is up, 10.8.0.0/16 goes through it for
// every packet without the mark 0x80000/0xff0000. It owns table 910 and
// rule priority 910; what it wants is a pure function of the view.
func bypass(v netwatch.View) netwatch.Desired {
	d := netwatch.Desired{Own: netwatch.Owned{
		Tables:     []netwatch.OwnedTable{{Family: netwatch.IPv4, Table: 910}},
		Priorities: []netwatch.OwnedPriority{{Family: netwatch.IPv4, Priority: 910}},
	}}
	tun, ok := v.LinkByName("tun0")
	if !ok || !tun.Up() {
		return d // nothing wanted: Plan removes everything owned
	}
	d.Routes = []netwatch.Route{{Family: netwatch.IPv4, Table: 910, Dst: netip.MustParsePrefix("10.8.0.0/16"),
		Index: tun.Index, Protocol: 241, Scope: netwatch.ScopeLink, Type: netwatch.RouteUnicast}}
	d.Rules = []netwatch.Rule{{Family: netwatch.IPv4, Priority: 910, Table: 910, Action: netwatch.ActionToTable,
		Invert: true, Mark: 0x80000, Mask: 0xff0000, Protocol: 241}}
	return d
}

// A policy maps a View to a Desired state and Plan diffs the two, make
// before break. A program reads the view with Watcher.Read and hands the
// operations to Applier.Apply; here the views are Snapshots.
func Example() {
	tun0 := netwatch.Link{Index: 5, Name: "tun0", Flags: 0x1} // IFF_UP
	stale := netwatch.Route{Family: netwatch.IPv4, Table: 910, Dst: netip.MustParsePrefix("10.9.0.0/16"),
		Index: 5, Protocol: 241, Scope: netwatch.ScopeLink, Type: netwatch.RouteUnicast}
	up := netwatch.Snapshot{Links: []netwatch.Link{tun0}, Routes: []netwatch.Route{stale}}
	done := bypass(up.View())                                         // what the kernel holds after the first plan
	gone := netwatch.Snapshot{Routes: done.Routes, Rules: done.Rules} // then tun0 is deleted
	for _, s := range []netwatch.Snapshot{up, gone} {
		v := s.View()
		ops, err := netwatch.Plan(v, bypass(v))
		if err != nil {
			fmt.Println(err)
			return
		}
		for _, op := range ops {
			if op.Kind == netwatch.RuleAdd || op.Kind == netwatch.RuleDelete {
				fmt.Println(op.Kind, op.Rule)
			} else {
				fmt.Println(op.Kind, op.Route)
			}
		}
	}
	// Output:
	// route-replace 10.8.0.0/16 dev#5 table 910
	// rule-add 910: not fwmark 0x80000/0xff0000 lookup 910 proto 241
	// route-delete 10.9.0.0/16 dev#5 table 910
	// rule-delete 910: not fwmark 0x80000/0xff0000 lookup 910 proto 241
	// route-delete 10.8.0.0/16 dev#5 table 910
}
