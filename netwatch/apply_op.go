package netwatch

import "strconv"

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
	// Repair marks a RouteReplace of a foreign route (reconcile.Desired.Repairs).
	Repair bool
}
