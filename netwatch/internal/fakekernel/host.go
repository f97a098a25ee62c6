//go:build linux

package fakekernel

import (
	"net/netip"

	"golang.org/x/sys/unix"
)

// NewHost returns a kernel set up as a small node running the mark-split,
// the host that the tests of netwatch and of netwatch/reconcile share
// (netwatchtest's Kernel is this Kernel under another name): eth0 (MTU 1450,
// 10.0.0.5/16 and fd00::5/64) and cilium_wg0 (MTU 1355), a route in main,
// copies in table 900 at the tunnel MTU, and the rules "not fwmark
// 0xe00/0xf00 lookup 900" of both families at priority 900. It returns
// eth0's index.
func NewHost() (*Kernel, uint32, error) {
	k := New()
	eth := k.AddLink("eth0", "veth", 1450, true)
	k.AddLink("cilium_wg0", "tun", 1355, true)
	gw4, gw6 := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("fd00::1")
	for _, err := range []error{
		k.AddAddr(eth, netip.MustParsePrefix("10.0.0.5/16")),
		k.AddAddr(eth, netip.MustParsePrefix("fd00::5/64")),
		k.AddRoute(Route{Dst: netip.MustParsePrefix("10.1.0.0/16"), Gateway: gw4, Index: eth}),
		k.AddRoute(Route{Table: 900, Dst: netip.MustParsePrefix("10.0.0.0/16"), Gateway: gw4,
			Index: eth, PrefSrc: netip.MustParseAddr("10.0.0.5"), MTU: 1355, Protocol: 77}),
		k.AddRoute(Route{Table: 900, Dst: netip.MustParsePrefix("fd01::/64"), Gateway: gw6, Index: eth, MTU: 1355}),
		k.AddRule(Rule{Family: unix.AF_INET, Priority: 900, Table: 900, Invert: true, Mark: 0xe00, Mask: 0xf00, Protocol: 77}),
		k.AddRule(Rule{Family: unix.AF_INET6, Priority: 900, Table: 900, Invert: true, Mark: 0xe00, Mask: 0xf00, Protocol: 77}),
	} {
		if err != nil {
			k.Close()
			return nil, 0, err
		}
	}
	return k, eth, nil
}
