package netwatch

import (
	"cmp"
	"encoding/binary"
	"net/netip"
	"slices"
)

// Routes are the bulk of a cache (a full BGP table is a million of them), so
// they are stored compactly: per family and table, a store (cache_store.go) of
// small pointer-free keys and values, which the garbage collector never
// scans. The rare routes that do not fit (multipath, RTA_VIA gateways of
// another family, source prefixes of IPv4 — which the kernel has none of)
// keep their whole Route in a side map, and routes that share a key (ip
// route append) keep the extra entries in a side list, in kernel order.

// The keys have no padding (pad is always zero), so == compares them as
// plain memory.
type key4 struct {
	dst    [4]byte
	bits   uint8
	tos    uint8
	pad    uint16 //lint:ignore U1000 fills the padding; see above
	metric uint32
}

// compare orders IPv4 keys as the kernel's FIB trie dumps them: by
// address, then longer prefixes first, higher TOS first, lower metric
// first.
func (a key4) compare(b key4) int {
	if x, y := binary.BigEndian.Uint32(a.dst[:]), binary.BigEndian.Uint32(b.dst[:]); x != y {
		return cmp.Compare(x, y)
	}
	if a.bits != b.bits {
		return cmp.Compare(b.bits, a.bits)
	}
	if a.tos != b.tos {
		return cmp.Compare(b.tos, a.tos)
	}
	return cmp.Compare(a.metric, b.metric)
}

type val4 struct {
	gw, psrc          [4]byte
	oif, mtu, flags   uint32
	nhid              uint32
	proto, scope, typ uint8
	has               uint8 // hasGW, hasPsrc, hasExtra bits
}

type key6 struct {
	dst, src      [16]byte
	bits, srcBits uint8  // srcBits is the source length + 1, 0 without one
	pad           uint16 //lint:ignore U1000 fills the padding; see above
	metric        uint32
}

// compare orders IPv6 keys as the kernel's walk of its FIB tree dumps
// them. The walk reaches a route with a source prefix when it enters the
// node of its destination, before the longer prefixes under it, and the
// other routes when it leaves that node, after them: the former sort by
// the first address of the destination, outer prefixes first, then by
// source as the latter by destination; the latter by the last address of
// the destination, inner prefixes first; both then by metric.
func (a key6) compare(b key6) int {
	ah, al := a.walkPos()
	bh, bl := b.walkPos()
	switch {
	case ah != bh:
		return cmp.Compare(ah, bh)
	case al != bl:
		return cmp.Compare(al, bl)
	case (a.srcBits == 0) != (b.srcBits == 0):
		return cmp.Compare(b.srcBits, a.srcBits) // entering before leaving
	case a.srcBits == 0 && a.bits != b.bits:
		return cmp.Compare(b.bits, a.bits)
	case a.bits != b.bits:
		return cmp.Compare(a.bits, b.bits)
	case a.srcBits != 0:
		if c := comparePrefixEnd(a.src, a.srcBits-1, b.src, b.srcBits-1); c != 0 {
			return c
		}
	}
	return cmp.Compare(a.metric, b.metric)
}

// walkPos returns the address at which the kernel's walk reaches a route
// with key k: the first of its destination with a source prefix, the last
// without.
func (k key6) walkPos() (hi, lo uint64) {
	hi, lo = binary.BigEndian.Uint64(k.dst[:8]), binary.BigEndian.Uint64(k.dst[8:])
	if k.srcBits == 0 {
		hi |= hostMask64(k.bits, 0)
		lo |= hostMask64(k.bits, 8)
	}
	return hi, lo
}

// comparePrefixEnd orders two IPv6 prefixes by their last address, then
// the longer one first.
func comparePrefixEnd(a [16]byte, abits uint8, b [16]byte, bbits uint8) int {
	for i := 0; i < 16; i += 8 {
		x := binary.BigEndian.Uint64(a[i:]) | hostMask64(abits, i)
		y := binary.BigEndian.Uint64(b[i:]) | hostMask64(bbits, i)
		if x != y {
			return cmp.Compare(x, y)
		}
	}
	return cmp.Compare(bbits, abits)
}

// hostMask64 returns the host bits of a prefix of length bits within the
// 64-bit half of an address that starts at byte off.
func hostMask64(bits uint8, off int) uint64 {
	n := int(bits) - off*8 // prefix bits inside this half
	switch {
	case n <= 0:
		return ^uint64(0)
	case n >= 64:
		return 0
	}
	return ^uint64(0) >> n
}

type val6 struct {
	gw, psrc          [16]byte
	oif, mtu, flags   uint32
	nhid              uint32
	proto, scope, typ uint8
	has               uint8
}

const (
	hasGW = 1 << iota
	hasPsrc
	hasExtra // the whole route is in table.extra
	// The two bits from prefShift on are an IPv6 route's RoutePref.
	prefShift = 3
	prefBits  = 3 << prefShift
)

// table holds the routes of one family and one table.
type table struct {
	family Family
	id     Table
	m4     store[key4, val4]
	m6     store[key6, val6]
	// extra holds routes that do not fit the compact form, by key; the
	// compact entry is then a placeholder with hasExtra set.
	extra map[RouteKey]Route
	// dups holds the second and later routes that share a key, in order.
	dups map[RouteKey][]Route
	// byLink counts the routes with a path out of each link, by index:
	// whether a link change can have touched the table is a look-up.
	// Indexes up to denseLinks count in the slice; the kernel hands out
	// small ones, but "ip link add … index N" takes any up to 2^31-1,
	// and those count in sparseLinks.
	byLink      []int32
	sparseLinks map[uint32]int32
}

// denseLinks bounds the link indexes counted in a table's slice.
const denseLinks = 1 << 16

// countLink adds d to the count of routes out of link index.
func (t *table) countLink(index uint32, d int32) {
	if index == 0 {
		return
	}
	if index >= denseLinks {
		if t.sparseLinks == nil {
			t.sparseLinks = make(map[uint32]int32)
		}
		if n := t.sparseLinks[index] + d; n != 0 {
			t.sparseLinks[index] = n
		} else {
			delete(t.sparseLinks, index)
		}
		return
	}
	if int(index) >= len(t.byLink) {
		t.byLink = append(t.byLink, make([]int32, int(index)+1-len(t.byLink))...)
	}
	t.byLink[index] += d
}

// countRoute adds d to the counts of each link r has a path out of.
func (t *table) countRoute(r Route, d int32) {
	t.countLink(r.Index, d)
	for i, h := range r.NextHops {
		if h.Index != r.Index && !slices.ContainsFunc(r.NextHops[:i], func(o NextHop) bool { return o.Index == h.Index }) {
			t.countLink(h.Index, d)
		}
	}
}

// newTable returns an empty table.
func newTable(f Family, id Table) *table {
	return &table{family: f, id: id}
}

func (t *table) len() int {
	n := t.m4.len() + t.m6.len()
	for _, d := range t.dups {
		n += len(d)
	}
	return n
}

// fits reports whether r can be stored in compact form: what nearly every
// route of a full table has, and no more.
func fits(r Route) bool {
	if r.NextHops != nil || r.Metrics != (Metrics{}) || r.Flow != 0 || !r.Expires.IsZero() ||
		r.Encap != (Encap{}) || r.Attrs != "" || r.Pref > 3 || r.Family == IPv4 && r.Pref != 0 {
		return false
	}
	if r.Family == IPv4 {
		return !r.Src.IsValid() && (!r.Gateway.IsValid() || r.Gateway.Is4()) && (!r.PrefSrc.IsValid() || r.PrefSrc.Is4())
	}
	return r.TOS == 0 && (!r.Gateway.IsValid() || r.Gateway.Is6()) && (!r.PrefSrc.IsValid() || r.PrefSrc.Is6())
}

func mk4(k RouteKey) key4 {
	return key4{dst: k.Dst.Addr().As4(), bits: uint8(k.Dst.Bits()), tos: k.TOS, metric: k.Metric}
}

func mk6(k RouteKey) key6 {
	k6 := key6{dst: k.Dst.Addr().As16(), bits: uint8(k.Dst.Bits()), metric: k.Metric}
	if k.Src.IsValid() {
		k6.src = k.Src.Addr().As16()
		k6.srcBits = uint8(k.Src.Bits()) + 1
	}
	return k6
}

func (t *table) key4Route(k key4) RouteKey { return routeKey4(t.id, k) }

func (t *table) key6Route(k key6) RouteKey { return routeKey6(t.id, k) }

func routeKey4(id Table, k key4) RouteKey {
	return RouteKey{Family: IPv4, Table: id, Dst: netip.PrefixFrom(netip.AddrFrom4(k.dst), int(k.bits)), TOS: k.tos, Metric: k.metric}
}

func routeKey6(id Table, k key6) RouteKey {
	rk := RouteKey{Family: IPv6, Table: id, Dst: netip.PrefixFrom(netip.AddrFrom16(k.dst), int(k.bits)), Metric: k.metric}
	if k.srcBits != 0 {
		rk.Src = netip.PrefixFrom(netip.AddrFrom16(k.src), int(k.srcBits)-1)
	}
	return rk
}

func (t *table) route4(k key4, v val4) Route {
	if v.has&hasExtra != 0 {
		return t.extra[t.key4Route(k)]
	}
	return unpack4(t.id, k, v)
}

func (t *table) route6(k key6, v val6) Route {
	if v.has&hasExtra != 0 {
		return t.extra[t.key6Route(k)]
	}
	return unpack6(t.id, k, v)
}

// unpack4 is the route of table id that k and v hold in compact form.
func unpack4(id Table, k key4, v val4) Route {
	rk := routeKey4(id, k)
	r := Route{Family: IPv4, Table: id, Dst: rk.Dst, TOS: k.tos, Metric: k.metric,
		Index: v.oif, MTU: v.mtu, Flags: RouteFlags(v.flags), NHID: v.nhid,
		Protocol: Protocol(v.proto), Scope: Scope(v.scope), Type: RouteType(v.typ)}
	if v.has&hasGW != 0 {
		r.Gateway = netip.AddrFrom4(v.gw)
	}
	if v.has&hasPsrc != 0 {
		r.PrefSrc = netip.AddrFrom4(v.psrc)
	}
	return r
}

// unpack6 is the route of table id that k and v hold in compact form.
func unpack6(id Table, k key6, v val6) Route {
	rk := routeKey6(id, k)
	r := Route{Family: IPv6, Table: id, Dst: rk.Dst, Src: rk.Src, Metric: k.metric,
		Index: v.oif, MTU: v.mtu, Flags: RouteFlags(v.flags), NHID: v.nhid,
		Protocol: Protocol(v.proto), Scope: Scope(v.scope), Type: RouteType(v.typ),
		Pref: RoutePref(v.has&prefBits) >> prefShift}
	if v.has&hasGW != 0 {
		r.Gateway = netip.AddrFrom16(v.gw)
	}
	if v.has&hasPsrc != 0 {
		r.PrefSrc = netip.AddrFrom16(v.psrc)
	}
	return r
}

// get returns the first route with key k.
func (t *table) get(k RouteKey) (Route, bool) {
	if t.family == IPv4 {
		k4 := mk4(k)
		v, ok := t.m4.get(k4)
		if !ok {
			return Route{}, false
		}
		return t.route4(k4, v), true
	}
	k6 := mk6(k)
	v, ok := t.m6.get(k6)
	if !ok {
		return Route{}, false
	}
	return t.route6(k6, v), true
}

// getAll returns every route with key k, first one first.
func (t *table) getAll(k RouteKey) []Route {
	var rs []Route
	t.each(k, func(r Route) bool { rs = append(rs, r); return true })
	return rs
}

// each yields every route with key k, first one first, allocating nothing.
func (t *table) each(k RouteKey, yield func(Route) bool) {
	r, ok := t.get(k)
	if !ok || !yield(r) {
		return
	}
	for _, d := range t.dups[k] {
		if !yield(d) {
			return
		}
	}
}

// setFirst stores r as the first route of its key, replacing any.
func (t *table) setFirst(r Route) {
	k := r.Key()
	if !fits(r) {
		if t.extra == nil {
			t.extra = make(map[RouteKey]Route)
		}
		t.extra[k] = r
		if t.family == IPv4 {
			t.m4.set(mk4(k), val4{has: hasExtra})
		} else {
			t.m6.set(mk6(k), val6{has: hasExtra})
		}
		return
	}
	delete(t.extra, k)
	if t.family == IPv4 {
		t.m4.set(mk4(k), pack4(r))
	} else {
		t.m6.set(mk6(k), pack6(r))
	}
}

// addNew stores r, the first route of its key, in compact form, and
// reports whether it could: not if r does not fit or its key is taken. It
// is the fast path of a dump, where nearly every key is new.
func (t *table) addNew(r Route) bool {
	if !fits(r) {
		return false
	}
	k := r.Key()
	added := t.family == IPv4 && t.m4.add(mk4(k), pack4(r)) || t.family == IPv6 && t.m6.add(mk6(k), pack6(r))
	if added {
		t.countLink(r.Index, 1)
	}
	return added
}

func pack4(r Route) val4 {
	v := val4{oif: r.Index, mtu: r.MTU, flags: uint32(r.Flags), nhid: r.NHID,
		proto: uint8(r.Protocol), scope: uint8(r.Scope), typ: uint8(r.Type)}
	if r.Gateway.IsValid() {
		v.gw, v.has = r.Gateway.As4(), v.has|hasGW
	}
	if r.PrefSrc.IsValid() {
		v.psrc, v.has = r.PrefSrc.As4(), v.has|hasPsrc
	}
	return v
}

func pack6(r Route) val6 {
	v := val6{oif: r.Index, mtu: r.MTU, flags: uint32(r.Flags), nhid: r.NHID,
		proto: uint8(r.Protocol), scope: uint8(r.Scope), typ: uint8(r.Type), has: uint8(r.Pref) << prefShift}
	if r.Gateway.IsValid() {
		v.gw, v.has = r.Gateway.As16(), v.has|hasGW
	}
	if r.PrefSrc.IsValid() {
		v.psrc, v.has = r.PrefSrc.As16(), v.has|hasPsrc
	}
	return v
}

// setAll stores rs (all sharing one key, in order) as the routes of that
// key; an empty rs removes the key.
func (t *table) setAll(k RouteKey, rs []Route) {
	if r, ok := t.get(k); ok {
		t.countRoute(r, -1)
		for _, d := range t.dups[k] {
			t.countRoute(d, -1)
		}
	}
	for _, r := range rs {
		t.countRoute(r, 1)
	}
	if len(rs) == 0 {
		t.drop(k)
		return
	}
	t.setFirst(rs[0])
	if len(rs) == 1 {
		delete(t.dups, k)
		return
	}
	if t.dups == nil {
		t.dups = make(map[RouteKey][]Route)
	}
	t.dups[k] = append([]Route(nil), rs[1:]...)
}

// hasDups reports whether key k holds more than one route.
func (t *table) hasDups(k RouteKey) bool { return len(t.dups) > 0 && t.dups[k] != nil }

// insert stores r under a key that holds no route: setAll without reading
// what is there.
func (t *table) insert(r Route) {
	t.countRoute(r, 1)
	t.setFirst(r)
}

// remove takes away first, the one route of key k: setAll(k, nil) without
// reading it again.
func (t *table) remove(k RouteKey, first Route) {
	t.countRoute(first, -1)
	t.drop(k)
}

// drop takes key k and its routes out of the table, counts aside.
func (t *table) drop(k RouteKey) {
	delete(t.extra, k)
	delete(t.dups, k)
	if t.family == IPv4 {
		t.m4.del(mk4(k))
	} else {
		t.m6.del(mk6(k))
	}
}

// all yields every route of the table.
func (t *table) all(yield func(Route) bool) bool {
	if t.family == IPv4 {
		return t.m4.all(func(k key4, v val4) bool {
			return yield(t.route4(k, v)) && yieldDups(t, t.key4Route, k, yield)
		})
	}
	return t.m6.all(func(k key6, v val6) bool {
		return yield(t.route6(k, v)) && yieldDups(t, t.key6Route, k, yield)
	})
}

// yieldDups yields the second and later routes with key k.
func yieldDups[K any](t *table, key func(K) RouteKey, k K, yield func(Route) bool) bool {
	if len(t.dups) == 0 {
		return true
	}
	for _, d := range t.dups[key(k)] {
		if !yield(d) {
			return false
		}
	}
	return true
}

// within yields the routes whose destination lies inside p (equals it or
// is more specific). IPv4 keys sort by address, longer prefixes first, so
// those routes are one run of the array from p's address on, less the
// shorter prefixes of that address: a binary search and the run. IPv6
// keys sort in the kernel's tree-walk order, which has no such run: a scan.
func (t *table) within(p netip.Prefix, yield func(Route) bool) {
	in := func(dst netip.Prefix) bool { return dst.Bits() >= p.Bits() && p.Contains(dst.Addr()) }
	if t.family == IPv6 {
		t.all(func(r Route) bool { return !in(r.Dst) || yield(r) })
		return
	}
	start := key4{dst: p.Addr().As4(), bits: 32, tos: 0xff}
	last := binary.BigEndian.Uint32(start.dst[:]) | uint32(^uint64(0)>>(32+p.Bits()))
	keep := func(k key4) bool {
		return in(netip.PrefixFrom(netip.AddrFrom4(k.dst), int(k.bits)))
	}
	t.m4.from(start, keep, func(k key4, v val4) bool {
		if binary.BigEndian.Uint32(k.dst[:]) > last {
			return false
		}
		if int(k.bits) < p.Bits() {
			return true // covers p: not inside it
		}
		return yield(t.route4(k, v)) && yieldDups(t, t.key4Route, k, yield)
	})
}

// usesLink reports whether a route of the table has a path out of link
// index, dead or not.
func (t *table) usesLink(index uint32) bool {
	if index >= denseLinks {
		return t.sparseLinks[index] > 0
	}
	return int(index) < len(t.byLink) && t.byLink[index] > 0
}

// covering returns the routes whose destination is the longest prefix
// containing a, of any key (TOS, source, metric), dups included. Each
// prefix length is a binary search of the array, from the longest down,
// and the side map of keys not yet in the array is read once.
func (t *table) covering(a netip.Addr) []Route {
	maxBits := a.BitLen()
	// The side map, once: best is the longest of its prefixes that
	// contain a, side their routes.
	best := -1
	var side []Route
	found := func(p netip.Prefix, r func() Route, dups func(yield func(Route) bool) bool) {
		if p.Bits() < best || !p.Contains(a) {
			return
		}
		if p.Bits() > best {
			best, side = p.Bits(), side[:0]
		}
		side = append(side, r())
		dups(func(r Route) bool { side = append(side, r); return true })
	}
	if t.family == IPv4 {
		for k, v := range t.m4.added {
			found(netip.PrefixFrom(netip.AddrFrom4(k.dst), int(k.bits)), func() Route { return t.route4(k, v) },
				func(y func(Route) bool) bool { return yieldDups(t, t.key4Route, k, y) })
		}
	} else {
		for k, v := range t.m6.added {
			found(netip.PrefixFrom(netip.AddrFrom16(k.dst), int(k.bits)), func() Route { return t.route6(k, v) },
				func(y func(Route) bool) bool { return yieldDups(t, t.key6Route, k, y) })
		}
	}
	// The array, a binary search per length, from the longest down to
	// best: a longer prefix there wins, an equal one joins the side's.
	var rs []Route
	collect := func(bits int) {
		p, _ := a.Prefix(bits)
		dst := p.Addr()
		if t.family == IPv4 {
			t.m4.sorted(key4{dst: dst.As4(), bits: uint8(bits), tos: 0xff}, func(k key4, v val4) bool {
				if k.dst != dst.As4() || int(k.bits) != bits {
					return false // past the run
				}
				rs = append(rs, t.route4(k, v))
				return yieldDups(t, t.key4Route, k, func(r Route) bool { rs = append(rs, r); return true })
			})
			return
		}
		for _, start := range []key6{{dst: dst.As16(), bits: uint8(bits)}, {dst: dst.As16(), bits: uint8(bits), srcBits: 129}} {
			src := start.srcBits != 0
			t.m6.sorted(start, func(k key6, v val6) bool {
				if k.dst != dst.As16() || int(k.bits) != bits || (k.srcBits != 0) != src {
					return false
				}
				rs = append(rs, t.route6(k, v))
				return yieldDups(t, t.key6Route, k, func(r Route) bool { rs = append(rs, r); return true })
			})
		}
	}
	for bits := maxBits; bits > best; bits-- {
		if collect(bits); len(rs) > 0 {
			break
		}
	}
	if len(rs) == 0 && best >= 0 {
		collect(best)
		rs = append(rs, side...)
	}
	slices.SortStableFunc(rs, func(a, b Route) int { return cmp.Or(cmp.Compare(a.Metric, b.Metric), compareRoutes(a, b)) })
	return rs
}
