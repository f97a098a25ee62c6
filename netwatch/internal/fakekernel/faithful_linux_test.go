//go:build linux

package fakekernel

import (
	"fmt"
	"github.com/marksplit/marksplit/internal/nstest"
	"iter"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jsimonetti/rtnetlink/v2"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// conn is what a side of the comparison needs from a socket: both
// *netlink.Conn and *FakeConn have it.
type conn interface {
	Execute(m netlink.Message) ([]netlink.Message, error)
	ReceiveIter() iter.Seq2[netlink.Message, error]
	SetReadDeadline(t time.Time) error
	PID() uint32
	Close() error
}

// side is one kernel under comparison: a request socket and a subscriber.
type side struct {
	name     string
	req, sub conn
}

var allGroups = []uint32{grpLink, grpIPv4Addr, grpIPv6Addr, grpIPv4Route, grpIPv6Route, grpIPv4Rule, grpIPv6Rule}

func realSide(t *testing.T, ns *nstest.NS) side {
	t.Helper()
	dial := func(groups []uint32) *netlink.Conn {
		c, err := netlink.Dial(unix.NETLINK_ROUTE, &netlink.Config{NetNS: ns.FD(), Strict: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if err := c.SetOption(netlink.ExtendedAcknowledge, true); err != nil {
			t.Fatal(err)
		}
		for _, g := range groups {
			if err := c.JoinGroup(g); err != nil {
				t.Fatal(err)
			}
		}
		return c
	}
	return side{name: "kernel", req: dial(nil), sub: dial(allGroups)}
}

func fakeSide(t *testing.T, k *Kernel) side {
	t.Helper()
	req := dialFake(t, k, nil, 0)
	sub := dialFake(t, k, allGroups, 1<<20)
	return side{name: "fake", req: req, sub: sub}
}

func dialFake(t testing.TB, k *Kernel, groups []uint32, rcvbuf int) *FakeConn {
	t.Helper()
	c, err := k.DialConn(groups, rcvbuf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// outcome is what a request got, normalized so both kernels compare.
type outcome struct {
	Err     string
	Replies []string
	Events  []string
}

// sentinel is a rule added and deleted after each step: its events mark
// the end of the step's events.
const sentinelPrio = 31337

func sentinel(typ uint16) netlink.Message {
	prio, table, proto := uint32(sentinelPrio), uint32(sentinelPrio), uint8(99)
	m := rtnetlink.RuleMessage{Family: unix.AF_INET, Action: unix.FR_ACT_TO_TBL,
		Attributes: &rtnetlink.RuleAttributes{Priority: &prio, Table: &table, Protocol: &proto}}
	return request(typ, netlink.Request|netlink.Acknowledge|netlink.Create, &m)
}

func (s side) do(t *testing.T, name string, m netlink.Message) outcome {
	t.Helper()
	var o outcome
	msgs, err := s.req.Execute(m)
	if err != nil {
		o.Err = describeErr(err)
	}
	if err == nil && m.Header.Flags&netlink.Echo != 0 {
		// Execute returned the echoed event; the acknowledgement follows.
		for r, err := range s.req.ReceiveIter() {
			if err != nil {
				t.Fatalf("%s: %s: receive the acknowledgement after the echo: %v", name, s.name, err)
			}
			msgs = append(msgs, r)
		}
	}
	for _, r := range msgs {
		if r.Header.Type == netlink.Error {
			o.Replies = append(o.Replies, fmt.Sprintf("ack flags=%v", r.Header.Flags))
			continue
		}
		if line, ok := describe(r, s.req.PID(), false); ok {
			o.Replies = append(o.Replies, line)
		}
	}
	if _, err := s.req.Execute(sentinel(unix.RTM_NEWRULE)); err != nil {
		t.Fatalf("%s: %s: sentinel: %v", name, s.name, err)
	}
	if _, err := s.req.Execute(sentinel(unix.RTM_DELRULE)); err != nil {
		t.Fatalf("%s: %s: sentinel: %v", name, s.name, err)
	}
	s.sub.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		var done bool
		for ev, err := range s.sub.ReceiveIter() {
			if err != nil {
				t.Fatalf("%s: receive events: %v", s.name, err)
			}
			if isSentinel(ev) {
				done = ev.Header.Type == unix.RTM_DELRULE
				continue
			}
			if line, ok := describe(ev, s.req.PID(), true); ok && (len(o.Events) == 0 || o.Events[len(o.Events)-1] != line) {
				o.Events = append(o.Events, line)
			}
		}
		if done {
			return o
		}
	}
}

func isSentinel(m netlink.Message) bool {
	var rm rtnetlink.RuleMessage
	return (m.Header.Type == unix.RTM_NEWRULE || m.Header.Type == unix.RTM_DELRULE) &&
		rm.UnmarshalBinary(m.Data) == nil && rm.Attributes != nil && rm.Attributes.Priority != nil &&
		*rm.Attributes.Priority == sentinelPrio
}

type faithStep struct {
	name  string
	typ   uint16
	flags netlink.HeaderFlags
	body  marshaler
}

// faithSteps is the script both kernels run. br0 is index 2, br1 index 3.
var faithSteps = []faithStep{
	{"create br0", unix.RTM_NEWLINK, fAdd, linkMsg(0, "br0", "bridge")},
	{"create br1", unix.RTM_NEWLINK, fAdd, linkMsg(0, "br1", "bridge")},
	{"create br2 up, mtu 1600", unix.RTM_NEWLINK, fAdd, &rtnetlink.LinkMessage{Flags: unix.IFF_UP, Change: unix.IFF_UP,
		Attributes: &rtnetlink.LinkAttributes{Name: "br2", MTU: 1600, Info: &rtnetlink.LinkInfo{Kind: "bridge"}}}},
	{"delete br2 by name", unix.RTM_DELLINK, fAck, linkMsg(0, "br2", "")},
	{"create br0 again: EEXIST", unix.RTM_NEWLINK, fAdd, linkMsg(0, "br0", "bridge")},
	{"create without kind", unix.RTM_NEWLINK, fAdd, linkMsg(0, "x0", "")},
	{"set a missing link up: ENODEV", unix.RTM_NEWLINK, fAck, linkUp(99, true)},
	{"br0 mtu 1400", unix.RTM_NEWLINK, fAck, &rtnetlink.LinkMessage{Index: 2, Attributes: &rtnetlink.LinkAttributes{MTU: 1400}}},
	{"br0 mtu 60: too small", unix.RTM_NEWLINK, fAck, &rtnetlink.LinkMessage{Index: 2, Attributes: &rtnetlink.LinkAttributes{MTU: 60}}},
	{"get link 2", unix.RTM_GETLINK, netlink.Request, &rtnetlink.LinkMessage{Index: 2}},
	{"get link by name", unix.RTM_GETLINK, netlink.Request, &rtnetlink.LinkMessage{Attributes: &rtnetlink.LinkAttributes{Name: "br1"}}},
	{"get missing link: ENODEV", unix.RTM_GETLINK, netlink.Request, &rtnetlink.LinkMessage{Index: 99}},
	{"link dump filtered by index: EINVAL", unix.RTM_GETLINK, fDump, &rtnetlink.LinkMessage{Index: 2}},
	{"delete lo: EOPNOTSUPP", unix.RTM_DELLINK, fAck, &rtnetlink.LinkMessage{Index: 1}},

	{"v4 route via a down link: ENETDOWN", unix.RTM_NEWROUTE, fAdd, rt("10.1.0.0/16", 900, func(m *rtnetlink.RouteMessage) { m.Attributes.OutIface = 2 })},
	{"v6 route via a down link: ENETDOWN", unix.RTM_NEWROUTE, fAdd, rt("fd01::/64", 900, func(m *rtnetlink.RouteMessage) { m.Attributes.OutIface = 2 })},
	{"the failed add created v4 table 900", unix.RTM_GETROUTE, fDump, rt("0.0.0.0/0", 900, func(m *rtnetlink.RouteMessage) { *m = rtnetlink.RouteMessage{Family: 2, Attributes: m.Attributes} })},
	{"and v6 table 900", unix.RTM_GETROUTE, fDump, &rtnetlink.RouteMessage{Family: 10, Attributes: rtnetlink.RouteAttributes{Table: 900}}},
	{"strict dump of a missing v4 table: ENOENT", unix.RTM_GETROUTE, fDump, &rtnetlink.RouteMessage{Family: 2, Attributes: rtnetlink.RouteAttributes{Table: 901}}},
	{"strict dump of a missing v6 table: ENOENT", unix.RTM_GETROUTE, fDump, &rtnetlink.RouteMessage{Family: 10, Table: 201}},
	{"unspec dump of a missing table: empty", unix.RTM_GETROUTE, fDump, &rtnetlink.RouteMessage{Attributes: rtnetlink.RouteAttributes{Table: 901}}},
	{"v4 main table does not exist yet", unix.RTM_GETROUTE, fDump, &rtnetlink.RouteMessage{Family: 2, Table: 254}},
	{"dump with a bad header: EINVAL", unix.RTM_GETROUTE, fDump, &rtnetlink.RouteMessage{Family: 2, Scope: 3}},
	{"dump with a bad attribute: EINVAL", unix.RTM_GETROUTE, fDump, &rtnetlink.RouteMessage{Family: 2, Attributes: rtnetlink.RouteAttributes{Priority: 3}}},
	{"dump by missing oif: ENODEV", unix.RTM_GETROUTE, fDump, &rtnetlink.RouteMessage{Family: 2, Attributes: rtnetlink.RouteAttributes{OutIface: 99}}},
	{"br0 up", unix.RTM_NEWLINK, fAck, linkUp(2, true)},
	{"br1 up", unix.RTM_NEWLINK, fAck, linkUp(3, true)},

	{"v4 add", unix.RTM_NEWROUTE, fAdd, rt("10.1.0.0/16", 900, func(m *rtnetlink.RouteMessage) { m.Attributes.OutIface = 2 })},
	{"v4 add again: EEXIST", unix.RTM_NEWROUTE, fAdd, rt("10.1.0.0/16", 900, func(m *rtnetlink.RouteMessage) { m.Attributes.OutIface = 2 })},
	{"v4 create identical: EEXIST", unix.RTM_NEWROUTE, fCreate, rt("10.1.0.0/16", 900, func(m *rtnetlink.RouteMessage) { m.Attributes.OutIface = 2 })},
	{"v4 replace with mtu", unix.RTM_NEWROUTE, fReplace, rt("10.1.0.0/16", 900, func(m *rtnetlink.RouteMessage) {
		m.Attributes.OutIface = 2
		m.Attributes.Metrics = &rtnetlink.RouteMetrics{MTU: 1300}
	})},
	{"v4 replace creating", unix.RTM_NEWROUTE, fReplace, rt("10.9.0.0/16", 900, func(m *rtnetlink.RouteMessage) { m.Attributes.OutIface = 2 })},
	{"v4 oif missing: ENODEV", unix.RTM_NEWROUTE, fAdd, rt("10.2.0.0/16", 900, func(m *rtnetlink.RouteMessage) { m.Attributes.OutIface = 99 })},
	{"v4 type 0: invalid scope", unix.RTM_NEWROUTE, fAdd, rt("10.2.0.0/16", 900, func(m *rtnetlink.RouteMessage) { m.Attributes.OutIface = 2; m.Type = 0 })},
	{"v4 unmasked destination", unix.RTM_NEWROUTE, fAdd, rt("10.2.3.0/16", 900, func(m *rtnetlink.RouteMessage) { m.Attributes.OutIface = 2 })},
	{"v4 scope host with a gateway", unix.RTM_NEWROUTE, fAdd, rt("10.2.0.0/16", 900, func(m *rtnetlink.RouteMessage) {
		m.Attributes.OutIface, m.Attributes.Gateway, m.Scope = 2, ip("10.0.0.1"), unix.RT_SCOPE_HOST
	})},
	{"v4 blackhole with a device", unix.RTM_NEWROUTE, fAdd, rt("10.2.0.0/16", 900, func(m *rtnetlink.RouteMessage) {
		m.Attributes.OutIface, m.Type, m.Scope = 2, unix.RTN_BLACKHOLE, 0
	})},
	{"v4 blackhole", unix.RTM_NEWROUTE, fAdd, rt("10.66.0.0/16", 900, func(m *rtnetlink.RouteMessage) { m.Type, m.Scope = unix.RTN_BLACKHOLE, 0 })},
	{"v4 replace without create, missing: ENOENT", unix.RTM_NEWROUTE, fAck | netlink.Replace, rt("10.3.0.0/16", 900, func(m *rtnetlink.RouteMessage) { m.Attributes.OutIface = 2 })},
	{"v4 no flags, missing: ENOENT", unix.RTM_NEWROUTE, fAck, rt("10.3.0.0/16", 900, func(m *rtnetlink.RouteMessage) { m.Attributes.OutIface = 2 })},
	{"v4 prefsrc not local: EINVAL", unix.RTM_NEWROUTE, fAdd, rt("10.2.0.0/16", 900, func(m *rtnetlink.RouteMessage) {
		m.Attributes.OutIface, m.Attributes.Src = 2, ip("10.0.0.5")
	})},
	{"v4 table above 255 in a dump", unix.RTM_GETROUTE, fDump, &rtnetlink.RouteMessage{Family: 2, Attributes: rtnetlink.RouteAttributes{Table: 900}}},
	{"v4 delete, scope 0 on a link route: ESRCH", unix.RTM_DELROUTE, fAck, rt("10.9.0.0/16", 900, func(m *rtnetlink.RouteMessage) { m.Scope, m.Type, m.Protocol = 0, 0, 0 })},
	{"v4 delete, scope nowhere", unix.RTM_DELROUTE, fAck, rt("10.9.0.0/16", 900, func(m *rtnetlink.RouteMessage) {
		m.Scope, m.Type, m.Protocol = unix.RT_SCOPE_NOWHERE, 0, 0
	})},
	{"v4 delete again: ESRCH", unix.RTM_DELROUTE, fAck, rt("10.9.0.0/16", 900, func(m *rtnetlink.RouteMessage) {
		m.Scope, m.Type, m.Protocol = unix.RT_SCOPE_NOWHERE, 0, 0
	})},
	{"v4 delete in a missing table: ESRCH", unix.RTM_DELROUTE, fAck, rt("10.9.0.0/16", 901, func(m *rtnetlink.RouteMessage) { m.Scope = unix.RT_SCOPE_NOWHERE })},
	{"v4 metric 5", unix.RTM_NEWROUTE, fAdd, rt("10.6.0.0/16", 900, func(m *rtnetlink.RouteMessage) { m.Attributes.OutIface, m.Attributes.Priority = 2, 5 })},
	{"v4 metric 3", unix.RTM_NEWROUTE, fAdd, rt("10.6.0.0/16", 900, func(m *rtnetlink.RouteMessage) { m.Attributes.OutIface, m.Attributes.Priority = 3, 3 })},
	{"v4 delete without metric takes the lowest", unix.RTM_DELROUTE, fAck, rt("10.6.0.0/16", 900, func(m *rtnetlink.RouteMessage) {
		m.Scope, m.Type, m.Protocol = unix.RT_SCOPE_NOWHERE, 0, 0
	})},
	{"v4 delete by wrong oif: ESRCH", unix.RTM_DELROUTE, fAck, rt("10.6.0.0/16", 900, func(m *rtnetlink.RouteMessage) {
		m.Scope, m.Type, m.Protocol, m.Attributes.OutIface = unix.RT_SCOPE_NOWHERE, 0, 0, 3
	})},

	// Route metrics, "mtu lock" included: what the kernel keeps, clamps
	// and refuses, and how an IPv4 delete must name them.
	{"v4 metrics, mtu lock", unix.RTM_NEWROUTE, fAdd, rtMx("10.20.0.0/16", 900, func(m *rtnetlink.RouteMessage) { m.Attributes.OutIface = 2 },
		uint16(unix.RTAX_LOCK), uint32(1<<unix.RTAX_MTU), uint16(unix.RTAX_MTU), uint32(1300), uint16(unix.RTAX_WINDOW), uint32(5),
		uint16(unix.RTAX_RTT), uint32(800), uint16(unix.RTAX_RTTVAR), uint32(200), uint16(unix.RTAX_SSTHRESH), uint32(7),
		uint16(unix.RTAX_CWND), uint32(9), uint16(unix.RTAX_ADVMSS), uint32(70000), uint16(unix.RTAX_REORDERING), uint32(4),
		uint16(unix.RTAX_HOPLIMIT), uint32(300), uint16(unix.RTAX_INITCWND), uint32(10), uint16(unix.RTAX_FEATURES), uint32(1),
		uint16(unix.RTAX_RTO_MIN), uint32(50), uint16(unix.RTAX_INITRWND), uint32(20), uint16(unix.RTAX_QUICKACK), uint32(1),
		uint16(unix.RTAX_CC_ALGO), "cubic", uint16(unix.RTAX_FASTOPEN_NO_COOKIE), uint32(1))},
	{"v4 mtu above the limit: clamped", unix.RTM_NEWROUTE, fAdd, rtMx("10.21.0.0/16", 900, func(m *rtnetlink.RouteMessage) { m.Attributes.OutIface = 2 }, uint16(unix.RTAX_MTU), uint32(70000))},
	{"v4 metric 0 of a type: not reported", unix.RTM_NEWROUTE, fAdd, rtMx("10.22.0.0/16", 900, func(m *rtnetlink.RouteMessage) { m.Attributes.OutIface = 2 }, uint16(unix.RTAX_WINDOW), uint32(0), uint16(0), uint32(3))},
	{"v4 unknown feature: EINVAL", unix.RTM_NEWROUTE, fAdd, rtMx("10.23.0.0/16", 900, func(m *rtnetlink.RouteMessage) { m.Attributes.OutIface = 2 }, uint16(unix.RTAX_FEATURES), uint32(0x20))},
	{"v4 unknown metric type: EINVAL", unix.RTM_NEWROUTE, fAdd, rtMx("10.23.0.0/16", 900, func(m *rtnetlink.RouteMessage) { m.Attributes.OutIface = 2 }, uint16(unix.RTAX_MAX+1), uint32(1))},
	{"v4 short metric: EINVAL", unix.RTM_NEWROUTE, fAdd, rtMx("10.23.0.0/16", 900, func(m *rtnetlink.RouteMessage) { m.Attributes.OutIface = 2 }, uint16(unix.RTAX_MTU), []byte{1, 2})},
	{"v4 replace keeps only the new metrics", unix.RTM_NEWROUTE, fReplace, rtMx("10.21.0.0/16", 900, func(m *rtnetlink.RouteMessage) { m.Attributes.OutIface = 2 },
		uint16(unix.RTAX_LOCK), uint32(1<<unix.RTAX_MTU), uint16(unix.RTAX_MTU), uint32(1400), uint16(unix.RTAX_CC_ALGO), "reno")},
	{"v4 metrics dump", unix.RTM_GETROUTE, fDump, &rtnetlink.RouteMessage{Family: 2, Attributes: rtnetlink.RouteAttributes{Table: 900}}},
	{"v4 delete without the lock: ESRCH", unix.RTM_DELROUTE, fAck, rtMx("10.21.0.0/16", 900, nil, uint16(unix.RTAX_MTU), uint32(1400), uint16(unix.RTAX_LOCK), uint32(0))},
	{"v4 delete by another mtu: ESRCH", unix.RTM_DELROUTE, fAck, rtMx("10.21.0.0/16", 900, nil, uint16(unix.RTAX_MTU), uint32(1300))},
	{"v4 delete by another congestion control: ESRCH", unix.RTM_DELROUTE, fAck, rtMx("10.21.0.0/16", 900, nil, uint16(unix.RTAX_CC_ALGO), "cubic")},
	{"v4 delete by an unknown metric type: ESRCH", unix.RTM_DELROUTE, fAck, rtMx("10.21.0.0/16", 900, nil, uint16(unix.RTAX_MAX+1), uint32(0))},
	{"v4 delete by the clamped value only: ESRCH", unix.RTM_DELROUTE, fAck, rtMx("10.20.0.0/16", 900, nil, uint16(unix.RTAX_ADVMSS), uint32(70000))},
	{"v4 delete by mtu lock", unix.RTM_DELROUTE, fAck, rtMx("10.21.0.0/16", 900, nil,
		uint16(unix.RTAX_LOCK), uint32(1<<unix.RTAX_MTU), uint16(unix.RTAX_MTU), uint32(1400), uint16(unix.RTAX_CC_ALGO), "reno")},
	{"v4 delete by a metric the route has", unix.RTM_DELROUTE, fAck, rtMx("10.22.0.0/16", 900, nil, uint16(unix.RTAX_WINDOW), uint32(0))},

	{"v4 address", unix.RTM_NEWADDR, fAdd, addrMsg(2, "10.0.0.5/16", 0)},
	{"v4 secondary", unix.RTM_NEWADDR, fAdd, addrMsg(2, "10.0.0.6/16", 0)},
	{"v4 address on br1", unix.RTM_NEWADDR, fAdd, addrMsg(3, "10.7.0.5/16", 0)},
	{"v4 address again: EEXIST", unix.RTM_NEWADDR, fAdd, addrMsg(2, "10.0.0.5/16", 0)},
	{"v4 address replace", unix.RTM_NEWADDR, fReplace, addrMsg(2, "10.0.0.5/16", 0)},
	{"v4 address on a missing link: ENODEV", unix.RTM_NEWADDR, fAdd, addrMsg(99, "10.0.0.5/16", 0)},
	{"v4 delete on a missing link: ENODEV", unix.RTM_DELADDR, fAck, addrMsg(99, "10.0.0.5/16", 0)},
	{"v4 delete missing address: EADDRNOTAVAIL", unix.RTM_DELADDR, fAck, addrMsg(2, "10.0.0.99/16", 0)},
	{"v4 route with prefsrc", unix.RTM_NEWROUTE, fAdd, rt("10.2.0.0/16", 254, func(m *rtnetlink.RouteMessage) {
		m.Attributes.OutIface, m.Attributes.Src = 2, ip("10.0.0.5")
	})},
	{"v4 main route on br1 with prefsrc of br0's secondary", unix.RTM_NEWROUTE, fAdd, rt("10.4.0.0/16", 254, func(m *rtnetlink.RouteMessage) {
		m.Attributes.OutIface, m.Attributes.Src = 3, ip("10.0.0.6")
	})},
	{"v4 table 900 route on br1 with prefsrc", unix.RTM_NEWROUTE, fAdd, rt("10.3.0.0/16", 900, func(m *rtnetlink.RouteMessage) {
		m.Attributes.OutIface, m.Attributes.Src = 3, ip("10.0.0.5")
	})},
	{"v4 gateway route", unix.RTM_NEWROUTE, fAdd, rt("10.5.0.0/16", 900, func(m *rtnetlink.RouteMessage) {
		m.Attributes.OutIface, m.Attributes.Gateway, m.Scope = 2, ip("10.0.0.1"), 0
	})},
	{"v4 delete by another gateway: ESRCH", unix.RTM_DELROUTE, fAck, rt("10.5.0.0/16", 900, func(m *rtnetlink.RouteMessage) {
		m.Scope, m.Type, m.Protocol, m.Attributes.Gateway = unix.RT_SCOPE_NOWHERE, 0, 0, ip("10.0.0.99")
	})},
	{"v4 delete by another link: ESRCH", unix.RTM_DELROUTE, fAck, rt("10.5.0.0/16", 900, func(m *rtnetlink.RouteMessage) {
		m.Scope, m.Type, m.Protocol, m.Attributes.OutIface = unix.RT_SCOPE_NOWHERE, 0, 0, 3
	})},
	{"v4 gateway route again", unix.RTM_NEWROUTE, fAdd, rt("10.15.0.0/16", 900, func(m *rtnetlink.RouteMessage) {
		m.Attributes.OutIface, m.Attributes.Gateway, m.Scope = 2, ip("10.0.0.1"), 0
	})},
	{"v4 delete by its gateway", unix.RTM_DELROUTE, fAck, rt("10.15.0.0/16", 900, func(m *rtnetlink.RouteMessage) {
		m.Scope, m.Type, m.Protocol, m.Attributes.Gateway = unix.RT_SCOPE_NOWHERE, 0, 0, ip("10.0.0.1")
	})},
	{"v4 main-table route on br1", unix.RTM_NEWROUTE, fAdd, rt("10.8.0.0/16", 254, func(m *rtnetlink.RouteMessage) { m.Attributes.OutIface = 3 })},
	{"another v4 primary on br0", unix.RTM_NEWADDR, fAdd, addrMsg(2, "10.9.0.5/16", 0)},
	{"address dump v4", unix.RTM_GETADDR, fDump, &rtnetlink.AddressMessage{Family: 2}},
	{"address dump by link", unix.RTM_GETADDR, fDump, &rtnetlink.AddressMessage{Family: 2, Index: 3}},
	{"address dump by missing link: ENODEV", unix.RTM_GETADDR, fDump, &rtnetlink.AddressMessage{Family: 2, Index: 99}},
	{"address dump with a bad header: EINVAL", unix.RTM_GETADDR, fDump, &rtnetlink.AddressMessage{Family: 2, PrefixLength: 8}},
	{"single address get: EOPNOTSUPP", unix.RTM_GETADDR, netlink.Request, &rtnetlink.AddressMessage{Family: 2}},
	{"route get: main table reported", unix.RTM_GETROUTE, netlink.Request, rtGet("10.3.0.9", 0, 0)},
	{"route get with lookup table", unix.RTM_GETROUTE, netlink.Request, rtGet("10.3.0.9", unix.RTM_F_LOOKUP_TABLE, 0)},
	{"route get fib match", unix.RTM_GETROUTE, netlink.Request, rtGet("10.1.0.9", unix.RTM_F_FIB_MATCH, 0)},
	{"route get unreachable", unix.RTM_GETROUTE, netlink.Request, rtGet("192.168.0.1", 0, 0)},
	{"route get bad header", unix.RTM_GETROUTE, netlink.Request, &rtnetlink.RouteMessage{Family: 2, DstLength: 24, Attributes: rtnetlink.RouteAttributes{Dst: ip("10.3.0.0")}}},

	{"v6 address", unix.RTM_NEWADDR, fAdd, addrMsg(2, "fd00::5/64", unix.IFA_F_NODAD)},
	{"v6 address again: EEXIST", unix.RTM_NEWADDR, fAdd, addrMsg(2, "fd00::5/64", unix.IFA_F_NODAD)},
	{"v6 address on br1", unix.RTM_NEWADDR, fAdd, addrMsg(3, "fd07::5/64", unix.IFA_F_NODAD)},
	{"v6 delete on a missing link: ENODEV", unix.RTM_DELADDR, fAck, addrMsg(99, "fd00::5/64", 0)},
	{"v6 delete missing address: EADDRNOTAVAIL", unix.RTM_DELADDR, fAck, addrMsg(2, "fd00::99/64", 0)},
	{"v6 address on a missing link: ENODEV", unix.RTM_NEWADDR, fAdd, addrMsg(99, "fd00::5/64", unix.IFA_F_NODAD)},
	{"v6 add", unix.RTM_NEWROUTE, fAdd, rt("fd01::/64", 900, func(m *rtnetlink.RouteMessage) { m.Attributes.OutIface = 2 })},
	{"v6 add again: EEXIST", unix.RTM_NEWROUTE, fAdd, rt("fd01::/64", 900, func(m *rtnetlink.RouteMessage) { m.Attributes.OutIface = 2 })},
	{"v6 replace", unix.RTM_NEWROUTE, fReplace, rt("fd01::/64", 900, func(m *rtnetlink.RouteMessage) {
		m.Attributes.OutIface = 2
		m.Attributes.Metrics = &rtnetlink.RouteMetrics{MTU: 1300}
	})},
	{"v6 replace without create, missing: ENOENT", unix.RTM_NEWROUTE, fAck | netlink.Replace, rt("fd09::/64", 900, func(m *rtnetlink.RouteMessage) { m.Attributes.OutIface = 2 })},
	{"v6 no flags, missing: created", unix.RTM_NEWROUTE, fAck, rt("fd0a::/64", 900, func(m *rtnetlink.RouteMessage) { m.Attributes.OutIface = 2 })},
	{"v6 with prefsrc", unix.RTM_NEWROUTE, fAdd, rt("fd02::/64", 900, func(m *rtnetlink.RouteMessage) {
		m.Attributes.OutIface, m.Attributes.Src = 2, ip("fd00::5")
	})},
	{"v6 with a foreign prefsrc: EINVAL", unix.RTM_NEWROUTE, fAdd, rt("fd03::/64", 900, func(m *rtnetlink.RouteMessage) {
		m.Attributes.OutIface, m.Attributes.Src = 2, ip("fd00::99")
	})},
	{"v6 on br1 with prefsrc on br0", unix.RTM_NEWROUTE, fAdd, rt("fd04::/64", 900, func(m *rtnetlink.RouteMessage) {
		m.Attributes.OutIface, m.Attributes.Src = 3, ip("fd00::5")
	})},
	{"v6 metric 10 in main on br1", unix.RTM_NEWROUTE, fAdd, rt("fd05::/64", 254, func(m *rtnetlink.RouteMessage) {
		m.Attributes.OutIface, m.Attributes.Priority = 3, 10
	})},
	{"v6 unreachable", unix.RTM_NEWROUTE, fAdd, rt("fd0b::/64", 900, func(m *rtnetlink.RouteMessage) { m.Type = unix.RTN_UNREACHABLE })},
	{"v6 default route", unix.RTM_NEWROUTE, fAdd, rt("::/0", 900, func(m *rtnetlink.RouteMessage) { m.Attributes.OutIface = 3 })},
	{"v6 with tos: EINVAL", unix.RTM_NEWROUTE, fAdd, rt("fd0c::/64", 900, func(m *rtnetlink.RouteMessage) { m.Attributes.OutIface, m.Tos = 2, 4 })},
	{"v6 oif missing: ENODEV", unix.RTM_NEWROUTE, fAdd, rt("fd0c::/64", 900, func(m *rtnetlink.RouteMessage) { m.Attributes.OutIface = 99 })},
	{"v6 delete missing: ESRCH", unix.RTM_DELROUTE, fAck, rt("fd0d::/64", 900, nil)},
	{"v6 delete in a missing table: ESRCH", unix.RTM_DELROUTE, fAck, rt("fd01::/64", 901, nil)},
	{"v6 delete by wrong metric: ESRCH", unix.RTM_DELROUTE, fAck, rt("fd0a::/64", 900, func(m *rtnetlink.RouteMessage) { m.Attributes.Priority = 7 })},
	{"v6 delete", unix.RTM_DELROUTE, fAck, rt("fd0a::/64", 900, func(m *rtnetlink.RouteMessage) { m.Protocol, m.Type = 0, 0 })},
	{"v6 metrics, mtu lock", unix.RTM_NEWROUTE, fAdd, rtMx("fd20::/64", 900, func(m *rtnetlink.RouteMessage) { m.Attributes.OutIface = 2 },
		uint16(unix.RTAX_LOCK), uint32(1<<unix.RTAX_MTU), uint16(unix.RTAX_MTU), uint32(1300), uint16(unix.RTAX_HOPLIMIT), uint32(300),
		uint16(unix.RTAX_ADVMSS), uint32(1200), uint16(unix.RTAX_FEATURES), uint32(2), uint16(unix.RTAX_CC_ALGO), "reno")},
	{"v6 unknown metric type: EINVAL", unix.RTM_NEWROUTE, fAdd, rtMx("fd21::/64", 900, func(m *rtnetlink.RouteMessage) { m.Attributes.OutIface = 2 }, uint16(unix.RTAX_MAX+1), uint32(1))},
	{"v6 replace keeps only the new metrics", unix.RTM_NEWROUTE, fReplace, rtMx("fd20::/64", 900, func(m *rtnetlink.RouteMessage) { m.Attributes.OutIface = 2 }, uint16(unix.RTAX_RTT), uint32(80))},
	{"v6 metrics dump", unix.RTM_GETROUTE, fDump, &rtnetlink.RouteMessage{Family: 10, Attributes: rtnetlink.RouteAttributes{Table: 900}}},
	{"v6 delete ignores metrics", unix.RTM_DELROUTE, fAck, rtMx("fd20::/64", 900, func(m *rtnetlink.RouteMessage) { m.Protocol, m.Type = 0, 0 },
		uint16(unix.RTAX_MTU), uint32(1500))},
	{"v6 gateway route", unix.RTM_NEWROUTE, fAdd, rt("fd22::/64", 900, func(m *rtnetlink.RouteMessage) {
		m.Attributes.OutIface, m.Attributes.Gateway = 2, ip("fd00::1")
	})},
	{"v6 delete by another gateway: ESRCH", unix.RTM_DELROUTE, fAck, rt("fd22::/64", 900, func(m *rtnetlink.RouteMessage) {
		m.Protocol, m.Type, m.Attributes.Gateway = 0, 0, ip("fd00::99")
	})},
	{"v6 delete by another link: ESRCH", unix.RTM_DELROUTE, fAck, rt("fd22::/64", 900, func(m *rtnetlink.RouteMessage) {
		m.Protocol, m.Type, m.Attributes.OutIface = 0, 0, 3
	})},
	{"v6 delete by metric 1024, what 0 became", unix.RTM_DELROUTE, fAck, rt("fd22::/64", 900, func(m *rtnetlink.RouteMessage) {
		m.Protocol, m.Type, m.Attributes.Priority, m.Attributes.Gateway = 0, 0, 1024, ip("fd00::1")
	})},
	{"v6 route with mtu lock for route get", unix.RTM_NEWROUTE, fAdd, rtMx("fd23::/64", 900, func(m *rtnetlink.RouteMessage) { m.Attributes.OutIface = 2 },
		uint16(unix.RTAX_LOCK), uint32(1<<unix.RTAX_MTU), uint16(unix.RTAX_MTU), uint32(1300), uint16(unix.RTAX_CC_ALGO), "cubic")},
	{"v6 dump of table 900", unix.RTM_GETROUTE, fDump, &rtnetlink.RouteMessage{Family: 10, Attributes: rtnetlink.RouteAttributes{Table: 900}}},
	{"v6 dump by protocol", unix.RTM_GETROUTE, fDump, &rtnetlink.RouteMessage{Family: 10, Protocol: 77}},
	{"v6 route get", unix.RTM_GETROUTE, netlink.Request, rtGet("fd01::9", 0, 0)},
	{"v6 route get fib match", unix.RTM_GETROUTE, netlink.Request, rtGet("fd01::9", unix.RTM_F_FIB_MATCH, 0)},
	{"v6 route get with lookup table: EINVAL", unix.RTM_GETROUTE, netlink.Request, rtGet("fd01::9", unix.RTM_F_LOOKUP_TABLE, 0)},

	{"rule add", unix.RTM_NEWRULE, fAdd, rule(2, 900, 900, func(m *rtnetlink.RuleMessage) {
		m.Flags, m.Attributes.FwMark, m.Attributes.FwMask = unix.FIB_RULE_INVERT, ptr(uint32(0xe00)), ptr(uint32(0xf00))
	})},
	{"rule add again: EEXIST", unix.RTM_NEWRULE, fAdd, rule(2, 900, 900, func(m *rtnetlink.RuleMessage) {
		m.Flags, m.Attributes.FwMark, m.Attributes.FwMask = unix.FIB_RULE_INVERT, ptr(uint32(0xe00)), ptr(uint32(0xf00))
	})},
	{"rule add differing only in not: EEXIST", unix.RTM_NEWRULE, fAdd, rule(2, 900, 900, func(m *rtnetlink.RuleMessage) {
		m.Attributes.FwMark, m.Attributes.FwMask = ptr(uint32(0xe00)), ptr(uint32(0xf00))
	})},
	{"rule replace adds a duplicate", unix.RTM_NEWRULE, fReplace, rule(2, 900, 900, func(m *rtnetlink.RuleMessage) {
		m.Flags, m.Attributes.FwMark, m.Attributes.FwMask = unix.FIB_RULE_INVERT, ptr(uint32(0xe00)), ptr(uint32(0xf00))
	})},
	{"rule with a mark and no mask", unix.RTM_NEWRULE, fAdd, rule(2, 901, 900, func(m *rtnetlink.RuleMessage) { m.Attributes.FwMark = ptr(uint32(0xe00)) })},
	{"v6 rule with a mark and no mask", unix.RTM_NEWRULE, fAdd, rule(10, 901, 900, func(m *rtnetlink.RuleMessage) { m.Attributes.FwMark = ptr(uint32(0xe00)) })},
	{"v6 rule without a table: EINVAL", unix.RTM_NEWRULE, fAdd, rule(10, 902, 0, nil)},
	{"v4 rule without a table gets an empty one", unix.RTM_NEWRULE, fAdd, rule(2, 902, 0, nil)},
	{"rule from a prefix", unix.RTM_NEWRULE, fAdd, rule(2, 905, 900, func(m *rtnetlink.RuleMessage) {
		m.SrcLength, m.Attributes.Src = 8, ptr(ip("10.0.0.0"))
	})},
	{"rule without from at the same place: EEXIST", unix.RTM_NEWRULE, fAdd, rule(2, 905, 900, nil)},
	{"rule with iif of a missing link", unix.RTM_NEWRULE, fAdd, rule(2, 906, 900, func(m *rtnetlink.RuleMessage) { m.Attributes.IIFName = ptr("nope0") })},
	{"rule with oif br1", unix.RTM_NEWRULE, fAdd, rule(2, 907, 900, func(m *rtnetlink.RuleMessage) { m.Attributes.OIFName = ptr("br1") })},
	{"blackhole rule", unix.RTM_NEWRULE, fAdd, rule(2, 908, 0, func(m *rtnetlink.RuleMessage) { m.Action, m.Attributes.Table = unix.FR_ACT_BLACKHOLE, nil })},
	{"rule without priority", unix.RTM_NEWRULE, fAdd, rule(2, 0, 950, func(m *rtnetlink.RuleMessage) { m.Attributes.Priority = nil })},
	{"rule of an unknown family: EAFNOSUPPORT", unix.RTM_NEWRULE, fAdd, rule(7, 900, 900, nil)},
	{"rule dump", unix.RTM_GETRULE, fDump, &rtnetlink.RuleMessage{}},
	{"rule dump of the multicast-routing family", unix.RTM_GETRULE, fDump, &rtnetlink.RuleMessage{Family: 128}},
	{"rule dump with attributes: EINVAL", unix.RTM_GETRULE, fDump, &rtnetlink.RuleMessage{Family: 2, Attributes: &rtnetlink.RuleAttributes{Table: ptr(uint32(900))}}},
	{"rule dump with a header: EINVAL", unix.RTM_GETRULE, fDump, &rtnetlink.RuleMessage{Family: 2, Table: 3}},
	{"single rule get: EOPNOTSUPP", unix.RTM_GETRULE, netlink.Request, &rtnetlink.RuleMessage{Family: 2}},
	{"route get through the not-fwmark rule", unix.RTM_GETROUTE, netlink.Request, rtGet("10.1.0.9", unix.RTM_F_LOOKUP_TABLE, 0)},
	{"route get with the mark", unix.RTM_GETROUTE, netlink.Request, rtGet("10.1.0.9", unix.RTM_F_LOOKUP_TABLE, 0xe00)},
	{"route get after the rules: main table reported", unix.RTM_GETROUTE, netlink.Request, rtGet("10.1.0.9", 0, 0)},
	{"route get fib match after the rules", unix.RTM_GETROUTE, netlink.Request, rtGet("10.1.0.9", unix.RTM_F_FIB_MATCH, 0)},
	{"route get fib match with lookup table", unix.RTM_GETROUTE, netlink.Request, rtGet("10.1.0.9", unix.RTM_F_FIB_MATCH|unix.RTM_F_LOOKUP_TABLE, 0)},
	{"v6 route get with the mark", unix.RTM_GETROUTE, netlink.Request, rtGet("fd01::9", 0, 0xe00)},
	{"v6 route get fib match with the mark", unix.RTM_GETROUTE, netlink.Request, rtGet("fd01::9", unix.RTM_F_FIB_MATCH, 0xe00)},
	{"v6 route get to an unreachable route", unix.RTM_GETROUTE, netlink.Request, rtGet("fd0b::1", 0, 0xe00)},
	{"route get hitting the blackhole route", unix.RTM_GETROUTE, netlink.Request, rtGet("10.66.1.1", unix.RTM_F_LOOKUP_TABLE, 0)},
	{"route get of a route with metrics", unix.RTM_GETROUTE, netlink.Request, rtGet("10.20.0.9", unix.RTM_F_LOOKUP_TABLE, 0)},
	{"route get fib match of a route with metrics", unix.RTM_GETROUTE, netlink.Request, rtGet("10.20.0.9", unix.RTM_F_FIB_MATCH, 0)},
	{"v6 route get of a route with metrics", unix.RTM_GETROUTE, netlink.Request, rtGet("fd23::9", 0, 0)},
	{"v6 route get fib match of a route with metrics", unix.RTM_GETROUTE, netlink.Request, rtGet("fd23::9", unix.RTM_F_FIB_MATCH, 0)},
	{"rule delete by mark without mask: ENOENT", unix.RTM_DELRULE, fAck, &rtnetlink.RuleMessage{Family: 2, Attributes: &rtnetlink.RuleAttributes{Priority: ptr(uint32(900)), FwMark: ptr(uint32(0xe00))}}},
	{"rule delete ignores not", unix.RTM_DELRULE, fAck, rule(2, 900, 900, func(m *rtnetlink.RuleMessage) {
		m.Attributes.FwMark, m.Attributes.FwMask = ptr(uint32(0xe00)), ptr(uint32(0xf00))
	})},
	{"rule delete by priority only", unix.RTM_DELRULE, fAck, &rtnetlink.RuleMessage{Family: 2, Attributes: &rtnetlink.RuleAttributes{Priority: ptr(uint32(900))}}},
	{"rule delete by table only", unix.RTM_DELRULE, fAck, &rtnetlink.RuleMessage{Family: 2, Attributes: &rtnetlink.RuleAttributes{Table: ptr(uint32(900))}}},
	{"rule delete missing: ENOENT", unix.RTM_DELRULE, fAck, &rtnetlink.RuleMessage{Family: 2, Attributes: &rtnetlink.RuleAttributes{Priority: ptr(uint32(12345))}}},
	{"v6 rule delete", unix.RTM_DELRULE, fAck, &rtnetlink.RuleMessage{Family: 10, Attributes: &rtnetlink.RuleAttributes{Priority: ptr(uint32(901))}}},
	{"rule dump after", unix.RTM_GETRULE, fDump, &rtnetlink.RuleMessage{}},

	{"echo: the requester gets its event", unix.RTM_NEWROUTE, fAdd | netlink.Echo, rt("10.77.0.0/16", 900, func(m *rtnetlink.RouteMessage) { m.Attributes.OutIface = 3 })},
	{"delete the primary v4 address: secondaries and prefsrc routes go", unix.RTM_DELADDR, fAck, addrMsg(2, "10.0.0.5/16", 0)},
	{"delete the other primary", unix.RTM_DELADDR, fAck, addrMsg(2, "10.9.0.5/16", 0)},
	{"v4 dump after address removal", unix.RTM_GETROUTE, fDump, &rtnetlink.RouteMessage{Family: 2}},
	{"readd an address to br0", unix.RTM_NEWADDR, fAdd, addrMsg(2, "10.0.0.7/16", 0)},
	{"route via br0 in main", unix.RTM_NEWROUTE, fAdd, rt("10.12.0.0/16", 254, func(m *rtnetlink.RouteMessage) { m.Attributes.OutIface = 2 })},
	{"delete br0's last v4 address: its v4 routes vanish", unix.RTM_DELADDR, fAck, addrMsg(2, "10.0.0.7/16", 0)},
	{"v4 dump after the last address", unix.RTM_GETROUTE, fDump, &rtnetlink.RouteMessage{Family: 2}},
	{"v6 address delete clears prefsrc", unix.RTM_DELADDR, fAck, addrMsg(2, "fd00::5/64", 0)},
	{"v6 dump after address removal", unix.RTM_GETROUTE, fDump, &rtnetlink.RouteMessage{Family: 10}},
	{"v4 route via br0 again", unix.RTM_NEWROUTE, fAdd, rt("10.13.0.0/16", 900, func(m *rtnetlink.RouteMessage) { m.Attributes.OutIface = 2 })},
	{"v6 address again", unix.RTM_NEWADDR, fAdd, addrMsg(2, "fd00::5/64", unix.IFA_F_NODAD)},
	{"v4 address again", unix.RTM_NEWADDR, fAdd, addrMsg(2, "10.0.0.5/16", 0)},
	{"v6 route via br0 again", unix.RTM_NEWROUTE, fAdd, rt("fd0e::/64", 900, func(m *rtnetlink.RouteMessage) { m.Attributes.OutIface = 2 })},
	{"br0 down: v4 routes vanish silently, v6 routes and addresses with events", unix.RTM_NEWLINK, fAck, linkUp(2, false)},
	{"dump after link down", unix.RTM_GETROUTE, fDump, &rtnetlink.RouteMessage{}},
	{"addresses after link down", unix.RTM_GETADDR, fDump, &rtnetlink.AddressMessage{}},
	{"delete br1", unix.RTM_DELLINK, fAck, &rtnetlink.LinkMessage{Index: 3}},
	{"delete br1 again: ENODEV", unix.RTM_DELLINK, fAck, &rtnetlink.LinkMessage{Index: 3}},
	{"dump after link delete", unix.RTM_GETROUTE, fDump, &rtnetlink.RouteMessage{}},
	{"addresses after link delete", unix.RTM_GETADDR, fDump, &rtnetlink.AddressMessage{}},
	{"links at the end", unix.RTM_GETLINK, fDump, &rtnetlink.LinkMessage{}},
	{"rules at the end", unix.RTM_GETRULE, fDump, &rtnetlink.RuleMessage{}},
}

// TestKernelFaithful runs the same requests on the fake and on the real
// kernel (in a fresh namespace) and compares the answers, the replies and
// the events, as netwatch would decode them.
func TestKernelFaithful(t *testing.T) {
	ns := newNS(t)
	b := probe(t)
	t.Logf("the running kernel: %+v", b)
	k := NewWith(b)
	t.Cleanup(func() { k.Close() })
	real, fake := realSide(t, ns), fakeSide(t, k)
	for _, st := range faithSteps {
		m := netlink.Message{}
		m = request(st.typ, st.flags, st.body)
		want := real.do(t, st.name, m)
		got := fake.do(t, st.name, m)
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%s: fake differs from the kernel (-kernel +fake):\n%s", st.name, diff)
		} else if testing.Verbose() {
			t.Logf("%s: %s %q", st.name, want.Err, append(want.Replies, want.Events...))
		}
	}
}
