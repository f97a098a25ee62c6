//go:build linux

package fakekernel

import (
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/marksplit/marksplit/internal/nstest"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/jsimonetti/rtnetlink/v2"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

type marshaler interface{ MarshalBinary() ([]byte, error) }

func request(typ uint16, flags netlink.HeaderFlags, body marshaler) netlink.Message {
	b, err := body.MarshalBinary()
	if err != nil {
		panic(err)
	}
	return netlink.Message{Header: netlink.Header{Type: netlink.HeaderType(typ), Flags: flags}, Data: b}
}

func describeErr(err error) string {
	var oe *netlink.OpError
	var errno unix.Errno
	if !errors.As(err, &oe) || !errors.As(err, &errno) {
		return err.Error()
	}
	return fmt.Sprintf("%s %q", unix.ErrnoName(errno), oe.Message)
}

func who(pid, self uint32) string {
	switch pid {
	case 0:
		return "kernel"
	case self:
		return "self"
	}
	return "other"
}

// describe renders a message the way netwatch would see it, through
// rtnetlink's decoders; ok is false for what the fake does not model and
// the real kernel adds by itself (kernel routes, link-local addresses),
// and for the events of new IPv6 addresses, which the kernel sends
// asynchronously (after duplicate address detection, even with nodad).
func describe(m netlink.Message, self uint32, event bool) (string, bool) {
	h := fmt.Sprintf("%d %v %s", m.Header.Type, m.Header.Flags, who(m.Header.PID, self))
	switch uint16(m.Header.Type) {
	case unix.RTM_NEWLINK, unix.RTM_DELLINK:
		var lm rtnetlink.LinkMessage
		if err := lm.UnmarshalBinary(m.Data); err != nil {
			return h + " undecodable: " + err.Error(), true
		}
		kind := ""
		if lm.Attributes.Info != nil {
			kind = lm.Attributes.Info.Kind
		}
		return fmt.Sprintf("%s link %d %s kind=%q mtu=%d up=%t", h, lm.Index, lm.Attributes.Name, kind,
			lm.Attributes.MTU, lm.Flags&unix.IFF_UP != 0), true
	case unix.RTM_NEWADDR, unix.RTM_DELADDR:
		var am rtnetlink.AddressMessage
		if err := am.UnmarshalBinary(m.Data); err != nil {
			return h + " undecodable: " + err.Error(), true
		}
		ip, _ := netip.AddrFromSlice(am.Attributes.Address)
		ip = ip.Unmap()
		if ip.IsLinkLocalUnicast() || event && m.Header.Type == unix.RTM_NEWADDR && ip.Is6() {
			return "", false
		}
		return fmt.Sprintf("%s addr %d %s/%d scope=%d flags=%#x label=%q", h, am.Index, ip, am.PrefixLength,
			am.Scope, am.Attributes.Flags, am.Attributes.Label), true
	case unix.RTM_NEWROUTE, unix.RTM_DELROUTE:
		var rm rtnetlink.RouteMessage
		if err := rm.UnmarshalBinary(m.Data); err != nil {
			return h + " undecodable: " + err.Error(), true
		}
		a := rm.Attributes
		dst, _ := netip.AddrFromSlice(a.Dst)
		if rm.Protocol == unix.RTPROT_KERNEL || rm.Table == unix.RT_TABLE_LOCAL || dst.Unmap().IsLinkLocalUnicast() ||
			dst.IsMulticast() {
			return "", false
		}
		return fmt.Sprintf("%s route fam=%d %v/%d src/%d tos=%d hdrtable=%d table=%d proto=%d scope=%d type=%d flags=%#x gw=%v oif=%d prefsrc=%v metric=%d metrics=[%s] mark=%d",
			h, rm.Family, a.Dst, rm.DstLength, rm.SrcLength, rm.Tos, rm.Table, a.Table, rm.Protocol, rm.Scope, rm.Type,
			rm.Flags&^unix.RTNH_F_LINKDOWN, a.Gateway, a.OutIface, a.Src, a.Priority, describeMetrics(m.Data), a.Mark), true
	case unix.RTM_NEWRULE, unix.RTM_DELRULE:
		var rm rtnetlink.RuleMessage
		if err := rm.UnmarshalBinary(m.Data); err != nil {
			return h + " undecodable: " + err.Error(), true
		}
		a := rm.Attributes
		u := func(p *uint32) string {
			if p == nil {
				return "-"
			}
			return fmt.Sprintf("%#x", *p)
		}
		s := func(p *string) string {
			if p == nil {
				return "-"
			}
			return *p
		}
		proto := "-"
		if a.Protocol != nil {
			proto = fmt.Sprint(*a.Protocol)
		}
		return fmt.Sprintf("%s rule fam=%d hdrtable=%d action=%d flags=%#x dst/%d src/%d tos=%d table=%s prio=%s mark=%s mask=%s proto=%s suppress=%s iif=%s oif=%s src=%v dst=%v",
			h, rm.Family, rm.Table, rm.Action, rm.Flags, rm.DstLength, rm.SrcLength, rm.TOS, u(a.Table), u(a.Priority),
			u(a.FwMark), u(a.FwMask), proto, u(a.SuppressPrefixLen), s(a.IIFName), s(a.OIFName), a.Src, a.Dst), true
	}
	return h + fmt.Sprintf(" %x", m.Data), true
}

// describeMetrics lists the RTA_METRICS of a route message, each as
// RTAX type=value (a string for RTAX_CC_ALGO) in the order sent.
func describeMetrics(data []byte) string {
	mx, ok := requestMetrics(data[unix.SizeofRtMsg:])
	if !ok {
		return "undecodable"
	}
	var out []string
	for _, a := range mx {
		if name, _ := congCtl(a.val); a.typ == unix.RTAX_CC_ALGO {
			out = append(out, fmt.Sprintf("%d=%q", a.typ, name))
		} else {
			out = append(out, fmt.Sprintf("%d=%d", a.typ, binary.NativeEndian.Uint32(a.val)))
		}
	}
	return strings.Join(out, " ")
}

// Request builders.

// withMetrics is a route request with an RTA_METRICS of its own, which
// rtnetlink's RouteMetrics cannot say: each of attrs is a type and a
// value, a uint32, a string (RTAX_CC_ALGO) or raw bytes.
type withMetrics struct {
	m     *rtnetlink.RouteMessage
	attrs []any
}

func (w withMetrics) MarshalBinary() ([]byte, error) {
	b, err := w.m.MarshalBinary()
	if err != nil {
		return nil, err
	}
	ae := netlink.NewAttributeEncoder()
	ae.Nested(unix.RTA_METRICS, func(nae *netlink.AttributeEncoder) error {
		for i := 0; i+1 < len(w.attrs); i += 2 {
			typ := w.attrs[i].(uint16)
			switch v := w.attrs[i+1].(type) {
			case uint32:
				nae.Uint32(typ, v)
			case string:
				nae.String(typ, v)
			case []byte:
				nae.Bytes(typ, v)
			}
		}
		return nil
	})
	mx, err := ae.Encode()
	if err != nil {
		return nil, err
	}
	return append(b, mx...), nil
}

// rtMx is rt with the metrics attrs: type, value, type, value, ….
func rtMx(dst string, table uint32, mod func(*rtnetlink.RouteMessage), attrs ...any) withMetrics {
	return withMetrics{rt(dst, table, mod), attrs}
}

func linkMsg(index uint32, name, kind string) *rtnetlink.LinkMessage {
	m := &rtnetlink.LinkMessage{Index: index, Attributes: &rtnetlink.LinkAttributes{Name: name}}
	if kind != "" {
		m.Attributes.Info = &rtnetlink.LinkInfo{Kind: kind}
	}
	return m
}

func linkUp(index uint32, up bool) *rtnetlink.LinkMessage {
	m := &rtnetlink.LinkMessage{Index: index, Change: unix.IFF_UP}
	if up {
		m.Flags = unix.IFF_UP
	}
	return m
}

func addrMsg(index uint32, prefix string, flags uint32) *rtnetlink.AddressMessage {
	p := netip.MustParsePrefix(prefix)
	ip := net.IP(p.Addr().AsSlice())
	m := &rtnetlink.AddressMessage{Family: familyOf(p.Addr()), PrefixLength: uint8(p.Bits()), Index: index,
		Attributes: &rtnetlink.AddressAttributes{Address: ip, Flags: flags}}
	if p.Addr().Is4() {
		m.Attributes.Local = ip
	}
	return m
}

// rt builds a route message for dst ("10.1.0.0/16") in table, then lets
// mod adjust it. Defaults: protocol 77, unicast, scope link for IPv4.
func rt(dst string, table uint32, mod func(*rtnetlink.RouteMessage)) *rtnetlink.RouteMessage {
	p := netip.MustParsePrefix(dst)
	m := &rtnetlink.RouteMessage{Family: familyOf(p.Addr()), DstLength: uint8(p.Bits()), Protocol: 77, Type: unix.RTN_UNICAST,
		Attributes: rtnetlink.RouteAttributes{Table: table}}
	if p.Bits() > 0 {
		m.Attributes.Dst = net.IP(p.Addr().AsSlice())
	}
	if p.Addr().Is4() {
		m.Scope = unix.RT_SCOPE_LINK
	}
	if mod != nil {
		mod(m)
	}
	return m
}

func ip(s string) net.IP { return net.IP(netip.MustParseAddr(s).AsSlice()) }

func ptr[T any](v T) *T { return &v }

// rule builds a rule message: lookup table at prio, protocol 77.
func rule(family uint8, prio, table uint32, mod func(*rtnetlink.RuleMessage)) *rtnetlink.RuleMessage {
	m := &rtnetlink.RuleMessage{Family: family, Action: unix.FR_ACT_TO_TBL,
		Attributes: &rtnetlink.RuleAttributes{Priority: ptr(prio), Table: ptr(table), Protocol: ptr(uint8(77))}}
	if mod != nil {
		mod(m)
	}
	return m
}

const (
	fAck     = netlink.Request | netlink.Acknowledge
	fAdd     = fAck | netlink.Create | netlink.Excl
	fReplace = fAck | netlink.Create | netlink.Replace
	fCreate  = fAck | netlink.Create
	fDump    = netlink.Request | netlink.Dump
)

func rtGet(dst string, flags uint32, mark uint32) *rtnetlink.RouteMessage {
	a := netip.MustParseAddr(dst)
	return &rtnetlink.RouteMessage{Family: familyOf(a), DstLength: uint8(a.BitLen()), Flags: flags,
		Attributes: rtnetlink.RouteAttributes{Dst: net.IP(a.AsSlice()), Mark: mark}}
}

// newNS returns a fresh network namespace for the test, which skips when
// namespaces are not available here, and fails instead with
// MARKSPLIT_KERNEL_TESTS=1 (CI sets it).
func newNS(t *testing.T) *nstest.NS {
	t.Helper()
	if reason := nstest.Unavailable(); reason != "" {
		if os.Getenv("MARKSPLIT_KERNEL_TESTS") == "1" {
			t.Fatalf("real-kernel test cannot run (%s) but MARKSPLIT_KERNEL_TESTS=1", reason)
		}
		t.Skipf("real-kernel test: %s", reason)
	}
	ns, err := nstest.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Close)
	return ns
}

// ip runs ip(8) in ns, failing the test on error.
func runIP(t *testing.T, ns *nstest.NS, args ...string) string {
	t.Helper()
	out, err := ns.IP(args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// probe is ProbeBehavior in a scratch namespace of its own: how the
// running kernel behaves where kernels differ.
func probe(t *testing.T) Behavior {
	t.Helper()
	scratch := newNS(t)
	b, err := ProbeBehavior(scratch)
	if err != nil {
		t.Fatalf("probe the kernel's behaviour: %v", err)
	}
	return b
}
