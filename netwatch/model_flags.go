package netwatch

import (
	"strconv"
)

// RouteFlags are rtm_flags and rtnh_flags (RTNH_F_*) bits.
type RouteFlags uint32

// Route flags the kernel reports.
const (
	RouteDead       RouteFlags = 0x1  // RTNH_F_DEAD
	routePervasive  RouteFlags = 0x2  // RTNH_F_PERVASIVE
	RouteOnlink     RouteFlags = 0x4  // RTNH_F_ONLINK
	routeOffload    RouteFlags = 0x8  // RTNH_F_OFFLOAD
	RouteLinkdown   RouteFlags = 0x10 // RTNH_F_LINKDOWN
	routeUnresolved RouteFlags = 0x20 // RTNH_F_UNRESOLVED
	routeTrap       RouteFlags = 0x40 // RTNH_F_TRAP
)

// LinkFlags are a link's IFF_* bits (linux/if.h); every bit the kernel
// reports is kept, named or not. Test them as net.Interface's flags are
// tested: l.Flags&LinkUp != 0 (administratively up), l.Flags&LinkLowerUp != 0
// (carrier).
type LinkFlags uint32

// Link flags a policy asks about.
const (
	LinkUp           LinkFlags = 0x1     // IFF_UP
	linkBroadcast    LinkFlags = 0x2     // IFF_BROADCAST
	LinkLoopback     LinkFlags = 0x8     // IFF_LOOPBACK
	linkPointToPoint LinkFlags = 0x10    // IFF_POINTOPOINT
	linkNoARP        LinkFlags = 0x80    // IFF_NOARP
	linkMulticast    LinkFlags = 0x1000  // IFF_MULTICAST
	LinkLowerUp      LinkFlags = 0x10000 // IFF_LOWER_UP
	linkDormant      LinkFlags = 0x20000 // IFF_DORMANT
)

// String names the flags as `ip link` does ("UP,LOWER_UP"), bits without
// a name as hex.
func (f LinkFlags) String() string { return bitNames(uint32(f), linkFlagNames) }

var linkFlagNames = []flagName{
	{0x1, "UP"}, {0x2, "BROADCAST"}, {0x4, "DEBUG"},
	{0x8, "LOOPBACK"}, {0x10, "POINTOPOINT"}, {0x20, "NOTRAILERS"},
	{0x40, "RUNNING"}, {0x80, "NOARP"}, {0x100, "PROMISC"},
	{0x200, "ALLMULTI"}, {0x400, "MASTER"}, {0x800, "SLAVE"},
	{0x1000, "MULTICAST"}, {0x2000, "PORTSEL"}, {0x4000, "AUTOMEDIA"},
	{0x8000, "DYNAMIC"}, {0x10000, "LOWER_UP"}, {0x20000, "DORMANT"},
	{0x40000, "ECHO"},
}

type flagName struct {
	bit  uint32
	name string
}

func bitNames(v uint32, names []flagName) string {
	var s []byte
	for _, n := range names {
		if v&n.bit != 0 {
			if len(s) > 0 {
				s = append(s, ',')
			}
			s = append(s, n.name...)
			v &^= n.bit
		}
	}
	if v != 0 || len(s) == 0 {
		if len(s) > 0 {
			s = append(s, ',')
		}
		s = append(s, "0x"...)
		s = strconv.AppendUint(s, uint64(v), 16)
	}
	return string(s)
}

// AddrFlags are an address's IFA_F_* bits (linux/if_addr.h); every bit the
// kernel reports is kept, named or not.
type AddrFlags uint32

// Address flags a policy asks about.
const (
	// AddrSecondary is a secondary IPv4 address (another one of the same
	// subnet came first); in IPv6 the same bit is IFA_F_TEMPORARY, a
	// privacy address.
	AddrSecondary  AddrFlags = 0x1  // IFA_F_SECONDARY
	addrNoDAD      AddrFlags = 0x2  // IFA_F_NODAD
	addrOptimistic AddrFlags = 0x4  // IFA_F_OPTIMISTIC
	addrDADFailed  AddrFlags = 0x8  // IFA_F_DADFAILED
	addrDeprecated AddrFlags = 0x20 // IFA_F_DEPRECATED
	AddrTentative  AddrFlags = 0x40 // IFA_F_TENTATIVE
	addrPermanent  AddrFlags = 0x80 // IFA_F_PERMANENT
	// addrNoPrefixRoute: the kernel added no route for the subnet.
	addrNoPrefixRoute AddrFlags = 0x200 // IFA_F_NOPREFIXROUTE
)

// String names the flags as `ip address` does ("secondary,permanent"), bits
// without a name as hex.
func (f AddrFlags) String() string { return bitNames(uint32(f), addrFlagNames) }

var addrFlagNames = []flagName{
	{0x1, "secondary"}, {0x2, "nodad"}, {0x4, "optimistic"},
	{0x8, "dadfailed"}, {0x10, "home"}, {0x20, "deprecated"},
	{0x40, "tentative"}, {0x80, "permanent"},
	{0x100, "mngtmpaddr"}, {0x200, "noprefixroute"},
	{0x400, "autojoin"}, {0x800, "stable-privacy"},
}
