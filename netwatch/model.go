package netwatch

import (
	"cmp"
	"net/netip"
	"slices"
	"strconv"
	"time"
)

// Family is an address family. Its values are 4 and 6 (what the JSON dump
// prints); its String is iproute2's name, "inet" or "inet6".
type Family uint8

// The families netwatch caches.
const (
	IPv4 Family = 4
	IPv6 Family = 6
)

func (f Family) String() string {
	switch f {
	case IPv4:
		return "inet"
	case IPv6:
		return "inet6"
	}
	return "unknown(" + strconv.Itoa(int(f)) + ")"
}

// FamilyOf returns the family of a: IPv4 for 4-in-6 addresses too.
func FamilyOf(a netip.Addr) Family {
	if a.Unmap().Is4() {
		return IPv4
	}
	return IPv6
}

// Table is a routing table ID. Tables above 255 are common; always the
// RTA_TABLE attribute, never the header byte.
type Table uint32

// Reserved tables.
const (
	tableUnspec  Table = 0
	tableCompat  Table = 252
	tableDefault Table = 253
	TableMain    Table = 254
	TableLocal   Table = 255
)

func (t Table) String() string {
	switch t {
	case tableUnspec:
		return "unspec"
	case tableDefault:
		return "default"
	case TableMain:
		return "main"
	case TableLocal:
		return "local"
	}
	return strconv.FormatUint(uint64(t), 10)
}

// Protocol is rtm_protocol on routes and FRA_PROTOCOL on rules: who installed
// the object.
type Protocol uint8

// Well-known protocols (from /etc/iproute2/rt_protos).
const (
	protoUnspec     Protocol = 0
	protoRedirect   Protocol = 1
	ProtoKernel     Protocol = 2
	ProtoBoot       Protocol = 3
	ProtoStatic     Protocol = 4
	protoRA         Protocol = 9
	ProtoDHCP       Protocol = 16
	protoKeepalived Protocol = 18
	protoBabel      Protocol = 42
	protoBIRD       Protocol = 12
	protoBGP        Protocol = 186
	protoISIS       Protocol = 187
	protoOSPF       Protocol = 188
	protoRIP        Protocol = 189
	protoEIGRP      Protocol = 192
)

var protoNames = map[Protocol]string{
	protoUnspec: "unspec", protoRedirect: "redirect", ProtoKernel: "kernel",
	ProtoBoot: "boot", ProtoStatic: "static", protoRA: "ra", ProtoDHCP: "dhcp",
	protoKeepalived: "keepalived", protoBabel: "babel", protoBIRD: "bird",
	protoBGP: "bgp", protoISIS: "isis", protoOSPF: "ospf", protoRIP: "rip",
	protoEIGRP: "eigrp",
}

// String returns the iproute2 name, or the number for a protocol without one.
func (p Protocol) String() string {
	if s, ok := protoNames[p]; ok {
		return s
	}
	return strconv.Itoa(int(p))
}

// Scope is rtm_scope / ifa_scope.
type Scope uint8

// Scopes.
const (
	ScopeUniverse Scope = 0
	scopeSite     Scope = 200
	ScopeLink     Scope = 253
	ScopeHost     Scope = 254
	scopeNowhere  Scope = 255
)

func (s Scope) String() string {
	switch s {
	case ScopeUniverse:
		return "global"
	case scopeSite:
		return "site"
	case ScopeLink:
		return "link"
	case ScopeHost:
		return "host"
	case scopeNowhere:
		return "nowhere"
	}
	return "unknown(" + strconv.Itoa(int(s)) + ")"
}

// RouteType is rtm_type.
type RouteType uint8

// Route types.
const (
	routeUnspec      RouteType = 0
	RouteUnicast     RouteType = 1
	RouteLocal       RouteType = 2
	routeBroadcast   RouteType = 3
	routeAnycast     RouteType = 4
	routeMulticast   RouteType = 5
	RouteBlackhole   RouteType = 6
	RouteUnreachable RouteType = 7
	RouteProhibit    RouteType = 8
	RouteThrow       RouteType = 9
	routeNAT         RouteType = 10
)

var routeTypeNames = [...]string{"unspec", "unicast", "local", "broadcast", "anycast",
	"multicast", "blackhole", "unreachable", "prohibit", "throw", "nat"}

func (t RouteType) String() string {
	if int(t) < len(routeTypeNames) {
		return routeTypeNames[t]
	}
	return "unknown(" + strconv.Itoa(int(t)) + ")"
}

// Mark is a firewall mark or mask (FRA_FWMARK, FRA_FWMASK).
type Mark uint32

func (m Mark) String() string { return "0x" + strconv.FormatUint(uint64(m), 16) }

// RuleAction is fib_rule_hdr.action.
type RuleAction uint8

// Rule actions.
const (
	actionUnspec      RuleAction = 0
	ActionToTable     RuleAction = 1
	actionGoto        RuleAction = 2
	actionNop         RuleAction = 3
	actionBlackhole   RuleAction = 6
	actionUnreachable RuleAction = 7
	actionProhibit    RuleAction = 8
)

func (a RuleAction) String() string {
	switch a {
	case actionUnspec:
		return "unspec"
	case ActionToTable:
		return "lookup"
	case actionGoto:
		return "goto"
	case actionNop:
		return "nop"
	case actionBlackhole:
		return "blackhole"
	case actionUnreachable:
		return "unreachable"
	case actionProhibit:
		return "prohibit"
	}
	return "unknown(" + strconv.Itoa(int(a)) + ")"
}

// OperState is IFLA_OPERSTATE (RFC 2863).
type OperState uint8

// Operational states.
const (
	operUnknown        OperState = 0
	operNotPresent     OperState = 1
	operDown           OperState = 2
	operLowerLayerDown OperState = 3
	operTesting        OperState = 4
	operDormant        OperState = 5
	operUp             OperState = 6
)

var operNames = [...]string{"UNKNOWN", "NOTPRESENT", "DOWN", "LOWERLAYERDOWN", "TESTING", "DORMANT", "UP"}

func (o OperState) String() string {
	if int(o) < len(operNames) {
		return operNames[o]
	}
	return "unknown(" + strconv.Itoa(int(o)) + ")"
}

// Link is a network interface.
type Link struct {
	Index     uint32
	Name      string
	MTU       uint32
	Flags     LinkFlags // IFF_* bits as the kernel reports them
	OperState OperState // IFLA_OPERSTATE
	Kind      string    // IFLA_INFO_KIND: "veth", "tun", "bridge", "wireguard"; empty for physical links
	Master    uint32    // IFLA_MASTER, 0 if none
}

// Addr is an interface address. Prefix holds the address itself with the
// prefix length of its subnet (10.0.0.5/16): it is not masked.
type Addr struct {
	Index  uint32
	Prefix netip.Prefix
	Peer   netip.Addr // IFA_ADDRESS when it differs from IFA_LOCAL (point-to-point)
	Scope  Scope
	Flags  AddrFlags // IFA_F_* (IFA_FLAGS when present)
	Label  string
}

// usable reports whether the address can be a new connection's source:
// it is not tentative (still in duplicate address detection, unless
// optimistic), has not failed DAD, and is not deprecated.
func (a Addr) usable() bool {
	if a.Flags&AddrTentative != 0 && a.Flags&addrOptimistic == 0 {
		return false
	}
	return a.Flags&(addrDADFailed|addrDeprecated) == 0
}

// addrKey identifies an address. The peer is part of it: IPv4 allows the
// same local address and prefix length on a link once per peer.
type addrKey struct {
	Index  uint32
	Prefix netip.Prefix
	Peer   netip.Addr
}

// key returns the address's identity.
func (a Addr) key() addrKey { return addrKey{a.Index, a.Prefix, a.Peer} }

// NextHop is one path of a multipath route.
type NextHop struct {
	Gateway netip.Addr
	Index   uint32 // output link
	Weight  uint16 // rtnh_hops + 1
	Flags   RouteFlags
	Flow    uint32 // RTA_FLOW: the path's realms
	Encap   Encap  // the path's lightweight tunnel encapsulation
	// Attrs are the path's other attributes (RTA_NEWDST, …) as the
	// kernel sent them.
	Attrs Attrs
}

// Route is a route of any table and either family, with every attribute
// the kernel reports for it: the ones programs use are typed, the others
// (Attrs) are kept as they came, compared by Equal and written back by a
// replace. Dst is always masked; a default route is 0.0.0.0/0 or ::/0.
type Route struct {
	Family Family
	Table  Table
	Dst    netip.Prefix
	Src    netip.Prefix // source prefix selector (IPv6 "from"); zero if none
	TOS    uint8
	// Metric is RTA_PRIORITY. The kernel stores an IPv6 route asked for
	// with metric 0 at 1024, and reports that: Clean (and so Matches and
	// reconcile.Plan) takes a desired IPv6 route with metric 0 as one with
	// 1024.
	Metric   uint32
	Gateway  netip.Addr
	Index    uint32 // output link (RTA_OIF)
	PrefSrc  netip.Addr
	MTU      uint32 // RTAX_MTU from RTA_METRICS; 0 when unset (the link's)
	Protocol Protocol
	Scope    Scope
	Type     RouteType
	Flags    RouteFlags
	NextHops []NextHop // RTA_MULTIPATH paths; nil for a single-path route
	NHID     uint32    // RTA_NH_ID: the route uses a nexthop object
	// Metrics are the other RTA_METRICS and the lock bits of all.
	Metrics Metrics
	Flow    uint32    // RTA_FLOW: realms, from<<16 | to ("realm 7" is 7)
	Pref    RoutePref // RTA_PREF: an IPv6 route's router preference
	Expires time.Time // when the kernel removes the route; zero for never
	Encap   Encap     // RTA_ENCAP_TYPE and RTA_ENCAP
	Attrs   Attrs     // every other attribute the kernel sent
}

// Metrics are a route's RTA_METRICS other than its MTU (Route.MTU), in the
// kernel's units, and the lock bits of all of them. The zero value is none.
type Metrics struct {
	// Locks are RTAX_LOCK: bit 1<<RTAX_x set locks metric x against path
	// MTU discovery and TCP's updates ("mtu lock 1355" sets
	// 1<<unix.RTAX_MTU).
	Locks      uint32
	Window     uint32 // RTAX_WINDOW
	RTT        uint32 // RTAX_RTT, in 1/8 ms ("rtt 100ms" is 800)
	RTTVar     uint32 // RTAX_RTTVAR, in 1/4 ms
	SSThresh   uint32 // RTAX_SSTHRESH
	CWnd       uint32 // RTAX_CWND
	AdvMSS     uint32 // RTAX_ADVMSS
	Reordering uint32 // RTAX_REORDERING
	HopLimit   uint32 // RTAX_HOPLIMIT
	InitCWnd   uint32 // RTAX_INITCWND
	Features   uint32 // RTAX_FEATURES: RTAX_FEATURE_* bits (ecn is 1)
	RTOMin     uint32 // RTAX_RTO_MIN, in ms
	InitRWnd   uint32 // RTAX_INITRWND
	QuickAck   uint32 // RTAX_QUICKACK
	CongCtl    string // RTAX_CC_ALGO: the congestion control algorithm
	FastOpen   uint32 // RTAX_FASTOPEN_NO_COOKIE
	// Attrs are metrics netwatch does not know, as the kernel sent them.
	Attrs Attrs
}

// lockMTU is the lock bit of the MTU in Metrics.Locks (1<<RTAX_MTU).
const lockMTU = 1 << 2

// RoutePref is RTA_PREF, the preference an IPv6 router advertised
// (RFC 4191): medium, the zero value, for every other route.
type RoutePref uint8

// Route preferences.
const (
	prefMedium RoutePref = 0
	prefHigh   RoutePref = 1
	prefLow    RoutePref = 3
)

func (p RoutePref) String() string {
	switch p {
	case prefMedium:
		return "medium"
	case prefHigh:
		return "high"
	case prefLow:
		return "low"
	}
	return "unknown(" + strconv.Itoa(int(p)) + ")"
}

// Encap is a lightweight tunnel encapsulation (ip route … encap): its type
// (LWTUNNEL_ENCAP_*) and its nested attributes as the kernel sent them.
type Encap struct {
	Type uint16
	Data string
}

// Attrs are netlink attributes kept as the kernel sent them, type and
// length headers included, in its order (netlink.NewAttributeDecoder reads
// them). A string, so that values holding
// them stay comparable and immutable; the zero value is none.
type Attrs string

// each yields the attributes' types and values. (A program reads them with
// netlink.NewAttributeDecoder([]byte(a)), as examples/watch does.)
func (a Attrs) each(yield func(typ uint16, val []byte) bool) {
	for at := (attrs{b: []byte(a)}); at.next(); {
		if !yield(at.typ, at.val) {
			return
		}
	}
}

// RouteKey identifies a route the way the kernel does: a second route with
// the same key replaces the first (or is appended to it).
type RouteKey struct {
	Family Family
	Table  Table
	Dst    netip.Prefix
	Src    netip.Prefix
	TOS    uint8
	Metric uint32
}

// Compare orders route keys by family, table, destination (address, then
// length: a covering prefix before the prefixes it covers), source, TOS
// and metric, as a Snapshot's views list routes. It returns -1, 0 or +1.
func (k RouteKey) Compare(o RouteKey) int {
	return cmp.Or(
		cmp.Compare(k.Family, o.Family), cmp.Compare(k.Table, o.Table),
		k.Dst.Addr().Compare(o.Dst.Addr()), cmp.Compare(k.Dst.Bits(), o.Dst.Bits()),
		k.Src.Addr().Compare(o.Src.Addr()), cmp.Compare(k.Src.Bits(), o.Src.Bits()),
		cmp.Compare(k.TOS, o.TOS), cmp.Compare(k.Metric, o.Metric))
}

func compareRoutes(a, b Route) int { return a.Key().Compare(b.Key()) }

// ipv6DefaultMetric is the metric the kernel gives an IPv6 route that
// asks for none (or for 0).
const ipv6DefaultMetric = 1024

// Key returns the route's identity.
func (r Route) Key() RouteKey {
	return RouteKey{r.Family, r.Table, r.Dst, r.Src, r.TOS, r.Metric}
}

// expiresSlack is how far apart two expiries may be and still be the same:
// the kernel counts a route's lifetime down and reports it rounded, so two
// reports of an unchanged route differ a little.
const expiresSlack = 2 * time.Second

// Equal reports whether r and o are the same route with the same
// attributes: every one of them, except that expiries (both set or both
// not) may differ by the rounding of the kernel's count-down.
func (r Route) Equal(o Route) bool {
	return r.Family == o.Family && r.Table == o.Table && r.Dst == o.Dst && r.Src == o.Src &&
		r.TOS == o.TOS && r.Metric == o.Metric && r.Gateway == o.Gateway && r.Index == o.Index &&
		r.PrefSrc == o.PrefSrc && r.MTU == o.MTU && r.Protocol == o.Protocol && r.Scope == o.Scope &&
		r.Type == o.Type && r.Flags == o.Flags && r.NHID == o.NHID && slices.Equal(r.NextHops, o.NextHops) &&
		r.Metrics == o.Metrics && r.Flow == o.Flow && r.Pref == o.Pref && r.Encap == o.Encap && r.Attrs == o.Attrs &&
		sameExpiry(r.Expires, o.Expires)
}

func sameExpiry(a, b time.Time) bool {
	if a.IsZero() || b.IsZero() {
		return a.IsZero() == b.IsZero()
	}
	d := a.Sub(b)
	return -expiresSlack < d && d < expiresSlack
}

// PortRange is FRA_SPORT_RANGE / FRA_DPORT_RANGE.
type PortRange struct{ Start, End uint16 }

// UIDRange is FRA_UID_RANGE.
type UIDRange struct {
	Set        bool
	Start, End uint32
}

// Optional is a rule attribute whose unset value is the kernel's -1.
type Optional struct {
	Set   bool
	Value int32
}

// Rule is a policy routing rule. Rules have no key: the kernel allows
// identical rules, and a delete removes the first rule that matches every
// attribute it names. Compare rules with Equal.
type Rule struct {
	Family            Family
	Priority          uint32
	Table             Table
	Action            RuleAction
	Invert            bool // FIB_RULE_INVERT: "not"
	Mark              Mark // FRA_FWMARK
	Mask              Mark // FRA_FWMASK; 0 when unset
	Protocol          Protocol
	Src               netip.Prefix // "from"; zero when any
	Dst               netip.Prefix // "to"; zero when any
	TOS               uint8
	IIF               string
	OIF               string
	Goto              uint32
	Flow              uint32 // FRA_FLOW (realms)
	L3MDev            uint8
	IPProto           uint8
	SPort             PortRange
	DPort             PortRange
	UID               UIDRange // FRA_UID_RANGE; zero when unset
	TunID             uint64   // FRA_TUN_ID
	SuppressPrefixLen Optional // FRA_SUPPRESS_PREFIXLEN; unset is the kernel's -1
	SuppressIfGroup   Optional // FRA_SUPPRESS_IFGROUP; unset is the kernel's -1
	// State are the fib_rule_hdr flags other than "not" that the kernel
	// sets on its own (FIB_RULE_UNRESOLVED: a goto to a priority with no
	// rule; the detached flags of a missing iif or oif). Equal ignores
	// them and a request never carries them.
	State uint32
	// Attrs are the attributes netwatch does not decode (newer kernels'
	// DSCP, flow label and port masks, …), as the kernel sent them: they
	// are compared and written back like the others, so a rule that
	// differs in any selector is never the same rule.
	Attrs Attrs
}

// Equal reports whether r and o are the same rule: every attribute but
// the kernel's own State.
func (r Rule) Equal(o Rule) bool {
	r.State, o.State = 0, 0
	return r == o
}

// String is the rule as `ip rule` prints it, every attribute named, "from
// all" for a rule with no source, a host without its /32 or /128:
// "900:\tnot from all fwmark 0xe00/0xf00 lookup 900 proto 109".
// TestKernelText checks it against ip(8) for rules with every attribute.
func (r Rule) String() string {
	ws := ruleWords(r)
	if !r.Src.IsValid() {
		i := 0
		if r.Invert {
			i = 1
		}
		ws = slices.Insert(ws, i, word{"from", "all"})
	}
	return strconv.FormatUint(uint64(r.Priority), 10) + ":\t" + render(ws)
}

// kernelRouteFlags are the route and next-hop flags the kernel sets on its
// own: a route whose link lost carrier is linkdown, one whose link went down
// is dead, offload and trap come from hardware, unresolved from the
// neighbour state, and the kernel's RTM_F_PREFIX (0x800) marks IPv6 prefix
// routes and RTM_F_OFFLOAD_FAILED (0x20000000) a failed offload. A desired
// route never carries them (the kernel refuses dead and linkdown in a
// request), so Route.Matches ignores them when it compares a desired route with the
// kernel's and a plan strips them from the routes it asks the kernel to install.
const kernelRouteFlags = RouteDead | routeOffload | RouteLinkdown | routeUnresolved | routeTrap | 0x800 | 0x20000000

// Clean returns r as a request may name it and as the kernel would store
// it: without the flags only the kernel sets, on it and on its next hops
// (dead, linkdown, offload, trap, unresolved, and the kernel's
// RTM_F_PREFIX and RTM_F_OFFLOAD_FAILED bits), and, for IPv6, with a
// metric of 0 made the kernel's 1024.
func (r Route) Clean() Route {
	r.Flags &^= kernelRouteFlags
	if r.Family == IPv6 && r.Metric == 0 {
		r.Metric = ipv6DefaultMetric
	}
	if r.NextHops != nil {
		nhs := slices.Clone(r.NextHops)
		for i := range nhs {
			nhs[i].Flags &^= kernelRouteFlags
		}
		r.NextHops = nhs
	}
	return r
}

// Matches reports whether r and o are the same route once both are Clean:
// whether a desired route r is in the kernel as o. An IPv6 reject route
// (blackhole, unreachable, prohibit, throw) that r names without an output
// link matches one on lo: the kernel hangs every such route on the
// loopback link and reports it as "dev lo".
func (r Route) Matches(o Route) bool {
	r, o = r.Clean(), o.Clean()
	if r.Family == IPv6 && r.Index == 0 && o.Index == loopbackIndex && r.Type.rejects() {
		o.Index = 0
	}
	return r.Equal(o)
}

// loopbackIndex is lo's index, the same in every network namespace.
const loopbackIndex = 1

// rejects reports whether routes of type t drop the packets they match
// (or, for throw, end the table's lookup) instead of forwarding them.
func (t RouteType) rejects() bool {
	return t >= RouteBlackhole && t <= RouteThrow
}
