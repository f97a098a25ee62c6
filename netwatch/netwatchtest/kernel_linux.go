//go:build linux

package netwatchtest

import (
	"errors"
	"fmt"
	"net/netip"
	"syscall"

	"github.com/marksplit/marksplit/netwatch"
	"github.com/marksplit/marksplit/netwatch/internal/fakekernel"
	"golang.org/x/sys/unix"
)

// Kernel is a fake rtnetlink kernel: one network namespace's links,
// addresses, routes and rules, in netwatch's own types. A Watcher or an
// Applier reaches it through NetNS, as it reaches a real namespace; a test
// changes it directly (its changes are the kernel's own, announced with
// port 0) or as another program (DialProgram), and injects faults. It
// answers requests as Linux does, checked against a real kernel by this
// package's tests; what it does not model it refuses with EOPNOTSUPP and
// says so. The zero value is not usable; call New. Its representation is
// the project's internal fake kernel, whose fixtures the project's own
// tests share.
type Kernel fakekernel.Kernel

// New returns a kernel that looks like a fresh network namespace: lo
// (index 1, down), no addresses, no IPv4 tables, the IPv6 main and local
// tables (empty), and the default rules of both families.
func New() *Kernel { return (*Kernel)(fakekernel.New()) }

// Close closes every socket of the kernel; later dials fail.
func (k *Kernel) Close() error { return k.engine().Close() }

// NetNS returns a netwatch.NetNS whose sockets are the kernel's: give it
// to netwatch.Options.NetNS and netwatch.DialApplier.
func (k *Kernel) NetNS() *netwatch.NetNS { return (*netwatch.NetNS)(k.engine().NetNS()) }

// AddLink adds a link of kind ("veth", "tun", …) and returns its index.
// A link that is up has carrier.
func (k *Kernel) AddLink(name, kind string, mtu uint32, up bool) uint32 {
	return k.engine().AddLink(name, kind, mtu, up)
}

// SetLinkUp sets a link up or down; down flushes its IPv4 routes without
// a notification, as Linux does.
func (k *Kernel) SetLinkUp(index uint32, up bool) error { return k.engine().SetLinkUp(index, up) }

// SetLinkMTU sets a link's MTU.
func (k *Kernel) SetLinkMTU(index, mtu uint32) error { return k.engine().SetLinkMTU(index, mtu) }

// DelLink deletes a link, with its addresses and routes.
func (k *Kernel) DelLink(index uint32) error { return k.engine().DelLink(index) }

// AddAddr adds an address (10.0.0.5/16: the address with its subnet's
// length) to a link, with the subnet's route as Linux adds it.
func (k *Kernel) AddAddr(index uint32, prefix netip.Prefix) error {
	return k.engine().AddAddr(index, prefix)
}

// DelAddr deletes an address.
func (k *Kernel) DelAddr(index uint32, prefix netip.Prefix) error {
	return k.engine().DelAddr(index, prefix)
}

// AddRoute adds r as `ip route add` does. As ip(8) takes them, in every
// method that takes a route: Table 0 is the main table, Family 0 is Dst's,
// Type 0 is unicast. Attributes the fake does not model (next hops,
// flags, encapsulation, expiry, source prefix, a congestion control other
// than reno and cubic) are refused; every metric, "mtu lock" included, is
// kept as the kernel keeps it.
func (k *Kernel) AddRoute(r netwatch.Route) error {
	e, err := engineRoute(r)
	if err != nil {
		return err
	}
	return k.engine().AddRoute(e)
}

// ReplaceRoute adds or replaces r as `ip route replace` does.
func (k *Kernel) ReplaceRoute(r netwatch.Route) error {
	e, err := engineRoute(r)
	if err != nil {
		return err
	}
	return k.engine().ReplaceRoute(e)
}

// DelRoute deletes the first route that matches what r sets, as `ip
// route del` does.
func (k *Kernel) DelRoute(r netwatch.Route) error {
	e, err := engineRoute(r)
	if err != nil {
		return err
	}
	return k.engine().DelRoute(e)
}

// AddRule adds r, after the rules at its priority, as `ip rule add` does;
// Action 0 is a lookup (in every method that takes a rule).
func (k *Kernel) AddRule(r netwatch.Rule) error {
	e, err := engineRule(r)
	if err != nil {
		return err
	}
	return k.engine().AddRule(e)
}

// AppendRule adds r after the rules at its priority even when an
// identical rule is there, as a request without NLM_F_EXCL does (or one
// with NLM_F_REPLACE, which the kernel ignores for rules): a duplicate.
func (k *Kernel) AppendRule(r netwatch.Rule) error {
	e, err := engineRule(r)
	if err != nil {
		return err
	}
	return k.engine().AppendRule(e)
}

// DelRule deletes the first rule that matches what r sets.
func (k *Kernel) DelRule(r netwatch.Rule) error {
	e, err := engineRule(r)
	if err != nil {
		return err
	}
	return k.engine().DelRule(e)
}

// Snapshot returns the kernel's state as a netwatch cache would hold it:
// its links, addresses, routes (every table) and rules (IPv4 and IPv6), in
// the kernel's order.
func (k *Kernel) Snapshot() netwatch.Snapshot {
	var s netwatch.Snapshot
	for _, l := range k.engine().Links() {
		s.Links = append(s.Links, netwatch.Link{Index: l.Index, Name: l.Name, MTU: l.MTU, Kind: l.Kind,
			Flags: netwatch.LinkFlags(l.Flags), OperState: netwatch.OperState(l.OperState)})
	}
	for _, a := range k.engine().Addrs() {
		s.Addrs = append(s.Addrs, netwatch.Addr{Index: a.Index, Prefix: a.Prefix, Scope: netwatch.Scope(a.Scope),
			Flags: netwatch.AddrFlags(a.Flags), Label: a.Label})
	}
	for _, r := range k.engine().Routes() {
		s.Routes = append(s.Routes, fromEngine(r))
	}
	for _, r := range k.engine().Rules() {
		s.Rules = append(s.Rules, netwatch.Rule{Family: ruleFamily(r.Family), Priority: r.Priority, Table: netwatch.Table(r.Table),
			Action: netwatch.RuleAction(r.Action), Invert: r.Invert, Mark: netwatch.Mark(r.Mark), Mask: netwatch.Mark(r.Mask),
			Protocol: netwatch.Protocol(r.Protocol), Src: r.Src, Dst: r.Dst, TOS: r.TOS, IIF: r.IIF, OIF: r.OIF})
	}
	return s
}

// Request is a request a socket sent the kernel.
type Request struct {
	Type  uint16        // RTM_*
	Errno syscall.Errno // the kernel's answer: 0 for success, and for a dump
}

// Requests returns every request sent to the kernel, in order: by
// watchers, appliers and programs.
func (k *Kernel) Requests() []Request {
	var rs []Request
	for _, r := range k.engine().Requests() {
		rs = append(rs, Request{Type: r.Type, Errno: r.Errno})
	}
	return rs
}

// ResetRequests forgets the requests sent so far.
func (k *Kernel) ResetRequests() { k.engine().ResetRequests() }

// Overflow makes every subscriber's next receive fail with ENOBUFS, as an
// overflow of its socket's buffer does: a Watcher then resyncs.
func (k *Kernel) Overflow() { k.engine().Overflow() }

// SetDumpIntr sets NLM_F_DUMP_INTR on every message of the next n dumps
// of msgType (RTM_GETLINK, RTM_GETADDR, RTM_GETROUTE or RTM_GETRULE).
func (k *Kernel) SetDumpIntr(msgType uint16, n int) { k.engine().SetDumpIntr(msgType, n) }

// FailNext makes the next n requests of msgType (RTM_*) fail with errno,
// changing nothing. A failed dump reports errno in its DONE message.
func (k *Kernel) FailNext(msgType uint16, errno syscall.Errno, n int) {
	k.engine().FailNext(msgType, errno, n)
}

// FailAll makes every request of msgType fail with errno until
// ClearFaults.
func (k *Kernel) FailAll(msgType uint16, errno syscall.Errno) { k.engine().FailAll(msgType, errno) }

// ClearFaults ends FailNext, FailAll and SetDumpIntr.
func (k *Kernel) ClearFaults() { k.engine().ClearFaults() }

// Program is another program's rtnetlink socket on a Kernel. The Kernel's
// own methods stand for changes nobody asked for over netlink, announced
// with port 0 as the kernel's own are; a Program's are announced with its
// port and a request's sequence, as the kernel announces a program's
// requests: netwatch's Event.Origin tells them apart.
type Program struct{ p *fakekernel.Program }

// DialProgram opens a Program's socket.
func (k *Kernel) DialProgram() (*Program, error) {
	p, err := k.engine().DialProgram()
	if err != nil {
		return nil, err
	}
	return &Program{p}, nil
}

// Port is the program's netlink port: its events carry it.
func (p *Program) Port() uint32 { return p.p.Port() }

// Close closes the program's socket.
func (p *Program) Close() error { return p.p.Close() }

// AddRoute is Kernel.AddRoute as the program's request.
func (p *Program) AddRoute(r netwatch.Route) error {
	e, err := engineRoute(r)
	if err != nil {
		return err
	}
	return p.p.AddRoute(e)
}

// ReplaceRoute is Kernel.ReplaceRoute as the program's request.
func (p *Program) ReplaceRoute(r netwatch.Route) error {
	e, err := engineRoute(r)
	if err != nil {
		return err
	}
	return p.p.ReplaceRoute(e)
}

// DelRoute is Kernel.DelRoute as the program's request.
func (p *Program) DelRoute(r netwatch.Route) error {
	e, err := engineRoute(r)
	if err != nil {
		return err
	}
	return p.p.DelRoute(e)
}

// AddRule is Kernel.AddRule as the program's request.
func (p *Program) AddRule(r netwatch.Rule) error {
	e, err := engineRule(r)
	if err != nil {
		return err
	}
	return p.p.AddRule(e)
}

// DelRule is Kernel.DelRule as the program's request.
func (p *Program) DelRule(r netwatch.Rule) error {
	e, err := engineRule(r)
	if err != nil {
		return err
	}
	return p.p.DelRule(e)
}

// fromEngine is the fake kernel's route as netwatch models it.
func fromEngine(r fakekernel.Route) netwatch.Route {
	return netwatch.Route{Family: family(r.Dst.Addr()), Table: netwatch.Table(r.Table), Dst: r.Dst,
		TOS: r.TOS, Metric: r.Metric, Gateway: r.Gateway, Index: r.Index, PrefSrc: r.PrefSrc, MTU: r.MTU,
		Metrics: fromEngineMetrics(r.Metrics), Protocol: netwatch.Protocol(r.Protocol), Scope: netwatch.Scope(r.Scope), Type: netwatch.RouteType(r.Type)}
}

func ruleFamily(af uint8) netwatch.Family {
	if af == syscall.AF_INET {
		return netwatch.IPv4
	}
	return netwatch.IPv6
}

func family(a netip.Addr) netwatch.Family {
	if a.Is4() {
		return netwatch.IPv4
	}
	return netwatch.IPv6
}

// engineRoute is r in the fake kernel's terms, or why the fake cannot
// hold it.
func engineRoute(r netwatch.Route) (fakekernel.Route, error) {
	switch {
	case !r.Dst.IsValid():
		return fakekernel.Route{}, errors.New("netwatchtest: route without a destination")
	case r.Family != 0 && r.Family != family(r.Dst.Addr()):
		return fakekernel.Route{}, fmt.Errorf("netwatchtest: route %v: family %v", r.Dst, r.Family)
	case r.Src.IsValid() || r.Flags != 0 || r.NextHops != nil || r.NHID != 0 || r.Metrics.Attrs != "" ||
		r.Flow != 0 || r.Pref != 0 || !r.Expires.IsZero() || r.Encap != (netwatch.Encap{}) || r.Attrs != "":
		return fakekernel.Route{}, fmt.Errorf("netwatchtest: route %v: an attribute the fake kernel does not model", r.Dst)
	}
	if r.Table == 0 {
		r.Table = netwatch.TableMain
	}
	return fakekernel.Route{Table: uint32(r.Table), Dst: r.Dst, TOS: r.TOS, Metric: r.Metric, Gateway: r.Gateway,
		Index: r.Index, PrefSrc: r.PrefSrc, MTU: r.MTU, Metrics: engineMetrics(r.Metrics), Protocol: uint8(r.Protocol),
		Scope: uint8(r.Scope), Type: uint8(r.Type)}, nil
}

// metricFields are netwatch's Metrics fields by RTAX_* type, all but the
// congestion control and the MTU (a field of Route).
func metricFields(m *netwatch.Metrics) map[int]*uint32 {
	return map[int]*uint32{
		unix.RTAX_LOCK: &m.Locks, unix.RTAX_WINDOW: &m.Window, unix.RTAX_RTT: &m.RTT,
		unix.RTAX_RTTVAR: &m.RTTVar, unix.RTAX_SSTHRESH: &m.SSThresh, unix.RTAX_CWND: &m.CWnd,
		unix.RTAX_ADVMSS: &m.AdvMSS, unix.RTAX_REORDERING: &m.Reordering, unix.RTAX_HOPLIMIT: &m.HopLimit,
		unix.RTAX_INITCWND: &m.InitCWnd, unix.RTAX_FEATURES: &m.Features, unix.RTAX_RTO_MIN: &m.RTOMin,
		unix.RTAX_INITRWND: &m.InitRWnd, unix.RTAX_QUICKACK: &m.QuickAck, unix.RTAX_FASTOPEN_NO_COOKIE: &m.FastOpen,
	}
}

func engineMetrics(m netwatch.Metrics) fakekernel.Metrics {
	e := fakekernel.Metrics{CongCtl: m.CongCtl}
	for typ, v := range metricFields(&m) {
		e.Values[typ] = *v
	}
	return e
}

func fromEngineMetrics(e fakekernel.Metrics) netwatch.Metrics {
	m := netwatch.Metrics{CongCtl: e.CongCtl}
	for typ, v := range metricFields(&m) {
		*v = e.Values[typ]
	}
	return m
}

// engineRule is r in the fake kernel's terms, or why the fake cannot hold
// it.
func engineRule(r netwatch.Rule) (fakekernel.Rule, error) {
	if r.Goto != 0 || r.Flow != 0 || r.L3MDev != 0 || r.IPProto != 0 || r.SPort != (netwatch.PortRange{}) ||
		r.DPort != (netwatch.PortRange{}) || r.UID != (netwatch.UIDRange{}) || r.TunID != 0 ||
		r.SuppressPrefixLen.Set || r.SuppressIfGroup.Set || r.State != 0 || r.Attrs != "" {
		return fakekernel.Rule{}, fmt.Errorf("netwatchtest: rule %d: a selector the fake kernel does not model", r.Priority)
	}
	af := uint8(syscall.AF_INET)
	switch r.Family {
	case netwatch.IPv4:
	case netwatch.IPv6:
		af = syscall.AF_INET6
	default:
		return fakekernel.Rule{}, fmt.Errorf("netwatchtest: rule %d: family %v", r.Priority, r.Family)
	}
	return fakekernel.Rule{Family: af, Priority: r.Priority, Table: uint32(r.Table), Action: uint8(r.Action),
		Invert: r.Invert, Mark: uint32(r.Mark), Mask: uint32(r.Mask), Protocol: uint8(r.Protocol), Src: r.Src, Dst: r.Dst,
		TOS: r.TOS, IIF: r.IIF, OIF: r.OIF}, nil
}

// engine is the fake kernel that k is: netwatchtest's Kernel is
// fakekernel's under the name and in the types of netwatch.
func (k *Kernel) engine() *fakekernel.Kernel { return (*fakekernel.Kernel)(k) }
