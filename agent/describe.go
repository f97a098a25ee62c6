package main

import (
	"strconv"
	"strings"

	"github.com/marksplit/marksplit/netwatch"
)

// linkNames resolves link indexes for log lines; a View's Link method.
type linkNames func(index uint32) (netwatch.Link, bool)

// describe renders an operation as the one log line DESIGN.md defines for
// the kernel change it makes, in ip(8)'s words, naming the object and what
// it was before:
//
//	table 900: 10.0.0.0/16 via 10.0.0.1 dev enp7s0 src 10.0.0.5 mtu 1355
//	table 900: 10.0.0.0/16 via 10.0.0.1 dev enp7s0 src 10.0.0.5 mtu 1420 (was 1355)
//	table 900: removed 10.0.0.0/16 via 10.0.0.1 dev enp7s0 src 10.0.0.5 mtu 1355
//	rule 900: not fwmark 0xe00/0xf00 lookup 900
//	rule 900 (inet6): removed not fwmark 0xe00/0xf00 lookup 900
//	dhcp route 10.0.0.0/16 mtu 1450 (was 1355)
//
// The last is a repair of a foreign route, named by its protocol.
func describe(op netwatch.Op, links linkNames) string {
	switch op.Kind {
	case netwatch.RouteReplace:
		if op.Repair {
			return describeRepair(op, links)
		}
		var was []attr
		if op.HasWas {
			was = routeAttrs(op.Was, links)
		}
		return "table " + op.Route.Table.String() + ": " + renderDiff(routeAttrs(op.Route, links), was, op.HasWas)
	case netwatch.RouteDelete:
		return "table " + op.Route.Table.String() + ": removed " + render(routeAttrs(op.Route, links))
	case netwatch.RuleAdd:
		head, body := ruleText(op.Rule)
		return head + ":" + body
	case netwatch.RuleDelete:
		head, body := ruleText(op.Rule)
		return head + ": removed" + body
	}
	return op.Kind.String()
}

// describeRepair names a foreign route by its protocol and shows only
// what changed: "dhcp route 10.0.0.0/16 mtu 1450 (was 1355)".
func describeRepair(op netwatch.Op, links linkNames) string {
	proto := op.Route.Protocol
	if op.HasWas {
		proto = op.Was.Protocol
	}
	head := proto.String() + " route " + op.Route.Dst.String()
	if op.Route.Table != netwatch.TableMain {
		head += " table " + op.Route.Table.String()
	}
	rt := op.Route
	if rt.MTU == 0 && links != nil {
		// A repair that removes the MTU gives the route its link's: say
		// which, as in "dhcp route 10.0.0.0/16 mtu 1450 (was 1355)".
		if l, ok := links(rt.Index); ok {
			rt.MTU = l.MTU
		}
	}
	now := routeAttrs(rt, links)
	if !op.HasWas {
		return head + " " + render(now[1:])
	}
	was := routeAttrs(op.Was, links)
	var words []string
	for _, a := range now[1:] {
		switch w, ok := lookup(was, a.name); {
		case !ok:
			words = append(words, render([]attr{a})+" (was unset)")
		case w != a.value:
			words = append(words, render([]attr{a})+" (was "+w+")")
		}
	}
	for _, w := range was[1:] {
		if _, ok := lookup(now, w.name); !ok {
			words = append(words, "(was "+render([]attr{w})+")")
		}
	}
	if len(words) == 0 {
		// Only something ip(8) does not print differs (flags).
		return head + " " + render(now[1:]) + " (was " + render(was[1:]) + ")"
	}
	return head + " " + strings.Join(words, " ")
}

// ruleText splits a rule into "rule 900" ("rule 900 (inet6)" for IPv6)
// and " not fwmark 0xe00/0xf00 lookup 900".
func ruleText(r netwatch.Rule) (head, body string) {
	p := strconv.FormatUint(uint64(r.Priority), 10)
	head = "rule " + p
	if r.Family == netwatch.IPv6 {
		head += " (inet6)"
	}
	return head, strings.TrimPrefix(r.String(), p+":")
}

// attr is one word of a route in ip(8)'s order; the destination has no
// name.
type attr struct{ name, value string }

func lookup(as []attr, name string) (string, bool) {
	for _, a := range as {
		if a.name == name {
			return a.value, true
		}
	}
	return "", false
}

func linkName(links linkNames, index uint32) string {
	if links != nil {
		if l, ok := links(index); ok {
			return l.Name
		}
	}
	return "#" + strconv.FormatUint(uint64(index), 10)
}

// routeAttrs lists a route's words: destination (after the type, unless
// unicast), then from, via, dev, nexthops, scope, src, metric and mtu where
// set.
func routeAttrs(r netwatch.Route, links linkNames) []attr {
	dst := r.Dst.String()
	if r.Type != netwatch.RouteUnicast && r.Type != netwatch.RouteUnspec {
		dst = r.Type.String() + " " + dst
	}
	as := []attr{{"", dst}}
	add := func(name, value string) { as = append(as, attr{name, value}) }
	if r.Src.IsValid() {
		add("from", r.Src.String())
	}
	if r.Gateway.IsValid() {
		add("via", r.Gateway.String())
	}
	if r.Index != 0 {
		add("dev", linkName(links, r.Index))
	}
	if len(r.NextHops) > 0 {
		var nhs []string
		for _, nh := range r.NextHops {
			s := ""
			if nh.Gateway.IsValid() {
				s += "via " + nh.Gateway.String() + " "
			}
			s += "dev " + linkName(links, nh.Index) + " weight " + strconv.Itoa(int(nh.Weight))
			nhs = append(nhs, s)
		}
		add("nexthop", strings.Join(nhs, " nexthop "))
	}
	if r.NHID != 0 {
		add("nhid", strconv.FormatUint(uint64(r.NHID), 10))
	}
	if r.Scope != netwatch.ScopeUniverse {
		add("scope", r.Scope.String())
	}
	if r.PrefSrc.IsValid() {
		add("src", r.PrefSrc.String())
	}
	if r.Metric != 0 {
		add("metric", strconv.FormatUint(uint64(r.Metric), 10))
	}
	if r.MTU != 0 {
		add("mtu", strconv.FormatUint(uint64(r.MTU), 10))
	}
	return as
}

func render(as []attr) string {
	var b strings.Builder
	for i, a := range as {
		if i > 0 {
			b.WriteByte(' ')
		}
		if a.name != "" {
			b.WriteString(a.name)
			b.WriteByte(' ')
		}
		b.WriteString(a.value)
	}
	return b.String()
}

// renderDiff renders now with "(was OLD)" after each word whose value
// differs in was, "(was unset)" after words was lacks, and the words only
// was has at the end, as "(was NAME VALUE)". Without hasWas it is render.
func renderDiff(now, was []attr, hasWas bool) string {
	if !hasWas {
		return render(now)
	}
	var b strings.Builder
	for i, a := range now {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(render([]attr{a}))
		if a.name == "" {
			continue
		}
		switch w, ok := lookup(was, a.name); {
		case !ok:
			b.WriteString(" (was unset)")
		case w != a.value:
			b.WriteString(" (was " + w + ")")
		}
	}
	for _, w := range was {
		if w.name == "" {
			continue
		}
		if _, ok := lookup(now, w.name); !ok {
			b.WriteString(" (was " + render([]attr{w}) + ")")
		}
	}
	return b.String()
}
