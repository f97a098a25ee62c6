//go:build linux

package netwatch

import (
	"maps"
	"net/netip"
	"slices"
)

// redumps says what the caller must read from the kernel again after
// changes the kernel made without saying so.
type redumps struct {
	routes [2]bool // every route of a family, by fi(f)
	// out are links whose routes of a family (by fi(f)) are to be read
	// again, with a dump the kernel filters by output link: what a link
	// change can have changed, without reading a full table.
	out   [2][]uint32
	rules bool // the rules of both families
	// later are links whose routes of a family (by fi(f)) are read again
	// once more, after recheckDelay: what the kernel changes on a link
	// event in the same notifier chain as the event, after it (see
	// applyLink).
	later [2][]uint32
}

// any reports whether anything is to be read again.
func (r redumps) any() bool {
	return r.routes[0] || r.routes[1] || len(r.out[0]) > 0 || len(r.out[1]) > 0 || r.rules
}

// add marks what o marks too.
func (r *redumps) add(o redumps) {
	for f := range r.routes {
		r.routes[f] = r.routes[f] || o.routes[f]
		for _, i := range o.out[f] {
			r.addOut(f, i)
		}
		for _, i := range o.later[f] {
			if !slices.Contains(r.later[f], i) {
				r.later[f] = append(r.later[f], i)
			}
		}
	}
	r.rules = r.rules || o.rules
}

// addOut marks the routes of family index f out of link index.
func (r *redumps) addOut(f int, index uint32) {
	if !slices.Contains(r.out[f], index) {
		r.out[f] = append(r.out[f], index)
	}
}

// allRoutes is a re-dump of the routes of both families.
var allRoutes = redumps{routes: [2]bool{true, true}}

// apply applies one decoded event to the state and reports what the caller
// must do next: whether the cache changed, and what the kernel may have
// changed without telling (IPv4 routes vanish silently when their link goes
// down or their address goes away; link state changes flip linkdown flags
// and IPv6 route MTUs silently) or what the event leaves ambiguous.
func (s *state) apply(ev *change) (changed bool, redump redumps) {
	switch ev.Kind {
	case KindLink:
		return s.applyLink(ev)
	case KindAddr:
		return s.applyAddr(ev)
	case KindRoute:
		return s.applyRoute(ev)
	case KindRule:
		return s.applyRule(ev)
	}
	return false, redump
}

// applyLink applies a link event; a deleted link takes its addresses out
// of the cache with it. What the kernel changes silently on a link event
// is the routes with a path out of that link: it flushes IPv4's when the
// link goes down or away (and IPv6's when it goes away), marks paths dead
// or linkdown and back, and lowers IPv6 route MTUs with the link's. So a
// deletion, or a change of the flags, MTU or operational state, asks for
// the link's routes again, and only when the cache has some: a link that
// carries none (a pod's veth coming and going) costs no dump at all.
func (s *state) applyLink(ev *change) (changed bool, redump redumps) {
	idx := ev.Link.Index
	old, had := s.links[idx]
	if ev.Deleted {
		if !had {
			return false, redump
		}
		delete(s.links, idx)
		for k := range s.addrs {
			if k.Index == idx {
				delete(s.addrs, k)
			}
		}
		s.redumpOut(&redump, idx)
		return true, redump
	}
	s.links[idx] = ev.Link
	switch {
	case !had:
	case old.Flags != ev.Link.Flags || old.OperState != ev.Link.OperState:
		// The kernel sets and clears the linkdown and dead flags of the
		// link's routes (fib_sync_up/down, rt6_sync_up/down) in the same
		// netdev notifier chain that sends this RTM_NEWLINK, which route
		// dumps no longer wait for (they take no RTNL lock): a re-read now
		// can overtake the change, so the link's routes are read now and
		// once more later.
		s.redumpOut(&redump, idx)
		s.recheckOut(&redump, idx, fi(IPv4), fi(IPv6))
	case old.MTU != ev.Link.MTU:
		// The kernel changes IPv6 routes' MTUs with their link's; an IPv4
		// route keeps its own (checked on 6.18): a program toggling a
		// link's MTU costs no dump of the IPv4 routes through it.
		s.redumpOutFamily(&redump, idx, fi(IPv6))
		s.recheckOut(&redump, idx, fi(IPv6))
	case ev.Link.Flags&LinkLowerUp != 0:
		// Nothing the cache holds changed, but the kernel may have
		// cleared linkdown on the link's routes only now: addrconf does it
		// on the NETDEV_CHANGE that finds the link ready, which can come
		// after the one that brought the carrier (the kernel announces
		// each with the same RTM_NEWLINK), and a carrier that flapped
		// faster than linkwatch reports leaves IPv4's flags to the same
		// event. IPv6 is read now, both families once more later.
		s.redumpOutFamily(&redump, idx, fi(IPv6))
		s.recheckOut(&redump, idx, fi(IPv4), fi(IPv6))
	}
	return !had || old != ev.Link, redump
}

// redumpOut marks, in each family, the routes out of link index for a
// re-dump if the cache has any.
func (s *state) redumpOut(redump *redumps, index uint32) {
	for f := range s.tables {
		s.redumpOutFamily(redump, index, f)
	}
}

// recheckOut marks the routes out of link index of each family (an index
// of s.tables) that the cache has for a re-read after recheckDelay.
func (s *state) recheckOut(redump *redumps, index uint32, families ...int) {
	for _, f := range families {
		if s.linkUsed(f, index) {
			redump.later[f] = append(redump.later[f], index)
		}
	}
}

// redumpOutFamily is redumpOut for one family (an index of s.tables).
func (s *state) redumpOutFamily(redump *redumps, index uint32, f int) {
	if s.linkUsed(f, index) {
		redump.addOut(f, index)
	}
}

// linkUsed reports whether a cached route of family index f leaves by
// link index.
func (s *state) linkUsed(f int, index uint32) bool {
	for _, tb := range s.tables[f] {
		if tb.usesLink(index) {
			return true
		}
	}
	return false
}

// applyAddr applies an address event. Deleting an IPv4 address makes the
// kernel remove, silently, the IPv4 routes that have it as their source
// and, when it was the link's last IPv4 address, every IPv4 route out of
// the link; deleting an IPv6 address clears it from the IPv6 routes that
// have it as their source. Those are asked for again, when the cache has
// any.
func (s *state) applyAddr(ev *change) (changed bool, redump redumps) {
	k := ev.Addr.key()
	old, had := s.addrs[k]
	if ev.Deleted {
		if !had {
			return false, redump
		}
		delete(s.addrs, k)
		a := k.Prefix.Addr()
		f := FamilyOf(a)
		redump.routes[fi(f)] = s.usesPrefSrc(f, a)
		if f == IPv4 && !s.hasAddr(k.Index, IPv4) {
			s.redumpOutFamily(&redump, k.Index, fi(IPv4))
		}
		return true, redump
	}
	s.addrs[k] = ev.Addr
	return !had || old != ev.Addr, redump
}

// hasAddr reports whether link index has an address of family f.
func (s *state) hasAddr(index uint32, f Family) bool {
	for k := range s.addrs {
		if k.Index == index && FamilyOf(k.Prefix.Addr()) == f {
			return true
		}
	}
	return false
}

// applyRule applies a rule event, and always asks for the rules again.
// The kernel changes rules under the RTNL lock but announces them after
// releasing it (since Linux 6.14): the announcements of two programs'
// changes can come in the other order, a deletion before the addition of
// what it deleted. Each rule event is applied for its origin, then the
// rules are dumped again to be sure.
func (s *state) applyRule(ev *change) (changed bool, redump redumps) {
	redump.rules = true
	rs := s.rules[fi(ev.Rule.Family)]
	if ev.Deleted {
		i := slices.IndexFunc(rs, func(r Rule) bool { return sameRule(r, ev.Rule) })
		if i < 0 {
			return false, redump
		}
		s.rules[fi(ev.Rule.Family)] = slices.Delete(rs, i, i+1)
		return true, redump
	}
	if ev.how&howDumped == 0 && slices.ContainsFunc(rs, func(r Rule) bool { return sameRule(r, ev.Rule) }) {
		// The kernel allows identical rules, but this may as well be
		// an event queued during a dump that already showed the rule:
		// only the kernel can tell.
		return false, redump
	}
	// The kernel keeps rules sorted by priority, a new rule after the
	// others of its priority.
	i := slices.IndexFunc(rs, func(r Rule) bool { return r.Priority > ev.Rule.Priority })
	if i < 0 {
		i = len(rs)
	}
	s.rules[fi(ev.Rule.Family)] = slices.Insert(rs, i, ev.Rule)
	return true, redump
}

// addDumped adds a route read from a dump, after any route with its key:
// a dump lists routes sharing a key in kernel order.
func (s *state) addDumped(r Route) {
	tb := s.table(r.Family, r.Table, true)
	if tb.addNew(r) {
		return
	}
	k := r.Key()
	tb.setAll(k, append(tb.getAll(k), r))
}

// usesPrefSrc reports whether a cached route of family f has a as its
// preferred source.
func (s *state) usesPrefSrc(f Family, a netip.Addr) bool {
	for _, tb := range s.tables[fi(f)] {
		found := false
		tb.all(func(r Route) bool {
			found = r.PrefSrc == a
			return !found
		})
		if found {
			return true
		}
	}
	return false
}

// sameRule matches a deleted rule to a cached one.
func sameRule(a, b Rule) bool { return a.Equal(b) }

// sameRoute matches a deleted route to a cached one by what identifies it
// beyond the key: its next hops and type. Flags and metrics may have
// changed silently.
func sameRoute(a, b Route) bool {
	return a.Gateway == b.Gateway && a.Index == b.Index && a.Type == b.Type && a.NHID == b.NHID &&
		len(a.NextHops) == len(b.NextHops)
}

// applyRoute applies a route event to the table of its route; a new route
// creates the table, a deletion that empties one removes it.
func (s *state) applyRoute(ev *change) (changed bool, redump redumps) {
	tb := s.table(ev.Route.Family, ev.Route.Table, !ev.Deleted)
	if tb == nil {
		return false, redump
	}
	if ev.Deleted {
		return s.applyRouteDel(tb, ev)
	}
	return applyRouteNew(tb, ev)
}

// applyRouteDel removes the route of a deletion event from tb, its table.
// Where it cannot tell which of the routes with the key went, it asks for
// the family's routes again instead of guessing.
func (s *state) applyRouteDel(tb *table, ev *change) (changed bool, redump redumps) {
	r := ev.Route
	f := fi(r.Family)
	k := r.Key()
	if first, ok := tb.get(k); ok && !tb.hasDups(k) && (first.Equal(r) || sameRoute(first, r)) {
		// The common case, the one route of its key, without a copy.
		tb.remove(k, first)
		if tb.len() == 0 {
			delete(s.tables[f], r.Table)
		}
		return true, redump
	}
	cur := tb.getAll(k)
	// Routes sharing a key may share a next hop too (ip route
	// prepend of one with other metrics): the equal one first.
	i := slices.IndexFunc(cur, r.Equal)
	if i < 0 {
		i = slices.IndexFunc(cur, func(c Route) bool { return sameRoute(c, r) })
	}
	switch {
	case i >= 0:
	case len(cur) == 0:
		return false, redump
	default:
		// None matches: IPv6 removed one path of a multipath route
		// and announced only that path, or the event was queued
		// during a dump and the cache holds a later route with this
		// key. Guessing deletes the wrong one: ask the kernel.
		redump.routes[f] = true
		return false, redump
	}
	tb.setAll(k, slices.Delete(cur, i, i+1))
	if tb.len() == 0 {
		delete(s.tables[f], r.Table)
	}
	return true, redump
}

// applyRouteNew puts the route of a new-route event into tb, its table,
// where the kernel put it: the event's flags say whether it replaced,
// appended or prepended. Where the cache cannot derive the result, it asks
// for the family's routes again.
func applyRouteNew(tb *table, ev *change) (changed bool, redump redumps) {
	r := ev.Route
	f := fi(r.Family)
	k := r.Key()
	cur := tb.getAll(k)
	switch {
	case len(cur) == 0:
		tb.insert(r)
	case ev.how&howReplace != 0:
		if cur[0].Equal(r) {
			return false, redump
		}
		cur[0] = r
		tb.setAll(k, cur)
	case ev.how&howDumped != 0:
		tb.setAll(k, append(cur, r))
	case ev.how&howExcl != 0:
		// NLM_F_EXCL: the kernel had no route with this key. The cache
		// does, so it is ahead (the event was queued during a dump that
		// showed a later state) or wrong: ask the kernel, which also
		// tells subscribers what went.
		if len(cur) == 1 && cur[0].Equal(r) {
			return false, redump
		}
		redump.routes[f] = true
		return false, redump
	case slices.ContainsFunc(cur, r.Equal):
		return false, redump
	case r.Family == IPv6 && ecmp6(r) && slices.ContainsFunc(cur, ecmp6):
		// IPv6 merges a route with an existing key into a multipath
		// route, and notifies only the new path: the cache cannot
		// derive the result, so it asks the kernel.
		redump.routes[f] = true
		return false, redump
	case r.Family == IPv6:
		// A route that cannot join a multipath route (a pod veth's
		// fe80::/64 beside the others'): the kernel puts it after
		// the routes with its key, whatever the flags say.
		tb.setAll(k, append(cur, r))
	case ev.how&howAppend != 0:
		tb.setAll(k, append(cur, r))
	case ev.how&howPrepend != 0:
		// ip route prepend: a new first route, even beside one with the
		// same next hop (the kernel's match includes metrics and prefsrc).
		tb.setAll(k, append([]Route{r}, cur...))
	default:
		if i := slices.IndexFunc(cur, func(c Route) bool { return sameRoute(c, r) }); i >= 0 {
			// The same route with new attributes (a flag or metric the
			// kernel changed and re-announced).
			cur[i] = r
			tb.setAll(k, cur)
			break
		}
		// ip route prepend: a new first route.
		tb.setAll(k, append([]Route{r}, cur...))
	}
	return true, redump
}

// ecmp6 reports whether the kernel can make IPv6 route r one path of a
// multipath route (rt6_qualify_for_ecmp: a gateway, no nexthop object, not
// from a router advertisement, which the cache cannot tell apart, so RA
// routes count too and cost a re-dump).
func ecmp6(r Route) bool {
	return r.NHID == 0 && (r.Gateway.IsValid() || len(r.NextHops) > 0)
}

// replaceOut replaces the routes of family f with a path out of link index
// by those of next (a dump of them), emitting each difference. Routes of a
// key that go out of other links keep their place, and so do the link's
// routes the dump still lists (a silent change alters a route, never its
// place among those of its key). It changes nothing and reports false when
// a route through several paths is involved, or a cached route cannot be
// matched to one dumped: those the caller reads whole.
func (s *state) replaceOut(f Family, index uint32, next *state, emit func(Event)) bool {
	// The keys under which the cache or the dump has a route out of the link.
	keys := make(map[RouteKey]bool)
	for _, tb := range s.tables[fi(f)] {
		if tb.usesLink(index) {
			tb.all(func(r Route) bool {
				if r.Index == index || slices.ContainsFunc(r.NextHops, func(h NextHop) bool { return h.Index == index }) {
					keys[r.Key()] = true
				}
				return true
			})
		}
	}
	for _, ntb := range next.tables[fi(f)] {
		ntb.all(func(r Route) bool { keys[r.Key()] = true; return true })
	}
	type edit struct {
		k   RouteKey
		rs  []Route
		evs []Event
	}
	var edits []edit
	for _, k := range slices.SortedFunc(maps.Keys(keys), RouteKey.Compare) {
		var cur, dumped []Route
		if tb := s.table(f, k.Table, false); tb != nil {
			cur = tb.getAll(k)
		}
		if ntb := next.table(f, k.Table, false); ntb != nil {
			dumped = ntb.getAll(k)
		}
		rs, evs, ok := mergeOut(cur, dumped, index)
		if !ok {
			return false
		}
		if len(evs) > 0 {
			edits = append(edits, edit{k, rs, evs})
		}
	}
	for _, e := range edits {
		tb := s.table(f, e.k.Table, true)
		tb.setAll(e.k, e.rs)
		if tb.len() == 0 {
			delete(s.tables[fi(f)], e.k.Table)
		}
		for _, ev := range e.evs {
			emit(ev)
		}
	}
	return true
}

// mergeOut returns the routes of one key, cur in the cache, after a dump
// of those out of link index listed dumped: each cached route out of the
// link becomes the dumped one it matches, in its place, or goes; a dumped
// route that matches none comes last. And the events that say so; ok is
// false where a route out of the link has several paths or a match is
// ambiguous.
func mergeOut(cur, dumped []Route, index uint32) (rs []Route, evs []Event, ok bool) {
	outMulti := func(r Route) bool {
		return slices.ContainsFunc(r.NextHops, func(h NextHop) bool { return h.Index == index })
	}
	if slices.ContainsFunc(cur, outMulti) ||
		slices.ContainsFunc(dumped, func(r Route) bool { return r.NextHops != nil || r.Index != index }) {
		return nil, nil, false
	}
	used := make([]bool, len(dumped))
	for _, c := range cur {
		if c.Index != index || c.NextHops != nil {
			rs = append(rs, c)
			continue
		}
		j := -1
		for i, d := range dumped {
			if sameRoute(c, d) {
				if j >= 0 || used[i] {
					return nil, nil, false
				}
				j = i
			}
		}
		if j < 0 {
			evs = append(evs, Event{Deleted: true, Kind: KindRoute, Route: c})
			continue
		}
		used[j] = true
		rs = append(rs, dumped[j])
		if !c.Equal(dumped[j]) {
			evs = append(evs, Event{Kind: KindRoute, Route: dumped[j]})
		}
	}
	for i, d := range dumped {
		if !used[i] {
			rs = append(rs, d)
			evs = append(evs, Event{Kind: KindRoute, Route: d})
		}
	}
	return rs, evs, true
}
