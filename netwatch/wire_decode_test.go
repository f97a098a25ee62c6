//go:build linux

package netwatch

import (
	"encoding"
	"errors"
	"net"
	"net/netip"
	"testing"

	gocmp "github.com/google/go-cmp/cmp"
	"github.com/jsimonetti/rtnetlink/v2"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// The decoder's cases, with messages built by an independent encoder
// (jsimonetti/rtnetlink/v2) where it can build them, by hand where it
// cannot (malformed bytes, attributes it does not know).

func marshal(t testing.TB, m encoding.BinaryMarshaler) []byte {
	t.Helper()
	b, err := m.MarshalBinary()
	if err != nil {
		t.Fatalf("marshal %T: %v", m, err)
	}
	return b
}

func ptr[T any](v T) *T { return &v }

// attr encodes one netlink attribute.
func attr(typ uint16, data []byte) []byte {
	ae := netlink.NewAttributeEncoder()
	ae.Bytes(typ, data)
	b, _ := ae.Encode()
	return b
}

// cmpNetip compares netip values, which have no exported fields, by value.
var cmpNetip = gocmp.Options{
	gocmp.Comparer(func(a, b netip.Addr) bool { return a == b }),
	gocmp.Comparer(func(a, b netip.Prefix) bool { return a == b }),
}

func ip(s string) net.IP { return net.IP(netip.MustParseAddr(s).AsSlice()) }

// typicalRoute is a route of a full BGP table as the kernel dumps it: a /24
// in a table above 255 via a gateway, with a metric, a prefsrc and an MTU.
func typicalRoute(t testing.TB) []byte {
	return marshal(t, &rtnetlink.RouteMessage{
		Family: unix.AF_INET, DstLength: 24, Table: unix.RT_TABLE_COMPAT, Protocol: unix.RTPROT_BGP,
		Scope: unix.RT_SCOPE_UNIVERSE, Type: unix.RTN_UNICAST,
		Attributes: rtnetlink.RouteAttributes{
			Table: 70000, Dst: ip("10.20.30.0"), Gateway: ip("10.0.0.1"), OutIface: 2, Priority: 20,
			Src: ip("10.0.0.5"), Metrics: &rtnetlink.RouteMetrics{MTU: 1355},
		},
	})
}

func TestDecodeRoute(t *testing.T) {
	for _, tc := range []struct {
		name  string
		msg   *rtnetlink.RouteMessage
		raw   []byte // instead of msg
		extra []byte // attributes appended to msg
		want  Route
		err   error
	}{{
		name: "typical",
		raw:  typicalRoute(t),
		want: Route{Family: IPv4, Table: 70000, Dst: netip.MustParsePrefix("10.20.30.0/24"), Gateway: netip.MustParseAddr("10.0.0.1"),
			Index: 2, Metric: 20, PrefSrc: netip.MustParseAddr("10.0.0.5"), MTU: 1355, Protocol: protoBGP, Type: RouteUnicast},
	}, {
		name: "table from the header without RTA_TABLE",
		msg: &rtnetlink.RouteMessage{Family: unix.AF_INET, DstLength: 8, Table: 100, Type: unix.RTN_BLACKHOLE,
			Attributes: rtnetlink.RouteAttributes{Dst: ip("10.0.0.0")}},
		want: Route{Family: IPv4, Table: 100, Dst: netip.MustParsePrefix("10.0.0.0/8"), Type: RouteBlackhole},
	}, {
		name: "destination masked",
		msg: &rtnetlink.RouteMessage{Family: unix.AF_INET, DstLength: 8, Table: 254, Type: unix.RTN_UNICAST,
			Attributes: rtnetlink.RouteAttributes{Dst: ip("10.1.2.3"), OutIface: 3}},
		want: Route{Family: IPv4, Table: TableMain, Dst: netip.MustParsePrefix("10.0.0.0/8"), Index: 3, Type: RouteUnicast},
	}, {
		name: "IPv6 default route",
		msg: &rtnetlink.RouteMessage{Family: unix.AF_INET6, Table: 254, Protocol: unix.RTPROT_RA, Type: unix.RTN_UNICAST,
			Attributes: rtnetlink.RouteAttributes{Table: 254, Gateway: ip("fe80::1"), OutIface: 2, Priority: 1024}},
		want: Route{Family: IPv6, Table: TableMain, Dst: netip.MustParsePrefix("::/0"), Gateway: netip.MustParseAddr("fe80::1"),
			Index: 2, Metric: 1024, Protocol: protoRA, Type: RouteUnicast},
	}, {
		name: "IPv4 default route",
		msg: &rtnetlink.RouteMessage{Family: unix.AF_INET, Table: 254, Type: unix.RTN_UNICAST,
			Attributes: rtnetlink.RouteAttributes{Gateway: ip("10.0.0.1"), OutIface: 2}},
		want: Route{Family: IPv4, Table: TableMain, Dst: netip.MustParsePrefix("0.0.0.0/0"), Gateway: netip.MustParseAddr("10.0.0.1"),
			Index: 2, Type: RouteUnicast},
	}, {
		name: "IPv6 source prefix and flags",
		msg: &rtnetlink.RouteMessage{Family: unix.AF_INET6, DstLength: 64, SrcLength: 48, Table: 254, Type: unix.RTN_UNICAST,
			Flags:      unix.RTNH_F_LINKDOWN | unix.RTNH_F_ONLINK | unix.RTM_F_NOTIFY,
			Attributes: rtnetlink.RouteAttributes{Dst: ip("fd09::"), OutIface: 2}},
		extra: attr(unix.RTA_SRC, ip("fd00:1:2:3::")),
		want: Route{Family: IPv6, Table: TableMain, Dst: netip.MustParsePrefix("fd09::/64"), Src: netip.MustParsePrefix("fd00:1:2::/48"),
			Index: 2, Type: RouteUnicast, Flags: RouteLinkdown | RouteOnlink},
	}, {
		name: "source length without RTA_SRC",
		msg: &rtnetlink.RouteMessage{Family: unix.AF_INET6, DstLength: 64, SrcLength: 48, Table: 254, Type: unix.RTN_UNICAST,
			Attributes: rtnetlink.RouteAttributes{Dst: ip("fd09::"), OutIface: 2}},
		err: errMalformed,
	}, {
		name:  "IPv4 source prefix",
		msg:   &rtnetlink.RouteMessage{Family: unix.AF_INET, DstLength: 24, SrcLength: 24, Table: 254, Type: unix.RTN_UNICAST, Attributes: rtnetlink.RouteAttributes{Dst: ip("10.9.0.0"), OutIface: 2}},
		extra: attr(unix.RTA_SRC, ip("10.8.0.0")),
		err:   errMalformed,
	}, {
		name: "IPv6 TOS",
		msg:  &rtnetlink.RouteMessage{Family: unix.AF_INET6, DstLength: 64, Tos: 0x10, Table: 254, Type: unix.RTN_UNICAST, Attributes: rtnetlink.RouteAttributes{Dst: ip("fd09::"), OutIface: 2}},
		err:  errMalformed,
	}, {
		name:  "nexthop object",
		msg:   &rtnetlink.RouteMessage{Family: unix.AF_INET, DstLength: 24, Table: 254, Type: unix.RTN_UNICAST, Attributes: rtnetlink.RouteAttributes{Dst: ip("10.9.0.0"), Gateway: ip("10.0.0.1"), OutIface: 2}},
		extra: attr(rtaNHID, []byte{7, 0, 0, 0}),
		want: Route{Family: IPv4, Table: TableMain, Dst: netip.MustParsePrefix("10.9.0.0/24"), Gateway: netip.MustParseAddr("10.0.0.1"),
			Index: 2, Type: RouteUnicast, NHID: 7},
	}, {
		name: "IPv4 via IPv6",
		msg: &rtnetlink.RouteMessage{Family: unix.AF_INET, DstLength: 24, Table: 254, Type: unix.RTN_UNICAST,
			Attributes: rtnetlink.RouteAttributes{Dst: ip("10.6.0.0"), OutIface: 2,
				Via: &rtnetlink.RouteVia{Family: unix.AF_INET6, Addr: ip("fe80::1")}}},
		want: Route{Family: IPv4, Table: TableMain, Dst: netip.MustParsePrefix("10.6.0.0/24"), Gateway: netip.MustParseAddr("fe80::1"),
			Index: 2, Type: RouteUnicast},
	}, {
		name: "multipath",
		msg: &rtnetlink.RouteMessage{Family: unix.AF_INET, DstLength: 24, Table: 254, Type: unix.RTN_UNICAST,
			Attributes: rtnetlink.RouteAttributes{Dst: ip("10.4.0.0"), Multipath: []rtnetlink.NextHop{
				{Hop: rtnetlink.RTNextHop{Hops: 2, IfIndex: 2}, Gateway: ip("10.0.0.2")},
				{Hop: rtnetlink.RTNextHop{Flags: unix.RTNH_F_LINKDOWN, IfIndex: 3}, Gateway: ip("10.1.0.3")},
			}}},
		want: Route{Family: IPv4, Table: TableMain, Dst: netip.MustParsePrefix("10.4.0.0/24"), Type: RouteUnicast, NextHops: []NextHop{
			{Gateway: netip.MustParseAddr("10.0.0.2"), Index: 2, Weight: 3},
			{Gateway: netip.MustParseAddr("10.1.0.3"), Index: 3, Weight: 1, Flags: RouteLinkdown},
		}},
	}, {
		name: "cloned",
		msg: &rtnetlink.RouteMessage{Family: unix.AF_INET6, DstLength: 128, Table: 254, Flags: unix.RTM_F_CLONED, Type: unix.RTN_UNICAST,
			Attributes: rtnetlink.RouteAttributes{Dst: ip("fd09::1"), OutIface: 2}},
		err: errSkip,
	}, {
		name: "multicast routing family",
		msg:  &rtnetlink.RouteMessage{Family: 128, Table: 254},
		err:  errSkip,
	}, {
		name: "IPv6 address in an IPv4 route",
		msg: &rtnetlink.RouteMessage{Family: unix.AF_INET, DstLength: 24, Table: 254,
			Attributes: rtnetlink.RouteAttributes{Dst: ip("fd00::")}},
		err: errMalformed,
	}, {
		name: "prefix too long",
		msg: &rtnetlink.RouteMessage{Family: unix.AF_INET, DstLength: 33, Table: 254,
			Attributes: rtnetlink.RouteAttributes{Dst: ip("10.0.0.0")}},
		err: errMalformed,
	}, {
		name: "short header",
		raw:  make([]byte, unix.SizeofRtMsg-1),
		err:  errMalformed,
	}, {
		name: "attribute longer than the message",
		raw:  append([]byte{unix.AF_INET, 0, 0, 0, 254, 0, 0, 1, 0, 0, 0, 0}, 8, 0, unix.RTA_OIF, 0, 1, 2),
		err:  errMalformed,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			b := tc.raw
			if b == nil {
				b = append(marshal(t, tc.msg), tc.extra...)
			}
			got, err := decodeRoute(b, tableFilter{})
			if !errors.Is(err, tc.err) || (tc.err == nil) != (err == nil) {
				t.Fatalf("error %v, want %v", err, tc.err)
			}
			if err != nil {
				return
			}
			if diff := gocmp.Diff(tc.want, got, cmpNetip); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestDecodeRouteTableFilter(t *testing.T) {
	b := typicalRoute(t)
	if _, err := decodeRoute(b, newTableFilter([]Table{TableMain, 900})); !errors.Is(err, errSkip) {
		t.Errorf("route of table 70000 with a filter of main and 900: %v, want errSkip", err)
	}
	if r, err := decodeRoute(b, newTableFilter([]Table{70000})); err != nil || r.Table != 70000 {
		t.Errorf("route of table 70000 with a filter of 70000: %v, %v", r, err)
	}
}

func TestDecodeLink(t *testing.T) {
	for _, tc := range []struct {
		name string
		msg  *rtnetlink.LinkMessage
		want Link
		err  error
	}{{
		name: "veth",
		msg: &rtnetlink.LinkMessage{Family: unix.AF_UNSPEC, Index: 7, Flags: unix.IFF_UP | unix.IFF_LOWER_UP | unix.IFF_BROADCAST,
			Attributes: &rtnetlink.LinkAttributes{Name: "enp7s0", MTU: 1450, OperationalState: rtnetlink.OperStateUp,
				Info: &rtnetlink.LinkInfo{Kind: "veth"}, Master: ptr(uint32(3))}},
		want: Link{Index: 7, Name: "enp7s0", MTU: 1450, Flags: unix.IFF_UP | unix.IFF_LOWER_UP | unix.IFF_BROADCAST,
			OperState: operUp, Kind: "veth", Master: 3},
	}, {
		name: "bridge port message",
		msg:  &rtnetlink.LinkMessage{Family: unix.AF_BRIDGE, Index: 7, Attributes: &rtnetlink.LinkAttributes{Name: "enp7s0"}},
		err:  errSkip,
	}, {
		name: "no name",
		msg:  &rtnetlink.LinkMessage{Family: unix.AF_UNSPEC, Index: 7, Attributes: &rtnetlink.LinkAttributes{MTU: 1500}},
		err:  errMalformed,
	}, {
		name: "index 0",
		msg:  &rtnetlink.LinkMessage{Family: unix.AF_UNSPEC, Attributes: &rtnetlink.LinkAttributes{Name: "x"}},
		err:  errMalformed,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			b := marshal(t, tc.msg)
			b[0] = uint8(tc.msg.Family) // rtnetlink always writes AF_UNSPEC
			got, err := decodeLink(b)
			if !errors.Is(err, tc.err) || (tc.err == nil) != (err == nil) {
				t.Fatalf("error %v, want %v", err, tc.err)
			}
			if err == nil {
				if diff := gocmp.Diff(tc.want, got); diff != "" {
					t.Errorf("(-want +got):\n%s", diff)
				}
				if got.Flags&LinkUp == 0 || got.Flags&LinkLowerUp == 0 {
					t.Errorf("Up %t LowerUp %t", got.Flags&LinkUp != 0, got.Flags&LinkLowerUp != 0)
				}
			}
		})
	}
}

func TestDecodeAddr(t *testing.T) {
	for _, tc := range []struct {
		name string
		msg  *rtnetlink.AddressMessage
		want Addr
		err  error
	}{{
		name: "IPv4",
		msg: &rtnetlink.AddressMessage{Family: unix.AF_INET, PrefixLength: 16, Index: 2, Attributes: &rtnetlink.AddressAttributes{
			Address: ip("10.0.0.5"), Local: ip("10.0.0.5"), Label: "enp7s0", Flags: unix.IFA_F_PERMANENT | unix.IFA_F_NOPREFIXROUTE}},
		want: Addr{Index: 2, Prefix: netip.MustParsePrefix("10.0.0.5/16"), Label: "enp7s0", Flags: unix.IFA_F_PERMANENT | unix.IFA_F_NOPREFIXROUTE},
	}, {
		name: "IPv4 point-to-point",
		msg: &rtnetlink.AddressMessage{Family: unix.AF_INET, PrefixLength: 32, Index: 9, Attributes: &rtnetlink.AddressAttributes{
			Address: ip("10.9.0.2"), Local: ip("10.9.0.1")}},
		want: Addr{Index: 9, Prefix: netip.MustParsePrefix("10.9.0.1/32"), Peer: netip.MustParseAddr("10.9.0.2")},
	}, {
		name: "IPv6 link-local, tentative",
		msg: &rtnetlink.AddressMessage{Family: unix.AF_INET6, PrefixLength: 64, Index: 2, Scope: unix.RT_SCOPE_LINK,
			Attributes: &rtnetlink.AddressAttributes{Address: ip("fe80::1"), Flags: unix.IFA_F_TENTATIVE}},
		want: Addr{Index: 2, Prefix: netip.MustParsePrefix("fe80::1/64"), Scope: ScopeLink, Flags: unix.IFA_F_TENTATIVE},
	}, {
		name: "prefix too long",
		msg: &rtnetlink.AddressMessage{Family: unix.AF_INET, PrefixLength: 40, Index: 2,
			Attributes: &rtnetlink.AddressAttributes{Address: ip("10.0.0.5")}},
		err: errMalformed,
	}, {
		name: "multicast routing family",
		msg:  &rtnetlink.AddressMessage{Family: unix.AF_PACKET, Index: 2, Attributes: &rtnetlink.AddressAttributes{Address: ip("10.0.0.5")}},
		err:  errSkip,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := decodeAddr(marshal(t, tc.msg))
			if !errors.Is(err, tc.err) || (tc.err == nil) != (err == nil) {
				t.Fatalf("error %v, want %v", err, tc.err)
			}
			if diff := gocmp.Diff(tc.want, got, cmpNetip); err == nil && diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestDecodeRule(t *testing.T) {
	src := ip("10.0.0.0")
	for _, tc := range []struct {
		name  string
		msg   *rtnetlink.RuleMessage
		extra []byte // appended attributes
		want  Rule
		err   error
	}{{
		name: "not fwmark lookup",
		msg: &rtnetlink.RuleMessage{Family: unix.AF_INET, Table: unix.RT_TABLE_COMPAT, Action: unix.FR_ACT_TO_TBL, Flags: unix.FIB_RULE_INVERT,
			Attributes: &rtnetlink.RuleAttributes{Priority: ptr(uint32(900)), Table: ptr(uint32(70000)), FwMark: ptr(uint32(0xe00)),
				FwMask: ptr(uint32(0xf00)), Protocol: ptr(uint8(77))}},
		want: Rule{Family: IPv4, Priority: 900, Table: 70000, Action: ActionToTable, Invert: true, Mark: 0xe00, Mask: 0xf00, Protocol: 77},
	}, {
		name: "selectors",
		msg: &rtnetlink.RuleMessage{Family: unix.AF_INET, SrcLength: 8, Action: unix.FR_ACT_GOTO,
			Attributes: &rtnetlink.RuleAttributes{Src: &src, Priority: ptr(uint32(5)), Goto: ptr(uint32(900)),
				IIFName: ptr("enp7s0"), OIFName: ptr("lo"), SuppressPrefixLen: ptr(uint32(0xffffffff)),
				DPortRange: &rtnetlink.RulePortRange{Start: 53, End: 53}, IPProto: ptr(uint8(17))}},
		// rtnetlink encodes a uid range as two 16-bit numbers; the
		// kernel's struct fib_rule_uid_range has two 32-bit ones.
		extra: attr(unix.FRA_UID_RANGE, []byte{0xe8, 3, 0, 0, 0xd0, 7, 0, 0}),
		want: Rule{Family: IPv4, Priority: 5, Action: actionGoto, Goto: 900, Src: netip.MustParsePrefix("10.0.0.0/8"),
			IIF: "enp7s0", OIF: "lo", UID: UIDRange{Set: true, Start: 1000, End: 2000}, DPort: PortRange{53, 53}, IPProto: 17},
	}, {
		name:  "attribute newer than the decoder",
		msg:   &rtnetlink.RuleMessage{Family: unix.AF_INET6, Table: 254, Action: unix.FR_ACT_TO_TBL, Attributes: &rtnetlink.RuleAttributes{Priority: ptr(uint32(100))}},
		extra: attr(25, []byte{0x2e}), // FRA_DSCP
		want:  Rule{Family: IPv6, Priority: 100, Table: TableMain, Action: ActionToTable, Attrs: Attrs(attr(25, []byte{0x2e}))},
	}, {
		name: "multicast routing family",
		msg:  &rtnetlink.RuleMessage{Family: 129, Table: 254},
		err:  errSkip,
	}, {
		name: "source length without an address",
		msg:  &rtnetlink.RuleMessage{Family: unix.AF_INET, SrcLength: 8, Attributes: &rtnetlink.RuleAttributes{Priority: ptr(uint32(5))}},
		err:  errMalformed,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := decodeRule(append(marshal(t, tc.msg), tc.extra...))
			if !errors.Is(err, tc.err) || (tc.err == nil) != (err == nil) {
				t.Fatalf("error %v, want %v", err, tc.err)
			}
			if diff := gocmp.Diff(tc.want, got, cmpNetip, gocmp.Comparer(func(a, b Rule) bool { return a == b })); err == nil && diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
			if tc.want.Attrs != "" {
				plain := got
				plain.Attrs = ""
				if got.Equal(plain) {
					t.Errorf("a rule with undecoded attributes is Equal to the rule without them")
				}
			}
		})
	}
}

// TestDecodeEvent checks the message types and the notification flags the
// cache relies on.
func TestDecodeEvent(t *testing.T) {
	route := typicalRoute(t)
	for _, tc := range []struct {
		typ   uint16
		flags netlink.HeaderFlags
		want  change
	}{
		{unix.RTM_NEWROUTE, netlink.Create | netlink.Excl, change{Event{Kind: KindRoute}, howExcl}},
		{unix.RTM_NEWROUTE, netlink.Create, change{Event{Kind: KindRoute}, howPrepend}},
		{unix.RTM_NEWROUTE, netlink.Create | netlink.Append, change{Event{Kind: KindRoute}, howAppend}},
		{unix.RTM_NEWROUTE, netlink.Replace, change{Event{Kind: KindRoute}, howReplace}},
		{unix.RTM_NEWROUTE, netlink.Multi, change{Event{Kind: KindRoute}, 0}},
		{unix.RTM_DELROUTE, 0, change{Event{Deleted: true, Kind: KindRoute}, 0}},
	} {
		ev, err := decode(netlink.Message{Header: netlink.Header{Type: netlink.HeaderType(tc.typ), Flags: tc.flags}, Data: route}, tableFilter{})
		if err != nil {
			t.Fatal(err)
		}
		if ev.Deleted != tc.want.Deleted || ev.Kind != tc.want.Kind || ev.how != tc.want.how || ev.Route.Table != 70000 {
			t.Errorf("type %d flags %v: %+v", tc.typ, tc.flags, ev)
		}
	}
	for _, typ := range []uint16{unix.RTM_NEWNEIGH, unix.RTM_NEWNEXTHOP, unix.RTM_NEWNETCONF, unix.NLMSG_DONE} {
		if _, err := decode(netlink.Message{Header: netlink.Header{Type: netlink.HeaderType(typ)}, Data: route}, tableFilter{}); !errors.Is(err, errSkip) {
			t.Errorf("message type %d: %v, want errSkip", typ, err)
		}
	}
}

// TestDecodeRouteAllocs: decoding a route, a million times during the sync
// of a full table, allocates nothing.
func TestDecodeRouteAllocs(t *testing.T) {
	b := typicalRoute(t)
	m := netlink.Message{Header: netlink.Header{Type: unix.RTM_NEWROUTE, Flags: netlink.Multi}, Data: b}
	var r Route
	var err error
	if n := testing.AllocsPerRun(1000, func() { r, err = decodeRoute(b, tableFilter{}) }); n != 0 || err != nil {
		t.Errorf("decodeRoute: %v allocations per run, error %v", n, err)
	}
	var ev change
	if n := testing.AllocsPerRun(1000, func() { ev, err = decode(m, tableFilter{}) }); n != 0 || err != nil {
		t.Errorf("decode: %v allocations per run, error %v", n, err)
	}
	filter := newTableFilter([]Table{70000})
	if n := testing.AllocsPerRun(1000, func() { r, err = decodeRoute(b, filter) }); n != 0 || err != nil {
		t.Errorf("decodeRoute with a table filter: %v allocations per run, error %v", n, err)
	}
	_, _ = r, ev
}

func BenchmarkDecodeRoute(b *testing.B) {
	msg := typicalRoute(b)
	b.ReportAllocs()
	b.SetBytes(int64(len(msg)))
	for b.Loop() {
		if _, err := decodeRoute(msg, tableFilter{}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecodeCompact is a dump's fast path, decodeCompact, on the
// route of BenchmarkDecodeRoute and on its IPv6 counterpart.
func BenchmarkDecodeCompact(b *testing.B) {
	for _, tc := range []struct {
		name string
		msg  []byte
	}{
		{"ipv4", typicalRoute(b)},
		{"ipv6", marshal(b, &rtnetlink.RouteMessage{
			Family: unix.AF_INET6, DstLength: 48, Table: unix.RT_TABLE_MAIN, Protocol: unix.RTPROT_BGP,
			Scope: unix.RT_SCOPE_UNIVERSE, Type: unix.RTN_UNICAST,
			Attributes: rtnetlink.RouteAttributes{
				Table: unix.RT_TABLE_MAIN, Dst: ip("2001:db8:1::"), Gateway: ip("fe80::1"), OutIface: 2, Priority: 1024,
				Metrics: &rtnetlink.RouteMetrics{MTU: 1355},
			},
		})},
	} {
		b.Run(tc.name, func(b *testing.B) {
			var c compactRoute
			b.ReportAllocs()
			b.SetBytes(int64(len(tc.msg)))
			for b.Loop() {
				if !decodeCompact(tc.msg, tableFilter{}, &c) {
					b.Fatal("not decoded on the fast path")
				}
			}
		})
	}
}
