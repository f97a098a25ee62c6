package mtupolicy

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/marksplit/marksplit/netwatch"
	"github.com/marksplit/marksplit/netwatch/reconcile"
)

// DefaultProtocol is the rtm_protocol and FRA_PROTOCOL value stamped on
// the routes and rules the policy installs: 109 (0x6d, "m"). It is free
// in every list that hands out these numbers: the kernel's RTPROT_* values
// (0–4, 8–18, 42, 84 OVN, 99 Open/R, 186–189, 192), iproute2's rt_protos,
// FRR's private values (186–198) and Calico's 80; Cilium installs with
// "kernel" (2). Values 0, 1 and 3 mean something to the kernel itself (3,
// boot, is also what a plain `ip route add` leaves); "kernel" is accepted
// for coexistence with systemd-networkd, which leaves it alone. With a value of its own,
// `ip route show table all proto 109` and `ip rule show proto 109` list
// exactly what marksplit installed.
const DefaultProtocol netwatch.Protocol = 109

// Config says what to split and how.
type Config struct {
	// TunnelLink is the encrypting link (Cilium's WireGuard device). Its
	// live MTU is the table routes' MTU; while it is missing, nothing is
	// split.
	TunnelLink string
	// Mark and Mask select the packets that keep the main table's routes
	// (the encrypting link's own UDP): the rule is
	// "not fwmark Mark/Mask lookup Table".
	Mark, Mask netwatch.Mark
	// Table is the routing table the policy owns, in both families.
	Table netwatch.Table
	// Priority is the rule priority the policy owns, in both families. The
	// rule there goes before every rule with a higher number: for the
	// split destinations, other rules between it and the main table's
	// 32766 are passed over. Cilium's rules are all below 1000.
	Priority uint32
	// Protocol is stamped on everything the policy installs.
	Protocol netwatch.Protocol
	// Prefixes select the main-table routes whose destination equals or
	// lies inside one of them. They must be masked (10.0.0.0/16, not
	// 10.0.0.5/16).
	Prefixes []netip.Prefix
	// UnderlayLink selects the main-table routes out of this link.
	UnderlayLink string
	// Peers selects host routes to the encrypting peers' addresses, which
	// the caller passes to DesiredPeers, instead of main-table routes:
	// neither Prefixes nor UnderlayLink may be set with it (peers.go).
	Peers bool
	// Mesh selects each peer's allowed IPs of a WireGuard device (the
	// tunnel link), which the caller passes to DesiredMesh: neither Peers,
	// Prefixes nor UnderlayLink may be set with it (mesh.go).
	Mesh bool
	// Repair takes the explicit MTU off a selected main-table route whose
	// MTU equals the tunnel MTU (lowered by the old approach), so that it
	// follows its link's MTU again.
	Repair bool
}

// DefaultConfig returns the defaults: cilium_wg0, 0xe00/0xf00, table 900,
// priority 900, DefaultProtocol, repair on. It selects nothing: add
// Prefixes or an UnderlayLink, or set Peers.
func DefaultConfig() Config {
	return Config{
		TunnelLink: "cilium_wg0",
		Mark:       0xe00,
		Mask:       0xf00,
		Table:      900,
		Priority:   900,
		Protocol:   DefaultProtocol,
		Repair:     true,
	}
}

// Validate reports the first problem with c, in one line.
func (c Config) Validate() error {
	err := c.validate()
	if err != nil {
		return fmt.Errorf("mtupolicy: %w", err)
	}
	return nil
}

func (c Config) validate() error {
	switch {
	case c.TunnelLink == "":
		return errors.New("no tunnel link")
	case c.UnderlayLink != "" && c.UnderlayLink == c.TunnelLink:
		return fmt.Errorf("underlay link %q is the tunnel link", c.UnderlayLink)
	}
	// The values the agent, the examples and this package share one check
	// each: reconcile's.
	for _, err := range []error{
		reconcile.LinkName(c.TunnelLink).Check(),
		reconcile.OwnTable(c.Table).Check(),
		reconcile.OwnPriority(c.Priority).Check(),
		reconcile.MarkMask{Mark: c.Mark, Mask: c.Mask}.Check(),
		reconcile.OwnProtocol(c.Protocol).Check(),
	} {
		if err != nil {
			return err
		}
	}
	if c.UnderlayLink != "" {
		if err := reconcile.LinkName(c.UnderlayLink).Check(); err != nil {
			return err
		}
	}
	switch {
	case c.Mesh && (c.Peers || len(c.Prefixes) > 0 || c.UnderlayLink != ""):
		return errors.New("the WireGuard device's peers select the table's routes themselves: no peers, prefixes or underlay link with them")
	case c.Peers && (len(c.Prefixes) > 0 || c.UnderlayLink != ""):
		return errors.New("peers select the table's routes themselves: no prefixes or underlay link with them")
	case !c.Peers && !c.Mesh && len(c.Prefixes) == 0 && c.UnderlayLink == "":
		return errors.New("nothing selected: give at least one prefix or an underlay link, or the peers")
	}
	for _, p := range c.Prefixes {
		switch {
		case !p.IsValid():
			return fmt.Errorf("prefix %v is not valid", p)
		case p.Addr().Is4In6():
			return fmt.Errorf("prefix %v: write the IPv4 form", p)
		case p != p.Masked():
			return fmt.Errorf("prefix %v has host bits set: did you mean %v?", p, p.Masked())
		}
	}
	return nil
}
