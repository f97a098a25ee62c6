package reconcile

import (
	"github.com/marksplit/marksplit/netwatch"

	"cmp"
	"errors"
	"fmt"
	"slices"
)

// ErrNotSynced is the error of Plan for a view that is not synced. A failed
// or partial listing is never read as "nothing there": nothing is planned,
// so nothing is removed.
var ErrNotSynced = errors.New("view not synced")

// PlanError is Plan's error for a Desired it rejects: an owned table or
// priority that belongs to the kernel, a route outside the owned tables,
// two routes with one key, a route without what the kernel needs. It
// is a bug in the policy that no retry mends: the Reconciler logs it once
// and waits for the next change instead of retrying.
type PlanError struct {
	Err error
}

func (e *PlanError) Error() string { return "reconcile: plan: " + e.Err.Error() }
func (e *PlanError) Unwrap() error { return e.Err }

// Plan returns the operations that take the kernel from v to d. It is pure:
// no I/O, no clock, no logging.
//
// It fails, planning nothing, when v is not synced (ErrNotSynced) and when
// d is inconsistent: a desired route outside the owned tables of its family,
// a desired rule outside the owned priorities of its family, a repair inside
// them, two different routes with one key, or two rules the kernel cannot
// hold side by side.
//
// Routes. A desired route whose key holds an equal route (ignoring
// the flags only the kernel sets) needs nothing; otherwise it is a RouteReplace, with Was
// set to the route it replaces. Every other route in an owned table is a
// RouteDelete: the routes whose key is not desired, and the extra routes
// appended to a desired key.
//
// Rules. At each owned priority, each desired rule is kept once if an equal
// rule exists and added otherwise; every other rule there is deleted, one
// RuleDelete per instance: other marks, rules without "not", other tables,
// rules with undecoded attributes, and the duplicates of a desired rule.
//
// Repairs. A repair whose key holds a route that differs is a RouteReplace
// with Repair set; a repair whose key is empty is nothing.
//
// Order: make before break. First the desired routes (the table is complete
// before the rule sends traffic to it; more specific prefixes first, so a
// covering route never catches, even briefly, traffic that a more specific
// route or throw is about to claim); then the rule adds; then the repairs
// (a foreign route changes only once the owned routes and rule that take
// over from it are in place); then the rule deletes; then the route deletes.
// Rule deletes precede route deletes so that a table is never consulted
// while it is half emptied: a lookup in an empty table falls through to the
// next rule, which is harmless, but a partly emptied one still answers for
// the destinations it has left, with a covering route where a more specific
// route or throw has already gone. Removing the rule first takes the whole
// table out of the path at once. Within each group the order is by family,
// then table or priority, then key (routes) or kernel order (rules).
//
// Plan models what the kernel does with Apply's requests (rules added with
// NLM_F_EXCL, deleted with every attribute they have; routes replaced and
// deleted by key and attributes, scope and MTU as wildcards) and picks
// an order under which one pass converges. The kernel's rule lookups
// ignore "not": an exclusive add of "not fwmark M lookup T" fails with
// EEXIST while "fwmark M lookup T" exists. And a delete removes the first
// rule that agrees with every attribute the request sets, so deleting a
// stray "lookup T" removes the first rule at that priority that looks up T,
// which may be the desired one. Where that would happen, Plan deletes the
// conflicting strays before the adds, or, when a stray would shadow a kept
// rule, deletes every rule at that priority in kernel order and adds the
// desired ones again; those deletes then come with the rule adds. Extra
// routes appended to a desired key are handled the same way. Rules at one
// priority are added in the order given; Plan does not reorder rules the
// kernel already holds.
func Plan(v netwatch.View, d Desired) ([]netwatch.Op, error) {
	p, err := newPlan(v, d)
	if err != nil {
		return nil, err
	}
	return p.next(v, 0), nil
}

// newPlan checks v and d and returns the planner that yields Plan's
// operations, all at once or a chunk at a time (plan_chunks.go).
func newPlan(v netwatch.View, d Desired) (*planner, error) {
	if !v.Synced() {
		return nil, fmt.Errorf("reconcile: plan: %w", ErrNotSynced)
	}
	p, err := newPlanner(v, d)
	if err != nil {
		return nil, &PlanError{err}
	}
	if err := p.checkCached(v); err != nil {
		return nil, &PlanError{err}
	}
	return p, nil
}

// planner holds what Plan needs of a Desired between chunks: the owned
// scope as sets, and the desired routes and repairs as indexes into d,
// sorted, one per key (plan_chunks.go). It copies no route: a pass over a
// full table costs four bytes a desired route here, not a map of them.
type planner struct {
	tables map[ownedTable]bool
	prios  map[ownedPriority]bool
	d      Desired
	// want holds the desired routes (d.Routes, never nil), Clean, in the
	// order their replaces run; repairs are the indexes of d.Repairs by
	// key.
	want    *netwatch.RouteSet
	repairs []int32
	rules   map[ownedPriority][]netwatch.Rule // deduplicated, in the order given
	// cur holds the kernel's routes of the key being planned (routes).
	cur []netwatch.Route

	cursor
}

// opGroup is the operations for one route key or one rule priority, in
// the order they must run.
type opGroup struct {
	prio ownedPriority // rule groups
	ops  []netwatch.Op
}

// newPlanner checks d and indexes it: the owned scope as sets, the
// desired routes and repairs by key, the desired rules by priority. Its
// errors are a bug in the policy, named as the log lines name things.
func newPlanner(v netwatch.View, d Desired) (*planner, error) {
	p := &planner{
		tables: make(map[ownedTable]bool),
		prios:  make(map[ownedPriority]bool),
		d:      d,
		rules:  make(map[ownedPriority][]netwatch.Rule),
	}
	if err := p.own(d.Own); err != nil {
		return nil, err
	}
	if err := p.wantRoutes(v, d.Routes); err != nil {
		return nil, err
	}
	if err := p.wantRules(d.Rules); err != nil {
		return nil, err
	}
	if err := p.wantRepairs(v, d.Repairs); err != nil {
		return nil, err
	}
	return p, nil
}

// own records the owned tables and priorities, each of a known family.
func (p *planner) own(owned Owned) error {
	for _, t := range owned.tables {
		if err := checkFamily(t.Family); err != nil {
			return fmt.Errorf("owned table %v: %w", t.Table, err)
		}
		if err := OwnTable(t.Table).Check(); err != nil {
			return fmt.Errorf("owned %v %w", t.Family, err)
		}
		p.tables[t] = true
	}
	for _, o := range owned.prios {
		if err := checkFamily(o.Family); err != nil {
			return fmt.Errorf("owned priority %d: %w", o.Priority, err)
		}
		if err := OwnPriority(o.Priority).Check(); err != nil {
			return fmt.Errorf("owned %v %w", o.Family, err)
		}
		p.prios[o] = true
	}
	return nil
}

// wantRoutes takes the desired routes as the policy's set holds them
// (Clean, in the order of the replaces, indexed by key): it only checks
// them. Each must be in an owned table, and a key must hold one route.
func (p *planner) wantRoutes(v netwatch.View, set *netwatch.RouteSet) error {
	if set == nil {
		set = new(netwatch.RouteSet)
	}
	var prev netwatch.Route
	for i, n := 0, set.Len(); i < n; i++ {
		r := set.At(i)
		if err := checkRoute(r); err != nil {
			return fmt.Errorf("%s: %w", planRouteName(v, r), err)
		}
		if !p.tables[ownedTable{r.Family, r.Table}] {
			return fmt.Errorf("%s: table %v is not owned", planRouteName(v, r), r.Table)
		}
		if i > 0 && prev.Key() == r.Key() {
			return fmt.Errorf("%s and %s: one key, two routes", planRouteName(v, prev), planRouteName(v, r))
		}
		prev = r
	}
	p.want = set
	return nil
}

// wantRules records the desired rules by owned priority, each once, in
// the order given. Two that the kernel cannot hold side by side are an
// error: one add would fail on every pass.
func (p *planner) wantRules(rs []netwatch.Rule) error {
	for _, r := range rs {
		o := ownedPriority{r.Family, r.Priority}
		if err := checkFamily(r.Family); err != nil {
			return fmt.Errorf("%s: %w", ruleName(r), err)
		}
		if !p.prios[o] {
			return fmt.Errorf("%s: priority %d is not owned", ruleName(r), r.Priority)
		}
		if r.State != 0 {
			return fmt.Errorf("%s: a desired rule cannot have the kernel's state flags %#x", ruleName(r), r.State)
		}
		if err := checkRule(r); err != nil {
			return fmt.Errorf("%s: %w", ruleName(r), err)
		}
		if slices.ContainsFunc(p.rules[o], r.Equal) {
			continue
		}
		for _, w := range p.rules[o] {
			if ruleAddCollides(r, w) || ruleAddCollides(w, r) {
				return fmt.Errorf("%s and %s: the kernel holds only one of them", ruleName(w), ruleName(r))
			}
		}
		p.rules[o] = append(p.rules[o], r)
	}
	return nil
}

// wantRepairs indexes the repairs by key, as wantRoutes does the desired
// routes, but each outside the owned tables: a repair changes a foreign
// route, and an owned one is the policy's to desire.
func (p *planner) wantRepairs(v netwatch.View, rs []netwatch.Route) error {
	for i := range rs {
		r := &rs[i]
		if err := checkRoute(*r); err != nil {
			return fmt.Errorf("repair of %s: %w", planRouteName(v, *r), err)
		}
		if p.tables[ownedTable{r.Family, r.Table}] {
			return fmt.Errorf("repair of %s: table %v is owned", planRouteName(v, r.Clean()), r.Table)
		}
	}
	idx, err := indexByKey(rs, netwatch.RouteKey.Compare)
	if err != nil {
		return fmt.Errorf("repairs of %s and %s: one key, two routes", planRouteName(v, err.a), planRouteName(v, err.b))
	}
	p.repairs = idx
	return nil
}

// planRouteName names r in a plan error with link names, as the log lines
// do.
func planRouteName(v netwatch.View, r netwatch.Route) string {
	return r.Family.String() + " route " + r.Describe(v.Link)
}

// checkCached refuses to plan for tables the view does not hold: an owned
// table outside Options.RouteTables would look empty, and be filled again
// on every pass.
func (p *planner) checkCached(v netwatch.View) error {
	for t := range p.tables {
		if !v.Cached(t.Table) {
			return fmt.Errorf("owned table %v is not in the cache (the watcher's Options.RouteTables leaves it out)", t.Table)
		}
	}
	for _, i := range p.repairs {
		if r := p.d.Repairs[i]; !v.Cached(r.Table) {
			return fmt.Errorf("repair of %v route %s: table %v is not in the cache (the watcher's Options.RouteTables leaves it out)", r.Family, r.Describe(v.Link), r.Table)
		}
	}
	return nil
}

func checkFamily(f netwatch.Family) error {
	if f != netwatch.IPv4 && f != netwatch.IPv6 {
		return fmt.Errorf("family %v", f)
	}
	return nil
}

func checkRoute(r netwatch.Route) error {
	if err := checkFamily(r.Family); err != nil {
		return err
	}
	is4 := r.Family == netwatch.IPv4
	if !r.Dst.IsValid() || r.Dst != r.Dst.Masked() || r.Dst.Addr().Is4() != is4 {
		return fmt.Errorf("destination is not a masked %v prefix", r.Family)
	}
	switch {
	case is4 && r.Src.IsValid():
		// The kernel's key of an IPv4 route has no source: it ignores
		// one, and two such routes would be one.
		return fmt.Errorf("an IPv4 route has no source prefix (from %v): the kernel ignores it", r.Src)
	case !is4 && r.TOS != 0:
		return fmt.Errorf("an IPv6 route has no TOS (tos %#x): the kernel refuses it", r.TOS)
	}
	if r.Src.IsValid() && (r.Src != r.Src.Masked() || r.Src.Addr().Is4() != is4) {
		return fmt.Errorf("source is not a masked %v prefix", r.Family)
	}
	switch {
	case r.Type == 0:
		// The kernel blames the scope ("Invalid scope"), which misleads.
		return errors.New("its Type is not set (netwatch.RouteUnicast for an ordinary route)")
	case r.Type == netwatch.RouteUnicast && r.Index == 0 && !r.Gateway.IsValid() && len(r.NextHops) == 0 && r.NHID == 0:
		return errors.New("a unicast route needs a next hop: set Index (the output link), Gateway, NextHops or NHID")
	}
	return nil
}

// checkRule refuses a desired rule the kernel would refuse on every pass.
func checkRule(r netwatch.Rule) error {
	switch {
	case r.Action == 0:
		return errors.New("its Action is not set (netwatch.ActionToTable with a Table, for a lookup)")
	case r.Action == netwatch.ActionToTable && r.Table == 0:
		return errors.New("its Action is ActionToTable but its Table is not set")
	}
	return nil
}

// planKey plans a desired key: keep or replace, and delete the extras. It
// returns the operations that run with the replaces, and whether the key
// has extra routes left for the route deletes (routeDels).
func planKey(cur []netwatch.Route, want netwatch.Route) (ops []netwatch.Op, dels bool) {
	want = want.Clean()
	var first []netwatch.Op
	keep, ndel := slices.IndexFunc(cur, func(r netwatch.Route) bool { return want.Matches(r) }), len(cur)-1
	if keep < 0 {
		op := netwatch.Op{Kind: netwatch.RouteReplace, Route: want}
		if len(cur) > 0 {
			op.Was, op.HasWas = cur[0], true
		} else {
			ndel = 0
		}
		first = append(first, op)
	}
	if len(first) == 0 && ndel == 0 {
		return nil, false // the kernel has the desired route alone: the converged case
	}
	if got := simulateRoutes(cur, slices.Concat(first, keyDels(cur, want))); len(got) == 1 && want.Matches(got[0]) {
		return first, ndel > 0
	}
	// An extra route names fewer attributes than the desired route ahead
	// of it, so deleting it would remove the desired one: delete every
	// route with the key in kernel order, then add the desired one.
	for _, r := range cur {
		ops = append(ops, netwatch.Op{Kind: netwatch.RouteDelete, Route: r})
	}
	return append(ops, netwatch.Op{Kind: netwatch.RouteReplace, Route: want}), false
}

// keyDels are the deletes of the routes with a desired key other than the
// one kept: the first that matches want, or else the first, which the
// replace changes into it.
func keyDels(cur []netwatch.Route, want netwatch.Route) []netwatch.Op {
	keep := max(0, slices.IndexFunc(cur, func(r netwatch.Route) bool { return want.Matches(r) }))
	var dels []netwatch.Op
	for j, r := range cur {
		if j != keep {
			dels = append(dels, netwatch.Op{Kind: netwatch.RouteDelete, Route: r})
		}
	}
	return dels
}

// simulateRoutes applies route operations to the routes of one key, the
// way the kernel does: a replace replaces the first route, a delete removes
// the first route that matches what it names.
func simulateRoutes(cur []netwatch.Route, ops []netwatch.Op) []netwatch.Route {
	rs := slices.Clone(cur)
	for _, op := range ops {
		switch op.Kind {
		case netwatch.RouteReplace:
			if len(rs) == 0 {
				rs = append(rs, op.Route)
			} else {
				rs[0] = op.Route
			}
		case netwatch.RouteDelete:
			if i := slices.IndexFunc(rs, func(r netwatch.Route) bool { return routeDeleteHits(op.Route, r) }); i >= 0 {
				rs = slices.Delete(rs, i, i+1)
			}
		}
	}
	return rs
}

// routeDeleteHits reports whether a delete request for del, as Apply sends
// it, may remove r, a route with the same key. The kernel compares only the
// attributes the request sets; Apply sends the scope as the wildcard and no
// metrics, expiry, preference or undecoded attributes. The model errs towards matching: a route it says is hit may in
// fact be spared, never the reverse.
func routeDeleteHits(del, r netwatch.Route) bool {
	switch {
	case del.Key() != r.Key():
		return false
	case del.Type != 0 && del.Type != r.Type:
		return false
	case del.Gateway.IsValid() && del.Gateway != r.Gateway:
		return false
	case del.Index != 0 && del.Index != r.Index:
		return false
	case del.PrefSrc.IsValid() && del.PrefSrc != r.PrefSrc:
		return false
	case del.Protocol != 0 && del.Protocol != r.Protocol:
		return false
	case del.NHID != 0 && del.NHID != r.NHID:
		return false
	case del.Flow != 0 && del.Flow != r.Flow, del.Encap != (netwatch.Encap{}) && del.Encap != r.Encap:
		return false
	case del.NextHops != nil && !slices.Equal(del.Clean().NextHops, r.Clean().NextHops):
		return false
	}
	return true
}

func (p *planner) planRules(v netwatch.View) {
	for o := range p.prios {
		var cur []netwatch.Rule
		for r := range v.Rules(o.Family) {
			if r.Priority == o.Priority {
				cur = append(cur, r)
			}
		}
		p.planPriority(o, cur, p.rules[o])
	}
	byPrio := func(a, b opGroup) int {
		return cmp.Or(cmp.Compare(a.prio.Family, b.prio.Family), cmp.Compare(a.prio.Priority, b.prio.Priority))
	}
	slices.SortFunc(p.ruleAdds, byPrio)
	slices.SortFunc(p.ruleDels, byPrio)
}

// planPriority plans the rules at one owned priority.
func (p *planner) planPriority(o ownedPriority, cur, want []netwatch.Rule) {
	kept := make([]bool, len(cur))
	var missing []netwatch.Rule
	for _, w := range want {
		// The desired rules are pairwise different, so each keeps its
		// own instance: the first one the kernel holds.
		if i := slices.IndexFunc(cur, w.Equal); i >= 0 {
			kept[i] = true
		} else {
			missing = append(missing, w)
		}
	}
	var adds, strays, all, readd []netwatch.Op
	for _, w := range missing {
		adds = append(adds, netwatch.Op{Kind: netwatch.RuleAdd, Rule: w})
	}
	for i, r := range cur {
		del := netwatch.Op{Kind: netwatch.RuleDelete, Rule: r}
		all = append(all, del)
		if !kept[i] {
			strays = append(strays, del)
		}
	}
	if len(adds) == 0 && len(strays) == 0 {
		return
	}
	for _, w := range want {
		readd = append(readd, netwatch.Op{Kind: netwatch.RuleAdd, Rule: w})
	}
	ok := func(ops ...[]netwatch.Op) bool { return rulesAre(simulateRules(cur, slices.Concat(ops...)), want) }
	switch {
	case ok(adds, strays):
		// Make before break: the adds go with the adds, the deletes
		// with the deletes.
		if len(adds) > 0 {
			p.ruleAdds = append(p.ruleAdds, opGroup{prio: o, ops: adds})
		}
		if len(strays) > 0 {
			p.ruleDels = append(p.ruleDels, opGroup{prio: o, ops: strays})
		}
	case ok(strays, adds):
		// A stray makes an add fail with EEXIST: it goes first.
		p.ruleAdds = append(p.ruleAdds, opGroup{prio: o, ops: slices.Concat(strays, adds)})
	default:
		// A stray shadows a kept rule: start the priority afresh.
		p.ruleAdds = append(p.ruleAdds, opGroup{prio: o, ops: slices.Concat(all, readd)})
	}
}

// rulesAre reports whether rs holds each rule of want exactly once and
// nothing else.
func rulesAre(rs, want []netwatch.Rule) bool {
	if len(rs) != len(want) {
		return false
	}
	for _, w := range want {
		if n := len(slices.DeleteFunc(slices.Clone(rs), func(r netwatch.Rule) bool { return !r.Equal(w) })); n != 1 {
			return false
		}
	}
	return true
}

// simulateRules applies rule operations to the rules at one priority, the
// way the kernel does: an exclusive add of a rule that collides is a no-op
// (EEXIST), a new rule goes after the others at its priority, and a delete
// removes the first rule that matches what it names.
func simulateRules(cur []netwatch.Rule, ops []netwatch.Op) []netwatch.Rule {
	rs := slices.Clone(cur)
	for _, op := range ops {
		switch op.Kind {
		case netwatch.RuleAdd:
			if !slices.ContainsFunc(rs, func(r netwatch.Rule) bool { return ruleAddCollides(op.Rule, r) }) {
				rs = append(rs, op.Rule)
			}
		case netwatch.RuleDelete:
			if i := slices.IndexFunc(rs, func(r netwatch.Rule) bool { return ruleDeleteHits(op.Rule, r) }); i >= 0 {
				rs = slices.Delete(rs, i, i+1)
			}
		}
	}
	return rs
}

// ruleDeleteHits reports whether a delete request naming every set
// attribute of del matches r, as the kernel's rule_find decides: an
// attribute the request leaves unset matches anything; "not" (a header
// flag) and the goto target are not compared. A rule's undecoded
// attributes are sent with it; the model takes them as one selector.
func ruleDeleteHits(del, r netwatch.Rule) bool {
	return del.Family == r.Family && del.Priority == r.Priority &&
		(del.Action == 0 || del.Action == r.Action) &&
		(del.Table == 0 || del.Table == r.Table) &&
		(del.IIF == "" || del.IIF == r.IIF) &&
		(del.OIF == "" || del.OIF == r.OIF) &&
		(del.Mark == 0 || del.Mark == r.Mark) &&
		(del.Mask == 0 || del.Mask == r.Mask) &&
		(!del.SuppressIfGroup.Set || del.SuppressIfGroup == r.SuppressIfGroup) &&
		(!del.SuppressPrefixLen.Set || del.SuppressPrefixLen == r.SuppressPrefixLen) &&
		(del.TunID == 0 || del.TunID == r.TunID) &&
		(del.L3MDev == 0 || del.L3MDev == r.L3MDev) &&
		(!del.UID.Set || del.UID == r.UID) &&
		(del.IPProto == 0 || del.IPProto == r.IPProto) &&
		(del.Protocol == 0 || del.Protocol == r.Protocol) &&
		(del.SPort == netwatch.PortRange{} || del.SPort == r.SPort) &&
		(del.DPort == netwatch.PortRange{} || del.DPort == r.DPort) &&
		(del.Attrs == "" || del.Attrs == r.Attrs) &&
		ruleSelectorsMatch(del, r)
}

// ruleAddCollides reports whether an exclusive add of n fails with EEXIST
// because r exists, as the kernel's rule_exists decides: every attribute
// equal except "not" and the goto target, and the selectors (from, to,
// tos, realms) compared only where n sets them.
func ruleAddCollides(n, r netwatch.Rule) bool {
	nm, rm := n.Mask, r.Mask
	if n.Mark != 0 && nm == 0 {
		nm = 0xffffffff // the kernel's default mask for a mark
	}
	if r.Mark != 0 && rm == 0 {
		rm = 0xffffffff
	}
	return n.Family == r.Family && n.Priority == r.Priority && n.Action == r.Action &&
		n.Table == r.Table && n.IIF == r.IIF && n.OIF == r.OIF && n.Mark == r.Mark && nm == rm &&
		n.SuppressIfGroup == r.SuppressIfGroup && n.SuppressPrefixLen == r.SuppressPrefixLen &&
		n.TunID == r.TunID && n.L3MDev == r.L3MDev && n.UID == r.UID && n.IPProto == r.IPProto &&
		n.Protocol == r.Protocol && n.SPort == r.SPort && n.DPort == r.DPort && n.Attrs == r.Attrs &&
		ruleSelectorsMatch(n, r)
}

// ruleSelectorsMatch is the family's compare hook (fib4_rule_compare,
// fib6_rule_compare): source, destination, tos and realms, each compared
// only when the request sets it.
func ruleSelectorsMatch(req, r netwatch.Rule) bool {
	return (!req.Src.IsValid() || req.Src.Bits() == 0 || req.Src == r.Src) &&
		(!req.Dst.IsValid() || req.Dst.Bits() == 0 || req.Dst == r.Dst) &&
		(req.TOS == 0 || req.TOS == r.TOS) &&
		(req.Flow == 0 || req.Flow == r.Flow)
}

// planRepair plans a repair: a replace of the first route with its key,
// unless none or one that matches is there.
func planRepair(v netwatch.View, rep netwatch.Route) (netwatch.Op, bool) {
	rep = rep.Clean()
	cur := slices.Collect(v.Route(rep.Key())) // a repair is rare
	if len(cur) == 0 || slices.ContainsFunc(cur, func(r netwatch.Route) bool { return rep.Matches(r) }) {
		return netwatch.Op{}, false
	}
	return netwatch.Op{Kind: netwatch.RouteReplace, Route: rep, Was: cur[0], HasWas: true, Repair: true}, true
}

// ruleName names r in a plan error as the log lines do: "rule 900 (inet6):
// not fwmark 0xe00/0xf00 lookup 900".
func ruleName(r netwatch.Rule) string {
	return netwatch.Op{Kind: netwatch.RuleAdd, Rule: r}.Describe(nil)
}
