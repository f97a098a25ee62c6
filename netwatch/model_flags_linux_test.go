//go:build linux

package netwatch

import (
	"testing"

	"golang.org/x/sys/unix"
)

// TestFlagValues: the portable constants are the kernel's bits.
func TestFlagValues(t *testing.T) {
	links := map[LinkFlags]int{
		LinkUp: unix.IFF_UP, linkBroadcast: unix.IFF_BROADCAST, LinkLoopback: unix.IFF_LOOPBACK,
		linkPointToPoint: unix.IFF_POINTOPOINT, linkNoARP: unix.IFF_NOARP, linkMulticast: unix.IFF_MULTICAST,
		LinkLowerUp: unix.IFF_LOWER_UP, linkDormant: unix.IFF_DORMANT,
	}
	for got, want := range links {
		if int(got) != want {
			t.Errorf("link flag %v = %#x, want %#x", got, uint32(got), want)
		}
	}
	addrs := map[AddrFlags]int{
		AddrSecondary: unix.IFA_F_SECONDARY, addrNoDAD: unix.IFA_F_NODAD, addrOptimistic: unix.IFA_F_OPTIMISTIC,
		addrDADFailed: unix.IFA_F_DADFAILED, addrDeprecated: unix.IFA_F_DEPRECATED, AddrTentative: unix.IFA_F_TENTATIVE,
		addrPermanent: unix.IFA_F_PERMANENT, addrNoPrefixRoute: unix.IFA_F_NOPREFIXROUTE,
	}
	for got, want := range addrs {
		if int(got) != want {
			t.Errorf("address flag %v = %#x, want %#x", got, uint32(got), want)
		}
	}
	// Every named bit of the String tables too.
	for _, n := range linkFlagNames {
		if n.name == "LOWER_UP" && n.bit != unix.IFF_LOWER_UP || n.name == "ECHO" && n.bit != unix.IFF_ECHO {
			t.Errorf("link flag name %s has bit %#x", n.name, n.bit)
		}
	}
}

func TestFlagStrings(t *testing.T) {
	for _, tc := range []struct {
		got, want string
	}{
		{(LinkUp | LinkLowerUp | linkMulticast | unix.IFF_RUNNING).String(), "UP,RUNNING,MULTICAST,LOWER_UP"},
		{LinkFlags(0).String(), "0x0"},
		{(LinkUp | 0x80000000).String(), "UP,0x80000000"},
		{(AddrSecondary | addrPermanent).String(), "secondary,permanent"},
		{AddrFlags(unix.IFA_F_STABLE_PRIVACY | unix.IFA_F_NOPREFIXROUTE).String(), "noprefixroute,stable-privacy"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}

func TestAddrUsable(t *testing.T) {
	for _, tc := range []struct {
		flags AddrFlags
		want  bool
	}{
		{0, true},
		{addrPermanent, true},
		{AddrSecondary, true},
		{AddrTentative, false},
		{AddrTentative | addrOptimistic, true},
		{addrDADFailed | AddrTentative, false},
		{addrDeprecated, false},
	} {
		if got := (Addr{Flags: tc.flags}).usable(); got != tc.want {
			t.Errorf("Addr{Flags: %v}.usable() = %v, want %v", tc.flags, got, tc.want)
		}
	}
}
