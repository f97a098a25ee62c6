//go:build linux

package netwatch

import (
	"encoding/binary"
	"net/netip"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// The encoders are the decoders' mirror image: what they write, decode reads
// back unchanged (FuzzRouteRoundTrip, FuzzRuleRoundTrip).

func afOf(f Family) uint8 {
	if f == IPv6 {
		return unix.AF_INET6
	}
	return unix.AF_INET
}

// encodeRoute writes r as an rtmsg with attributes: every attribute it
// has, so that a replace installs the route whole. For a delete, scope
// RT_SCOPE_NOWHERE is the kernel's wildcard; the caller sets it.
func encodeRoute(r Route) ([]byte, error) {
	b := encodeRtmsg(r)
	ae := netlink.NewAttributeEncoder()
	putRouteAttrs(ae, r)
	attrs, err := ae.Encode()
	if err != nil {
		return nil, err
	}
	return append(append(b, attrs...), r.Attrs...), nil
}

// encodeRtmsg writes the rtmsg header of r. A table of 256 or more has
// RT_TABLE_COMPAT there and its number in RTA_TABLE alone.
func encodeRtmsg(r Route) []byte {
	b := make([]byte, unix.SizeofRtMsg)
	b[0] = afOf(r.Family)
	b[1] = uint8(r.Dst.Bits())
	if r.Src.IsValid() {
		b[2] = uint8(r.Src.Bits())
	}
	b[3] = r.TOS
	if r.Table < 256 {
		b[4] = uint8(r.Table)
	} else {
		b[4] = unix.RT_TABLE_COMPAT
	}
	b[5] = uint8(r.Protocol)
	b[6] = uint8(r.Scope)
	b[7] = uint8(r.Type)
	binary.NativeEndian.PutUint32(b[8:12], uint32(r.Flags))
	return b
}

// putRouteAttrs writes an attribute for each field of r that is set, and
// RTA_TABLE always; r.Attrs, kept as sent, are encodeRoute's to append
// after them.
func putRouteAttrs(ae *netlink.AttributeEncoder, r Route) {
	ae.Uint32(unix.RTA_TABLE, uint32(r.Table))
	if r.Dst.Bits() > 0 || r.Dst.Addr().IsValid() && !r.Dst.Addr().IsUnspecified() {
		ae.Bytes(unix.RTA_DST, r.Dst.Addr().AsSlice())
	}
	if r.Src.IsValid() {
		ae.Bytes(unix.RTA_SRC, r.Src.Addr().AsSlice())
	}
	if r.Index != 0 {
		ae.Uint32(unix.RTA_OIF, r.Index)
	}
	if r.Gateway.IsValid() {
		putGateway(ae, r.Family, r.Gateway)
	}
	if r.Metric != 0 {
		ae.Uint32(unix.RTA_PRIORITY, r.Metric)
	}
	if r.PrefSrc.IsValid() {
		ae.Bytes(unix.RTA_PREFSRC, r.PrefSrc.AsSlice())
	}
	if m := encodeMetrics(r.MTU, r.Metrics); m != nil {
		ae.Bytes(unix.RTA_METRICS|unix.NLA_F_NESTED, m)
	}
	if r.NHID != 0 {
		ae.Uint32(rtaNHID, r.NHID)
	}
	if r.NextHops != nil {
		ae.Bytes(unix.RTA_MULTIPATH, encodeMultipath(r.Family, r.NextHops))
	}
	if r.Flow != 0 {
		ae.Uint32(unix.RTA_FLOW, r.Flow)
	}
	if r.Pref != prefMedium {
		ae.Uint8(unix.RTA_PREF, uint8(r.Pref))
	}
	if !r.Expires.IsZero() {
		ae.Uint32(unix.RTA_EXPIRES, expiresIn(r.Expires))
	}
	putEncap(ae, r.Encap)
}

// expiresIn is the remaining lifetime until t in whole seconds, rounded
// up, at least one: RTA_EXPIRES.
func expiresIn(t time.Time) uint32 {
	d := time.Until(t)
	if d <= time.Second {
		return 1
	}
	return uint32((d + time.Second - 1) / time.Second)
}

func putEncap(ae *netlink.AttributeEncoder, e Encap) {
	if e == (Encap{}) {
		return
	}
	ae.Uint16(unix.RTA_ENCAP_TYPE, e.Type)
	ae.Bytes(unix.RTA_ENCAP|unix.NLA_F_NESTED, []byte(e.Data))
}

// encodeMetrics writes RTA_METRICS' nested attributes, nil for none.
func encodeMetrics(mtu uint32, m Metrics) []byte {
	var b []byte
	put := func(typ uint16, v uint32) {
		if v != 0 {
			b = appendAttr(b, typ, binary.NativeEndian.AppendUint32(nil, v))
		}
	}
	put(unix.RTAX_LOCK, m.Locks)
	put(unix.RTAX_MTU, mtu)
	put(unix.RTAX_WINDOW, m.Window)
	put(unix.RTAX_RTT, m.RTT)
	put(unix.RTAX_RTTVAR, m.RTTVar)
	put(unix.RTAX_SSTHRESH, m.SSThresh)
	put(unix.RTAX_CWND, m.CWnd)
	put(unix.RTAX_ADVMSS, m.AdvMSS)
	put(unix.RTAX_REORDERING, m.Reordering)
	put(unix.RTAX_HOPLIMIT, m.HopLimit)
	put(unix.RTAX_INITCWND, m.InitCWnd)
	put(unix.RTAX_FEATURES, m.Features)
	put(unix.RTAX_RTO_MIN, m.RTOMin)
	put(unix.RTAX_INITRWND, m.InitRWnd)
	put(unix.RTAX_QUICKACK, m.QuickAck)
	if m.CongCtl != "" {
		b = appendAttr(b, unix.RTAX_CC_ALGO, append([]byte(m.CongCtl), 0))
	}
	put(unix.RTAX_FASTOPEN_NO_COOKIE, m.FastOpen)
	return append(b, m.Attrs...)
}

func putGateway(ae *netlink.AttributeEncoder, f Family, gw netip.Addr) {
	if (f == IPv4) == gw.Is4() {
		ae.Bytes(unix.RTA_GATEWAY, gw.AsSlice())
		return
	}
	af := uint16(unix.AF_INET6)
	if gw.Is4() {
		af = unix.AF_INET
	}
	v := binary.NativeEndian.AppendUint16(nil, af)
	ae.Bytes(unix.RTA_VIA, append(v, gw.AsSlice()...))
}

func encodeMultipath(f Family, nhs []NextHop) []byte {
	var b []byte
	for _, nh := range nhs {
		ae := netlink.NewAttributeEncoder()
		if nh.Gateway.IsValid() {
			putGateway(ae, f, nh.Gateway)
		}
		if nh.Flow != 0 {
			ae.Uint32(unix.RTA_FLOW, nh.Flow)
		}
		putEncap(ae, nh.Encap)
		attrs, _ := ae.Encode()
		attrs = append(attrs, nh.Attrs...)
		h := make([]byte, unix.SizeofRtNexthop)
		binary.NativeEndian.PutUint16(h[0:2], uint16(unix.SizeofRtNexthop+len(attrs)))
		h[2] = uint8(nh.Flags)
		w := nh.Weight
		if w == 0 {
			w = 1
		}
		h[3] = uint8(w - 1)
		binary.NativeEndian.PutUint32(h[4:8], nh.Index)
		b = append(b, h...)
		b = append(b, attrs...)
		for len(b)%4 != 0 {
			b = append(b, 0)
		}
	}
	return b
}

// encodeRule writes r as a fib_rule_hdr with attributes: every attribute
// that is set, Attrs included, so that a delete names the rule completely.
// The kernel's State flags are not a request's to set.
func encodeRule(r Rule) ([]byte, error) {
	b := encodeFibRuleHdr(r)
	ae := netlink.NewAttributeEncoder()
	putRuleAttrs(ae, r)
	attrs, err := ae.Encode()
	if err != nil {
		return nil, err
	}
	return append(append(b, attrs...), r.Attrs...), nil
}

// encodeFibRuleHdr writes the fib_rule_hdr of r: of its flags, "not"
// alone. A table of 256 or more has RT_TABLE_COMPAT there and its number
// in FRA_TABLE alone.
func encodeFibRuleHdr(r Rule) []byte {
	b := make([]byte, 12)
	b[0] = afOf(r.Family)
	if r.Dst.IsValid() {
		b[1] = uint8(r.Dst.Bits())
	}
	if r.Src.IsValid() {
		b[2] = uint8(r.Src.Bits())
	}
	b[3] = r.TOS
	if r.Table < 256 {
		b[4] = uint8(r.Table)
	} else {
		b[4] = unix.RT_TABLE_COMPAT
	}
	b[7] = uint8(r.Action)
	if r.Invert {
		binary.NativeEndian.PutUint32(b[8:12], unix.FIB_RULE_INVERT)
	}
	return b
}

// putRuleAttrs writes an attribute for each field of r that is set, and
// FRA_TABLE always; r.Attrs, kept as sent, are encodeRule's to append
// after them.
func putRuleAttrs(ae *netlink.AttributeEncoder, r Rule) {
	ae.Uint32(unix.FRA_TABLE, uint32(r.Table))
	if r.Priority != 0 {
		ae.Uint32(unix.FRA_PRIORITY, r.Priority)
	}
	if r.Dst.IsValid() {
		ae.Bytes(unix.FRA_DST, r.Dst.Addr().AsSlice())
	}
	if r.Src.IsValid() {
		ae.Bytes(unix.FRA_SRC, r.Src.Addr().AsSlice())
	}
	if r.IIF != "" {
		ae.String(unix.FRA_IIFNAME, r.IIF)
	}
	if r.OIF != "" {
		ae.String(unix.FRA_OIFNAME, r.OIF)
	}
	if r.Goto != 0 {
		ae.Uint32(unix.FRA_GOTO, r.Goto)
	}
	if r.Mark != 0 {
		ae.Uint32(unix.FRA_FWMARK, uint32(r.Mark))
	}
	if r.Mask != 0 {
		ae.Uint32(unix.FRA_FWMASK, uint32(r.Mask))
	}
	if r.Flow != 0 {
		ae.Uint32(unix.FRA_FLOW, r.Flow)
	}
	if r.TunID != 0 {
		ae.Bytes(unix.FRA_TUN_ID, binary.BigEndian.AppendUint64(nil, r.TunID))
	}
	if r.SuppressIfGroup.Set {
		ae.Uint32(unix.FRA_SUPPRESS_IFGROUP, uint32(r.SuppressIfGroup.Value))
	}
	if r.SuppressPrefixLen.Set {
		ae.Uint32(unix.FRA_SUPPRESS_PREFIXLEN, uint32(r.SuppressPrefixLen.Value))
	}
	if r.L3MDev != 0 {
		ae.Uint8(unix.FRA_L3MDEV, r.L3MDev)
	}
	if r.UID.Set {
		v := binary.NativeEndian.AppendUint32(nil, r.UID.Start)
		ae.Bytes(unix.FRA_UID_RANGE, binary.NativeEndian.AppendUint32(v, r.UID.End))
	}
	if r.Protocol != 0 {
		ae.Uint8(unix.FRA_PROTOCOL, uint8(r.Protocol))
	}
	if r.IPProto != 0 {
		ae.Uint8(unix.FRA_IP_PROTO, r.IPProto)
	}
	putPortRange(ae, unix.FRA_SPORT_RANGE, r.SPort)
	putPortRange(ae, unix.FRA_DPORT_RANGE, r.DPort)
}

// putPortRange writes a rule's port range attribute of type typ, unless
// pr is zero: the rule has none.
func putPortRange(ae *netlink.AttributeEncoder, typ uint16, pr PortRange) {
	if pr == (PortRange{}) {
		return
	}
	v := binary.NativeEndian.AppendUint16(nil, pr.Start)
	ae.Bytes(typ, binary.NativeEndian.AppendUint16(v, pr.End))
}
