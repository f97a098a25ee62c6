package mtupolicy

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/marksplit/marksplit/netwatch"
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

const maxLinkName = 15 // IFNAMSIZ - 1

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
	case len(c.TunnelLink) > maxLinkName:
		return fmt.Errorf("tunnel link %q: longer than %d bytes", c.TunnelLink, maxLinkName)
	case len(c.UnderlayLink) > maxLinkName:
		return fmt.Errorf("underlay link %q: longer than %d bytes", c.UnderlayLink, maxLinkName)
	case c.UnderlayLink != "" && c.UnderlayLink == c.TunnelLink:
		return fmt.Errorf("underlay link %q is the tunnel link", c.UnderlayLink)
	}
	switch c.Table {
	case netwatch.TableUnspec, netwatch.TableCompat, netwatch.TableDefault, netwatch.TableMain, netwatch.TableLocal:
		// 252 is what rtnetlink headers say for tables above 255.
		return fmt.Errorf("table %d is reserved (0, 252, 253 default, 254 main, 255 local)", uint32(c.Table))
	}
	switch {
	case c.Priority == 0:
		return errors.New("priority 0 belongs to the kernel's local rule")
	case c.Priority >= 32766:
		return fmt.Errorf("priority %d comes after the main table's rule at 32766, so the split could never win: choose one below 32766", c.Priority)
	}
	switch {
	case c.Mask == 0:
		return fmt.Errorf("mask 0 matches every packet: the mark %v would mean nothing", c.Mark)
	case c.Mark == 0:
		return fmt.Errorf("mark 0/%v: the mark must be non-zero", c.Mask)
	case c.Mark&^c.Mask != 0:
		return fmt.Errorf("mask %v does not cover mark %v (bits %v outside it)", c.Mask, c.Mark, c.Mark&^c.Mask)
	}
	// "kernel" (2) is allowed: systemd-networkd never removes routes and
	// rules of that protocol, so it is how the agent coexists with a
	// networkd that manages foreign rules. The others below 4 mean
	// something else to the kernel or to iproute2.
	if c.Protocol < netwatch.ProtoStatic && c.Protocol != netwatch.ProtoKernel {
		return fmt.Errorf("protocol %d means something to the kernel (0 unspec, 1 redirect, 3 boot); use 2 (kernel) or 4–255", c.Protocol)
	}
	switch {
	case c.Peers && (len(c.Prefixes) > 0 || c.UnderlayLink != ""):
		return errors.New("peers select the table's routes themselves: no prefixes or underlay link with them")
	case !c.Peers && len(c.Prefixes) == 0 && c.UnderlayLink == "":
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
