package mtupolicy_test

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"

	"github.com/marksplit/marksplit/netwatch"
)

// kernel is a small model of what the kernel does with netwatch's requests,
// written from the kernel's source (fib_table_insert, fib_table_delete,
// fib_nl_newrule, fib_nl_delrule, rule_exists, rule_find) and independent of
// the model inside reconcile.Plan. Apply adds rules with NLM_F_EXCL, deletes
// them naming every attribute they have, replaces routes with
// NLM_F_REPLACE, and deletes routes with the scope as wildcard and no
// metrics.
type kernel struct {
	s netwatch.Snapshot
}

// apply executes ops in order, like netwatch's Applier: "already there" and
// "already gone" are success; anything the kernel would refuse is an error.
func (k *kernel) apply(ops []netwatch.Op) error {
	for _, op := range ops {
		var err error
		switch op.Kind {
		case netwatch.RouteReplace:
			err = k.replaceRoute(op.Route)
		case netwatch.RouteDelete:
			k.deleteRoute(op.Route)
		case netwatch.RuleAdd:
			k.addRule(op.Rule)
		case netwatch.RuleDelete:
			k.deleteRule(op.Rule)
		default:
			err = fmt.Errorf("unknown op %v", op.Kind)
		}
		if err != nil {
			return fmt.Errorf("%v %v: %w", op.Kind, op, err)
		}
	}
	return nil
}

func (k *kernel) link(index uint32) (netwatch.Link, bool) {
	i := slices.IndexFunc(k.s.Links, func(l netwatch.Link) bool { return l.Index == index })
	if i < 0 {
		return netwatch.Link{}, false
	}
	return k.s.Links[i], true
}

func (k *kernel) loopback() uint32 {
	for _, l := range k.s.Links {
		if l.Flags&netwatch.LinkLoopback != 0 {
			return l.Index
		}
	}
	return 0
}

func (k *kernel) replaceRoute(r netwatch.Route) error {
	if r.Table == 0 {
		return fmt.Errorf("table 0")
	}
	if r.Flags&(netwatch.RouteDead|netwatch.RouteLinkdown) != 0 {
		return fmt.Errorf("invalid rtm_flags: can not contain DEAD or LINKDOWN")
	}
	if r.Family == netwatch.IPv6 && r.Metric == 0 {
		r.Metric = 1024
	}
	switch r.Type {
	case netwatch.RouteUnicast:
		l, ok := k.link(r.Index)
		if !ok {
			return fmt.Errorf("no link %d", r.Index)
		}
		if l.Flags&netwatch.LinkUp == 0 {
			return fmt.Errorf("link %s is down", l.Name)
		}
		if l.Flags&netwatch.LinkLowerUp == 0 {
			r.Flags |= netwatch.RouteLinkdown
		}
	case netwatch.RouteThrow, netwatch.RouteBlackhole, netwatch.RouteUnreachable, netwatch.RouteProhibit:
		if r.Family == netwatch.IPv6 {
			r.Index = k.loopback() // reported as dev lo
		}
	}
	if r.PrefSrc.IsValid() && !slices.ContainsFunc(k.s.Addrs, func(a netwatch.Addr) bool { return a.Prefix.Addr() == r.PrefSrc }) {
		return fmt.Errorf("invalid prefsrc %v", r.PrefSrc)
	}
	i := slices.IndexFunc(k.s.Routes, func(c netwatch.Route) bool { return c.Key() == r.Key() })
	if i < 0 {
		k.s.Routes = append(k.s.Routes, r)
	} else {
		k.s.Routes[i] = r
	}
	return nil
}

// deleteRoute removes the first route with the key whose attributes match
// those the request names: type, prefsrc, protocol, output link, gateway,
// nexthop id, the paths of a multipath route (fib_nh_match: link, gateway
// and weight of each). The request's scope is RT_SCOPE_NOWHERE, the
// wildcard.
func (k *kernel) deleteRoute(d netwatch.Route) {
	type hop struct {
		gw     netip.Addr
		index  uint32
		weight uint16
	}
	hops := func(r netwatch.Route) []hop {
		var hs []hop
		for _, nh := range r.NextHops {
			hs = append(hs, hop{nh.Gateway, nh.Index, max(nh.Weight, 1)})
		}
		return hs
	}
	i := slices.IndexFunc(k.s.Routes, func(r netwatch.Route) bool {
		return r.Key() == d.Key() &&
			(d.Type == 0 || r.Type == d.Type) &&
			(!d.PrefSrc.IsValid() || r.PrefSrc == d.PrefSrc) &&
			(d.Protocol == 0 || r.Protocol == d.Protocol) &&
			(d.Index == 0 || r.Index == d.Index) &&
			(!d.Gateway.IsValid() || r.Gateway == d.Gateway) &&
			(d.NHID == 0 || r.NHID == d.NHID) &&
			(d.NextHops == nil || slices.Equal(hops(r), hops(d)))
	})
	if i >= 0 { // else ESRCH: already gone
		k.s.Routes = slices.Delete(k.s.Routes, i, i+1)
	}
}

// ruleExists is rule_exists: an exclusive add fails with EEXIST.
func ruleExists(n, r netwatch.Rule) bool {
	mask := func(x netwatch.Rule) netwatch.Mark {
		if x.Mark != 0 && x.Mask == 0 {
			return 0xffffffff
		}
		return x.Mask
	}
	if r.Family != n.Family || r.Action != n.Action || r.Table != n.Table || r.Priority != n.Priority ||
		r.IIF != n.IIF || r.OIF != n.OIF || r.Mark != n.Mark || r.SuppressIfGroup != n.SuppressIfGroup ||
		r.SuppressPrefixLen != n.SuppressPrefixLen || mask(r) != mask(n) || r.TunID != n.TunID ||
		r.L3MDev != n.L3MDev || r.UID != n.UID || r.IPProto != n.IPProto || r.Protocol != n.Protocol ||
		r.SPort != n.SPort || r.DPort != n.DPort || r.Attrs != n.Attrs {
		return false
	}
	return compareSelectors(r, n)
}

// compareSelectors is fib4_rule_compare / fib6_rule_compare: each selector
// compared only when the request has it.
func compareSelectors(r, req netwatch.Rule) bool {
	if req.Src.IsValid() && req.Src.Bits() > 0 && r.Src != req.Src {
		return false
	}
	if req.Dst.IsValid() && req.Dst.Bits() > 0 && r.Dst != req.Dst {
		return false
	}
	if req.TOS != 0 && r.TOS != req.TOS {
		return false
	}
	return req.Flow == 0 || r.Flow == req.Flow
}

// ruleFind is rule_find: the first rule that matches every attribute the
// request sets. Flags ("not") and the goto target are not compared.
func ruleFind(rs []netwatch.Rule, req netwatch.Rule) int {
	return slices.IndexFunc(rs, func(r netwatch.Rule) bool {
		switch {
		case r.Family != req.Family:
		case req.Action != 0 && r.Action != req.Action:
		case req.Table != 0 && r.Table != req.Table:
		case req.Priority != 0 && r.Priority != req.Priority: // FRA_PRIORITY is sent when non-zero
		case req.IIF != "" && r.IIF != req.IIF:
		case req.OIF != "" && r.OIF != req.OIF:
		case req.Mark != 0 && r.Mark != req.Mark:
		case req.SuppressIfGroup.Set && r.SuppressIfGroup != req.SuppressIfGroup:
		case req.SuppressPrefixLen.Set && r.SuppressPrefixLen != req.SuppressPrefixLen:
		case req.Mask != 0 && r.Mask != req.Mask:
		case req.TunID != 0 && r.TunID != req.TunID:
		case req.L3MDev != 0 && r.L3MDev != req.L3MDev:
		case req.UID.Set && r.UID != req.UID:
		case req.IPProto != 0 && r.IPProto != req.IPProto:
		case req.Protocol != 0 && r.Protocol != req.Protocol:
		case req.SPort != (netwatch.PortRange{}) && r.SPort != req.SPort:
		case req.DPort != (netwatch.PortRange{}) && r.DPort != req.DPort:
		case req.Attrs != "" && r.Attrs != req.Attrs: // FRA_DSCP and the like, sent and compared
		default:
			return compareSelectors(r, req)
		}
		return false
	})
}

func (k *kernel) addRule(n netwatch.Rule) {
	if slices.ContainsFunc(k.s.Rules, func(r netwatch.Rule) bool { return ruleExists(n, r) }) {
		return // EEXIST: already there
	}
	if n.Mark != 0 && n.Mask == 0 {
		n.Mask = 0xffffffff
	}
	// After the last rule of the family whose priority is not above it.
	at := 0
	for i, r := range k.s.Rules {
		if r.Family == n.Family && r.Priority <= n.Priority {
			at = i + 1
		}
	}
	if at == 0 {
		at = len(k.s.Rules)
		if i := slices.IndexFunc(k.s.Rules, func(r netwatch.Rule) bool { return r.Family == n.Family }); i >= 0 {
			at = i
		}
	}
	k.s.Rules = slices.Insert(k.s.Rules, at, n)
}

func (k *kernel) deleteRule(d netwatch.Rule) {
	if i := ruleFind(k.s.Rules, d); i >= 0 { // else ENOENT: already gone
		k.s.Rules = slices.Delete(k.s.Rules, i, i+1)
	}
}

// lookup answers like `ip route get DST mark MARK` for a locally generated
// packet: rules in order, lookup tables with longest prefix match, the
// lowest metric among equal prefixes, the first of equal keys; a throw route
// or a miss goes on to the next rule. It returns the route and the MTU the
// packet gets (the route's, else its link's).
func lookup(s netwatch.Snapshot, dst netip.Addr, mark netwatch.Mark) (netwatch.Route, uint32, bool) {
	f := netwatch.FamilyOf(dst)
	rules := slices.DeleteFunc(slices.Clone(s.Rules), func(r netwatch.Rule) bool { return r.Family != f })
	slices.SortStableFunc(rules, func(a, b netwatch.Rule) int { return cmp.Compare(a.Priority, b.Priority) })
	for _, r := range rules {
		m := (mark^r.Mark)&r.Mask == 0
		if r.IIF != "" && r.IIF != "lo" || r.OIF != "" || r.Src.IsValid() && !r.Src.Contains(dst) && r.Src.Bits() > 0 {
			m = false
		}
		if r.Dst.IsValid() && r.Dst.Bits() > 0 && !r.Dst.Contains(dst) {
			m = false
		}
		if m == r.Invert {
			continue
		}
		if r.Action != netwatch.ActionToTable {
			return netwatch.Route{}, 0, false
		}
		rt, ok := lpm(s, f, r.Table, dst)
		if !ok || rt.Type == netwatch.RouteThrow {
			continue
		}
		mtu := rt.MTU
		if mtu == 0 {
			if l := slices.IndexFunc(s.Links, func(l netwatch.Link) bool { return l.Index == rt.Index }); l >= 0 {
				mtu = s.Links[l].MTU
			}
		}
		return rt, mtu, true
	}
	return netwatch.Route{}, 0, false
}

// lpm is a longest-prefix match in one table.
func lpm(s netwatch.Snapshot, f netwatch.Family, t netwatch.Table, dst netip.Addr) (netwatch.Route, bool) {
	var best netwatch.Route
	found := false
	for _, r := range s.Routes {
		if r.Family != f || r.Table != t || !r.Dst.Contains(dst) {
			continue
		}
		if !found || r.Dst.Bits() > best.Dst.Bits() || r.Dst.Bits() == best.Dst.Bits() && r.Metric < best.Metric {
			best, found = r, true
		}
	}
	return best, found
}
