package netwatch

import (
	"strconv"
	"strings"
)

// Describe renders o as the one log line of the kernel change it makes, in
// ip(8)'s words, naming the object and what it was before:
//
//	table 900: 10.0.0.0/16 via 10.0.0.1 dev enp7s0 src 10.0.0.5 mtu 1355
//	table 900: 10.0.0.0/16 via 10.0.0.1 dev enp7s0 src 10.0.0.5 mtu 1420 (was 1355)
//	table 900: removed 10.0.0.0/16 via 10.0.0.1 dev enp7s0 src 10.0.0.5 mtu 1355
//	rule 900: not fwmark 0xe00/0xf00 lookup 900
//	rule 900 (inet6): removed not fwmark 0xe00/0xf00 lookup 900
//	dhcp route 10.0.0.0/16 mtu 1450 (was 1355)
//
// The last is a repair of a foreign route, named by its protocol. links
// resolves link indexes to names, as View.Link does; without it, or for a
// link it does not know, a link is "#INDEX". Call it inside Read, with the
// view the plan was made from.
func (o Op) Describe(links func(index uint32) (Link, bool)) string {
	switch o.Kind {
	case RouteReplace:
		if o.Repair {
			return o.describeRepair(links)
		}
		var was []word
		if o.HasWas {
			was = routeAttrs(o.Was, links)
		}
		return "table " + o.Route.Table.String() + ": " + renderDiff(routeAttrs(o.Route, links), was, o.HasWas)
	case RouteDelete:
		return "table " + o.Route.Table.String() + ": removed " + render(routeAttrs(o.Route, links))
	case RuleAdd:
		head, body := ruleText(o.Rule)
		return head + ":" + body
	case RuleDelete:
		head, body := ruleText(o.Rule)
		return head + ": removed" + body
	}
	return o.Kind.String()
}

// DescribeWhole is Describe, except that a replaced owned route's previous
// state is written out whole rather than word by word, which reads better
// when the path changes:
//
//	table 920: 0.0.0.0/0 via 192.0.2.254 dev eth1 (was 0.0.0.0/0 via 192.0.2.1 dev eth1)
func (o Op) DescribeWhole(links func(index uint32) (Link, bool)) string {
	if o.Kind != RouteReplace || o.Repair || !o.HasWas {
		return o.Describe(links)
	}
	return "table " + o.Route.Table.String() + ": " + o.Route.Describe(links) + " (was " + o.Was.Describe(links) + ")"
}

// Describe renders r in ip(8)'s words and order, with link names from
// links (as in Op.Describe): the destination (after the type, unless
// unicast), then from, via, dev, nexthops, nhid, scope, src, metric and
// mtu where set. Unlike String, it leaves out the table.
func (r Route) Describe(links func(index uint32) (Link, bool)) string {
	return render(routeAttrs(r, links))
}

// describeRepair names a foreign route by its protocol and shows only
// what changed: "dhcp route 10.0.0.0/16 mtu 1450 (was 1355)".
func (o Op) describeRepair(links func(uint32) (Link, bool)) string {
	proto := o.Route.Protocol
	if o.HasWas {
		proto = o.Was.Protocol
	}
	head := proto.String() + " route " + o.Route.Dst.String()
	if o.Route.Table != TableMain {
		head += " table " + o.Route.Table.String()
	}
	rt := o.Route
	if rt.MTU == 0 && links != nil {
		// A repair that removes the MTU gives the route its link's: say
		// which, as in "dhcp route 10.0.0.0/16 mtu 1450 (was 1355)".
		if l, ok := links(rt.Index); ok {
			rt.MTU = l.MTU
		}
	}
	now := routeAttrs(rt, links)
	if !o.HasWas {
		return head + " " + render(now[1:])
	}
	was := routeAttrs(o.Was, links)
	var words []string
	for _, a := range now[1:] {
		switch w, ok := lookup(was, a.name); {
		case !ok:
			words = append(words, render([]word{a})+" (was unset)")
		case w != a.value:
			words = append(words, render([]word{a})+" (was "+w+")")
		}
	}
	for _, w := range was[1:] {
		if _, ok := lookup(now, w.name); !ok {
			words = append(words, "(was "+render([]word{w})+")")
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
func ruleText(r Rule) (head, body string) {
	p := strconv.FormatUint(uint64(r.Priority), 10)
	head = "rule " + p
	if r.Family == IPv6 {
		head += " (inet6)"
	}
	return head, strings.TrimPrefix(r.String(), p+":")
}

// word is one word of a route in ip(8)'s order; the destination has no
// name.
type word struct{ name, value string }

func lookup(as []word, name string) (string, bool) {
	for _, a := range as {
		if a.name == name {
			return a.value, true
		}
	}
	return "", false
}

func linkName(links func(uint32) (Link, bool), index uint32) string {
	if links != nil {
		if l, ok := links(index); ok {
			return l.Name
		}
	}
	return "#" + strconv.FormatUint(uint64(index), 10)
}

// routeAttrs lists a route's words, as Route.Describe renders them.
func routeAttrs(r Route, links func(uint32) (Link, bool)) []word {
	dst := r.Dst.String()
	if r.Type != RouteUnicast && r.Type != RouteUnspec {
		dst = r.Type.String() + " " + dst
	}
	as := []word{{"", dst}}
	add := func(name, value string) { as = append(as, word{name, value}) }
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
	if r.Scope != ScopeUniverse {
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

func render(as []word) string {
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
func renderDiff(now, was []word, hasWas bool) string {
	if !hasWas {
		return render(now)
	}
	var b strings.Builder
	for i, a := range now {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(render([]word{a}))
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
			b.WriteString(" (was " + render([]word{w}) + ")")
		}
	}
	return b.String()
}
