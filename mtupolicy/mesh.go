package mtupolicy

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/marksplit/marksplit/netwatch"
	"github.com/marksplit/marksplit/netwatch/reconcile"
)

// Mesh is what the mesh policy (cfg.Mesh) knows of a WireGuard device: its
// own fwmark and its peers.
type Mesh struct {
	// FirewallMark is the mark the device puts on its encrypted UDP; 0
	// for none.
	FirewallMark netwatch.Mark
	Peers        []MeshPeer
}

// MeshPeer is one peer of the device.
type MeshPeer struct {
	// Endpoint is the peer's underlay address, the key of its inner MTU
	// in InnerMTUs; invalid while the device knows none.
	Endpoint netip.Addr
	// AllowedIPs are the destinations the device sends to this peer.
	AllowedIPs []netip.Prefix
}

// DesiredMesh is the policy for cfg.Mesh, a WireGuard mesh that is not
// Cilium's: each peer's allowed IPs through the tunnel link (the WireGuard
// device, cfg.TunnelLink) at that peer's inner MTU. ok is false when
// nothing may be edited: cfg.Mesh is not set, the mode is unknown, the view
// is not synced, or cfg is not valid. The caller must not call it before
// its first read of the device.
//
// Off, or the link missing, down or at MTU 0: the owned scope and nothing
// else, as Desired. On, for each allowed IP p of a family that is split:
//
//   - A route p in cfg.Table where the main table already sends p through
//     the link: its longest route that covers p (equal or shorter, no TOS,
//     no source prefix, the lowest metric) is a single-path unicast route
//     out of the link. The route copies that one's gateway, scope, flags
//     and prefsrc; its MTU is PeerMTU(family, link MTU, inner[Endpoint]);
//     type unicast, cfg.Protocol. The mode changes MTUs, never where a
//     packet goes: an allowed IP the main table sends elsewhere (wg-quick's
//     0.0.0.0/0 in a table of its own) gets nothing, nor does the default
//     route, a link-local or multicast prefix, or an inner MTU below the
//     family's minimum (a note says so).
//   - A throw route, with its key, for each main route inside p that does
//     not leave by the link, or that matches some packets only (TOS,
//     source prefix): those packets go on to the main table.
//   - One rule per family with routes: "not fwmark MARK lookup Table" with
//     the device's own fwmark, so that its encrypted packets never loop
//     into the tunnel; "lookup Table" when the device has none (its
//     packets then take whatever the main table gives them: the table's
//     routes only follow the main table's).
//
// Allowed IPs are unique within a device; overlapping ones of two peers
// (10.244.9.0/24 and 10.244.9.128/25) each get their route, and the
// longest wins as in WireGuard. Nothing is repaired.
func (c *PeerCache) DesiredMesh(v netwatch.View, cfg Config, mode Mode, m Mesh, inner InnerMTUs) (reconcile.Desired, bool) {
	c.follow(v)
	if !cfg.Mesh {
		return reconcile.Desired{}, false
	}
	return cfg.desired(v, mode, func(v netwatch.View, f netwatch.Family, tun netwatch.Link, d *reconcile.Desired) {
		fi := famIndex(f)
		if c.tables[fi] == nil {
			c.tables[fi] = walkMain(v, f)
			c.walks++
		}
		cfg.meshFamily(v, f, tun, m, inner, d, newMainIndex(v, f, c.tables[fi]))
	})
}

// DesiredMesh is PeerCache.DesiredMesh without a cache.
func DesiredMesh(v netwatch.View, cfg Config, mode Mode, m Mesh, inner InnerMTUs) (reconcile.Desired, bool) {
	var c PeerCache
	return c.DesiredMesh(v, cfg, mode, m, inner)
}

func (c Config) meshFamily(v netwatch.View, f netwatch.Family, tun netwatch.Link, m Mesh, inner InnerMTUs, d *reconcile.Desired, idx mainIndex) {
	n := 0
	var throws []netwatch.Route
	seen := make(map[netwatch.RouteKey]bool)
	hosts := make(map[netwatch.RouteKey]bool) // of the routes added to d.Routes
	below := 0
	for _, p := range m.Peers {
		mtu, low := PeerMTU(f, tun.MTU, inner[p.Endpoint.Unmap()])
		for _, dst := range p.AllowedIPs {
			dst = dst.Masked()
			if !dst.IsValid() || netwatch.FamilyOf(dst.Addr()) != f || dst.Bits() == 0 || unencrypted(dst) {
				continue
			}
			path, ok := idx.covering(dst)
			if !ok || path.Index != tun.Index || path.Type != netwatch.RouteUnicast || path.NextHops != nil || path.NHID != 0 {
				continue
			}
			if low {
				below++
			}
			h := netwatch.Route{
				Family:   f,
				Table:    c.Table,
				Dst:      dst,
				Gateway:  path.Gateway,
				Index:    tun.Index,
				PrefSrc:  path.PrefSrc,
				MTU:      mtu,
				Protocol: c.Protocol,
				Scope:    path.Scope,
				Type:     netwatch.RouteUnicast,
				Flags:    path.Flags,
			}.Clean()
			if hosts[h.Key()] {
				continue
			}
			hosts[h.Key()] = true
			d.Routes.Add(h)
			n++
			for r := range v.RoutesWithin(netwatch.TableMain, dst) {
				if r.Index == tun.Index && r.TOS == 0 && !r.Src.IsValid() || r.Dst == dst && r.TOS == 0 && !r.Src.IsValid() {
					continue
				}
				t := netwatch.Route{Family: f, Table: c.Table, Dst: r.Dst, Src: r.Src, TOS: r.TOS, Metric: r.Metric,
					Protocol: c.Protocol, Scope: netwatch.ScopeUniverse, Type: netwatch.RouteThrow}
				if f == netwatch.IPv6 {
					t.Index = loopback(v) // the kernel hangs IPv6 throw routes on lo and says so
				}
				if !seen[t.Key()] {
					seen[t.Key()] = true
					throws = append(throws, t)
				}
			}
		}
	}
	if below > 0 {
		d.Notes = append(d.Notes, fmt.Sprintf("%v: %d allowed IPs of %s keep its MTU %d: their peer's inner MTU is below the family's minimum %d",
			f, below, tun.Name, tun.MTU, MinMTU(f)))
	}
	if n == 0 {
		return
	}
	slices.SortFunc(throws, func(a, b netwatch.Route) int { return a.Key().Compare(b.Key()) })
	for _, t := range throws {
		if !hosts[t.Key()] {
			d.Routes.Add(t)
		}
	}
	r := netwatch.Rule{Family: f, Priority: c.Priority, Table: c.Table, Action: netwatch.ActionToTable, Protocol: c.Protocol}
	if m.FirewallMark != 0 {
		r.Invert, r.Mark, r.Mask = true, m.FirewallMark, 0xffffffff
	}
	d.Rules = append(d.Rules, r)
}

// covering returns the main route the kernel uses for every address of
// p: the longest route (of those that match every packet) that equals or
// contains p.
func (idx mainIndex) covering(p netip.Prefix) (netwatch.Route, bool) {
	for _, bits := range idx.lens {
		if bits > p.Bits() {
			continue
		}
		q := netip.PrefixFrom(p.Addr(), bits).Masked()
		metric, ok := idx.byLen[bits][q]
		if !ok {
			continue
		}
		if r, ok := idx.route(q, metric); ok {
			return r, true
		}
	}
	return netwatch.Route{}, false
}
