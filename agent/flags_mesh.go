package main

import (
	"flag"

	"github.com/marksplit/marksplit/internal/wgpeers"
	"github.com/marksplit/marksplit/netwatch/reconcile"
)

// meshFlags defines --wireguard-link and --wireguard-poll on fs.
func meshFlags(fs *flag.FlagSet, o *options) {
	fs.Var((*reconcile.LinkName)(&o.wireguardLink), "wireguard-link", "WireGuard `link` of a mesh without Cilium (e.g. wg0): each peer's allowed IPs through it at the peer's inner MTU, read from the device; goes alone")
	o.wireguardPoll = wgpeers.DefaultInterval
	fs.DurationVar(&o.wireguardPoll, "wireguard-poll", wgpeers.DefaultInterval, "`interval` between reads of the --wireguard-link device (the kernel announces no peer change): at least 100ms")
}

// checkMesh checks the flags that go with --wireguard-link (set names the
// flags given) and turns the mode on in o.policy: the device names the
// tunnel link and the mark, and selects the routes itself. Without Cilium
// there is no CiliumNode to read: --encryption=auto means on (while the
// device exists; without it nothing is split).
func checkMesh(o *options, set map[string]bool) error {
	if o.wireguardLink == "" {
		if set["wireguard-poll"] {
			return usageErrorf("--wireguard-poll goes with --wireguard-link")
		}
		return nil
	}
	for _, f := range []string{"peers", "prefix", "underlay-link", "tunnel-link", "mark"} {
		if set[f] {
			return usageErrorf("--wireguard-link reads what to split, the link and the mark from the WireGuard device: give it without --%s (and without --peers, --prefix, --underlay-link, --tunnel-link and --mark)", f)
		}
	}
	if o.wireguardPoll < wgpeers.MinInterval {
		return usageErrorf("--wireguard-poll %v: at least %v", o.wireguardPoll, wgpeers.MinInterval)
	}
	if o.cmd == cmdVerify {
		return usageErrorf("verify does not know the --wireguard-link device's fwmark yet: ask the kernel with ip route get ADDR mark FWMARK")
	}
	o.policy.Mesh = true
	o.policy.TunnelLink = o.wireguardLink
	o.policy.Repair = false
	if o.encryption == encAuto {
		o.encryption = encOn
	}
	return nil
}
