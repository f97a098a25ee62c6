package main

import (
	"net/netip"

	"github.com/marksplit/marksplit/netwatch"
	"github.com/marksplit/marksplit/netwatch/reconcile"
)

// Config is the policy: which prefixes go through which VPN link, and the
// table, rule priority, mark and protocol it uses.
type Config struct {
	// Link is the VPN link's name (tailscale0, wg0, tun0).
	Link string
	// Prefixes are sent through Link; masked, without duplicates.
	Prefixes []netip.Prefix
	// Mark and Mask select the VPN's own packets, which bypass the table.
	Mark, Mask netwatch.Mark
	// Table and Priority are owned: every route in Table and every rule
	// at Priority, in both families, belong to the policy.
	Table    netwatch.Table
	Priority uint32
	// Protocol is stamped on every route and rule the policy installs.
	Protocol netwatch.Protocol
}

// Desired returns what the policy wants for the view: while the VPN link
// exists and is up, one route per prefix in the table, out of the link,
// with the link's address of the prefix's family as source when it has
// one; and, per family that has a prefix, the rule that sends every
// packet without the VPN's mark to the table. While the link is absent or
// down, nothing: Plan removes whatever the policy owns.
func (c Config) Desired(v netwatch.View) reconcile.Desired {
	d := reconcile.Desired{Own: reconcile.Own(reconcile.OwnTable(c.Table), reconcile.OwnPriority(c.Priority)), Routes: new(netwatch.RouteSet)}
	link, ok := v.LinkByName(c.Link)
	switch {
	case !ok:
		d.Notes = []string{"vpnbypass: link " + c.Link + " does not exist: nothing is routed through it"}
		return d
	case link.Flags&netwatch.LinkUp == 0:
		d.Notes = []string{"vpnbypass: link " + c.Link + " is down: nothing is routed through it"}
		return d
	}
	hasPrefix := map[netwatch.Family]bool{}
	for _, p := range c.Prefixes {
		f := netwatch.FamilyOf(p.Addr())
		r := netwatch.Route{
			Family:   f,
			Table:    c.Table,
			Dst:      p,
			Index:    link.Index,
			PrefSrc:  source(v, link.Index, f),
			Protocol: c.Protocol,
			Scope:    netwatch.ScopeLink,
			Type:     netwatch.RouteUnicast,
		}
		if f == netwatch.IPv6 {
			r.Scope = netwatch.ScopeUniverse // IPv6 routes have no scope; the kernel reports universe
		}
		d.Routes.Add(r)
		hasPrefix[f] = true
	}
	for _, f := range []netwatch.Family{netwatch.IPv4, netwatch.IPv6} {
		if !hasPrefix[f] {
			continue
		}
		d.Rules = append(d.Rules, netwatch.Rule{
			Family:   f,
			Priority: c.Priority,
			Table:    c.Table,
			Action:   netwatch.ActionToTable,
			Invert:   true,
			Mark:     c.Mark,
			Mask:     c.Mask,
			Protocol: c.Protocol,
		})
	}
	return d
}

// source picks the link's address of family f to use as the routes'
// source: the first of View.SourceAddrs (usable, primary first, lowest
// first) if it has global scope. It returns the zero Addr when there is
// none: the kernel then chooses.
func source(v netwatch.View, index uint32, f netwatch.Family) netip.Addr {
	as := v.SourceAddrs(index, f)
	if len(as) == 0 || as[0].Scope != netwatch.ScopeUniverse || as[0].Prefix.Addr().IsLinkLocalUnicast() {
		return netip.Addr{}
	}
	return as[0].Prefix.Addr()
}
