//go:build linux

package fakekernel

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// rtnlgrpMax is the highest rtnetlink multicast group (RTNLGRP_IPV6_ACADDR).
const rtnlgrpMax = unix.RTNLGRP_IPV6_ACADDR

// errKernelClosed is returned by DialConn after Kernel.Close.
var errKernelClosed = errors.New("kernel closed")

// Kernel is a fake rtnetlink kernel: one network namespace's links,
// addresses, routes and rules, reachable through FakeConn sockets and changed
// directly through its Go API. The zero value is not usable; call New.
type Kernel struct {
	mu       sync.Mutex
	closed   bool
	behavior Behavior

	links     map[uint32]Link
	nextIndex uint32
	addrs     []Addr // per link: in the order the kernel lists them
	routes    map[routeKey]Route
	tables    map[tableID]bool
	rules     map[uint8][]Rule // AF_INET and AF_INET6, in kernel order
	// customRules4 is fib_has_custom_rules: once an IPv4 rule changed,
	// creating the local table no longer creates main along with it.
	customRules4 bool

	conns    map[*FakeConn]struct{}
	nextPort uint32

	requests []Request
	failNext map[uint16]failure
	failAll  map[uint16]unix.Errno
	dumpIntr map[uint16]int
}

type tableID struct {
	family uint8
	id     uint32
}

type failure struct {
	errno unix.Errno
	n     int
}

// New returns a kernel that looks like a fresh network namespace: lo
// (index 1, down), no addresses, no IPv4 tables, the IPv6 main and local
// tables (empty), and the default rules of both families. It behaves as
// DefaultBehavior says.
func New() *Kernel { return NewWith(DefaultBehavior) }

// NewWith is New for a kernel that behaves as b says: for example
// NewWith(ns.Behavior()) to follow the kernel a test runs on.
func NewWith(b Behavior) *Kernel {
	k := &Kernel{
		behavior:  b,
		links:     map[uint32]Link{},
		nextIndex: 1,
		routes:    map[routeKey]Route{},
		tables:    map[tableID]bool{},
		rules:     map[uint8][]Rule{},
		conns:     map[*FakeConn]struct{}{},
		nextPort:  4000,
		failNext:  map[uint16]failure{},
		failAll:   map[uint16]unix.Errno{},
		dumpIntr:  map[uint16]int{},
	}
	k.links[1] = Link{Index: 1, Name: "lo", MTU: 65536}
	k.nextIndex = 2
	k.tables[tableID{unix.AF_INET6, unix.RT_TABLE_MAIN}] = true
	k.tables[tableID{unix.AF_INET6, unix.RT_TABLE_LOCAL}] = true
	k.rules[unix.AF_INET] = []Rule{
		defaultRule(unix.AF_INET, 0, unix.RT_TABLE_LOCAL),
		defaultRule(unix.AF_INET, 32766, unix.RT_TABLE_MAIN),
		defaultRule(unix.AF_INET, 32767, unix.RT_TABLE_DEFAULT),
	}
	k.rules[unix.AF_INET6] = []Rule{
		defaultRule(unix.AF_INET6, 0, unix.RT_TABLE_LOCAL),
		defaultRule(unix.AF_INET6, 32766, unix.RT_TABLE_MAIN),
	}
	return k
}

func defaultRule(family uint8, prio, table uint32) Rule {
	return Rule{Family: family, Priority: prio, Table: table, Action: unix.FR_ACT_TO_TBL, Protocol: unix.RTPROT_KERNEL}
}

// Close closes every FakeConn of the kernel; later dials fail.
func (k *Kernel) Close() error {
	k.mu.Lock()
	k.closed = true
	conns := make([]*FakeConn, 0, len(k.conns))
	for c := range k.conns {
		conns = append(conns, c)
	}
	k.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
	return nil
}

// forget drops a closed conn.
func (k *Kernel) forget(c *FakeConn) {
	k.mu.Lock()
	delete(k.conns, c)
	k.mu.Unlock()
}

// kerr is the kernel's answer to a failed change: an errno and the
// extended-ack message, if the kernel gives one.
type kerr struct {
	errno unix.Errno
	msg   string
}

func fail(errno unix.Errno, msg string) *kerr { return &kerr{errno, msg} }

func (e *kerr) err(op string) error {
	if e == nil {
		return nil
	}
	if e.msg != "" {
		return fmt.Errorf("netwatchtest: %s: %w (%s)", op, e.errno, e.msg)
	}
	return fmt.Errorf("netwatchtest: %s: %w", op, e.errno)
}

// AddLink creates a link, up or down, announced by one RTM_NEWLINK as
// "ip link add NAME mtu MTU [up] type KIND" would be, and returns its
// index. An mtu of 0 means 1500. It panics if a link already has that name.
func (k *Kernel) AddLink(name, kind string, mtu uint32, up bool) uint32 {
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, ok := k.linkByName(name); ok {
		panic(fmt.Sprintf("netwatchtest: AddLink: a link is already called %q", name))
	}
	if mtu == 0 {
		mtu = 1500
	}
	return k.createLink(name, kind, mtu, 0, up)
}

// SetLinkUp sets a link administratively up or down. Down removes the
// link's IPv4 routes without events, its IPv6 routes and addresses with
// RTM_DELROUTE and RTM_DELADDR events, as the kernel does.
func (k *Kernel) SetLinkUp(index uint32, up bool) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, ok := k.links[index]; !ok {
		return fail(unix.ENODEV, "").err(fmt.Sprintf("set link %d up=%t", index, up))
	}
	k.setUp(index, up)
	return nil
}

// SetLinkMTU changes a link's MTU.
func (k *Kernel) SetLinkMTU(index, mtu uint32) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.setMTU(index, mtu).err(fmt.Sprintf("set link %d mtu %d", index, mtu))
}

// DelLink deletes a link with its addresses and routes, as the kernel
// does (see SetLinkUp; IPv4 addresses go with RTM_DELADDR events).
func (k *Kernel) DelLink(index uint32) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.deleteLink(index, nil).err(fmt.Sprintf("delete link %d", index))
}

// AddAddr adds an address to a link ("ip addr add PREFIX dev LINK"):
// scope global for IPv4, derived from the address for IPv6.
func (k *Kernel) AddAddr(index uint32, prefix netip.Prefix) error {
	return k.addAddr(index, prefix, nil)
}

func (k *Kernel) addAddr(index uint32, prefix netip.Prefix, o *origin) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	a := Addr{Index: index, Prefix: prefix}
	return k.newAddr(a, netlink.Create|netlink.Excl, o).err("add address " + prefix.String())
}

// DelAddr removes an address from a link. Removing an IPv4 address also
// removes its secondaries, the main-table routes using it as prefsrc
// (with events) and, when it was the link's last IPv4 address, every IPv4
// route through the link (without events).
func (k *Kernel) DelAddr(index uint32, prefix netip.Prefix) error {
	return k.removeAddrBy(index, prefix, nil)
}

func (k *Kernel) removeAddrBy(index uint32, prefix netip.Prefix, o *origin) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	f := addrFilter{family: familyOf(prefix.Addr()), index: index, local: prefix.Addr(), prefix: prefix}
	return k.delAddr(f, o).err("delete address " + prefix.String())
}

// AddRoute adds a route, failing with EEXIST when one with its key (table,
// destination, TOS, metric) exists ("ip route add").
func (k *Kernel) AddRoute(r Route) error {
	return k.setRoute(r, netlink.Create|netlink.Excl, nil).err("add route " + r.String())
}

func (k *Kernel) setRoute(r Route, flags netlink.HeaderFlags, o *origin) *kerr {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.newRoute(goRoute(r), metricAttrs(r), flags, o)
}

// ReplaceRoute adds a route or replaces the one with its key ("ip route
// replace").
func (k *Kernel) ReplaceRoute(r Route) error {
	return k.setRoute(r, netlink.Create|netlink.Replace, nil).err("replace route " + r.String())
}

// DelRoute deletes the first route that r names, as "ip route del" does:
// the destination, table and TOS must be r's; the metric (IPv4: any when
// 0, IPv6: any when 0), gateway, output link, protocol and, for IPv4,
// type, preferred source, MTU and metrics must be r's where r sets them; a zero
// Scope matches any scope. It fails with ESRCH when no route matches: a
// route via another gateway is not deleted.
func (k *Kernel) DelRoute(r Route) error { return k.unsetRoute(r, nil) }

func (k *Kernel) unsetRoute(r Route, o *origin) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	f := routeFilter{family: r.Family(), table: r.Table, dst: r.Dst, tos: r.TOS, metric: r.Metric, typ: r.Type,
		scope: r.Scope, prefSrc: r.PrefSrc, protocol: r.Protocol, index: r.Index, gateway: r.Gateway, metrics: metricAttrs(r)}
	if f.scope == 0 {
		f.scope = unix.RT_SCOPE_NOWHERE
	}
	return k.delRoute(f, o).err("delete route " + r.String())
}

// goRoute applies the Go API's defaults.
func goRoute(r Route) Route {
	if r.Type == 0 {
		r.Type = unix.RTN_UNICAST
	}
	return r
}

// AddRule adds a rule at r.Priority (always given, 0 included), failing
// with EEXIST when an identical rule exists ("ip rule add"). Action 0
// means FR_ACT_TO_TBL.
func (k *Kernel) AddRule(r Rule) error { return k.addRule(r, nil) }

// AppendRule adds r after the rules at its priority even when an identical
// rule is there: a request without NLM_F_EXCL (or with NLM_F_REPLACE,
// which the kernel ignores for rules) adds a duplicate.
func (k *Kernel) AppendRule(r Rule) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if r.Action == 0 {
		r.Action = unix.FR_ACT_TO_TBL
	}
	return k.newRule(ruleReq{Rule: r, hasPrio: true}, netlink.Create, nil).err("append rule " + r.String())
}

func (k *Kernel) addRule(r Rule, o *origin) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if r.Action == 0 {
		r.Action = unix.FR_ACT_TO_TBL
	}
	return k.newRule(ruleReq{Rule: r, hasPrio: true}, netlink.Create|netlink.Excl, o).err("add rule " + r.String())
}

// DelRule deletes the first rule of r.Family at r.Priority that matches
// every other non-zero field of r, as the kernel's delete does (Invert is
// not compared, and a Mark without a Mask matches only mask 0xffffffff).
// It fails with ENOENT when none matches.
func (k *Kernel) DelRule(r Rule) error { return k.removeRule(r, nil) }

func (k *Kernel) removeRule(r Rule, o *origin) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.delRule(ruleReq{Rule: r, hasPrio: true}, o).err("delete rule " + r.String())
}

// Links returns the links by index.
func (k *Kernel) Links() []Link {
	k.mu.Lock()
	defer k.mu.Unlock()
	links := make([]Link, 0, len(k.links))
	for _, l := range k.links {
		links = append(links, reported(l))
	}
	slices.SortFunc(links, func(a, b Link) int { return cmp.Compare(a.Index, b.Index) })
	return links
}

// Addrs returns the addresses, IPv4 first, by link, in kernel order.
func (k *Kernel) Addrs() []Addr {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.sortedAddrs(0, 0)
}

// Routes returns every route of both families, in dump order.
func (k *Kernel) Routes() []Route {
	k.mu.Lock()
	defer k.mu.Unlock()
	var rs []Route
	for _, fam := range []uint8{unix.AF_INET, unix.AF_INET6} {
		rs = append(rs, k.sortedRoutes(fam)...)
	}
	return rs
}

// Rules returns the IPv4 rules, then the IPv6 rules, in kernel order. The
// multicast-routing families (128, 129), which dumps include where
// Behavior.MulticastRules says so, are left out.
func (k *Kernel) Rules() []Rule {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append(slices.Clone(k.rules[unix.AF_INET]), k.rules[unix.AF_INET6]...)
}

// Requests returns every request the kernel's conns sent, in order.
func (k *Kernel) Requests() []Request {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.requests)
}

// ResetRequests forgets the recorded requests.
func (k *Kernel) ResetRequests() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.requests = nil
}

// InjectENOBUFS makes the next receive on c fail with ENOBUFS, as after a
// receive-buffer overrun. A pending receive fails at once.
func (k *Kernel) InjectENOBUFS(c *FakeConn) { c.sock.injectOverrun() }

// Overflow is InjectENOBUFS on every socket that has joined a multicast
// group: each subscriber's next receive fails with ENOBUFS, as after an
// overflow of its buffer.
func (k *Kernel) Overflow() {
	k.mu.Lock()
	var subs []*FakeConn
	for c := range k.conns {
		if len(c.sock.groups) > 0 {
			subs = append(subs, c)
		}
	}
	k.mu.Unlock()
	for _, c := range subs {
		c.sock.injectOverrun()
	}
}

// SetDumpIntr sets NLM_F_DUMP_INTR on every message (DONE included) of the
// next n dumps of msgType (RTM_GETLINK, RTM_GETADDR, RTM_GETROUTE or
// RTM_GETRULE).
func (k *Kernel) SetDumpIntr(msgType uint16, n int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.dumpIntr[msgType] = n
}

// FailNext makes the next n requests of msgType (RTM_*) fail with errno,
// changing nothing. A failed dump reports errno in its DONE message.
func (k *Kernel) FailNext(msgType uint16, errno unix.Errno, n int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if n <= 0 {
		delete(k.failNext, msgType)
		return
	}
	k.failNext[msgType] = failure{errno, n}
}

// FailAll makes every request of msgType fail with errno until
// ClearFaults.
func (k *Kernel) FailAll(msgType uint16, errno unix.Errno) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.failAll[msgType] = errno
}

// ClearFaults removes every fault set by FailNext, FailAll, SetDumpIntr
// and InjectENOBUFS that has not fired yet.
func (k *Kernel) ClearFaults() {
	k.mu.Lock()
	defer k.mu.Unlock()
	clear(k.failNext)
	clear(k.failAll)
	clear(k.dumpIntr)
	for c := range k.conns {
		c.sock.mu.Lock()
		c.sock.overrun, c.sock.congested = false, false
		c.sock.mu.Unlock()
	}
}

// injected returns the errno an injected fault gives a request of msgType.
func (k *Kernel) injected(msgType uint16) unix.Errno {
	if e, ok := k.failAll[msgType]; ok {
		return e
	}
	if f, ok := k.failNext[msgType]; ok && f.n > 0 {
		f.n--
		if f.n == 0 {
			delete(k.failNext, msgType)
		} else {
			k.failNext[msgType] = f
		}
		return f.errno
	}
	return 0
}

func (k *Kernel) takeDumpIntr(msgType uint16) bool {
	if n := k.dumpIntr[msgType]; n > 0 {
		if n == 1 {
			delete(k.dumpIntr, msgType)
		} else {
			k.dumpIntr[msgType] = n - 1
		}
		return true
	}
	return false
}
