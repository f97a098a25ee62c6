package netwatch

import (
	"cmp"
	"net/netip"
	"slices"
)

// The questions every policy asks a View, answered once. Each returns a
// new slice, in the order its doc says; none is cheap enough for a loop
// over a large table (each walks the table it reads).

// SourceAddrs returns the addresses of family f on link index that a new
// connection may use as its source (not tentative, failed or deprecated), for a route's PrefSrc:
// global ones (ScopeUniverse, not IPv6 link-local) before the others, then
// primary ones before secondary (in IPv6, temporary) ones, then lowest
// first. It returns addresses of every scope (host and link ones after the
// global), each address once.
func (v View) SourceAddrs(index uint32, f Family) []Addr {
	var as []Addr
	for a := range v.Addrs(index) {
		if FamilyOf(a.Prefix.Addr()) == f && a.usable() {
			as = append(as, a)
		}
	}
	rank := func(a Addr) int {
		n := 0
		if !a.global() {
			n += 2
		}
		if a.Flags&AddrSecondary != 0 {
			n++
		}
		return n
	}
	slices.SortStableFunc(as, func(a, b Addr) int { return cmp.Compare(rank(a), rank(b)) })
	return as
}

// global reports whether the address has global scope and is not an IPv6
// link-local one.
func (a Addr) global() bool {
	return a.Scope == ScopeUniverse && !a.Prefix.Addr().IsLinkLocalUnicast()
}

// routesTo returns the routes of family FamilyOf(dst) in table t whose
// destination is dst, whatever their source, TOS and metric: lowest metric
// first (then by source and TOS), the order in which the kernel prefers
// them. Routes that share a key come in the kernel's order.
func (v View) routesTo(t Table, dst netip.Prefix) []Route {
	var rs []Route
	for r := range v.Routes(FamilyOf(dst.Addr()), t) {
		if r.Dst == dst {
			rs = append(rs, r)
		}
	}
	slices.SortStableFunc(rs, func(a, b Route) int {
		return cmp.Or(cmp.Compare(a.Metric, b.Metric), compareRoutes(a, b))
	})
	return rs
}

// DefaultRoutes returns the default routes of family f in table t out of
// link index (its own link, or a live path's), or out of any link when
// index is 0: unicast
// routes to 0.0.0.0/0 or ::/0 without a source prefix or TOS, lowest
// metric first, the one the kernel uses. Two of them can share a key (an
// IPv4 table may hold routes that differ only beyond it, `ip route
// append`): a policy that copies them into one table copies the first
// per metric, since a Desired holds one route per key.
func (v View) DefaultRoutes(f Family, t Table, index uint32) []Route {
	var rs []Route
	for r := range v.Routes(f, t) {
		if r.Dst.Bits() != 0 || r.Src.IsValid() || r.TOS != 0 || r.Type != RouteUnicast {
			continue
		}
		if _, ok := r.PathOut(index); ok || index == 0 {
			rs = append(rs, r)
		}
	}
	slices.SortStableFunc(rs, compareRoutes)
	return rs
}

// paths returns the route's paths: its NextHops when it is multipath, else
// one made of its own gateway, link and flags. A route through a nexthop
// object (NHID) has none.
func (r Route) paths() []NextHop {
	if r.NextHops != nil {
		return r.NextHops
	}
	if r.NHID != 0 || r.Index == 0 {
		return nil
	}
	return []NextHop{{Gateway: r.Gateway, Index: r.Index, Flags: r.Flags}}
}

// PathOut returns the route's path out of link index that the kernel has
// not marked dead; when several are, the one with the lowest gateway.
func (r Route) PathOut(index uint32) (NextHop, bool) {
	var found NextHop
	ok := false
	for _, h := range r.paths() {
		if h.Index != index || h.Flags&RouteDead != 0 {
			continue
		}
		if !ok || h.Gateway.Compare(found.Gateway) < 0 {
			found, ok = h, true
		}
	}
	return found, ok
}
