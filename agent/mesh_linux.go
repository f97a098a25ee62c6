//go:build linux

package main

import (
	"context"
	"log/slog"
	"net/netip"
	"slices"

	"github.com/marksplit/marksplit/internal/wgpeers"
	"github.com/marksplit/marksplit/mtupolicy"
	"github.com/marksplit/marksplit/netwatch"
	"github.com/marksplit/marksplit/netwatch/reconcile"
	"golang.zx2c4.com/wireguard/wgctrl"
)

// meshSource reads the --wireguard-link device for the loop.
type meshSource struct {
	src *wgpeers.Source
	log *slog.Logger
}

func newMeshSource(o options, log *slog.Logger) *meshSource {
	if !o.policy.Mesh || !o.usesMode() {
		return nil
	}
	return &meshSource{log: log, src: &wgpeers.Source{
		Link:     o.wireguardLink,
		Interval: o.wireguardPoll,
		Logger:   log,
		Open: func() (wgpeers.Client, error) {
			c, err := wgctrl.New()
			if err != nil {
				return nil, err
			}
			return c, nil
		},
	}}
}

// run feeds l until ctx ends, calling reported after each report. Each
// change of the device is logged, one line per peer.
func (m *meshSource) run(ctx context.Context, l *loop, reported func()) {
	m.src.Run(ctx, func(d wgpeers.Device) {
		prev := l.mesh.Swap(&d)
		var was wgpeers.Device
		if prev != nil {
			was = *prev
		}
		for _, line := range wgpeers.Diff(m.src.Link, was, d) {
			l.emit(line)
		}
		if prev == nil && !d.Exists {
			l.emit("wireguard " + m.src.Link + ": no such device yet: nothing is split")
		}
		var endpoints []netip.Addr // the path-MTU store's peers: the underlay addresses
		for _, p := range d.Peers {
			if p.Endpoint.IsValid() {
				endpoints = append(endpoints, p.Endpoint.Addr())
			}
		}
		slices.SortFunc(endpoints, netip.Addr.Compare)
		l.pathChanged(l.pmtu.SetPeers(slices.Compact(endpoints)))
		l.r.Trigger()
		reported()
	})
}

// meshKnown reports whether the device has been read.
func (l *loop) meshKnown() bool { return l.mesh.Load() != nil }

// meshPolicy is the policy with --wireguard-link: nothing before the first
// read of the device, unless the mode is off.
func (l *loop) meshPolicy(v netwatch.View, mode mtupolicy.Mode) (reconcile.Desired, bool) {
	d := l.mesh.Load()
	if d == nil && mode != mtupolicy.ModeOff {
		return reconcile.Desired{}, false
	}
	var m mtupolicy.Mesh
	if d != nil {
		m.FirewallMark = d.FirewallMark
		for _, p := range d.Peers {
			m.Peers = append(m.Peers, mtupolicy.MeshPeer{Endpoint: p.Endpoint.Addr(), AllowedIPs: p.AllowedIPs})
		}
	}
	if tun, ok := v.LinkByName(l.cfg.TunnelLink); ok {
		l.pmtu.SetTunnelMTU(int(tun.MTU))
	}
	// Each peer's inner MTU by its endpoint (--path-mtu, and what the
	// path-MTU sources learn); the link's MTU where none is known.
	return l.peerIndex.DesiredMesh(v, l.cfg, mode, m, l.pmtu.Inner())
}
