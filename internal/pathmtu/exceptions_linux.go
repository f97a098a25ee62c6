//go:build linux

package pathmtu

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/jsimonetti/rtnetlink/v2"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// An Exception is a PMTU exception: a path MTU the kernel learned from an
// ICMP "fragmentation needed" or "packet too big" message and keeps on the
// route the lookup used (table Table, out of link Index), for packets to
// Dst, for about ten minutes.
type Exception struct {
	Dst     netip.Addr
	Table   uint32
	Index   uint32
	Gateway netip.Addr
	MTU     int
}

// Exceptions reads the PMTU exceptions of the current network namespace:
// a route dump with RTM_F_CLONED under strict checking, which lists only
// exceptions (kernel ≥ 5.3). The kernel announces none of them: dump again
// when /proc/net/snmp's Icmp InDestUnreachs or Icmp6 InPktTooBigs rise.
func Exceptions() ([]Exception, error) {
	c, err := netlink.Dial(unix.NETLINK_ROUTE, nil)
	if err != nil {
		return nil, fmt.Errorf("pathmtu: dial: %w", err)
	}
	defer c.Close()
	if err := c.SetOption(netlink.GetStrictCheck, true); err != nil {
		return nil, fmt.Errorf("pathmtu: strict checking (kernel ≥ 4.20): %w", err)
	}
	var out []Exception
	for _, fam := range []uint8{unix.AF_INET, unix.AF_INET6} {
		req := rtnetlink.RouteMessage{Family: fam, Flags: unix.RTM_F_CLONED}
		b, err := req.MarshalBinary()
		if err != nil {
			return nil, err
		}
		msgs, err := c.Execute(netlink.Message{
			Header: netlink.Header{Type: unix.RTM_GETROUTE, Flags: netlink.Request | netlink.Dump},
			Data:   b,
		})
		if err != nil {
			return nil, fmt.Errorf("pathmtu: dump exceptions: %w", err)
		}
		for _, m := range msgs {
			var rm rtnetlink.RouteMessage
			if err := rm.UnmarshalBinary(m.Data); err != nil {
				return nil, fmt.Errorf("pathmtu: decode: %w", err)
			}
			if rm.Flags&unix.RTM_F_CLONED == 0 || rm.Attributes.Metrics == nil || rm.Attributes.Metrics.MTU == 0 {
				continue // a cached route without a learned MTU (a redirect)
			}
			dst, _ := netip.AddrFromSlice(rm.Attributes.Dst)
			gw, _ := netip.AddrFromSlice(rm.Attributes.Gateway)
			table := rm.Attributes.Table
			if table == 0 {
				table = uint32(rm.Table)
			}
			out = append(out, Exception{Dst: dst.Unmap(), Table: table, Index: rm.Attributes.OutIface,
				Gateway: gw.Unmap(), MTU: int(rm.Attributes.Metrics.MTU)})
		}
	}
	return out, nil
}

// ErrNoDelete is DeleteException's answer for an IPv4 exception: the
// kernel offers no way to delete one alone (RTM_DELROUTE would delete the
// route itself). It expires (net.ipv4.route.mtu_expires, 600 s), and a
// route the agent replaces (a new MTU) starts without exceptions.
var ErrNoDelete = errors.New("pathmtu: the kernel deletes no single IPv4 exception")

// DeleteException deletes the IPv6 exception e: RTM_DELROUTE with
// RTM_F_CLONED, which the kernel turns into RTF_CACHE and so removes the
// exception, never the route (ip6_route_del). "Already gone" is success.
func DeleteException(e Exception) error {
	if !e.Dst.Is6() {
		return ErrNoDelete
	}
	c, err := netlink.Dial(unix.NETLINK_ROUTE, nil)
	if err != nil {
		return fmt.Errorf("pathmtu: dial: %w", err)
	}
	defer c.Close()
	rm := rtnetlink.RouteMessage{Family: unix.AF_INET6, DstLength: 128, Table: unix.RT_TABLE_UNSPEC,
		Flags:      unix.RTM_F_CLONED,
		Attributes: rtnetlink.RouteAttributes{Dst: net.IP(e.Dst.AsSlice()), Table: e.Table, OutIface: e.Index}}
	if e.Gateway.IsValid() {
		rm.Attributes.Gateway = net.IP(e.Gateway.AsSlice())
	}
	b, err := rm.MarshalBinary()
	if err != nil {
		return err
	}
	_, err = c.Execute(netlink.Message{
		Header: netlink.Header{Type: unix.RTM_DELROUTE, Flags: netlink.Request | netlink.Acknowledge},
		Data:   b,
	})
	if errors.Is(err, unix.ESRCH) || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("pathmtu: delete exception %v: %w", e.Dst, err)
	}
	return nil
}
