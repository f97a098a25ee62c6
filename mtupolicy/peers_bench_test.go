package mtupolicy_test

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/marksplit/marksplit/mtupolicy"
	"github.com/marksplit/marksplit/netwatch"
	"github.com/marksplit/marksplit/netwatch/reconcile"
)

// One pass of the peer policy at scale: 5,000 peers on the node network,
// each a host route, with the table already converged (as after a change
// of one peer).
func BenchmarkDesiredPeers5000(b *testing.B) {
	var peers []netip.Addr
	for i := range 5000 {
		peers = append(peers, netip.AddrFrom4([4]byte{10, 0, byte(20 + i/250), byte(1 + i%250)}))
	}
	s := node()
	d, _ := mtupolicy.DesiredPeers(s.View(), peerConfig(), mtupolicy.ModeOn, peers, nil)
	s.Routes = append(s.Routes, flat(d).Routes...)
	s.Rules = append(s.Rules, d.Rules...)
	v := s.View()
	b.Run("DesiredPeers", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			mtupolicy.DesiredPeers(v, peerConfig(), mtupolicy.ModeOn, peers, nil)
		}
	})
	b.Run("Plan", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := reconcile.Plan(v, d); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// One pass of the peer policy with 50 peers and a large main table (1,000
// and 100,000 BGP host routes that no peer uses): the main table's index
// is built from a walk of it, so this grows with the table.
func BenchmarkDesiredPeersLargeMain(b *testing.B) {
	var peers []netip.Addr
	for i := range 50 {
		peers = append(peers, netip.AddrFrom4([4]byte{10, 0, 20, byte(1 + i)}))
	}
	for _, n := range []int{1000, 100000} {
		s := node()
		for i := range n {
			s.Routes = append(s.Routes, netwatch.Route{Family: netwatch.IPv4, Table: netwatch.TableMain,
				Dst:     netip.PrefixFrom(netip.AddrFrom4([4]byte{11, byte(i >> 16), byte(i >> 8), byte(i)}), 32),
				Gateway: addr("10.0.0.1"), Index: idxEnp, Protocol: netwatch.Protocol(186), Type: netwatch.RouteUnicast})
		}
		v := s.View()
		b.Run(fmt.Sprintf("routes=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, ok := mtupolicy.DesiredPeers(v, peerConfig(), mtupolicy.ModeOn, peers, nil); !ok {
					b.Fatal("DesiredPeers: not ok")
				}
			}
		})
	}
}

// One pass of the underlay policy (--underlay-link) with 100,000 main
// routes out of the underlay and the table converged: what every change of
// the underlay (an MTU toggled, a flag) costs the agent before Plan finds
// nothing to do.
func BenchmarkDesiredUnderlay100k(b *testing.B) {
	s := node()
	for i := range 100000 {
		s.Routes = append(s.Routes, netwatch.Route{Family: netwatch.IPv4, Table: netwatch.TableMain,
			Dst:     netip.PrefixFrom(netip.AddrFrom4([4]byte{11, byte(i >> 16), byte(i >> 8), byte(i)}), 32),
			Gateway: addr("10.0.0.1"), Index: idxEnp, Protocol: netwatch.Protocol(186), Type: netwatch.RouteUnicast})
	}
	cfg := config()
	cfg.Prefixes, cfg.UnderlayLink, cfg.Repair = nil, "enp7s0", false
	d, ok := mtupolicy.Desired(s.View(), cfg, mtupolicy.ModeOn)
	if !ok {
		b.Fatal("Desired: not ok")
	}
	s.Routes = append(s.Routes, flat(d).Routes...)
	s.Rules = append(s.Rules, d.Rules...)
	v := s.View()
	b.Run("Desired", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			mtupolicy.Desired(v, cfg, mtupolicy.ModeOn)
		}
	})
	b.Run("Plan", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if ops, err := reconcile.Plan(v, d); err != nil || len(ops) != 0 {
				b.Fatalf("Plan: %d ops, %v", len(ops), err)
			}
		}
	})
}
