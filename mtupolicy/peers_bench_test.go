package mtupolicy_test

import (
	"net/netip"
	"testing"

	"github.com/marksplit/marksplit/mtupolicy"
	"github.com/marksplit/marksplit/netwatch"
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
	d, _ := mtupolicy.DesiredPeers(s.View(), peerConfig(), mtupolicy.ModeOn, peers)
	s.Routes = append(s.Routes, d.Routes...)
	s.Rules = append(s.Rules, d.Rules...)
	v := s.View()
	b.Run("DesiredPeers", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			mtupolicy.DesiredPeers(v, peerConfig(), mtupolicy.ModeOn, peers)
		}
	})
	b.Run("Plan", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := netwatch.Plan(v, d); err != nil {
				b.Fatal(err)
			}
		}
	})
}
