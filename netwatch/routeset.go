package netwatch

import (
	"cmp"
	"encoding/binary"
	"iter"
	"slices"
	"sync"
)

// A RouteSet holds the routes a policy desires (reconcile.Desired.Routes),
// as compactly as a cache holds routes: 44 bytes for an ordinary IPv4
// route and 96 for an IPv6 one (one with no multipath, metrics but the
// MTU, encapsulation, expiry or unknown attributes; the others keep their
// whole Route), against about 350 in a []Route, so that a policy that
// desires as many routes as a full table holds fits a small memory limit.
//
// A RouteSet holds each route as the kernel would store it (Route.Clean:
// an IPv6 metric of 0 is 1024) and each once: adding a route it holds
// again changes nothing. It holds one route per key (RouteKey: what the
// kernel tells apart), except that a second, different route added with a
// key is kept beside the first, so that reconcile.Plan refuses the pair
// ("one key, two routes") instead of picking one; a third is not kept.
// Its memory follows the routes it holds, not the routes ever added.
//
// Its order is the one reconcile.Plan installs routes in: by family and
// table, longer prefixes first, then by key (RouteKey.Compare), and routes
// of one key in the order added. Routes the kernel cannot hold as keyed
// (of a family other than IPv4 and IPv6, a destination of another family,
// an IPv4 source prefix, an IPv6 TOS) are kept whole, by their whole key,
// after the others, for the reader to refuse.
//
// The zero RouteSet is empty and ready to use; a nil *RouteSet is empty
// to read. A RouteSet must not be copied after first use. Its methods are
// safe for concurrent use.
type RouteSet struct {
	mu     sync.Mutex
	e4     []setEntry4
	e6     []setEntry6
	odd    []Route // routes with no compact key, sorted by key once sorted is set
	extra  []Route // routes that do not fit an entry, by the entry's oif
	sorted bool    // e4, e6 and odd are sorted and hold what the set holds
	held   int     // entries held after the last sort: Add sorts again once they double
}

type setEntry4 struct {
	table Table
	k     key4
	v     val4
}

type setEntry6 struct {
	table Table
	k     key6
	v     val6
}

// compactKey4 and compactKey6 report whether r's whole key fits a compact
// entry: the kernel's key of an IPv4 route has no source, an IPv6 one no
// TOS.
func compactKey4(r *Route) bool {
	return r.Family == IPv4 && r.Dst.IsValid() && r.Dst.Addr().Is4() && !r.Src.IsValid()
}

func compactKey6(r *Route) bool {
	return r.Family == IPv6 && r.Dst.IsValid() && r.Dst.Addr().Is6() && (!r.Src.IsValid() || r.Src.Addr().Is6()) && r.TOS == 0
}

// Add adds rs, each Clean, to the set, and returns the set:
// new(RouteSet).Add(a, b) is a set of a and b.
func (s *RouteSet) Add(rs ...Route) *RouteSet {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range rs {
		s.add(r.Clean())
	}
	return s
}

func (s *RouteSet) add(r Route) {
	s.sorted = false
	switch {
	case compactKey4(&r):
		e := setEntry4{table: r.Table, k: mk4(r.Key())}
		if fits(r) {
			e.v = pack4(r)
		} else {
			e.v = val4{has: hasExtra, oif: uint32(len(s.extra))}
			s.extra = append(s.extra, r)
		}
		s.e4 = append(s.e4, e)
	case compactKey6(&r):
		e := setEntry6{table: r.Table, k: mk6(r.Key())}
		if fits(r) {
			e.v = pack6(r)
		} else {
			e.v = val6{has: hasExtra, oif: uint32(len(s.extra))}
			s.extra = append(s.extra, r)
		}
		s.e6 = append(s.e6, e)
	default:
		s.odd = append(s.odd, r)
	}
	if len(s.e4)+len(s.e6)+len(s.odd) >= 2*s.held+64 {
		// What is held, not what was added: a key added a million
		// times takes one entry.
		s.sort()
	}
}

// Len returns the number of routes in the set.
func (s *RouteSet) Len() int {
	if s == nil {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sort()
	return len(s.e4) + len(s.e6) + len(s.odd)
}

// At returns the route at position i of the set's order, 0 <= i < Len.
func (s *RouteSet) At(i int) Route {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sort()
	return s.at(i)
}

// All yields the routes in the set's order. It must not be used while
// the set is changed.
func (s *RouteSet) All() iter.Seq[Route] {
	return func(yield func(Route) bool) {
		for i, n := 0, s.Len(); i < n; i++ {
			if !yield(s.At(i)) {
				return
			}
		}
	}
}

// Get returns the route with key k: the first added, if two are held.
func (s *RouteSet) Get(k RouteKey) (Route, bool) {
	if s == nil {
		return Route{}, false
	}
	if k.Family == IPv6 && k.Metric == 0 {
		k.Metric = ipv6DefaultMetric
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sort()
	r := Route{Family: k.Family, Table: k.Table, Dst: k.Dst, Src: k.Src, TOS: k.TOS}
	var i int
	var ok bool
	switch {
	case compactKey4(&r):
		w := setEntry4{table: k.Table, k: mk4(k)}
		i, ok = slices.BinarySearchFunc(s.e4, w, compareEntry4)
	case compactKey6(&r):
		w := setEntry6{table: k.Table, k: mk6(k)}
		i, ok = slices.BinarySearchFunc(s.e6, w, compareEntry6)
		i += len(s.e4)
	default:
		i, ok = slices.BinarySearchFunc(s.odd, k, func(r Route, k RouteKey) int { return r.Key().Compare(k) })
		i += len(s.e4) + len(s.e6)
	}
	if !ok {
		return Route{}, false
	}
	return s.at(i), true
}

// at returns the route at position i; s is sorted.
func (s *RouteSet) at(i int) Route {
	if i < len(s.e4) {
		e := &s.e4[i]
		if e.v.has&hasExtra != 0 {
			return s.extra[e.v.oif]
		}
		return unpack4(e.table, e.k, e.v)
	}
	if i -= len(s.e4); i < len(s.e6) {
		e := &s.e6[i]
		if e.v.has&hasExtra != 0 {
			return s.extra[e.v.oif]
		}
		return unpack6(e.table, e.k, e.v)
	}
	return s.odd[i-len(s.e6)]
}

// sort sorts the entries into the set's order and keeps, of each key, the
// first route added and the first added after it that differs from it.
func (s *RouteSet) sort() {
	if s.sorted {
		return
	}
	s.sorted = true
	s.e4 = heldOfEachKey(s.e4, compareEntry4, func(a, b *setEntry4) bool { return s.same(a.v.has, b.v.has, a.v.oif, b.v.oif, a.v == b.v) })
	s.e6 = heldOfEachKey(s.e6, compareEntry6, func(a, b *setEntry6) bool { return s.same(a.v.has, b.v.has, a.v.oif, b.v.oif, a.v == b.v) })
	s.odd = heldOfEachKey(s.odd, func(a, b Route) int { return a.Key().Compare(b.Key()) }, func(a, b *Route) bool { return a.Equal(*b) })
	if len(s.extra) > 0 {
		s.dropUnusedExtra()
	}
	s.held = len(s.e4) + len(s.e6) + len(s.odd)
}

// same reports whether two entries of one key hold the same route: their
// values are equal (eq) when neither is in s.extra, the routes there are
// when both are.
func (s *RouteSet) same(ha, hb uint8, oa, ob uint32, eq bool) bool {
	switch ea, eb := ha&hasExtra != 0, hb&hasExtra != 0; {
	case ea && eb:
		return s.extra[oa].Equal(s.extra[ob])
	case ea || eb:
		return false
	}
	return eq
}

// heldOfEachKey sorts es stably and keeps, of each run of one key, the
// first and the first after it that is not the same.
func heldOfEachKey[E any](es []E, compare func(a, b E) int, same func(a, b *E) bool) []E {
	slices.SortStableFunc(es, compare)
	out := es[:0] // written behind the reads
	first := 0    // the index in out of the current key's first
	for i := range es {
		if len(out) > 0 && compare(out[first], es[i]) == 0 {
			if len(out)-first == 1 && !same(&out[first], &es[i]) {
				out = append(out, es[i])
			}
			continue
		}
		first = len(out)
		out = append(out, es[i])
	}
	clear(es[len(out):])
	return out
}

// dropUnusedExtra drops the whole routes that replaced entries no longer
// refer to.
func (s *RouteSet) dropUnusedExtra() {
	keep := make([]Route, 0, len(s.extra))
	for i := range s.e4 {
		if v := &s.e4[i].v; v.has&hasExtra != 0 {
			keep, v.oif = append(keep, s.extra[v.oif]), uint32(len(keep))
		}
	}
	for i := range s.e6 {
		if v := &s.e6[i].v; v.has&hasExtra != 0 {
			keep, v.oif = append(keep, s.extra[v.oif]), uint32(len(keep))
		}
	}
	s.extra = slices.Clip(keep)
}

// compareEntry4 orders IPv4 entries as routeSetOrder orders their keys.
func compareEntry4(a, b setEntry4) int {
	return cmp.Or(cmp.Compare(a.table, b.table), cmp.Compare(b.k.bits, a.k.bits),
		cmp.Compare(binary.BigEndian.Uint32(a.k.dst[:]), binary.BigEndian.Uint32(b.k.dst[:])),
		cmp.Compare(a.k.tos, b.k.tos), cmp.Compare(a.k.metric, b.k.metric))
}

// compareEntry6 orders IPv6 entries as RouteKey.Compare orders their keys
// within one prefix length.
func compareEntry6(a, b setEntry6) int {
	if c := cmp.Or(cmp.Compare(a.table, b.table), cmp.Compare(b.k.bits, a.k.bits)); c != 0 {
		return c
	}
	if c := compareBytes16(a.k.dst, b.k.dst); c != 0 {
		return c
	}
	// No source (srcBits 0) sorts first, as the zero Prefix does.
	if (a.k.srcBits == 0) != (b.k.srcBits == 0) {
		return cmp.Compare(a.k.srcBits, b.k.srcBits)
	}
	return cmp.Or(compareBytes16(a.k.src, b.k.src), cmp.Compare(a.k.srcBits, b.k.srcBits), cmp.Compare(a.k.metric, b.k.metric))
}

func compareBytes16(a, b [16]byte) int {
	return cmp.Or(cmp.Compare(binary.BigEndian.Uint64(a[:8]), binary.BigEndian.Uint64(b[:8])),
		cmp.Compare(binary.BigEndian.Uint64(a[8:]), binary.BigEndian.Uint64(b[8:])))
}
