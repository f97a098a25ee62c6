package mtupolicy

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/marksplit/marksplit/netwatch"
	"github.com/marksplit/marksplit/netwatch/reconcile"
)

// DesiredPeers is the policy for cfg.Peers: it returns the state cfg wants
// for v in mode when peers are the addresses of the encrypting peer nodes
// (every InternalIP of every other node whose CiliumNode has an encryption
// key). ok is false when nothing may be edited at all: cfg.Peers is not
// set, the mode is unknown, the view is not synced, or cfg is not valid.
// The caller must not call it before it knows the peers (its first good
// list of the nodes): an empty peers removes every host route.
//
// Off, or the tunnel link missing, down or at MTU 0: the owned scope and
// nothing else, as Desired. A family below its MinMTU gets nothing either.
//
// On, for each peer address a of a family that is split:
//
//   - The path: the route the main table uses for a now, by longest-prefix
//     match over the first route of each key (the one the kernel uses),
//     the default route included. Only routes that match every packet to
//     a take part: no TOS, no source prefix, not dead (the kernel passes
//     over a dead route to the next one); among equal prefixes the lowest
//     metric wins.
//   - A host route a/32 or a/128 in cfg.Table through that path: its
//     gateway (none when a is on a connected subnet: the route then leaves
//     by the link, scope link), output link, scope and route flags; src
//     from the path's prefsrc, else the output link's primary address whose
//     subnet holds a, else as Desired chooses (gateway's subnet, first
//     global); MTU TableMTU(tunnel, output link), or the peer's inner
//     MTU from inner where that is smaller (PeerMTU: never below the
//     family's minimum, which a note names instead), never locked, so that
//     ICMP can still lower it; metric 0 (IPv6: the
//     kernel's default, 1024, as Plan takes it); type unicast, cfg.Protocol.
//   - No host route when the path is not a single-path unicast route out of
//     a link of its own (multipath, nexthop object, blackhole, unreachable,
//     prohibit, throw), leaves by the tunnel link, has a gateway of the
//     other family, or there is no path at all: such a peer keeps whatever
//     the main table gives it (a note names the multipath routes). None
//     for an address of this host either (the local table answers first),
//     nor a link-local or multicast one (Cilium encrypts neither).
//   - A throw route in cfg.Table for each main route with a TOS or a source
//     prefix that covers a at least as specifically as the path: for the
//     packets it matches the kernel would take it over the path, so they go
//     on to the main table rather than take the host route.
//   - One rule, not fwmark Mark/Mask lookup Table, when the family has host
//     routes.
//   - With cfg.Repair, each non-default path whose MTU equals the tunnel
//     MTU loses its explicit MTU, as in Desired (never a `proto kernel`
//     one: Cilium's). The default route is
//     never repaired: its MTU is the operator's (a route edited by the old
//     approach is one the split covered, never the default).
//
// Host routes cover nothing but their own address, so a more specific main
// route cannot lie inside one: the throw routes of Desired are not needed.
// A change of the main table moves the host routes with their paths at the
// next pass, and a table left by prefix mode is replaced wholesale: the
// table is owned, so whatever the peers do not want in it goes.
func DesiredPeers(v netwatch.View, cfg Config, mode Mode, peers []netip.Addr, inner InnerMTUs) (d reconcile.Desired, ok bool) {
	var c PeerCache
	return c.DesiredPeers(v, cfg, mode, peers, inner)
}

// InnerMTUs holds, by peer address, the largest inner packet the path to
// that peer carries (internal/pathmtu measures it: floor16(P − 60) for a
// path of P bytes on an IPv4 underlay, floor16(P − 80) on IPv6). A peer
// not in it, or at 0, is not known: its host route gets the tunnel MTU as
// before. nil knows no peer.
type InnerMTUs map[netip.Addr]uint32

// PeerMTU is the MTU of the host route to a peer of family f whose path
// carries inner packets of at most inner bytes (0: not known), when the
// route would otherwise get table (TableMTU): the smaller of the two. A
// value below the family's minimum (MinMTU) is not installed: the route
// keeps table, and below reports it.
func PeerMTU(f netwatch.Family, table, inner uint32) (mtu uint32, below bool) {
	switch {
	case inner == 0 || inner >= table:
		return table, false
	case inner < MinMTU(f):
		return table, true
	}
	return inner, false
}

// peerNotes adds to d a note per main route that peers of family f are
// reached through but that has no single path to copy (multipath or a
// nexthop object): those peers keep the interface MTU.
func peerNotes(idx mainIndex, f netwatch.Family, peers []netip.Addr, d *reconcile.Desired) {
	noted := make(map[netwatch.RouteKey]bool)
	for _, a := range peers {
		if a = a.Unmap(); netwatch.FamilyOf(a) != f || !a.IsValid() {
			continue
		}
		if path, ok := idx.lookup(a); ok && (path.NextHops != nil || path.NHID != 0) && !noted[path.Key()] {
			noted[path.Key()] = true
			d.Notes = append(d.Notes, fmt.Sprintf("%v: peers reached through main route %v keep the interface MTU: it has no single path to copy (multipath or a nexthop object)",
				f, path.Dst))
		}
	}
}

// peerFamily adds to d the host routes, throws, rule and repairs of family
// f.
func (c Config) peerFamily(v netwatch.View, f netwatch.Family, tun netwatch.Link, peers []netip.Addr, inner InnerMTUs, d *reconcile.Desired, idx mainIndex) {
	peerNotes(idx, f, peers, d)
	srcs := newSources(v, f)
	n := 0 // host routes, in d.Routes (desired made it)
	var throws []netwatch.Route
	seenThrow := make(map[netwatch.RouteKey]bool)
	repaired := make(map[netwatch.RouteKey]bool)
	var lastRepaired netwatch.RouteKey
	for _, a := range uniqueAddrs(peers) {
		a = a.Unmap()
		if netwatch.FamilyOf(a) != f || !a.IsValid() || a.Zone() != "" || srcs.local[a] {
			continue
		}
		dst := netip.PrefixFrom(a, a.BitLen())
		if unencrypted(dst) {
			continue
		}
		path, ok := idx.lookup(a)
		if !ok {
			continue
		}
		out, ok := c.peerPath(v, path, tun)
		if !ok {
			continue
		}
		mtu, below := PeerMTU(f, TableMTU(tun, out), inner[a])
		if below {
			d.Notes = append(d.Notes, belowNote(f, a, inner[a]))
		}
		h := netwatch.Route{
			Family:   f,
			Table:    c.Table,
			Dst:      dst,
			Gateway:  path.Gateway,
			Index:    path.Index,
			PrefSrc:  srcs.of(path, a),
			MTU:      mtu,
			Protocol: c.Protocol,
			Scope:    path.Scope,
			Type:     netwatch.RouteUnicast,
			Flags:    path.Flags,
		}
		d.Routes.Add(h)
		n++
		for _, s := range idx.selective {
			if !s.Dst.Contains(a) || s.Dst.Bits() < path.Dst.Bits() {
				continue
			}
			t := netwatch.Route{Family: f, Table: c.Table, Dst: dst, Src: s.Src, TOS: s.TOS, Metric: h.Metric,
				Protocol: c.Protocol, Type: netwatch.RouteThrow}
			if f == netwatch.IPv6 {
				t.Index = loopback(v) // the kernel hangs IPv6 throw routes on lo and says so
			}
			if !seenThrow[t.Key()] {
				seenThrow[t.Key()] = true
				throws = append(throws, t)
			}
		}
		if c.Repair && path.Dst.Bits() != 0 && path.MTU == tun.MTU && out.MTU != 0 && out.MTU != tun.MTU && path.Protocol != netwatch.ProtoKernel {
			if k := path.Key(); k != lastRepaired && !repaired[k] {
				repaired[k], lastRepaired = true, k
				d.Repairs = append(d.Repairs, repair(path))
			}
		}
	}
	if n == 0 {
		return
	}
	d.Routes.Add(throws...)
	d.Rules = append(d.Rules, c.rule(f))
}

// belowNote is the note for a peer a of family f whose path carries inner
// packets of only inner bytes, below the family's minimum.
func belowNote(f netwatch.Family, a netip.Addr, inner uint32) string {
	return fmt.Sprintf("%v: the path to peer %v carries inner packets of at most %d bytes, below the family's minimum %d: its route keeps the tunnel MTU (clamp TCP MSS, or lower Cilium's MTU)",
		f, a, inner, MinMTU(f))
}

// uniqueAddrs returns as without duplicates: as itself when it is sorted
// and has none (the agent's peers are), else a sorted copy.
func uniqueAddrs(as []netip.Addr) []netip.Addr {
	sorted := true
	for i := 1; i < len(as) && sorted; i++ {
		sorted = as[i-1].Less(as[i])
	}
	if sorted {
		return as
	}
	as = slices.Clone(as)
	slices.SortFunc(as, netip.Addr.Compare)
	return slices.Compact(as)
}

// peerPath reports whether the main route r is a path a host route can
// copy, and its output link.
func (c Config) peerPath(v netwatch.View, r netwatch.Route, tun netwatch.Link) (netwatch.Link, bool) {
	switch {
	case r.Type != netwatch.RouteUnicast, r.NextHops != nil, r.NHID != 0, r.Index == 0, r.Index == tun.Index,
		r.Gateway.IsValid() && r.Gateway.Is4() != (r.Family == netwatch.IPv4):
		return netwatch.Link{}, false
	}
	return v.Link(r.Index)
}

// sources chooses the source addresses of host routes in one family: the
// view's addresses sorted out once, and prefSrc's answer once per path.
type sources struct {
	v      netwatch.View
	f      netwatch.Family
	local  map[netip.Addr]bool        // this host's addresses
	byLink map[uint32][]netwatch.Addr // primary's answers, by link
	memo   map[netwatch.RouteKey]netip.Addr
}

func newSources(v netwatch.View, f netwatch.Family) *sources {
	s := &sources{v: v, f: f, local: make(map[netip.Addr]bool), byLink: make(map[uint32][]netwatch.Addr), memo: make(map[netwatch.RouteKey]netip.Addr)}
	for a := range v.Addrs(0) {
		ip := a.Prefix.Addr().Unmap()
		if netwatch.FamilyOf(ip) != f {
			continue
		}
		s.local[ip] = true
	}
	return s
}

// primary returns the primary global addresses of link index that a
// connection may use as its source, lowest first: those SourceAddrs lists
// first.
func (s *sources) primary(index uint32) []netwatch.Addr {
	as, ok := s.byLink[index]
	if ok {
		return as
	}
	for _, a := range s.v.SourceAddrs(index, s.f) {
		if a.Flags&netwatch.AddrSecondary != 0 || a.Scope != netwatch.ScopeUniverse || a.Prefix.Addr().IsLinkLocalUnicast() {
			break // the global primary ones come first
		}
		as = append(as, a)
	}
	s.byLink[index] = as
	return as
}

// of is the source address of the host route to a through path: its
// prefsrc, else the output link's primary address whose subnet holds a (a
// peer on a connected subnet), else what prefSrc finds for a host route
// through path (the address whose subnet holds the gateway, else the
// link's first global one).
func (s *sources) of(path netwatch.Route, a netip.Addr) netip.Addr {
	if path.PrefSrc.IsValid() {
		return path.PrefSrc
	}
	for _, ad := range s.primary(path.Index) {
		if ad.Prefix.Masked().Contains(a) {
			return ad.Prefix.Addr().Unmap()
		}
	}
	k := path.Key()
	if src, ok := s.memo[k]; ok {
		return src
	}
	host := path
	host.Dst = netip.PrefixFrom(a, a.BitLen()) // holds no address of this host
	src := prefSrc(s.v, host)
	s.memo[k] = src
	return src
}

// mainTable is what the peer policy knows of one family of the main
// table, kept from pass to pass by a PeerCache.
type mainTable struct {
	// byLen holds, per prefix length, the metric of the route each
	// destination uses: of the routes that match every packet, the one of
	// lowest metric. That and the destination are its key: lookup reads
	// the route itself from the view, for the few destinations asked.
	byLen map[int]map[netip.Prefix]uint32
	lens  []int // the keys of byLen, longest first
	// selective are the routes with a TOS or a source prefix: they match
	// only some packets.
	selective []netwatch.Route
}

// mainIndex answers longest-prefix matches on one family of the main
// table, in one pass.
type mainIndex struct {
	*mainTable
	v netwatch.View
	f netwatch.Family
	// found memoizes the routes lookup read: peers share their paths.
	found map[netip.Prefix]netwatch.Route
}

func newMainIndex(v netwatch.View, f netwatch.Family, t *mainTable) mainIndex {
	return mainIndex{mainTable: t, v: v, f: f, found: make(map[netip.Prefix]netwatch.Route)}
}

// walkMain reads family f of the main table into a mainTable.
func walkMain(v netwatch.View, f netwatch.Family) *mainTable {
	idx := &mainTable{byLen: make(map[int]map[netip.Prefix]uint32)}
	var last netwatch.RouteKey
	for r := range v.Routes(f, netwatch.TableMain) {
		// Routes yields the routes of a key together, the first (the
		// one the kernel uses) first.
		k := r.Key()
		if k == last && last.Dst.IsValid() {
			continue
		}
		last = k
		switch {
		case r.TOS != 0 || r.Src.IsValid():
			idx.selective = append(idx.selective, r)
			continue
		case r.Flags&netwatch.RouteDead != 0:
			continue
		}
		m := idx.byLen[r.Dst.Bits()]
		if m == nil {
			m = make(map[netip.Prefix]uint32)
			idx.byLen[r.Dst.Bits()] = m
			idx.lens = append(idx.lens, r.Dst.Bits())
		}
		if o, ok := m[r.Dst]; !ok || r.Metric < o {
			m[r.Dst] = r.Metric
		}
	}
	slices.SortFunc(idx.lens, func(a, b int) int { return b - a })
	return idx
}

// A PeerCache keeps the peer policy's index of the main table from one
// pass to the next, and walks the table again only when the view's
// journal (View.Changes) shows a change of it since, or cannot tell: the
// journal lost changes, the view is not synced, or it has no journal (a
// Snapshot's). A pass after any other change (a pod's veth, an address,
// another table, the policy's own routes) then costs what the peers cost,
// not what the main table does. The zero value is ready. A PeerCache is
// for the views of one Watcher, one pass at a time (a Reconciler's
// policy).
type PeerCache struct {
	mark   uint64
	tables [2]*mainTable // by family, IPv4 first; nil: walk it
	walks  int           // for tests: how many walks of the main table
}

// DesiredPeers is the package's DesiredPeers, with c's index.
func (c *PeerCache) DesiredPeers(v netwatch.View, cfg Config, mode Mode, peers []netip.Addr, inner InnerMTUs) (reconcile.Desired, bool) {
	c.follow(v)
	if !cfg.Peers {
		return reconcile.Desired{}, false
	}
	return cfg.desired(v, mode, func(v netwatch.View, f netwatch.Family, tun netwatch.Link, d *reconcile.Desired) {
		fi := famIndex(f)
		if c.tables[fi] == nil {
			c.tables[fi] = walkMain(v, f)
			c.walks++
		}
		cfg.peerFamily(v, f, tun, peers, inner, d, newMainIndex(v, f, c.tables[fi]))
	})
}

// follow drops the index of each family whose main table changed since
// the last view c saw.
func (c *PeerCache) follow(v netwatch.View) {
	changes, next, complete := v.Changes(c.mark)
	c.mark = next
	if c.tables == ([2]*mainTable{}) {
		return // nothing kept to drop
	}
	if v.Changed() == nil || !complete || !v.Synced() {
		// A Snapshot's view (it has no journal), or one that cannot tell.
		c.tables = [2]*mainTable{}
	} else {
		for ev := range changes {
			if ev.Kind == netwatch.KindRoute && ev.Route.Table == netwatch.TableMain {
				c.tables[famIndex(ev.Route.Family)] = nil
			}
		}
	}
}

func famIndex(f netwatch.Family) int {
	if f == netwatch.IPv6 {
		return 1
	}
	return 0
}

// route returns the main route of destination p and the metric the index
// holds for it (the first of its key), from the view once a pass.
func (idx mainIndex) route(p netip.Prefix, metric uint32) (netwatch.Route, bool) {
	if r, ok := idx.found[p]; ok {
		return r, true
	}
	for r := range idx.v.Route(netwatch.RouteKey{Family: idx.f, Table: netwatch.TableMain, Dst: p, Metric: metric}) {
		idx.found[p] = r
		return r, true
	}
	return netwatch.Route{}, false // not in this view: a PeerCache would have walked again
}

// lookup returns the main route for a.
func (idx mainIndex) lookup(a netip.Addr) (netwatch.Route, bool) {
	for _, bits := range idx.lens {
		p, err := a.Prefix(bits)
		if err != nil {
			continue
		}
		if metric, ok := idx.byLen[bits][p]; ok {
			if r, ok := idx.route(p, metric); ok {
				return r, true
			}
		}
	}
	return netwatch.Route{}, false
}
