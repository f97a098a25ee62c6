package netwatch

import (
	"net/netip"
)

// Routes are the bulk of a cache (a full BGP table is a million of them), so
// they are stored compactly: per family and table, a map from a small
// pointer-free key to a small pointer-free value. The garbage collector never
// scans these maps. The rare routes that do not fit (multipath, RTA_VIA
// gateways of another family, nexthop objects with extras, source
// prefixes of IPv4 — which the kernel has none of) keep their whole Route in
// a side map, and routes that share a key (ip route append) keep the extra
// entries in a side list, in kernel order.

// The keys have no padding (pad is always zero), so the runtime hashes
// and compares them as plain memory: measurably faster in a dump.
type key4 struct {
	dst    [4]byte
	bits   uint8
	tos    uint8
	pad    uint16 //lint:ignore U1000 fills the padding; see above
	metric uint32
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
	bits, srcBits uint8
	pad           uint16 //lint:ignore U1000 fills the padding; see above
	metric        uint32
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
)

// table holds the routes of one family and one table.
type table struct {
	family Family
	id     Table
	m4     map[key4]val4
	m6     map[key6]val6
	// extra holds routes that do not fit the compact form, by key; the
	// compact entry is then a placeholder with hasExtra set.
	extra map[RouteKey]Route
	// dups holds the second and later routes that share a key, in order.
	dups map[RouteKey][]Route
}

// newTable returns an empty table with room for hint routes.
func newTable(f Family, id Table, hint int) *table {
	t := &table{family: f, id: id}
	if f == IPv4 {
		t.m4 = make(map[key4]val4, hint)
	} else {
		t.m6 = make(map[key6]val6, hint)
	}
	return t
}

func (t *table) len() int {
	n := len(t.m4) + len(t.m6)
	for _, d := range t.dups {
		n += len(d)
	}
	return n
}

// fits reports whether r can be stored in compact form.
func fits(r Route) bool {
	if r.NextHops != nil {
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

func (t *table) key4Route(k key4) RouteKey {
	return RouteKey{Family: IPv4, Table: t.id, Dst: netip.PrefixFrom(netip.AddrFrom4(k.dst), int(k.bits)), TOS: k.tos, Metric: k.metric}
}

func (t *table) key6Route(k key6) RouteKey {
	rk := RouteKey{Family: IPv6, Table: t.id, Dst: netip.PrefixFrom(netip.AddrFrom16(k.dst), int(k.bits)), Metric: k.metric}
	if k.srcBits != 0 {
		rk.Src = netip.PrefixFrom(netip.AddrFrom16(k.src), int(k.srcBits)-1)
	}
	return rk
}

func (t *table) route4(k key4, v val4) Route {
	rk := t.key4Route(k)
	if v.has&hasExtra != 0 {
		return t.extra[rk]
	}
	r := Route{Family: IPv4, Table: t.id, Dst: rk.Dst, TOS: k.tos, Metric: k.metric,
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

func (t *table) route6(k key6, v val6) Route {
	rk := t.key6Route(k)
	if v.has&hasExtra != 0 {
		return t.extra[rk]
	}
	r := Route{Family: IPv6, Table: t.id, Dst: rk.Dst, Src: rk.Src, Metric: k.metric,
		Index: v.oif, MTU: v.mtu, Flags: RouteFlags(v.flags), NHID: v.nhid,
		Protocol: Protocol(v.proto), Scope: Scope(v.scope), Type: RouteType(v.typ)}
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
		v, ok := t.m4[k4]
		if !ok {
			return Route{}, false
		}
		return t.route4(k4, v), true
	}
	k6 := mk6(k)
	v, ok := t.m6[k6]
	if !ok {
		return Route{}, false
	}
	return t.route6(k6, v), true
}

// getAll returns every route with key k, first one first.
func (t *table) getAll(k RouteKey) []Route {
	r, ok := t.get(k)
	if !ok {
		return nil
	}
	return append([]Route{r}, t.dups[k]...)
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
			t.m4[mk4(k)] = val4{has: hasExtra}
		} else {
			t.m6[mk6(k)] = val6{has: hasExtra}
		}
		return
	}
	delete(t.extra, k)
	if t.family == IPv4 {
		t.m4[mk4(k)] = pack4(r)
	} else {
		t.m6[mk6(k)] = pack6(r)
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
	if t.family == IPv4 {
		k4 := mk4(k)
		if _, ok := t.m4[k4]; ok {
			return false
		}
		t.m4[k4] = pack4(r)
		return true
	}
	k6 := mk6(k)
	if _, ok := t.m6[k6]; ok {
		return false
	}
	t.m6[k6] = pack6(r)
	return true
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
		proto: uint8(r.Protocol), scope: uint8(r.Scope), typ: uint8(r.Type)}
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
	if len(rs) == 0 {
		delete(t.extra, k)
		delete(t.dups, k)
		if t.family == IPv4 {
			delete(t.m4, mk4(k))
		} else {
			delete(t.m6, mk6(k))
		}
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

// all yields every route of the table.
func (t *table) all(yield func(Route) bool) bool {
	if t.family == IPv4 {
		for k, v := range t.m4 {
			if !yield(t.route4(k, v)) {
				return false
			}
			if len(t.dups) > 0 {
				for _, d := range t.dups[t.key4Route(k)] {
					if !yield(d) {
						return false
					}
				}
			}
		}
		return true
	}
	for k, v := range t.m6 {
		if !yield(t.route6(k, v)) {
			return false
		}
		if len(t.dups) > 0 {
			for _, d := range t.dups[t.key6Route(k)] {
				if !yield(d) {
					return false
				}
			}
		}
	}
	return true
}
