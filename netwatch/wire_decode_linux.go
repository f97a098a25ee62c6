//go:build linux

package netwatch

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// The wire_ files are the edge: rtnetlink bytes become netwatch values in
// them and nowhere else (wire_frame_linux.go splits datagrams into
// messages). The decoders are written by hand because routes are decoded
// a million at a time during a sync of a full table: they allocate nothing
// for a route (see TestDecodeRouteAllocs) and read only what the cache keeps.

// errSkip marks a message that is valid but not cached: another address
// family (multicast routing, MPLS), a cloned route, a table outside the
// filter, a per-protocol link message.
var errSkip = errors.New("netwatch: message not cached")

func addrOf(f Family, b []byte) (netip.Addr, error) {
	switch {
	case f == IPv4 && len(b) == 4:
		return netip.AddrFrom4([4]byte(b)), nil
	case f == IPv6 && len(b) == 16:
		return netip.AddrFrom16([16]byte(b)), nil
	}
	return netip.Addr{}, malformed("%d-byte address in a %v message", len(b), f)
}

func familyOf(af uint8) (Family, bool) {
	switch af {
	case unix.AF_INET:
		return IPv4, true
	case unix.AF_INET6:
		return IPv6, true
	}
	return 0, false
}

// decode turns one rtnetlink message into an event. It returns errSkip for
// messages the cache does not keep, and an error wrapping errMalformed for
// bytes that are not a valid message of their type.
func decode(m netlink.Message, tables tableFilter) (change, error) {
	var ev change
	var err error
	switch m.Header.Type {
	case unix.RTM_NEWLINK, unix.RTM_DELLINK:
		ev.Kind = KindLink
		ev.Link, err = decodeLink(m.Data)
	case unix.RTM_NEWADDR, unix.RTM_DELADDR:
		ev.Kind = KindAddr
		ev.Addr, err = decodeAddr(m.Data)
	case unix.RTM_NEWROUTE, unix.RTM_DELROUTE:
		ev.Kind = KindRoute
		ev.Route, err = decodeRoute(m.Data, tables)
		ev.how = routeHow(m.Header.Flags)
	case unix.RTM_NEWRULE, unix.RTM_DELRULE:
		ev.Kind = KindRule
		ev.Rule, err = decodeRule(m.Data)
	default:
		return ev, errSkip
	}
	switch m.Header.Type {
	case unix.RTM_DELLINK, unix.RTM_DELADDR, unix.RTM_DELROUTE, unix.RTM_DELRULE:
		ev.Deleted = true
	}
	return ev, err
}

// routeHow reads what a route notification's flags say of the change.
func routeHow(f netlink.HeaderFlags) uint8 {
	var how uint8
	if f&netlink.Replace != 0 {
		how |= howReplace
	}
	if f&netlink.Append != 0 {
		how |= howAppend
	}
	if f&netlink.Excl != 0 {
		how |= howExcl
	}
	if f&(netlink.Create|netlink.Excl|netlink.Append|netlink.Replace) == netlink.Create {
		how |= howPrepend
	}
	return how
}

func decodeLink(b []byte) (Link, error) {
	if len(b) < unix.SizeofIfInfomsg {
		return Link{}, malformed("link message of %d bytes", len(b))
	}
	if b[0] != unix.AF_UNSPEC {
		// AF_INET6 and AF_BRIDGE send per-protocol link messages; they
		// are not the link itself.
		return Link{}, errSkip
	}
	l := Link{
		Index: binary.NativeEndian.Uint32(b[4:8]),
		Flags: LinkFlags(binary.NativeEndian.Uint32(b[8:12])),
	}
	if l.Index == 0 {
		return Link{}, malformed("link index 0")
	}
	a := attrs{b: b[unix.SizeofIfInfomsg:]}
	var err error
	for a.next() && err == nil {
		switch a.typ {
		case unix.IFLA_IFNAME:
			l.Name = a.str()
		case unix.IFLA_MTU:
			l.MTU, err = a.u32()
		case unix.IFLA_MASTER:
			l.Master, err = a.u32()
		case unix.IFLA_OPERSTATE:
			var o uint8
			o, err = a.u8()
			l.OperState = OperState(o)
		case unix.IFLA_LINKINFO:
			in := attrs{b: a.val}
			for in.next() {
				if in.typ == unix.IFLA_INFO_KIND {
					l.Kind = in.str()
				}
			}
			err = in.err
		}
	}
	if err == nil {
		err = a.err
	}
	if err == nil && l.Name == "" {
		err = malformed("link %d without a name", l.Index)
	}
	return l, err
}

func decodeAddr(b []byte) (Addr, error) {
	if len(b) < unix.SizeofIfAddrmsg {
		return Addr{}, malformed("address message of %d bytes", len(b))
	}
	f, ok := familyOf(b[0])
	if !ok {
		return Addr{}, errSkip
	}
	bits := int(b[1])
	ad := Addr{Flags: AddrFlags(b[2]), Scope: Scope(b[3]), Index: binary.NativeEndian.Uint32(b[4:8])}
	var local, address netip.Addr
	a := attrs{b: b[unix.SizeofIfAddrmsg:]}
	var err error
	for a.next() && err == nil {
		switch a.typ {
		case unix.IFA_ADDRESS:
			address, err = addrOf(f, a.val)
		case unix.IFA_LOCAL:
			local, err = addrOf(f, a.val)
		case unix.IFA_LABEL:
			ad.Label = a.str()
		case unix.IFA_FLAGS:
			var v uint32
			v, err = a.u32()
			ad.Flags = AddrFlags(v)
		}
	}
	if err == nil {
		err = a.err
	}
	if err != nil {
		return Addr{}, err
	}
	own := local
	if !own.IsValid() {
		own = address
	} else if address.IsValid() && address != local {
		ad.Peer = address
	}
	if !own.IsValid() {
		return Addr{}, malformed("address message without an address")
	}
	if bits > own.BitLen() {
		return Addr{}, malformed("prefix length %d for %v", bits, own)
	}
	ad.Prefix = netip.PrefixFrom(own, bits)
	return ad, nil
}

const (
	rtaNHID   = 30   // RTA_NH_ID
	rtnhFlags = 0xff // the RTNH_F_* bits of rtm_flags
)

func decodeRoute(b []byte, tables tableFilter) (Route, error) {
	if len(b) < unix.SizeofRtMsg {
		return Route{}, malformed("route message of %d bytes", len(b))
	}
	f, ok := familyOf(b[0])
	if !ok {
		return Route{}, errSkip
	}
	flags := binary.NativeEndian.Uint32(b[8:12])
	if flags&unix.RTM_F_CLONED != 0 {
		return Route{}, errSkip
	}
	r := Route{
		Family:   f,
		Table:    Table(b[4]),
		TOS:      b[3],
		Protocol: Protocol(b[5]),
		Scope:    Scope(b[6]),
		Type:     RouteType(b[7]),
		Flags:    RouteFlags(flags & rtnhFlags),
	}
	dstBits, srcBits := int(b[1]), int(b[2])
	if f == IPv4 && srcBits != 0 || f == IPv6 && r.TOS != 0 {
		// The kernel's IPv4 FIB has no source prefixes and IPv6 none of
		// TOS; the cache's compact keys have no room for them either.
		return Route{}, malformed("%v route with source length %d, tos %d", f, srcBits, r.TOS)
	}
	var dst, src netip.Addr
	a := attrs{b: b[unix.SizeofRtMsg:]}
	var err error
	for a.next() && err == nil {
		err = r.decodeAttr(&a, &dst, &src)
	}
	if err == nil {
		err = a.err
	}
	if err != nil {
		return Route{}, err
	}
	if !tables.has(r.Table) {
		return Route{}, errSkip
	}
	if !dst.IsValid() {
		if f == IPv4 {
			dst = netip.IPv4Unspecified()
		} else {
			dst = netip.IPv6Unspecified()
		}
	}
	if dstBits > dst.BitLen() || srcBits > dst.BitLen() {
		return Route{}, malformed("prefix length %d/%d for a %v route", dstBits, srcBits, f)
	}
	r.Dst = netip.PrefixFrom(dst, dstBits).Masked()
	if srcBits > 0 {
		if !src.IsValid() {
			return Route{}, malformed("source prefix length %d without RTA_SRC", srcBits)
		}
		r.Src = netip.PrefixFrom(src, srcBits).Masked()
	}
	return r, nil
}

// decodeAttr decodes one attribute of a route message into r (dst and
// src take RTA_DST and RTA_SRC). What it does not decode it keeps in
// r.Attrs.
func (r *Route) decodeAttr(a *attrs, dst, src *netip.Addr) (err error) {
	f := r.Family
	switch a.typ {
	case unix.RTA_TABLE:
		var t uint32
		t, err = a.u32()
		r.Table = Table(t)
	case unix.RTA_DST:
		*dst, err = addrOf(f, a.val)
	case unix.RTA_SRC:
		*src, err = addrOf(f, a.val)
	case unix.RTA_OIF:
		r.Index, err = a.u32()
	case unix.RTA_GATEWAY:
		r.Gateway, err = addrOf(f, a.val)
	case unix.RTA_VIA:
		r.Gateway, err = decodeVia(a.val)
	case unix.RTA_PRIORITY:
		r.Metric, err = a.u32()
	case unix.RTA_PREFSRC:
		r.PrefSrc, err = addrOf(f, a.val)
	case unix.RTA_METRICS:
		r.MTU, r.Metrics, err = decodeMetrics(a.val)
	case unix.RTA_MULTIPATH:
		r.NextHops, err = decodeMultipath(f, a.val)
	case rtaNHID:
		r.NHID, err = a.u32()
	case unix.RTA_FLOW:
		r.Flow, err = a.u32()
	case unix.RTA_PREF:
		var p uint8
		p, err = a.u8()
		r.Pref = RoutePref(p)
	case unix.RTA_CACHEINFO:
		r.Expires, err = decodeExpires(a.val)
	case unix.RTA_EXPIRES:
		// A request's remaining lifetime in seconds; a report has it in
		// RTA_CACHEINFO.
		var secs uint32
		if secs, err = a.u32(); err == nil && secs != 0 {
			r.Expires = time.Now().Add(time.Duration(secs) * time.Second)
		}
	case unix.RTA_ENCAP_TYPE:
		r.Encap.Type, err = a.u16()
	case unix.RTA_ENCAP:
		r.Encap.Data = string(a.val)
	case unix.RTA_PAD:
	default:
		r.Attrs = a.keep(r.Attrs)
	}
	return err
}

// decodeMetrics decodes RTA_METRICS: the MTU apart, the rest and the locks
// into Metrics, what it does not know into Metrics.Attrs.
func decodeMetrics(b []byte) (mtu uint32, m Metrics, err error) {
	a := attrs{b: b}
	for a.next() && err == nil {
		if a.typ == unix.RTAX_CC_ALGO {
			m.CongCtl = a.str()
			continue
		}
		var p *uint32
		switch a.typ {
		case unix.RTAX_LOCK:
			p = &m.Locks
		case unix.RTAX_MTU:
			p = &mtu
		case unix.RTAX_WINDOW:
			p = &m.Window
		case unix.RTAX_RTT:
			p = &m.RTT
		case unix.RTAX_RTTVAR:
			p = &m.RTTVar
		case unix.RTAX_SSTHRESH:
			p = &m.SSThresh
		case unix.RTAX_CWND:
			p = &m.CWnd
		case unix.RTAX_ADVMSS:
			p = &m.AdvMSS
		case unix.RTAX_REORDERING:
			p = &m.Reordering
		case unix.RTAX_HOPLIMIT:
			p = &m.HopLimit
		case unix.RTAX_INITCWND:
			p = &m.InitCWnd
		case unix.RTAX_FEATURES:
			p = &m.Features
		case unix.RTAX_RTO_MIN:
			p = &m.RTOMin
		case unix.RTAX_INITRWND:
			p = &m.InitRWnd
		case unix.RTAX_QUICKACK:
			p = &m.QuickAck
		case unix.RTAX_FASTOPEN_NO_COOKIE:
			p = &m.FastOpen
		default:
			m.Attrs = a.keep(m.Attrs)
			continue
		}
		*p, err = a.u32()
	}
	if err == nil {
		err = a.err
	}
	return mtu, m, err
}

// decodeExpires reads the remaining lifetime out of RTA_CACHEINFO (struct
// rta_cacheinfo: rta_expires, in clock ticks of USER_HZ, is the third
// field; the others are statistics, which the cache does not keep).
func decodeExpires(b []byte) (time.Time, error) {
	if len(b) < 12 {
		return time.Time{}, malformed("RTA_CACHEINFO of %d bytes", len(b))
	}
	ticks := int32(binary.NativeEndian.Uint32(b[8:12]))
	switch {
	case ticks == 0:
		return time.Time{}, nil
	case ticks < 0:
		return time.Now(), nil // past its lifetime, about to be collected
	}
	return time.Now().Add(time.Duration(ticks) * time.Second / userHZ), nil
}

// userHZ is USER_HZ, the unit of clock_t in netlink messages.
const userHZ = 100

func decodeVia(b []byte) (netip.Addr, error) {
	if len(b) < 2 {
		return netip.Addr{}, malformed("RTA_VIA of %d bytes", len(b))
	}
	switch binary.NativeEndian.Uint16(b[0:2]) {
	case unix.AF_INET:
		return addrOf(IPv4, b[2:])
	case unix.AF_INET6:
		return addrOf(IPv6, b[2:])
	}
	return netip.Addr{}, malformed("RTA_VIA of family %d", binary.NativeEndian.Uint16(b[0:2]))
}

func decodeMultipath(f Family, b []byte) ([]NextHop, error) {
	nhs := []NextHop{}
	for len(b) > 0 {
		if len(b) < unix.SizeofRtNexthop {
			return nil, malformed("truncated rtnexthop")
		}
		l := int(binary.NativeEndian.Uint16(b[0:2]))
		if l < unix.SizeofRtNexthop || l > len(b) {
			return nil, malformed("rtnexthop length %d out of range", l)
		}
		nh := NextHop{
			Flags:  RouteFlags(b[2]),
			Weight: uint16(b[3]) + 1,
			Index:  binary.NativeEndian.Uint32(b[4:8]),
		}
		a := attrs{b: b[unix.SizeofRtNexthop:l]}
		var err error
		for a.next() && err == nil {
			switch a.typ {
			case unix.RTA_GATEWAY:
				nh.Gateway, err = addrOf(f, a.val)
			case unix.RTA_VIA:
				nh.Gateway, err = decodeVia(a.val)
			case unix.RTA_FLOW:
				nh.Flow, err = a.u32()
			case unix.RTA_ENCAP_TYPE:
				nh.Encap.Type, err = a.u16()
			case unix.RTA_ENCAP:
				nh.Encap.Data = string(a.val)
			default:
				nh.Attrs = a.keep(nh.Attrs)
			}
		}
		if err == nil {
			err = a.err
		}
		if err != nil {
			return nil, err
		}
		nhs = append(nhs, nh)
		al := (l + 3) &^ 3
		if al > len(b) {
			al = len(b)
		}
		b = b[al:]
	}
	return nhs, nil
}

func decodeRule(b []byte) (Rule, error) {
	if len(b) < 12 {
		return Rule{}, malformed("rule message of %d bytes", len(b))
	}
	f, ok := familyOf(b[0])
	if !ok {
		return Rule{}, errSkip
	}
	hflags := binary.NativeEndian.Uint32(b[8:12])
	r := Rule{
		Family: f,
		TOS:    b[3],
		Table:  Table(b[4]),
		Action: RuleAction(b[7]),
		Invert: hflags&unix.FIB_RULE_INVERT != 0,
		State:  hflags &^ unix.FIB_RULE_INVERT,
	}
	dstBits, srcBits := int(b[1]), int(b[2])
	var dst, src netip.Addr
	a := attrs{b: b[12:]}
	var err error
	for a.next() && err == nil {
		err = r.decodeAttr(&a, &dst, &src)
	}
	if err == nil {
		err = a.err
	}
	if err != nil {
		return Rule{}, err
	}
	if dstBits > 0 {
		if !dst.IsValid() || dstBits > dst.BitLen() {
			return Rule{}, malformed("rule destination length %d", dstBits)
		}
		r.Dst = netip.PrefixFrom(dst, dstBits).Masked()
	}
	if srcBits > 0 {
		if !src.IsValid() || srcBits > src.BitLen() {
			return Rule{}, malformed("rule source length %d", srcBits)
		}
		r.Src = netip.PrefixFrom(src, srcBits).Masked()
	}
	return r, nil
}

// decodeAttr decodes one attribute of a rule message into r (dst and src
// take FRA_DST and FRA_SRC); what it does not decode it keeps in r.Attrs.
func (r *Rule) decodeAttr(a *attrs, dst, src *netip.Addr) (err error) {
	switch a.typ {
	case unix.FRA_DST:
		*dst, err = addrOf(r.Family, a.val)
	case unix.FRA_SRC:
		*src, err = addrOf(r.Family, a.val)
	case unix.FRA_IIFNAME:
		r.IIF = a.str()
	case unix.FRA_OIFNAME:
		r.OIF = a.str()
	case unix.FRA_GOTO:
		r.Goto, err = a.u32()
	case unix.FRA_PRIORITY:
		r.Priority, err = a.u32()
	case unix.FRA_FWMARK:
		var v uint32
		v, err = a.u32()
		r.Mark = Mark(v)
	case unix.FRA_FWMASK:
		var v uint32
		v, err = a.u32()
		r.Mask = Mark(v)
	case unix.FRA_FLOW:
		r.Flow, err = a.u32()
	case unix.FRA_TUN_ID:
		if len(a.val) != 8 {
			return malformed("FRA_TUN_ID of %d bytes", len(a.val))
		}
		r.TunID = binary.BigEndian.Uint64(a.val)
	case unix.FRA_SUPPRESS_IFGROUP:
		r.SuppressIfGroup, err = a.optional()
	case unix.FRA_SUPPRESS_PREFIXLEN:
		r.SuppressPrefixLen, err = a.optional()
	case unix.FRA_TABLE:
		var v uint32
		v, err = a.u32()
		r.Table = Table(v)
	case unix.FRA_L3MDEV:
		r.L3MDev, err = a.u8()
	case unix.FRA_UID_RANGE:
		if len(a.val) != 8 {
			return malformed("FRA_UID_RANGE of %d bytes", len(a.val))
		}
		r.UID = UIDRange{Set: true, Start: binary.NativeEndian.Uint32(a.val[0:4]), End: binary.NativeEndian.Uint32(a.val[4:8])}
	case unix.FRA_PROTOCOL:
		var v uint8
		v, err = a.u8()
		r.Protocol = Protocol(v)
	case unix.FRA_IP_PROTO:
		r.IPProto, err = a.u8()
	case unix.FRA_SPORT_RANGE, unix.FRA_DPORT_RANGE:
		if len(a.val) != 4 {
			return malformed("port range of %d bytes", len(a.val))
		}
		pr := PortRange{binary.NativeEndian.Uint16(a.val[0:2]), binary.NativeEndian.Uint16(a.val[2:4])}
		if a.typ == unix.FRA_SPORT_RANGE {
			r.SPort = pr
		} else {
			r.DPort = pr
		}
	case unix.FRA_PAD:
	default:
		r.Attrs = a.keep(r.Attrs)
	}
	return err
}

// compactRoute is a dumped route decoded straight into the store's form:
// the fast path of a sync, which skips building a Route. It mirrors
// decodeRoute and reports ok only for the routes that fit the compact form
// and decode without error; anything else — multipath, RTA_VIA, a cloned
// route, a table outside the filter, a malformed message — takes
// decodeRoute's path. FuzzCompactRoute checks that both paths agree.
type compactRoute struct {
	family Family
	table  Table
	k4     key4
	v4     val4
	k6     key6
	v6     val6
}

// decodeCompact decodes a dumped route into c and reports whether it fits
// the compact form; when it does not, c is not the route's and the caller
// takes decodeRoute's path.
func decodeCompact(b []byte, tables tableFilter, c *compactRoute) (ok bool) {
	if len(b) < unix.SizeofRtMsg {
		return false
	}
	f, ok := familyOf(b[0])
	flags := binary.NativeEndian.Uint32(b[8:12])
	dstBits, srcBits, tos := b[1], b[2], b[3]
	if !ok || flags&unix.RTM_F_CLONED != 0 || f == IPv4 && srcBits != 0 || f == IPv6 && tos != 0 {
		return false
	}
	alen := 4
	if f == IPv6 {
		alen = 16
	}
	if int(dstBits) > alen*8 || int(srcBits) > alen*8 {
		return false
	}
	at := compactAttrs{table: Table(b[4])}
	if !at.read(b[unix.SizeofRtMsg:], alen) || !tables.has(at.table) || srcBits > 0 && !at.srcOK {
		return false
	}
	c.family, c.table = f, at.table
	if at.pref != 0 && f == IPv4 {
		// A route preference is an IPv6 route's: val4 has no bits for it.
		return false
	}
	has := at.has()
	proto, scope, typ := b[5], b[6], b[7]
	if f == IPv4 {
		c.k4 = key4{dst: maskAddr4([4]byte(at.dst[:4]), dstBits), bits: dstBits, tos: tos, metric: at.metric}
		c.v4 = val4{gw: [4]byte(at.gw[:4]), psrc: [4]byte(at.psrc[:4]), oif: at.oif, mtu: at.mtu, flags: flags & rtnhFlags, nhid: at.nhid,
			proto: proto, scope: scope, typ: typ, has: has}
		return true
	}
	c.k6 = key6{dst: maskAddr16(at.dst, dstBits), bits: dstBits, metric: at.metric}
	if srcBits > 0 {
		c.k6.src, c.k6.srcBits = maskAddr16(at.src, srcBits), srcBits+1
	}
	c.v6 = val6{gw: at.gw, psrc: at.psrc, oif: at.oif, mtu: at.mtu, flags: flags & rtnhFlags, nhid: at.nhid,
		proto: proto, scope: scope, typ: typ, has: has}
	return true
}

// compactAttrs is what decodeCompact reads from a route's attributes, held
// apart from the compactRoute until the whole message is known to fit.
// Addresses are in the first alen bytes of their arrays.
type compactAttrs struct {
	table                  Table
	dst, src, gw, psrc     [16]byte
	srcOK, gwOK, psrcOK    bool
	oif, metric, mtu, nhid uint32
	pref                   uint8
}

// read reads the attributes b of a route whose addresses are alen bytes
// long. It reports false at the first one the compact form has no room for
// and at malformed bytes: decodeRoute's path then decodes them, or reports
// the error.
func (at *compactAttrs) read(b []byte, alen int) bool {
	// attrs.next's walk, in line: this loop runs for every attribute of
	// every route of a dump, and keeping the cursor in registers halves
	// its cost (BenchmarkDecodeCompact).
	for len(b) > 0 {
		if len(b) < 4 {
			return false
		}
		l := int(binary.NativeEndian.Uint16(b[0:2]))
		if l < 4 || l > len(b) {
			return false
		}
		typ := binary.NativeEndian.Uint16(b[2:4]) & 0x3fff // strip NLA_F_NESTED, NLA_F_NET_BYTEORDER
		v, ok := b[4:l], true
		b = b[min((l+3)&^3, len(b)):]
		switch typ {
		case unix.RTA_TABLE:
			var t uint32
			t, ok = compactU32(v)
			at.table = Table(t)
		case unix.RTA_DST:
			ok = compactAddr(&at.dst, v, alen)
		case unix.RTA_SRC:
			ok = compactAddr(&at.src, v, alen)
			at.srcOK = ok
		case unix.RTA_OIF:
			at.oif, ok = compactU32(v)
		case unix.RTA_GATEWAY:
			ok = compactAddr(&at.gw, v, alen)
			at.gwOK = ok
		case unix.RTA_PRIORITY:
			at.metric, ok = compactU32(v)
		case unix.RTA_PREFSRC:
			ok = compactAddr(&at.psrc, v, alen)
			at.psrcOK = ok
		case unix.RTA_METRICS:
			ok = compactMTU(&at.mtu, v)
		case rtaNHID:
			at.nhid, ok = compactU32(v)
		case unix.RTA_PREF:
			if ok = len(v) == 1 && v[0] <= 3; ok {
				at.pref = v[0]
			}
		case unix.RTA_CACHEINFO:
			// Statistics, and an expiry: a route that expires takes the
			// other path.
			ok = len(v) >= 12 && binary.NativeEndian.Uint32(v[8:12]) == 0
		case unix.RTA_PAD:
		default:
			// Multipath, RTA_VIA, realms, encapsulation, anything else.
			ok = false
		}
		if !ok {
			return false
		}
	}
	return true
}

// has returns the has bits of the route's val4 or val6.
func (at *compactAttrs) has() uint8 {
	var has uint8
	if at.gwOK {
		has |= hasGW
	}
	if at.psrcOK {
		has |= hasPsrc
	}
	return has | at.pref<<prefShift
}

// compactU32 reads a u32 attribute's value v; a value of another length
// does not fit.
func compactU32(v []byte) (uint32, bool) {
	if len(v) != 4 {
		return 0, false
	}
	return binary.NativeEndian.Uint32(v), true
}

// compactAddr copies an address attribute's value v, of alen bytes, into
// to; a value of another length does not fit.
func compactAddr(to *[16]byte, v []byte, alen int) bool {
	if len(v) != alen {
		return false
	}
	copy(to[:], v)
	return true
}

// compactMTU reads RTA_METRICS' value v into *mtu when it holds the MTU
// alone: other metrics and locks take the other path. An RTA_METRICS
// without the MTU leaves *mtu as it was.
func compactMTU(mtu *uint32, v []byte) bool {
	m := attrs{b: v}
	for m.next() {
		if m.typ != unix.RTAX_MTU || len(m.val) != 4 {
			return false
		}
		*mtu = binary.NativeEndian.Uint32(m.val)
	}
	return m.err == nil
}

func maskAddr4(a [4]byte, bits uint8) [4]byte {
	var m [4]byte
	binary.BigEndian.PutUint32(m[:], binary.BigEndian.Uint32(a[:])&^(0xffffffff>>bits))
	return m
}

func maskAddr16(a [16]byte, bits uint8) [16]byte {
	return netip.PrefixFrom(netip.AddrFrom16(a), int(bits)).Masked().Addr().As16()
}
