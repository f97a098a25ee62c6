package reconcile

import (
	"slices"

	"github.com/marksplit/marksplit/netwatch"
)

// A plan is made a chunk at a time, so that a pass over a full table holds
// a chunk of operations, never all of them: the planner keeps a cursor
// through Plan's order (the replaces, the rule adds, the repairs, the rule
// deletes, the route deletes) and next plans from where it stopped, from
// the view it is given. Plan is next without a limit, on one view; the
// Reconciler applies each chunk and reads the view again for the next, so
// each chunk is planned from what the kernel holds after the ones before.

// Plan's phases, in the order their operations run.
const (
	phaseReplaces = iota
	phaseRuleAdds
	phaseRepairs
	phaseRuleDels
	phaseRouteDels
	phaseDone
)

// cursor is where a planner is in Plan's order.
type cursor struct {
	phase int
	at    int // the next index within the phase's list
	// ruleAdds and ruleDels are planned on entering phaseRuleAdds.
	ruleAdds, ruleDels []opGroup
	// dels are the keys with routes to delete, sorted: the desired keys
	// with extra routes (found by the replaces) and, on entering
	// phaseRouteDels, the keys of owned tables that nothing desires.
	dels []netwatch.RouteKey
}

// done reports whether the planner has planned everything.
func (p *planner) done() bool { return p.phase == phaseDone }

// next plans the next operations from v: all that are left when limit is
// 0, else at least one and no more than limit unless one key's or one
// priority's group is longer (a group is never split: its operations must
// run together). It returns none once done.
func (p *planner) next(v netwatch.View, limit int) []netwatch.Op {
	var ops []netwatch.Op
	full := func() bool { return limit > 0 && len(ops) >= limit }
	for !p.done() && !full() {
		switch p.phase {
		case phaseReplaces:
			for n := p.want.Len(); p.at < n && !full(); p.at++ {
				want := p.want.At(p.at)
				g, dels := planKey(p.routes(v, want.Key()), want)
				ops = append(ops, g...)
				if dels {
					p.dels = append(p.dels, want.Key())
				}
			}
		case phaseRuleAdds:
			p.planRules(v)
			for _, g := range p.ruleAdds {
				ops = append(ops, g.ops...)
			}
		case phaseRepairs:
			for ; p.at < len(p.repairs) && !full(); p.at++ {
				if op, ok := planRepair(v, p.d.Repairs[p.repairs[p.at]]); ok {
					ops = append(ops, op)
				}
			}
		case phaseRuleDels:
			for _, g := range p.ruleDels {
				ops = append(ops, g.ops...)
			}
		case phaseRouteDels:
			if p.at == 0 {
				p.extras(v)
			}
			for ; p.at < len(p.dels) && !full(); p.at++ {
				ops = append(ops, p.routeDels(v, p.dels[p.at])...)
			}
		}
		if p.phaseEnded() {
			p.phase, p.at = p.phase+1, 0
		}
	}
	return ops
}

// phaseEnded reports whether the cursor is at the end of its phase.
func (p *planner) phaseEnded() bool {
	switch p.phase {
	case phaseReplaces:
		return p.at == p.want.Len()
	case phaseRepairs:
		return p.at == len(p.repairs)
	case phaseRouteDels:
		return p.at == len(p.dels)
	}
	return true // the rule phases run whole
}

// extras adds to p.dels the keys of the owned tables that no desired route
// has, and sorts them: the route deletes run by key. Only those keys are
// collected, not every key of a table: none, once converged.
func (p *planner) extras(v netwatch.View) {
	for t := range p.tables {
		var last netwatch.RouteKey
		first := true
		for r := range v.Routes(t.Family, t.Table) {
			if k := r.Key(); first || k != last {
				first, last = false, k
				if !p.desired(k) {
					p.dels = append(p.dels, k)
				}
			}
		}
	}
	slices.SortFunc(p.dels, netwatch.RouteKey.Compare)
	p.dels = slices.Compact(p.dels)
}

// routes returns the kernel's routes with key k, the first first, in a
// buffer the next call reuses: a pass over 200,000 desired routes then
// allocates none for them (BenchmarkPlan200k).
func (p *planner) routes(v netwatch.View, k netwatch.RouteKey) []netwatch.Route {
	p.cur = slices.AppendSeq(p.cur[:0], v.Route(k))
	return p.cur
}

// routeDels are the deletes of key k's routes: every one when no route is
// desired there, else the extras beside the one kept. Deleting in kernel
// order removes the first route with the key each time: the one named.
func (p *planner) routeDels(v netwatch.View, k netwatch.RouteKey) []netwatch.Op {
	cur := p.routes(v, k)
	if want, ok := p.want.Get(k); ok {
		return keyDels(cur, want)
	}
	ops := make([]netwatch.Op, 0, len(cur))
	for _, r := range cur {
		ops = append(ops, netwatch.Op{Kind: netwatch.RouteDelete, Route: r})
	}
	return ops
}

// desired reports whether a desired route has key k.
func (p *planner) desired(k netwatch.RouteKey) bool {
	_, ok := p.want.Get(k)
	return ok
}

// desiredKey is the key of r as the kernel holds it: an IPv6 route's
// metric 0 is 1024 (netwatch.Route.Clean).
func desiredKey(r *netwatch.Route) netwatch.RouteKey {
	k := r.Key()
	if k.Family == netwatch.IPv6 && k.Metric == 0 {
		k.Metric = 1024
	}
	return k
}

// keyClash is two routes with one key that are not the same route.
type keyClash struct{ a, b netwatch.Route }

// indexByKey returns the indexes of rs sorted by order of their keys, the
// last given of each key. Two routes with one key must match; the first
// pair in rs's order that does not is the error, both Clean.
func indexByKey(rs []netwatch.Route, order func(a, b netwatch.RouteKey) int) ([]int32, *keyClash) {
	idx := make([]int32, len(rs))
	for i := range idx {
		idx[i] = int32(i)
	}
	slices.SortStableFunc(idx, func(i, j int32) int { return order(desiredKey(&rs[i]), desiredKey(&rs[j])) })
	clash := -1    // the index in rs of the first route that clashes with the one before it
	out := idx[:0] // written behind the reads
	prev := int32(-1)
	for _, i := range idx {
		if prev >= 0 && order(desiredKey(&rs[prev]), desiredKey(&rs[i])) == 0 {
			if !rs[prev].Matches(rs[i]) && (clash < 0 || int(i) < clash) {
				clash = int(i)
			}
			out[len(out)-1] = i // the last given stands
		} else {
			out = append(out, i)
		}
		prev = i
	}
	if clash >= 0 {
		// The route given before it with its key.
		k, prev := desiredKey(&rs[clash]), -1
		for i := range clash {
			if order(desiredKey(&rs[i]), k) == 0 {
				prev = i
			}
		}
		return nil, &keyClash{rs[prev].Clean(), rs[clash].Clean()}
	}
	return slices.Clip(out), nil
}
