package wgpeers

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"

	"github.com/marksplit/marksplit/netwatch"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// Key is a peer's public key.
type Key [32]byte

// String is the key in base64, as wg(8) prints it.
func (k Key) String() string { return base64.StdEncoding.EncodeToString(k[:]) }

// Device is what a read of a WireGuard device found. The zero value is a
// device that does not exist.
type Device struct {
	// Exists is false when there is no WireGuard device of that name (no
	// link, a link of another kind, or a userspace one whose socket is not
	// there): then nothing else is set.
	Exists bool
	// FirewallMark is the mark the device puts on its own UDP packets; 0
	// for none.
	FirewallMark netwatch.Mark
	// Peers are sorted by public key.
	Peers []Peer
}

// Peer is one peer of a device.
type Peer struct {
	PublicKey Key
	// Endpoint is where the device sends the peer's packets; the zero
	// value while it knows none.
	Endpoint netip.AddrPort
	// AllowedIPs are masked and sorted (netip.Prefix.Compare), without
	// duplicates.
	AllowedIPs []netip.Prefix
}

// Equal reports whether d and o are the same.
func (d Device) Equal(o Device) bool {
	return d.Exists == o.Exists && d.FirewallMark == o.FirewallMark && slices.EqualFunc(d.Peers, o.Peers, Peer.Equal)
}

// Equal reports whether p and o are the same.
func (p Peer) Equal(o Peer) bool {
	return p.PublicKey == o.PublicKey && p.Endpoint == o.Endpoint && slices.Equal(p.AllowedIPs, o.AllowedIPs)
}

// Client is what Read needs of a WireGuard client: *wgctrl.Client is one.
// Device returns an error that matches os.ErrNotExist when there is no
// such device.
type Client interface {
	Device(name string) (*wgtypes.Device, error)
	Close() error
}

// Read reads the device name through c. A device that does not exist is
// no error: the Device says so.
func Read(c Client, name string) (Device, error) {
	wd, err := c.Device(name)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return Device{}, nil
	case err != nil:
		return Device{}, fmt.Errorf("wgpeers: read %s: %w", name, err)
	}
	return convert(wd), nil
}

// convert turns wgctrl's device into a Device: the edge where wgtypes
// stop. Keys and counters are dropped.
func convert(wd *wgtypes.Device) Device {
	d := Device{Exists: true, FirewallMark: netwatch.Mark(uint32(wd.FirewallMark))}
	for _, wp := range wd.Peers {
		p := Peer{PublicKey: Key(wp.PublicKey)}
		if e := wp.Endpoint; e != nil {
			if a, ok := netip.AddrFromSlice(e.IP); ok {
				p.Endpoint = netip.AddrPortFrom(a.Unmap(), uint16(e.Port))
			}
		}
		for _, n := range wp.AllowedIPs {
			a, ok := netip.AddrFromSlice(n.IP)
			if !ok {
				continue
			}
			a = a.Unmap()
			bits, size := n.Mask.Size()
			if size == 128 && a.Is4() {
				bits -= 96
			}
			if pf, err := a.Prefix(bits); err == nil && bits >= 0 {
				p.AllowedIPs = append(p.AllowedIPs, pf)
			}
		}
		slices.SortFunc(p.AllowedIPs, netip.Prefix.Compare)
		p.AllowedIPs = slices.Compact(p.AllowedIPs)
		d.Peers = append(d.Peers, p)
	}
	slices.SortFunc(d.Peers, func(a, b Peer) int { return strings.Compare(string(a.PublicKey[:]), string(b.PublicKey[:])) })
	return d
}

// Diff describes what changed from prev to next, one line per change, in
// the order: the device, its fwmark, peers removed, peers added, peers
// whose endpoint or allowed IPs changed. A device that appears or goes is
// one line. It is empty when nothing changed.
func Diff(link string, prev, next Device) []string {
	var lines []string
	switch {
	case prev.Exists && !next.Exists:
		return []string{"wireguard " + link + ": gone"}
	case !prev.Exists && next.Exists:
		// Not a line per peer: a mesh may have thousands.
		return []string{fmt.Sprintf("wireguard %s: %d peers, fwmark %s", link, len(next.Peers), markText(next.FirewallMark))}
	case prev.FirewallMark != next.FirewallMark:
		lines = append(lines, fmt.Sprintf("wireguard %s: fwmark %s (was %s)", link, markText(next.FirewallMark), markText(prev.FirewallMark)))
	}
	old := make(map[Key]Peer, len(prev.Peers))
	for _, p := range prev.Peers {
		old[p.PublicKey] = p
	}
	cur := make(map[Key]bool, len(next.Peers))
	for _, p := range next.Peers {
		cur[p.PublicKey] = true
	}
	for _, p := range prev.Peers {
		if !cur[p.PublicKey] {
			lines = append(lines, fmt.Sprintf("wireguard %s: peer %v removed", link, p.PublicKey))
		}
	}
	for _, p := range next.Peers {
		o, ok := old[p.PublicKey]
		switch {
		case !ok:
			lines = append(lines, fmt.Sprintf("wireguard %s: peer %v added: endpoint %s, allowed ips %s", link, p.PublicKey, endpointText(p.Endpoint), prefixesText(p.AllowedIPs)))
			continue
		case o.Endpoint != p.Endpoint:
			lines = append(lines, fmt.Sprintf("wireguard %s: peer %v endpoint %s (was %s)", link, p.PublicKey, endpointText(p.Endpoint), endpointText(o.Endpoint)))
		}
		if !slices.Equal(o.AllowedIPs, p.AllowedIPs) {
			lines = append(lines, fmt.Sprintf("wireguard %s: peer %v allowed ips %s (was %s)", link, p.PublicKey, prefixesText(p.AllowedIPs), prefixesText(o.AllowedIPs)))
		}
	}
	return lines
}

func markText(m netwatch.Mark) string {
	if m == 0 {
		return "none"
	}
	return m.String()
}

func endpointText(e netip.AddrPort) string {
	if !e.IsValid() {
		return "none"
	}
	return e.String()
}

func prefixesText(ps []netip.Prefix) string {
	if len(ps) == 0 {
		return "none"
	}
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}
