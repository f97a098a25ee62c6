//go:build linux

package fakekernel

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"

	"github.com/jsimonetti/rtnetlink/v2"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Datagram sizes of a dump: the kernel fills a page first, then larger
// buffers. DONE comes in a datagram of its own.
const (
	firstDumpDatagram = 3776
	dumpDatagram      = 16384
)

// Constants x/sys/unix lacks.
const (
	familyIPMR   = 128 // RTNL_FAMILY_IPMR
	familyIP6MR  = 129 // RTNL_FAMILY_IP6MR
	rtaFlowLabel = 31  // RTA_FLOWLABEL
)

// The rules of the multicast-routing families, which rule dumps include
// where Behavior.MulticastRules says so.
var mrouteRules = []Rule{
	{Family: familyIPMR, Priority: 32767, Table: unix.RT_TABLE_DEFAULT, Action: unix.FR_ACT_TO_TBL, Protocol: unix.RTPROT_KERNEL},
	{Family: familyIP6MR, Priority: 32767, Table: unix.RT_TABLE_MAIN, Action: unix.FR_ACT_TO_TBL, Protocol: unix.RTPROT_KERNEL},
}

// receive handles one request from s and queues the replies on s.
func (k *Kernel) receive(s *socket, raw []byte) {
	var m netlink.Message
	if err := m.UnmarshalBinary(raw); err != nil {
		return
	}
	m.Data = slices.Clone(m.Data)
	k.mu.Lock()
	defer k.mu.Unlock()
	i := len(k.requests)
	k.requests = append(k.requests, Request{
		Type:    uint16(m.Header.Type),
		Flags:   m.Header.Flags,
		Object:  decodeObject(m),
		Message: m,
	})
	k.requests[i].Errno = k.dispatch(s, m, raw)
}

func isGet(typ uint16) bool {
	switch typ {
	case unix.RTM_GETLINK, unix.RTM_GETADDR, unix.RTM_GETROUTE, unix.RTM_GETRULE:
		return true
	}
	return false
}

// dispatch answers a request and returns the errno it answered.
func (k *Kernel) dispatch(s *socket, m netlink.Message, raw []byte) unix.Errno {
	h := m.Header
	typ := uint16(h.Type)
	if h.Flags&netlink.Request == 0 || typ < unix.RTM_BASE {
		// The kernel skips these, acknowledging them if asked.
		if h.Flags&netlink.Acknowledge != 0 {
			k.ack(s, m, raw, nil)
		}
		return 0
	}
	dump := isGet(typ) && h.Flags&netlink.Dump != 0
	if e := k.injected(typ); e != 0 {
		ke := fail(e, "netwatchtest: injected fault")
		if dump {
			k.dumpDone(s, m, ke, typ == unix.RTM_GETROUTE, false)
		} else {
			k.ack(s, m, raw, ke)
		}
		return e
	}
	if dump {
		var ke *kerr
		switch typ {
		case unix.RTM_GETLINK:
			ke = k.dumpLinks(s, m)
		case unix.RTM_GETADDR:
			ke = k.dumpAddrs(s, m)
		case unix.RTM_GETROUTE:
			ke = k.dumpRoutes(s, m)
		case unix.RTM_GETRULE:
			ke = k.dumpRules(s, m)
		}
		if ke != nil {
			return ke.errno
		}
		return 0
	}
	o := &origin{s: s, seq: h.Sequence, echo: h.Flags&netlink.Echo != 0}
	var ke *kerr
	switch typ {
	case unix.RTM_NEWLINK:
		ke = k.reqNewLink(m)
	case unix.RTM_DELLINK:
		ke = k.reqDelLink(m, o)
	case unix.RTM_GETLINK:
		ke = k.getLink(s, m)
	case unix.RTM_NEWADDR:
		ke = k.reqAddr(m, o, true)
	case unix.RTM_DELADDR:
		ke = k.reqAddr(m, o, false)
	case unix.RTM_NEWROUTE:
		ke = k.reqRoute(m, o, true)
	case unix.RTM_DELROUTE:
		ke = k.reqRoute(m, o, false)
	case unix.RTM_GETROUTE:
		ke = k.getRoute(s, m)
	case unix.RTM_NEWRULE:
		ke = k.reqRule(m, o, true)
	case unix.RTM_DELRULE:
		ke = k.reqRule(m, o, false)
	case unix.RTM_GETADDR:
		ke = fail(unix.EOPNOTSUPP, "")
		if len(m.Data) > 0 && m.Data[0] == unix.AF_INET6 {
			ke.msg = "netwatchtest: getting a single IPv6 address is not modelled"
		}
	case unix.RTM_GETRULE:
		ke = fail(unix.EOPNOTSUPP, "")
	default:
		ke = fail(unix.EOPNOTSUPP, fmt.Sprintf("netwatchtest: message type %d is not modelled", typ))
	}
	if ke != nil || h.Flags&netlink.Acknowledge != 0 {
		k.ack(s, m, raw, ke)
	}
	if ke != nil {
		return ke.errno
	}
	return 0
}

// ack sends NLMSG_ERROR: an acknowledgement (ke nil) echoes the request's
// header, an error the whole request, followed by the extended-ack
// message if there is one.
func (k *Kernel) ack(s *socket, m netlink.Message, raw []byte, ke *kerr) {
	var flags netlink.HeaderFlags
	body := make([]byte, 4, 4+len(raw)+64)
	if ke == nil {
		flags = netlink.Capped
		body = append(body, raw[:16]...)
	} else {
		binary.NativeEndian.PutUint32(body, uint32(-int32(ke.errno)))
		body = append(body, raw...)
		if ke.msg != "" {
			flags |= netlink.AcknowledgeTLVs
			body = append(body, extAck(ke.msg)...)
		}
	}
	h := netlink.Header{Type: netlink.Error, Flags: flags, Sequence: m.Header.Sequence, PID: s.port}
	s.enqueue(marshal(h, body), false)
}

func extAck(msg string) []byte {
	return encodeAttrs(func(ae *netlink.AttributeEncoder) { ae.String(unix.NLMSGERR_ATTR_MSG, msg) })
}

// dumpReply sends the messages of a dump and its DONE.
func (k *Kernel) dumpReply(s *socket, m netlink.Message, typ uint16, bodies [][]byte, filtered bool) {
	flags := netlink.Multi
	if filtered {
		flags |= netlink.DumpFiltered
	}
	intr := k.takeDumpIntr(uint16(m.Header.Type))
	if intr {
		flags |= netlink.DumpInterrupted
	}
	h := netlink.Header{Type: netlink.HeaderType(typ), Flags: flags, Sequence: m.Header.Sequence, PID: s.port}
	var dg []byte
	limit := firstDumpDatagram
	for _, body := range bodies {
		b := marshal(h, body)
		if len(dg) > 0 && len(dg)+len(b) > limit {
			s.enqueue(dg, false)
			dg, limit = nil, dumpDatagram
		}
		dg = append(dg, b...)
	}
	if len(dg) > 0 {
		s.enqueue(dg, false)
	}
	k.dumpDone(s, m, nil, filtered, intr)
}

// dumpDone sends the DONE that ends a dump, with the dump's error if it
// failed.
func (k *Kernel) dumpDone(s *socket, m netlink.Message, ke *kerr, filtered, intr bool) {
	flags := netlink.Multi
	if filtered {
		flags |= netlink.DumpFiltered
	}
	if intr {
		flags |= netlink.DumpInterrupted
	}
	body := make([]byte, 4)
	if ke != nil {
		binary.NativeEndian.PutUint32(body, uint32(-int32(ke.errno)))
		if ke.msg != "" {
			flags |= netlink.AcknowledgeTLVs
			body = append(body, extAck(ke.msg)...)
		}
	}
	h := netlink.Header{Type: netlink.Done, Flags: flags, Sequence: m.Header.Sequence, PID: s.port}
	s.enqueue(marshal(h, body), false)
}

// decodeObject decodes a request's body for the record.
func decodeObject(m netlink.Message) any {
	switch uint16(m.Header.Type) {
	case unix.RTM_NEWLINK, unix.RTM_DELLINK, unix.RTM_GETLINK:
		if q, ke := decodeLink(m.Data); ke == nil {
			return q.object()
		}
	case unix.RTM_NEWADDR, unix.RTM_DELADDR, unix.RTM_GETADDR:
		if q, ke := decodeAddr(m.Data); ke == nil {
			return q.object()
		}
	case unix.RTM_NEWROUTE, unix.RTM_DELROUTE, unix.RTM_GETROUTE:
		if q, ke := decodeRoute(m.Data); ke == nil && q.route.Dst.IsValid() {
			return q.route
		}
	case unix.RTM_NEWRULE, unix.RTM_DELRULE, unix.RTM_GETRULE:
		if q, _, ke := decodeRule(m.Data); ke == nil {
			return q.Rule
		}
	}
	return nil
}

// Links.

func (k *Kernel) findLink(q linkReq) (Link, bool) {
	if q.msg.Index > 0 {
		l, ok := k.links[q.msg.Index]
		return l, ok
	}
	if q.name != "" {
		return k.linkByName(q.name)
	}
	return Link{}, false
}

func (k *Kernel) reqNewLink(m netlink.Message) *kerr {
	q, ke := decodeLink(m.Data)
	if ke != nil {
		return ke
	}
	if ke := checkAttrs("link", q.attrs, unix.IFLA_IFNAME, unix.IFLA_MTU, unix.IFLA_LINKINFO, unix.IFLA_EXT_MASK); ke != nil {
		return ke
	}
	if a := q.msg.Attributes; a != nil && a.Info != nil && (a.Info.Data != nil || a.Info.SlaveKind != "" || a.Info.SlaveData != nil) {
		return notModelled("link info", unix.IFLA_INFO_DATA)
	}
	flags := m.Header.Flags
	var up *bool
	if q.msg.Flags != 0 || q.msg.Change != 0 {
		change := q.msg.Change
		if change == 0 {
			change = ^uint32(0) // ifi_change 0 means all flags
		}
		if change&unix.IFF_UP != 0 {
			v := q.msg.Flags&unix.IFF_UP != 0
			up = &v
		}
	}
	l, ok := k.findLink(q)
	if ok {
		switch {
		case flags&netlink.Excl != 0:
			return fail(unix.EEXIST, "")
		case flags&netlink.Replace != 0:
			return fail(unix.EOPNOTSUPP, "")
		case q.kind != "" && q.kind != l.Kind:
			return fail(unix.EOPNOTSUPP, "")
		case q.msg.Index > 0 && q.name != "" && q.name != l.Name:
			return fail(unix.EOPNOTSUPP, "netwatchtest: renaming a link is not modelled")
		}
		if q.mtu != 0 {
			if ke := k.setMTU(l.Index, q.mtu); ke != nil {
				return ke
			}
		}
		if up != nil {
			k.setUp(l.Index, *up)
		}
		return nil
	}
	if flags&netlink.Create == 0 {
		return fail(unix.ENODEV, "")
	}
	if q.kind == "" {
		return fail(unix.EOPNOTSUPP, "Unknown device type")
	}
	name := q.name
	for n := 0; name == ""; n++ {
		if _, taken := k.linkByName(fmt.Sprint(q.kind, n)); !taken {
			name = fmt.Sprint(q.kind, n)
		}
	}
	if _, taken := k.linkByName(name); taken {
		return fail(unix.EEXIST, "")
	}
	mtu := q.mtu
	if mtu == 0 {
		mtu = 1500
	}
	if mtu < 68 {
		return fail(unix.EINVAL, "mtu less than device minimum")
	}
	if mtu > 65535 {
		return fail(unix.EINVAL, "mtu greater than device maximum")
	}
	k.createLink(name, q.kind, mtu, q.msg.Index, up != nil && *up)
	return nil
}

func (k *Kernel) reqDelLink(m netlink.Message, o *origin) *kerr {
	q, ke := decodeLink(m.Data)
	if ke != nil {
		return ke
	}
	if q.msg.Index == 0 && q.name == "" {
		return fail(unix.EINVAL, "")
	}
	l, ok := k.findLink(q)
	if !ok {
		return fail(unix.ENODEV, "")
	}
	return k.deleteLink(l.Index, o)
}

func badLinkHeader(q linkReq) bool {
	return q.msg.Family>>8 != 0 || q.msg.Type != 0 || q.msg.Flags != 0 || q.msg.Change != 0
}

func (k *Kernel) getLink(s *socket, m netlink.Message) *kerr {
	q, ke := decodeLink(m.Data)
	if ke != nil {
		return fail(unix.EINVAL, "Invalid header for get link request")
	}
	if badLinkHeader(q) {
		return fail(unix.EINVAL, "Invalid values in header for get link request")
	}
	for t := range q.attrs {
		if t != unix.IFLA_IFNAME && t != unix.IFLA_EXT_MASK {
			return fail(unix.EINVAL, "Unsupported attribute in get link request")
		}
	}
	if q.msg.Index == 0 && q.name == "" {
		return fail(unix.EINVAL, "")
	}
	l, ok := k.findLink(q)
	if !ok {
		return fail(unix.ENODEV, "")
	}
	h := netlink.Header{Type: unix.RTM_NEWLINK, Sequence: m.Header.Sequence, PID: s.port}
	s.enqueue(marshal(h, linkBody(reported(l))), false)
	return nil
}

func (k *Kernel) dumpLinks(s *socket, m netlink.Message) *kerr {
	ke := func() *kerr {
		q, ke := decodeLink(m.Data)
		if ke != nil {
			return fail(unix.EINVAL, "Invalid header for link dump")
		}
		if badLinkHeader(q) {
			return fail(unix.EINVAL, "Invalid values in header for link dump request")
		}
		if q.msg.Index != 0 {
			return fail(unix.EINVAL, "Filter by device index not supported for link dumps")
		}
		for t := range q.attrs {
			switch t {
			case unix.IFLA_EXT_MASK:
			case unix.IFLA_MASTER, unix.IFLA_LINKINFO, unix.IFLA_TARGET_NETNSID:
				return notModelled("link dump", t)
			default:
				return fail(unix.EINVAL, "Unsupported attribute in link dump request")
			}
		}
		return nil
	}()
	if ke != nil {
		k.dumpDone(s, m, ke, false, false)
		return ke
	}
	idx := make([]uint32, 0, len(k.links))
	for i := range k.links {
		idx = append(idx, i)
	}
	slices.Sort(idx)
	bodies := make([][]byte, len(idx))
	for i, ix := range idx {
		bodies[i] = linkBody(reported(k.links[ix]))
	}
	k.dumpReply(s, m, unix.RTM_NEWLINK, bodies, false)
	return nil
}

// Addresses.

func familyPrefix(family uint8) string {
	if family == unix.AF_INET6 {
		return "ipv6: "
	}
	return "ipv4: "
}

func (k *Kernel) reqAddr(m netlink.Message, o *origin, add bool) *kerr {
	q, ke := decodeAddr(m.Data)
	if ke != nil {
		return ke
	}
	if q.family != unix.AF_INET && q.family != unix.AF_INET6 {
		return fail(unix.EOPNOTSUPP, "")
	}
	if ke := checkAttrs("address", q.attrs, unix.IFA_UNSPEC, unix.IFA_ADDRESS, unix.IFA_LOCAL, unix.IFA_LABEL, unix.IFA_FLAGS); ke != nil {
		return ke
	}
	ip := q.local
	if q.family == unix.AF_INET6 || !ip.IsValid() {
		ip = q.address
		if !ip.IsValid() {
			ip = q.local
		}
	}
	if !ip.IsValid() || familyOf(ip) != q.family || int(q.prefixLen) > ip.BitLen() {
		return fail(unix.EINVAL, "")
	}
	if q.family == unix.AF_INET && q.local.IsValid() && q.address.IsValid() && q.local != q.address {
		if add {
			return fail(unix.EOPNOTSUPP, "netwatchtest: point-to-point peer addresses are not modelled")
		}
	}
	if add {
		flags := q.flags
		if q.family == unix.AF_INET6 {
			flags &= unix.IFA_F_NODAD | unix.IFA_F_HOMEADDRESS | unix.IFA_F_MANAGETEMPADDR | unix.IFA_F_NOPREFIXROUTE | unix.IFA_F_MCAUTOJOIN | unix.IFA_F_OPTIMISTIC
		}
		a := Addr{Index: q.index, Prefix: netip.PrefixFrom(ip, int(q.prefixLen)), Scope: q.scope, Flags: flags, Label: q.label}
		return k.newAddr(a, m.Header.Flags, o)
	}
	f := addrFilter{family: q.family, index: q.index, local: q.local, label: q.label}
	if q.family == unix.AF_INET6 {
		f.local = ip
		f.prefix = netip.PrefixFrom(ip, int(q.prefixLen))
	} else if q.address.IsValid() {
		f.prefix = netip.PrefixFrom(q.address, int(q.prefixLen))
	}
	return k.delAddr(f, o)
}

func (k *Kernel) dumpAddrs(s *socket, m netlink.Message) *kerr {
	q, ke := decodeAddr(m.Data)
	families := []uint8{unix.AF_INET, unix.AF_INET6}
	if ke == nil && (q.family == unix.AF_INET || q.family == unix.AF_INET6) {
		families = []uint8{q.family}
	}
	filtered := ke == nil && q.index != 0
	ke = func() *kerr {
		pfx := familyPrefix(families[0])
		if ke != nil {
			return fail(unix.EINVAL, pfx+"Invalid header for address dump request")
		}
		if q.prefixLen != 0 || q.flags != 0 || q.scope != 0 {
			return fail(unix.EINVAL, pfx+"Invalid values in header for address dump request")
		}
		if len(q.attrs) > 0 {
			return fail(unix.EINVAL, pfx+"Unsupported attribute in dump request")
		}
		if _, ok := k.links[q.index]; q.index != 0 && !ok {
			return fail(unix.ENODEV, "")
		}
		return nil
	}()
	if ke != nil {
		k.dumpDone(s, m, ke, filtered, false)
		return ke
	}
	var bodies [][]byte
	for _, fam := range families {
		for _, a := range k.sortedAddrs(fam, q.index) {
			bodies = append(bodies, addrBody(a))
		}
	}
	k.dumpReply(s, m, unix.RTM_NEWADDR, bodies, filtered)
	return nil
}

// Routes.

func (k *Kernel) reqRoute(m netlink.Message, o *origin, add bool) *kerr {
	q, ke := decodeRoute(m.Data)
	if ke != nil {
		return ke
	}
	fam := q.msg.Family
	if fam != unix.AF_INET && fam != unix.AF_INET6 {
		return fail(unix.EOPNOTSUPP, "")
	}
	if ke := checkAttrs("route", q.attrs, unix.RTA_DST, unix.RTA_OIF, unix.RTA_GATEWAY, unix.RTA_PRIORITY,
		unix.RTA_PREFSRC, unix.RTA_METRICS, unix.RTA_TABLE, unix.RTA_PREF); ke != nil {
		return ke
	}
	if q.msg.SrcLength != 0 {
		return fail(unix.EOPNOTSUPP, "netwatchtest: source-specific routes are not modelled")
	}
	if fam == unix.AF_INET6 && q.msg.Tos != 0 {
		if k.behavior.IPv6RouteTOSRefused {
			return fail(unix.EINVAL, "Invalid dsfield (tos): option not available for IPv6")
		}
		q.route.TOS = 0 // ignored, as 5.10 does
	}
	if q.msg.Flags&(unix.RTNH_F_DEAD|unix.RTNH_F_LINKDOWN) != 0 {
		return fail(unix.EINVAL, "Invalid rtm_flags - can not contain DEAD or LINKDOWN")
	}
	r := q.route
	if add {
		return k.newRoute(r, q.metrics, m.Header.Flags, o)
	}
	return k.delRoute(routeFilter{
		family: fam, table: r.Table, dst: r.Dst, tos: r.TOS, metric: r.Metric, typ: r.Type,
		scope: r.Scope, prefSrc: r.PrefSrc, protocol: r.Protocol, index: r.Index, gateway: r.Gateway, metrics: q.metrics,
	}, o)
}

func (k *Kernel) dumpRoutes(s *socket, m netlink.Message) *kerr {
	q, ke := decodeRoute(m.Data)
	var families []uint8
	switch q.msg.Family {
	case unix.AF_INET, unix.AF_INET6:
		families = []uint8{q.msg.Family}
	case familyIPMR, familyIP6MR:
		// Multicast routes: none.
	default:
		families = []uint8{unix.AF_INET, unix.AF_INET6}
	}
	table := uint32(q.msg.Table)
	if q.msg.Attributes.Table != 0 {
		table = q.msg.Attributes.Table
	}
	oif := q.msg.Attributes.OutIface
	// The kernel marks every strict route dump filtered, even one that
	// names no filter.
	const filtered = true
	ke = func() *kerr {
		if ke != nil {
			return fail(unix.EINVAL, "Invalid header for FIB dump request")
		}
		if q.msg.DstLength != 0 || q.msg.SrcLength != 0 || q.msg.Tos != 0 || q.msg.Scope != 0 {
			return fail(unix.EINVAL, "Invalid values in header for FIB dump request")
		}
		if q.msg.Flags&^(unix.RTM_F_CLONED|unix.RTM_F_PREFIX) != 0 {
			return fail(unix.EINVAL, "Invalid flags for FIB dump request")
		}
		for t := range q.attrs {
			if t != unix.RTA_TABLE && t != unix.RTA_OIF {
				return fail(unix.EINVAL, "Unsupported attribute in dump request")
			}
		}
		if _, ok := k.links[oif]; oif != 0 && !ok {
			return fail(unix.ENODEV, "")
		}
		if len(families) == 1 && table != 0 && !k.tableExists(families[0], table) {
			return fail(unix.ENOENT, familyPrefix(families[0])+"FIB table does not exist")
		}
		return nil
	}()
	if ke != nil {
		k.dumpDone(s, m, ke, filtered, false)
		return ke
	}
	var bodies [][]byte
	if q.msg.Flags&unix.RTM_F_CLONED == 0 {
		for _, fam := range families {
			for _, r := range k.sortedRoutes(fam) {
				if table != 0 && r.Table != table || q.msg.Protocol != 0 && r.Protocol != q.msg.Protocol ||
					q.msg.Type != 0 && r.Type != q.msg.Type || oif != 0 && r.Index != oif {
					continue
				}
				bodies = append(bodies, routeBody(r))
			}
		}
	}
	k.dumpReply(s, m, unix.RTM_NEWROUTE, bodies, filtered)
	return nil
}

// getRoute answers a route lookup ("ip route get").
func (k *Kernel) getRoute(s *socket, m netlink.Message) *kerr {
	q, ke := decodeRoute(m.Data)
	if ke != nil {
		return ke
	}
	fam, hdr := q.msg.Family, q.msg
	full := 32
	switch fam {
	case unix.AF_INET:
	case unix.AF_INET6:
		full = 128
	default:
		return fail(unix.EOPNOTSUPP, "")
	}
	pfx := familyPrefix(fam)
	if hdr.DstLength != 0 && int(hdr.DstLength) != full || hdr.SrcLength != 0 && int(hdr.SrcLength) != full ||
		hdr.Table != 0 || hdr.Protocol != 0 || hdr.Scope != 0 || hdr.Type != 0 {
		if fam == unix.AF_INET {
			return fail(unix.EINVAL, pfx+"Invalid values in header for route get request")
		}
		return fail(unix.EINVAL, pfx+"Invalid values in header for get route request")
	}
	if fam == unix.AF_INET && hdr.Flags&^(unix.RTM_F_NOTIFY|unix.RTM_F_LOOKUP_TABLE|unix.RTM_F_FIB_MATCH) != 0 {
		return fail(unix.EINVAL, pfx+"Unsupported rtm_flags for route get request")
	}
	if fam == unix.AF_INET6 && hdr.Flags&^unix.RTM_F_FIB_MATCH != 0 {
		return fail(unix.EINVAL, pfx+"Invalid flags for get route request")
	}
	for t := range q.attrs {
		switch t {
		case unix.RTA_DST, unix.RTA_MARK, unix.RTA_UID:
		case unix.RTA_SRC, unix.RTA_IIF, unix.RTA_OIF, unix.RTA_IP_PROTO, unix.RTA_SPORT, unix.RTA_DPORT, rtaFlowLabel:
			return notModelled("route get", t)
		default:
			if fam == unix.AF_INET {
				return fail(unix.EINVAL, pfx+"Unsupported attribute in route get request")
			}
			return fail(unix.EINVAL, pfx+"Unsupported attribute in get route request")
		}
	}
	dst, mark := q.route.Dst.Addr(), hdr.Attributes.Mark
	r, ke := k.lookup(fam, dst, zeroAddr(fam), "", mark, hdr.Tos)
	if ke != nil {
		return ke
	}
	table := r.Table
	if fam == unix.AF_INET && hdr.Flags&unix.RTM_F_LOOKUP_TABLE == 0 {
		table = unix.RT_TABLE_MAIN
	}
	var rm rtnetlink.RouteMessage
	var extra []byte
	if hdr.Flags&unix.RTM_F_FIB_MATCH != 0 {
		rm = routeMessage(r)
		rm.Table, rm.Attributes.Table = headerTable(table), table
		extra = metricsAttr(r)
	} else {
		rm = rtnetlink.RouteMessage{
			Family: fam, DstLength: uint8(full), Tos: hdr.Tos, Table: headerTable(table), Type: r.Type,
			Attributes: rtnetlink.RouteAttributes{
				Table: table, Dst: ipOf(dst), OutIface: r.Index, Gateway: ipOf(r.Gateway), Src: ipOf(r.PrefSrc),
			},
		}
		extra = metricsAttr(r)
		if fam == unix.AF_INET {
			rm.Flags = unix.RTM_F_CLONED
			rm.Attributes.Mark = mark
			if !r.PrefSrc.IsValid() {
				rm.Attributes.Src = ipOf(k.sourceFor(unix.AF_INET, r.Index))
			}
			extra = append(extra, encodeAttrs(func(ae *netlink.AttributeEncoder) { ae.Uint32(unix.RTA_UID, 0) })...)
		} else {
			rm.SrcLength, rm.Protocol = 128, r.Protocol
			if !r.PrefSrc.IsValid() {
				rm.Attributes.Src = ipOf(k.sourceFor(unix.AF_INET6, r.Index))
			}
			rm.Attributes.Priority = r.Metric
			pref := uint8(0)
			rm.Attributes.Pref = &pref
			extra = append(extra, encodeAttrs(func(ae *netlink.AttributeEncoder) { ae.Bytes(unix.RTA_SRC, make([]byte, 16)) })...)
		}
	}
	body := append(mustMarshal(&rm), extra...)
	h := netlink.Header{Type: unix.RTM_NEWROUTE, Sequence: m.Header.Sequence, PID: s.port}
	s.enqueue(marshal(h, body), false)
	return nil
}

// sourceFor picks the source address of a lookup, roughly as the kernel
// does: the output link's first primary address of global scope, else any
// such address.
func (k *Kernel) sourceFor(family uint8, index uint32) netip.Addr {
	var other netip.Addr
	for _, a := range k.sortedAddrs(family, 0) {
		if a.Flags&unix.IFA_F_SECONDARY != 0 || a.Scope != unix.RT_SCOPE_UNIVERSE {
			continue
		}
		if a.Index == index {
			return a.Prefix.Addr()
		}
		if !other.IsValid() {
			other = a.Prefix.Addr()
		}
	}
	return other
}

// lookup is the FIB lookup of a packet from src (the zero address for a
// locally generated one without a source) that came in by iif ("" for a
// locally generated packet, which the rules see as iif lo): the rules in
// order (selectors: mark, from, to, tos, iif; "not" inverts), then the
// longest matching prefix of the rule's table.
func (k *Kernel) lookup(fam uint8, dst, src netip.Addr, iif string, mark uint32, tos uint8) (Route, *kerr) {
	if iif == "" {
		iif = "lo"
	}
	for _, rule := range k.rules[fam] {
		match := (rule.Mark^mark)&rule.Mask == 0 &&
			(!rule.Src.IsValid() || rule.Src.Contains(src)) &&
			(!rule.Dst.IsValid() || rule.Dst.Contains(dst)) &&
			(rule.TOS == 0 || rule.TOS == tos) &&
			(rule.IIF == "" || rule.IIF == iif) && rule.OIF == ""
		if match == rule.Invert {
			continue
		}
		switch rule.Action {
		case unix.FR_ACT_BLACKHOLE:
			return Route{}, fail(unix.EINVAL, "")
		case unix.FR_ACT_UNREACHABLE:
			return Route{}, fail(unix.ENETUNREACH, "")
		case unix.FR_ACT_PROHIBIT:
			return Route{}, fail(unix.EACCES, "")
		}
		r, ok := k.lookupTable(fam, rule.Table, dst, tos)
		if !ok {
			continue
		}
		switch r.Type {
		case unix.RTN_BLACKHOLE:
			return Route{}, fail(unix.EINVAL, "")
		case unix.RTN_UNREACHABLE:
			return Route{}, fail(unix.EHOSTUNREACH, "")
		case unix.RTN_PROHIBIT:
			return Route{}, fail(unix.EACCES, "")
		case unix.RTN_THROW:
			continue
		}
		return r, nil
	}
	return Route{}, fail(unix.ENETUNREACH, "")
}

// Lookup is the route lookup of `ip route get DST [from SRC] [iif IIF]
// [mark MARK]` through the rules, as lookup does it; src may be the zero
// Addr; without iif it must be the host's. The kernel's further checks of
// a forwarded packet (forwarding enabled, the source's reverse path) are
// not modelled.
func (k *Kernel) Lookup(dst, src netip.Addr, iif string, mark uint32) (Route, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	fam := familyOf(dst)
	if !src.IsValid() {
		src = zeroAddr(fam)
	}
	if iif == "" && !src.IsUnspecified() && !k.addrAssigned(src) {
		// A locally generated packet's source must be one of the host's.
		return Route{}, fail(unix.ENETUNREACH, "").err("route get " + dst.String())
	}
	if iif != "" {
		if _, ok := k.linkByName(iif); !ok {
			return Route{}, fail(unix.ENODEV, "").err("route get " + dst.String())
		}
	}
	r, ke := k.lookup(fam, dst, src, iif, mark, 0)
	if ke != nil {
		return Route{}, ke.err("route get " + dst.String())
	}
	return r, nil
}

func (k *Kernel) lookupTable(fam uint8, table uint32, dst netip.Addr, tos uint8) (Route, bool) {
	var best Route
	found := false
	for key, r := range k.routes {
		if key.family != fam || key.table != table || !r.Dst.Contains(dst) || r.TOS != 0 && r.TOS != tos {
			continue
		}
		if !found || r.Dst.Bits() > best.Dst.Bits() ||
			r.Dst.Bits() == best.Dst.Bits() && (r.TOS > best.TOS || r.TOS == best.TOS && r.Metric < best.Metric) {
			best, found = r, true
		}
	}
	return best, found
}

// Rules.

func (k *Kernel) reqRule(m netlink.Message, o *origin, add bool) *kerr {
	if len(m.Data) >= 1 && m.Data[0] != unix.AF_INET && m.Data[0] != unix.AF_INET6 {
		if k.behavior.MulticastRules && (m.Data[0] == familyIPMR || m.Data[0] == familyIP6MR) {
			return fail(unix.EOPNOTSUPP, "netwatchtest: multicast routing rules are not modelled")
		}
		return fail(unix.EAFNOSUPPORT, "Rule family not supported")
	}
	q, types, ke := decodeRule(m.Data)
	if ke != nil {
		return ke
	}
	if ke := checkAttrs("rule", types, unix.FRA_DST, unix.FRA_SRC, unix.FRA_IIFNAME, unix.FRA_PRIORITY,
		unix.FRA_FWMARK, unix.FRA_SUPPRESS_IFGROUP, unix.FRA_SUPPRESS_PREFIXLEN, unix.FRA_TABLE,
		unix.FRA_FWMASK, unix.FRA_OIFNAME, unix.FRA_PROTOCOL); ke != nil {
		return ke
	}
	if add {
		return k.newRule(q, m.Header.Flags, o)
	}
	return k.delRule(q, o)
}

func (k *Kernel) dumpRules(s *socket, m netlink.Message) *kerr {
	var family uint8
	ke := func() *kerr {
		d := m.Data
		if len(d) < 12 {
			return fail(unix.EINVAL, "Invalid header for fib rule dump request")
		}
		family = d[0]
		if slices.ContainsFunc(d[1:12], func(b byte) bool { return b != 0 }) {
			return fail(unix.EINVAL, "Invalid values in header for fib rule dump request")
		}
		if len(d) > 12 {
			return fail(unix.EINVAL, "Invalid data after header in fib rule dump request")
		}
		switch family {
		case unix.AF_UNSPEC, unix.AF_INET, unix.AF_INET6:
			return nil
		case familyIPMR, familyIP6MR:
			if k.behavior.MulticastRules {
				return nil
			}
		}
		return fail(unix.EAFNOSUPPORT, "")
	}()
	if ke != nil {
		k.dumpDone(s, m, ke, false, false)
		return ke
	}
	var mroute []Rule
	if k.behavior.MulticastRules {
		mroute = mrouteRules
	}
	all := slices.Concat(k.rules[unix.AF_INET], mroute, k.rules[unix.AF_INET6])
	var bodies [][]byte
	for _, r := range all {
		if family == unix.AF_UNSPEC || r.Family == family {
			bodies = append(bodies, ruleBody(k.reportedRule(r)))
		}
	}
	k.dumpReply(s, m, unix.RTM_NEWRULE, bodies, false)
	return nil
}
