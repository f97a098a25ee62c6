package reconcile

import (
	"slices"

	"github.com/marksplit/marksplit/netwatch"
)

// Owned names the objects a caller owns: every route in an owned table and
// every rule at an owned priority, per family. Plan removes what is owned
// and not desired; it never removes anything else. Own builds one; the zero
// Owned owns nothing. Plan checks every table and priority again, so a value
// converted from a raw number (OwnTable(254)) is refused with a PlanError
// before anything is planned.
type Owned struct {
	tables []ownedTable
	prios  []ownedPriority
}

// Own returns the scope most policies own: table and priority, in both
// families. A zero table or priority is left out, for a policy that owns
// only rules or only routes.
func Own(table OwnTable, priority OwnPriority) Owned {
	var o Owned
	for _, f := range []netwatch.Family{netwatch.IPv4, netwatch.IPv6} {
		if table != 0 {
			o.tables = append(o.tables, ownedTable{f, netwatch.Table(table)})
		}
		if priority != 0 {
			o.prios = append(o.prios, ownedPriority{f, uint32(priority)})
		}
	}
	return o
}

// Only returns the part of o in family f.
func (o Owned) Only(f netwatch.Family) Owned {
	var n Owned
	for _, t := range o.tables {
		if t.Family == f {
			n.tables = append(n.tables, t)
		}
	}
	for _, p := range o.prios {
		if p.Family == f {
			n.prios = append(n.prios, p)
		}
	}
	return n
}

// Equal reports whether o and p own the same tables and priorities, in
// the same order (go-cmp uses it to compare Desired states).
func (o Owned) Equal(p Owned) bool {
	return slices.Equal(o.tables, p.tables) && slices.Equal(o.prios, p.prios)
}

// ownedTable is a routing table of one family.
type ownedTable struct {
	Family netwatch.Family
	Table  netwatch.Table
}

// ownedPriority is a rule priority of one family.
type ownedPriority struct {
	Family   netwatch.Family
	Priority uint32
}

// Desired is the state a caller wants.
type Desired struct {
	// Own is the scope the caller owns.
	Own Owned
	// Routes must exist exactly as given; each must be in an owned table.
	// A desired route sets Family, Table, Dst (masked), Type
	// (netwatch.RouteUnicast for an ordinary route) and, for a unicast
	// route, a next hop: Index, Gateway, NextHops or NHID. Everything else
	// is optional and, when set, must be as the kernel reports it: for
	// IPv4, Scope universe for a route via a gateway and link for one
	// without, and no source prefix (the kernel ignores one); for IPv6,
	// Scope always universe, no TOS (the kernel refuses one), and metric 0
	// is taken as the kernel's 1024. A reject route (blackhole,
	// unreachable, prohibit, throw) has no output link, in both families:
	// that the kernel reports IPv6 ones as "dev lo" is its own detail. Plan
	// refuses a route that lacks what the kernel needs with a PlanError
	// naming the field, and two different routes with one key with a
	// PlanError naming both. A route the kernel keeps otherwise than
	// desired is rewritten on every pass; the Reconciler warns of it once,
	// naming the field.
	//
	// A copy of another table's route (one View.Covering found) is best
	// built from the fields it needs, as mtupolicy's are: Dst, its own
	// Table and Protocol, the next hop (Gateway, Index or NextHops), PrefSrc,
	// Scope, Type and the MTU it wants. A whole copy also desires the
	// original's Expires, Metrics and Attrs, which the kernel then must keep
	// too.
	//
	// The set is compact (44 bytes an IPv4 route), so that a policy that
	// desires a route for each route of a full table fits a small memory
	// limit, and Plan reads it in place. Nil desires no route.
	Routes *netwatch.RouteSet
	// Rules must exist exactly once each; each must be at an owned priority.
	// A desired rule sets Family, Priority and Action
	// (netwatch.ActionToTable with a Table, for a lookup).
	Rules []netwatch.Rule
	// Repairs are foreign routes the caller wants changed: the route with
	// the same key is replaced by the one given, if it exists and differs.
	// A repair never creates a route and never removes one.
	Repairs []netwatch.Route
	// Notes say, a line each, why the policy wants less than it could:
	// "link wg0 not found" for a policy that acts on wg0. Plan ignores
	// them; the Reconciler logs each at Warn when it first appears, and
	// again only after a pass without it (a note whose numbers changed,
	// "MTU 1200" become "MTU 1100", is the same note). A note should name what is
	// missing, not the time, so that it stays the same line while it
	// holds.
	Notes []string
}
