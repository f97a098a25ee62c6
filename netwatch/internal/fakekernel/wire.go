//go:build linux

package fakekernel

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/jsimonetti/rtnetlink/v2"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// marshal encodes one netlink message, padded to 4 bytes.
func marshal(h netlink.Header, body []byte) []byte {
	b := make([]byte, align(16+len(body)))
	binary.NativeEndian.PutUint32(b[0:], uint32(16+len(body)))
	binary.NativeEndian.PutUint16(b[4:], uint16(h.Type))
	binary.NativeEndian.PutUint16(b[6:], uint16(h.Flags))
	binary.NativeEndian.PutUint32(b[8:], h.Sequence)
	binary.NativeEndian.PutUint32(b[12:], h.PID)
	copy(b[16:], body)
	return b
}

func mustMarshal(m interface{ MarshalBinary() ([]byte, error) }) []byte {
	b, err := m.MarshalBinary()
	if err != nil {
		panic(fmt.Sprintf("netwatchtest: encode %T: %v", m, err))
	}
	return b
}

func encodeAttrs(fn func(ae *netlink.AttributeEncoder)) []byte {
	ae := netlink.NewAttributeEncoder()
	fn(ae)
	b, err := ae.Encode()
	if err != nil {
		panic(fmt.Sprintf("netwatchtest: encode attributes: %v", err))
	}
	return b
}

func ipOf(a netip.Addr) net.IP {
	if !a.IsValid() {
		return nil
	}
	return net.IP(a.AsSlice())
}

func addrOf(ip net.IP, family uint8) (netip.Addr, bool) {
	if ip == nil {
		return netip.Addr{}, true
	}
	a, ok := netip.AddrFromSlice(ip)
	if !ok || familyOf(a) != family || a.Is4In6() {
		return netip.Addr{}, false
	}
	return a, true
}

func zeroAddr(family uint8) netip.Addr {
	if family == unix.AF_INET {
		return netip.IPv4Unspecified()
	}
	return netip.IPv6Unspecified()
}

// headerTable is the table as the 8-bit header field reports it.
func headerTable(t uint32) uint8 {
	if t > 255 {
		return unix.RT_TABLE_COMPAT
	}
	return uint8(t)
}

func arphrd(l Link) uint16 {
	switch {
	case l.Flags&unix.IFF_LOOPBACK != 0:
		return unix.ARPHRD_LOOPBACK
	case l.Kind == "tun":
		return unix.ARPHRD_NONE
	}
	return unix.ARPHRD_ETHER
}

// linkBody encodes a reported link as the kernel's RTM_NEWLINK body.
func linkBody(l Link) []byte {
	attrs := &rtnetlink.LinkAttributes{
		Name:             l.Name,
		MTU:              l.MTU,
		OperationalState: rtnetlink.OperationalState(l.OperState),
	}
	switch arphrd(l) {
	case unix.ARPHRD_LOOPBACK:
		attrs.Address = make(net.HardwareAddr, 6)
		attrs.Broadcast = make(net.HardwareAddr, 6)
	case unix.ARPHRD_ETHER:
		attrs.Address = net.HardwareAddr{0x02, 0, 0, 0, byte(l.Index >> 8), byte(l.Index)}
		attrs.Broadcast = net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	}
	if l.Kind != "" {
		attrs.Info = &rtnetlink.LinkInfo{Kind: l.Kind}
	}
	m := rtnetlink.LinkMessage{Type: arphrd(l), Index: l.Index, Flags: l.Flags, Attributes: attrs}
	b := mustMarshal(&m)
	// What rtnetlink does not encode: IFLA_OPERSTATE when it is unknown
	// (0), and a few attributes every kernel link carries.
	return append(b, encodeAttrs(func(ae *netlink.AttributeEncoder) {
		if l.OperState == operUnknown {
			ae.Uint8(unix.IFLA_OPERSTATE, 0)
		}
		ae.Uint8(unix.IFLA_LINKMODE, 0)
		ae.Uint32(unix.IFLA_TXQLEN, 1000)
		carrier := uint8(0)
		if l.Up {
			carrier = 1
		}
		ae.Uint8(unix.IFLA_CARRIER, carrier)
	})...)
}

// addrBody encodes an address as the kernel's RTM_NEWADDR body. It is
// encoded by hand: rtnetlink's AddressMessage adds an IFA_UNSPEC attribute
// that the kernel never sends.
func addrBody(a Addr) []byte {
	fam := familyOf(a.Prefix.Addr())
	b := make([]byte, unix.SizeofIfAddrmsg)
	b[0] = fam
	b[1] = uint8(a.Prefix.Bits())
	b[2] = uint8(a.Flags)
	b[3] = a.Scope
	binary.NativeEndian.PutUint32(b[4:], a.Index)
	ip := a.Prefix.Addr().AsSlice()
	return append(b, encodeAttrs(func(ae *netlink.AttributeEncoder) {
		ae.Bytes(unix.IFA_ADDRESS, ip)
		if fam == unix.AF_INET {
			ae.Bytes(unix.IFA_LOCAL, ip)
			ae.String(unix.IFA_LABEL, a.Label)
		}
		ae.Uint32(unix.IFA_FLAGS, a.Flags)
		ci := make([]byte, 16) // ifa_cacheinfo: forever, forever, 0, 0
		binary.NativeEndian.PutUint32(ci[0:], 0xffffffff)
		binary.NativeEndian.PutUint32(ci[4:], 0xffffffff)
		ae.Bytes(unix.IFA_CACHEINFO, ci)
	})...)
}

// routeMessage is a route as the kernel reports it in dumps and events.
func routeMessage(r Route) rtnetlink.RouteMessage {
	m := rtnetlink.RouteMessage{
		Family:    r.Family(),
		DstLength: uint8(r.Dst.Bits()),
		Tos:       r.TOS,
		Table:     headerTable(r.Table),
		Protocol:  r.Protocol,
		Scope:     r.Scope,
		Type:      r.Type,
		Attributes: rtnetlink.RouteAttributes{
			Table:    r.Table,
			Priority: r.Metric,
			OutIface: r.Index,
			Gateway:  ipOf(r.Gateway),
			Src:      ipOf(r.PrefSrc),
		},
	}
	if r.Dst.Bits() > 0 {
		m.Attributes.Dst = ipOf(r.Dst.Addr())
	}
	if m.Family == unix.AF_INET6 {
		pref := uint8(0) // ICMPV6_ROUTER_PREF_MEDIUM
		m.Attributes.Pref = &pref
	}
	return m
}

// routeBody is a route as the kernel reports it in dumps and events.
func routeBody(r Route) []byte {
	m := routeMessage(r)
	return append(mustMarshal(&m), metricsAttr(r)...)
}

// metricsAttr is r's RTA_METRICS as the kernel reports it
// (rtnetlink_put_metrics): every metric that is not 0, by type, the
// congestion control by name; nothing when there are none.
func metricsAttr(r Route) []byte {
	if r.MTU == 0 && r.Metrics == (Metrics{}) {
		return nil
	}
	return encodeAttrs(func(ae *netlink.AttributeEncoder) {
		ae.Nested(unix.RTA_METRICS, func(nae *netlink.AttributeEncoder) error {
			for typ := uint16(1); typ <= unix.RTAX_MAX; typ++ {
				switch v := r.metric(typ); {
				case typ == unix.RTAX_CC_ALGO:
					if r.Metrics.CongCtl != "" {
						nae.String(typ, r.Metrics.CongCtl)
					}
				case v != 0:
					nae.Uint32(typ, v)
				}
			}
			return nil
		})
	})
}

// metricAttr is one attribute of a request's RTA_METRICS, as sent.
type metricAttr struct {
	typ uint16
	val []byte
}

// metricAttrs is r's MTU and metrics as a request sends them.
func metricAttrs(r Route) []metricAttr {
	var mx []metricAttr
	for typ := uint16(1); typ <= unix.RTAX_MAX; typ++ {
		switch v := r.metric(typ); {
		case typ == unix.RTAX_CC_ALGO:
			if r.Metrics.CongCtl != "" {
				mx = append(mx, metricAttr{typ, append([]byte(r.Metrics.CongCtl), 0)})
			}
		case v != 0:
			mx = append(mx, metricAttr{typ, binary.NativeEndian.AppendUint32(nil, v)})
		}
	}
	return mx
}

// rtaxFeatureMask is RTAX_FEATURE_MASK: ECN, SACK, TIMESTAMP, ALLFRAG and
// TCP_USEC_TS.
const rtaxFeatureMask = 0x1f

// congCtl is the name in an RTAX_CC_ALGO attribute, and whether the fake
// knows it (reno and cubic, which every kernel has built in).
func congCtl(val []byte) (string, bool) {
	name, _, _ := strings.Cut(string(val), "\x00")
	return name, name == "reno" || name == "cubic"
}

// convertMetrics is the kernel's ip_metrics_convert: a new route's MTU
// and other metrics from its request's RTA_METRICS. It clamps the MTU,
// the advertised MSS and the hop limit as the kernel does.
func convertMetrics(mx []metricAttr) (mtu uint32, m Metrics, ke *kerr) {
	for _, a := range mx {
		switch {
		case a.typ == 0:
			continue
		case a.typ > unix.RTAX_MAX:
			return 0, Metrics{}, fail(unix.EINVAL, "Invalid metric type")
		case a.typ == unix.RTAX_CC_ALGO:
			name, ok := congCtl(a.val)
			if !ok {
				return 0, Metrics{}, fail(unix.EOPNOTSUPP, fmt.Sprintf("netwatchtest: congestion control %q is not modelled (reno and cubic are)", name))
			}
			m.CongCtl = name
			continue
		case len(a.val) != 4:
			return 0, Metrics{}, fail(unix.EINVAL, "Invalid attribute in metrics")
		}
		v := binary.NativeEndian.Uint32(a.val)
		switch a.typ {
		case unix.RTAX_ADVMSS:
			v = min(v, 65535-40)
		case unix.RTAX_MTU:
			v = min(v, 65535-15)
		case unix.RTAX_HOPLIMIT:
			v = min(v, 255)
		case unix.RTAX_FEATURES:
			if v&^rtaxFeatureMask != 0 {
				return 0, Metrics{}, fail(unix.EINVAL, "Unknown flag set in feature mask in metrics attribute")
			}
		}
		if a.typ == unix.RTAX_MTU {
			mtu = v
		} else {
			m.Values[a.typ] = v
		}
	}
	return mtu, m, nil
}

// metricsMatch is the kernel's fib_metrics_match, an IPv4 delete's test:
// whether r has every metric mx names, with its value as given (not
// clamped).
func metricsMatch(r Route, mx []metricAttr) bool {
	for _, a := range mx {
		switch {
		case a.typ == 0:
			continue
		case a.typ > unix.RTAX_MAX:
			return false
		case a.typ == unix.RTAX_CC_ALGO:
			name, ok := congCtl(a.val)
			if !ok {
				name = ""
			}
			if name != r.Metrics.CongCtl {
				return false
			}
			continue
		}
		var v uint32
		if len(a.val) >= 4 {
			v = binary.NativeEndian.Uint32(a.val)
		}
		if r.metric(a.typ) != v {
			return false
		}
	}
	return true
}

func ruleBody(rr reportRule) []byte {
	r := rr.Rule
	suppress := uint32(0xffffffff)
	m := rtnetlink.RuleMessage{
		Family:    r.Family,
		DstLength: uint8(max(r.Dst.Bits(), 0)),
		SrcLength: uint8(max(r.Src.Bits(), 0)),
		TOS:       r.TOS,
		Table:     headerTable(r.Table),
		Action:    r.Action,
		Flags:     rr.flags,
		Attributes: &rtnetlink.RuleAttributes{
			Table:             &r.Table,
			SuppressPrefixLen: &suppress,
			Protocol:          &r.Protocol,
		},
	}
	a := m.Attributes
	if r.Priority != 0 {
		a.Priority = &r.Priority
	}
	if r.Mark != 0 {
		a.FwMark = &r.Mark
	}
	if r.Mark != 0 || r.Mask != 0 {
		a.FwMask = &r.Mask
	}
	if r.Src.Bits() > 0 {
		ip := ipOf(r.Src.Addr())
		a.Src = &ip
	}
	if r.Dst.Bits() > 0 {
		ip := ipOf(r.Dst.Addr())
		a.Dst = &ip
	}
	if r.IIF != "" {
		a.IIFName = &r.IIF
	}
	if r.OIF != "" {
		a.OIFName = &r.OIF
	}
	return mustMarshal(&m)
}

// Decoding requests.

// attrTypes lists the attribute types in b (flags masked off).
func attrTypes(b []byte) (map[uint16]bool, error) {
	types := map[uint16]bool{}
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return nil, err
	}
	for ad.Next() {
		types[ad.Type()] = true
	}
	return types, ad.Err()
}

// notModelled refuses a request that uses what the fake does not model.
func notModelled(what string, typ uint16) *kerr {
	return fail(unix.EOPNOTSUPP, fmt.Sprintf("netwatchtest: %s attribute %d is not modelled", what, typ))
}

func checkAttrs(what string, types map[uint16]bool, allowed ...uint16) *kerr {
	for t := range types {
		ok := false
		for _, a := range allowed {
			ok = ok || t == a
		}
		if !ok {
			return notModelled(what, t)
		}
	}
	return nil
}

type linkReq struct {
	msg   rtnetlink.LinkMessage
	attrs map[uint16]bool
	name  string
	mtu   uint32
	kind  string
}

func decodeLink(data []byte) (linkReq, *kerr) {
	var q linkReq
	if len(data) < unix.SizeofIfInfomsg {
		return q, fail(unix.EINVAL, "")
	}
	types, err := attrTypes(data[unix.SizeofIfInfomsg:])
	if err != nil {
		return q, fail(unix.EINVAL, "")
	}
	if err := q.msg.UnmarshalBinary(data); err != nil {
		return q, fail(unix.EINVAL, "")
	}
	q.attrs = types
	if a := q.msg.Attributes; a != nil {
		q.name, q.mtu = a.Name, a.MTU
		if a.Info != nil {
			q.kind = a.Info.Kind
		}
	}
	return q, nil
}

func (q linkReq) object() Link {
	l := Link{Index: q.msg.Index, Name: q.name, Kind: q.kind, MTU: q.mtu}
	l.Up = q.msg.Flags&unix.IFF_UP != 0 && (q.msg.Change == 0 || q.msg.Change&unix.IFF_UP != 0)
	return l
}

type addrReq struct {
	family    uint8
	prefixLen uint8
	flags     uint32
	scope     uint8
	index     uint32
	attrs     map[uint16]bool
	address   netip.Addr // IFA_ADDRESS
	local     netip.Addr // IFA_LOCAL
	label     string
}

func decodeAddr(data []byte) (addrReq, *kerr) {
	var q addrReq
	if len(data) < unix.SizeofIfAddrmsg {
		return q, fail(unix.EINVAL, "")
	}
	q.family, q.prefixLen, q.flags, q.scope = data[0], data[1], uint32(data[2]), data[3]
	q.index = binary.NativeEndian.Uint32(data[4:])
	ad, err := netlink.NewAttributeDecoder(data[unix.SizeofIfAddrmsg:])
	if err != nil {
		return q, fail(unix.EINVAL, "")
	}
	q.attrs = map[uint16]bool{}
	for ad.Next() {
		q.attrs[ad.Type()] = true
		switch ad.Type() {
		case unix.IFA_ADDRESS, unix.IFA_LOCAL:
			a, ok := netip.AddrFromSlice(ad.Bytes())
			if !ok {
				return q, fail(unix.EINVAL, "")
			}
			if ad.Type() == unix.IFA_ADDRESS {
				q.address = a
			} else {
				q.local = a
			}
		case unix.IFA_LABEL:
			q.label = ad.String()
		case unix.IFA_FLAGS:
			q.flags = ad.Uint32()
		}
	}
	if ad.Err() != nil {
		return q, fail(unix.EINVAL, "")
	}
	return q, nil
}

func (q addrReq) object() Addr {
	a := q.local
	if !a.IsValid() {
		a = q.address
	}
	var p netip.Prefix
	if a.IsValid() {
		p = netip.PrefixFrom(a, int(q.prefixLen))
	}
	return Addr{Index: q.index, Prefix: p, Scope: q.scope, Flags: q.flags, Label: q.label}
}

type routeReq struct {
	msg     rtnetlink.RouteMessage
	attrs   map[uint16]bool
	route   Route        // MTU and Metrics not set: see metrics
	metrics []metricAttr // RTA_METRICS as sent
}

// withoutAttr is the message data, whose attributes begin at off, without
// the attributes of type typ.
func withoutAttr(data []byte, off int, typ uint16) []byte {
	out := append([]byte(nil), data[:off]...)
	for b := data[off:]; len(b) >= 4; {
		n := int(binary.NativeEndian.Uint16(b))
		if n < 4 || n > len(b) {
			return append(out, b...) // malformed: the decoder says so
		}
		step := min(align(n), len(b))
		if binary.NativeEndian.Uint16(b[2:])&^(unix.NLA_F_NESTED|unix.NLA_F_NET_BYTEORDER) != typ {
			out = append(out, b[:step]...)
		}
		b = b[step:]
	}
	return out
}

// requestMetrics lists the attributes of the RTA_METRICS in attrs.
func requestMetrics(attrs []byte) ([]metricAttr, bool) {
	ad, err := netlink.NewAttributeDecoder(attrs)
	if err != nil {
		return nil, false
	}
	var mx []metricAttr
	for ad.Next() {
		if ad.Type() != unix.RTA_METRICS {
			continue
		}
		nad, err := netlink.NewAttributeDecoder(ad.Bytes())
		if err != nil {
			return nil, false
		}
		for nad.Next() {
			mx = append(mx, metricAttr{nad.Type(), nad.Bytes()})
		}
		if nad.Err() != nil {
			return nil, false
		}
	}
	return mx, ad.Err() == nil
}

func decodeRoute(data []byte) (routeReq, *kerr) {
	var q routeReq
	if len(data) < unix.SizeofRtMsg {
		return q, fail(unix.EINVAL, "")
	}
	types, err := attrTypes(data[unix.SizeofRtMsg:])
	if err != nil {
		return q, fail(unix.EINVAL, "")
	}
	mx, ok := requestMetrics(data[unix.SizeofRtMsg:])
	if !ok {
		return q, fail(unix.EINVAL, "")
	}
	// RTA_METRICS is read here (rtnetlink's RouteMetrics knows five
	// metrics and fails on a malformed one, which the kernel reports
	// as such).
	if err := q.msg.UnmarshalBinary(withoutAttr(data, unix.SizeofRtMsg, unix.RTA_METRICS)); err != nil {
		return q, fail(unix.EINVAL, "")
	}
	q.attrs, q.metrics = types, mx
	m := q.msg
	if m.Family != unix.AF_INET && m.Family != unix.AF_INET6 {
		return q, nil
	}
	r := Route{Table: uint32(m.Table), TOS: m.Tos, Protocol: m.Protocol, Scope: m.Scope, Type: m.Type,
		Metric: m.Attributes.Priority, Index: m.Attributes.OutIface}
	if m.Attributes.Table != 0 {
		r.Table = m.Attributes.Table
	}
	dst, ok := addrOf(m.Attributes.Dst, m.Family)
	if !ok {
		return q, fail(unix.EINVAL, "")
	}
	if !dst.IsValid() {
		dst = zeroAddr(m.Family)
	}
	if int(m.DstLength) > dst.BitLen() {
		return q, fail(unix.EINVAL, "Invalid prefix length")
	}
	r.Dst = netip.PrefixFrom(dst, int(m.DstLength))
	if r.Gateway, ok = addrOf(m.Attributes.Gateway, m.Family); !ok {
		return q, fail(unix.EINVAL, "")
	}
	if r.PrefSrc, ok = addrOf(m.Attributes.Src, m.Family); !ok {
		return q, fail(unix.EINVAL, "")
	}
	q.route = r
	return q, nil
}

func decodeRule(data []byte) (ruleReq, map[uint16]bool, *kerr) {
	var q ruleReq
	if len(data) < 12 {
		return q, nil, fail(unix.EINVAL, "")
	}
	types, err := attrTypes(data[12:])
	if err != nil {
		return q, nil, fail(unix.EINVAL, "")
	}
	var m rtnetlink.RuleMessage
	if err := m.UnmarshalBinary(data); err != nil {
		// An attribute rtnetlink does not know (newer than
		// FRA_DPORT_RANGE): the fake does not model it either.
		return q, types, notModelled("rule", 0)
	}
	q.Family, q.TOS, q.Table, q.Action = m.Family, m.TOS, uint32(m.Table), m.Action
	q.Invert = m.Flags&unix.FIB_RULE_INVERT != 0
	if a := m.Attributes; a != nil {
		if a.Table != nil {
			q.Table = *a.Table
		}
		if a.Priority != nil {
			q.Priority, q.hasPrio = *a.Priority, true
		}
		if a.FwMark != nil {
			q.Mark = *a.FwMark
		}
		if a.FwMask != nil {
			q.Mask = *a.FwMask
		}
		if a.Protocol != nil {
			q.Protocol = *a.Protocol
		}
		if a.IIFName != nil {
			q.IIF = *a.IIFName
		}
		if a.OIFName != nil {
			q.OIF = *a.OIFName
		}
		for _, sel := range []struct {
			ip  *net.IP
			len uint8
			p   *netip.Prefix
		}{{a.Src, m.SrcLength, &q.Src}, {a.Dst, m.DstLength, &q.Dst}} {
			if sel.ip == nil {
				continue
			}
			ip, ok := addrOf(*sel.ip, m.Family)
			if !ok || int(sel.len) > ip.BitLen() {
				return q, types, fail(unix.EINVAL, "")
			}
			*sel.p = netip.PrefixFrom(ip, int(sel.len))
		}
	}
	if a := m.Attributes; a != nil {
		if a.SuppressPrefixLen != nil && *a.SuppressPrefixLen != 0xffffffff {
			return q, types, notModelled("rule", unix.FRA_SUPPRESS_PREFIXLEN)
		}
		if a.SuppressIFGroup != nil && *a.SuppressIFGroup != 0xffffffff {
			return q, types, notModelled("rule", unix.FRA_SUPPRESS_IFGROUP)
		}
	}
	if m.Flags&^unix.FIB_RULE_INVERT != 0 {
		return q, types, fail(unix.EOPNOTSUPP, fmt.Sprintf("netwatchtest: rule flags %#x are not modelled", m.Flags))
	}
	return q, types, nil
}
