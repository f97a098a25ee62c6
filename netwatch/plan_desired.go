package netwatch

import (
	"strconv"
)

// Owned names the objects a caller owns: every route in an owned table and
// every rule at an owned priority, per family. Plan removes what is owned
// and not desired; it never removes anything else.
type Owned struct {
	Tables     []OwnedTable
	Priorities []OwnedPriority
}

// Own returns the scope most policies own: table and priority, in both
// families. A zero table or priority is left out, for a policy that owns
// only rules or only routes.
func Own(table Table, priority uint32) Owned {
	var o Owned
	for _, f := range []Family{IPv4, IPv6} {
		if table != TableUnspec {
			o.Tables = append(o.Tables, OwnedTable{f, table})
		}
		if priority != 0 {
			o.Priorities = append(o.Priorities, OwnedPriority{f, priority})
		}
	}
	return o
}

// OwnedTable is a routing table of one family.
type OwnedTable struct {
	Family Family
	Table  Table
}

// OwnedPriority is a rule priority of one family.
type OwnedPriority struct {
	Family   Family
	Priority uint32
}

// Desired is the state a caller wants.
type Desired struct {
	// Own is the scope the caller owns.
	Own Owned
	// Routes must exist exactly as given; each must be in an owned table.
	Routes []Route
	// Rules must exist exactly once each; each must be at an owned priority.
	Rules []Rule
	// Repairs are foreign routes the caller wants changed: the route with
	// the same key is replaced by the one given, if it exists and differs.
	// A repair never creates a route and never removes one.
	Repairs []Route
	// Notes say, a line each, why the policy wants less than it could:
	// "link wg0 not found" for a policy that acts on wg0. Plan ignores
	// them; the Reconciler logs each at Warn when it first appears, and
	// again only after a pass without it. A note should name what is
	// missing, not the time, so that it stays the same line while it
	// holds.
	Notes []string
}

// OpKind is what an operation does.
type OpKind uint8

// Operations.
const (
	// RouteReplace adds a route or replaces the route with its key.
	RouteReplace OpKind = iota + 1
	// RouteDelete removes a route.
	RouteDelete
	// RuleAdd adds a rule.
	RuleAdd
	// RuleDelete removes one rule that matches every attribute.
	RuleDelete
)

func (k OpKind) String() string {
	switch k {
	case RouteReplace:
		return "route-replace"
	case RouteDelete:
		return "route-delete"
	case RuleAdd:
		return "rule-add"
	case RuleDelete:
		return "rule-delete"
	}
	return "unknown(" + strconv.Itoa(int(k)) + ")"
}

// Op is one kernel change.
type Op struct {
	Kind  OpKind
	Route Route // for RouteReplace and RouteDelete
	Rule  Rule  // for RuleAdd and RuleDelete
	// Was is the route a RouteReplace replaces, when there is one
	// (HasWas): for log lines that say what changed.
	Was    Route
	HasWas bool
	// Repair marks a RouteReplace of a foreign route (Desired.Repairs).
	Repair bool
}

// Family returns the family of the object the operation changes.
func (o Op) Family() Family {
	if o.Kind == RuleAdd || o.Kind == RuleDelete {
		return o.Rule.Family
	}
	return o.Route.Family
}
