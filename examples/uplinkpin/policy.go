package main

import (
	"net/netip"

	"github.com/marksplit/marksplit/netwatch"
)

// Config is the policy: which marked packets leave by which uplink, and the
// table, rule priority and protocol it uses.
type Config struct {
	// Uplink is the name of the link marked packets must leave by.
	Uplink string
	// Mark and Mask select the packets to pin.
	Mark, Mask netwatch.Mark
	// Table and Priority are owned: every route in Table and every rule
	// at Priority, in both families, belong to the policy.
	Table    netwatch.Table
	Priority uint32
	// Protocol is stamped on every route and rule the policy installs.
	Protocol netwatch.Protocol
}

// IPv6 routes get this metric when none is given; the kernel reports it,
// so the desired route says it too.
const ipv6DefaultMetric = 1024

// Desired returns what the policy wants for the view, per family: while
// the uplink is up and has carrier and the main table has a default route
// out of it (as a DHCP client or router advertisements install), a default
// route in the table via the same gateway and out of the uplink, and the
// rule that sends marked packets to the table. Otherwise nothing for that
// family: Plan removes what the policy owns, and marked packets follow the
// main table.
func (c Config) Desired(v netwatch.View) netwatch.Desired {
	d := netwatch.Desired{Own: netwatch.Owned{
		Tables: []netwatch.OwnedTable{
			{Family: netwatch.IPv4, Table: c.Table},
			{Family: netwatch.IPv6, Table: c.Table},
		},
		Priorities: []netwatch.OwnedPriority{
			{Family: netwatch.IPv4, Priority: c.Priority},
			{Family: netwatch.IPv6, Priority: c.Priority},
		},
	}}
	link, ok := v.LinkByName(c.Uplink)
	if !ok || !link.Up() || !link.LowerUp() {
		return d
	}
	for _, f := range []netwatch.Family{netwatch.IPv4, netwatch.IPv6} {
		gw, flags, ok := gateway(v, f, link.Index)
		if !ok {
			continue
		}
		r := netwatch.Route{
			Family:   f,
			Table:    c.Table,
			Dst:      netip.PrefixFrom(netip.IPv4Unspecified(), 0),
			Gateway:  gw,
			Index:    link.Index,
			Protocol: c.Protocol,
			Scope:    netwatch.ScopeUniverse,
			Type:     netwatch.RouteUnicast,
			Flags:    flags,
		}
		if f == netwatch.IPv6 {
			r.Dst, r.Metric = netip.PrefixFrom(netip.IPv6Unspecified(), 0), ipv6DefaultMetric
		}
		d.Routes = append(d.Routes, r)
		d.Rules = append(d.Rules, netwatch.Rule{
			Family:   f,
			Priority: c.Priority,
			Table:    c.Table,
			Action:   netwatch.ActionToTable,
			Mark:     c.Mark,
			Mask:     c.Mask,
			Protocol: c.Protocol,
		})
	}
	return d
}

// gateway finds the uplink's current gateway of family f: the gateway of
// the main table's default route out of the uplink with the lowest metric,
// or of that route's path out of the uplink when it is multipath. flags
// carries the path's onlink flag, which a gateway outside the uplink's
// subnets needs. Routes the kernel considers dead are skipped, and so are
// routes through nexthop objects, whose gateway the route does not carry.
func gateway(v netwatch.View, f netwatch.Family, index uint32) (gw netip.Addr, flags netwatch.RouteFlags, ok bool) {
	var best netwatch.Route
	for r := range v.Routes(f, netwatch.TableMain) {
		if r.Dst.Bits() != 0 || r.Src.IsValid() || r.TOS != 0 || r.Type != netwatch.RouteUnicast {
			continue
		}
		hop, found := pathOut(r, index)
		if !found {
			continue
		}
		if !ok || r.Metric < best.Metric || r.Metric == best.Metric && hop.Gateway.Compare(gw) < 0 {
			best, gw, flags, ok = r, hop.Gateway, hop.Flags&netwatch.RouteOnlink, true
		}
	}
	return gw, flags, ok
}

// pathOut returns the path of r that leaves by the link with the given
// index through a gateway.
func pathOut(r netwatch.Route, index uint32) (netwatch.NextHop, bool) {
	hops := r.NextHops
	if hops == nil {
		hops = []netwatch.NextHop{{Gateway: r.Gateway, Index: r.Index, Flags: r.Flags}}
	}
	var found netwatch.NextHop
	ok := false
	for _, h := range hops {
		if h.Index != index || !h.Gateway.IsValid() || h.Flags&netwatch.RouteDead != 0 {
			continue
		}
		if !ok || h.Gateway.Compare(found.Gateway) < 0 {
			found, ok = h, true
		}
	}
	return found, ok
}
