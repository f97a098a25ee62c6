package netwatch

import (
	"encoding/hex"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// Describe renders o as the one log line of the kernel change it makes, in
// ip(8)'s words, naming the object and what it was before:
//
//	table 900: 10.0.0.0/16 via 10.0.0.1 dev enp7s0 src 10.0.0.5 mtu 1355
//	table 900: 10.0.0.0/16 via 10.0.0.1 dev enp7s0 src 10.0.0.5 mtu 1420 (was 1355)
//	table 920: default via 192.0.2.254 dev eth1 (was default via 192.0.2.1 dev eth1)
//	table 900: removed 10.0.0.0/16 via 10.0.0.1 dev enp7s0 proto 109 src 10.0.0.5 mtu 1355
//	rule 900: not fwmark 0xe00/0xf00 lookup 900
//	rule 900 (inet6): removed not fwmark 0xe00/0xf00 lookup 900 proto 109
//	dhcp route 10.0.0.0/16 mtu 1450 (was 1355)
//
// Every attribute the object has is named (metrics and their locks,
// realms, expiry, preference, flags such as onlink, encapsulation, and
// undecoded attributes as hex), and every one that differs from before;
// the protocol is named on removals and when it changes. A route whose
// path changed (its gateway, link or preferred source) is written out
// whole before and after, which reads better than word by word. An IPv6 rule's
// head says "(inet6)", since a rule may name no address; a route's family
// shows in its destination. The last line is a repair of a foreign route,
// named by its protocol, with what changed.
// links resolves link indexes to names, as View.Link does; without it, or
// for a link it does not know, a link is "#INDEX". Call it inside Read,
// with the view the plan was made from.
func (o Op) Describe(links func(index uint32) (Link, bool)) string {
	switch o.Kind {
	case RouteReplace:
		if o.Repair {
			return o.describeRepair(links)
		}
		now := logWords(o.Route, links)
		if !o.HasWas {
			return "table " + o.Route.Table.String() + ": " + render(without(now, "proto"))
		}
		was := logWords(o.Was, links)
		if v, _ := lookup(was, "proto"); v == mustLookup(now, "proto") {
			now, was = without(now, "proto"), without(was, "proto")
		}
		if o.Route.Gateway != o.Was.Gateway || o.Route.Index != o.Was.Index || o.Route.PrefSrc != o.Was.PrefSrc {
			return "table " + o.Route.Table.String() + ": " + render(now) + " (was " + render(was) + ")"
		}
		return "table " + o.Route.Table.String() + ": " + renderDiff(now, was)
	case RouteDelete:
		words := logWords(o.Route, links)
		if p := o.Route.Protocol; p == protoUnspec || p == ProtoBoot {
			words = without(words, "proto") // as ip(8), which leaves out boot
		}
		return "table " + o.Route.Table.String() + ": removed " + render(words)
	case RuleAdd:
		return ruleHead(o.Rule) + ": " + render(without(ruleWords(o.Rule), "proto"))
	case RuleDelete:
		return ruleHead(o.Rule) + ": removed " + render(ruleWords(o.Rule))
	}
	return o.Kind.String()
}

// Describe renders r as `ip route show table all` prints it, on one line
// (a multipath route's next hops follow one another), with link names from
// links (as in Op.Describe) and ip's "ifINDEX" for a link it does not know:
// the destination ("default", a host without its /32 or /128, after the
// type unless unicast), then from, tos, via, dev, table (unless main),
// nexthops, nhid, proto (unless boot), scope (unless universe), src,
// metric, flags, expiry, realms, metrics, preference (IPv6), encapsulation
// and undecoded attributes as hex, each where set. TestKernelText checks it
// against ip(8) for routes with every attribute.
func (r Route) Describe(links func(index uint32) (Link, bool)) string {
	ws := routeWords(r, links)
	if r.Protocol == ProtoBoot {
		ws = without(ws, "proto") // as ip(8), which leaves out boot
	}
	return render(ws)
}

// String is Describe without link names: "10.0.0.0/16 via 10.0.0.1 dev if2
// table 900 proto 109 src 10.0.0.5 mtu 1355".
func (r Route) String() string { return r.Describe(nil) }

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
	now := logWords(rt, links)[1:]
	if !o.HasWas {
		return head + " " + render(now)
	}
	was := logWords(o.Was, links)[1:]
	var words []string
	for _, a := range now {
		switch w, ok := lookup(was, a.name); {
		case !ok:
			words = append(words, render([]word{a})+" (was unset)")
		case w != a.value:
			words = append(words, render([]word{a})+" (was "+w+")")
		}
	}
	for _, w := range was {
		if _, ok := lookup(now, w.name); !ok {
			words = append(words, "(was "+render([]word{w})+")")
		}
	}
	if len(words) == 0 {
		return head + " " + render(now) + " (unchanged)"
	}
	return head + " " + strings.Join(words, " ")
}

// ruleHead is "rule 900", or "rule 900 (inet6)" for IPv6.
func ruleHead(r Rule) string {
	head := "rule " + strconv.FormatUint(uint64(r.Priority), 10)
	if r.Family == IPv6 {
		head += " (inet6)"
	}
	return head
}

// word is one word of a route or rule in ip(8)'s order; the destination
// and flags have no name.
type word struct{ name, value string }

func lookup(as []word, name string) (string, bool) {
	for _, a := range as {
		if a.name == name {
			return a.value, true
		}
	}
	return "", false
}

func mustLookup(as []word, name string) string {
	v, _ := lookup(as, name)
	return v
}

// without returns as without the word called name.
func without(as []word, name string) []word {
	out := make([]word, 0, len(as))
	for _, a := range as {
		if a.name != name {
			out = append(out, a)
		}
	}
	return out
}

// linkName is the name links gives the link, or "ifINDEX", as ip(8)
// names a link it does not know.
func linkName(links func(uint32) (Link, bool), index uint32) string {
	if links != nil {
		if l, ok := links(index); ok {
			return l.Name
		}
	}
	return "if" + strconv.FormatUint(uint64(index), 10)
}

// prefixText is p as ip(8) prints a prefix: the address alone for a host
// prefix, whole for a family's whole space (the word ip uses for it:
// "default" for a route's destination, "all" for a source).
func prefixText(p netip.Prefix, whole string) string {
	switch {
	case p.Bits() == 0:
		return whole
	case p.Bits() == p.Addr().BitLen():
		return p.Addr().String()
	}
	return p.String()
}

// logWords are a route's words in a log line, which names the table in its
// head and the protocol only where it says something: without them, and
// without IPv6's default preference.
func logWords(r Route, links func(uint32) (Link, bool)) []word {
	ws := without(routeWords(r, links), "table")
	if v, _ := lookup(ws, "pref"); v == prefMedium.String() {
		ws = without(ws, "pref")
	}
	return ws
}

func itoa[T ~uint8 | ~uint16 | ~uint32 | ~uint64](v T) string {
	return strconv.FormatUint(uint64(v), 10)
}

// routeWords lists a route's words, as Route.Describe renders them and in
// ip(8)'s order; the protocol is among them.
func routeWords(r Route, links func(uint32) (Link, bool)) []word {
	dst := prefixText(r.Dst, "default")
	if r.Type != RouteUnicast && r.Type != routeUnspec {
		dst = r.Type.String() + " " + dst
	}
	as := []word{{"", dst}}
	add := func(name, value string) { as = append(as, word{name, value}) }
	if r.Src.IsValid() {
		add("from", prefixText(r.Src, "all"))
	}
	if r.TOS != 0 {
		add("tos", "0x"+strconv.FormatUint(uint64(r.TOS), 16))
	}
	if r.Gateway.IsValid() {
		add("via", r.Gateway.String())
	}
	if r.Index != 0 {
		add("dev", linkName(links, r.Index))
	}
	if r.Table != TableMain {
		add("table", r.Table.String())
	}
	if len(r.NextHops) > 0 {
		var nhs []string
		for _, nh := range r.NextHops {
			nhs = append(nhs, hopText(nh, r.Family, links))
		}
		add("nexthop", strings.Join(nhs, " nexthop "))
	}
	if r.NHID != 0 {
		add("nhid", itoa(r.NHID))
	}
	add("proto", r.Protocol.String())
	if r.Scope != ScopeUniverse {
		add("scope", r.Scope.String())
	}
	if r.PrefSrc.IsValid() {
		add("src", r.PrefSrc.String())
	}
	if r.Metric != 0 || r.Family == IPv6 {
		add("metric", itoa(r.Metric)) // an IPv6 route always has one
	}
	if f := flagText(r.Flags); f != "" {
		add("flags", f)
	}
	if !r.Expires.IsZero() {
		add("expires", strconv.Itoa(int(time.Until(r.Expires).Round(time.Second)/time.Second))+"sec")
	}
	if r.Flow != 0 {
		name, v := realmsText(r.Flow)
		add(name, v)
	}
	as = append(as, metricWords(r.MTU, r.Metrics)...)
	if r.Family == IPv6 {
		add("pref", r.Pref.String())
	}
	if r.Encap != (Encap{}) {
		add("encap", encapText(r.Encap))
	}
	if r.Attrs != "" {
		add("attrs", attrsText(r.Attrs))
	}
	return as
}

// hopText is one path of a multipath route.
func hopText(nh NextHop, f Family, links func(uint32) (Link, bool)) string {
	var s []string
	if nh.Gateway.IsValid() {
		s = append(s, "via "+nh.Gateway.String())
	}
	s = append(s, "dev "+linkName(links, nh.Index), "weight "+itoa(nh.Weight))
	if t := flagText(nh.Flags); t != "" {
		s = append(s, t)
	}
	if nh.Flow != 0 {
		name, v := realmsText(nh.Flow)
		s = append(s, name+" "+v)
	}
	if nh.Encap != (Encap{}) {
		s = append(s, "encap "+encapText(nh.Encap))
	}
	if nh.Attrs != "" {
		s = append(s, "attrs "+attrsText(nh.Attrs))
	}
	return strings.Join(s, " ")
}

var flagNames = []struct {
	f    RouteFlags
	name string
}{
	{RouteDead, "dead"}, {routePervasive, "pervasive"}, {RouteOnlink, "onlink"}, {routeOffload, "offload"},
	{RouteLinkdown, "linkdown"}, {routeUnresolved, "unresolved"}, {routeTrap, "trap"},
}

// flagText names route flags as ip(8) does, the ones without a name as hex.
func flagText(f RouteFlags) string {
	var s []string
	for _, n := range flagNames {
		if f&n.f != 0 {
			s = append(s, n.name)
			f &^= n.f
		}
	}
	if f != 0 {
		s = append(s, "flags 0x"+strconv.FormatUint(uint64(f), 16))
	}
	return strings.Join(s, " ")
}

// realmsText renders RTA_FLOW or FRA_FLOW as ip(8) does: "realm TO", or
// "realms FROM/TO".
func realmsText(flow uint32) (name, value string) {
	from, to := flow>>16, flow&0xffff
	if from == 0 {
		return "realm", itoa(to)
	}
	return "realms", itoa(from) + "/" + itoa(to)
}

var metricNames = []struct {
	lock uint32
	name string
	get  func(Metrics) uint32
	unit func(uint32) string
}{
	{1 << 3, "window", func(m Metrics) uint32 { return m.Window }, nil},
	{1 << 4, "rtt", func(m Metrics) uint32 { return m.RTT }, func(v uint32) string { return msText(float64(v) / 8) }},
	{1 << 5, "rttvar", func(m Metrics) uint32 { return m.RTTVar }, func(v uint32) string { return msText(float64(v) / 4) }},
	{1 << 6, "ssthresh", func(m Metrics) uint32 { return m.SSThresh }, nil},
	{1 << 7, "cwnd", func(m Metrics) uint32 { return m.CWnd }, nil},
	{1 << 8, "advmss", func(m Metrics) uint32 { return m.AdvMSS }, nil},
	{1 << 9, "reordering", func(m Metrics) uint32 { return m.Reordering }, nil},
	{1 << 10, "hoplimit", func(m Metrics) uint32 { return m.HopLimit }, nil},
	{1 << 11, "initcwnd", func(m Metrics) uint32 { return m.InitCWnd }, nil},
	{1 << 12, "features", func(m Metrics) uint32 { return m.Features }, featuresText},
	{1 << 13, "rto_min", func(m Metrics) uint32 { return m.RTOMin }, func(v uint32) string { return msText(float64(v)) }},
	{1 << 14, "initrwnd", func(m Metrics) uint32 { return m.InitRWnd }, nil},
	{1 << 15, "quickack", func(m Metrics) uint32 { return m.QuickAck }, nil},
}

// metricWords lists the metrics in ip(8)'s order and words: "mtu lock
// 1355", "rtt 100ms", "congctl reno".
func metricWords(mtu uint32, m Metrics) []word {
	var as []word
	lock := func(bit uint32) string {
		if m.Locks&bit != 0 {
			return "lock "
		}
		return ""
	}
	if mtu != 0 || m.Locks&lockMTU != 0 {
		as = append(as, word{"mtu", lock(lockMTU) + itoa(mtu)})
	}
	for _, n := range metricNames {
		if v := n.get(m); v != 0 || m.Locks&n.lock != 0 {
			s := itoa(v)
			if n.unit != nil {
				s = n.unit(v)
			}
			as = append(as, word{n.name, lock(n.lock) + s})
		}
	}
	if m.CongCtl != "" {
		as = append(as, word{"congctl", lock(1<<16) + m.CongCtl})
	}
	if m.FastOpen != 0 {
		as = append(as, word{"fastopen_no_cookie", itoa(m.FastOpen)})
	}
	if m.Attrs != "" {
		as = append(as, word{"metrics", attrsText(m.Attrs)})
	}
	return as
}

func msText(ms float64) string {
	if ms >= 1000 {
		return strconv.FormatFloat(ms/1000, 'g', -1, 64) + "s"
	}
	return strconv.FormatFloat(ms, 'g', -1, 64) + "ms"
}

func featuresText(v uint32) string {
	var s []string
	for _, f := range []struct {
		bit  uint32
		name string
	}{{1, "ecn"}, {2, "sack"}, {4, "timestamp"}, {8, "allfrag"}, {16, "tcp_usec_ts"}} {
		if v&f.bit != 0 {
			s = append(s, f.name)
			v &^= f.bit
		}
	}
	if v != 0 {
		s = append(s, "0x"+strconv.FormatUint(uint64(v), 16))
	}
	return strings.Join(s, ",")
}

var encapNames = [...]string{"none", "mpls", "ip", "ila", "ip6", "seg6", "bpf", "seg6local", "rpl", "ioam6", "xfrm"}

func encapText(e Encap) string {
	name := itoa(e.Type)
	if int(e.Type) < len(encapNames) {
		name = encapNames[e.Type]
	}
	return name + " " + hex.EncodeToString([]byte(e.Data))
}

// attrsText renders undecoded attributes as TYPE=HEX words.
func attrsText(a Attrs) string {
	var s []string
	a.each(func(typ uint16, val []byte) bool {
		s = append(s, itoa(typ)+"="+hex.EncodeToString(val))
		return true
	})
	return strings.Join(s, ",")
}

// ruleWords lists a rule's words in ip(8)'s order, without "from all".
func ruleWords(r Rule) []word {
	return appendRuleAction(appendRuleSelector(nil, r), r)
}

// appendRuleSelector appends the words of what r matches, ip rule's
// SELECTOR, to as.
func appendRuleSelector(as []word, r Rule) []word {
	add := func(name, value string) { as = append(as, word{name, value}) }
	if r.Invert {
		add("", "not")
	}
	if r.Src.IsValid() {
		add("from", prefixText(r.Src, "all"))
	}
	if r.Dst.IsValid() {
		add("to", prefixText(r.Dst, "all"))
	}
	if r.TOS != 0 {
		add("tos", "0x"+strconv.FormatUint(uint64(r.TOS), 16))
	}
	if r.Mark != 0 || r.Mask != 0 {
		v := r.Mark.String()
		if r.Mask != 0 && r.Mask != 0xffffffff {
			v += "/" + r.Mask.String()
		}
		add("fwmark", v)
	}
	if r.IIF != "" {
		add("iif", r.IIF)
	}
	if r.OIF != "" {
		add("oif", r.OIF)
	}
	if r.L3MDev != 0 {
		add("", "l3mdev")
	}
	if r.UID.Set {
		add("uidrange", itoa(r.UID.Start)+"-"+itoa(r.UID.End))
	}
	if r.IPProto != 0 {
		add("ipproto", ipprotoText(r.IPProto))
	}
	if r.SPort != (PortRange{}) {
		add("sport", portsText(r.SPort))
	}
	if r.DPort != (PortRange{}) {
		add("dport", portsText(r.DPort))
	}
	if r.TunID != 0 {
		add("tun_id", strconv.FormatUint(r.TunID, 10))
	}
	return as
}

// appendRuleAction appends the words of what r does, ip rule's ACTION and
// SUPPRESSOR, and its undecoded attributes, to as.
func appendRuleAction(as []word, r Rule) []word {
	add := func(name, value string) { as = append(as, word{name, value}) }
	switch r.Action {
	case ActionToTable:
		add("lookup", r.Table.String())
	case actionGoto:
		add("goto", itoa(r.Goto))
	default:
		add("", r.Action.String())
	}
	if r.SuppressPrefixLen.Set {
		add("suppress_prefixlength", strconv.Itoa(int(r.SuppressPrefixLen.Value)))
	}
	if r.SuppressIfGroup.Set {
		add("suppress_ifgroup", strconv.Itoa(int(r.SuppressIfGroup.Value)))
	}
	if r.Flow != 0 {
		name, v := realmsText(r.Flow)
		if name == "realm" {
			name = "realms" // ip rule says realms either way
		}
		add(name, v)
	}
	if r.Protocol != 0 && r.Protocol != ProtoKernel {
		add("proto", r.Protocol.String()) // as ip(8), which leaves out kernel
	}
	if r.Attrs != "" {
		add("attrs", attrsText(r.Attrs))
	}
	return as
}

func portsText(p PortRange) string {
	if p.Start == p.End {
		return itoa(p.Start)
	}
	return itoa(p.Start) + "-" + itoa(p.End)
}

func ipprotoText(p uint8) string {
	switch p {
	case 1:
		return "icmp"
	case 6:
		return "tcp"
	case 17:
		return "udp"
	case 58:
		return "ipv6-icmp"
	}
	return itoa(p)
}

func render(as []word) string {
	var b strings.Builder
	for i, a := range as {
		if i > 0 {
			b.WriteByte(' ')
		}
		if a.name != "" && a.name != "flags" {
			b.WriteString(a.name)
			b.WriteByte(' ')
		}
		b.WriteString(a.value)
	}
	return b.String()
}

// renderDiff renders now with "(was OLD)" after each word whose value
// differs in was, "(was unset)" after words was lacks, and the words only
// was has at the end, as "(was NAME VALUE)".
func renderDiff(now, was []word) string {
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
