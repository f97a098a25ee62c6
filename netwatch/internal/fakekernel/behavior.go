//go:build linux

package fakekernel

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/jsimonetti/rtnetlink/v2"
	"github.com/marksplit/marksplit/internal/nstest"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Behavior is what the fake kernel does where real kernels differ by
// version or build configuration. New uses DefaultBehavior; NewWith takes
// one, and ProbeBehavior reads it from the running kernel, so a test that
// compares the fake with the real kernel compares like with like. The
// versions named are those of Debian's kernels the project is tested on
// (docs/design.md, "Kernels").
type Behavior struct {
	// MulticastRules: rule dumps include the default rules of the
	// multicast-routing families 128 and 129 (RTNL_FAMILY_IPMR,
	// RTNL_FAMILY_IP6MR), as kernels built with
	// CONFIG_IP_MROUTE_MULTIPLE_TABLES show them. Without it a rule
	// request of those families fails with EAFNOSUPPORT, as there.
	MulticastRules bool
	// LinkDeleteNamesRequester: the RTM_DELLINK event of a link deleted
	// by a request carries the requester's port and sequence (Debian's
	// 6.1), rather than port 0 (5.10, 6.12, 6.18).
	LinkDeleteNamesRequester bool
	// AddressErrorMessages: a failed address request carries an
	// extended-ack message ("ipv4: Address not found"), as 6.12 and 6.18
	// do; 5.10 and 6.1 send the errno alone.
	AddressErrorMessages bool
	// IPv6PrefSrcEveryLink: removing an IPv6 address takes it off the
	// routes of every link that use it as preferred source (6.12, 6.18);
	// 5.10 and 6.1 take it only off the routes of the address's own link.
	IPv6PrefSrcEveryLink bool
	// IPv6RouteTOSRefused: an IPv6 route request with a TOS (dsfield)
	// fails with EINVAL (6.1 and later); 5.10 adds the route and ignores
	// the TOS.
	IPv6RouteTOSRefused bool
}

// DefaultBehavior is the behaviour of a recent kernel (6.12 and later) as
// the distributions build it, which New follows.
var DefaultBehavior = Behavior{
	MulticastRules:       true,
	AddressErrorMessages: true,
	IPv6PrefSrcEveryLink: true,
	IPv6RouteTOSRefused:  true,
}

// ProbeBehavior asks the running kernel how it behaves where kernels
// differ, in ns, a fresh namespace it changes.
func ProbeBehavior(ns *nstest.NS) (Behavior, error) {
	var b Behavior
	c, err := netlink.Dial(unix.NETLINK_ROUTE, &netlink.Config{NetNS: ns.FD(), Strict: true})
	if err != nil {
		return b, err
	}
	defer c.Close()
	if err := c.SetOption(netlink.ExtendedAcknowledge, true); err != nil {
		return b, err
	}
	do := func(typ uint16, flags netlink.HeaderFlags, body interface{ MarshalBinary() ([]byte, error) }) ([]netlink.Message, error) {
		data, err := body.MarshalBinary()
		if err != nil {
			return nil, err
		}
		return c.Execute(netlink.Message{Header: netlink.Header{Type: netlink.HeaderType(typ), Flags: netlink.Request | flags}, Data: data})
	}
	ack := netlink.Acknowledge

	// The multicast-routing families' default rules, in a rule dump.
	msgs, err := do(unix.RTM_GETRULE, netlink.Dump, &rtnetlink.RuleMessage{})
	if err != nil {
		return b, fmt.Errorf("rule dump: %w", err)
	}
	for _, m := range msgs {
		if len(m.Data) > 0 && (m.Data[0] == familyIPMR || m.Data[0] == familyIP6MR) {
			b.MulticastRules = true
		}
	}

	// The message of a failed address request: delete one lo lacks.
	probeAddr := netip.MustParseAddr("192.0.2.1").AsSlice()
	_, err = do(unix.RTM_DELADDR, ack, &rtnetlink.AddressMessage{Family: unix.AF_INET, PrefixLength: 32, Index: 1,
		Attributes: &rtnetlink.AddressAttributes{Address: probeAddr, Local: probeAddr}})
	var oe *netlink.OpError
	if !errors.As(err, &oe) || !errors.Is(err, unix.EADDRNOTAVAIL) {
		return b, fmt.Errorf("delete a missing address: %v, want EADDRNOTAVAIL", err)
	}
	b.AddressErrorMessages = oe.Message != ""

	// Two veth ends, an IPv6 address on one and a route through the
	// other using it as preferred source; then remove the address.
	if _, err := ns.IP("link", "add", "msprobe0", "type", "veth", "peer", "name", "msprobe1"); err != nil {
		return b, err
	}
	for _, args := range [][]string{
		{"link", "set", "lo", "up"},
		{"link", "set", "msprobe0", "up"},
		{"link", "set", "msprobe1", "up"},
		{"addr", "add", "fd00:5::1/128", "dev", "msprobe0", "nodad"},
		{"route", "add", "fd00:6::/64", "dev", "msprobe1", "src", "fd00:5::1"},
		{"addr", "del", "fd00:5::1/128", "dev", "msprobe0"},
	} {
		if _, err := ns.IP(args...); err != nil {
			return b, err
		}
	}
	out, err := ns.IP("-6", "route", "show", "fd00:6::/64")
	if err != nil {
		return b, err
	}
	b.IPv6PrefSrcEveryLink = !strings.Contains(" "+out+" ", " src ")

	// An IPv6 route with a TOS, through msprobe1.
	out, err = ns.IP("-o", "link", "show", "dev", "msprobe1")
	if err != nil {
		return b, err
	}
	n1, _, _ := strings.Cut(out, ":")
	index1, err := strconv.ParseUint(n1, 10, 32)
	if err != nil {
		return b, fmt.Errorf("ip -o link show: %q", out)
	}
	_, err = do(unix.RTM_NEWROUTE, ack|netlink.Create|netlink.Excl, &rtnetlink.RouteMessage{
		Family: unix.AF_INET6, DstLength: 64, Tos: 4, Table: unix.RT_TABLE_MAIN, Protocol: unix.RTPROT_BOOT,
		Scope: unix.RT_SCOPE_UNIVERSE, Type: unix.RTN_UNICAST,
		Attributes: rtnetlink.RouteAttributes{Dst: netip.MustParseAddr("fd00:7::").AsSlice(), OutIface: uint32(index1)},
	})
	switch {
	case errors.Is(err, unix.EINVAL):
		b.IPv6RouteTOSRefused = true
	case err != nil:
		return b, fmt.Errorf("an IPv6 route with a TOS: %w", err)
	}

	// Who the RTM_DELLINK event of a requested delete names.
	out, err = ns.IP("-o", "link", "show", "dev", "msprobe0")
	if err != nil {
		return b, err
	}
	n, _, _ := strings.Cut(out, ":")
	index, err := strconv.ParseUint(n, 10, 32)
	if err != nil {
		return b, fmt.Errorf("ip -o link show: %q", out)
	}
	sub, err := netlink.Dial(unix.NETLINK_ROUTE, &netlink.Config{NetNS: ns.FD(), Groups: unix.RTMGRP_LINK})
	if err != nil {
		return b, err
	}
	defer sub.Close()
	if _, err := do(unix.RTM_DELLINK, ack, &rtnetlink.LinkMessage{Family: unix.AF_UNSPEC, Index: uint32(index)}); err != nil {
		return b, fmt.Errorf("delete a veth: %w", err)
	}
	if err := sub.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		return b, err
	}
	for {
		msgs, err := sub.Receive()
		if err != nil {
			return b, fmt.Errorf("wait for the link delete event: %w", err)
		}
		for _, m := range msgs {
			if m.Header.Type == unix.RTM_DELLINK && len(m.Data) >= 8 && uint64(binary.NativeEndian.Uint32(m.Data[4:8])) == index {
				b.LinkDeleteNamesRequester = m.Header.PID == c.PID()
				return b, nil
			}
		}
	}
}
