package main

import (
	"net/netip"

	"github.com/marksplit/marksplit/netwatch"
	"github.com/marksplit/marksplit/netwatch/reconcile"
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

// Desired returns what the policy wants for the view, per family: while
// the uplink is up and has carrier and the main table has a default route
// out of it (as a DHCP client or router advertisements install), a default
// route in the table via the same gateway and out of the uplink, and the
// rule that sends marked packets to the table. Otherwise nothing for that
// family: Plan removes what the policy owns, and marked packets follow the
// main table.
func (c Config) Desired(v netwatch.View) reconcile.Desired {
	d := reconcile.Desired{Own: reconcile.Own(reconcile.OwnTable(c.Table), reconcile.OwnPriority(c.Priority)), Routes: new(netwatch.RouteSet)}
	link, ok := v.LinkByName(c.Uplink)
	switch {
	case !ok:
		d.Notes = []string{"uplinkpin: uplink " + c.Uplink + " does not exist: marked packets follow the main table"}
		return d
	case link.Flags&netwatch.LinkUp == 0 || link.Flags&netwatch.LinkLowerUp == 0:
		d.Notes = []string{"uplinkpin: uplink " + c.Uplink + " is down: marked packets follow the main table"}
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
			r.Dst = netip.PrefixFrom(netip.IPv6Unspecified(), 0)
		}
		d.Routes.Add(r)
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
// the main table's default route out of the uplink with the lowest metric
// (View.DefaultRoutes), or of that route's path out of the uplink when it
// is multipath (Route.PathOut). flags carries the path's onlink flag,
// which a gateway outside the uplink's subnets needs. Dead paths do not
// count, and routes through nexthop objects, whose gateway the route does
// not carry, are never among them.
func gateway(v netwatch.View, f netwatch.Family, index uint32) (gw netip.Addr, flags netwatch.RouteFlags, ok bool) {
	for _, r := range v.DefaultRoutes(f, netwatch.TableMain, index) {
		if hop, found := r.PathOut(index); found && hop.Gateway.IsValid() {
			return hop.Gateway, hop.Flags & netwatch.RouteOnlink, true
		}
	}
	return netip.Addr{}, 0, false
}
