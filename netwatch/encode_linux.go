//go:build linux

package netwatch

import (
	"encoding/binary"
	"net/netip"

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

// encodeRoute writes r as an rtmsg with attributes. For a delete, scope
// RT_SCOPE_NOWHERE is the kernel's wildcard; the caller sets it.
func encodeRoute(r Route) ([]byte, error) {
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

	ae := netlink.NewAttributeEncoder()
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
	if r.MTU != 0 {
		ae.Nested(unix.RTA_METRICS, func(ne *netlink.AttributeEncoder) error {
			ne.Uint32(unix.RTAX_MTU, r.MTU)
			return nil
		})
	}
	if r.NHID != 0 {
		ae.Uint32(rtaNHID, r.NHID)
	}
	if r.NextHops != nil {
		ae.Bytes(unix.RTA_MULTIPATH, encodeMultipath(r.Family, r.NextHops))
	}
	attrs, err := ae.Encode()
	if err != nil {
		return nil, err
	}
	return append(b, attrs...), nil
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
		attrs, _ := ae.Encode()
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
// that is set, so that a delete names the rule completely.
func encodeRule(r Rule) ([]byte, error) {
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
		binary.NativeEndian.PutUint32(b[8:12], fibRuleInvert)
	}
	ae := netlink.NewAttributeEncoder()
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
		ae.Uint32(fraFlow, r.Flow)
	}
	if r.TunID != 0 {
		ae.Bytes(fraTunID, binary.BigEndian.AppendUint64(nil, r.TunID))
	}
	if r.SuppressIfGroup.Set {
		ae.Uint32(fraSuppressIfg, uint32(r.SuppressIfGroup.Value))
	}
	if r.SuppressPrefixLen.Set {
		ae.Uint32(fraSuppressLen, uint32(r.SuppressPrefixLen.Value))
	}
	if r.L3MDev != 0 {
		ae.Uint8(fraL3MDev, r.L3MDev)
	}
	if r.UID.Set {
		v := binary.NativeEndian.AppendUint32(nil, r.UID.Start)
		ae.Bytes(fraUIDRange, binary.NativeEndian.AppendUint32(v, r.UID.End))
	}
	if r.Protocol != 0 {
		ae.Uint8(fraProtocol, uint8(r.Protocol))
	}
	if r.IPProto != 0 {
		ae.Uint8(fraIPProto, r.IPProto)
	}
	for _, p := range []struct {
		typ uint16
		pr  PortRange
	}{{fraSPortRange, r.SPort}, {fraDPortRange, r.DPort}} {
		if p.pr != (PortRange{}) {
			v := binary.NativeEndian.AppendUint16(nil, p.pr.Start)
			ae.Bytes(p.typ, binary.NativeEndian.AppendUint16(v, p.pr.End))
		}
	}
	attrs, err := ae.Encode()
	if err != nil {
		return nil, err
	}
	return append(b, attrs...), nil
}
