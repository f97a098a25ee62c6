//go:build linux

package fakekernel

import (
	"encoding/binary"
	"errors"
	"fmt"
	"iter"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jsimonetti/rtnetlink/v2"
	"github.com/mdlayher/netlink"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// netwatchConn is netwatch.Conn, repeated here: netwatch's tests import
// this package, so it cannot import netwatch.
type netwatchConn interface {
	Execute(m netlink.Message) ([]netlink.Message, error)
	Send(m netlink.Message) (netlink.Message, error)
	ReceiveIter() iter.Seq2[netlink.Message, error]
	SetReadDeadline(t time.Time) error
	Close() error
}

var _ netwatchConn = (*FakeConn)(nil)

func newKernel(t *testing.T) *Kernel {
	t.Helper()
	k := New()
	t.Cleanup(func() { k.Close() })
	return k
}

func doReq(c *FakeConn, typ uint16, flags netlink.HeaderFlags, body marshaler) ([]netlink.Message, error) {
	return c.Execute(request(typ, flags, body))
}

func mustExec(t *testing.T, c *FakeConn, typ uint16, flags netlink.HeaderFlags, body marshaler) []netlink.Message {
	t.Helper()
	msgs, err := doReq(c, typ, flags, body)
	if err != nil {
		t.Fatalf("request %d: %v", typ, err)
	}
	return msgs
}

func errnoOf(err error) unix.Errno {
	var e unix.Errno
	errors.As(err, &e)
	return e
}

// pending reports whether a receive would return at once.
func (s *socket) pending() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.queue) > 0 || s.overrun
}

// queued receives the messages waiting on c, without blocking: the fake
// delivers events before the request that causes them returns.
func queued(t *testing.T, c *FakeConn) []netlink.Message {
	t.Helper()
	var msgs []netlink.Message
	for c.sock.pending() {
		for m, err := range c.ReceiveIter() {
			if err != nil {
				t.Fatalf("receive: %v", err)
			}
			msgs = append(msgs, m)
		}
	}
	return msgs
}

func routeTo(link uint32) func(*rtnetlink.RouteMessage) {
	return func(m *rtnetlink.RouteMessage) { m.Attributes.OutIface = link }
}

// TestAnswers checks one kernel answer per case: the errno and the
// extended-ack message a request gets.
func TestAnswers(t *testing.T) {
	const eth = 2
	up := func(k *Kernel) { k.AddLink("eth0", "veth", 1500, true) }
	withRoute := func(k *Kernel) {
		up(k)
		if err := k.AddRoute(Route{Table: 900, Dst: netip.MustParsePrefix("10.1.0.0/16"), Index: eth, Scope: unix.RT_SCOPE_LINK, Protocol: 77}); err != nil {
			t.Fatal(err)
		}
	}
	withRule := func(k *Kernel) {
		if err := k.AddRule(Rule{Family: unix.AF_INET, Priority: 900, Table: 900, Invert: true, Mark: 0xe00, Mask: 0xf00, Protocol: 77}); err != nil {
			t.Fatal(err)
		}
	}
	withAddr := func(k *Kernel) {
		up(k)
		if err := k.AddAddr(eth, netip.MustParsePrefix("10.0.0.5/16")); err != nil {
			t.Fatal(err)
		}
	}
	notRule := rule(unix.AF_INET, 900, 900, func(m *rtnetlink.RuleMessage) {
		m.Flags, m.Attributes.FwMark, m.Attributes.FwMask = unix.FIB_RULE_INVERT, ptr(uint32(0xe00)), ptr(uint32(0xf00))
	})
	tests := []struct {
		name  string
		setup func(*Kernel)
		typ   uint16
		flags netlink.HeaderFlags
		body  marshaler
		errno unix.Errno
		msg   string
	}{
		{"route add", up, unix.RTM_NEWROUTE, fAdd, rt("10.1.0.0/16", 900, routeTo(eth)), 0, ""},
		{"route add, exists: EEXIST", withRoute, unix.RTM_NEWROUTE, fAdd, rt("10.1.0.0/16", 900, routeTo(eth)), unix.EEXIST, ""},
		{"route replace, exists", withRoute, unix.RTM_NEWROUTE, fReplace, rt("10.1.0.0/16", 900, routeTo(eth)), 0, ""},
		{"route create, different: not modelled", withRoute, unix.RTM_NEWROUTE, fCreate, rt("10.1.0.0/16", 900, func(m *rtnetlink.RouteMessage) {
			m.Attributes.OutIface, m.Attributes.Gateway, m.Scope = eth, ip("10.0.0.1"), 0
		}), unix.EOPNOTSUPP, "netwatchtest: several routes with one key (append, prepend, IPv6 multipath) are not modelled"},
		{"route via a missing link: ENODEV", up, unix.RTM_NEWROUTE, fAdd, rt("10.1.0.0/16", 900, routeTo(99)), unix.ENODEV, ""},
		{"route via a down link: ENETDOWN", func(k *Kernel) { k.AddLink("eth0", "veth", 1500, false) },
			unix.RTM_NEWROUTE, fAdd, rt("10.1.0.0/16", 900, routeTo(eth)), unix.ENETDOWN, "Device for nexthop is not up"},
		{"v6 route via a down link: ENETDOWN", func(k *Kernel) { k.AddLink("eth0", "veth", 1500, false) },
			unix.RTM_NEWROUTE, fAdd, rt("fd00::/64", 900, routeTo(eth)), unix.ENETDOWN, "Nexthop device is not up"},
		{"route with a gateway but no link: not modelled", up, unix.RTM_NEWROUTE, fAdd, rt("10.1.0.0/16", 900, func(m *rtnetlink.RouteMessage) {
			m.Attributes.Gateway, m.Scope = ip("10.0.0.1"), 0
		}), unix.EOPNOTSUPP, "netwatchtest: routes that find their output link from the gateway are not modelled: give RTA_OIF"},
		{"multipath route: not modelled", up, unix.RTM_NEWROUTE, fAdd, rt("10.1.0.0/16", 900, func(m *rtnetlink.RouteMessage) {
			m.Attributes.Multipath = []rtnetlink.NextHop{{Hop: rtnetlink.RTNextHop{IfIndex: eth}}}
		}), unix.EOPNOTSUPP, "netwatchtest: route attribute 9 is not modelled"},
		{"route delete, scope 0 on a link route: ESRCH", withRoute, unix.RTM_DELROUTE, fAck, rt("10.1.0.0/16", 900, func(m *rtnetlink.RouteMessage) { m.Scope = 0 }), unix.ESRCH, ""},
		{"route delete, scope nowhere", withRoute, unix.RTM_DELROUTE, fAck, rt("10.1.0.0/16", 900, func(m *rtnetlink.RouteMessage) { m.Scope = unix.RT_SCOPE_NOWHERE }), 0, ""},
		{"route delete, missing: ESRCH", withRoute, unix.RTM_DELROUTE, fAck, rt("10.2.0.0/16", 900, nil), unix.ESRCH, ""},
		{"route delete, missing table: ESRCH", up, unix.RTM_DELROUTE, fAck, rt("10.2.0.0/16", 900, nil), unix.ESRCH, "FIB table does not exist"},
		{"strict dump, missing table: ENOENT", up, unix.RTM_GETROUTE, fDump, &rtnetlink.RouteMessage{Family: unix.AF_INET, Attributes: rtnetlink.RouteAttributes{Table: 900}},
			unix.ENOENT, "ipv4: FIB table does not exist"},
		{"strict dump, existing table", withRoute, unix.RTM_GETROUTE, fDump, &rtnetlink.RouteMessage{Family: unix.AF_INET, Attributes: rtnetlink.RouteAttributes{Table: 900}}, 0, ""},
		{"v6 strict dump, main exists from the start", nil, unix.RTM_GETROUTE, fDump, &rtnetlink.RouteMessage{Family: unix.AF_INET6, Table: unix.RT_TABLE_MAIN}, 0, ""},
		{"rule add", nil, unix.RTM_NEWRULE, fAdd, notRule, 0, ""},
		{"rule add, identical: EEXIST", withRule, unix.RTM_NEWRULE, fAdd, notRule, unix.EEXIST, ""},
		{"rule replace, identical: a duplicate", withRule, unix.RTM_NEWRULE, fReplace, notRule, 0, ""},
		{"rule delete, missing: ENOENT", withRule, unix.RTM_DELRULE, fAck, rule(unix.AF_INET, 901, 900, nil), unix.ENOENT, ""},
		{"rule of an unknown family", nil, unix.RTM_NEWRULE, fAdd, rule(7, 900, 900, nil), unix.EAFNOSUPPORT, "Rule family not supported"},
		{"rule goto: not modelled", nil, unix.RTM_NEWRULE, fAdd, rule(unix.AF_INET, 900, 900, func(m *rtnetlink.RuleMessage) {
			m.Action, m.Attributes.Goto = unix.FR_ACT_GOTO, ptr(uint32(950))
		}), unix.EOPNOTSUPP, "netwatchtest: rule attribute 4 is not modelled"},
		{"address add", up, unix.RTM_NEWADDR, fAdd, addrMsg(eth, "10.0.0.5/16", 0), 0, ""},
		{"address add, exists: EEXIST", withAddr, unix.RTM_NEWADDR, fAdd, addrMsg(eth, "10.0.0.5/16", 0), unix.EEXIST, "ipv4: Address already assigned"},
		{"address delete, missing: EADDRNOTAVAIL", withAddr, unix.RTM_DELADDR, fAck, addrMsg(eth, "10.0.0.6/16", 0), unix.EADDRNOTAVAIL, "ipv4: Address not found"},
		{"address on a missing link: ENODEV", nil, unix.RTM_NEWADDR, fAdd, addrMsg(eth, "10.0.0.5/16", 0), unix.ENODEV, "ipv4: Device not found"},
		{"link get, missing: ENODEV", nil, unix.RTM_GETLINK, netlink.Request, &rtnetlink.LinkMessage{Index: 9}, unix.ENODEV, ""},
		{"link create, exists: EEXIST", up, unix.RTM_NEWLINK, fAdd, linkMsg(0, "eth0", "veth"), unix.EEXIST, ""},
		{"delete lo: EOPNOTSUPP", nil, unix.RTM_DELLINK, fAck, &rtnetlink.LinkMessage{Index: 1}, unix.EOPNOTSUPP, ""},
		{"neighbours: not modelled", nil, unix.RTM_GETNEIGH, fDump, &rtnetlink.NeighMessage{}, unix.EOPNOTSUPP, "netwatchtest: message type 30 is not modelled"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := newKernel(t)
			if tt.setup != nil {
				tt.setup(k)
			}
			c := dialFake(t, k, nil, 0)
			_, err := doReq(c, tt.typ, tt.flags, tt.body)
			if got := errnoOf(err); got != tt.errno || (err == nil) != (tt.errno == 0) {
				t.Fatalf("got %v, want errno %v", err, tt.errno)
			}
			var oe *netlink.OpError
			if errors.As(err, &oe) && oe.Message != tt.msg {
				t.Errorf("extended ack %q, want %q", oe.Message, tt.msg)
			}
			reqs := k.Requests()
			if len(reqs) != 1 || reqs[0].Type != tt.typ || reqs[0].Errno != tt.errno {
				t.Errorf("Requests() = %+v, want one of type %d answered %v", reqs, tt.typ, tt.errno)
			}
		})
	}
}

func TestErrorReplyFormat(t *testing.T) {
	k := newKernel(t)
	c := dialFake(t, k, nil, 0)
	req := request(unix.RTM_DELROUTE, fAck, rt("10.1.0.0/16", 900, nil))
	sent, err := c.Send(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := c.sock.next()
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := parseDatagram(raw)
	if err != nil || len(msgs) != 1 {
		t.Fatalf("reply: %v %v", msgs, err)
	}
	m := msgs[0]
	if m.Header.Type != netlink.Error || m.Header.Flags != netlink.AcknowledgeTLVs || m.Header.Sequence != sent.Header.Sequence || m.Header.PID != c.PID() {
		t.Errorf("header %+v", m.Header)
	}
	if errno := int32(binary.NativeEndian.Uint32(m.Data)); errno != -int32(unix.ESRCH) {
		t.Errorf("errno %d, want -ESRCH", errno)
	}
	echoed, _ := sent.MarshalBinary()
	if got := m.Data[4 : 4+len(echoed)]; !cmp.Equal(got, echoed) {
		t.Errorf("echoed request %x, want %x", got, echoed)
	}
	if !strings.Contains(string(m.Data[4+len(echoed):]), "FIB table does not exist\x00") {
		t.Errorf("no extended ack in %x", m.Data)
	}
}

func TestDumpIsMultipart(t *testing.T) {
	k := newKernel(t)
	idx := k.AddLink("eth0", "veth", 1500, true)
	const n = 500
	for i := range n {
		r := Route{Table: 900, Dst: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 0}), 24), Index: idx, Scope: unix.RT_SCOPE_LINK}
		if err := k.AddRoute(r); err != nil {
			t.Fatal(err)
		}
	}
	c := dialFake(t, k, nil, 0)
	sent, err := c.Send(request(unix.RTM_GETROUTE, fDump, &rtnetlink.RouteMessage{Family: unix.AF_INET}))
	if err != nil {
		t.Fatal(err)
	}
	var datagrams, routes int
	for {
		raw, err := c.sock.next()
		if err != nil {
			t.Fatal(err)
		}
		msgs, err := parseDatagram(raw)
		if err != nil {
			t.Fatal(err)
		}
		datagrams++
		for _, m := range msgs {
			if m.Header.Flags&netlink.Multi == 0 || m.Header.Sequence != sent.Header.Sequence {
				t.Fatalf("message %+v of a dump", m.Header)
			}
		}
		if last := msgs[len(msgs)-1]; last.Header.Type == netlink.Done {
			if len(msgs) != 1 {
				t.Errorf("DONE shares its datagram with %d messages", len(msgs)-1)
			}
			break
		}
		routes += len(msgs)
		if len(msgs) < 2 {
			t.Errorf("datagram with %d messages", len(msgs))
		}
	}
	if routes != n || datagrams < 3 {
		t.Errorf("%d routes in %d datagrams, want %d in several", routes, datagrams, n)
	}
	// Through the library, the dump is one answer.
	msgs := mustExec(t, c, unix.RTM_GETROUTE, fDump, &rtnetlink.RouteMessage{Family: unix.AF_INET})
	if len(msgs) != n {
		t.Errorf("Execute returned %d messages, want %d", len(msgs), n)
	}
}

func TestRuleOrderAndDuplicates(t *testing.T) {
	k := newKernel(t)
	c := dialFake(t, k, nil, 0)
	add := func(flags netlink.HeaderFlags, prio, table uint32) {
		t.Helper()
		mustExec(t, c, unix.RTM_NEWRULE, flags, rule(unix.AF_INET, prio, table, nil))
	}
	add(fAdd, 900, 1)
	add(fAdd, 800, 2)
	add(fReplace, 900, 1) // the kernel ignores NLM_F_REPLACE: a duplicate
	add(fAdd, 900, 3)
	var got []string
	for _, r := range k.Rules() {
		if r.Family == unix.AF_INET {
			got = append(got, r.String())
		}
	}
	want := []string{"0: lookup 255", "800: lookup 2", "900: lookup 1", "900: lookup 1", "900: lookup 3", "32766: lookup 254", "32767: lookup 253"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("rules (-want +got):\n%s", diff)
	}
	// A delete naming only a priority removes the first rule there.
	mustExec(t, c, unix.RTM_DELRULE, fAck, &rtnetlink.RuleMessage{Family: unix.AF_INET, Attributes: &rtnetlink.RuleAttributes{Priority: ptr(uint32(900))}})
	mustExec(t, c, unix.RTM_DELRULE, fAck, &rtnetlink.RuleMessage{Family: unix.AF_INET, Attributes: &rtnetlink.RuleAttributes{Table: ptr(uint32(3))}})
	got = nil
	for _, r := range k.Rules() {
		if r.Family == unix.AF_INET && r.Priority == 900 {
			got = append(got, r.String())
		}
	}
	if diff := cmp.Diff([]string{"900: lookup 1"}, got); diff != "" {
		t.Errorf("rules at 900 after the deletes (-want +got):\n%s", diff)
	}
	// A rule dump includes the multicast-routing families (New follows
	// DefaultBehavior, which has them).
	var families []uint8
	for _, m := range mustExec(t, c, unix.RTM_GETRULE, fDump, &rtnetlink.RuleMessage{}) {
		families = append(families, m.Data[0])
	}
	if diff := cmp.Diff([]uint8{2, 2, 2, 2, 2, 128, 129, 10, 10}, families); diff != "" {
		t.Errorf("dumped families (-want +got):\n%s", diff)
	}
}

// TestMulticastRules: the multicast-routing families' rules are in a dump
// only where the behaviour says the kernel has them; without them a
// request of those families is EAFNOSUPPORT, as on such a kernel.
func TestMulticastRules(t *testing.T) {
	for _, tc := range []struct {
		b          Behavior
		families   []uint8
		dump128Err error
	}{
		{Behavior{MulticastRules: true}, []uint8{2, 2, 2, 128, 129, 10, 10}, nil},
		{Behavior{MulticastRules: false}, []uint8{2, 2, 2, 10, 10}, unix.EAFNOSUPPORT},
	} {
		t.Run(fmt.Sprint(tc.b.MulticastRules), func(t *testing.T) {
			k := NewWith(tc.b)
			t.Cleanup(func() { k.Close() })
			c := dialFake(t, k, nil, 0)
			var families []uint8
			for _, m := range mustExec(t, c, unix.RTM_GETRULE, fDump, &rtnetlink.RuleMessage{}) {
				families = append(families, m.Data[0])
			}
			if diff := cmp.Diff(tc.families, families); diff != "" {
				t.Errorf("dumped families (-want +got):\n%s", diff)
			}
			_, err := c.Execute(request(unix.RTM_GETRULE, fDump, &rtnetlink.RuleMessage{Family: 128}))
			if !errors.Is(err, tc.dump128Err) || (err == nil) != (tc.dump128Err == nil) {
				t.Errorf("dump of family 128: %v, want %v", err, tc.dump128Err)
			}
			_, err = c.Execute(request(unix.RTM_NEWRULE, fAdd, rule(128, 900, 900, nil)))
			want := unix.EOPNOTSUPP // modelled as not modelled
			if !tc.b.MulticastRules {
				want = unix.EAFNOSUPPORT
			}
			if !errors.Is(err, want) {
				t.Errorf("rule add of family 128: %v, want %v", err, want)
			}
		})
	}
}

func TestRouteDefaults(t *testing.T) {
	k := newKernel(t)
	idx := k.AddLink("eth0", "veth", 1500, true)
	c := dialFake(t, k, nil, 0)
	mustExec(t, c, unix.RTM_NEWROUTE, fAdd, rt("fd00::/64", 0, func(m *rtnetlink.RouteMessage) { m.Attributes.OutIface = idx }))
	mustExec(t, c, unix.RTM_NEWROUTE, fAdd, rt("10.0.0.0/8", 0, func(m *rtnetlink.RouteMessage) { m.Attributes.OutIface = idx }))
	want := []Route{
		{Table: 254, Dst: netip.MustParsePrefix("10.0.0.0/8"), Index: idx, Protocol: 77, Scope: unix.RT_SCOPE_LINK, Type: unix.RTN_UNICAST},
		{Table: 254, Dst: netip.MustParsePrefix("fd00::/64"), Metric: 1024, Index: idx, Protocol: 77, Type: unix.RTN_UNICAST},
	}
	if diff := cmp.Diff(want, k.Routes(), cmp.Comparer(func(a, b netip.Prefix) bool { return a == b }), cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
		t.Errorf("routes (-want +got):\n%s", diff)
	}
}

// event is a decoded event for assertions.
type event struct {
	Type     uint16
	PID, Seq uint32
	What     string
}

func events(t *testing.T, c *FakeConn) []event {
	t.Helper()
	var evs []event
	for _, m := range queued(t, c) {
		line, _ := describe(m, 0, false)
		evs = append(evs, event{uint16(m.Header.Type), m.Header.PID, m.Header.Sequence, strings.SplitN(line, " ", 4)[3]})
	}
	return evs
}

func TestEventsOwnAndForeign(t *testing.T) {
	k := newKernel(t)
	idx := k.AddLink("eth0", "veth", 1500, true)
	sub := dialFake(t, k, allGroups, 0)
	v4only := dialFake(t, k, []uint32{unix.RTNLGRP_IPV4_ROUTE}, 0)
	req := dialFake(t, k, nil, 0)

	sent, err := req.Send(request(unix.RTM_NEWROUTE, fAdd, rt("10.1.0.0/16", 900, routeTo(idx))))
	if err != nil {
		t.Fatal(err)
	}
	queued(t, req) // the acknowledgement
	if err := k.AddRoute(Route{Table: 900, Dst: netip.MustParsePrefix("fd00::/64"), Index: idx}); err != nil {
		t.Fatal(err)
	}
	if err := k.SetLinkMTU(idx, 1400); err != nil {
		t.Fatal(err)
	}
	mustExec(t, req, unix.RTM_NEWLINK, fAck, &rtnetlink.LinkMessage{Index: idx, Attributes: &rtnetlink.LinkAttributes{MTU: 1300}})

	got := events(t, sub)
	want := []event{
		{unix.RTM_NEWROUTE, req.PID(), sent.Header.Sequence, ""}, // own request: our port and sequence
		{unix.RTM_NEWROUTE, 0, 0, ""},                            // foreign: port 0
		{unix.RTM_NEWLINK, 0, 0, ""},
		{unix.RTM_NEWLINK, 0, 0, ""}, // link events carry port 0 even for our own request
	}
	if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b event) bool {
		return a.Type == b.Type && a.PID == b.PID && a.Seq == b.Seq
	})); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	if got := events(t, v4only); len(got) != 1 || got[0].Type != unix.RTM_NEWROUTE || !strings.Contains(got[0].What, "10.1.0.0") {
		t.Errorf("IPv4-route subscriber got %+v, want the IPv4 route only", got)
	}
	if got := events(t, req); len(got) != 0 {
		t.Errorf("a conn without groups got events %+v", got)
	}
}

func TestLinkDown(t *testing.T) {
	k := newKernel(t)
	eth := k.AddLink("eth0", "veth", 1500, true)
	other := k.AddLink("eth1", "veth", 1500, true)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(k.AddAddr(eth, netip.MustParsePrefix("10.0.0.5/16")))
	must(k.AddAddr(eth, netip.MustParsePrefix("fd00::5/64")))
	must(k.AddRoute(Route{Table: 900, Dst: netip.MustParsePrefix("10.1.0.0/16"), Index: eth, Scope: unix.RT_SCOPE_LINK}))
	must(k.AddRoute(Route{Table: 900, Dst: netip.MustParsePrefix("10.2.0.0/16"), Index: other, Scope: unix.RT_SCOPE_LINK}))
	must(k.AddRoute(Route{Table: 900, Dst: netip.MustParsePrefix("fd01::/64"), Index: eth}))
	sub := dialFake(t, k, allGroups, 0)

	must(k.SetLinkUp(eth, false))

	var got []uint16
	for _, e := range events(t, sub) {
		got = append(got, e.Type)
	}
	// The link, the IPv6 route, the IPv6 address; nothing for the IPv4 route.
	if diff := cmp.Diff([]uint16{unix.RTM_NEWLINK, unix.RTM_DELROUTE, unix.RTM_DELADDR}, got); diff != "" {
		t.Errorf("event types (-want +got):\n%s", diff)
	}
	var routes []string
	for _, r := range k.Routes() {
		routes = append(routes, r.Dst.String())
	}
	if diff := cmp.Diff([]string{"10.2.0.0/16"}, routes); diff != "" {
		t.Errorf("routes left (-want +got):\n%s", diff)
	}
	if addrs := k.Addrs(); len(addrs) != 1 || addrs[0].Prefix.String() != "10.0.0.5/16" {
		t.Errorf("addresses left: %v, want the IPv4 one", addrs)
	}

	must(k.DelLink(eth))
	got = nil
	for _, e := range events(t, sub) {
		got = append(got, e.Type)
	}
	if diff := cmp.Diff([]uint16{unix.RTM_DELADDR, unix.RTM_DELLINK}, got); diff != "" {
		t.Errorf("events of the delete (-want +got):\n%s", diff)
	}
}

func TestAddrRemoval(t *testing.T) {
	k := newKernel(t)
	eth := k.AddLink("eth0", "veth", 1500, true)
	other := k.AddLink("eth1", "veth", 1500, true)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(k.AddAddr(eth, netip.MustParsePrefix("10.0.0.5/16")))
	must(k.AddAddr(eth, netip.MustParsePrefix("10.0.0.6/16"))) // secondary
	must(k.AddAddr(eth, netip.MustParsePrefix("10.9.0.5/16")))
	src := netip.MustParseAddr("10.0.0.5")
	must(k.AddRoute(Route{Dst: netip.MustParsePrefix("10.1.0.0/16"), Index: other, PrefSrc: src, Scope: unix.RT_SCOPE_LINK}))
	must(k.AddRoute(Route{Table: 900, Dst: netip.MustParsePrefix("10.2.0.0/16"), Index: other, PrefSrc: src, Scope: unix.RT_SCOPE_LINK}))
	must(k.AddRoute(Route{Table: 900, Dst: netip.MustParsePrefix("10.3.0.0/16"), Index: eth, Scope: unix.RT_SCOPE_LINK}))
	// Primaries first, then secondaries, as the kernel lists them.
	var flags []uint32
	for _, a := range k.Addrs() {
		flags = append(flags, a.Flags)
	}
	if diff := cmp.Diff([]uint32{unix.IFA_F_PERMANENT, unix.IFA_F_PERMANENT, unix.IFA_F_PERMANENT | unix.IFA_F_SECONDARY}, flags); diff != "" {
		t.Fatalf("address flags (-want +got):\n%s", diff)
	}
	sub := dialFake(t, k, allGroups, 0)

	must(k.DelAddr(eth, netip.MustParsePrefix("10.0.0.5/16")))
	var got []string
	for _, e := range events(t, sub) {
		got = append(got, e.What[:strings.Index(e.What, " scope")])
	}
	// The secondary goes with its primary; the main-table route using
	// the address as prefsrc is deleted with an event; table 900 keeps its.
	want := []string{"addr 2 10.0.0.6/16", "addr 2 10.0.0.5/16", "route fam=2 10.1.0.0/16 src/0 tos=0 hdrtable=254 table=254 proto=0"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	must(k.DelAddr(eth, netip.MustParsePrefix("10.9.0.5/16")))
	if got := events(t, sub); len(got) != 1 {
		t.Errorf("removing the last address: events %+v, want only its DELADDR", got)
	}
	var routes []string
	for _, r := range k.Routes() {
		routes = append(routes, r.Dst.String())
	}
	if diff := cmp.Diff([]string{"10.2.0.0/16"}, routes); diff != "" {
		t.Errorf("routes left (-want +got):\n%s", diff)
	}
}

func TestRouteGet(t *testing.T) {
	k := newKernel(t)
	eth := k.AddLink("enp7s0", "veth", 1450, true)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(k.AddAddr(eth, netip.MustParsePrefix("10.0.0.5/16")))
	must(k.AddRoute(Route{Dst: netip.MustParsePrefix("10.0.0.0/16"), Index: eth, Scope: unix.RT_SCOPE_LINK, Protocol: unix.RTPROT_KERNEL}))
	must(k.AddRoute(Route{Table: 900, Dst: netip.MustParsePrefix("10.0.0.0/16"), Gateway: netip.MustParseAddr("10.0.0.1"),
		Index: eth, PrefSrc: netip.MustParseAddr("10.0.0.5"), MTU: 1355}))
	must(k.AddRule(Rule{Family: unix.AF_INET, Priority: 900, Table: 900, Invert: true, Mark: 0xe00, Mask: 0xf00}))
	c := dialFake(t, k, nil, 0)
	for _, tt := range []struct {
		mark  uint32
		table uint32
		mtu   uint32
	}{{0, 900, 1355}, {0xe00, 254, 0}, {0x1e00, 254, 0}, {0x100, 900, 1355}} {
		msgs := mustExec(t, c, unix.RTM_GETROUTE, netlink.Request, rtGet("10.0.0.9", unix.RTM_F_LOOKUP_TABLE, tt.mark))
		var rm rtnetlink.RouteMessage
		if err := rm.UnmarshalBinary(msgs[0].Data); err != nil {
			t.Fatal(err)
		}
		mtu := uint32(0)
		if rm.Attributes.Metrics != nil {
			mtu = rm.Attributes.Metrics.MTU
		}
		if rm.Attributes.Table != tt.table || mtu != tt.mtu || rm.Attributes.OutIface != eth || rm.Attributes.Src.String() != "10.0.0.5" {
			t.Errorf("mark %#x: table %d mtu %d dev %d src %v, want table %d mtu %d", tt.mark, rm.Attributes.Table, mtu,
				rm.Attributes.OutIface, rm.Attributes.Src, tt.table, tt.mtu)
		}
	}
	if _, err := doReq(c, unix.RTM_GETROUTE, netlink.Request, rtGet("192.168.0.1", 0, 0)); !errors.Is(err, unix.ENETUNREACH) {
		t.Errorf("unroutable: %v, want ENETUNREACH", err)
	}
}

func TestEcho(t *testing.T) {
	k := newKernel(t)
	idx := k.AddLink("eth0", "veth", 1500, true)
	sub := dialFake(t, k, []uint32{unix.RTNLGRP_IPV4_ROUTE}, 0)
	msgs := mustExec(t, sub, unix.RTM_NEWROUTE, fAdd|netlink.Echo, rt("10.1.0.0/16", 900, routeTo(idx)))
	if len(msgs) != 1 || msgs[0].Header.Type != unix.RTM_NEWROUTE {
		t.Fatalf("Execute got %+v, want the echoed event", msgs)
	}
	// The acknowledgement follows; the event is not multicast to us again.
	rest := queued(t, sub)
	if len(rest) != 1 || rest[0].Header.Type != netlink.Error {
		t.Errorf("after the echo: %+v, want the acknowledgement only", rest)
	}
}

func TestReceiveBlocksUntilEvent(t *testing.T) {
	k := newKernel(t)
	sub := dialFake(t, k, []uint32{unix.RTNLGRP_LINK}, 0)
	got := make(chan netlink.Message)
	go func() {
		defer close(got)
		for m, err := range sub.ReceiveIter() {
			if err == nil {
				got <- m
			}
		}
	}()
	k.AddLink("eth0", "veth", 1500, false)
	if m, ok := <-got; !ok || m.Header.Type != unix.RTM_NEWLINK {
		t.Fatalf("got %+v, want RTM_NEWLINK", m)
	}
}

func TestReadDeadline(t *testing.T) {
	k := newKernel(t)
	sub := dialFake(t, k, []uint32{unix.RTNLGRP_LINK}, 0)
	recv := func() <-chan error {
		errc := make(chan error, 1)
		go func() {
			for _, err := range sub.ReceiveIter() {
				errc <- err
				return
			}
			errc <- errors.New("nothing yielded")
		}()
		return errc
	}
	// A deadline already past fails at once.
	sub.SetReadDeadline(time.Now().Add(-time.Second))
	if err := <-recv(); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("got %v, want a deadline error", err)
	}
	// A pending receive is unblocked by moving the deadline.
	sub.SetReadDeadline(time.Time{})
	errc := recv()
	sub.SetReadDeadline(time.Now())
	err := <-errc
	var oe *netlink.OpError
	if !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &oe) || !oe.Timeout() {
		t.Fatalf("got %v, want a timeout", err)
	}
	// A deadline that passes while waiting.
	sub.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	if err := <-recv(); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("got %v, want a deadline error", err)
	}
}

func TestCloseUnblocks(t *testing.T) {
	k := newKernel(t)
	sub, err := k.DialConn([]uint32{unix.RTNLGRP_LINK}, 0)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		for _, err := range sub.ReceiveIter() {
			errc <- err
			return
		}
		errc <- errors.New("nothing yielded")
	}()
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; !errors.Is(err, unix.EBADF) {
		t.Fatalf("receive after close: %v, want EBADF", err)
	}
	if err := sub.Close(); err != nil {
		t.Errorf("second close: %v", err)
	}
	if _, err := sub.Send(request(unix.RTM_GETLINK, fDump, &rtnetlink.LinkMessage{})); !errors.Is(err, unix.EBADF) {
		t.Errorf("send after close: %v, want EBADF", err)
	}
	// The kernel forgot it: changes do not reach it.
	k.AddLink("eth0", "veth", 1500, false)
	if _, ok := k.conns[sub]; ok {
		t.Error("the kernel still holds the closed conn")
	}
	// Kernel.Close closes the others and refuses new ones.
	other := dialFake(t, k, nil, 0)
	k.Close()
	if _, err := other.Send(request(unix.RTM_GETLINK, fDump, &rtnetlink.LinkMessage{})); !errors.Is(err, unix.EBADF) {
		t.Errorf("send after Kernel.Close: %v, want EBADF", err)
	}
	if _, err := k.DialConn(nil, 0); err == nil {
		t.Error("DialConn after Close succeeded")
	}
}

func TestOverflowENOBUFS(t *testing.T) {
	k := newKernel(t)
	idx := k.AddLink("eth0", "veth", 1500, true)
	sub := dialFake(t, k, []uint32{unix.RTNLGRP_IPV4_ROUTE}, 4096)
	const n = 100
	for i := range n {
		r := Route{Table: 900, Dst: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 0, byte(i), 0}), 24), Index: idx, Scope: unix.RT_SCOPE_LINK}
		if err := k.AddRoute(r); err != nil {
			t.Fatal(err)
		}
	}
	var first error
	for _, err := range sub.ReceiveIter() {
		first = err
		break
	}
	if !errors.Is(first, unix.ENOBUFS) {
		t.Fatalf("first receive: %v, want ENOBUFS", first)
	}
	// What fitted is still there; the rest was lost.
	kept := len(queued(t, sub))
	if kept == 0 || kept >= n {
		t.Errorf("%d events kept of %d, want some lost", kept, n)
	}
	// Later events arrive again.
	if err := k.DelRoute(Route{Table: 900, Dst: netip.MustParsePrefix("10.0.0.0/24")}); err != nil {
		t.Fatal(err)
	}
	if got := queued(t, sub); len(got) != 1 || got[0].Header.Type != unix.RTM_DELROUTE {
		t.Errorf("after the overflow: %+v, want the DELROUTE", got)
	}
}

func TestInjectENOBUFS(t *testing.T) {
	k := newKernel(t)
	sub := dialFake(t, k, []uint32{unix.RTNLGRP_LINK}, 0)
	errc := make(chan error, 1)
	go func() {
		for _, err := range sub.ReceiveIter() {
			errc <- err
			return
		}
	}()
	k.InjectENOBUFS(sub) // wakes the pending receive
	if err := <-errc; !errors.Is(err, unix.ENOBUFS) {
		t.Fatalf("got %v, want ENOBUFS", err)
	}
	k.AddLink("eth0", "veth", 1500, false)
	if got := queued(t, sub); len(got) != 1 {
		t.Errorf("after the injected overrun: %d messages, want the event", len(got))
	}
	k.InjectENOBUFS(sub)
	k.ClearFaults()
	k.AddLink("eth1", "veth", 1500, false)
	if got := queued(t, sub); len(got) != 1 {
		t.Errorf("after ClearFaults: %d messages, want the event and no error", len(got))
	}
}

func TestSetDumpIntr(t *testing.T) {
	k := newKernel(t)
	k.AddLink("eth0", "veth", 1500, false)
	c := dialFake(t, k, nil, 0)
	k.SetDumpIntr(unix.RTM_GETLINK, 2)
	for i, want := range []bool{true, true, false} {
		msgs := mustExec(t, c, unix.RTM_GETLINK, fDump, &rtnetlink.LinkMessage{})
		if len(msgs) != 2 {
			t.Fatalf("dump %d: %d links", i, len(msgs))
		}
		for _, m := range msgs {
			if got := m.Header.Flags&netlink.DumpInterrupted != 0; got != want {
				t.Errorf("dump %d: NLM_F_DUMP_INTR %t, want %t", i, got, want)
			}
		}
	}
	// Other dump kinds are not affected.
	k.SetDumpIntr(unix.RTM_GETROUTE, 1)
	for _, m := range mustExec(t, c, unix.RTM_GETLINK, fDump, &rtnetlink.LinkMessage{}) {
		if m.Header.Flags&netlink.DumpInterrupted != 0 {
			t.Error("a link dump carries NLM_F_DUMP_INTR set for route dumps")
		}
	}
}

func TestFailNextAndAll(t *testing.T) {
	k := newKernel(t)
	idx := k.AddLink("eth0", "veth", 1500, true)
	c := dialFake(t, k, nil, 0)
	add := func(dst string) error {
		_, err := doReq(c, unix.RTM_NEWROUTE, fAdd, rt(dst, 900, routeTo(idx)))
		return err
	}
	k.FailNext(unix.RTM_NEWROUTE, unix.EBUSY, 2)
	for i, want := range []unix.Errno{unix.EBUSY, unix.EBUSY, 0} {
		if got := errnoOf(add("10.1.0.0/16")); got != want {
			t.Errorf("request %d: errno %v, want %v", i, got, want)
		}
	}
	if n := len(k.Routes()); n != 1 {
		t.Errorf("%d routes, want 1: failed requests change nothing", n)
	}
	k.FailAll(unix.RTM_GETROUTE, unix.EINTR)
	for i := range 3 {
		if _, err := doReq(c, unix.RTM_GETROUTE, fDump, &rtnetlink.RouteMessage{}); !errors.Is(err, unix.EINTR) {
			t.Errorf("dump %d: %v, want EINTR", i, err)
		}
	}
	if err := add("10.2.0.0/16"); err != nil {
		t.Errorf("another type still works: %v", err)
	}
	k.ClearFaults()
	if _, err := doReq(c, unix.RTM_GETROUTE, fDump, &rtnetlink.RouteMessage{}); err != nil {
		t.Errorf("after ClearFaults: %v", err)
	}
	reqs := k.Requests()
	if got := reqs[0]; got.Type != unix.RTM_NEWROUTE || got.Errno != unix.EBUSY || got.Flags != fAdd {
		t.Errorf("first request recorded as %+v", got)
	}
	if r, ok := reqs[2].Object.(Route); !ok || r.Dst.String() != "10.1.0.0/16" || r.Table != 900 || r.Index != idx {
		t.Errorf("decoded object %#v", reqs[2].Object)
	}
	k.ResetRequests()
	if n := len(k.Requests()); n != 0 {
		t.Errorf("%d requests after ResetRequests", n)
	}
}

func TestGoAPIErrors(t *testing.T) {
	k := newKernel(t)
	idx := k.AddLink("eth0", "veth", 1500, true)
	r := Route{Table: 900, Dst: netip.MustParsePrefix("10.1.0.0/16"), Index: idx, Scope: unix.RT_SCOPE_LINK}
	if err := k.AddRoute(r); err != nil {
		t.Fatal(err)
	}
	for name, err := range map[string]error{
		"AddRoute twice":       k.AddRoute(r),
		"DelRoute missing":     k.DelRoute(Route{Table: 900, Dst: netip.MustParsePrefix("10.2.0.0/16")}),
		"SetLinkUp missing":    k.SetLinkUp(9, true),
		"DelRule missing":      k.DelRule(Rule{Family: unix.AF_INET, Priority: 5}),
		"AddAddr missing link": k.AddAddr(9, netip.MustParsePrefix("10.0.0.1/8")),
	} {
		if err == nil || !strings.HasPrefix(err.Error(), "netwatchtest: ") {
			t.Errorf("%s: %v, want an netwatchtest error", name, err)
		}
	}
	if err := k.ReplaceRoute(Route{Table: 900, Dst: r.Dst, Index: idx, Scope: unix.RT_SCOPE_LINK, MTU: 1300}); err != nil {
		t.Fatal(err)
	}
	if got := k.Routes(); len(got) != 1 || got[0].MTU != 1300 {
		t.Errorf("after ReplaceRoute: %v", got)
	}
	if err := k.DelRoute(r); err != nil {
		t.Errorf("DelRoute: %v", err)
	}
	if links := k.Links(); len(links) != 2 || links[1].Flags&unix.IFF_UP == 0 || links[1].OperState != operUp {
		t.Errorf("links %+v", links)
	}
}

// TestConcurrent drives the kernel from several goroutines at once (run
// with -race) while a subscriber drains its events.
func TestConcurrent(t *testing.T) {
	k := newKernel(t)
	idx := k.AddLink("eth0", "veth", 1500, true)
	sub := dialFake(t, k, allGroups, 1<<20)
	drained := make(chan int)
	go func() {
		n := 0
		for {
			var stop bool
			for _, err := range sub.ReceiveIter() {
				if err != nil {
					stop = !errors.Is(err, unix.ENOBUFS)
					break
				}
				n++
			}
			if stop {
				drained <- n
				return
			}
		}
	}()
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			c, err := k.DialConn(nil, 0)
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			for i := range 50 {
				dst := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(w), byte(i), 0}), 24)
				if w%2 == 0 {
					if err := k.AddRoute(Route{Table: 900, Dst: dst, Index: idx, Scope: unix.RT_SCOPE_LINK}); err != nil {
						t.Error(err)
					}
					continue
				}
				if _, err := doReq(c, unix.RTM_NEWROUTE, fAdd, rt(dst.String(), 900, routeTo(idx))); err != nil {
					t.Error(err)
				}
				if _, err := doReq(c, unix.RTM_GETROUTE, fDump, &rtnetlink.RouteMessage{Family: unix.AF_INET}); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if n := len(k.Routes()); n != 200 {
		t.Errorf("%d routes, want 200", n)
	}
	sub.Close()
	if n := <-drained; n == 0 {
		t.Error("the subscriber saw no events")
	}
}
