package mtupolicy

import (
	"fmt"
	"iter"
	"net/netip"
	"slices"
	"strconv"

	"github.com/marksplit/marksplit/netwatch"
	"github.com/marksplit/marksplit/netwatch/reconcile"
)

// Mode is the node's encryption mode, as far as the caller knows it.
type Mode int

// Modes.
const (
	// ModeUnknown: no good read of the mode yet. Nothing may be edited.
	ModeUnknown Mode = iota
	// ModeOn: the node encrypts; split the selected routes.
	ModeOn
	// ModeOff: the node is opted out; remove everything owned.
	ModeOff
)

func (m Mode) String() string {
	switch m {
	case ModeUnknown:
		return "unknown"
	case ModeOn:
		return "on"
	case ModeOff:
		return "off"
	}
	return "unknown(" + strconv.Itoa(int(m)) + ")"
}

// Desired returns the state cfg wants for v in mode. ok is false when
// nothing may be edited at all: the mode is unknown, the view is not
// synced, or cfg is not valid. The caller must then not plan.
//
// Off, or the tunnel link missing, down or at MTU 0: the owned scope and
// nothing else, so Plan removes every route in the table and every rule at
// the priority. A family whose minimum MTU (MinMTU) the tunnel's is below
// is not split either (Notes says so).
//
// On, with the tunnel link present, per family:
//
//   - Each selected main-table route gets a table route: same destination,
//     source prefix, tos, metric, gateway, output link, scope and
//     route flags; type unicast; src from the route's own prefsrc, else
//     the output link's primary address inside the destination, else the
//     one whose subnet holds the gateway, else its first global one; the
//     tunnel link's live MTU; cfg.Protocol. Where several main routes
//     share a key (ip route append), only the first, the one the kernel
//     uses, counts.
//   - A main-table route that is not split but lies inside (or equals the
//     destination of) a table route gets a throw route with its key, so
//     that unmarked packets for it fall through to the main table instead
//     of taking the covering table route: a more specific route out of
//     another link, or out of the tunnel link itself, keeps working.
//   - One rule, not fwmark Mark/Mask lookup Table, when the family has
//     table routes.
//   - With cfg.Repair, each selected main route whose MTU equals the tunnel
//     MTU loses its explicit MTU, and so follows its output link's again (a
//     repair that changes nothing else); a route with any other MTU, or
//     none, is left alone, and so is a `proto kernel` route with an explicit
//     MTU: Cilium writes those (its route reconciler stores an MTU per route
//     and re-asserts it about every second), and the old approach never did
//     (its `ip route replace` stamps `proto boot`): repairing one would be a
//     fight without end.
//
// Selected means: table main, type unicast, single path (no multipath, no
// nexthop object) with an output link, a gateway of its own family if any,
// not the default route, not a link-local or multicast destination (Cilium
// never encrypts those), not out of the tunnel link; and either its
// destination equals or lies inside one of cfg.Prefixes, or its output
// link is cfg.UnderlayLink.
//
// Metrics: a table route keeps its main route's metric. Keys then map one
// to one, so two main routes to one destination with different metrics (a
// primary and a backup path) keep their order in the table, and a key
// stays put as long as the main route does.
//
// Multipath routes (RTA_MULTIPATH or a nexthop object) are not split and
// not repaired: their paths may leave through different links with
// different MTUs and addresses, so no single table route mirrors them. They
// keep working at the interface MTU through the main table, and, when a
// table route covers them, a throw route sends their packets there.
//
// With cfg.Peers, Desired knows no peers: only ModeOff (the owned scope, to
// empty it, as cleanup does) is ok; DesiredPeers is the policy then. So
// with cfg.Mesh and DesiredMesh.
func Desired(v netwatch.View, cfg Config, mode Mode) (d reconcile.Desired, ok bool) {
	if (cfg.Peers || cfg.Mesh) && mode != ModeOff {
		return reconcile.Desired{}, false
	}
	return cfg.desired(v, mode, cfg.family)
}

// desired is what Desired and DesiredPeers share: nothing unless the mode
// is known, v synced and c valid; the owned scope; and, on, split for each
// family the tunnel link is up and large enough for, with a note (logged
// once by the Reconciler) for each reason it splits nothing, or nothing of
// a family: the tunnel link is missing or down, or its MTU is below a
// family's minimum.
func (c Config) desired(v netwatch.View, mode Mode, split func(netwatch.View, netwatch.Family, netwatch.Link, *reconcile.Desired)) (d reconcile.Desired, ok bool) {
	if mode != ModeOn && mode != ModeOff || !v.Synced() || c.Validate() != nil {
		return reconcile.Desired{}, false
	}
	d.Own = reconcile.Own(reconcile.OwnTable(c.Table), reconcile.OwnPriority(c.Priority))
	if mode == ModeOff {
		return d, true
	}
	tun, ok := v.LinkByName(c.TunnelLink)
	switch {
	case !ok:
		d.Notes = []string{"tunnel link " + c.TunnelLink + " does not exist: nothing is split"}
		return d, true
	case tun.Flags&netwatch.LinkUp == 0 || tun.MTU == 0:
		d.Notes = []string{"tunnel link " + c.TunnelLink + " is down: nothing is split"}
		return d, true
	}
	// The table routes (one for each main route, with --underlay-link)
	// and throws, at an eighth of a []Route's memory.
	d.Routes = new(netwatch.RouteSet)
	for _, f := range []netwatch.Family{netwatch.IPv4, netwatch.IPv6} {
		if min := MinMTU(f); tun.MTU < min {
			d.Notes = append(d.Notes, fmt.Sprintf("%v: tunnel link %s's MTU %d is below the family's minimum %d: %v is not split",
				f, tun.Name, tun.MTU, min, f))
			continue
		}
		split(v, f, tun, &d)
	}
	return d, true
}

// MinMTU is the smallest MTU a family allows: 1280 for IPv6 (RFC 8200), 68
// for IPv4 (RFC 791). A tunnel below it does not carry that family, so
// routes at its MTU would make the host fragment: that family is not split.
func MinMTU(f netwatch.Family) uint32 {
	if f == netwatch.IPv6 {
		return 1280
	}
	return 68
}

// TableMTU is the MTU of a table route out of link out: the tunnel's,
// unless out's is smaller. A packet sized for the tunnel but too big for
// the link it leaves by would be dropped there (or fragmented).
func TableMTU(tun, out netwatch.Link) uint32 {
	if out.MTU != 0 && out.MTU < tun.MTU {
		return out.MTU
	}
	return tun.MTU
}

// repair is the lowered main route r as it is to be: without an explicit
// MTU, so that it follows its link's, and otherwise unchanged. The old
// approach gave a route that had no MTU of its own the tunnel's; dropping
// it undoes that exactly and keeps the route right when the link's MTU
// changes later. The lowered MTU's lock goes with it.
func repair(r netwatch.Route) netwatch.Route {
	r.MTU = 0
	r.Metrics.Locks &^= lockMTU
	return r.Clean()
}

// lockMTU is the MTU's bit in netwatch.Metrics.Locks: 1<<RTAX_MTU
// (golang.org/x/sys/unix names RTAX_MTU on Linux only, and the policy
// builds everywhere).
const lockMTU = 1 << 2

// rule is the rule for family f exactly as the kernel reports it back:
// FRA_SUPPRESS_PREFIXLEN comes back as -1, which is unset.
func (c Config) rule(f netwatch.Family) netwatch.Rule {
	return netwatch.Rule{
		Family:   f,
		Priority: c.Priority,
		Table:    c.Table,
		Action:   netwatch.ActionToTable,
		Invert:   true,
		Mark:     c.Mark,
		Mask:     c.Mask,
		Protocol: c.Protocol,
	}
}

func (c Config) family(v netwatch.View, f netwatch.Family, tun netwatch.Link, d *reconcile.Desired) {
	var rest []netwatch.Route
	srcs := make(map[uint32][]netwatch.Addr) // SourceAddrs by link, asked once per pass
	n := 0
	for r := range c.candidates(v, f) {
		out, ok := c.selects(v, r, tun)
		if !ok {
			rest = append(rest, r)
			continue
		}
		t := netwatch.Route{
			Family:   r.Family,
			Table:    c.Table,
			Dst:      r.Dst,
			Src:      r.Src,
			TOS:      r.TOS,
			Metric:   r.Metric,
			Gateway:  r.Gateway,
			Index:    r.Index,
			PrefSrc:  prefSrcOf(srcs, v, r),
			MTU:      TableMTU(tun, out),
			Protocol: c.Protocol,
			Scope:    r.Scope,
			Type:     netwatch.RouteUnicast,
			Flags:    r.Flags,
		}
		d.Routes.Add(t)
		n++
		if c.Repair && r.MTU == tun.MTU && out.MTU != 0 && out.MTU != tun.MTU && r.Protocol != netwatch.ProtoKernel {
			d.Repairs = append(d.Repairs, repair(r))
		}
	}
	if n == 0 {
		return
	}
	lo := loopback(v)
	// A main route left out gets a throw where a table route covers it.
	var dsts []netip.Prefix // of the table routes, sorted
	if len(rest) > 0 {
		for t := range d.Routes.All() {
			if t.Family == f {
				dsts = append(dsts, t.Dst)
			}
		}
		slices.SortFunc(dsts, netip.Prefix.Compare)
		dsts = slices.Compact(dsts)
	}
	var throws []netwatch.Route
	seen := make(map[netwatch.RouteKey]bool) // of the throws: one route per key
	for _, m := range rest {
		t := netwatch.Route{
			Family:   m.Family,
			Table:    c.Table,
			Dst:      m.Dst,
			Src:      m.Src,
			TOS:      m.TOS,
			Metric:   m.Metric,
			Protocol: c.Protocol,
			Scope:    netwatch.ScopeUniverse,
			Type:     netwatch.RouteThrow,
		}
		if f == netwatch.IPv6 {
			t.Index = lo // the kernel hangs IPv6 throw routes on lo and says so
		}
		if _, split := d.Routes.Get(t.Key()); split || seen[t.Key()] || !covered(dsts, m.Dst) {
			continue
		}
		seen[t.Key()] = true
		throws = append(throws, t)
	}
	d.Routes.Add(throws...)
	d.Rules = append(d.Rules, c.rule(f))
}

// covered reports whether a prefix of dsts (sorted, by netip.Prefix.Compare)
// covers p.
func covered(dsts []netip.Prefix, p netip.Prefix) bool {
	for bits := p.Bits(); bits >= 0; bits-- {
		if _, ok := slices.BinarySearchFunc(dsts, netip.PrefixFrom(p.Addr(), bits).Masked(), netip.Prefix.Compare); ok {
			return true
		}
	}
	return false
}

// candidates yields the main routes of family f that the split may select,
// the first of each key (the one the kernel uses): those inside
// cfg.Prefixes, found without walking the rest of a full table, sorted by
// key, or with cfg.UnderlayLink every main route, in the table's order
// (which Plan does not depend on). A route a table route covers lies
// inside the prefix that table route lies in, so the throws need nothing
// else.
func (c Config) candidates(v netwatch.View, f netwatch.Family) iter.Seq[netwatch.Route] {
	if c.UnderlayLink != "" {
		// Every main route is a candidate, and the first route of each
		// key is the one the table yields first.
		return func(yield func(netwatch.Route) bool) {
			var last netwatch.RouteKey
			first := true
			for r := range v.Routes(f, netwatch.TableMain) {
				if k := r.Key(); first || k != last {
					first, last = false, k
					if !yield(r) {
						return
					}
				}
			}
		}
	}
	seen := make(map[netwatch.RouteKey]bool)
	var mains []netwatch.Route
	for _, p := range c.Prefixes {
		if netwatch.FamilyOf(p.Addr()) != f {
			continue
		}
		for r := range v.RoutesWithin(netwatch.TableMain, p) {
			// The routes of a key come together, the kernel's first.
			if k := r.Key(); !seen[k] {
				seen[k] = true
				mains = append(mains, r)
			}
		}
	}
	slices.SortFunc(mains, func(a, b netwatch.Route) int { return a.Key().Compare(b.Key()) })
	return slices.Values(mains)
}

// selects reports whether the main-table route r is split, and its
// output link.
func (c Config) selects(v netwatch.View, r netwatch.Route, tun netwatch.Link) (netwatch.Link, bool) {
	switch {
	case r.Type != netwatch.RouteUnicast, r.Dst.Bits() == 0, r.NextHops != nil, r.NHID != 0, r.Index == 0,
		r.Index == tun.Index, r.Gateway.IsValid() && r.Gateway.Is4() != (r.Family == netwatch.IPv4),
		unencrypted(r.Dst):
		return netwatch.Link{}, false
	}
	out, ok := v.Link(r.Index)
	if !ok {
		return netwatch.Link{}, false
	}
	if c.UnderlayLink != "" && out.Name == c.UnderlayLink {
		return out, true
	}
	for _, p := range c.Prefixes {
		if covers(p, r.Dst) {
			return out, true
		}
	}
	return netwatch.Link{}, false
}

// covers reports whether p equals or contains q.
func covers(p, q netip.Prefix) bool {
	return p.Bits() <= q.Bits() && p.Contains(q.Addr())
}

var unencryptedRanges = []netip.Prefix{
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("224.0.0.0/4"),
	netip.MustParsePrefix("fe80::/10"),
	netip.MustParsePrefix("ff00::/8"),
}

// unencrypted reports whether dst is link-local or multicast.
func unencrypted(dst netip.Prefix) bool {
	return slices.ContainsFunc(unencryptedRanges, func(p netip.Prefix) bool { return covers(p, dst) })
}

// prefSrc returns the source address for the table route made from r: its
// own prefsrc, else the output link's primary address of r's family inside
// r's destination, else the one whose subnet holds the gateway, else the
// first global one, in View.SourceAddrs's order; none (the kernel chooses)
// when the link has no usable address (none not tentative, failed or deprecated).
func prefSrc(v netwatch.View, r netwatch.Route) netip.Addr {
	return prefSrcOf(nil, v, r)
}

// prefSrcOf is prefSrc with the SourceAddrs of each link kept in srcs (when
// not nil) for the next route out of it: a table of 100,000 routes out of
// one link asks once.
func prefSrcOf(srcs map[uint32][]netwatch.Addr, v netwatch.View, r netwatch.Route) netip.Addr {
	if r.PrefSrc.IsValid() {
		return r.PrefSrc
	}
	as, ok := srcs[r.Index]
	if !ok {
		as = v.SourceAddrs(r.Index, r.Family)
		if srcs != nil {
			srcs[r.Index] = as
		}
	}
	var inDst, byGW, global netip.Addr
	for _, a := range as {
		ip := a.Prefix.Addr()
		if a.Flags&netwatch.AddrSecondary != 0 {
			continue
		}
		if !inDst.IsValid() && r.Dst.Contains(ip) {
			inDst = ip
		}
		if a.Scope != netwatch.ScopeUniverse || ip.IsLinkLocalUnicast() {
			continue
		}
		if !byGW.IsValid() && r.Gateway.IsValid() && a.Prefix.Masked().Contains(r.Gateway) {
			byGW = ip
		}
		if !global.IsValid() {
			global = ip
		}
	}
	switch {
	case inDst.IsValid():
		return inDst
	case byGW.IsValid():
		return byGW
	}
	return global
}

// loopback returns the index of the loopback link, or 0.
func loopback(v netwatch.View) uint32 {
	for l := range v.Links() {
		if l.Flags&netwatch.LinkLoopback != 0 || l.Name == "lo" {
			return l.Index
		}
	}
	return 0
}
