package netwatch

import (
	"cmp"
	"encoding/binary"
	"iter"
	"slices"
	"sync"
)

// A RouteSet holds routes as compactly as a cache holds them: 44 bytes
// for an ordinary IPv4 route and 96 for an IPv6 one (one with no multipath,
// metrics but the MTU, encapsulation, expiry or unknown attributes; the
// others keep their whole Route), against about 350 in a []Route. It is
// for a policy that desires as many routes as a full table holds (see
// reconcile.Desired.RouteSet).
//
// A RouteSet holds one route per key: Add replaces the route with r's key,
// if there is one. Its order is the one reconcile.Plan installs routes
// in: by family and table, longer prefixes first, then by key
// (RouteKey.Compare). Routes of a family other than IPv4 and IPv6, or
// whose destination is not one of their family, are kept as given, after
// the others, for the reader to refuse.
//
// The zero RouteSet is empty and ready to use. A RouteSet must not be
// copied after first use. Its methods are safe for concurrent use.
type RouteSet struct {
	mu     sync.Mutex
	e4     []setEntry4
	e6     []setEntry6
	odd    []Route // routes with no compact key, sorted by key once sorted is set
	extra  []Route // routes that do not fit an entry, by the entry's oif
	sorted bool    // e4, e6 and odd are sorted and hold one entry per key
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

// Add adds r to the set, replacing the route with its key.
func (s *RouteSet) Add(r Route) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sorted = false
	switch {
	case r.Family == IPv4 && r.Dst.IsValid() && r.Dst.Addr().Is4():
		e := setEntry4{table: r.Table, k: mk4(r.Key())}
		if fits(r) {
			e.v = pack4(r)
		} else {
			e.v = val4{has: hasExtra, oif: uint32(len(s.extra))}
			s.extra = append(s.extra, r)
		}
		s.e4 = append(s.e4, e)
	case r.Family == IPv6 && r.Dst.IsValid() && r.Dst.Addr().Is6() && (!r.Src.IsValid() || r.Src.Addr().Is6()):
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
}

// Len returns the number of routes in the set.
func (s *RouteSet) Len() int {
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

// Get returns the route with key k.
func (s *RouteSet) Get(k RouteKey) (Route, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sort()
	var i int
	var ok bool
	switch {
	case k.Family == IPv4 && k.Dst.IsValid() && k.Dst.Addr().Is4():
		w := setEntry4{table: k.Table, k: mk4(k)}
		i, ok = slices.BinarySearchFunc(s.e4, w, compareEntry4)
	case k.Family == IPv6 && k.Dst.IsValid() && k.Dst.Addr().Is6() && (!k.Src.IsValid() || k.Src.Addr().Is6()):
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

// sort sorts the entries into the set's order and keeps the last added
// of each key.
func (s *RouteSet) sort() {
	if s.sorted {
		return
	}
	s.sorted = true
	s.e4 = lastOfEachKey(s.e4, compareEntry4)
	s.e6 = lastOfEachKey(s.e6, compareEntry6)
	s.odd = lastOfEachKey(s.odd, func(a, b Route) int { return a.Key().Compare(b.Key()) })
	if len(s.extra) > 0 {
		s.dropUnusedExtra()
	}
}

// lastOfEachKey sorts es stably and keeps the last of each run of equal
// keys: the one added last.
func lastOfEachKey[E any](es []E, compare func(a, b E) int) []E {
	slices.SortStableFunc(es, compare)
	out := es[:0]
	for i := range es {
		if len(out) > 0 && compare(out[len(out)-1], es[i]) == 0 {
			out[len(out)-1] = es[i]
			continue
		}
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
