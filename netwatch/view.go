package netwatch

import (
	"cmp"
	"iter"
	"maps"
	"net/netip"
	"slices"
)

// state is the cache's content. The watcher owns it; a View reads it under
// the watcher's read lock.
type state struct {
	synced bool
	gen    uint64
	links  map[uint32]Link
	addrs  map[addrKey]Addr
	tables [2]map[Table]*table // [0] IPv4, [1] IPv6
	rules  [2][]Rule           // kernel order
}

func newState() *state {
	return &state{
		links:  make(map[uint32]Link),
		addrs:  make(map[addrKey]Addr),
		tables: [2]map[Table]*table{make(map[Table]*table), make(map[Table]*table)},
	}
}

// mapped returns the bytes the route tables hold outside the Go heap.
func (s *state) mapped() int64 {
	var n int64
	for _, ts := range s.tables {
		for _, t := range ts {
			n += t.m4.mapped() + t.m6.mapped()
		}
	}
	return n
}

func fi(f Family) int {
	if f == IPv6 {
		return 1
	}
	return 0
}

func (s *state) table(f Family, t Table, create bool) *table {
	tb := s.tables[fi(f)][t]
	if tb == nil && create {
		tb = newTable(f, t)
		s.tables[fi(f)][t] = tb
	}
	return tb
}

// Snapshot is a copy of a cache's content, as plain values. Tests and
// tools build one to get a View without a kernel; examples/watch prints one.
type Snapshot struct {
	Links  []Link
	Addrs  []Addr
	Routes []Route
	Rules  []Rule
}

// View returns a synced View of s, for pure code and its tests. Routes that
// share a key are kept in the order given.
func (s Snapshot) View() View {
	st := newState()
	st.synced = true
	for _, l := range s.Links {
		st.links[l.Index] = l
	}
	for _, a := range s.Addrs {
		st.addrs[a.key()] = a
	}
	for _, r := range s.Routes {
		tb := st.table(r.Family, r.Table, true)
		tb.setAll(r.Key(), append(tb.getAll(r.Key()), r))
	}
	for _, r := range s.Rules {
		st.rules[fi(r.Family)] = append(st.rules[fi(r.Family)], r)
	}
	return View{s: st}
}

// View is a consistent, read-only view of a cache. One obtained from
// Watcher.Read is valid only during the callback; one from Snapshot.View
// for as long as it is kept.
type View struct {
	s       *state
	j       *journal      // nil for a Snapshot's view
	changed chan struct{} // closed at the next change after the view; nil for a Snapshot's
	tables  tableFilter   // the tables the cache holds (Options.RouteTables)
	// held: the view holds differences a re-dump found that the journal
	// does not have yet (they wait for the events that may explain them).
	held bool
}

// Cached reports whether the cache holds the routes of table t: every
// table, unless Options.RouteTables names the ones it holds. The routes of
// a table the cache does not hold are not known, not absent.
func (v View) Cached(t Table) bool { return v.tables.has(t) }

// Synced reports whether the view reflects a complete dump plus every event
// since. A view that is not synced must not be used to remove anything.
func (v View) Synced() bool { return v.s != nil && v.s.synced }

// Changed returns a channel that is closed at the first change of the cache
// after this view; it may be kept after the view is not. A Snapshot's view
// never changes: its channel is nil, which blocks for ever.
func (v View) Changed() <-chan struct{} { return v.changed }

// Changes yields the changes the cache recorded after mark (the next of an
// earlier view's Changes; 0 at first), oldest first, each with its Origin:
// the events applied and the differences resyncs found, and returns next,
// the journal position after the last change this view holds, for the
// next call. The journal keeps the last 2048 changes; complete is false
// when some after mark have left it, or are not in it yet (for a moment
// after a re-dump found differences, which wait for the events that may
// explain them).
// This is how a program learns who changed an object it cares about since
// it last looked (reconcile.Reconciler tells another program's undo from the
// kernel's flush this way). A Snapshot's view has no journal, yields
// nothing and returns next 0.
func (v View) Changes(mark uint64) (changes iter.Seq[Event], next uint64, complete bool) {
	if v.j == nil {
		return func(func(Event) bool) {}, 0, true
	}
	changes, complete = v.j.since(mark)
	return changes, v.j.next, complete && !v.held
}

// Link returns the link with the given index.
func (v View) Link(index uint32) (Link, bool) {
	l, ok := v.s.links[index]
	return l, ok
}

// LinkByName returns the link with the given name.
func (v View) LinkByName(name string) (Link, bool) {
	for _, l := range v.s.links {
		if l.Name == name {
			return l, true
		}
	}
	return Link{}, false
}

// Links yields every link, by index.
func (v View) Links() iter.Seq[Link] {
	return func(yield func(Link) bool) {
		for _, i := range slices.Sorted(maps.Keys(v.s.links)) {
			if !yield(v.s.links[i]) {
				return
			}
		}
	}
}

// Addrs yields the addresses of the link with the given index, or of
// every link when index is 0, ordered by link and address.
func (v View) Addrs(index uint32) iter.Seq[Addr] {
	return func(yield func(Addr) bool) {
		var as []Addr
		for k, a := range v.s.addrs {
			if index == 0 || k.Index == index {
				as = append(as, a)
			}
		}
		slices.SortFunc(as, func(a, b Addr) int {
			return cmp.Or(cmp.Compare(a.Index, b.Index), a.Prefix.Addr().Compare(b.Prefix.Addr()), cmp.Compare(a.Prefix.Bits(), b.Prefix.Bits()), a.Peer.Compare(b.Peer))
		})
		for _, a := range as {
			if !yield(a) {
				return
			}
		}
	}
}

// Tables returns the IDs of the tables that hold routes of family f, sorted.
func (v View) Tables(f Family) []Table {
	var ts []Table
	for id, tb := range v.s.tables[fi(f)] {
		if tb.len() > 0 {
			ts = append(ts, id)
		}
	}
	slices.Sort(ts)
	return ts
}

// Routes yields the routes of family f in table t, in no particular order
// (mostly the kernel's dump order). For the routes a policy usually wants,
// see DefaultRoutes, which returns them in a documented order, and
// RoutesWithin.
func (v View) Routes(f Family, t Table) iter.Seq[Route] {
	return func(yield func(Route) bool) {
		if tb := v.s.table(f, t, false); tb != nil {
			tb.all(yield)
		}
	}
}

// RoutesWithin yields the routes of table t whose destination lies inside
// p: equals it or is more specific (10.0.0.0/16 holds 10.0.0.0/16 and
// 10.0.5.0/24, not 10.0.0.0/8). The family is p's; the order none in
// particular. For IPv4 it costs a binary search and the routes it yields,
// not a walk of the table: a policy that cares about some prefixes of a
// full table reads them this way.
func (v View) RoutesWithin(t Table, p netip.Prefix) iter.Seq[Route] {
	p = p.Masked()
	return func(yield func(Route) bool) {
		if tb := v.s.table(FamilyOf(p.Addr()), t, false); tb != nil && p.IsValid() {
			tb.within(p, yield)
		}
	}
}

// Covering returns the routes of table t whose destination is the longest
// prefix that contains a: those among which the kernel's lookup of a in t
// chooses (by TOS, source and metric), lowest metric first, then by key;
// none when no route of t covers a. It takes a binary search per prefix
// length and one read of the routes that arrived, since the table was
// last compacted, in an order its sorted array could not append (at most
// 1,023, or a quarter of the table when that is more): not a walk of the
// table.
func (v View) Covering(t Table, a netip.Addr) []Route {
	a = a.Unmap()
	if tb := v.s.table(FamilyOf(a), t, false); tb != nil && a.IsValid() {
		return tb.covering(a.WithZone(""))
	}
	return nil
}

// Route yields the routes with key k: usually one, more when routes were
// appended to the same key, the one the kernel uses first. The key holds
// the metric; RoutesWithin finds a destination's routes whatever their
// metric. It allocates nothing: slices.AppendSeq(buf[:0], v.Route(k))
// reuses a caller's buffer from key to key.
func (v View) Route(k RouteKey) iter.Seq[Route] {
	return func(yield func(Route) bool) {
		if tb := v.s.table(k.Family, k.Table, false); tb != nil {
			tb.each(k, yield)
		}
	}
}

// routeCount returns the number of routes cached for family f.
func (v View) routeCount(f Family) int {
	n := 0
	for _, tb := range v.s.tables[fi(f)] {
		n += tb.len()
	}
	return n
}

// Rules yields the rules of family f in kernel order.
func (v View) Rules(f Family) iter.Seq[Rule] {
	return slices.Values(v.s.rules[fi(f)])
}

// snapshot copies the view into plain values: links by index, addresses by
// link and address, routes by family, table and destination, rules in
// kernel order, IPv4 before IPv6.
func (v View) snapshot() Snapshot {
	var s Snapshot
	s.Links = slices.Collect(v.Links())
	s.Addrs = slices.Collect(v.Addrs(0))
	for _, f := range []Family{IPv4, IPv6} {
		for _, t := range v.Tables(f) {
			start := len(s.Routes)
			for r := range v.Routes(f, t) {
				s.Routes = append(s.Routes, r)
			}
			rs := s.Routes[start:]
			slices.SortStableFunc(rs, compareRoutes)
		}
	}
	for _, f := range []Family{IPv4, IPv6} {
		s.Rules = append(s.Rules, v.s.rules[fi(f)]...)
	}
	return s
}

// tableFilter restricts which routing tables are cached; the zero value
// caches all.
type tableFilter struct {
	set map[Table]struct{}
}

func newTableFilter(ts []Table) tableFilter {
	if ts == nil {
		return tableFilter{}
	}
	f := tableFilter{set: make(map[Table]struct{}, len(ts))}
	for _, t := range ts {
		f.set[t] = struct{}{}
	}
	return f
}

func (f tableFilter) has(t Table) bool {
	if f.set == nil {
		return true
	}
	_, ok := f.set[t]
	return ok
}
