//go:build linux

package fakekernel

import (
	"fmt"
	"net/netip"
	"strconv"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Link is a network interface of the fake kernel.
type Link struct {
	Index uint32
	Name  string
	Kind  string // IFLA_INFO_KIND ("veth", "tun", …); empty for lo
	MTU   uint32
	Up    bool // administratively up; a fake link has carrier whenever it is up

	// Flags (IFF_*) and OperState (IF_OPER_*) are what the kernel reports,
	// derived from Kind and Up. Links fills them in; AddLink ignores them.
	Flags     uint32
	OperState uint8
}

// Addr is an interface address.
type Addr struct {
	Index uint32
	// Prefix is the address with the prefix length of its subnet
	// (10.0.0.5/16); it is not masked.
	Prefix netip.Prefix
	// Scope is as requested for IPv4 and derived from the address for
	// IPv6 (link-local 253, loopback 254, others 0).
	Scope uint8
	// Flags are IFA_F_* as the kernel reports them: IFA_F_PERMANENT
	// always, IFA_F_SECONDARY on an IPv4 address in the subnet of an
	// earlier one on the same link.
	Flags uint32
	Label string // IPv4 only: the link's name unless the request named one
}

// Route is a route of either family. The family is Dst's.
type Route struct {
	Table    uint32       // 0 means main (254)
	Dst      netip.Prefix // masked; 0.0.0.0/0 or ::/0 for a default route
	TOS      uint8
	Metric   uint32 // RTA_PRIORITY; an IPv6 route given 0 gets 1024
	Gateway  netip.Addr
	Index    uint32 // output link (RTA_OIF)
	PrefSrc  netip.Addr
	MTU      uint32 // RTAX_MTU; 0 when unset
	Metrics  Metrics
	Protocol uint8
	Scope    uint8 // IPv4 only: the kernel reports 0 for every IPv6 route
	Type     uint8 // RTN_*; 0 means unicast in this package's Go API
}

// Metrics are a route's RTA_METRICS other than its MTU, as the kernel
// keeps them: Values by RTAX_* type, 0 for unset (Values[unix.RTAX_LOCK]
// holds the lock bits: 1<<unix.RTAX_MTU for "mtu lock"; the slots of
// RTAX_MTU and RTAX_CC_ALGO are unused), and CongCtl the congestion
// control algorithm's name (RTAX_CC_ALGO), "" for none. The fake knows the
// algorithms every kernel has built in, reno and cubic.
type Metrics struct {
	Values  [unix.RTAX_MAX + 1]uint32
	CongCtl string
}

// metric returns the value of RTAX_* type typ (not RTAX_CC_ALGO).
func (r Route) metric(typ uint16) uint32 {
	if typ == unix.RTAX_MTU {
		return r.MTU
	}
	return r.Metrics.Values[typ]
}

// Family returns unix.AF_INET or unix.AF_INET6.
func (r Route) Family() uint8 { return familyOf(r.Dst.Addr()) }

func (r Route) String() string {
	s := r.Dst.String()
	if r.Type != 0 && r.Type != unix.RTN_UNICAST {
		s = "type " + strconv.Itoa(int(r.Type)) + " " + s
	}
	if r.Gateway.IsValid() {
		s += " via " + r.Gateway.String()
	}
	if r.Index != 0 {
		s += " dev#" + strconv.FormatUint(uint64(r.Index), 10)
	}
	s += " table " + strconv.FormatUint(uint64(r.Table), 10)
	if r.Metric != 0 {
		s += " metric " + strconv.FormatUint(uint64(r.Metric), 10)
	}
	if r.PrefSrc.IsValid() {
		s += " src " + r.PrefSrc.String()
	}
	if r.MTU != 0 {
		s += " mtu " + strconv.FormatUint(uint64(r.MTU), 10)
	}
	for typ, v := range r.Metrics.Values {
		if v != 0 {
			s += " rtax" + strconv.Itoa(typ) + " " + strconv.FormatUint(uint64(v), 10)
		}
	}
	if r.Metrics.CongCtl != "" {
		s += " congctl " + r.Metrics.CongCtl
	}
	return s
}

// routeKey identifies a route the way the kernel does.
type routeKey struct {
	family uint8
	table  uint32
	dst    netip.Prefix
	tos    uint8
	metric uint32
}

func (r Route) key() routeKey {
	return routeKey{r.Family(), r.Table, r.Dst, r.TOS, r.Metric}
}

// Rule is a policy routing rule. Rules have no key: identical rules may
// coexist.
type Rule struct {
	Family   uint8 // unix.AF_INET or unix.AF_INET6
	Priority uint32
	Table    uint32
	Action   uint8 // FR_ACT_*; 0 means FR_ACT_TO_TBL in this package's Go API
	Invert   bool  // FIB_RULE_INVERT: "not"
	Mark     uint32
	// Mask is FRA_FWMASK. A rule given a mark but no mask gets
	// 0xffffffff, as the kernel does.
	Mask     uint32
	Protocol uint8
	Src      netip.Prefix // "from"; zero for any
	Dst      netip.Prefix // "to"; zero for any
	TOS      uint8
	IIF      string
	OIF      string
}

func (r Rule) String() string {
	s := strconv.FormatUint(uint64(r.Priority), 10) + ":"
	if r.Invert {
		s += " not"
	}
	if r.Src.IsValid() {
		s += " from " + r.Src.String()
	}
	if r.Dst.IsValid() {
		s += " to " + r.Dst.String()
	}
	if r.Mark != 0 || r.Mask != 0 {
		s += fmt.Sprintf(" fwmark %#x/%#x", r.Mark, r.Mask)
	}
	if r.IIF != "" {
		s += " iif " + r.IIF
	}
	if r.OIF != "" {
		s += " oif " + r.OIF
	}
	if r.Action == unix.FR_ACT_TO_TBL {
		s += " lookup " + strconv.FormatUint(uint64(r.Table), 10)
	} else {
		s += " action " + strconv.Itoa(int(r.Action))
	}
	return s
}

// Request is one request a FakeConn sent, as Kernel.Requests records it.
type Request struct {
	Type  uint16 // RTM_*
	Flags netlink.HeaderFlags
	// Object is the request's body decoded as a Link, Addr, Route or Rule,
	// as sent (no defaults applied); nil when it does not decode.
	Object any
	// Errno is the kernel's answer: 0 for success (or a dump).
	Errno unix.Errno
	// Message is the request as it was sent, header filled in.
	Message netlink.Message
}

func familyOf(a netip.Addr) uint8 {
	if a.Is4() {
		return unix.AF_INET
	}
	return unix.AF_INET6
}
