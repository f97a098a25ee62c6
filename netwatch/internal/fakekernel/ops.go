//go:build linux

package fakekernel

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Everything in this file runs with k.mu held.

// origin is the request that causes a change. A nil *origin is a change
// made by someone else (the Go API) or by the kernel itself: its events
// carry port ID 0 and sequence 0.
type origin struct {
	s    *socket
	seq  uint32
	echo bool // NLM_F_ECHO: the requester gets the event by unicast instead
}

// rtnetlink multicast groups.
const (
	grpLink      = unix.RTNLGRP_LINK
	grpIPv4Addr  = unix.RTNLGRP_IPV4_IFADDR
	grpIPv6Addr  = unix.RTNLGRP_IPV6_IFADDR
	grpIPv4Route = unix.RTNLGRP_IPV4_ROUTE
	grpIPv6Route = unix.RTNLGRP_IPV6_ROUTE
	grpIPv4Rule  = unix.RTNLGRP_IPV4_RULE
	grpIPv6Rule  = unix.RTNLGRP_IPV6_RULE
)

// notify delivers an event to the conns that joined group.
func (k *Kernel) notify(group uint32, typ uint16, flags netlink.HeaderFlags, body []byte, o *origin) {
	h := netlink.Header{Type: netlink.HeaderType(typ), Flags: flags}
	var echo *socket
	if o != nil {
		h.PID, h.Sequence = o.s.port, o.seq
		if o.echo {
			echo = o.s
		}
	}
	b := marshal(h, body)
	for c := range k.conns {
		if c.sock != echo && c.sock.groups[group] {
			c.sock.enqueue(b, true)
		}
	}
	if echo != nil {
		echo.enqueue(b, false)
	}
}

func addrGroup(family uint8) uint32 {
	if family == unix.AF_INET {
		return grpIPv4Addr
	}
	return grpIPv6Addr
}

func routeGroup(family uint8) uint32 {
	if family == unix.AF_INET {
		return grpIPv4Route
	}
	return grpIPv6Route
}

func ruleGroup(family uint8) uint32 {
	if family == unix.AF_INET {
		return grpIPv4Rule
	}
	return grpIPv6Rule
}

// Links.

func (k *Kernel) linkByName(name string) (Link, bool) {
	for _, l := range k.links {
		if l.Name == name {
			return l, true
		}
	}
	return Link{}, false
}

// createLink adds a link and announces it, once, up or down. index 0
// picks the next free index.
func (k *Kernel) createLink(name, kind string, mtu, index uint32, up bool) uint32 {
	if index == 0 {
		for k.links[k.nextIndex].Index != 0 {
			k.nextIndex++
		}
		index = k.nextIndex
		k.nextIndex++
	}
	l := Link{Index: index, Name: name, Kind: kind, MTU: mtu, Up: up}
	k.links[index] = l
	k.notify(grpLink, unix.RTM_NEWLINK, 0, linkBody(reported(l)), nil)
	return index
}

// Link events carry port ID 0 even when a request caused them: the kernel
// sends them from its netdevice notifier.
func (k *Kernel) setUp(index uint32, up bool) {
	l := k.links[index]
	if l.Up == up {
		return
	}
	l.Up = up
	k.links[index] = l
	k.notify(grpLink, unix.RTM_NEWLINK, 0, linkBody(reported(l)), nil)
	if !up {
		k.linkDown(index)
	}
}

func (k *Kernel) setMTU(index, mtu uint32) *kerr {
	l, ok := k.links[index]
	if !ok {
		return fail(unix.ENODEV, "")
	}
	if mtu < 68 && l.Kind != "" {
		return fail(unix.EINVAL, "mtu less than device minimum")
	}
	if mtu > 65535 && l.Kind != "" {
		return fail(unix.EINVAL, "mtu greater than device maximum")
	}
	if l.MTU == mtu {
		return nil
	}
	l.MTU = mtu
	k.links[index] = l
	k.notify(grpLink, unix.RTM_NEWLINK, 0, linkBody(reported(l)), nil)
	return nil
}

// linkDown is what the kernel does when a link goes down: IPv6 routes
// through it are deleted with events, its IPv6 addresses are removed with
// events (keep_addr_on_down is 0), IPv4 routes through it vanish silently.
func (k *Kernel) linkDown(index uint32) {
	for _, r := range k.sortedRoutes(unix.AF_INET6) {
		if r.Index == index {
			k.removeRoute(r.key(), true, nil)
		}
	}
	for _, a := range k.sortedAddrs(unix.AF_INET6, index) {
		k.removeAddr(a, nil)
	}
	k.flushRoutes4(index)
}

// flushRoutes4 removes the IPv4 routes through a link without events.
func (k *Kernel) flushRoutes4(index uint32) {
	for key, r := range k.routes {
		if key.family == unix.AF_INET && r.Index == index {
			delete(k.routes, key)
		}
	}
}

// deleteLink deletes a link with everything on it; o is the request that
// asked for it, or nil.
func (k *Kernel) deleteLink(index uint32, o *origin) *kerr {
	l, ok := k.links[index]
	if !ok {
		return fail(unix.ENODEV, "")
	}
	if l.Kind == "" && l.Name == "lo" {
		return fail(unix.EOPNOTSUPP, "")
	}
	k.setUp(index, false)
	for _, a := range k.sortedAddrs(unix.AF_INET6, index) {
		k.removeAddr(a, nil)
	}
	for _, r := range k.sortedRoutes(unix.AF_INET6) {
		if r.Index == index {
			k.removeRoute(r.key(), true, nil)
		}
	}
	for _, a := range k.sortedAddrs(unix.AF_INET, index) {
		if k.hasAddr(a) {
			k.removeAddr4(a, nil)
		}
	}
	k.flushRoutes4(index)
	l = k.links[index]
	delete(k.links, index)
	if !k.behavior.LinkDeleteNamesRequester {
		o = nil
	}
	k.notify(grpLink, unix.RTM_DELLINK, 0, linkBody(reported(l)), o)
	return nil
}

// Link flags and operational states the kernel reports.
const (
	operUnknown = 0
	operDown    = 2
	operUp      = 6
)

// reported fills in the flags and operational state the kernel reports.
func reported(l Link) Link {
	switch {
	case l.Kind == "" && l.Name == "lo":
		l.Flags = unix.IFF_LOOPBACK
	case l.Kind == "tun":
		l.Flags = unix.IFF_POINTOPOINT | unix.IFF_NOARP | unix.IFF_MULTICAST
	default:
		l.Flags = unix.IFF_BROADCAST | unix.IFF_MULTICAST
	}
	l.OperState = operDown
	if l.Up {
		l.Flags |= unix.IFF_UP | unix.IFF_RUNNING | unix.IFF_LOWER_UP
		l.OperState = operUp
		if l.Flags&unix.IFF_LOOPBACK != 0 {
			l.OperState = operUnknown
		}
	}
	return l
}

// Addresses.

type addrFilter struct {
	family uint8
	index  uint32
	local  netip.Addr   // IFA_LOCAL (IPv4) or the address (IPv6); zero: any
	prefix netip.Prefix // IFA_ADDRESS with the prefix length; zero: any
	label  string       // IFA_LABEL; empty: any
}

func ipv6Scope(a netip.Addr) uint8 {
	switch {
	case a.IsLoopback():
		return unix.RT_SCOPE_HOST
	case a.IsLinkLocalUnicast():
		return unix.RT_SCOPE_LINK
	}
	return unix.RT_SCOPE_UNIVERSE
}

func (k *Kernel) newAddr(a Addr, flags netlink.HeaderFlags, o *origin) *kerr {
	fam := familyOf(a.Prefix.Addr())
	l, ok := k.links[a.Index]
	if fam == unix.AF_INET {
		if !ok {
			return k.addrFail(unix.ENODEV, "ipv4: Device not found")
		}
		a.Flags = a.Flags&^unix.IFA_F_SECONDARY | unix.IFA_F_PERMANENT
		if a.Label == "" {
			a.Label = l.Name
		}
		sub := a.Prefix.Masked()
		for i, b := range k.addrs {
			if b.Index != a.Index || !b.Prefix.Addr().Is4() || b.Prefix.Bits() != a.Prefix.Bits() || b.Prefix.Masked() != sub {
				continue
			}
			if b.Prefix.Addr() == a.Prefix.Addr() {
				if flags&netlink.Excl != 0 || flags&netlink.Replace == 0 {
					return k.addrFail(unix.EEXIST, "ipv4: Address already assigned")
				}
				// Replace keeps the address as it is and announces it.
				k.notify(grpIPv4Addr, unix.RTM_NEWADDR, 0, addrBody(k.addrs[i]), o)
				return nil
			}
			if b.Scope != a.Scope {
				return fail(unix.EINVAL, "ipv4: Invalid scope value")
			}
			a.Flags |= unix.IFA_F_SECONDARY
		}
		k.insertAddr(a)
		k.notify(grpIPv4Addr, unix.RTM_NEWADDR, 0, addrBody(a), o)
		return nil
	}
	if !ok {
		return k.addrFail(unix.ENODEV, "ipv6: Unable to find the interface")
	}
	a.Scope = ipv6Scope(a.Prefix.Addr())
	a.Flags |= unix.IFA_F_PERMANENT
	a.Label = ""
	for i, b := range k.addrs {
		if b.Index == a.Index && b.Prefix.Addr() == a.Prefix.Addr() {
			if flags&netlink.Excl != 0 || flags&netlink.Replace == 0 {
				return k.addrFail(unix.EEXIST, "ipv6: address already assigned")
			}
			k.addrs[i].Prefix = a.Prefix
			k.addrs[i].Flags = a.Flags
			k.notify(grpIPv6Addr, unix.RTM_NEWADDR, 0, addrBody(k.addrs[i]), nil)
			return nil
		}
	}
	k.insertAddr(a)
	// IPv6 address events carry port ID 0, whoever asked.
	k.notify(grpIPv6Addr, unix.RTM_NEWADDR, 0, addrBody(a), nil)
	return nil
}

// insertAddr keeps a link's IPv4 primaries before its secondaries.
func (k *Kernel) insertAddr(a Addr) {
	i := len(k.addrs)
	if a.Flags&unix.IFA_F_SECONDARY == 0 && a.Prefix.Addr().Is4() {
		i = slices.IndexFunc(k.addrs, func(b Addr) bool {
			return b.Index == a.Index && b.Prefix.Addr().Is4() && b.Flags&unix.IFA_F_SECONDARY != 0
		})
		if i < 0 {
			i = len(k.addrs)
		}
	}
	k.addrs = slices.Insert(k.addrs, i, a)
}

func (k *Kernel) hasAddr(a Addr) bool {
	return slices.ContainsFunc(k.addrs, func(b Addr) bool { return b.Index == a.Index && b.Prefix == a.Prefix })
}

func (k *Kernel) delAddr(f addrFilter, o *origin) *kerr {
	if f.family == unix.AF_INET {
		if _, ok := k.links[f.index]; !ok {
			return k.addrFail(unix.ENODEV, "ipv4: Device not found")
		}
		for _, a := range k.sortedAddrs(unix.AF_INET, f.index) {
			if f.local.IsValid() && a.Prefix.Addr() != f.local {
				continue
			}
			if f.label != "" && a.Label != f.label {
				continue
			}
			if f.prefix.IsValid() && (f.prefix.Bits() != a.Prefix.Bits() || !a.Prefix.Masked().Contains(f.prefix.Addr())) {
				continue
			}
			k.removeAddr4(a, o)
			return nil
		}
		return k.addrFail(unix.EADDRNOTAVAIL, "ipv4: Address not found")
	}
	if _, ok := k.links[f.index]; !ok {
		return k.addrFail(unix.ENODEV, "ipv6: Unable to find the interface")
	}
	for _, a := range k.sortedAddrs(unix.AF_INET6, f.index) {
		if a.Prefix.Addr() == f.local && a.Prefix.Bits() == f.prefix.Bits() {
			k.removeAddr(a, nil)
			return nil
		}
	}
	return k.addrFail(unix.EADDRNOTAVAIL, "ipv6: address not found")
}

// addrFail is a failed address request: the message is there where the
// kernel gives it (Behavior.AddressErrorMessages).
func (k *Kernel) addrFail(errno unix.Errno, msg string) *kerr {
	if !k.behavior.AddressErrorMessages {
		msg = ""
	}
	return fail(errno, msg)
}

// removeAddr drops an address and announces it, nothing more.
func (k *Kernel) removeAddr(a Addr, o *origin) {
	k.addrs = slices.DeleteFunc(k.addrs, func(b Addr) bool { return b.Index == a.Index && b.Prefix == a.Prefix })
	fam := familyOf(a.Prefix.Addr())
	if fam == unix.AF_INET6 {
		o = nil
		// The kernel takes the address off the routes using it as
		// their preferred source, silently: of every link, or only of
		// the address's own (Behavior.IPv6PrefSrcEveryLink).
		for key, r := range k.routes {
			if !k.behavior.IPv6PrefSrcEveryLink && r.Index != a.Index {
				continue
			}
			if r.PrefSrc == a.Prefix.Addr() && !k.addrAssigned(r.PrefSrc) {
				r.PrefSrc = netip.Addr{}
				k.routes[key] = r
			}
		}
	}
	k.notify(addrGroup(fam), unix.RTM_DELADDR, 0, addrBody(a), o)
}

// removeAddr4 is the kernel's IPv4 address removal: a primary takes its
// secondaries with it (promote_secondaries is 0); the main-table routes
// using a removed address as prefsrc are deleted with events; when the
// link has no IPv4 address left, every IPv4 route through it vanishes
// without events.
func (k *Kernel) removeAddr4(a Addr, o *origin) {
	if a.Flags&unix.IFA_F_SECONDARY == 0 {
		for _, b := range k.sortedAddrs(unix.AF_INET, a.Index) {
			if b.Flags&unix.IFA_F_SECONDARY != 0 && b.Prefix.Bits() == a.Prefix.Bits() && b.Prefix.Masked() == a.Prefix.Masked() {
				k.removeAddr(b, o)
				k.flushPrefSrc(b.Prefix.Addr())
			}
		}
	}
	k.removeAddr(a, o)
	k.flushPrefSrc(a.Prefix.Addr())
	if len(k.sortedAddrs(unix.AF_INET, a.Index)) == 0 {
		k.flushRoutes4(a.Index)
	}
}

func (k *Kernel) addrAssigned(ip netip.Addr) bool {
	return slices.ContainsFunc(k.addrs, func(b Addr) bool { return b.Prefix.Addr() == ip })
}

// flushPrefSrc deletes, with events, the main-table IPv4 routes whose
// prefsrc is ip once no link holds ip any more.
func (k *Kernel) flushPrefSrc(ip netip.Addr) {
	if k.addrAssigned(ip) {
		return
	}
	for _, r := range k.sortedRoutes(unix.AF_INET) {
		if r.Table == unix.RT_TABLE_MAIN && r.PrefSrc == ip {
			k.removeRoute(r.key(), true, nil)
		}
	}
}

// sortedAddrs lists addresses of a family (0: both, IPv4 first) and link
// (0: all), by link, in the kernel's per-link order.
func (k *Kernel) sortedAddrs(family uint8, index uint32) []Addr {
	var out []Addr
	for _, fam := range []uint8{unix.AF_INET, unix.AF_INET6} {
		if family != 0 && family != fam {
			continue
		}
		var as []Addr
		for _, a := range k.addrs {
			if familyOf(a.Prefix.Addr()) == fam && (index == 0 || a.Index == index) {
				as = append(as, a)
			}
		}
		slices.SortStableFunc(as, func(a, b Addr) int { return cmp.Compare(a.Index, b.Index) })
		out = append(out, as...)
	}
	return out
}

// Routes.

func (k *Kernel) tableExists(family uint8, id uint32) bool { return k.tables[tableID{family, id}] }

// createTable is fib_new_table / fib6_new_table. Without custom IPv4
// rules, the IPv4 local table comes with main.
func (k *Kernel) createTable(family uint8, id uint32) {
	k.tables[tableID{family, id}] = true
	if family == unix.AF_INET && id == unix.RT_TABLE_LOCAL && !k.customRules4 {
		k.tables[tableID{family, unix.RT_TABLE_MAIN}] = true
	}
}

// scopeOfType is fib_props[type].scope: the widest scope a route of the
// type may have.
var scopeOfType = [...]uint8{
	unix.RTN_UNSPEC:      unix.RT_SCOPE_NOWHERE,
	unix.RTN_UNICAST:     unix.RT_SCOPE_UNIVERSE,
	unix.RTN_LOCAL:       unix.RT_SCOPE_HOST,
	unix.RTN_BROADCAST:   unix.RT_SCOPE_LINK,
	unix.RTN_ANYCAST:     unix.RT_SCOPE_LINK,
	unix.RTN_MULTICAST:   unix.RT_SCOPE_UNIVERSE,
	unix.RTN_BLACKHOLE:   unix.RT_SCOPE_UNIVERSE,
	unix.RTN_UNREACHABLE: unix.RT_SCOPE_UNIVERSE,
	unix.RTN_PROHIBIT:    unix.RT_SCOPE_UNIVERSE,
	unix.RTN_THROW:       unix.RT_SCOPE_UNIVERSE,
	unix.RTN_NAT:         unix.RT_SCOPE_NOWHERE,
	unix.RTN_XRESOLVE:    unix.RT_SCOPE_NOWHERE,
}

// isReject reports whether routes of type t drop instead of forwarding.
func isReject(t uint8) bool {
	switch t {
	case unix.RTN_BLACKHOLE, unix.RTN_UNREACHABLE, unix.RTN_PROHIBIT, unix.RTN_THROW:
		return true
	}
	return false
}

// newRoute is RTM_NEWROUTE for one route, checked in the kernel's order.
// newRoute adds or replaces r with the metrics mx as a request names them.
func (k *Kernel) newRoute(r Route, mx []metricAttr, flags netlink.HeaderFlags, o *origin) *kerr {
	fam := r.Family()
	if r.Table == 0 {
		r.Table = unix.RT_TABLE_MAIN
	}
	if r.Type > unix.RTN_XRESOLVE {
		return fail(unix.EINVAL, "Invalid route type")
	}
	if fam == unix.AF_INET {
		// The table exists from here on, whatever happens next.
		k.createTable(fam, r.Table)
		var ke *kerr
		if r.MTU, r.Metrics, ke = convertMetrics(mx); ke != nil {
			return ke
		}
		if r.Dst != r.Dst.Masked() {
			return fail(unix.EINVAL, "Invalid prefix for given prefix length")
		}
		if scopeOfType[r.Type] > r.Scope {
			return fail(unix.EINVAL, "Invalid scope")
		}
		if isReject(r.Type) {
			if r.Gateway.IsValid() || r.Index != 0 {
				return fail(unix.EINVAL, "Gateway, device and multipath can not be specified for this route type")
			}
		} else {
			switch r.Type {
			case unix.RTN_UNICAST, unix.RTN_LOCAL, unix.RTN_BROADCAST, unix.RTN_ANYCAST, unix.RTN_MULTICAST:
			default:
				return fail(unix.EINVAL, "Invalid route type")
			}
			if r.Scope > unix.RT_SCOPE_HOST {
				return fail(unix.EINVAL, "Invalid scope")
			}
			if r.Scope == unix.RT_SCOPE_HOST && r.Gateway.IsValid() {
				return fail(unix.EINVAL, "Route with host scope can not have a gateway")
			}
			if e := k.checkDevice(r, "Device for nexthop is not up"); e != nil {
				return e
			}
		}
		if r.PrefSrc.IsValid() && !(r.Type == unix.RTN_LOCAL && r.PrefSrc == r.Dst.Addr()) && !k.addrAssigned(r.PrefSrc) {
			return fail(unix.EINVAL, "Invalid prefsrc address")
		}
	} else {
		if r.Type == 0 {
			r.Type = unix.RTN_UNICAST
		}
		if r.Metric == 0 {
			r.Metric = 1024
		}
		r.Dst = r.Dst.Masked()
		r.Scope = unix.RT_SCOPE_UNIVERSE
		k.createTable(fam, r.Table)
		var ke *kerr
		if r.MTU, r.Metrics, ke = convertMetrics(mx); ke != nil {
			return ke
		}
		if isReject(r.Type) {
			// The kernel hangs reject routes on lo.
			r.Index, r.Gateway = 1, netip.Addr{}
		} else if e := k.checkDevice(r, "Nexthop device is not up"); e != nil {
			return e
		}
		if r.PrefSrc.IsValid() && !k.addrAssigned(r.PrefSrc) {
			return fail(unix.EINVAL, "Invalid source address")
		}
	}

	key := r.key()
	old, exists := k.routes[key]
	switch {
	case exists && flags&netlink.Excl != 0:
		return fail(unix.EEXIST, "")
	case exists && flags&netlink.Replace != 0:
		k.routes[key] = r
		k.notify(routeGroup(fam), unix.RTM_NEWROUTE, netlink.Replace, routeBody(r), o)
		return nil
	case exists && old == r:
		return fail(unix.EEXIST, "")
	case exists:
		return fail(unix.EOPNOTSUPP, "netwatchtest: several routes with one key (append, prepend, IPv6 multipath) are not modelled")
	case fam == unix.AF_INET && flags&netlink.Create == 0:
		return fail(unix.ENOENT, "")
	case fam == unix.AF_INET6 && flags&netlink.Create == 0 && flags&netlink.Replace != 0:
		return fail(unix.ENOENT, "Can not replace route - no match found")
	}
	k.routes[key] = r
	k.notify(routeGroup(fam), unix.RTM_NEWROUTE, netlink.Create|netlink.Excl, routeBody(r), o)
	return nil
}

// checkDevice checks a route's output link: given, existing and up.
func (k *Kernel) checkDevice(r Route, downMsg string) *kerr {
	if r.Index == 0 {
		if r.Gateway.IsValid() {
			return fail(unix.EOPNOTSUPP, "netwatchtest: routes that find their output link from the gateway are not modelled: give RTA_OIF")
		}
		return fail(unix.ENODEV, "")
	}
	l, ok := k.links[r.Index]
	if !ok {
		return fail(unix.ENODEV, "")
	}
	if !l.Up {
		return fail(unix.ENETDOWN, downMsg)
	}
	return nil
}

// routeFilter is an RTM_DELROUTE request: zero fields match anything
// except as noted.
type routeFilter struct {
	family   uint8
	table    uint32 // 0 means main
	dst      netip.Prefix
	tos      uint8
	metric   uint32
	typ      uint8
	scope    uint8 // IPv4: RT_SCOPE_NOWHERE matches any scope, others only themselves
	prefSrc  netip.Addr
	protocol uint8
	index    uint32
	gateway  netip.Addr
	metrics  []metricAttr // IPv4: each must be the route's
}

func (k *Kernel) delRoute(f routeFilter, o *origin) *kerr {
	if f.table == 0 {
		f.table = unix.RT_TABLE_MAIN
	}
	if !k.tableExists(f.family, f.table) {
		return fail(unix.ESRCH, "FIB table does not exist")
	}
	for _, r := range k.sortedRoutes(f.family) {
		if r.Table != f.table || r.Dst != f.dst.Masked() || r.TOS != f.tos ||
			f.metric != 0 && r.Metric != f.metric ||
			f.protocol != 0 && r.Protocol != f.protocol ||
			f.index != 0 && r.Index != f.index ||
			f.gateway.IsValid() && r.Gateway != f.gateway {
			continue
		}
		if f.family == unix.AF_INET && (f.typ != 0 && r.Type != f.typ ||
			f.scope != unix.RT_SCOPE_NOWHERE && r.Scope != f.scope ||
			f.prefSrc.IsValid() && r.PrefSrc != f.prefSrc ||
			!metricsMatch(r, f.metrics)) {
			continue
		}
		k.removeRoute(r.key(), true, o)
		return nil
	}
	return fail(unix.ESRCH, "")
}

func (k *Kernel) removeRoute(key routeKey, announce bool, o *origin) {
	r, ok := k.routes[key]
	if !ok {
		return
	}
	delete(k.routes, key)
	if announce {
		k.notify(routeGroup(key.family), unix.RTM_DELROUTE, 0, routeBody(r), o)
	}
}

// sortedRoutes lists a family's routes in dump order: tables in the order
// of the kernel's table hash, routes in trie order.
func (k *Kernel) sortedRoutes(family uint8) []Route {
	var rs []Route
	for key, r := range k.routes {
		if key.family == family {
			rs = append(rs, r)
		}
	}
	slices.SortFunc(rs, func(a, b Route) int {
		if c := cmp.Or(cmp.Compare(a.Table&0xff, b.Table&0xff), cmp.Compare(a.Table, b.Table)); c != 0 {
			return c
		}
		if c := comparePrefix(family, a.Dst, b.Dst); c != 0 {
			return c
		}
		return cmp.Or(cmp.Compare(b.TOS, a.TOS), cmp.Compare(a.Metric, b.Metric))
	})
	return rs
}

// comparePrefix orders destinations as the kernel walks them: IPv4 by
// address, longer prefix first; IPv6 in post-order of the radix tree (a
// prefix after the prefixes it contains).
func comparePrefix(family uint8, a, b netip.Prefix) int {
	if family == unix.AF_INET {
		return cmp.Or(a.Addr().Compare(b.Addr()), cmp.Compare(b.Bits(), a.Bits()))
	}
	bits := min(a.Bits(), b.Bits())
	pa, _ := a.Addr().Prefix(bits)
	pb, _ := b.Addr().Prefix(bits)
	if c := pa.Addr().Compare(pb.Addr()); c != 0 {
		return c
	}
	return cmp.Compare(b.Bits(), a.Bits())
}

// Rules.

// ruleReq is an RTM_NEWRULE or RTM_DELRULE request.
type ruleReq struct {
	Rule
	hasPrio bool // FRA_PRIORITY was given
}

// compareSel is the family's compare(): the selectors the request names
// must be the rule's.
func compareSel(r Rule, req Rule) bool {
	return (!req.Src.IsValid() || r.Src == req.Src) &&
		(!req.Dst.IsValid() || r.Dst == req.Dst) &&
		(req.TOS == 0 || r.TOS == req.TOS)
}

func (k *Kernel) newRule(q ruleReq, flags netlink.HeaderFlags, o *origin) *kerr {
	r := q.Rule
	if r.Family != unix.AF_INET && r.Family != unix.AF_INET6 {
		return fail(unix.EAFNOSUPPORT, "Rule family not supported")
	}
	switch {
	case r.Action > unix.FR_ACT_PROHIBIT:
		return fail(unix.EINVAL, "Invalid action")
	case r.Action != unix.FR_ACT_TO_TBL && r.Action < unix.FR_ACT_BLACKHOLE:
		// Unspecified, goto, nop and the reserved ones.
		return fail(unix.EOPNOTSUPP, fmt.Sprintf("netwatchtest: rule action %d is not modelled", r.Action))
	}
	if r.Mark != 0 && r.Mask == 0 {
		r.Mask = 0xffffffff
	}
	if r.Action != unix.FR_ACT_TO_TBL {
		r.Table = 0
	}
	rules := k.rules[r.Family]
	if !q.hasPrio {
		// fib_default_rule_pref: one below the second rule's.
		if len(rules) > 1 && rules[1].Priority != 0 {
			r.Priority = rules[1].Priority - 1
		}
	}
	if r.Action == unix.FR_ACT_TO_TBL && r.Table == 0 {
		if r.Family == unix.AF_INET6 {
			return fail(unix.EINVAL, "Invalid table")
		}
		// fib_empty_table: the first unused IPv4 table id.
		for id := uint32(1); id <= 255; id++ {
			if !k.tableExists(unix.AF_INET, id) {
				r.Table = id
				k.createTable(unix.AF_INET, id)
				break
			}
		}
	}
	if flags&netlink.Excl != 0 && slices.ContainsFunc(rules, func(x Rule) bool { return ruleExists(x, r) }) {
		return fail(unix.EEXIST, "")
	}
	if r.Family == unix.AF_INET6 && r.Action == unix.FR_ACT_TO_TBL {
		k.createTable(unix.AF_INET6, r.Table)
	}
	if r.Family == unix.AF_INET {
		k.customRules4 = true
	}
	// After the last rule at or below its priority: insertion order
	// within a priority. NLM_F_REPLACE is ignored: a duplicate is added.
	i := len(rules)
	for j, x := range rules {
		if x.Priority > r.Priority {
			i = j
			break
		}
	}
	k.rules[r.Family] = slices.Insert(rules, i, r)
	k.notify(ruleGroup(r.Family), unix.RTM_NEWRULE, 0, ruleBody(k.reportedRule(r)), o)
	return nil
}

// ruleExists is the kernel's rule_exists: every field but the flags (so
// not "not") must be equal, selectors only as far as the request names
// them.
func ruleExists(x, r Rule) bool {
	return x.Action == r.Action && x.Table == r.Table && x.Priority == r.Priority &&
		x.IIF == r.IIF && x.OIF == r.OIF && x.Mark == r.Mark && x.Mask == r.Mask &&
		x.Protocol == r.Protocol && compareSel(x, r)
}

// ruleFind is the kernel's rule_find for a delete: the fields the request
// names must match; the flags are not compared.
func ruleFind(x Rule, q ruleReq) bool {
	r := q.Rule
	return (r.Action == 0 || x.Action == r.Action) &&
		(r.Table == 0 || x.Table == r.Table) &&
		(!q.hasPrio || x.Priority == r.Priority) &&
		(r.IIF == "" || x.IIF == r.IIF) &&
		(r.OIF == "" || x.OIF == r.OIF) &&
		(r.Mark == 0 || x.Mark == r.Mark) &&
		(r.Mask == 0 || x.Mask == r.Mask) &&
		(r.Protocol == 0 || x.Protocol == r.Protocol) &&
		compareSel(x, r)
}

func (k *Kernel) delRule(q ruleReq, o *origin) *kerr {
	if q.Family != unix.AF_INET && q.Family != unix.AF_INET6 {
		return fail(unix.EAFNOSUPPORT, "Rule family not supported")
	}
	if q.Mark != 0 && q.Mask == 0 {
		q.Mask = 0xffffffff
	}
	rules := k.rules[q.Family]
	i := slices.IndexFunc(rules, func(x Rule) bool { return ruleFind(x, q) })
	if i < 0 {
		return fail(unix.ENOENT, "")
	}
	r := rules[i]
	k.rules[q.Family] = slices.Delete(rules, i, i+1)
	if q.Family == unix.AF_INET {
		k.customRules4 = true
	}
	k.notify(ruleGroup(q.Family), unix.RTM_DELRULE, 0, ruleBody(k.reportedRule(r)), o)
	return nil
}

// Rule flags the kernel adds when a named link does not exist.
const (
	ruleIIFDetached = 0x8  // FIB_RULE_IIF_DETACHED
	ruleOIFDetached = 0x10 // FIB_RULE_OIF_DETACHED
)

// reportedRule returns the header flags the kernel reports with a rule.
func (k *Kernel) reportedRule(r Rule) reportRule {
	var f uint32
	if r.Invert {
		f |= unix.FIB_RULE_INVERT
	}
	if _, ok := k.linkByName(r.IIF); r.IIF != "" && !ok {
		f |= ruleIIFDetached
	}
	if _, ok := k.linkByName(r.OIF); r.OIF != "" && !ok {
		f |= ruleOIFDetached
	}
	return reportRule{r, f}
}

type reportRule struct {
	Rule
	flags uint32
}
